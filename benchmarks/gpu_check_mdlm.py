"""The MDLM reference (kuleshov-group/mdlm) training step, timed beside replaid's own MDLM.

    python benchmarks/gpu_check_mdlm.py --ref .carry/mdlm --batch 32 --steps 10 --json

``--ref`` is a copy of the reference repository (``scripts/gpu_check.sh --fetch-mdlm SNAPSHOT`` puts
one in the ignored folder ``.carry/mdlm``; its code is never committed here). The reference's own
modules are imported from there: ``models/dit.py`` (``DIT``), ``models/ema.py``, ``noise_schedule.py``,
``utils.py`` and ``diffusion.py``, whose ``Diffusion._loss`` (SUBS parameterisation, continuous time,
antithetic t, log-linear noise) is called on an instance built without ``Diffusion.__init__`` (which
loads GPT-2-large's tokenizer from the Hub and sets up Lightning's metrics, neither of which a step
uses). One timed step is what Lightning's ``training_step`` + ``optimizer_step`` do on one GPU with
``configs/config.yaml`` and ``model=small`` (hidden 768, 12 blocks, 12 heads, cond_dim 128, dropout 0.1,
L = 1024, V = 50,257 + [MASK]): bf16 autocast around the loss, backward, gradient clipping at 1.0,
AdamW (lr 3e-4, betas (0.9, 0.999), eps 1e-8, no weight decay), EMA 0.9999. Not timed: Lightning's
loop, its ``self.log`` (a ``loss.item()`` per step) and the torchmetrics updates.

Stand-ins, each reported in the output: modules the loss never calls are replaced by empty ones
(``models.dimamba`` and ``models.autoregressive``, which need mamba-ssm/causal-conv1d, and
``dataloader``, which needs ``datasets``); when no ``flash_attn`` is importable (no wheel for the
machine's torch), a shim gives ``flash_attn_varlen_qkvpacked_func`` (uniform lengths, as DIT calls it)
through ``torch.nn.functional.scaled_dot_product_attention`` and ``apply_rotary_emb_qkv_`` as the same
rotary formula in PyTorch (out of place): the timing then measures the reference's model and loss with
PyTorch's own fused attention instead of flash-attn's kernels.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

REF_FILES = ("diffusion.py", "noise_schedule.py", "utils.py", "models/dit.py", "models/ema.py")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default=".carry/mdlm", help="folder holding a copy of kuleshov-group/mdlm")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--check", action="store_true", help="only check that --ref holds the reference files")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def missing_files(ref: Path) -> list[str]:
    return [f for f in REF_FILES if not (ref / f).is_file()]


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def flash_attn_shim() -> str:
    """The real flash_attn when it imports, else the PyTorch shim (module docstring); says which."""
    try:
        import flash_attn
        import flash_attn.layers.rotary

        return f"flash-attn {getattr(flash_attn, '__version__', '?')}"
    except Exception as e:  # absent, or a wheel built for another torch (undefined symbols: OSError/ImportError)
        for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
            del sys.modules[name]
        if not isinstance(e, ImportError) or getattr(e, "name", None) not in ("flash_attn", None):
            print(
                f"flash_attn is there but does not import ({e.__class__.__name__}: {str(e)[:120]}); using the shim",
                file=sys.stderr,
            )

    def varlen_qkvpacked(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False, **_):
        total, _, H, D = qkv.shape
        B = cu_seqlens.numel() - 1
        if B * max_seqlen != total:
            raise ValueError("the flash-attn shim handles equal-length sequences only (as DIT calls it)")
        q, k, v = qkv.view(B, max_seqlen, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, D) each
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale)
        return o.transpose(1, 2).reshape(total, H, D)

    def rotary_qkv(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0, **_):
        if interleaved or seqlen_offsets != 0 or cos_k is not None:
            raise ValueError("the flash-attn shim implements the non-interleaved rotary of DIT only")
        S, half = qkv.shape[1], cos.shape[-1]
        c, s = cos[:S].view(1, S, 1, half), sin[:S].view(1, S, 1, half)

        def rot(x):  # (B, S, H, D): the first 2 * half channels rotated (GPT-NeoX layout), the rest kept
            x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
            return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, rest], -1)

        return torch.stack([rot(qkv[:, :, 0]), rot(qkv[:, :, 1]), qkv[:, :, 2]], 2)

    iface = _module("flash_attn.flash_attn_interface", flash_attn_varlen_qkvpacked_func=varlen_qkvpacked)
    rotary = _module("flash_attn.layers.rotary", apply_rotary_emb_qkv_=rotary_qkv)
    layers = _module("flash_attn.layers", rotary=rotary)
    _module("flash_attn", flash_attn_interface=iface, layers=layers, __version__="shim")
    return "PyTorch SDPA shim (no flash_attn importable)"


def load_reference(ref: Path) -> tuple[types.ModuleType, list[str]]:
    """The reference's ``diffusion`` module and the list of stand-ins used (module docstring)."""
    notes = [f"attention: {flash_attn_shim()}"]
    sys.path.insert(0, str(ref))
    pkg = _module("models", __path__=[str(ref / "models")])  # the package without its __init__ (mamba)
    for name in ("dimamba", "autoregressive"):
        setattr(pkg, name, _module(f"models.{name}"))
    notes.append("models.dimamba, models.autoregressive: empty stand-ins (not used by the DIT loss)")
    pkg.dit = importlib.import_module("models.dit")
    pkg.ema = importlib.import_module("models.ema")
    try:
        importlib.import_module("dataloader")
    except ImportError as e:
        sys.modules.pop("dataloader", None)
        _module("dataloader")
        notes.append(f"dataloader: empty stand-in ({e.__class__.__name__}: {str(e)[:80]}; not used by the loss)")
    return importlib.import_module("diffusion"), notes


