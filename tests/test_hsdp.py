"""Issue 36 §2: train.parallel=hsdp, FSDP2 on a 2-D (replicate x shard) device mesh, on 4 gloo ranks as a
2 x 2 mesh: its losses equal DDP's on 4 ranks and one process's with 4 accumulation steps (the same
global batch of 8, the same micro-batches and noise), and its sharded checkpoint holds each parameter
in 2 shards (sharded within a group of 2, replicated across the 2 groups), read back whole in one process."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from replaid.store import checkpoint as ck
from replaid.store import sharded

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

COMMON = ["--preset", "debug", "--no-progress", "train.steps=3", "train.batch_size=8", "train.log_every=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(out, *extra, ranks=1):
    launch = [sys.executable, "-m"]
    if ranks > 1:
        launch += ["torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(free_port()), "-m"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [*launch, "replaid", "train", "--out", str(out), *COMMON, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


def test_hsdp_on_a_2x2_mesh_equals_ddp_and_one_process(tmp_path):
    one = train(tmp_path / "one", "train.grad_accum=4")
    ddp = train(tmp_path / "ddp", "train.parallel=ddp", ranks=4)
    hsdp = train(tmp_path / "hsdp", "train.parallel=hsdp", "train.hsdp_shard=2", ranks=4)
    assert len(one) == len(ddp) == len(hsdp) == 3
    for a, b, c in zip(one, ddp, hsdp, strict=True):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
        assert c == pytest.approx(b, rel=1e-5, abs=1e-6)
    c = ck.find_checkpoint(tmp_path / "hsdp")
    st = ck.load_state(c)
    assert st["format"] == "dcp" and st["ranks_in_sync"] is True
    md = sharded.read_metadata(c / "sharded")
    big = [k for k, m in md.state_dict_metadata.items() if k.startswith("model.") and getattr(m, "size", (0,))[0] >= 4]
    assert big and all(len(md.state_dict_metadata[k].chunks) == 2 for k in big)  # 2 shards: the mesh is 2 x 2
    wa = ck.load_tensors(ck.find_checkpoint(tmp_path / "one"), "model")
    wb = ck.Stored(c, st).weights(ema=False)[0]
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), k
