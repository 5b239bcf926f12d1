"""A memory model of one training step per rank, and a live-heap meter to check it on a CPU.

Peak of a step = the state that lives across steps (fp32 parameters, fp32 gradients, AdamW's two
fp32 moments, the fp32 EMA) + what autograd saves from the forward for the backward + the largest
transient of the backward. Activations are counted from the code, per token:

* a DiT block (``model/dit.py``) saves 23 d values: 6 d in float32 (residual x, both LayerNorm
  outputs, attention-out and MLP-out branches before their gates, the second residual) and 17 d that
  are matmul operands, in bf16 under autocast (modulated inputs of qkv and fc1, the qkv output kept
  alive by the v view, rotated q and k, the SDPA output and its (B, L, D) copy, fc1 output and GELU
  output at 4 d each), + the SDPA log-sum-exp (H float32) + dropout masks (2 d bytes when
  ``model.dropout > 0``). Flash/SDPA kernels never hold (L, L) scores. With activation
  checkpointing a block keeps its float32 input (d) and one block is rebuilt at a time.
* outside the blocks: the float32 input projection and final-layer features (4 d) and, for
  RePlaid, the (L, d_e) latents (6 d_e).
* the head: RePlaid's fused head (``model/head.py``) keeps one (B L, V) float32 buffer and, under
  bf16, copies it to bf16 in the backward (+2 bytes per entry); the plain autograd head (before it)
  keeps two float32 (B L, V) tensors (``z E^T`` and the softmax) and creates two more in the
  backward; MDLM/AR's fused cross-entropy (``linear_cross_entropy``) keeps one (B L, V) buffer in the
  matmul dtype (2 bytes under bf16) and a float32 (chunk, V) workspace, and by plain ``cross_entropy``
  (``fused_head=False``) its float32 log-softmax, creating two more in the backward.

The peak is the larger of (state without gradients + activations + head backward transient + head
gradients) at the start of the backward and (full state + one block) at its end.
bf16 follows from the same counts: matmul operands at 2 bytes, everything else unchanged (the
residual stream, norms, softmax and losses stay float32 by the precision table).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from replaid.config import RunConfig
from replaid.methods import get_method, method_class
from replaid.model.head import chunk_rows

GB = 1e9
VOCAB = {"gpt2": 50257, "llama2": 32000, "bert-base-uncased": 30522}


def preset_vocab(cfg: RunConfig) -> int:
    return cfg.data.bpe_vocab_size if cfg.data.tokenizer == "bpe" else VOCAB.get(cfg.data.tokenizer, 50257)


@dataclass
class MemoryEstimate:
    parts: dict[str, float] = field(default_factory=dict)  # bytes
    peak: float = 0.0

    def table(self) -> list[tuple[str, float]]:
        return [(k, v / GB) for k, v in self.parts.items()] + [("peak", self.peak / GB)]


def param_counts(cfg: RunConfig, V: int) -> tuple[int, int]:
    """(all parameters, trainable parameters) of the method's model, built on the meta device."""
    with torch.device("meta"):
        model = get_method(cfg).build_model(V)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad)


