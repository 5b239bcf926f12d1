"""Issue 36 §3: the scaling model's byte counts (scaling/cluster.py) against what FSDP2 and HSDP issue on
gloo ranks (torch.multiprocessing, CPU): the sizes of the all-gathers, reduce-scatters and all-reduces
of one optimiser step with 2 accumulation steps, counted where FSDP2 calls torch.distributed; and the
``replaid plan-cluster`` table."""

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from replaid.scaling import cluster

pytestmark = [pytest.mark.distributed]

COUNTED = ("all_gather_single", "reduce_scatter_single", "all_reduce")


def _worker(rank: int, world: int, port: int, parallel: str, shard: int, accum: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1"
    )
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from replaid import dist
        from replaid.methods import get_method
        from replaid.presets import resolve
        from replaid.training.train import TrainModule

        cfg = resolve("debug", None, [])
        torch.manual_seed(0)
        method = get_method(cfg)
        model = method.build_model(512)
        module = dist.wrap_model(TrainModule(model, method), parallel, torch.device("cpu"), shard)
        sizes = {k: 0 for k in COUNTED}
        real = {k: getattr(tdist, k) for k in COUNTED}

        def counting(name):
            def call(*a, **kw):
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if "fsdp" in caller:  # FSDP2's own collectives (not the trainer's scalar reductions)
                    key = "input" if name == "reduce_scatter_single" else "output"  # the full size
                    t = kw[key] if key in kw else (kw["tensor"] if "tensor" in kw else a[1 if key == "input" else 0])
                    sizes[name] += t.numel() * t.element_size()
                return real[name](*a, **kw)

            return call

        for k in COUNTED:
            setattr(tdist, k, counting(k))
        for k in range(accum):  # one optimiser step as the trainer takes it: forward + backward per micro-batch
            tokens = torch.randint(0, 512, (4, cfg.data.seq_len), generator=torch.Generator().manual_seed(k))
            loss, _ = module(tokens, torch.Generator().manual_seed(100 + k))
            (loss / accum).backward()
        for k in COUNTED:
            setattr(tdist, k, real[k])
        if rank == 0:
            torch.save(sizes, out)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def measure(tmp_path, world: int, parallel: str, shard: int, accum: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / f"{parallel}{world}.pt")
    mp.spawn(_worker, args=(world, port, parallel, shard, accum, out), nprocs=world, join=True)
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("world, parallel, shard", [(2, "fsdp", 0), (4, "hsdp", 2)])
def test_the_models_collective_bytes_match_what_fsdp2_issues_on_gloo(tmp_path, monkeypatch, world, parallel, shard):
    from replaid.presets import resolve

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    got = measure(tmp_path, world, parallel, shard, accum=2)
    cfg = resolve("debug", None, [])
    blocks, root = cluster.block_params(cfg, 512)
    nodes, gpus = (1, world) if parallel == "fsdp" else (world // shard, shard)
    assert cluster.self_conditioned(cfg)
    want = cluster.step_bytes(parallel, blocks, root, nodes, gpus, 2, True, cfg.model.n_layers)
    assert got["all_gather_single"] > 0 and got["reduce_scatter_single"] > 0
    for k, name in (("all_gather", "all_gather_single"), ("reduce_scatter", "reduce_scatter_single")):
        # FSDP2 pads each parameter to a multiple of the shard count: at most a few bytes per parameter
        assert got[name] == pytest.approx(want[k], rel=0.01), (k, got, want)
    assert got["all_reduce"] == pytest.approx(want["all_reduce"], rel=0.01), (got, want)


def test_plan_cluster_prints_the_table_for_the_papers_sizes():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "replaid",
            "plan-cluster",
            "--preset",
            "owt-0.1b",
            "isoflop-413m",
            "isoflop-1708m",
            "--nodes",
            "1",
            "2",
            "16",
            "--budget",
            "1e20",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith(("owt-0.1b", "isoflop-"))]
    assert len(rows) == 9  # the paper's 0.1B, 0.4B and 1.7B on 1, 2 and 16 nodes
    bad = subprocess.run(
        [sys.executable, "-m", "replaid", "plan-cluster", "--nodes", "3", "--gpus-per-node", "7"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "does not split over 21 ranks" in lines[0]
