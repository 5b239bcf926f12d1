"""For the first user with a GPU: tokens/s, step time, peak memory and MFU of the real training step.

    python benchmarks/bench_gpu.py                                   # owt-0.1b, L = 1024, bf16, one GPU
    torchrun --nproc_per_node 8 benchmarks/bench_gpu.py --per-device-batch 32   # DDP over 8 GPUs
    python benchmarks/bench_gpu.py --preset debug --per-device-batch 4 --steps 2 --device cpu  # CI smoke run

One process per device (torchrun sets RANK/WORLD_SIZE; DDP, or ``--set train.parallel=fsdp``).
Each rank runs ``--warmup`` then ``--steps`` timed optimiser steps of ``Trainer.train_step`` on random
tokens (logging, i.e. a host sync, only on the last step). MFU = training FLOPs per token
(``replaid.training.flops``) x tokens/s per device / the matmul peak measured on the same device (bf16
on GPU, fp32 on CPU). Peak memory: ``torch.cuda.max_memory_allocated`` on GPU (next to the memory
model's estimate, ``replaid memory``), the process's max RSS on CPU. Rank 0 appends a dated row to
docs/benchmarks.md unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results, device_name, peak_matmul_flops, sync  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="owt-0.1b")
    p.add_argument("--per-device-batch", type=int, default=32)
    p.add_argument("--length", type=int, default=None, help="default: the preset's L (1024 for owt-0.1b)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--compile", action="store_true", help="train.compile=true")
    p.add_argument("--set", nargs="*", default=[], help="config overrides k=v")
    p.add_argument("--no-record", action="store_true")
    a = p.parse_args()

    from replaid import dist
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.flops import train_flops_per_token
    from replaid.training.memory import estimate, preset_vocab
    from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer, compile_loss, resolve_device

    dev = dist.setup_device(resolve_device(a.device))
    world = dist.world_size()
    L = a.length
    cfg = resolve(
        a.preset,
        None,
        [
            f"train.batch_size={a.per_device_batch * world}",
            f"train.precision={a.precision}",
            f"train.compile={str(a.compile).lower()}",
            *([f"data.seq_len={L}"] if L else []),
            *a.set,
        ],
    )
    L, V, B = cfg.data.seq_len, preset_vocab(cfg), a.per_device_batch
    torch.manual_seed(0)
    method = get_method(cfg)
    model = method.build_model(V).to(dev)
    tr = Trainer(cfg, model, method, None, dev, EMA(model, cfg.optim.ema) if cfg.optim.ema > 0 else None)
    tr.loss_module = dist.wrap_model(TrainModule(model, method), cfg.train.parallel, dev)
    tr.optimizer = build_optimizer(model, cfg.optim)
    if cfg.train.compile:
        compile_loss(model, method)
    g = torch.Generator().manual_seed(1 + dist.rank())
    batch = [{"tokens": torch.randint(0, V, (B, L), generator=g)}]
    bf16 = cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and dev.type == "cuda")
    peak = peak_matmul_flops(dev, torch.bfloat16 if bf16 else torch.float32)
    for _ in range(a.warmup):
        tr.train_step(batch, log=False)
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for k in range(a.steps):
        m = tr.train_step(batch, log=k == a.steps - 1)
    sync(dev)
    step_s = (time.perf_counter() - t0) / a.steps
    tok_s = B * L * world / step_s
    mfu = train_flops_per_token(cfg, V) * tok_s / world / peak
    mem = (
        torch.cuda.max_memory_allocated(dev)
        if dev.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    est = estimate(cfg, V, B, bf16).peak
    row = [
        a.preset,
        cfg.method,
        L,
        B,
        world,
        "bf16" if bf16 else "fp32",
        cfg.train.compile,
        f"{step_s:.4g}",
        f"{tok_s:.4g}",
        f"{mem / 1e9:.3g}",
        f"{est / 1e9:.3g}",
        f"{100 * mfu:.1f}%",
        f"{peak / 1e12:.3g}",
        f"{m.get('loss', float('nan')):.4g}",
    ]
    header = [
        "preset",
        "method",
        "L",
        "batch/device",
        "devices",
        "precision",
        "compile",
        "step s",
        "tokens/s",
        "peak mem GB",
        "model GB",
        "MFU",
        "matmul TFLOP/s",
        "loss",
    ]
    if dist.is_main():
        print(" | ".join(f"{h}={x}" for h, x in zip(header, row)), flush=True)
        if not a.no_record:
            append_results(
                f"Training step, {device_name(dev)} x{world}",
                header,
                [row],
                f"`{'torchrun --nproc_per_node ' + str(world) + ' ' if world > 1 else 'python '}"
                f"benchmarks/bench_gpu.py {' '.join(sys.argv[1:])}`. Peak memory: max allocated on GPU "
                f"(max RSS on CPU); 'model GB' is `replaid memory`'s estimate for this batch.",
            )
    dist.cleanup()


if __name__ == "__main__":
    main()
