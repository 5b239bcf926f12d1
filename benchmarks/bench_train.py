"""Training throughput, step time, peak memory and MFU for presets at several L and batch sizes.

    python benchmarks/bench_train.py --preset debug demo owt-0.1b --lengths 128 1024 --batches 4 16
    python benchmarks/bench_train.py --preset owt-0.1b --lengths 1024 --batches 8 --chunk 0 4096  # head memory

Each configuration runs in a fresh subprocess (clean peak-memory reading): a few warm-up steps,
then timed steps of the real training step (Algorithm 1 with self-conditioning, AdamW) on random
tokens. MFU = (training FLOPs per token x tokens/s) / the peak matmul FLOP/s measured in the same
process (bf16 on GPU, fp32 on CPU). Results are appended to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_one_option, append_results, device_name, peak_matmul_flops, run_isolated, run_one_if_asked, sync


def one(
    preset: str, L: int, B: int, steps: int, chunk: int, device: str, vocab: int | None, compile_: bool, ckpt: bool
) -> dict:
    from replaid.config import set_key
    from replaid.methods import get_method
    from replaid.presets import get_preset
    from replaid.training.flops import train_flops_per_token
    from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer

    cfg = get_preset(preset)
    for k, v in {
        "data.seq_len": L,
        "train.batch_size": B,
        "model.head_chunk_rows": chunk,
        "model.activation_checkpointing": ckpt,
        "train.compile": "on" if compile_ else "off",
    }.items():
        set_key(cfg, k, v)
    cfg.validate()
    dev = torch.device(device)
    V = vocab or (
        cfg.data.bpe_vocab_size
        if cfg.data.tokenizer == "bpe"
        else {"gpt2": 50257, "llama2": 32000}.get(cfg.data.tokenizer, 30522)
    )
    method = get_method(cfg)
    model = method.build_model(V).to(dev)
    if compile_:
        model.backbone.compile()
    opt = build_optimizer(model, cfg.optim)
    tr = Trainer(
        cfg,
        model,
        method,
        opt,
        dev,
        EMA(model, cfg.optim.ema) if cfg.optim.ema > 0 else None,
        loss_module=TrainModule(model, method),
    )
    batch = [{"tokens": torch.randint(0, V, (B, L))}]
    peak_flops = peak_matmul_flops(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    warm = 2
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(warm):
        tr.train_step(batch)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.train_step(batch)
    sync(dev)
    dt = (time.perf_counter() - t0) / steps
    tok_s = B * L / dt
    fpt = train_flops_per_token(cfg, V)
    mem = (
        torch.cuda.max_memory_allocated(dev)
        if dev.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "preset": preset,
        "L": L,
        "B": B,
        "V": V,
        "chunk": chunk,
        "step_s": dt,
        "tokens_per_s": tok_s,
        "peak_mem_gb": mem / 2**30,
        "rss_before_gb": rss0 * 1024 / 2**30,
        "model_flops_per_s": fpt * tok_s,
        "peak_matmul_flops": peak_flops,
        "mfu": fpt * tok_s / peak_flops,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "device": device_name(dev),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=["debug", "demo"])
    p.add_argument("--lengths", type=int, nargs="+", default=[128])
    p.add_argument("--batches", type=int, nargs="+", default=[8])
    p.add_argument("--chunk", type=int, nargs="+", default=[0], help="model.head_chunk_rows values")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--act-ckpt", action="store_true")
    p.add_argument("--no-record", action="store_true")
    add_one_option(p)
    a = p.parse_args()
    if run_one_if_asked(a, one):
        return
    rows, results = [], []
    for preset in a.preset:
        for L in a.lengths:
            for B in a.batches:
                for chunk in a.chunk:
                    spec = dict(
                        preset=preset,
                        L=L,
                        B=B,
                        steps=a.steps,
                        chunk=chunk,
                        device=a.device,
                        vocab=a.vocab,
                        compile_=a.compile,
                        ckpt=a.act_ckpt,
                    )
                    res, stderr = run_isolated(__file__, spec)
                    if res is None:
                        err = (stderr.strip().splitlines() or ["?"])[-1]
                        print(f"{preset} L={L} B={B} chunk={chunk}: failed: {err}", flush=True)
                        rows.append([preset, L, B, chunk, "failed", "", "", "", err[:60]])
                        continue
                    results.append(res)
                    print(
                        f"{preset:9s} L={L:5d} B={B:4d} chunk={chunk:5d} step {res['step_s']:.3f}s "
                        f"{res['tokens_per_s']:9.0f} tok/s  peak {res['peak_mem_gb']:.2f} GiB  "
                        f"MFU {100 * res['mfu']:.1f}%",
                        flush=True,
                    )
                    rows.append(
                        [
                            preset,
                            L,
                            B,
                            chunk,
                            res["step_s"],
                            res["tokens_per_s"],
                            res["peak_mem_gb"],
                            f"{100 * res['mfu']:.1f}%",
                            f"{res['peak_matmul_flops'] / 1e12:.3g}",
                        ]
                    )
    if results and not a.no_record:
        dev = results[0]["device"]
        append_results(
            f"Training throughput, {dev}",
            ["preset", "L", "batch", "head chunk", "step s", "tokens/s", "peak mem GiB", "MFU", "peak matmul TFLOP/s"],
            rows,
            f"`python benchmarks/bench_train.py {' '.join(sys.argv[1:])}`. MFU counts training FLOPs "
            f"(`replaid.flops`, incl. the 8.3% self-conditioning pass) over the measured matmul peak "
            f"({'bf16' if 'CPU' not in dev else 'fp32'}). CPU peak memory is the process's max RSS.",
        )


if __name__ == "__main__":
    main()
