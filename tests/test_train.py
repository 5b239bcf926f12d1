"""End-to-end training, checkpoints, resume, evaluation and the CLI's handling of bad input."""

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from replaid.cli import main
from replaid.eval.evaluate import evaluate
from replaid.presets import optim_scaling, resolve
from replaid.store import checkpoint as ck
from replaid.training.train import lr_at
from replaid.training.train import train as _train

train = partial(_train, evaluate=evaluate)  # the trainer with the evaluation commands/train.py wires in


def debug_cfg(*overrides):
    return resolve("debug", None, list(overrides))


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[row["step"]] = row["loss"]
    return out


def test_debug_training_lowers_the_nelbo(tmp_path):
    cfg = debug_cfg("train.steps=60", "train.log_every=1", "optim.ema=0", "eval.max_batches=4", "eval.t_samples=4")
    first = train(
        debug_cfg("train.steps=1", "optim.ema=0", "eval.max_batches=4", "eval.t_samples=4"),
        tmp_path / "a",
        progress=False,
    )
    res = train(cfg, tmp_path / "b", progress=False)
    before, after = first["eval"]["nelbo_nats_per_token"], res["eval"]["nelbo_nats_per_token"]
    assert after < before - 0.3, (before, after)
    assert res["eval"]["nelbo_ppl"] < 600


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    args = ("train.steps=12", "train.log_every=1", "train.save_every=6")
    train(debug_cfg(*args), tmp_path / "full", progress=False)
    train(debug_cfg(*args), tmp_path / "part", progress=False, stop_after=6)
    assert not (tmp_path / "part" / "metrics.jsonl").read_text().count('"step": 7,')
    cfg = debug_cfg(*args)
    train(cfg, tmp_path / "part", resume=True, progress=False)
    full, part = losses(tmp_path / "full"), losses(tmp_path / "part")
    for s in range(7, 13):
        assert part[s] == pytest.approx(full[s], rel=1e-9, abs=1e-12), s
    a = ck.load_tensors(ck.find_checkpoint(tmp_path / "full"), "model")
    b = ck.load_tensors(ck.find_checkpoint(tmp_path / "part"), "model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_a_finished_run_with_more_steps_evaluates_the_new_end(tmp_path):
    """A finished run resumed with a larger train.steps gets a final evaluation at its new last step (it
    once returned the old step's evaluation as the new one and left final_eval.json at the old step)."""
    run = tmp_path / "run"
    first = train(debug_cfg("train.steps=5"), run, progress=False)
    res = train(debug_cfg("train.steps=10"), run, resume=True, progress=False)
    final = json.loads((run / "final_eval.json").read_text())
    assert final["step"] == 10 and final["eval"] == res["eval"] != first["eval"]
    assert any(
        r["step"] == 10 and "eval/nelbo_nats_per_token" in r for r in map(json.loads, open(run / "metrics.jsonl"))
    )
    again = train(debug_cfg("train.steps=10"), run, resume=True, progress=False)  # finished: the same evaluation
    assert again["eval"] == res["eval"]


def test_checkpoint_is_atomic_and_pickle_free(tmp_path, monkeypatch):
    run = tmp_path / "r"
    train(debug_cfg("train.steps=2"), run, progress=False)
    good = ck.find_checkpoint(run)
    files = sorted(p.name for p in good.iterdir())
    assert files == [
        "ema.safetensors",
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "rng.safetensors",
        "state.json",
    ]
    state = json.loads((good / "state.json").read_text())
    assert state["config"]["preset"] == "debug" and state["step"] == 2

    # a crash in the middle of writing the next checkpoint leaves the previous one in force
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ck, "save_file", boom)
    with pytest.raises(RuntimeError):
        ck.save_checkpoint(run, 3, {"w": torch.zeros(1)}, {"x": 1})
    assert ck.find_checkpoint(run) == good
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".step")]


def test_lr_schedules():
    o = optim_scaling()
    total = 1000
    assert lr_at(0, 2e-4, o, total) == pytest.approx(2e-4 / 100)  # 1% warm-up, at least 100 steps
    assert lr_at(99, 2e-4, o, total) == pytest.approx(2e-4)
    assert lr_at(total, 2e-4, o, total) == pytest.approx(2e-5)
    assert lr_at(total, 1e-2, o, total) == pytest.approx(2e-5)  # embeddings: 1e-2 -> 2e-5
    mid = lr_at(100 + 450, 2e-4, o, total)
    assert mid == pytest.approx(2e-5 + (2e-4 - 2e-5) * 0.5, rel=1e-6)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=4"]) == 0
    return run


