"""Issue 38 class 1: every JSON file replaid writes into a run, checkpoint or grid folder is read through
its declared schema (``replaid.schema``). A generated corruption of each field (missing, wrong type, out
of range), given to every command that opens the file, ends in one line naming the file and the field,
exit 2, and leaves the folder byte for byte as it was."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from replaid import schema
from replaid.cli import main
from replaid.config import RunConfig

RUN = "{g}/runs/a__s0"
# the commands that open each file, run as a user would (in process, through replaid.cli.main)
OPENS = {
    "state.json": {
        "eval": ["eval", RUN],
        "sample": ["sample", RUN, "--num", "1"],
        "resume": ["train", "--out", RUN, "--resume", "--no-progress", "train.steps=4"],
        "grid report": ["grid", "report", "{g}"],
        "grid run": ["grid", "run", "{g}", "--python", "inprocess", "--no-progress"],
    },
    "tokenizer_spec.json": {
        "eval": ["eval", RUN],
        "sample": ["sample", RUN, "--num", "1"],
        "resume": ["train", "--out", RUN, "--resume", "--no-progress", "train.steps=4"],
    },
}
# the other commands that load a run (replaid.store.loading.load_run), for its two files
LOADERS = {
    "export": ["export", RUN, "--out", "{g}/x"],
    "edit": ["edit", RUN, "--text", "the value", "--steps", "2"],
    "diagnose": ["diagnose", RUN, "--out", "{g}/d"],
    "likelihood": ["likelihood", RUN, "--out", "{g}/lk", "--num-seqs", "1"],
    # V02, V03: the playground loads its runs at start-up (uvicorn.run is replaced in the test: never listens)
    "serve": ["serve", RUN, "--port", "{port}", "--device", "cpu"],
}
for _name in ("state.json", "tokenizer_spec.json"):
    OPENS[_name].update(LOADERS)
OPENS |= {
    "final_eval.json": {
        "grid report": ["grid", "report", "{g}"],
        "grid run": ["grid", "run", "{g}", "--python", "inprocess", "--no-progress"],
    },
    "manifest.json": {
        "grid report": ["grid", "report", "{g}"],
        "grid run": ["grid", "run", "{g}", "--python", "inprocess", "--no-progress"],
    },
    "distill.json": {"distill --resume": ["distill", RUN, "--out", "{g}/student", "--resume", "--no-progress"]},
    "config.json": {
        "resume": ["train", "--out", RUN, "--resume", "--no-progress", "train.steps=4"],
        "grid report": ["grid", "report", "{g}"],
    },
}


def where(g: Path, name: str) -> Path:
    run = g / "runs" / "a__s0"
    return {
        "state.json": run / "checkpoints" / "step_0000002" / "state.json",
        "tokenizer_spec.json": run / "tokenizer" / "tokenizer_spec.json",
        "final_eval.json": run / "final_eval.json",
        "manifest.json": g / "manifest.json",
        "distill.json": g / "student" / "distill.json",
        "config.json": run / "config.json",
    }[name]


def wrong_type(f: schema.Field):
    return "x" if f.kind in ("int", "number", "bool") else 5


def corruptions(name: str, sch: schema.Schema, sub: str = ""):
    """(file, field, how, edit) for every field of ``sch``: missing (when required), of another type,
    below its range (when it has one)."""
    for field, f in sch.items():
        label = f"{sub}{field}"
        if f.required:
            yield name, field, f"{label} missing", lambda d, k=field: d.pop(k) and None
        yield name, field, f"{label} {wrong_type(f)!r}", lambda d, k=field, v=wrong_type(f): d.__setitem__(k, v)  # noqa: B008 -- binds this field's value
        if f.lo is not None:
            yield name, field, f"{label} below {f.lo:g}", lambda d, k=field, v=f.lo - 1: d.__setitem__(k, v)


def in_run(edit):
    """An edit of the manifest's first run (runs[0])."""
    return lambda d: edit(d["runs"][0])


