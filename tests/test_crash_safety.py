"""Crash safety of run folders: every filesystem step of a checkpoint save fails in turn (raises, or
the process dies with os._exit), and the run must still load, resume, and end bit for bit where the
uninterrupted run ends. Plus: LATEST fallback and confinement, no double save, the run-folder lock,
no silent overwrite, strict resume, stale temporaries, save before the final evaluation."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch

from replaid.cli import main
from replaid.eval.evaluate import evaluate
from replaid.presets import resolve
from replaid.store import checkpoint as ck
from replaid.store import runfolder
from replaid.training.train import train as _train

train = partial(_train, evaluate=evaluate)  # the trainer with the evaluation commands/train.py wires in

ARGS = ("train.steps=6", "train.save_every=2", "train.log_every=1", "eval.max_batches=1", "train.num_threads=1")
TIMING = {"time", "tokens_per_s", "eval/seconds"}


def cfg(*extra):
    return resolve("debug", None, [*ARGS, *extra])


def rows(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


def tensors(run: Path) -> dict[str, torch.Tensor]:
    c = ck.find_checkpoint(run)
    out = {}
    for name in ("model", "ema", "optimizer", "rng"):
        out.update({f"{name}/{k}": v for k, v in (ck.load_tensors(c, name) or {}).items()})
    return out


def assert_same_run(run: Path, ref: Path) -> None:
    """Bit-exact: every saved tensor (weights, EMA, optimizer moments, RNG) equal, and the metrics
    rows (timings aside) identical, one per logged step, in order."""
    a, b = tensors(run), tensors(ref)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    assert rows(run) == rows(ref)
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 6


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ref") / "run"
    train(cfg(), run, progress=False)
    return run


class Fault(Exception):
    pass


def inject(monkeypatch, owner, name: str, k: int, when=lambda *a, **kw: True):
    """Make the k-th call of ``owner.name`` (among those ``when`` accepts) raise :class:`Fault`."""
    real, seen = getattr(owner, name), [0]

    def faulty(*a, **kw):
        if when(*a, **kw):
            seen[0] += 1
            if seen[0] == k:
                raise Fault(f"{name} call {k}")
        return real(*a, **kw)

    monkeypatch.setattr(owner, name, faulty)


def in_checkpoints(*a, **kw):
    return "checkpoints" in str(a[0]) or (len(a) > 1 and "checkpoints" in str(a[1]))


# (what fails, k-th call): first save (step 2), middle saves, the final save (step 6), pruning
FAULTS = [
    ("save_file", 1),
    ("save_file", 11),
    ("_write_json", 2),
    ("rename", 1),
    ("rename", 3),
    ("replace", 2),
    ("replace", 3),
    ("rmtree", 1),
    ("fsync_dir", 4),
]


@pytest.mark.parametrize("name,k", FAULTS)
def test_a_failing_save_step_leaves_a_run_that_resumes_bit_exactly(ref, tmp_path, monkeypatch, name, k):
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        if name in ("save_file", "_write_json", "fsync_dir"):
            inject(m, ck, name, k)
        elif name == "rmtree":
            inject(m, shutil, "rmtree", k, when=in_checkpoints)
        else:
            inject(m, os, name, k, when=in_checkpoints)
        with pytest.raises(Fault):
            train(cfg(), run, progress=False)
    before = ck.latest_checkpoint(run)  # loadable at once (None: the fault hit the first save)
    assert before is None or ck.load_state(before)["step"] in (2, 4, 6)
    assert before is None or ck.read_latest(run / "checkpoints")[0] == before  # LATEST itself stays valid
    train(cfg(), run, resume=True, progress=False)
    assert_same_run(run, ref)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


KILL = """
import os, sys
from replaid.store import checkpoint as ck
from replaid.cli import main

