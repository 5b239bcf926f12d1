"""Issue 38: run folders, numbers and outputs that can be trusted.

A failed run never exits 0 and leaves no checkpoint that ``eval`` refuses (O26); outputs never land
over existing ones or inside a run's managed folders (H13, H14), a grid keeps its runs inside its
folder (R15), an unreadable ``checkpoints/`` is an error, never a fresh start (D20; H13, H14 and D20
are rows of ``tests/test_bad_inputs.py`` too); a closed output pipe ends a command quietly."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.store import checkpoint as ck

DEBUG = ["train", "--preset", "debug", "--no-progress"]
FAST = ["eval.max_batches=1", "train.num_threads=1"]


def run_cli(argv: list[str]) -> tuple[int, list[str]]:
    """``main(argv)`` in process: (exit status, non-empty stderr lines)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, [ln for ln in err.getvalue().splitlines() if ln.strip()]


def files(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


def test_o26_a_run_whose_steps_were_all_skipped_fails_and_saves_nothing(tmp_path):
    """O26: every step non-finite (fewer than max_nonfinite_steps): one line, exit 2, no checkpoint,
    no final evaluation (the old code printed a NaN evaluation, saved step 3 and exited 0)."""
    run = tmp_path / "run"
    code, err = run_cli(DEBUG + ["--out", run, *FAST, "train.steps=3", "model.readout_mult=1e30"])
    assert code == 2, err
    assert err[-1].startswith("replaid: error: training failed: all 3 steps") and "skipped" in err[-1], err
    assert ck.latest_checkpoint(run) is None and not (run / "final_eval.json").exists()
    assert (run / "config.json").is_file()  # the run folder stays, with what its steps logged


def test_o26_a_nonfinite_final_evaluation_fails_and_sets_its_checkpoint_aside(tmp_path, monkeypatch):
    """O26: finite steps, then a non-finite final evaluation: one line, exit 2; the checkpoint it
    evaluated is moved out of checkpoints/ (eval would refuse it), the earlier one is in force again."""
    import replaid.eval.evaluate as ev

    real = ev.evaluate

    def nan_at_the_end(trainer, data, **kw):
        res = real(trainer, data, **kw)
        return {**res, "nelbo_nats_per_token": float("nan")} if trainer.step == trainer.cfg.train.steps else res

    monkeypatch.setattr(ev, "evaluate", nan_at_the_end)
    run = tmp_path / "run"
    code, err = run_cli(DEBUG + ["--out", run, *FAST, "train.steps=4", "train.save_every=3"])
    assert code == 2, err
    assert err[-1].startswith("replaid: error: the final evaluation at step 4") and "not finite" in err[-1], err
    assert ck.latest_checkpoint(run).name == "step_0000003"
    assert not (run / "checkpoints" / "step_0000004").exists() and not (run / "final_eval.json").exists()
    assert ck.is_complete(run / "nonfinite" / "step_0000004")  # set aside, not deleted
    monkeypatch.setattr(ev, "evaluate", real)
    assert run_cli(["eval", run, "--max-batches", "1"])[0] == 0  # what stays in force evaluates


def test_r15_grid_run_refuses_a_run_dir_outside_the_grid(tmp_path):
    """R15: a manifest whose run_dir leaves the grid folder (``..``, absolute) is refused in one line
    before any run starts; the foreign run is untouched (the old code resumed it)."""
    g, victim = tmp_path / "g", tmp_path / "victim"
    over = ["train.steps=2", "eval.max_batches=1", "train.num_threads=1"]
    assert run_cli(["grid", "plan", "--base", "debug", "--out", g, "--seeds", "1", "--cell", "a", "--", *over])[0] == 0
    man = json.loads((g / "manifest.json").read_text())
    victim.mkdir()
    (victim / "config.json").write_text((g / man["runs"][0]["config"]).read_text())  # unfinished: no checkpoint
    for bad in ("../victim", str(victim)):
        man["runs"][0]["run_dir"] = bad
        (g / "manifest.json").write_text(json.dumps(man))
        before = files(tmp_path)
        code, err = run_cli(["grid", "run", g, "--python", "inprocess", "--no-progress"])
        assert code == 2 and len(err) == 1 and "outside the folder" in err[0], err
        assert files(tmp_path) == before


def test_closed_stdout_ends_quietly_with_141(tmp_path):
    """``replaid presets | head``: a reader that went away ends the command quietly, exit 141 (the
    status a shell shows for a tool killed by SIGPIPE), no traceback, no 'replaid: error' (was: exit 2)."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    try:
        p = subprocess.run([sys.executable, "-m", "replaid", "presets"], stdout=w, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == b"", p.stderr.decode()


@pytest.mark.parametrize("out", ["{run}/checkpoints/step_0000002", "{run}/tokenizer/x", "{run}"])
def test_h14_check_out_refuses_any_runs_managed_folders(tmp_path, out):
    """H14: the shared --out check refuses a run's checkpoints/, tokenizer/ or the run itself, for any
    run (not only the command's input)."""
    from replaid.commands import check_out

    run = tmp_path / "run"
    (run / "checkpoints" / "step_0000002").mkdir(parents=True)
    (run / "tokenizer").mkdir()
    (run / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="run"):
        check_out(out.replace("{run}", str(run)))
