"""The first hour (issue 54): the demo's set-up installs no extra, the thread count follows the free cores,
the committed judge table is printed only for the run it was measured on, each tutorial says how to run
it, and decoded text shows control characters and U+FFFD as escapes (CLI, playground, /v1/completions)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

from replaid.cli import main
from replaid.sampling.display import visible
from replaid.training import threads

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "docs" / "results" / "demo" / "first-run" / "measure.json"
spec = importlib.util.spec_from_file_location("demo_report", REPO / "scripts" / "demo_report.py")
demo_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_report)


# -- 1. the demo's set-up: the core package, and the demo imports nothing else -----------------------------


def _name(req: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0]).lower()


def _closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require (no extras), as installed here."""
    seen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        try:
            reqs = metadata.requires(n) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if "extra ==" not in r and "extra==" not in r]
    return seen


DEMO_CODE_PATH = textwrap.dedent(
    """
    import importlib.util, json, sys
    from replaid.cli import main
    out, measured, report = sys.argv[1:4]
    assert main(["train", "--preset", "debug", "--out", out, "--no-progress", "train.steps=2",
                 "eval.max_batches=1", "train.num_threads=1"]) == 0
    assert main(["sample", out, "--sampler", "ddpm", "--steps", "4", "--num", "1", "--seed", "0"]) == 0
    spec = importlib.util.spec_from_file_location("demo_report", report)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([out, "--grid", "3", "--measured", measured]) == 0
    print("MODULES " + json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """
)


def test_the_demo_setup_installs_the_core_and_the_demo_imports_nothing_else(tmp_path):
    """demo.sh runs ``setup.sh --core`` (``pip install -e .``, no chromium); the demo's code path (train,
    sample, demo_report) imports only distributions that the core's dependencies bring, none of an extra."""
    demo = (REPO / "scripts" / "demo.sh").read_text()
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "bash scripts/setup.sh --core" in demo and "[all]" not in demo and "apt-get" not in demo
    assert '--core) WHAT="." ;;' in setup and 'if [ "$WHAT" = "." ]; then' in setup
    assert setup.index('if [ "$WHAT" = "." ]') < setup.index("apt-get")  # --core stops before chromium
    assert "bash scripts/setup.sh\n" in (REPO / "scripts" / "test.sh").read_text()  # the suite: everything

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = _closure({_name(r) for r in project["dependencies"]})
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs} - {"replaid"}
    extra_only = extras - core
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            DEMO_CODE_PATH,
            str(tmp_path / "run"),
            str(MEASURED),
            str(REPO / "scripts/demo_report.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    modules = json.loads(p.stdout.split("MODULES ", 1)[1])
    owners = metadata.packages_distributions()
    third = {m: {_name(d) for d in owners.get(m, [])} - {"replaid"} for m in modules}
    third = {m: ds for m, ds in third.items() if ds}
    assert third, "no third-party distribution seen: the check sees nothing"
    # a module counts as an extra's when every distribution that provides it is extra-only (a namespace such
    # as google or backports is shared); an optional import of something else installed here is not counted
    extra = sorted(f"{m} ({', '.join(sorted(ds))})" for m, ds in third.items() if ds <= extra_only)
    assert not extra, f"the demo imports what only an extra installs: {extra}"
    assert {"torch", "tokenizers", "matplotlib"} <= set(third)  # it sees the core's imports


# -- 2. threads: the free cores now, torch's default the ceiling, the option overrides ----------------------


@pytest.mark.parametrize(
    "ceiling,cores,load,want",
    [(2, 2, 0.1, 2), (2, 2, 1.9, 1), (2, 2, 4.0, 1), (8, 16, 3.2, 8), (8, 8, 3.4, 5), (1, 4, 0.0, 1), (4, 4, 1.5, 2)],
)
def test_free_threads(ceiling, cores, load, want):
    assert threads.free_threads(ceiling, cores, load) == want


@pytest.fixture
def fresh_choice(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setattr(threads, "_message", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


def test_a_busy_machine_gets_fewer_threads_said_once(fresh_choice, monkeypatch, capsys):
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "machine", lambda: (2, 1.9))
    assert threads.set_threads(0) == 1 and torch.get_num_threads() == 1
    assert capsys.readouterr().err == ""  # said when training starts, after the input was checked
    threads.announce_threads()
    assert capsys.readouterr().err == "replaid: using 1 of 2 CPU threads (load 1.9; train.num_threads=N to choose)\n"
    monkeypatch.setattr(threads, "machine", lambda: (2, 0.0))
    assert threads.set_threads(0) == 1  # once per process: runs in it agree
    threads.announce_threads()
    assert capsys.readouterr().err == ""
    assert threads.set_threads(2) == 2 and torch.get_num_threads() == 2  # train.num_threads=2 overrides
    assert capsys.readouterr().err == ""


def test_a_quiet_machine_keeps_torchs_default_and_omp_num_threads_is_a_choice(fresh_choice, monkeypatch, capsys):
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "machine", lambda: (2, 0.2))
    assert threads.set_threads(0) == 2
    threads.announce_threads()
    assert "using 2 of 2 CPU threads (load 0.2" in capsys.readouterr().err
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(threads, "machine", lambda: (2, 5.0))
    assert threads.set_threads(0) == 2 and capsys.readouterr().err == ""
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "machine", lambda: (2, None))  # no load average (Windows): torch's default
    assert threads.set_threads(0) == 2
    threads.announce_threads()
    assert "load unknown" in capsys.readouterr().err


