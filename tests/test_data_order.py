"""Issue 36 §2, data order across world sizes: 1, 2 and 4 gloo ranks (torch.multiprocessing, CPU,
loopback) drawing from the training pipeline as the training loop does (``grad_accum`` micro-batches
per step from ``DataPipeline.train_iter``) see exactly the same global batches in the same order,
across epoch boundaries and across a resume saved on one world size and continued on another."""

import json
import os

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from replaid.data.pipeline import DataPipeline
from replaid.presets import resolve

pytestmark = [pytest.mark.distributed]

# 45 sequences of 1,024 tokens: 5 global batches of 8 an epoch (5 sequences dropped), so 12 steps
# cross two epoch boundaries; the resume point (step 7) lies inside epoch 1
OVR = ["train.batch_size=8", "data.max_docs=8", "data.seq_len=1024", "train.seed=3"]
STEPS, SAVE_AT = 12, 7


def pipeline(rank: int, world: int, accum: int) -> DataPipeline:
    return DataPipeline(resolve("debug", None, [*OVR, f"train.grad_accum={accum}"]), None, rank=rank, world_size=world)


def draw(pipe: DataPipeline, rank: int, world: int, accum: int, steps: int, state=None):
    """Each step's global batch (B, L), put together by the trainer's slot ``k * world + rank``, and
    the loader state after ``SAVE_AT`` steps (as a checkpoint's state.json records it)."""
    if state is not None:
        pipe.train_loader.load_state_dict(state)
    out, saved = [], None
    for step in range(steps):
        local = torch.stack([next(pipe.train_iter)["tokens"] for _ in range(accum)])  # (accum, micro, L)
        parts = [torch.zeros_like(local) for _ in range(world)]
        if world > 1:
            tdist.all_gather(parts, local)
        else:
            parts = [local]
        out.append(torch.cat([parts[r][k] for k in range(accum) for r in range(world)]))
        if step + 1 == SAVE_AT:
            saved = json.loads(json.dumps(pipe.train_loader.state_dict()))
    return out, saved


def _worker(rank: int, world: int, port: int, cache: str, accum: int, state, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", REPLAID_CACHE_DIR=cache)
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pipe = pipeline(rank, world, accum)
        full, saved = draw(pipe, rank, world, accum, STEPS)
        resumed, _ = draw(pipeline(rank, world, accum), rank, world, accum, STEPS - SAVE_AT, state)
        if rank == 0:
            torch.save({"full": torch.stack(full), "resumed": torch.stack(resumed), "saved": saved}, result)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def spawn(world: int, accum: int, state: dict, tmp_path, cache: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = str(tmp_path / f"w{world}.pt")
    mp.spawn(_worker, args=(world, port, cache, accum, state, result), nprocs=world, join=True)
    return torch.load(result, weights_only=True)


def test_one_two_and_four_ranks_see_the_same_global_batches(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("REPLAID_CACHE_DIR", cache)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pipe = pipeline(0, 1, 1)  # one process, no accumulation: the reference (and fills the token cache)
    assert len(pipe.train_loader.dataset) == 45 and pipe.train_loader.steps_per_epoch == 5
    ref, state1 = draw(pipe, 0, 1, 1, STEPS)
    ref = torch.stack(ref)  # (12, 8, 1024)
    assert state1 == {"epoch": 1, "index": 2, "global_batch": 8}
    assert len({tuple(r[:, 0].tolist()) for r in ref}) == STEPS  # no batch repeats: epochs reshuffle

    two = spawn(2, 2, state1, tmp_path, cache)  # 2 ranks x 2 accumulation steps x 2 rows
    assert torch.equal(two["full"], ref)
    assert torch.equal(two["resumed"], ref[SAVE_AT:])  # saved on 1 process, resumed on 2 ranks
    four = spawn(4, 1, two["saved"], tmp_path, cache)  # 4 ranks x 2 rows
    assert torch.equal(four["full"], ref)
    assert torch.equal(four["resumed"], ref[SAVE_AT:])  # saved on 2, resumed on 4
    one, _ = draw(pipeline(0, 1, 4), 0, 1, 4, STEPS - SAVE_AT, four["saved"])  # saved on 4, resumed on 1 (accum 4)
    assert torch.equal(torch.stack(one), ref[SAVE_AT:])