real, seen = {owner}.{name}, [0]
def dying(*a, **kw):
    if {when}:
        seen[0] += 1
        if seen[0] == {k}:
            os._exit(9)
    return real(*a, **kw)
{owner}.{name} = dying
sys.exit(main(["train", "--preset", "debug", "--out", sys.argv[1], "--no-progress", *sys.argv[2:]]))
"""


@pytest.mark.parametrize(
    "owner,name,k,when",
    [
        # the final save renamed step_6 into place, then died before LATEST named it
        ("os", "replace", 3, "str(a[1]).endswith('LATEST')"),
        # died in the middle of writing the final checkpoint's files
        ("ck", "save_file", 9, "True"),
    ],
)
def test_death_at_a_save_step_leaves_a_run_that_resumes_bit_exactly(ref, tmp_path, owner, name, k, when):
    run = tmp_path / "run"
    script = KILL.format(owner=owner, name=name, k=k, when=when)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(run), *ARGS], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr[-2000:]
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 4
    train(cfg(), run, resume=True, progress=False)
    assert_same_run(run, ref)


def test_latest_missing_broken_or_outside_falls_back_and_says_so(ref, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    shutil.copytree(ref, tmp_path / "other")  # a complete checkpoint outside the run, named by ../..
    newest = ck.find_checkpoint(run)
    latest = run / "checkpoints" / "LATEST"
    for content in (None, "step_9999999", "../../other/checkpoints/step_0000006", "\x00garbage"):
        if content is None:
            latest.unlink(missing_ok=True)
        else:
            latest.write_text(content)
        assert ck.find_checkpoint(run) == newest
        assert "using the newest complete checkpoint" in capsys.readouterr().err
    shutil.rmtree(newest)  # LATEST names a removed folder: the older complete one is used
    older = ck.find_checkpoint(run)
    assert older != newest and ck.load_state(older)["step"] == 4


def test_a_step_is_never_saved_twice_and_a_nan_checkpoint_never_written(ref, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    c = ck.find_checkpoint(run)
    mtime = (c / "model.safetensors").stat().st_mtime_ns
    assert ck.save_checkpoint(run, 6, {"w": torch.zeros(1)}, {}) == c  # a no-op: LATEST names step 6
    assert (c / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(ck.CheckpointError, match="NaN"):
        ck.save_checkpoint(run, 7, {"w": torch.tensor([float("nan")])}, {})
    assert ck.find_checkpoint(run) == c and not (run / "checkpoints" / "step_0000007").exists()


def test_second_trainer_is_refused_naming_the_holder(tmp_path, capsys):
    run = tmp_path / "run"
    with runfolder.lock(run):
        code = main(["train", "--preset", "debug", "--out", str(run), "--no-progress", *ARGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "in use by another trainer" in err[0] and f"pid {os.getpid()}" in err[0]
    assert not (run / "config.json").exists()


def test_existing_run_needs_resume_or_overwrite(ref, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    snapshot = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".lock" not in p.name}
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".lock" not in p.name} == snapshot
    # a finished run resumed again: nothing retrained, nothing rewritten, the recorded evaluation
    res = train(cfg(), run, resume=True, progress=False)
    assert res["step"] == 6 and res["eval"] == runfolder.read_final_eval(ref)["eval"]
    assert {
        p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".lock" not in p.name and "tb" not in p.parts
    } == {p: b for p, b in snapshot.items() if "tb" not in p.parts}
    assert runfolder.status(run)["state"] == "finished"
    train(resolve("debug", None, ["train.steps=2"]), run, overwrite=True, progress=False)
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["LATEST", "step_0000002"]


def test_resume_without_optimizer_state_is_refused_unless_weights_only(ref, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    c = ck.find_checkpoint(run)
    (c / "optimizer.json").unlink()
    assert main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=7"]) == 2
    assert "lacks optimizer.json" in capsys.readouterr().err
    assert (
        main(["train", "--out", str(run), "--resume", "--resume-weights-only", "--no-progress", "train.steps=7"]) == 0
    )
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 7


def test_stale_temporaries_are_removed_and_a_torn_metrics_line_dropped(ref, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    (run / "checkpoints" / ".step_0000008.abc").mkdir()
    (run / "checkpoints" / ".LATEST.tmp.123").write_text("step_0000008")
    (run / ".config.json.tmp.123").write_text("{")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "loss": 1.')
    train(cfg("train.steps=8"), run, resume=True, progress=False)
    assert not [p for p in run.rglob(".*") if p.name not in (".lock", ".lock.owner")]
    steps = [r["step"] for r in rows(run) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_start_killed_before_its_config_leaves_a_folder_that_starts_again(ref, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(ref / "tokenizer", run / "tokenizer")  # the tokenizer is saved before config.json
    (run / "tokenizer" / ".tokenizer.json.tmp.99").write_text("{")
    train(cfg(), run, progress=False)
    assert_same_run(run, ref)


def test_the_final_checkpoint_is_saved_before_the_final_evaluation(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("evaluation failed")

    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        _train(resolve("debug", None, ["train.steps=3"]), run, evaluate=broken, progress=False)
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 3
    assert runfolder.status(run)["state"] == "interrupted"


def test_a_full_disk_keeps_the_checkpoint_in_force_and_every_file_whole(ref, tmp_path, monkeypatch):
    import errno

    from replaid import fileio

    run = tmp_path / "run"
    shutil.copytree(ref, run)
    good = ck.find_checkpoint(run)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(ck, "save_file", full)
        with pytest.raises(ck.CheckpointError, match="free disk space"):
            ck.save_checkpoint(run, 7, {"w": torch.zeros(1)}, {})
    assert ck.find_checkpoint(run) == good and not [p for p in (run / "checkpoints").iterdir() if p.name[0] == "."]
    spec = run / "tokenizer" / "tokenizer_spec.json"
    old = spec.read_bytes()
    monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(OSError):
        fileio.atomic_write_text(spec, "{}")
    assert spec.read_bytes() == old and not [p for p in spec.parent.iterdir() if p.name[0] == "."]


SIGNAL_AT = """
import os, signal, sys
from replaid.training import train as tr
from replaid.cli import main

