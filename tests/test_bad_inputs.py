"""The hostile-user table: every bad input ends in one line ``replaid: error: ...`` naming the
problem, exit status 2, and leaves the run folder (or the absent --out) exactly as it was."""

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replaid.cli import main
from replaid.training import checkpoint as ck

NEW = ["train", "--preset", "debug", "--no-progress", "--out", "{new}"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("bad") / "run"
    assert (
        main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2", "eval.max_batches=1"])
        == 0
    )
    return run


def corrupt_state_list(run):
    (ck.find_checkpoint(run) / "state.json").write_text("[1, 2]")


def corrupt_state_keys(run):
    (ck.find_checkpoint(run) / "state.json").write_text('{"step": 2}')


def corrupt_optimizer(run):
    (ck.find_checkpoint(run) / "optimizer.json").write_text("garbage{")


def corrupt_config(run):
    (run / "config.json").write_text("{not json")


def corrupt_tokenizer_spec(run):
    (run / "tokenizer" / "tokenizer_spec.json").write_text("")


def nan_weights(run):
    c = ck.find_checkpoint(run)
    for name in ("model", "ema"):
        sd = load_file(str(c / f"{name}.safetensors"))
        save_file(
            {k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in sd.items()},
            str(c / f"{name}.safetensors"),
        )


def split_folder(run):
    tmp = run.parent
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"doc {i} " * 40}) + "\n" for i in range(40))
    )
    (tmp / "corpus" / "valid.jsonl").write_text(json.dumps({"text": "x"}) + "\n")


CASES = [
    # (command, message fragment, how to damage a copy of the trained run first)
    (NEW + ["train.log_every=0"], "train.log_every: must be >= 1", None),
    (NEW + ["train.device=tpu"], "train.device", None),
    (NEW + ["train.device=cuda"] if not torch.cuda.is_available() else NEW + ["train.device=tpu"], "device", None),
    (NEW + ["train.num_threads=-1"], "train.num_threads: must be >= 0", None),
    (NEW + ["optim.lr_backbone=inf"], "optim.lr_backbone: must be a finite number", None),
    (NEW + ["optim.grad_clip=nan"], "optim.grad_clip: must be a finite number", None),
    (NEW + ["train.max_nonfinite_steps=0"], "train.max_nonfinite_steps", None),
    (NEW + ["data.source={tmp}/corpus"], "the valid split", split_folder),
    (["train", "--preset", "debug", "--no-progress", "--out", "{run}"], "already holds a run", None),
    (
        ["train", "--preset", "debug", "--no-progress", "--out", "{tmp}/afile"],
        "is a file",
        lambda run: (run.parent / "afile").write_text("x"),
    ),
    (["train", "--preset", "debug", "--no-progress", "--out", "/proc/replaid-run"], "cannot write to run folder", None),
    (["train", "--out", "{run}", "--resume", "--overwrite"], "pass one of them", None),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "not a replaid state", corrupt_state_list),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "lacks config", corrupt_state_keys),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "optimizer.json is damaged", corrupt_optimizer),
    (["train", "--out", "{run}", "--resume"], "config.json is not a valid run config", corrupt_config),
    (["eval", "{run}"], "tokenizer_spec.json is damaged", corrupt_tokenizer_spec),
    (["eval", "{run}"], "non-finite weights", nan_weights),
    (["eval", "{run}", "--t-samples", "0"], "--t-samples 0: invalid config value eval.t_samples", None),
    (["eval", "{run}", "--max-batches", "-1"], "--max-batches -1", None),
    (["sample", "{run}", "--batch-size", "0"], "--batch-size 0: must be >= 1", None),
    (["sample", "{run}", "--length", "100000000"], "beyond the run's trained length", None),
    (["sample", "{run}", "--num", "-1"], "--num -1: must be >= 1", None),
    (["sample", "{run}", "--num", "0"], "--num 0: must be >= 1", None),
    (["sample", "{run}", "--steps", "0"], "--steps 0: must be >= 1", None),
    (["sample", "{run}", "--temperature", "0"], "--temperature 0.0", None),
    (["sample", "{run}", "--prompt", "return the value " * 40], "leaving nothing to generate", None),
]


def files(root: Path) -> dict:
    if not root.exists():
        return {}
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".lock" not in p.name}


@pytest.mark.parametrize("argv,needle,damage", CASES, ids=[" ".join(c[0][-2:])[:40] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(trained, tmp_path, capsys, argv, needle, damage):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    if damage is not None:
        damage(run)
    before = files(tmp_path)
    argv = [
        a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)).replace("{new}", str(tmp_path / "new"))
        for a in argv
    ]
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("replaid: error: ")]  # besides progress bars (tokenizing)
    assert errors == err[-1:] and needle in errors[0] and "Traceback" not in "".join(err), err
    assert files(tmp_path) == before  # nothing written, nothing damaged, no new --out left behind


def test_damaged_cache_meta_names_the_file(trained, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(os.environ["REPLAID_CACHE_DIR"], cache)
    monkeypatch.setenv("REPLAID_CACHE_DIR", str(cache))
    for meta in cache.glob("valid-*.json"):
        meta.write_text("{garbage")
    assert main(["eval", str(trained)]) == 2
    err = capsys.readouterr().err.strip()
    assert "token cache meta" in err and "valid-" in err and "delete it" in err


def test_debug_flag_and_environment_show_the_traceback(tmp_path, monkeypatch):
    from replaid.config import ConfigError

    with pytest.raises(ConfigError, match="train.log_every"):
        main(["--debug", "train", "--preset", "debug", "--out", str(tmp_path / "x"), "train.log_every=0"])
    monkeypatch.setenv("REPLAID_DEBUG", "1")
    with pytest.raises(ConfigError, match="train.log_every"):
        main(["train", "--preset", "debug", "--out", str(tmp_path / "x"), "train.log_every=0"])
