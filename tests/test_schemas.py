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
            yield name, field, f"{label} missing", lambda d, k=field: d.pop(k)
        yield name, field, f"{label} {wrong_type(f)!r}", lambda d, k=field, v=wrong_type(f): d.__setitem__(k, v)
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


def run_cli(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, [ln for ln in err.getvalue().splitlines() if ln.strip()]


@pytest.mark.parametrize("name,field,how,edit,cmd", PARAMS, ids=[f"{p[0]}:{p[2]}:{p[4]}" for p in PARAMS])
def test_a_corrupted_field_is_one_line_naming_file_and_field(grid, tmp_path, name, field, how, edit, cmd):
    g = tmp_path / "g"
    shutil.copytree(grid, g)
    f = where(g, name)
    d = json.loads(f.read_text())
    edit(d)
    f.write_text(json.dumps(d))
    before = files(tmp_path)
    code, lines = run_cli([a.replace("{g}", str(g)) for a in OPENS[name][cmd]])
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
