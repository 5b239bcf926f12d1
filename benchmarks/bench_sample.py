"""Sampling throughput: tokens/s and NFE/s for a preset (random weights), batch size and T.

    python benchmarks/bench_sample.py --preset demo --batch 16 --steps 64 1024 --samplers ddpm dpmpp2m heun
    python benchmarks/bench_sample.py --preset owt-0.1b --method mdlm --steps 64 --json   # MDLM's ancestral sampler

Weights do not change the cost, so an untrained model of the preset's size is timed (bf16 autocast on
a GPU). ``--method mdlm`` times MDLM's own sampler (``--samplers`` is then ignored; its NFE is the
network calls it made). Results are appended to docs/benchmarks.md with date and device, or printed
as one JSON object per line with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results, device_name, sync

from replaid.presets import resolve
from replaid.sampling.continuous import gamma_grid, time_grid


def initial_tokens(method, model, B: int, L: int, dev: torch.device, g: torch.Generator) -> torch.Tensor:
    """MDLM's start: every position [MASK] (id V, one past the vocabulary)."""
    return torch.full((B, L), model.n_out, dtype=torch.long, device=dev)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument(
        "--method",
        default="replaid",
        choices=["replaid", "mdlm"],
        help="replaid: the continuous samplers; mdlm: MDLM's ancestral sampler",
    )
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's tokenizer's)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--steps", type=int, nargs="+", default=[64])
    p.add_argument("--samplers", nargs="+", default=["ddpm", "ddim", "dpmpp2m", "heun"])
    p.add_argument("--set", nargs="*", default=[], help="config overrides k=v of the model")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true", help="one JSON object per configuration (and do not record)")
    p.add_argument("--no-record", action="store_true")
    return p


def main() -> None:
    from replaid.methods import get_method
    from replaid.sampling.registry import get_sampler
    from replaid.training.memory import preset_vocab

    a = build_parser().parse_args()
    cfg = resolve(a.preset, None, [f"method={a.method}", *a.set])
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    V = a.vocab or preset_vocab(cfg)
    L = a.length or cfg.data.seq_len
    method = get_method(cfg)
    torch.manual_seed(0)
    model = method.build_model(V).to(dev).eval()
    names = a.samplers if a.method == "replaid" else ["mdlm"]
    rows = []
    for T in a.steps:
        for name in names:
            ctx = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
            g = torch.Generator().manual_seed(0)
            with torch.no_grad(), ctx:
                if a.method == "replaid":  # the registry's samplers, one contract (sampling/contract.py)
                    sampler = get_sampler(method, name)
                    grid = gamma_grid(model.schedule, T)
                    state = torch.randn(a.batch, L, model.d_e, device=dev)
                else:  # the method's default sampler from the registry, from its initial state
                    sampler = get_sampler(method)
                    grid = time_grid(T)
                    state = initial_tokens(method, model, a.batch, L, dev, g)
                sync(dev)
                t0 = time.perf_counter()
                nfe = sampler.fn(model, state, grid, generator=g).nfe
                sync(dev)
            secs = time.perf_counter() - t0
            rows.append([name, T, nfe, a.batch, L, secs, a.batch * L / secs, nfe / secs])
            if a.json:
                print(
                    json.dumps(
                        {
                            "sampler": name,
                            "method": a.method,
                            "T": T,
                            "nfe": nfe,
                            "batch": a.batch,
                            "L": L,
                            "V": V,
                            "seconds": secs,
                            "tokens_per_s": a.batch * L / secs,
                            "nfe_per_s": nfe / secs,
                            "device": device_name(dev),
                        }
                    ),
                    flush=True,
                )
            else:
                print(
                    f"{name:8s} T={T:5d} nfe={nfe:5d} {secs:8.2f}s  {a.batch * L / secs:10.1f} tok/s  "
                    f"{nfe / secs:8.2f} NFE/s",
                    flush=True,
                )
    if not a.no_record and not a.json:
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