real, n = tr.Trainer.train_step, [0]
def stepping(self, *a, **kw):
    out = real(self, *a, **kw)
    n[0] += 1
    if n[0] == {k}:  # a real signal to this process, as SLURM / timeout / submitit send it
        os.kill(os.getpid(), signal.{sig})
    return out
tr.Trainer.train_step = stepping
sys.exit(main(["train", "--preset", "debug", "--out", sys.argv[1], "--no-progress", *sys.argv[2:]]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_a_preemption_signal_saves_exits_75_and_the_run_resumes_bit_exactly(ref, tmp_path, sig):
    """With checkpoints off (save_every=0), SIGTERM/SIGUSR1 at step 3 of 6 saves step 3 and exits 75
    (EX_TEMPFAIL, which the scaling runner reports as preempted); --resume ends where the uninterrupted
    run ends."""
    from replaid.training.train import PREEMPTED_EXIT

    run = tmp_path / "run"
    script = textwrap.dedent(SIGNAL_AT.format(k=3, sig=sig))
    r = subprocess.run(
        [sys.executable, "-c", script, str(run), *ARGS, "train.save_every=0"], capture_output=True, text=True
    )
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("replaid:")]
    assert r.returncode == PREEMPTED_EXIT and err[-1].startswith(f"replaid: preempted: {sig} received"), r.stderr
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 3 and "--resume" in err[-1]
    assert not (run / runfolder.OWNER).exists()
    train(cfg(), run, resume=True, progress=False)
    assert_same_run(run, ref)
    a, b = (runfolder.read_final_eval(x)["eval"] for x in (run, ref))
    assert a.pop("seconds") > 0 and b.pop("seconds") > 0 and a == b  # the same final bound, to the bit


SIGNAL_IN_FINAL_EVAL = """
import os, signal, sys
from replaid.eval import evaluate as ev
from replaid.cli import main

real = ev.evaluate
def evaluating(trainer, *a, **kw):
    if trainer.step == trainer.cfg.train.steps:  # the final evaluation, after the last save
        os.kill(os.getpid(), signal.SIGTERM)
    return real(trainer, *a, **kw)
ev.evaluate = evaluating
sys.exit(main(["train", "--preset", "debug", "--out", sys.argv[1], "--no-progress", *sys.argv[2:]]))
"""


@pytest.mark.slow
def test_sigterm_during_the_final_evaluation_exits_75_and_resume_evaluates(ref, tmp_path):
    """A signal after the last step's checkpoint, during the final evaluation, stops at once with exit 75
    (not killed by the signal: -15), leaves no final_eval.json, and --resume evaluates the saved step
    to the same bound as the uninterrupted run."""
    from replaid.training.train import PREEMPTED_EXIT

    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", SIGNAL_IN_FINAL_EVAL, str(run), *ARGS], capture_output=True, text=True)
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("replaid:")]
    assert r.returncode == PREEMPTED_EXIT, r.stderr
    assert "SIGTERM received during the final evaluation" in err[-1] and "--resume" in err[-1]
    assert ck.load_state(ck.find_checkpoint(run))["step"] == 6 and runfolder.read_final_eval(run) is None
    assert not (run / runfolder.OWNER).exists()
    train(cfg(), run, resume=True, progress=False)
    a, b = (runfolder.read_final_eval(x)["eval"] for x in (run, ref))
    assert a.pop("seconds") > 0 and b.pop("seconds") > 0 and a == b


