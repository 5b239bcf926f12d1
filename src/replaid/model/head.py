"""RePlaid's output head as one autograd function with a single (N, V) float32 buffer.

For N = B*L rows with features ``f`` (N, H), head ``W`` (V, H), ``b`` (V,), prior-scaled latents
``zs = s (alpha / sigma^2) z`` (N, d_e) and unit embeddings ``E`` (V, d_e) (paper section 2):

    logits = f W^T + b + zs E^T                 the head (bf16 under autocast) + output prior logits
    p      = softmax(logits)  (float32)          x_hat
    e_hat  = p E                                 categorical reparameterisation   (N, d_e)
    nll    = logsumexp(logits) - logits[target]  reconstruction cross-entropy     (N,)

Autograd of the plain expression keeps about three (N, V) float32 tensors from forward to
backward (head output, prior logits, softmax). Here the forward keeps only the logits buffer;
the backward turns it, ``head_chunk_rows`` rows at a time, into ``p`` and then in place into
``d logits = p * (g_e E^T - <g_e, e_hat>) + g_nll (p - onehot(target))`` (the softmax Jacobian
with ``sum_v p_v (g_e . E_v) = g_e . e_hat``), so exactly one (N, V) float32 tensor is alive plus
one (chunk, V) temporary. No FLOP is recomputed. Rows with ``e_keep = 0`` (self-conditioned
rows) pass no gradient to ``E`` (both through ``p E`` and the prior), without any row indexing.

On the CPU that (chunk, V) temporary is one workspace kept between calls (:func:`workspace`): at small
sizes a fresh 16 MB buffer per softmax, log-sum-exp and backward pass cost page faults comparable to
the arithmetic (RePlaid's step at the demo size: below 1.15x MDLM's, against 1.21x with the plain autograd head). The
log-sum-exp is ``torch.logsumexp``'s own sequence of operations, so every number is the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from replaid.regions import ELEMENT_LOSS, HEAD, PRIOR, REPARAM, region

DEFAULT_CHUNK_ELEMENTS = 1 << 22  # (chunk, V) temporaries of ~16 MB when head_chunk_rows = 0


_WORKSPACE: dict[tuple[int, int], Tensor] = {}


def workspace(rows: int, V: int, like: Tensor) -> Tensor:
    """A (rows, V) float32 scratch buffer: on the CPU one kept between calls (the largest asked for, per
    V); elsewhere a new one (the device's caching allocator reuses memory by itself)."""
    if like.device.type != "cpu":
        return like.new_empty(rows, V, dtype=torch.float32)
    buf = _WORKSPACE.get((V, like.device.index or 0))
    if buf is None or buf.shape[0] < rows:
        _WORKSPACE.clear()  # one size in use at a time
        buf = _WORKSPACE[V, like.device.index or 0] = torch.empty(rows, V, dtype=torch.float32)
    return buf[:rows]


def _logsumexp_rows(x: Tensor, out: Tensor, scratch: Tensor) -> None:
    """``out = torch.logsumexp(x, -1)`` (N,) for x (N, V) float32, by the same operations in the same order
    (max, shift, exp, sum, log, add back the max), the shifted copy written into ``scratch`` (N, V)."""
    m = torch.amax(x, -1, keepdim=True)
    m.masked_fill_(m.abs() == float("inf"), 0)
    torch.sub(x, m, out=scratch)
    scratch.exp_()
    torch.sum(scratch, -1, out=out)
    out.log_().add_(m.squeeze(-1))


def chunk_rows(V: int, head_chunk_rows: int = 0) -> int:
    """Rows of the flattened B*L per chunk of the softmax pass (``model.head_chunk_rows``; 0 = auto)."""
    return head_chunk_rows if head_chunk_rows > 0 else max(1, DEFAULT_CHUNK_ELEMENTS // V)


class _PriorSoftmaxHead(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        f: Tensor,
        W: Tensor,
        b: Tensor | None,
        zs: Tensor | None,
        E: Tensor,
        e_keep: Tensor,
        target: Tensor,
        chunk: int,
        mm_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(f.device.type, enabled=False):
            with region(HEAD):  # bf16 under autocast (precision table)
                logits = (f.to(mm_dtype) @ W.to(mm_dtype).t()).float()  # (N, V): the one float32 buffer
            if b is not None:
                logits += b.float()
            Ef = E.float()
            if zs is not None:
                with region(PRIOR):  # float32
                    logits.addmm_(zs.float(), Ef.t())
            N, V = logits.shape
            e_hat = logits.new_empty(N, Ef.shape[1])
            lse = logits.new_empty(N)
            ws = workspace(min(chunk, N), V, logits)  # (chunk, V)
            for s in range(0, N, chunk):
                lc = logits[s : s + chunk]
                w = ws[: lc.shape[0]]
                with region(ELEMENT_LOSS):  # float32
                    _logsumexp_rows(lc, lse[s : s + chunk], w)
                with region(REPARAM):  # float32
                    torch.ops.aten._softmax.out(lc, -1, False, out=w)  # softmax(lc) into the workspace
                    torch.mm(w, Ef, out=e_hat[s : s + chunk])
            with region(ELEMENT_LOSS):
                nll = lse - logits.gather(1, target[:, None]).squeeze(1)
        ctx.save_for_backward(logits, lse, e_hat, f, W, b, zs, E, e_keep, target)
        ctx.chunk, ctx.mm_dtype, ctx.used = chunk, mm_dtype, False
        return e_hat, nll

    @staticmethod
    def backward(ctx: Any, g_e: Tensor | None, g_nll: Tensor | None) -> tuple[Tensor | None, ...]:
        if ctx.used:
            raise RuntimeError("the fused RePlaid head frees its buffer in backward; retain_graph is not supported")
        ctx.used = True
        logits, lse, e_hat, f, W, b, zs, E, e_keep, target = ctx.saved_tensors
        mm = ctx.mm_dtype
        with torch.autocast(f.device.type, enabled=False):
            Ef = E.float()
            g_e = torch.zeros_like(e_hat) if g_e is None else g_e.float()
            g_nll = torch.zeros_like(lse) if g_nll is None else g_nll.float()
            s_e = (g_e * e_hat).sum(-1, keepdim=True)  # (N, 1): sum_v p_v g_e.E_v
            keep = e_keep.float()[:, None]
            dE = torch.zeros_like(Ef)
            N, V = logits.shape
            ws = workspace(min(ctx.chunk, N), V, logits)  # (chunk, V)
            for s in range(0, N, ctx.chunk):
                d = logits[s : s + ctx.chunk]  # becomes p, then d logits, in place
                with region(ELEMENT_LOSS):  # float32
                    d.sub_(lse[s : s + ctx.chunk, None]).exp_()
                with region(REPARAM):  # float32
                    dE.addmm_(d.t(), g_e[s : s + ctx.chunk] * keep[s : s + ctx.chunk])  # from e_hat = p E
                    dp = torch.mm(g_e[s : s + ctx.chunk], Ef.t(), out=ws[: d.shape[0]])  # (chunk, V) temporary
                    dp.sub_(s_e[s : s + ctx.chunk]).add_(g_nll[s : s + ctx.chunk, None])
                    d.mul_(dp)
                del dp
            d = logits  # (N, V): d loss / d logits
            with region(ELEMENT_LOSS):  # float32
                d.scatter_add_(1, target[:, None], -g_nll[:, None])
            with region(HEAD):  # bf16 under autocast, as its forward
                dm = d.to(mm)
                df = (dm @ W.to(mm)).to(f.dtype) if ctx.needs_input_grad[0] else None
                dW = (dm.t() @ f.to(mm)).to(W.dtype) if ctx.needs_input_grad[1] else None
                db = d.sum(0).to(b.dtype) if b is not None and ctx.needs_input_grad[2] else None
            dzs = None
            if zs is not None:
                with region(PRIOR):  # float32
                    dzs = (d @ Ef).to(zs.dtype) if ctx.needs_input_grad[3] else None
                    dE.addmm_(d.t(), zs.float() * keep)
        return df, dW, db, dzs, dE.to(E.dtype) if ctx.needs_input_grad[4] else None, None, None, None, None


def prior_softmax_head(
    f: Tensor,
    W: Tensor,
    b: Tensor | None,
    zs: Tensor | None,
    E: Tensor,
    e_keep: Tensor,
    target: Tensor,
    chunk: int,
    mm_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """(e_hat (N, d_e) float32, nll (N,) float32) of the module docstring; f (N, H), zs (N, d_e) or
    None (no output prior), e_keep (N,) 0/1 (0: no gradient to E from that row), target (N,) long."""
    out_: tuple[Tensor, Tensor] = _PriorSoftmaxHead.apply(f, W, b, zs, E, e_keep, target, chunk, mm_dtype)  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
    return out_


def plain_head(
    f: Tensor,
    W: Tensor,
    b: Tensor | None,
    zs: Tensor | None,
    E: Tensor,
    e_keep: Tensor,
    target: Tensor,
    dtype: torch.dtype = torch.float32,
    mm_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """The same outputs by plain autograd in ``dtype`` (the float64 test reference, and the
    expression ``torch.compile`` fuses itself); rows with ``e_keep = 0`` see ``E.detach()``."""
    keep = e_keep.to(dtype)[:, None]
    Ed = E.to(dtype)
    mm = mm_dtype or dtype
    logits = (f.to(mm) @ W.to(mm).t()).to(dtype) + (0 if b is None else b.to(dtype))
    if zs is not None:
        logits = logits + keep * (zs.to(dtype) @ Ed.t()) + (1 - keep) * (zs.to(dtype) @ Ed.detach().t())
    p = torch.softmax(logits, -1)
    e_hat = keep * (p @ Ed) + (1 - keep) * (p @ Ed.detach())
    nll = torch.logsumexp(logits, -1) - logits.gather(1, target[:, None]).squeeze(1)
    return e_hat, nll


def reference_head(
    f: Tensor, W: Tensor, b: Tensor | None, zs: Tensor | None, E: Tensor, e_keep: Tensor, target: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`plain_head` in float64 (for tests)."""
    return plain_head(f, W, b, zs, E, e_keep, target, torch.float64)


class _LinearCrossEntropy(torch.autograd.Function):
    """The token models' head and cross-entropy in one: the same approach as :class:`_PriorSoftmaxHead`
    without the prior and the reparameterisation (module docstring of :func:`linear_cross_entropy`)."""

    @staticmethod
    def forward(
        ctx: Any, f: Tensor, W: Tensor, b: Tensor | None, target: Tensor, chunk: int, mm_dtype: torch.dtype
    ) -> Tensor:
        acc = torch.promote_types(mm_dtype, torch.float32)  # the softmax's dtype: float32 (float64 in a reference)
        with torch.autocast(f.device.type, enabled=False):
            with region(HEAD):  # bf16 under autocast (precision table): the one (N, V) buffer, in mm_dtype
                fm, Wm = f.to(mm_dtype), W.to(mm_dtype)
                logits = fm @ Wm.t() if b is None else torch.addmm(b.to(mm_dtype), fm, Wm.t())  # (N, V)
            N, V = logits.shape
            with region(ELEMENT_LOSS):  # float32
                lse = logits.new_empty(N, dtype=acc)
                ws = workspace(min(chunk, N), V, logits) if acc == torch.float32 else None  # (chunk, V)
                for s in range(0, N, chunk):
                    lc = logits[s : s + chunk]
                    if ws is None:
                        lse[s : s + chunk] = torch.logsumexp(lc.to(acc), -1)
                        continue
                    w = ws[: lc.shape[0]]
                    x = lc if lc.dtype == acc else w.copy_(lc)  # a bf16 chunk upcast into the workspace
                    _logsumexp_rows(x, lse[s : s + chunk], w)
            with region(HEAD):  # the target's logit, read (exactly) from the head's buffer
                picked = logits.gather(1, target[:, None]).squeeze(1)  # (N,)
            with region(ELEMENT_LOSS):
                nll = lse - picked.to(acc)  # (N,)
        ctx.save_for_backward(logits, lse, f, W, b, target)
        ctx.chunk, ctx.mm_dtype, ctx.used = chunk, mm_dtype, False
        return nll

    @staticmethod
    def backward(ctx: Any, g_nll: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.used:
            raise RuntimeError("the fused cross-entropy frees its buffer in backward; retain_graph is not supported")
        ctx.used = True
        logits, lse, f, W, b, target = ctx.saved_tensors
        mm = ctx.mm_dtype
        acc = lse.dtype
        with torch.autocast(f.device.type, enabled=False):
            g = g_nll.to(acc)
            N, V = logits.shape
            ws = workspace(min(ctx.chunk, N), V, logits) if acc == torch.float32 else None  # (chunk, V)
            for s in range(0, N, ctx.chunk):
                d = logits[s : s + ctx.chunk]  # becomes d nll / d logits = g (p - onehot(target)), in place
                n = d.shape[0]
                with region(ELEMENT_LOSS):  # float32
                    p = (ws[:n].copy_(d) if ws is not None else d.to(acc)) if d.dtype != acc else d
                    p.sub_(lse[s : s + n, None]).exp_().mul_(g[s : s + n, None])  # (chunk, V) in acc
                    p.scatter_add_(1, target[s : s + n, None], -g[s : s + n, None])
                if p is not d:
                    with region(HEAD):
                        d.copy_(p)  # rounded once to mm_dtype, as autocast's cast of the float32 gradient
            d = logits  # (N, V): d loss / d logits in mm_dtype
            with region(HEAD):  # bf16 under autocast, as its forward
                Wm = W.to(mm)
                df = (d @ Wm).to(f.dtype) if ctx.needs_input_grad[0] else None
                dW = (d.t() @ f.to(mm)).to(W.dtype) if ctx.needs_input_grad[1] else None
                db = d.sum(0, dtype=acc).to(b.dtype) if b is not None and ctx.needs_input_grad[2] else None
        return df, dW, db, None, None, None


def linear_cross_entropy(
    f: Tensor, W: Tensor, b: Tensor | None, target: Tensor, chunk: int, mm_dtype: torch.dtype | None = None
) -> Tensor:
    """``cross_entropy(f W^T + b, target, reduction="none")`` (N,) without full float32 logits.

    f (N, H), W (V, H), b (V,) or None, target (N,) long. The forward keeps one (N, V) buffer of the
    head's output in ``mm_dtype`` (bf16 under autocast: the precision table's head; default: W's dtype
    widened to float32) and takes the log-sum-exp ``chunk`` rows at a time in float32 (one (chunk, V)
    workspace); the backward turns the buffer in place into ``d logits = g (softmax - onehot(target))``,
    computed in float32 and rounded once. Against autocast's plain head + float32 ``F.cross_entropy``
    (bf16 logits, a float32 copy, a float32 log-softmax kept for backward, its float32 gradient and its
    bf16 cast: ~14 bytes per logit at the peak) it holds 2 bytes per logit plus the workspace, and it
    computes the same numbers up to the order of the sums. Returns float32 (float64 for a float64 W).
    """
    mm = mm_dtype or torch.promote_types(W.dtype, torch.float32)
    out_: Tensor = _LinearCrossEntropy.apply(f, W, b, target, chunk, mm)  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
    return out_


def plain_cross_entropy(
    f: Tensor, W: Tensor, b: Tensor | None, target: Tensor, mm_dtype: torch.dtype | None = None
) -> Tensor:
    """:func:`linear_cross_entropy` by plain autograd (the test reference in float64, and the expression
    ``torch.compile`` fuses itself)."""
    mm = mm_dtype or torch.promote_types(W.dtype, torch.float32)
    logits = f.to(mm) @ W.to(mm).t() if b is None else torch.addmm(b.to(mm), f.to(mm), W.to(mm).t())  # (N, V)
    acc = torch.promote_types(mm, torch.float32)
    return torch.nn.functional.cross_entropy(logits.to(acc), target, reduction="none")
