"""Sampling throughput: tokens/s and NFE/s for a preset (random weights), batch size and T.

    python benchmarks/bench_sample.py --preset demo --batch 16 --steps 64 1024 --samplers ddpm dpmpp2m heun

Weights do not change the cost, so an untrained model of the preset's size is timed.
Results are appended to docs/benchmarks.md with date and device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results, device_name, sync  # noqa: E402

from replaid.model.replaid import RePlaid  # noqa: E402
from replaid.presets import get_preset  # noqa: E402
from replaid.sampling.continuous import gamma_grid, get_sampler  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's BPE size)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--steps", type=int, nargs="+", default=[64])
    p.add_argument("--samplers", nargs="+", default=["ddpm", "ddim", "dpmpp2m", "heun"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-record", action="store_true")
    a = p.parse_args()
    cfg = get_preset(a.preset)
    dev = torch.device(a.device)
    V = a.vocab or (cfg.data.bpe_vocab_size if cfg.data.tokenizer == "bpe" else 50257)
    L = a.length or cfg.data.seq_len
    model = RePlaid(cfg.model, cfg.diffusion, V).to(dev).eval()
    rows = []
    for T in a.steps:
        gammas = gamma_grid(model.schedule, T)
        for name in a.samplers:
            z = torch.randn(a.batch, L, model.d_e, device=dev)
            ctx = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
            with torch.no_grad(), ctx:
                sync(dev)
                t0 = time.perf_counter()
                res = get_sampler(name)(model, z, gammas, generator=None)
                sync(dev)
            secs = time.perf_counter() - t0
            rows.append([name, T, res.nfe, a.batch, L, secs, a.batch * L / secs, res.nfe / secs])
            print(
                f"{name:8s} T={T:5d} nfe={res.nfe:5d} {secs:8.2f}s  {a.batch * L / secs:10.1f} tok/s  "
                f"{res.nfe / secs:8.2f} NFE/s",
                flush=True,
            )
    if not a.no_record:
        append_results(
            f"Sampling throughput, preset {a.preset}, {device_name(dev)}",
            ["sampler", "T", "NFE", "batch", "L", "seconds", "tokens/s", "NFE/s"],
            rows,
            f"`python benchmarks/bench_sample.py --preset {a.preset} --batch {a.batch} "
            f"--steps {' '.join(map(str, a.steps))}`; untrained weights of the preset's size, "
            f"self-conditioning on (each NFE is one network pass; its e_hat is fed to the next).",
        )


if __name__ == "__main__":
    main()