def estimate(
    cfg: RunConfig,
    V: int,
    batch: int,
    bf16: bool = False,
    act_ckpt: bool | None = None,
    fused_head: bool = True,
    params: tuple[int, int] | None = None,
) -> MemoryEstimate:
    """Peak bytes per rank of one training step at per-device ``batch`` (module docstring).
    ``params``: :func:`param_counts`, when already known."""
    m = cfg.model
    ckpt = m.activation_checkpointing if act_ckpt is None else act_ckpt
    n_all, n_train = params or param_counts(cfg, V)
    T, d, H, n, r = batch * cfg.data.seq_len, m.hidden, m.n_heads, m.n_layers, m.mlp_ratio
    f, a = 4, (2 if bf16 else 4)
    e: dict[str, float] = {
        "parameters": f * n_all,
        "gradients": f * n_train,
        "AdamW moments": 2 * f * n_train,
        "EMA": f * n_all if cfg.optim.ema > 0 else 0,
    }
    per_block = T * (6 * f * d + a * (9 + 2 * r) * d + f * H + (2 * d if m.dropout > 0 else 0))
    e["activations per block"] = per_block
    e["activations, blocks"] = n * T * f * d + per_block if ckpt else n * per_block
    continuous = method_class(cfg.method).kind.continuous
    e["activations, outside blocks"] = T * (4 * f * d + (6 * f * m.d_e if continuous else 0))
    if continuous and fused_head:
        e["head: saved (B L, V)"] = T * V * f
        c = min(T, chunk_rows(V, m.head_chunk_rows))  # the (chunk, V) temporary; bf16 copies the buffer
        e["head: backward transient"] = f * c * V + (2 * T * V if bf16 else 0)
    elif continuous:  # the plain autograd head: z E^T and the softmax saved, two gradients in the backward
        e["head: saved (B L, V)"] = 2 * T * V * f
        e["head: backward transient"] = 2 * T * V * f + (2 * T * V if bf16 else 0)
    elif fused_head:  # MDLM / AR: the fused cross-entropy's one (B L, V) buffer in the matmul dtype, turned
        # into d logits in place by the backward, with one float32 (chunk, V) workspace
        e["head: saved (B L, V)"] = T * V * a
        e["head: backward transient"] = f * min(T, chunk_rows(V, m.head_chunk_rows)) * V
    else:  # MDLM / AR by plain cross_entropy: its float32 log-softmax saved; two gradients (+ the bf16 one)
        e["head: saved (B L, V)"] = T * V * f
        e["head: backward transient"] = 2 * T * V * f + (2 * T * V if bf16 else 0)
    head_grads = f * V * (d + 1 + (m.d_e if continuous else 0))
    start_bwd = (
        e["parameters"]
        + e["AdamW moments"]
        + e["EMA"]
        + e["activations, blocks"]
        + e["activations, outside blocks"]
        + e["head: saved (B L, V)"]
        + e["head: backward transient"]
        + head_grads
    )
    end_bwd = e["parameters"] + e["gradients"] + e["AdamW moments"] + e["EMA"] + per_block
    return MemoryEstimate(e, max(start_bwd, end_bwd))


def largest_batch(cfg: RunConfig, V: int, budget_bytes: float, bf16: bool = True, act_ckpt: bool | None = None) -> int:
    """The largest per-device batch whose estimated peak fits ``budget_bytes`` (0 if none)."""
    n = param_counts(cfg, V)

    def fits(b: int) -> bool:
        return estimate(cfg, V, b, bf16, act_ckpt, params=n).peak <= budget_bytes

    lo, hi = 0, 1
    while fits(hi) and hi < 1 << 16:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


