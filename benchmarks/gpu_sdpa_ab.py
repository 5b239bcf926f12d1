"""Cached generation on CUDA, with and without cuDNN attention (an A/B run, not a sweep).

On an H100 (torch 2.11, 2026-11-27) AR with its KV cache took 66 ms per token at owt-0.1b, batch 1,
more than the CPU, while a block step of the same backbone took 17 ms. Suspects: (1) SDPA's cuDNN
backend builds a plan for every new key length, and an AR call's key length grows by one every call;
(2) ``exponential_race`` makes a CUDA generator from the CPU one at every token.

``--part ab``: arms in this one process, each after its own warm-up: AR calls per token (every backend;
cuDNN left out; each with the CPU generator moved per call, or one CUDA generator), then block
generation (MDLM, RePlaid, b = 16, T = 16) per NFE with every backend and without cuDNN. The arms run
in that order, so a later arm may find shapes an earlier one met. ``--part order`` separates the two
suspects: at batch sizes no earlier arm used (3 and 5), every backend with one CUDA generator first
(fresh shapes), then cuDNN left out, then every backend again with each generator (shapes seen).
Prints one JSON line per arm and writes OUT/sdpa_ab.json (``ab``) or OUT/sdpa_order.json (``order``).

    python benchmarks/gpu_sdpa_ab.py --device cuda --out $OUT                 # --part ab
    python benchmarks/gpu_sdpa_ab.py --device cuda --part order --out $OUT

The model code now leaves cuDNN out of cached attention on CUDA (``replaid.model.dit.cached_sdpa``); the
"all" arms put it back for the length of the arm (``sdpa_kernel`` over every backend).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_blocks import build
from common import sync

ALL = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextlib.contextmanager
def backends(name: str):
    """``"all"``: every SDPA backend, the model's cached-attention policy lifted (the code before it);
    ``"no_cudnn"``: cuDNN left out (what the policy does)."""
    from replaid.model import dit, plaid_backbone

    modules, policy = (dit, plaid_backbone), dit.cached_sdpa  # each backbone's module holds the name
    if name == "all":
        for m in modules:
            m.cached_sdpa = lambda device: contextlib.nullcontext()  # type: ignore[assignment]
    try:
        with sdpa_kernel(ALL if name == "all" else NO_CUDNN):
            yield
    finally:
        for m in modules:
            m.cached_sdpa = policy  # type: ignore[assignment]


@torch.no_grad()
def ar_calls(model, prompt, n: int, gen: torch.Generator, dev) -> tuple[float, int]:
    """Seconds per call of n AR calls after the prompt's prefill (sample_ar's loop)."""
    from replaid.model.dit import KVCache
    from replaid.sampling.discrete import exponential_race, tempered_probs

    B, P = prompt.shape
    cache = KVCache()
    bos = torch.full((B, 1), model.n_in - 1, dtype=torch.long, device=dev)
    logits = model.forward_cached(torch.cat([bos, prompt], 1), cache, 0)[:, -1]
    sync(dev)
    t0 = time.perf_counter()
    for i in range(n):
        nxt = exponential_race(tempered_probs(logits, 1.0), gen)
        logits = model.forward_cached(nxt[:, None], cache, P + 1 + i)[:, -1]
    sync(dev)
    return (time.perf_counter() - t0) / n, n


@torch.no_grad()
def block_nfe(method, model, prompt, n: int, dev) -> tuple[float, int]:
    from replaid.sampling.loop import sample_any_length

    g = torch.Generator().manual_seed(0)
    sync(dev)
    t0 = time.perf_counter()
    res = sample_any_length(method, model, prompt, n, steps=16, generator=g)
    sync(dev)
    return (time.perf_counter() - t0) / res.nfe, res.nfe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="owt-0.1b")
    p.add_argument("--ar-tokens", type=int, default=128)
    p.add_argument("--block-tokens", type=int, default=240)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--part", choices=["ab", "order"], default="ab")
    p.add_argument("--order-batches", type=int, nargs="+", default=[3, 5])
    p.add_argument("--order-tokens", type=int, default=48)
    p.add_argument("--out", default="sdpa_ab")
    a = p.parse_args()
    dev = torch.device(a.device)
    rows: list[dict] = []
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    if dev.type == "cuda":
        info["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()
        info["flash_sdp_enabled"] = torch.backends.cuda.flash_sdp_enabled()
    print(json.dumps(info), flush=True)
    ac = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    name_out = out / ("sdpa_ab.json" if a.part == "ab" else "sdpa_order.json")

    def record(**row) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        name_out.write_text(json.dumps({"info": info, "command": " ".join(sys.argv), "rows": rows}, indent=1))

    if a.part == "order":
        with ac:
            _, model, _, V = build({"preset": a.preset, "method": "ar", "b": 16, "vocab": None}, "ar", dev)
            arms = (("all", "cuda"), ("no_cudnn", "cpu"), ("all", "cpu"), ("all", "cuda"))
            for B in a.order_batches:
                prompt = torch.randint(0, V, (B, 16)).to(dev)
                for k, (name, gdev) in enumerate(arms):
                    with backends(name):
                        gen = torch.Generator(device=dev if gdev == "cuda" else "cpu").manual_seed(0)
                        s, _ = ar_calls(model, prompt, a.order_tokens, gen, dev)
                    shapes = "fresh" if k == 0 else "seen" if name == "all" else "-"
                    record(family="ar", batch=B, sdpa=name, gen=f"{gdev}_gen", shapes=shapes, ms_per_call=1e3 * s)
        return 0

    with ac:
        _, model, _, V = build({"preset": a.preset, "method": "ar", "b": 16, "vocab": None}, "ar", dev)
        for B in a.batches:
            prompt = torch.randint(0, V, (B, 16), generator=torch.Generator().manual_seed(1)).to(dev)
            for name in ("all", "no_cudnn"):
                for gname in ("cpu_gen", "cuda_gen"):
                    with backends(name):
                        mk = (
                            (lambda: torch.Generator().manual_seed(0))
                            if gname == "cpu_gen"
                            else (lambda: torch.Generator(device=dev).manual_seed(0))
                        )
                        ar_calls(model, prompt, 8, mk(), dev)  # warm-up
                        s, n = ar_calls(model, prompt, a.ar_tokens, mk(), dev)
                    record(family="ar", batch=B, sdpa=name, gen=gname, ms_per_call=1e3 * s, calls=n)
        del model
        for m in ("mdlm", "replaid"):
            method, model, _, V = build({"preset": a.preset, "method": m, "b": 16, "vocab": None}, "blocks", dev)
            for B in a.batches:
                prompt = torch.randint(0, V, (B, 16), generator=torch.Generator().manual_seed(1)).to(dev)
                for name in ("all", "no_cudnn"):
                    with backends(name):
                        block_nfe(method, model, prompt, 16, dev)  # warm-up
                        s, n = block_nfe(method, model, prompt, a.block_tokens, dev)
                    record(
                        family="blocks",
                        method=m,
                        batch=B,
                        sdpa=name,
                        ms_per_nfe=1e3 * s,
                        nfe=n,
                        tokens_per_s=B * a.block_tokens / (s * n),
                    )
            del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