def test_the_default_is_documented_as_the_free_cores():
    from replaid.config import TrainConfig

    assert TrainConfig().num_threads == 0


# -- 4. the committed judge table belongs to its preset's run ----------------------------------------------


def _run_with(tmp_path: Path, **train) -> Path:
    m = json.loads(MEASURED.read_text())["config"]
    cfg = {
        "method": "replaid",
        "preset": "first-run",
        "data": {"source": m["source"], "tokenizer": m["tokenizer"], "bpe_vocab_size": m["bpe_vocab_size"]}
        | {"seq_len": m["seq_len"]},
        "train": {"steps": m["steps"], "seed": m["train_seed"], "batch_size": m["batch_size"]} | train,
    }
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def test_the_committed_table_prints_for_the_preset_run_only(tmp_path, capsys):
    m = json.loads(MEASURED.read_text())
    run = _run_with(tmp_path)
    assert demo_report.differences(json.loads((run / "config.json").read_text()), m) == []
    assert demo_report.main([str(run), "--no-report", "--measured", str(MEASURED)]) == 0
    out = capsys.readouterr().out
    assert "measured once, offline" in out and "gap closed" in out

    short = _run_with(tmp_path / "short", steps=80)
    assert demo_report.main([str(short), "--no-report", "--measured", str(MEASURED)]) == 0
    out = capsys.readouterr().out
    assert "gap closed" not in out and "measured once" not in out  # no table a reader takes for this run's
    assert "belongs to the preset's own run" in out and "train.steps 80 (measured: 1200)" in out
    assert "--judge-run AR_RUN" in out
    other = _run_with(tmp_path / "seed1", seed=1)
    assert demo_report.differences(json.loads((other / "config.json").read_text()), m) == ["train.seed 1 (measured: 0)"]


# -- 5. each tutorial says how to run it and where it writes ------------------------------------------------


@pytest.mark.parametrize("nb", sorted((REPO / "docs" / "tutorials").glob("*.py")), ids=lambda p: p.stem)
def test_each_tutorial_opens_with_how_to_run_it(nb):
    text = nb.read_text()
    first = text.split("# %% [markdown]", 1)[1].split("# %%", 1)[0]  # the opening cell
    assert f"`python docs/tutorials/{nb.name}`" in first and f"`jupytext --to ipynb docs/tutorials/{nb.name}`" in first
    assert "from the repository root" in first and f"`runs/tutorials/{nb.stem}/`" in first
    assert 'os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")' in text and f'/ "{nb.stem}"' in text


# -- 6. decoded text: control characters and U+FFFD as escapes, in one function used by all three -----------


def test_visible_escapes_control_characters_and_replacement_characters():
    assert visible("a\x13b\ufffdc") == "a\\x13b\\ufffdc"
    assert visible("line\n\tindented é ü 中") == "line\n\tindented é ü 中"  # layout and real text kept
    assert visible("\r\x00\x7f\x85") == "\\x0d\\x00\\x7f\\x85"
    assert visible("a\x13\ufffd", raw=True) == "a\x13\ufffd"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("i54") / "run"
    argv = ["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.steps=2", "eval.max_batches=1"]
    assert main([*argv, "train.num_threads=1"]) == 0
    return out


@pytest.fixture
def garbled(monkeypatch):
    """Every decode gives a control character and a broken byte piece (an undertrained byte-level BPE)."""
    from replaid.data import tokenizers

    for cls in vars(tokenizers).values():
        if isinstance(cls, type) and "decode" in vars(cls):
            monkeypatch.setattr(cls, "decode", lambda self, ids: "x\x13\ufffdy")


def test_the_cli_prints_escapes_and_raw_keeps_the_text(run, garbled, capsys):
    argv = ["sample", str(run), "--steps", "2", "--num", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "x\\x13\\ufffdy" in out and "\x13" not in out and "\ufffd" not in out
    assert main([*argv, "--raw"]) == 0
    assert "x\x13\ufffdy" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0  # JSON rows keep the text (replaid quality retokenises it)
    assert json.loads(capsys.readouterr().out.splitlines()[0])["text"] == "x\x13\ufffdy"


def test_the_playground_and_completions_send_escapes_unless_raw(run, garbled):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from replaid.store.loading import load_run
    from replaid.web.app import create_app
    from replaid.web.engine import Asked, Limits, generate_stream, parse

    loaded = load_run(run)
    asked: Asked = parse({"run": "run", "steps": 2, "samples": 1})
    events: list[dict] = []
    res = generate_stream(loaded, asked, events.append)
    shown = {t for e in events for t in e.get("tokens", {}).values()}  # each token's display string, once
    assert res.texts == ["x\\x13\\ufffdy"] and shown == {"x\\x13\\ufffdy"}
    assert generate_stream(loaded, asked, lambda e: None, limits=Limits(raw=True)).texts == ["x\x13\ufffdy"]
    for raw, want in ((False, "x\\x13\\ufffdy"), (True, "x\x13\ufffdy")):
        app = create_app([str(run)], Limits(raw=raw), runs=[loaded])
        with TestClient(app) as client:
            r = client.post("/v1/completions", json={"model": "run", "prompt": "", "max_tokens": 4, "seed": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
