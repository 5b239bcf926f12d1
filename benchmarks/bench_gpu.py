"""For the first user with a GPU: tokens/s, step time, peak memory and MFU of the real training step.

    python benchmarks/bench_gpu.py                                   # owt-0.1b, L = 1024, bf16, one GPU
    torchrun --nproc_per_node 8 benchmarks/bench_gpu.py --per-device-batch 32   # DDP over 8 GPUs
    python benchmarks/bench_gpu.py --preset debug --per-device-batch 4 --steps 2 --device cpu  # CI smoke run
    python benchmarks/bench_gpu.py --set method=mdlm --max-batch --json   # the largest batch that fits, measured

One process per device (torchrun sets RANK/WORLD_SIZE; DDP, or ``--set train.parallel=fsdp``).
Each rank runs ``--warmup`` then ``--steps`` timed optimiser steps of ``Trainer.train_step`` on random
tokens (logging, i.e. a host sync, only on the last step). MFU = training FLOPs per token
(``replaid.training.flops``) x tokens/s per device / the matmul peak measured on the same device (bf16
on GPU, fp32 on CPU; ``--peak-tflops`` gives it instead) and, on a GPU whose datasheet peak is known,
/ that peak. Peak memory: ``torch.cuda.max_memory_allocated`` on GPU (next to the memory model's
estimate, ``replaid memory``), the process's max RSS on CPU. Rank 0 appends a dated row to
docs/benchmarks.md unless ``--no-record`` or ``--json`` (one JSON object on the last line instead).

``--max-batch`` (one CUDA device): after one step at batch 2 (so AdamW's state exists), tries single
training steps at growing, then bisected, per-device batches from the memory model's prediction
(``replaid.training.memory.largest_batch`` for the device's whole memory), catching out-of-memory
errors, and reports the largest batch that ran, the smallest that did not and the prediction.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results, datasheet_bf16_flops, device_name, peak_matmul_flops, sync


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="owt-0.1b")
    p.add_argument("--per-device-batch", type=int, default=32)
    p.add_argument("--length", type=int, default=None, help="default: the preset's L (1024 for owt-0.1b)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--compile", action="store_true", help="train.compile=on (default: off, the eager step)")
    p.add_argument("--set", nargs="*", default=[], help="config overrides k=v")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the matmul peak (TFLOP/s) for MFU; default: measured here for 2 s",
    )
    p.add_argument("--max-batch", action="store_true", help="measure the largest per-device batch that fits")
    p.add_argument("--max-probes", type=int, default=12, help="--max-batch: at most this many trial steps")
    p.add_argument("--json", action="store_true", help="print one JSON object (and do not record)")
    p.add_argument("--no-record", action="store_true")
    return p


def build(a):
    """(cfg, trainer, device, world, V, bf16) for the arguments ``a``."""
    from replaid import dist
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.store.loading import resolve_device
    from replaid.training.memory import preset_vocab
    from replaid.training.train import (
        EMA,
        Trainer,
        TrainModule,
        build_optimizer,
        compile_loss,
        compiles,
    )

    dev = dist.setup_device(resolve_device(a.device or ("cuda" if torch.cuda.is_available() else "cpu")))
    world = dist.world_size()
    L = a.length
    cfg = resolve(
        a.preset,
        None,
        [
            f"train.batch_size={a.per_device_batch * world}",
            f"train.precision={a.precision}",
            f"train.compile={'on' if a.compile else 'off'}",
            *([f"data.seq_len={L}"] if L else []),
            *a.set,
        ],
    )
    V = preset_vocab(cfg)
    torch.manual_seed(0)
    method = get_method(cfg)
    model = method.build_model(V).to(dev)
    tr = Trainer(cfg, model, method, None, dev, EMA(model, cfg.optim.ema) if cfg.optim.ema > 0 else None)
    tr.loss_module = dist.wrap_model(TrainModule(model, method), cfg.train.parallel, dev)
    tr.optimizer = build_optimizer(model, cfg.optim)
    if compiles(cfg.train.compile, dev):
        compile_loss(model, method)
    bf16 = cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and dev.type == "cuda")
    return cfg, tr, dev, world, V, bf16


def random_batch(V: int, B: int, L: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"tokens": torch.randint(0, V, (B, L), generator=g)}]


def max_batch(a, cfg, tr, dev, V: int, bf16: bool) -> dict:
    """The largest per-device batch whose training step runs on ``dev`` (module docstring)."""
    from replaid.training.memory import largest_batch

    L = cfg.data.seq_len
    total = torch.cuda.get_device_properties(dev).total_memory
    predicted = largest_batch(cfg, V, total, bf16)
    tr.train_step(random_batch(V, 2, L, 0), log=False)  # AdamW's moments and the EMA exist from here on
    sync(dev)
    tried: list[dict] = []

    def fits(b: int) -> bool:
        ok, err = True, ""
        try:
            tr.train_step(random_batch(V, b, L, b), log=False)
            sync(dev)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:  # cuBLAS's workspace can fail outside the allocator
            if not isinstance(e, torch.cuda.OutOfMemoryError) and not re.search(r"out of memory|ALLOC_FAILED", str(e)):
                raise
            ok, err = False, str(e).splitlines()[0][:160]
        tr.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        peak = torch.cuda.max_memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        tried.append({"batch": b, "fits": ok, "peak_gb": peak / 1e9, **({"error": err} if err else {})})
        print(f"max-batch: batch {b}: {'fits' if ok else 'out of memory'} (peak {peak / 1e9:.2f} GB)", flush=True)
        return ok

    lo, hi, b = 0, None, max(1, predicted)
    while len(tried) < a.max_probes:  # bracket: grow by 15% from a fit, shrink by 15% from a failure
        if fits(b):
            lo = b
            if hi is not None:
                break
            b = max(b + 1, int(b * 1.15))
        else:
            hi = b
            if lo:
                break
            b = max(1, int(b * 0.85))
            if b == hi:
                break
    while hi is not None and hi - lo > max(1, lo // 50) and len(tried) < a.max_probes:  # bisect to 2%
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {
        "max_batch": lo,
        "first_failing_batch": hi,
        "predicted_max_batch": predicted,
        "device_memory_gb": total / 1e9,
        "resolution": max(1, lo // 50),
        "probes": tried,
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"),
    }


def main() -> None:
    a = build_parser().parse_args()
    if a.max_batch and not (a.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        print("replaid: error: --max-batch measures CUDA memory; run it on a GPU (--device cuda)", file=sys.stderr)
        sys.exit(2)
    from replaid import dist
    from replaid.training.flops import train_flops_per_token
    from replaid.training.memory import estimate

    cfg, tr, dev, world, V, bf16 = build(a)
    L, B = cfg.data.seq_len, a.per_device_batch
    info = {
        "preset": a.preset,
        "method": cfg.method,
        "L": L,
        "V": V,
        "precision": "bf16" if bf16 else "fp32",
        "compile": cfg.train.compile,
        "device": device_name(dev),
        "devices": world,
    }
    if a.max_batch:
        res = {**info, **max_batch(a, cfg, tr, dev, V, bf16)}
        print(json.dumps(res) if a.json else res, flush=True)
        dist.cleanup()
        return
    batch = random_batch(V, B, L, 1 + dist.rank())
    peak = a.peak_tflops * 1e12 if a.peak_tflops else peak_matmul_flops(dev, torch.bfloat16 if bf16 else torch.float32)
    t_compile = time.perf_counter()
    for _ in range(a.warmup):
        tr.train_step(batch, log=False)
    sync(dev)
    warmup_s = time.perf_counter() - t_compile
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for k in range(a.steps):
        m = tr.train_step(batch, log=k == a.steps - 1)
    sync(dev)
    step_s = (time.perf_counter() - t0) / a.steps
    tok_s = B * L * world / step_s
    flops_tok = train_flops_per_token(cfg, V)
    mfu = flops_tok * tok_s / world / peak
    sheet = datasheet_bf16_flops(dev) if bf16 else None
    mem = (
        torch.cuda.max_memory_allocated(dev)
        if dev.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    reserved = torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else None
    est = estimate(cfg, V, B, bf16).peak
    if a.json:
        if dist.is_main():
            print(
                json.dumps(
                    {
                        **info,
                        "batch": B,
                        "steps": a.steps,
                        "warmup": a.warmup,
                        "warmup_s": warmup_s,
                        "step_s": step_s,
                        "tokens_per_s": tok_s,
                        "train_flops_per_token": flops_tok,
                        "peak_tflops_used": peak / 1e12,
                        "mfu": mfu,
                        "datasheet_tflops": sheet / 1e12 if sheet else None,
                        "mfu_datasheet": flops_tok * tok_s / world / sheet if sheet else None,
                        "peak_mem_gb": mem / 1e9,
                        "reserved_gb": reserved / 1e9 if reserved else None,
                        "model_gb": est / 1e9,
                        "loss": m.get("loss", float("nan")),
                    }
                ),
                flush=True,
            )
        dist.cleanup()
        return
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
        print(" | ".join(f"{h}={x}" for h, x in zip(header, row, strict=True)), flush=True)
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
