"""torchrun with the gloo backend on CPU: DDP (and FSDP2) training equals single-process training
with the same global batch (gradient accumulation standing in for the ranks)."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from replaid.store import checkpoint as ck

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

COMMON = ["--preset", "debug", "--no-progress", "train.steps=5", "train.batch_size=8", "train.log_every=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def curve(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    run([sys.executable, "-m", "replaid", "train", "--out", str(out), *COMMON, "train.grad_accum=2"])
    return out


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_two_ranks_match_single_process(single, tmp_path, parallel):
    out = tmp_path / parallel
    run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "-m",
            "replaid",
            "train",
            "--out",
            str(out),
            *COMMON,
            f"train.parallel={parallel}",
        ]
    )
    a, b = curve(single), curve(out)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-6)
        assert y["B_r"] == x["B_r"]  # the adaptive split is tied across ranks
    st = ck.load_state(ck.find_checkpoint(out))
    assert st["ranks_in_sync"] is True and st["world_size"] == 2
    assert st.get("format") == ("dcp" if parallel == "fsdp" else None)  # FSDP2: sharded (DCP), DDP: one file
    wa = ck.load_tensors(ck.find_checkpoint(single), "model")
    wb = ck.Stored(ck.find_checkpoint(out), st).weights(ema=False)[0]  # read from the shards in one process
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), k
    # the checkpoint loads in a single process (another world size)
    from replaid.cli import main

    assert main(["eval", str(out), "--json", "--max-batches", "1"]) == 0
