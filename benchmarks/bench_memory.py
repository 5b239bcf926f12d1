"""Peak training memory on the CPU against `replaid memory`'s model (issue 53 §3), per method and size.

The measurement is the live-heap peak of the second training step (fp32; every tensor storage counted
from allocation to free by a dispatch mode, not the resident set), so it does not depend on what else
runs on the machine: unlike a timing, it is a figure on a busy CPU. The model is
``replaid.training.memory.estimate`` for the same configuration and batch.

    python benchmarks/bench_memory.py                                  # demo and owt-0.1b, AR/MDLM/RePlaid
    python benchmarks/bench_memory.py --sizes demo --methods mdlm --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

from replaid.presets import resolve
from replaid.training.memory import estimate
from replaid.training.testbed import measure

# name: (preset, overrides, vocabulary, per-device batch). demo: the plateau runs' shape (issue 48);
# owt-0.1b: the GPU target's model and length at a batch the CPU holds.
SIZES: dict[str, tuple[str, list[str], int, int]] = {
    "demo": ("demo", ["data.seq_len=64"], 2048, 32),
    "owt-0.1b": ("owt-0.1b", [], 50257, 2),  # 2: RePlaid's micro-batch holds a recon and a diffusion row
}


def rows(sizes: list[str], methods: list[str]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for size in sizes:
        preset, overrides, V, batch = SIZES[size]
        for method in methods:
            cfg = resolve(preset, None, [f"method={method}", "train.precision=fp32", *overrides])
            t0 = time.perf_counter()
            got = measure(cfg, V, batch)
            est = estimate(cfg, V, batch).peak
            out.append(
                {
                    "size": size,
                    "method": method,
                    "L": cfg.data.seq_len,
                    "V": V,
                    "batch": batch,
                    "measured_bytes": got,
                    "model_bytes": est,
                    "error": (est - got) / got,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(f"{size} {method}: measured {got / 2**20:.1f} MiB, model {est / 2**20:.1f} MiB", file=sys.stderr)
    return out


def table(found: list[dict[str, object]]) -> str:
    lines = [
        "| size | method | L | V | batch | measured MiB | model MiB | model - measured |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in found:
        m, e = float(r["measured_bytes"]) / 2**20, float(r["model_bytes"]) / 2**20  # type: ignore[arg-type]
        lines.append(
            f"| {r['size']} | {r['method']} | {r['L']} | {r['V']} | {r['batch']} | {m:.1f} | {e:.1f} | "
            f"{100 * float(r['error']):+.1f}% |"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    ap.add_argument("--methods", nargs="+", default=["ar", "mdlm", "replaid"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    torch.set_num_threads(a.threads)
    found = rows(a.sizes, a.methods)
    if a.json:
        print(json.dumps(found, indent=1))
    else:
        print(f"{datetime.date.today()}, torch {torch.__version__}, CPU, fp32, live-heap peak of the second step")
        print(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