@pytest.mark.slow
def test_sigterm_through_grid_run_stops_saves_exits_75_and_the_rerun_ends_bit_exactly(tmp_path):
    """``replaid grid run`` (local executor, subprocess runs) forwards SIGTERM to its running training
    run, which saves a checkpoint and stops; the second run is never started; the command exits 75.
    Rerunning ``grid run`` resumes the stopped run and starts the other: the stopped run's weights,
    optimizer, RNG and final bound equal those of an uninterrupted run of the same config, to the bit."""
    import signal
    import time

    from replaid.config import RunConfig
    from replaid.training.train import PREEMPTED_EXIT

    g = tmp_path / "g"
    over = ["train.steps=60", "eval.max_batches=1", "train.log_every=1", "train.save_every=0", "train.num_threads=1"]
    assert main(["grid", "plan", "--base", "debug", "--out", str(g), "--seeds", "2", "--", *over]) == 0
    first, second = g / "runs" / "base__s0", g / "runs" / "base__s1"
    cmd = [sys.executable, "-m", "replaid", "grid", "run", str(g), "--max-parallel", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.time()
    while not ((first / "metrics.jsonl").exists() and '"step"' in (first / "metrics.jsonl").read_text()):
        assert p.poll() is None and time.time() - t0 < 300, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)  # to the runner only, as SLURM / timeout / docker stop send it
    out, err = p.communicate(timeout=300)
    assert p.returncode == PREEMPTED_EXIT, err
    assert "SIGTERM: stopping; 1 run(s) not started" in err and "rerun 'replaid grid run" in err.splitlines()[-1]
    stopped = ck.load_state(ck.find_checkpoint(first))["step"]
    assert 1 <= stopped < 60 and runfolder.read_final_eval(first) is None  # saved mid-run, not finished
    assert not second.exists() and not (g / "logs" / "base__s1.log").exists()  # nothing started after the signal
    assert "base__s1" not in err
    assert "replaid: preempted: SIGTERM received" in (g / "logs" / "base__s0.log").read_text()

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "--resume" in (g / "logs" / "base__s0.log").read_text()  # the rerun resumed, not restarted
    ref = tmp_path / "ref"  # the same config, uninterrupted
    train(RunConfig.from_dict(json.loads((g / "configs" / "base__s0.json").read_text())), ref, progress=False)
    a, b = tensors(first), tensors(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(first) == rows(ref)
    fa, fb = (runfolder.read_final_eval(x)["eval"] for x in (first, ref))
    assert fa.pop("seconds") > 0 and fb.pop("seconds") > 0 and fa == fb  # the same final bound, to the bit
    assert runfolder.read_final_eval(second) is not None
