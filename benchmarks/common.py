"""Shared helpers for the benchmark scripts: device, peak matmul throughput, result table."""

from __future__ import annotations

import datetime
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def peak_matmul_flops(dev: torch.device, dtype: torch.dtype, n: int | None = None, seconds: float = 2.0) -> float:
    """Measured FLOP/s of a large square matmul on this device (the MFU denominator)."""
    n = n or (8192 if dev.type == "cuda" else 1024)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(dev)
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        iters += 1
    sync(dev)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


# Dense bf16 tensor-core peaks from the vendors' datasheets (FLOP/s, no sparsity), by device-name pattern;
# the first match wins, so the more specific names come first.
DATASHEET_BF16 = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.4e12),
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
]


def datasheet_bf16_flops(dev: torch.device) -> float | None:
    """The datasheet's dense bf16 peak of a CUDA device (None for a CPU or an unlisted GPU)."""
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    return next((v for k, v in DATASHEET_BF16 if k in name), None)


def append_results(title: str, header: list[str], rows: list[list], notes: str = "") -> None:
    """Append a dated markdown table to docs/benchmarks.md."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    new = not RESULTS.exists()
    with open(RESULTS, "a") as f:
        if new:
            f.write(
                "# Benchmarks\n\nAppended by the scripts in `benchmarks/`; each table carries its date and device.\n"
            )
        f.write(f"\n## {title} — {datetime.date.today().isoformat()}\n\n")
        if notes:
            f.write(notes.strip() + "\n\n")
        f.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
        for r in rows:
            f.write("| " + " | ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in r) + " |\n")


def add_one_option(p) -> None:
    """The hidden ``--one SPEC`` option: run a single configuration in this (fresh) process."""
    import argparse

    p.add_argument("--one", help=argparse.SUPPRESS)


def run_one_if_asked(a, fn) -> bool:
    """In the child: ``fn(**SPEC)`` printed as one JSON line; returns True when it ran."""
    import json

    if not getattr(a, "one", None):
        return False
    print(json.dumps(fn(**json.loads(a.one))))
    return True


def run_isolated(script: str, spec: dict, env: dict | None = None):
    """Run ``script --one SPEC`` in a fresh interpreter (clean allocator, peak memory and CPU time);
    returns ``(result dict or None, stderr)``."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, script, "--one", json.dumps(spec)], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr
