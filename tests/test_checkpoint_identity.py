"""Issue 49: a checkpoint's identity. ``state.json``'s config and the run's ``config.json`` agree on every
key that defines the model and its data (``sample`` and ``eval`` refuse a mismatch in one line naming the
key); the sha256 record covers ``state.json``'s config and every file of the checkpoint (a record that
does not list one, or lists one that is gone, is an error); ``train --resume`` refuses a ``config.json``
edited behind the checkpoint's back, naming the key; ``--no-verify`` on a sharded (DCP) checkpoint with a
truncated or deleted shard is one line, not a traceback. Each case was seen failing on the old code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.store import checkpoint as ck

L, BLOCK = 16, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """``bd3`` (MDLM with blocks of 4) and ``plain`` (MDLM without blocks), 2 steps each."""
    root = tmp_path_factory.mktemp("identity")
    out = {}
    for name, block in (("bd3", BLOCK), ("plain", 0)):
        sets = ["method=mdlm", f"mdlm.block_size={block}", f"data.seq_len={L}", "train.steps=2", "eval.max_batches=1"]
        argv = ["train", "--preset", "debug", "--out", str(root / name), "--no-progress", "train.num_threads=1"]
        assert main([*argv, *sets]) == 0
        out[name] = root / name
    return out


def copy(src: Path, tmp: Path) -> Path:
    run = tmp / src.name
    shutil.copytree(src, run)
    return run


def one_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), (rc, err)
    return err[0]


def snapshot(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def edit_json(f: Path, change) -> None:
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d, indent=2))


COMMANDS = {
    "sample": ["sample", "{run}", "--num", "1", "--steps", "2"],
    "eval": ["eval", "{run}", "--max-batches", "1"],
}
EDITS = [  # (run, key, edit of a config dict)
    ("bd3", "mdlm.block_size", lambda c: c["mdlm"].update(block_size=8)),
    ("bd3", "data.seq_len", lambda c: c["data"].update(seq_len=32)),
    ("plain", "mdlm.block_size", lambda c: c["mdlm"].update(block_size=4)),  # blocks given to a run without
    ("bd3", "data.tokenizer", lambda c: c["data"].update(tokenizer="gpt2")),
    ("bd3", "model.n_layers", lambda c: c["model"].update(n_layers=3)),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name, key, change", EDITS, ids=[f"{n}-{k}" for n, k, _ in EDITS])
def test_state_json_config_edited_by_hand_is_refused(runs, tmp_path, capsys, command, name, key, change):
    """Verified: the record's digest of the config names state.json's config; --no-verify: config.json's
    disagreement names the key. Nothing of the run changes."""
    run = copy(runs[name], tmp_path)
    st = ck.find_checkpoint(run) / "state.json"
    edit_json(st, lambda d: change(d["config"]))
    before = snapshot(run)
    argv = [a.format(run=run) for a in COMMANDS[command]]
    capsys.readouterr()
    line = one_line(capsys, main(argv))
    assert str(st) in line and 'field "config"' in line and "sha256" in line, line
    line = one_line(capsys, main(["--no-verify", *argv]))
    assert key in line and "config.json" in line and "state.json" in line, line
    assert snapshot(run) == before


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name, key, change", EDITS, ids=[f"{n}-{k}" for n, k, _ in EDITS])
def test_config_json_edited_by_hand_is_refused_by_sample_and_eval(runs, tmp_path, capsys, command, name, key, change):
    run = copy(runs[name], tmp_path)
    edit_json(run / "config.json", change)
    before = snapshot(run)
    capsys.readouterr()
    line = one_line(capsys, main([a.format(run=run) for a in COMMANDS[command]]))
    assert key in line and str(run / "config.json") in line, line
    assert snapshot(run) == before


def test_a_key_that_does_not_define_the_model_may_differ(runs, tmp_path, capsys):
    """config.json's train.steps is the first call's after a resume with train.steps=N: not a mismatch."""
    run = copy(runs["bd3"], tmp_path)
    edit_json(run / "config.json", lambda c: c["train"].update(steps=7, log_every=3))
    edit_json(run / "config.json", lambda c: c["eval"].update(batch_size=3))
    assert main(["sample", str(run), "--num", "1", "--steps", "2"]) == 0


def test_resume_refuses_a_config_json_edited_behind_the_checkpoint(runs, tmp_path, capsys):
    """Issue 49: a hand-edited block size (4 -> 8) in config.json was adopted by --resume with no word."""
    run = copy(runs["bd3"], tmp_path)
    edit_json(run / "config.json", lambda c: c["mdlm"].update(block_size=8))
    before = snapshot(run)
    capsys.readouterr()
    line = one_line(capsys, main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]))
    assert "mdlm.block_size" in line and "8" in line and "--resume" in line, line
    assert snapshot(run) == before
    edit_json(run / "config.json", lambda c: c["optim"].update(lr_backbone=0.5))  # optim too: any key but steps
    edit_json(run / "config.json", lambda c: c["mdlm"].update(block_size=BLOCK))
    line = one_line(capsys, main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]))
    assert "optim.lr_backbone" in line, line
    edit_json(run / "config.json", lambda c: c["optim"].update(lr_backbone=json.loads((runs["bd3"] / "config.json")
                                                                 .read_text())["optim"]["lr_backbone"]))  # fmt: skip
    assert main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]) == 0


def test_the_record_covers_the_config_and_every_file(runs):
    c = ck.find_checkpoint(runs["bd3"])
    st = ck.load_state(c)
    rec = st["sha256"]
    files = sorted(p.name for p in c.iterdir() if p.is_file() and p.name != "state.json")
    assert sorted(k for k in rec if k != ck.CONFIG_DIGEST) == files and "optimizer.json" in files
    assert rec[ck.CONFIG_DIGEST] == ck.config_digest(st["config"])
    assert all(rec[n] == ck.sha256_file(c / n) for n in files)


@pytest.mark.parametrize("omitted", ["optimizer.json", "ema.safetensors", "rng.safetensors"])
def test_a_record_that_does_not_list_every_file_is_an_error(runs, tmp_path, capsys, omitted):
    run = copy(runs["bd3"], tmp_path)
    st = ck.find_checkpoint(run) / "state.json"
    edit_json(st, lambda d: d["sha256"].pop(omitted))
    capsys.readouterr()
    line = one_line(capsys, main(["eval", str(run), "--max-batches", "1"]))
    assert str(st) in line and omitted in line, line
    line = one_line(capsys, main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]))
    assert str(st) in line and omitted in line, line
    assert main(["--no-verify", "sample", str(run), "--num", "1", "--steps", "2"]) == 0


def test_an_optimizer_json_changed_after_it_was_written_is_named(runs, tmp_path, capsys):
    run = copy(runs["bd3"], tmp_path)
    f = ck.find_checkpoint(run) / "optimizer.json"
    edit_json(f, lambda d: d["param_groups"][0].update(lr=123.0))
    capsys.readouterr()
    line = one_line(capsys, main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]))
    assert str(f) in line and "sha256" in line, line


def test_a_recorded_file_that_is_gone_is_an_error_not_a_fallback(runs, tmp_path, capsys):
    """ema.safetensors deleted: the old code sampled from the trained (non-EMA) weights with no word."""
    run = copy(runs["bd3"], tmp_path)
    f = ck.find_checkpoint(run) / "ema.safetensors"
    f.unlink()
    capsys.readouterr()
    line = one_line(capsys, main(["sample", str(run), "--num", "1", "--steps", "2"]))
    assert str(f) in line and "missing" in line, line


def sharded_copy(run: Path) -> Path:
    """The run's checkpoint written again, one step on, in the sharded (DCP) format (one process)."""
    stored = ck.Stored.open(run)
    state = {k: v for k, v in stored.state.items() if k not in ("sha256", "step")}
    sd = {"model": stored.weights(ema=False)[0], "ema": stored.tensors("ema")}
    out = ck.save_sharded_checkpoint(run, stored.step + 1, sd, state)
    assert out is not None and ck.Stored.open(run).sharded
    return out


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_no_verify_on_a_damaged_shard_is_one_line_not_a_traceback(runs, tmp_path, capsys, damage):
    run = copy(runs["bd3"], tmp_path)
    c = sharded_copy(run)
    assert main(["eval", str(run), "--max-batches", "1"]) == 0  # the sharded copy loads
    f = c / "sharded" / "__0_0.distcp"
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        f.unlink()
    capsys.readouterr()
    for command in (["eval", str(run), "--max-batches", "1"], ["sample", str(run), "--num", "1", "--steps", "2"]):
        line = one_line(capsys, main(["--no-verify", *command]))
        assert str(c) in line and "unreadable shards" in line, line
        line = one_line(capsys, main(command))
        assert str(f) in line, line
    assert f.exists() or damage == "deleted"


def test_a_shard_the_record_omits_is_an_error(runs, tmp_path, capsys):
    """A record that omits a shard: the shard was loaded unchecked (a changed one without a word)."""
    run = copy(runs["bd3"], tmp_path)
    c = sharded_copy(run)
    edit_json(c / "state.json", lambda d: d["sha256"].pop("sharded/__0_0.distcp"))
    capsys.readouterr()
    line = one_line(capsys, main(["eval", str(run), "--max-batches", "1"]))
    assert "sharded/__0_0.distcp" in line and str(c / "state.json") in line, line