def test_cli_eval_json(trained, capsys):
    assert main(["eval", str(trained), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for k in ("nelbo_ppl", "nelbo_nats_per_token", "recon", "diffusion", "prior", "tokens", "unigram_ppl"):
        assert k in res
    assert res["nelbo_nats_per_token"] == pytest.approx(res["recon"] + res["diffusion"] + res["prior"])


def test_cli_sample_json(trained, capsys, tmp_path):
    assert main(["sample", str(trained), "--num", "2", "--steps", "4", "--length", "8", "--json"]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(x) for x in out.splitlines()]
    assert len(rows) == 2 and rows[0]["nfe"] == 5 and len(rows[0]["ids"]) == 8
    V = json.loads((trained / "tokenizer" / "tokenizer_spec.json").read_text())["vocab_size"]
    assert rows[0]["vocab_size"] == V and all(max(r["ids"]) < r["vocab_size"] for r in rows)
    (tmp_path / "s.jsonl").write_text(out)  # quality reads them, the ids checked against their vocab_size
    assert main(["quality", str(tmp_path / "s.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entropy_units"] == "sample ids"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "--preset", "debug", "--out", "{tmp}/x", "model.hiden=3"], "did you mean 'model.hidden'"),
        (["train", "--preset", "debug", "--out", "{tmp}/x", "train.steps=ten"], "expects a whole number"),
        (["train", "--preset", "debug", "--out", "{tmp}/x", "data.source={tmp}/missing.jsonl"], "missing.jsonl"),
        (["train", "--preset", "debug", "--out", "{tmp}/x", "data.source={tmp}/empty.jsonl"], "empty"),
        (["train", "--preset", "nope"], "unknown preset"),
        (["eval", "{tmp}/no-run"], "no run or checkpoint"),
        (["train", "--preset", "debug", "--out", "{tmp}/x", "data.tokenizer=wordpiece"], "tokenizer"),
    ],
)
def test_cli_bad_input_one_line_error(tmp_path, args, needle):
    (tmp_path / "empty.jsonl").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("replaid: error:") and needle in lines[0], r.stderr
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_checkpoint_of_another_model_is_rejected(trained, tmp_path):
    bad = tmp_path / "bad"
    ckpt = ck.find_checkpoint(trained)
    import shutil

    shutil.copytree(trained, bad)
    c2 = ck.find_checkpoint(bad)
    st = json.loads((c2 / "state.json").read_text())
    st["config"]["model"]["hidden"] = 64  # pretend it is another model
    (c2 / "state.json").write_text(json.dumps(st))  # issue 49: the record's digest of the config refuses it first
    r = run_cli("eval", str(bad), "--json")
    assert r.returncode == 2 and 'field "config" does not match the sha256' in r.stderr
    st["sha256"][ck.CONFIG_DIGEST] = ck.config_digest(st["config"])  # the record and config.json agree with it
    (c2 / "state.json").write_text(json.dumps(st))
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model"]["hidden"] = 64
    (bad / "config.json").write_text(json.dumps(cfg))
    r = run_cli("eval", str(bad), "--json")
    assert r.returncode == 2 and "does not match this model" in r.stderr
    assert ck.find_checkpoint(trained) == ckpt


def test_damaged_checkpoint_is_reported(trained, tmp_path):
    import shutil

    bad = tmp_path / "dmg"
    shutil.copytree(trained, bad)
    (ck.find_checkpoint(bad) / "model.safetensors").write_bytes(b"not a safetensors file")
    (ck.find_checkpoint(bad) / "ema.safetensors").unlink()
    r = run_cli("eval", str(bad))
    assert r.returncode == 2 and "damaged" in r.stderr


def test_tokens_out_of_range_are_rejected(tmp_path):
    import numpy as np

    from replaid.data import DataError, validate_tokens

    with pytest.raises(DataError, match="range|vocab"):
        validate_tokens(np.array([1, 2, 600], dtype=np.uint16), 512)


def test_ema_matches_closed_form():
    """After updates with weights w_1..w_n, shadow = d^n w_0 + sum_k (1-d) d^(n-k) w_k."""
    from replaid.training.train import EMA

    m = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(1.0)
    ema, d = EMA(m, 0.9), 0.9
    ref = 1.0
    for w in (2.0, -1.0, 5.0):
        with torch.no_grad():
            m.weight.fill_(w)
        ema.update(m)
        ref = d * ref + (1 - d) * w
    assert torch.allclose(ema.shadow["weight"], torch.full((1, 2), ref))
    with ema.applied(m):
        assert torch.allclose(m.weight, torch.full((1, 2), ref))
    assert torch.equal(m.weight, torch.full((1, 2), 5.0))  # raw weights restored


def test_logged_diagnostics_per_group_gradients_and_embedding_geometry(tmp_path):
    """Issue 34 §1's logged quantities: at a logged step (log_every=1: a window of one step) the groups'
    gradient norms combine to the total norm; the embedding's mean row norm and mean pairwise cosine
    equal an independent numpy computation on the saved weights (replaid.eval.geometry)."""
    import math

    import numpy as np

    from replaid.eval.geometry import mean_pairwise_cosine

    cfg = debug_cfg("train.steps=3", "train.log_every=1", "optim.ema=0", "eval.max_batches=1", "train.save_every=3")
    train(cfg, tmp_path / "r", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    groups = {"embedding", "schedule_mlp", "endpoints", "projections", "backbone"}
    for r in rows:
        assert {k.split("/", 1)[1] for k in r if k.startswith("grad_norm/")} == groups
        total = math.sqrt(sum(v**2 for k, v in r.items() if k.startswith("grad_norm/")))
        assert total == pytest.approx(r["grad_norm"], rel=1e-5)
    w = ck.load_tensors(ck.find_checkpoint(tmp_path / "r"), "model")["embedding.weight"].double().numpy()
    assert rows[-1]["emb_norm"] == pytest.approx(float(np.linalg.norm(w, axis=1).mean()), rel=1e-12)
    assert rows[-1]["emb_cosine"] == pytest.approx(mean_pairwise_cosine(w), abs=1e-12)
