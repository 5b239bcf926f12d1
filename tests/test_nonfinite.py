"""The NaN/Inf guard: a non-finite step is skipped (weights, EMA, statistics unchanged) and counted;
too many in a row stop the run naming the likely causes and the checkpoint still in force, which
stays the last one saved before the streak; perplexity overflows to inf, never to an exception."""

import json
import math
from functools import partial

import pytest
import torch

from replaid.eval.evaluate import evaluate, ppl
from replaid.presets import resolve
from replaid.store import checkpoint as ck
from replaid.training.train import TrainingDiverged, TrainModule
from replaid.training.train import train as _train

train = partial(_train, evaluate=evaluate)  # the trainer with the evaluation commands/train.py wires in


def poison(monkeypatch, bad_calls, snapshots=None):
    """Multiply the training loss by NaN on the given forward calls (one call per step here)."""
    real, calls = TrainModule.forward, [0]

    def forward(self, *a, **k):
        calls[0] += 1
        if snapshots is not None:
            snapshots.append({n: v.detach().clone() for n, v in self.model.state_dict().items()})
        loss, m = real(self, *a, **k)
        return (loss * math.nan, m) if calls[0] in bad_calls else (loss, m)

    monkeypatch.setattr(TrainModule, "forward", forward)


def test_a_nonfinite_step_is_skipped_and_counted(tmp_path, monkeypatch):
    snaps = []
    poison(monkeypatch, {3}, snaps)
    run = tmp_path / "run"
    train(resolve("debug", None, ["train.steps=5", "train.log_every=1", "eval.max_batches=1"]), run, progress=False)
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)
    assert same(snaps[2], snaps[3])  # step 3 (NaN) left the weights as step 2 made them
    assert not same(snaps[3], snaps[4])  # step 4 trained again
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "skipped" in r}
    assert [rows[s]["skipped"] for s in range(1, 6)] == [0, 0, 1, 0, 0]
    assert rows[5]["nonfinite_steps"] == 1
    c = ck.find_checkpoint(run)
    assert ck.load_state(c)["step"] == 5 and ck.nonfinite_tensor(ck.load_tensors(c, "model")) is None


def test_a_nonfinite_streak_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    poison(monkeypatch, set(range(3, 100)))
    run = tmp_path / "run"
    cfg = resolve(
        "debug", None, ["train.steps=20", "train.save_every=2", "train.max_nonfinite_steps=3", "eval.max_batches=1"]
    )
    with pytest.raises(TrainingDiverged) as e:
        train(cfg, run, progress=False)
    msg = str(e.value)
    assert "3 steps in a row up to step 5" in msg and "learning rate" in msg and "gamma_0" in msg
    assert "step_0000002" in msg
    assert (run / "checkpoints" / "LATEST").read_text() == "step_0000002"  # not step 4, saved mid-streak
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["LATEST", "step_0000002"]


def test_perplexity_overflows_to_inf():
    assert ppl(1.0) == pytest.approx(math.e)
    assert ppl(800.0) == math.inf and ppl(math.inf) == math.inf
    assert math.isnan(ppl(math.nan))