class LiveHeap(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves __init_subclass__ unannotated
    """Live bytes of every CPU tensor storage created under the mode (allocation accounting, not
    RSS: freed memory leaves the count when its storage dies). ``peak`` since ``reset_peak()``."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def track(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        k = id(s)
        if k in self.live:
            return
        self.live[k] = s.nbytes()
        self.current += s.nbytes()
        self.peak = max(self.peak, self.current)
        weakref.finalize(s, self._free, k)

    def _free(self, k: int) -> None:
        self.current -= self.live.pop(k, 0)

    def reset_peak(self) -> None:
        self.peak = self.current

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self.track(t)
        return out


SAMPLE_TOKEN_BYTES = 64  # one kept sample token: its id in a Python list, its share of the text and JSON


def sampling_estimate(cfg: RunConfig, V: int, n_params: int, rows: int, L: int, num: int) -> MemoryEstimate:
    """Peak bytes of sampling ``num`` sequences of ``L`` tokens, ``rows`` at a time (no autograd): the
    float32 weights, one batch's forward (the residual stream and block temporaries, the (rows L, V)
    logits with their softmax and a copy, the latent state and its sampler buffers) and the kept
    samples. A first-order count (module docstring's per-token terms), made to refuse what cannot fit."""
    m = cfg.model
    T, f = rows * L, 4
    e: dict[str, float] = {
        "parameters": f * n_params,
        "batch forward": T * f * (8 + 2 * m.mlp_ratio) * m.hidden,
        "batch logits (rows L, V)": 3 * T * V * f,
        "batch state": 8 * T * f * m.d_e,
        "samples kept": num * L * SAMPLE_TOKEN_BYTES,
    }
    return MemoryEstimate(e, sum(e.values()))


def eval_estimate(cfg: RunConfig, V: int, n_params: int, rows: int, L: int) -> MemoryEstimate:
    """Peak bytes of one evaluation batch (``replaid eval``): ``rows`` sequences of ``L`` tokens through the
    method's bound without autograd, its ``eval.t_samples`` times one after another, so the terms of
    :func:`sampling_estimate` for one batch (weights, forward, logits, latent state), nothing kept;
    discrete methods (MDLM/AR) hold no latent state and two (rows L, V) float32 tensors (the logits and
    their log-softmax)."""
    e = dict(sampling_estimate(cfg, V, n_params, rows, L, 0).parts)
    e.pop("samples kept")
    if not method_class(cfg.method).kind.continuous:
        e.pop("batch state")
        e["batch logits (rows L, V)"] *= 2 / 3
    return MemoryEstimate(e, sum(e.values()))


def likelihood_estimate(
    cfg: RunConfig, V: int, n_params: int, rows: int, L: int, total_rows: int, n_hutch: int = 1, jvp: str = "fd"
) -> MemoryEstimate:
    """Peak bytes of the ODE likelihood (``replaid likelihood``): ``rows`` (sequence x sample) rows of ``L``
    tokens solved at a time out of ``total_rows``: one evaluation batch (:func:`eval_estimate`; its
    forward terms x6 for ``jvp="autograd"``, whose ``torch.func.jvp`` keeps every primal and tangent of
    the forward: 6-7x the fd forward, measured on the CPU at debug size), the float64 ODE state
    (the latent, the Heun stages and the divergence: 6 copies of (rows, L, d_e)) with 2 more per
    Hutchinson probe (the probe and its Jacobian product), and the repeated token rows (int64)."""
    e = dict(eval_estimate(cfg, V, n_params, rows, L).parts)
    if jvp == "autograd":
        for k in ("batch forward", "batch logits (rows L, V)", "batch state"):
            e[k] *= 6
    e["ODE state (float64)"] = (6 + 2 * n_hutch) * rows * L * cfg.model.d_e * 8
    e["token rows"] = total_rows * L * 8
    return MemoryEstimate(e, sum(e.values()))


def human_bytes(b: float) -> str:
    return f"{b / 1e12:.3g} TB" if b >= 1e12 else f"{b / 1e9:.3g} GB" if b >= 1e9 else f"{b / 1e6:.3g} MB"


def check_fits(
    what: str,
    peak: Callable[[int], MemoryEstimate],
    rows: int,
    flag: str,
    device: torch.device,
    free: float | None = None,
    too_big: str = "the run's weights alone do not fit: use a larger device",
) -> None:
    """Refuse (ValueError, one line) a request whose estimated peak at ``rows`` rows a time (``peak(rows)``)
    exceeds 90% of the memory free on ``device``, before anything is allocated: the line names the
    estimate and its main parts, the free memory and the largest ``flag`` value that fits (``too_big``
    when not even one row does)."""
    free = free_bytes(device) if free is None else free
    if free is None:
        return
    budget = 0.9 * free
    est = peak(rows)
    if est.peak <= budget:
        return
    lo, hi = 0, rows  # the largest row count that fits: peak grows with the rows
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid).peak <= budget else (lo, mid)
    hint = f"use {flag} {lo} or less" if lo >= 1 else too_big
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in est.parts.items() if v >= 0.01 * est.peak)
    raise ValueError(
        f"{what}, {rows} rows at a time, needs about {human_bytes(est.peak)} ({parts}) "
        f"but {device.type} has {human_bytes(free)} free; {hint}"
    )


def free_bytes(device: torch.device) -> float | None:
    """Memory free for a new allocation on ``device`` (CUDA: free device memory; CPU: the kernel's
    MemAvailable), or None when it cannot be told."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None