def build(diffusion, device: torch.device, length: int, vocab: int = 50257):
    """A ``Diffusion`` with the reference's OWT-small configuration, its noise, EMA and AdamW."""
    import lightning
    import models
    import noise_schedule
    import omegaconf

    cfg = omegaconf.OmegaConf.create(
        {
            "model": {
                "hidden_size": 768,
                "cond_dim": 128,
                "length": length,
                "n_blocks": 12,
                "n_heads": 12,
                "scale_by_sigma": True,
                "dropout": 0.1,
                "tie_word_embeddings": False,
            },
            "noise": {"type": "loglinear", "sigma_min": 1e-4, "sigma_max": 20},
            "training": {
                "ema": 0.9999,
                "antithetic_sampling": True,
                "importance_sampling": False,
                "sampling_eps": 1e-3,
                "change_of_variables": False,
            },
            "optim": {"weight_decay": 0, "lr": 3e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
            "parameterization": "subs",
            "T": 0,
            "subs_masking": False,
            "time_conditioning": False,
            "backbone": "dit",
        }
    )
    obj = diffusion.Diffusion.__new__(diffusion.Diffusion)
    lightning.LightningModule.__init__(obj)
    obj.config = cfg
    obj.vocab_size, obj.mask_index = vocab + 1, vocab  # GPT-2 has no mask token: the reference appends one
    obj.parameterization, obj.T, obj.subs_masking = "subs", 0, False
    obj.time_conditioning, obj.neg_infinity = False, -1000000.0
    obj.antithetic_sampling, obj.importance_sampling, obj.change_of_variables = True, False, False
    obj.sampling_eps = cfg.training.sampling_eps
    obj.backbone = models.dit.DIT(cfg, vocab_size=obj.vocab_size)
    obj.noise = noise_schedule.get_noise(cfg)
    obj.to(device)
    params = list(itertools.chain(obj.backbone.parameters(), obj.noise.parameters()))
    obj.ema = models.ema.ExponentialMovingAverage(params, decay=cfg.training.ema)
    opt = torch.optim.AdamW(
        params,
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
    )
    return obj, params, opt


def step(obj, params, opt, x0: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One reference training step (module docstring); returns the loss (on the device)."""
    obj.backbone.train()
    obj.noise.train()
    with torch.autocast(x0.device.type, dtype=torch.bfloat16, enabled=x0.device.type == "cuda"):
        loss = obj._loss(x0, mask).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    obj.ema.update(params)
    return loss.detach()


def main() -> None:
    a = build_parser().parse_args()
    ref = Path(a.ref)
    miss = missing_files(ref)
    if miss:
        print(
            f"replaid: error: --ref {ref} lacks {', '.join(miss)}; copy kuleshov-group/mdlm there "
            f"(scripts/gpu_check.sh --fetch-mdlm SNAPSHOT)",
            file=sys.stderr,
        )
        sys.exit(2)
    if a.check:
        print(json.dumps({"ref": str(ref), "files": list(REF_FILES)}) if a.json else f"{ref}: reference files present")
        return
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t_setup = time.perf_counter()
    diffusion, notes = load_reference(ref)
    torch.manual_seed(0)
    obj, params, opt = build(diffusion, dev, a.length)
    setup_s = time.perf_counter() - t_setup
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(0, obj.mask_index, (a.batch, a.length), generator=g).to(dev)
    mask = torch.ones_like(x0)
    for _ in range(a.warmup):
        step(obj, params, opt, x0, mask)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step(obj, params, opt, x0, mask)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    step_s = (time.perf_counter() - t0) / a.steps
    n_params = sum(p.numel() for p in obj.backbone.parameters())
    res = {
        "ref": str(ref),
        "batch": a.batch,
        "L": a.length,
        "V": obj.vocab_size,
        "params": n_params,
        "setup_s": setup_s,
        "step_s": step_s,
        "tokens_per_s": a.batch * a.length / step_s,
        "peak_mem_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
        "loss": float(loss),
        "stand_ins": notes,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }
    print(json.dumps(res) if a.json else res, flush=True)


if __name__ == "__main__":
    main()
