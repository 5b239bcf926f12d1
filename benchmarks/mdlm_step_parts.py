"""Where one MDLM (BD3-LM) block step's time goes (issue 39 §4): the network, the softmax, the draw.

    python benchmarks/mdlm_step_parts.py --batch 16 --threads 2 --out docs/results/blocks/speed-cpu/mdlm_step_parts.json

The `demo` network with blocks of ``--block`` tokens, untrained (speed does not depend on training), V =
2,048, a cache of three committed blocks, the block all [MASK]: per step, ``cached_logits`` (the network
over the block's queries and the cache), ``tempered_probs`` (float64 softmax) and ``unmask_step`` (an
exponential race: one float64 Exp(1) draw per vocabulary entry per position). Three warm-up steps, then
``--repeats`` timed ones; prints and writes the median wall time of each part in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime
from pathlib import Path

import torch

from replaid.config import set_key
from replaid.methods import get_method
from replaid.model.dit import KVCache
from replaid.presets import get_preset
from replaid.sampling.blocks import cached_logits, commit_masked
from replaid.sampling.discrete import tempered_probs, unmask_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="write the medians here (JSON)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = get_preset("demo")
    set_key(cfg, "method", "mdlm")
    set_key(cfg, "diffusion.block_size", a.block)
    cfg.validate()
    V = cfg.data.bpe_vocab_size
    model = get_method(cfg).build_model(V).eval()
    B, b = a.batch, a.block
    cache = KVCache(window=cfg.data.seq_len - b)
    g = torch.Generator().manual_seed(0)
    parts: dict[str, list[float]] = {"network": [], "softmax": [], "draw": []}
    with torch.no_grad():
        for _ in range(3):  # three committed blocks in the cache
            commit_masked(model, torch.randint(0, V, (B, b), generator=g), cache.next_pos, cache)
        z = torch.full((B, b), V)  # (B, b) all [MASK]
        for i in range(3 + a.repeats):
            t0 = time.perf_counter()
            logits = cached_logits(model, z, cache)  # (B, b, V)
            t1 = time.perf_counter()
            probs = tempered_probs(logits, 1.0)  # (B, b, V) float64
            t2 = time.perf_counter()
            unmask_step(z, probs, 0.9, 0.8, g)
            t3 = time.perf_counter()
            if i >= 3:
                parts["network"].append(t1 - t0)
                parts["softmax"].append(t2 - t1)
                parts["draw"].append(t3 - t2)
    ms = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
    for k, v in ms.items():
        print(f"{k:8s} median {v:.2f} ms")
    if a.out is not None:
        rec = {
            "median_ms": ms,
            "meta": {
                "date": datetime.now().isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "threads": a.threads,
                "batch": B,
                "block": b,
                "vocab": V,
                "repeats": a.repeats,
                "cache_rows": cache.length,
            },
        }
        a.out.write_text(json.dumps(rec, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