def config_leaves(d: dict, path: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from config_leaves(v, path + (k,))
        else:
            yield path + (k,), v


def set_leaf(path: tuple, value):
    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return edit


CASES = []
for name in ("state.json", "tokenizer_spec.json", "final_eval.json", "distill.json"):
    CASES += list(corruptions(name, schema.SCHEMAS[name]))
CASES += list(corruptions("manifest.json", schema.MANIFEST))
CASES += [(n, k, f"runs[0].{how}", in_run(e)) for n, k, how, e in corruptions("manifest.json", schema.GRID_RUN)]
# config.json: every key of every section given a value of another type (a string key a number)
CASES += [
    ("config.json", path[-1], ".".join(path) + " wrong type", set_leaf(path, 5 if isinstance(v, str) else "x"))
    for path, v in config_leaves(RunConfig().to_dict())
]
CASES += [("config.json", sec, f"{sec} section a list", set_leaf((sec,), [1])) for sec in ("train", "model", "data")]
# the whole file a JSON list (R13's manifest), for every file
CASES += [(name, "a JSON list", "file a list", lambda d: [d]) for name in OPENS]
PARAMS = [(n, k, how, e, cmd) for n, k, how, e in CASES for cmd in OPENS[n]]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """A planned and run grid of one debug run (2 steps) and a student folder's distill.json."""
    from replaid.distill.config import DistillConfig

    g = tmp_path_factory.mktemp("schemas") / "g"
    over = ["train.steps=2", "eval.max_batches=1", "train.num_threads=1"]
    assert main(["grid", "plan", "--base", "debug", "--out", str(g), "--seeds", "1", "--cell", "a", "--", *over]) == 0
    assert main(["grid", "run", str(g), "--python", "inprocess", "--no-progress"]) == 0
    assert where(g, "state.json").is_file()
    (g / "student").mkdir()
    teacher = str(where(g, "state.json").parent)
    where(g, "distill.json").write_text(json.dumps({"config": asdict(DistillConfig()), "teacher": teacher}))
    return g


def files(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def free_port() -> int:
    """A TCP port nothing listens on now (serve gets past its port check to loading the run)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, [ln for ln in err.getvalue().splitlines() if ln.strip()]


@pytest.mark.parametrize("name,field,how,edit,cmd", PARAMS, ids=[f"{p[0]}:{p[2]}:{p[4]}" for p in PARAMS])
def test_a_corrupted_field_is_one_line_naming_file_and_field(grid, tmp_path, monkeypatch, name, field, how, edit, cmd):
    if cmd == "serve":
        uvicorn = pytest.importorskip("uvicorn")

        def listen(*a, **k):
            raise AssertionError("replaid serve started serving a damaged run")

        monkeypatch.setattr(uvicorn, "run", listen)
    g = tmp_path / "g"
    shutil.copytree(grid, g)
    f = where(g, name)
    d = json.loads(f.read_text())
    d = edit(d) or d  # an edit changes d in place, or returns what replaces it
    f.write_text(json.dumps(d))
    before = files(tmp_path)
    code, lines = run_cli([a.replace("{g}", str(g)).replace("{port}", str(free_port())) for a in OPENS[name][cmd]])
    assert code == 2, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("replaid: error: "), lines
    assert str(f) in lines[0] and field in lines[0], lines[0]
    assert files(tmp_path) == before


def test_the_cases_cover_every_declared_file_and_field():
    """Every schema of replaid.schema.SCHEMAS is exercised field by field; prints the count."""
    seen = {(n, k) for n, k, *_ in CASES}
    for name, sch in schema.SCHEMAS.items():
        assert {(name, k) for k in sch} <= seen, name
    assert {("manifest.json", k) for k in schema.GRID_RUN} <= seen
    print(f"{len(PARAMS)} (file, field, command) cases over {len(CASES)} corruptions of {len(OPENS)} files")


def test_a_stray_metrics_line_is_skipped_with_a_warning(grid, tmp_path, capsys):
    """metrics.jsonl is append-only: a stray line is skipped with one warning naming the file; the grid
    report reads the other rows."""
    g = tmp_path / "g"
    shutil.copytree(grid, g)
    m = g / "runs" / "a__s0" / "metrics.jsonl"
    rows = m.read_text().splitlines()
    m.write_text("\n".join(rows[:1] + ["[1, 2]", '{"step": "two"}'] + rows[1:]) + "\n")
    from replaid.scaling.grid import metrics_rows

    assert [r["step"] for r in metrics_rows(m.parent)] == [json.loads(r)["step"] for r in rows]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(m) in err[0] and "skipped 2 line(s)" in err[0], err
    assert main(["grid", "report", str(g), "--out", str(tmp_path / "rep")]) == 0


def test_a_checkpoint_without_its_sha256_record_is_refused_not_loaded_unchecked(grid, tmp_path):
    """A missing checksum record is an error (never a reason to skip verification), unless --no-verify."""
    g = tmp_path / "g"
    shutil.copytree(grid, g)
    f = where(g, "state.json")
    st = json.loads(f.read_text())
    rec = copy.deepcopy(st["sha256"])
    del rec["ema.safetensors"]
    f.write_text(json.dumps({**st, "sha256": rec}))
    code, lines = run_cli(["eval", str(g / "runs" / "a__s0"), "--max-batches", "1"])
    assert code == 2 and len(lines) == 1 and str(f) in lines[0] and "ema.safetensors" in lines[0], lines
    code, lines = run_cli(["--no-verify", "sample", str(g / "runs" / "a__s0"), "--num", "1", "--steps", "2"])
    assert code == 0, lines
    f.write_text(json.dumps({**st, "sha256": {**st["sha256"], "ema.safetensors": "not a digest"}}))  # malformed
    code, lines = run_cli(["eval", str(g / "runs" / "a__s0"), "--max-batches", "1"])
    assert code == 2 and len(lines) == 1 and 'field "sha256"' in lines[0] and "ema.safetensors" in lines[0], lines


# Issue 38, small items: a one-line error about a file names the file (the battery's M03, GR1, DR1, ZS4, YA6)
def write(name: str, data: str | bytes):
    def make(tmp: Path) -> Path:
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return p

    return make


NEW = ["train", "--preset", "debug", "--no-progress", "--out", "{tmp}/new"]
GRID_PLAN = ["grid", "plan", "{tmp}/spec.yaml", "--out", "{tmp}/gp"]
NAMES_THE_FILE = [
    # YA6: a YAML config whose value is wrong, out of range, for another method, or not UTF-8
    (NEW + ["--config", "{tmp}/c.yaml"], "c.yaml", write("c.yaml", "train:\n  steps: many\n")),
    (NEW + ["--config", "{tmp}/c.yaml"], "c.yaml", write("c.yaml", "train:\n  log_every: 0\n")),
    (NEW + ["--config", "{tmp}/c.yaml"], "c.yaml", write("c.yaml", "model:\n  no_such_key: 1\n")),
    (NEW + ["--config", "{tmp}/c.yaml"], "c.yaml", write("c.yaml", "method: ar\nmdlm:\n  antithetic: true\n")),
    (NEW + ["--config", "{tmp}/c.yaml"], "c.yaml", write("c.yaml", b"train:\n  steps: 2 # \xff\n")),
    # GR1: a grid spec or base config that does not validate
    (GRID_PLAN, "spec.yaml", write("spec.yaml", "base: debug\nseeds: [0, 0]\n")),
    (GRID_PLAN, "spec.yaml", write("spec.yaml", "base: debug\ncells: {a: []}\nreference: b\n")),
    (GRID_PLAN, "spec.yaml", write("spec.yaml", "base: debug\ncells: {a: [], b: []}\norderings: ['a < c']\n")),
    (GRID_PLAN, "spec.yaml", write("spec.yaml", "base: debug\ncells: {'a b': []}\n")),
    (GRID_PLAN, "spec.yaml", write("spec.yaml", "base: debug\ncells: {a: []}\nreference: [a]\n")),  # R01
    (
        ["grid", "plan", "--base", "{tmp}/base.json", "--out", "{tmp}/gp", "--cell", "a"],
        "base.json",
        write("base.json", '{"train": {"steps": "many"}}'),
    ),
    # DR1: a student's distill.json that is not JSON, or not its schema
    (["distill", RUN, "--out", "{tmp}/st", "--resume"], "distill.json", write("st/distill.json", "{oops")),
    (["distill", RUN, "--out", "{tmp}/st", "--resume"], "distill.json", write("st/distill.json", '{"config": 5}')),
    # ZS4: a zero-shot file with a line that is not JSON, without a text field, or not UTF-8
    (
        ["zeroshot", RUN, "--datasets", "ptb", "--data-dir", "{tmp}/zs"],
        "validation.jsonl",
        write("zs/ptb/validation.jsonl", '{"sentence": "a b"}\n{oops\n'),
    ),
    (
        ["zeroshot", RUN, "--datasets", "ptb", "--data-dir", "{tmp}/zs"],
        "validation.jsonl",
        write("zs/ptb/validation.jsonl", '{"words": "a b"}\n'),
    ),
    (
        ["zeroshot", RUN, "--datasets", "ptb", "--data-dir", "{tmp}/zs"],
        "validation.txt",
        write("zs/ptb/validation.txt", b"a b\n\xff\n"),
    ),
    # M03 (as read here: the run's metrics log): a stray row is a warning naming it (test above)
]


@pytest.mark.parametrize("argv,name,make", NAMES_THE_FILE, ids=[f"{c[1]}-{i}" for i, c in enumerate(NAMES_THE_FILE)])
def test_an_error_about_a_file_names_the_file(grid, tmp_path, argv, name, make):
    g = tmp_path / "g"
    shutil.copytree(grid, g)
    f = make(tmp_path)
    before = files(tmp_path)
    code, lines = run_cli([a.replace("{g}", str(g)).replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2 and len(lines) == 1 and lines[0].startswith("replaid: error: "), (code, lines)
    assert str(f) in lines[0] and name in lines[0], lines[0]
    assert files(tmp_path) == before


def test_the_playground_reads_metrics_rows_through_the_schema(tmp_path, capsys):
    """replaid serve's curves and run info read metrics.jsonl through the same schema (a JSON list row
    used to reach r.get / r.items)."""
    pytest.importorskip("fastapi")
    from replaid.web.app import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n[1]\n{"step": 2, "loss": 1.0}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert "skipped 1 line(s)" in capsys.readouterr().err
