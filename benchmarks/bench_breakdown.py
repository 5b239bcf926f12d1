"""Where one training step's time goes, per method (issue 53 §1): a profiler breakdown and a bytes model.

    python benchmarks/bench_breakdown.py --preset demo --methods ar mdlm replaid --device cpu
    python benchmarks/bench_breakdown.py --tiny --json          # seconds on a CPU (the gpu_check test)

Per method, ``--steps`` profiled steps after one warm-up, of the trainer's step taken apart: ``data`` (the
batch to the device), ``forward`` (the method's training loss, under the run's autocast), ``backward``,
``optimiser`` (clipping, AdamW, zeroing); each timed by the wall clock with the device synchronised (the
median over steps). Inside them, ``torch.profiler`` times the named regions of :mod:`replaid.regions`
(the self-conditioning pass, the final logit head, the output prior logits, the categorical
reparameterisation, the per-element loss, the loss aggregation, attention, input projections), inclusive
of what they contain (the self-conditioning pass contains a head), and the fused heads' backward
(``*Backward`` of :mod:`replaid.model.head`); CUDA time on a GPU, CPU time elsewhere.

``bytes_model``: the (N, V) traffic of RePlaid's fused head and loss (the part that is memory-bound
beyond its FLOPs), pass by pass, against the token models' fused cross-entropy. The last line of
stdout is one JSON object (``--json``); a markdown table is printed before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name

TINY = ["model.hidden=64", "model.n_layers=2", "model.n_heads=2", "model.cond_dim=32", "data.seq_len=64"]
PHASES = ["data", "forward", "backward", "optimiser"]

# bytes per (N, V) element, pass by pass (reads + writes), of replaid.model.head's two functions
REPLAID_HEAD_PASSES = {
    "forward": [
        ("head matmul output (bf16)", 2),
        ("to float32", 6),
        ("+ bias", 8),
        ("+ output prior logits (addmm_)", 8),
        ("log-sum-exp: max, shift, exp, sum", 24),
        ("softmax into the workspace", 8),
        ("e_hat = p E (read p)", 4),
    ],
    "backward": [
        ("p = exp(logits - lse), in place", 16),
        ("dE += p^T g_e (read p)", 4),
        ("g_e E^T into the workspace", 4),
        ("- <g_e, e_hat> + g_nll", 16),
        ("d = p * (...)", 12),
        ("to bf16 for the head's matmuls", 6),
        ("d W, d^T f (read bf16 twice)", 4),
        ("d b = sum over rows", 4),
        ("d zs = d E; dE += d^T zs", 8),
    ],
}
TOKEN_CE_PASSES = {
    "forward": [("head matmul output (bf16)", 2), ("chunk to float32", 6), ("log-sum-exp", 24)],
    "backward": [("chunk to float32", 6), ("shift, exp, scale", 24), ("back to bf16", 6), ("d W, d^T f", 4)],
}


def bytes_model(N: int, V: int, sc_rate: float, bandwidth: float | None) -> dict:
    """GB moved per step by the (N, V) passes (the self-conditioning pass repeats the forward on sc_rate of
    the rows); seconds at ``bandwidth`` bytes/s when given."""
    out = {}
    for name, passes, sc in (("replaid_head", REPLAID_HEAD_PASSES, sc_rate), ("token_ce", TOKEN_CE_PASSES, 0.0)):
        fwd = sum(b for _, b in passes["forward"])
        bwd = sum(b for _, b in passes["backward"])
        per = fwd * (1 + sc) + bwd
        gb = per * N * V / 1e9
        out[name] = {
            "bytes_per_logit": per,
            "gb": gb,
            "seconds": gb * 1e9 / bandwidth if bandwidth else None,
            "passes": {k: [f"{n}: {b}" for n, b in v] for k, v in passes.items()},
        }
    return out


def profile_method(method: str, overrides: list[str], preset: str, device: str, steps: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from replaid import regions
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.scaling.plan import planned_vocab_size
    from replaid.training.train import TrainModule, autocast_ctx, build_optimizer

    cfg = resolve(preset, None, [f"method={method}", "optim.ema=0", *overrides])
    dev = torch.device(device)
    torch.manual_seed(0)
    m = get_method(cfg)
    V = planned_vocab_size(cfg)  # the tokenizer's (GPT-2's 50,257 at owt-0.1b), not the BPE setting
    model = m.build_model(V).to(dev)
    loss_module = TrainModule(model, m)
    opt = build_optimizer(model, cfg.optim)
    B, L = cfg.train.batch_size, cfg.data.seq_len
    gen = torch.Generator().manual_seed(0)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(times: dict[str, list[float]] | None) -> None:
        t0 = time.perf_counter()
        marks = []
        with record_function("data"):
            tokens = torch.randint(0, V, (B, L), generator=gen).to(dev, non_blocking=True)
            sync()
        marks.append(time.perf_counter())
        with record_function("forward"), autocast_ctx(dev, cfg.train.precision):
            loss, _ = loss_module(tokens, gen)
            sync()
        marks.append(time.perf_counter())
        with record_function("backward"):
            loss.backward()
            sync()
        marks.append(time.perf_counter())
        with record_function("optimiser"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        marks.append(time.perf_counter())
        if times is not None:
            for name, a, b in zip(PHASES, [t0, *marks[:-1]], marks, strict=True):
                times[name].append(b - a)

    m.before_step()
    step(None)  # warm-up
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof, regions.profiled():
        for _ in range(steps):
            step(times)
    total = sum(statistics.median(v) for v in times.values())
    rows = [
        {"method": method, "part": p, "ms": 1e3 * statistics.median(v), "share": statistics.median(v) / total}
        for p, v in times.items()
    ]
    names = {
        regions.SELF_CONDITIONING,
        regions.HEAD,
        regions.PRIOR,
        regions.REPARAM,
        regions.ELEMENT_LOSS,
        regions.AGGREGATION,
        regions.ATTENTION,
        regions.INPUT_PROJECTIONS,
    }
    for ev in prof.key_averages():
        fused_bwd = ev.key.endswith("Backward") and ev.key.lstrip("_").startswith(("PriorSoftmaxHead", "LinearCross"))
        if ev.key in names or fused_bwd:
            us = getattr(ev, "device_time_total", 0.0) if cuda else ev.cpu_time_total
            rows.append(
                {"method": method, "part": f"  {ev.key}", "ms": us / 1e3 / steps, "share": us / 1e6 / steps / total}
            )
    rows.append({"method": method, "part": "step", "ms": 1e3 * total, "share": 1.0})
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--methods", nargs="+", default=["ar", "mdlm", "replaid"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps after one warm-up")
    ap.add_argument("--batch", type=int, default=0, help="train.batch_size (0: the preset's)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="bytes/s for the bytes model's seconds")
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides k=v")
    ap.add_argument("--tiny", action="store_true", help="the debug preset shrunk: seconds on a CPU")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    over = [f"train.precision={a.precision}", *(TINY if a.tiny else []), *a.set]
    preset = "debug" if a.tiny else a.preset
    if a.batch:
        over.append(f"train.batch_size={a.batch}")
    rows: list[dict] = []
    for method in a.methods:
        rows += profile_method(method, over, preset, a.device, a.steps)
    from replaid.presets import resolve
    from replaid.scaling.plan import planned_vocab_size

    cfg = resolve(preset, None, ["method=replaid", *over])
    N, V = cfg.train.batch_size * cfg.data.seq_len, planned_vocab_size(cfg)
    bm = bytes_model(N, V, cfg.diffusion.sc_rate if cfg.model.self_conditioning else 0.0, a.bandwidth or None)
    meta = {
        "device": device_name(torch.device(a.device)),
        "preset": preset,
        "overrides": over,
        "batch": cfg.train.batch_size,
        "L": cfg.data.seq_len,
        "V": V,
        "steps": a.steps,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
    }
    print(f"device {meta['device']}, {preset} {' '.join(over)}, torch {torch.__version__}, {meta['threads']} threads")
    print("| method | part | ms / step | share |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['method']} | {r['part']} | {r['ms']:.2f} | {100 * r['share']:.1f}% |")
    for k, v in bm.items():
        print(f"bytes model {k}: {v['bytes_per_logit']} B per logit, {v['gb']:.2f} GB per step (N={N}, V={V})")
    if a.json:
        print(json.dumps({"ok": True, "meta": meta, "rows": rows, "bytes_model": bm}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
