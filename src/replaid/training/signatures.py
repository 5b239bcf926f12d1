"""Plateau signatures for the training log: cheap read-only probes of the model on a few
rows of the logged step's batch, computed on logging steps only.

* ``kl_unigram/t<t>``: mean over predicted positions of ``KL(p_theta(x | z_t) || p_unigram)``, the
  distance of the model's token predictions from the unigram distribution at fixed times t (0 on the
  plateau: the network predicts the unigram). MDLM's predicted positions are the masked ones.
* ``attn_entropy/<i>`` (nats): mean entropy of layer i's attention rows (``log L`` when uniform);
  ``pos_cosine/<i>``: mean cosine between the residual-stream states of different positions of a
  sequence after block i (1: representation collapse). Both at the middle time ``t = 0.5`` (Gopalani
  and Hu, NeurIPS 2025, tie both to transformer plateaus).
* ``emb_rank``: effective rank ``exp(H(s / sum s))`` of the embedding rows' singular values s (Roy and
  Vetterli, 2007); ``emb_min_dist``: the smallest distance between two rows.
* ``prior_share/t<t>`` (RePlaid, Plaid): ``var(prior) / (var(prior) + var(head))``, the output prior
  logits' share of the logits' variance over the vocabulary, mean over positions.
* ``sc_cosine`` (self-conditioning): mean cosine between the first pass's estimate ``e_sc`` (what
  self-conditioning feeds back) and the clean embedding, at ``t = 0.5``; ``sc_input``: the norm of
  its input projection ``W_sc(sqrt(d_e) e_sc)`` over the norm of ``h_0`` without it.

The probes use their own generator (seeded by the seed and step), the network in eval mode and no
gradient: the training trajectory is the same with or without them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from replaid.methods.base import Method, Probe
from replaid.model.dit import apply_rotary

PROBE_TIMES = (0.2, 0.5, 0.8)
LAYER_TIME = 0.5  # the time of the per-layer signatures and the self-conditioning ones


def kl_from_unigram(logits: Tensor, unigram_logp: Tensor, keep: Tensor) -> float:
    """Mean over the kept positions of ``KL(softmax(logits) || unigram)``. logits (B, L, V), unigram_logp
    (V,) log-probabilities, keep (B, L) bool. NaN when no position is kept."""
    logp = torch.log_softmax(logits.double(), dim=-1)  # (B, L, V)
    kl = (logp.exp() * (logp - unigram_logp.double().to(logp.device))).sum(-1)  # (B, L)
    n = int(keep.sum())
    return float(kl[keep].sum() / n) if n else math.nan


def prior_share(head: Tensor, prior: Tensor, keep: Tensor) -> float:
    """Mean over kept positions of ``var_V(prior) / (var_V(prior) + var_V(head))``: head and prior (B, L, V)."""
    vp, vh = prior.double().var(-1, unbiased=False), head.double().var(-1, unbiased=False)  # (B, L)
    share = vp / (vp + vh).clamp_min(1e-300)
    n = int(keep.sum())
    return float(share[keep].sum() / n) if n else math.nan


def effective_rank(w: Tensor) -> float:
    """``exp(H(p))`` with ``p = s / sum(s)`` over the singular values s of w (V, d) (Roy and Vetterli)."""
    s = torch.linalg.svdvals(w.double())
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def min_pairwise_distance(w: Tensor, chunk: int = 1024) -> float:
    """The smallest Euclidean distance between two distinct rows of w (V, d), ``chunk`` rows against all
    at a time: (chunk, V) float64 at most, never the (V, V) matrix (20 GB at GPT-2's 50k rows)."""
    w = w.double()
    sq = (w * w).sum(-1)  # (V,)
    best = math.inf
    for i in range(0, w.shape[0], chunk):
        d2 = (sq[i : i + chunk, None] + sq[None, :] - 2 * w[i : i + chunk] @ w.t()).clamp_min(0)  # (c, V)
        rows = torch.arange(d2.shape[0], device=w.device)
        d2[rows, rows + i] = math.inf  # a row against itself
        best = min(best, float(d2.min()))
    return math.sqrt(best)


def attention_entropy(qkv_out: Tensor, n_heads: int, rope: tuple[Tensor, Tensor]) -> float:
    """Mean entropy (nats) of the bidirectional attention rows of a block, from its ``qkv`` projection's
    output (B, L, 3D): ``softmax(q k^T / sqrt(hd))`` after the rotary embedding, as the block computes it."""
    B, L, D3 = qkv_out.shape
    q, k, _ = qkv_out.float().view(B, L, 3, n_heads, D3 // (3 * n_heads)).permute(2, 0, 3, 1, 4)  # (B, H, L, hd)
    q, k = apply_rotary(q, *rope).double(), apply_rotary(k, *rope).double()
    logp = torch.log_softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)  # (B, H, L, L)
    return float(-(logp.exp() * logp).sum(-1).mean())


def position_cosine(h: Tensor) -> float:
    """Mean cosine between the states of different positions of one sequence, over sequences: h (B, L, D);
    ``(||sum_l u_l||^2 - L) / (L (L - 1))`` per sequence, ``u_l`` the unit states."""
    u = h.double() / h.double().norm(dim=-1, keepdim=True).clamp_min(1e-300)  # (B, L, D)
    L = u.shape[1]
    s = u.sum(1)  # (B, D)
    return float(((s * s).sum(-1) - L).mean() / (L * (L - 1)))


@contextmanager
def recorded_layers(backbone: nn.Module) -> Iterator[dict[str, dict[int, Tensor]]]:
    """While open, keep the last ``qkv`` output and the last output of every block of ``backbone``
    (``{"qkv": {i: (B, L, 3D)}, "out": {i: (B, L, D)}}``)."""
    rec: dict[str, dict[int, Tensor]] = {"qkv": {}, "out": {}}
    handles = []
    for i, blk in enumerate(getattr(backbone, "blocks", [])):

        def keep(kind: str, i: int = i) -> Any:
            def hook(_m: nn.Module, _inp: Any, out: Tensor) -> None:
                rec[kind][i] = out.detach()

            return hook

        handles.append(blk.qkv.register_forward_hook(keep("qkv")))
        handles.append(blk.register_forward_hook(keep("out")))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def signatures(
    method: Method[Any],
    model: nn.Module,
    tokens: Tensor,
    unigram_logp: Tensor,
    generator: torch.Generator,
    times: Sequence[float] = PROBE_TIMES,
) -> dict[str, float]:
    """The module docstring's signatures of ``model`` on tokens (B, L). ``{}`` for a method without
    :meth:`~replaid.methods.base.Method.probe` (AR, Duo)."""
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    try:
        for t in times:
            backbone = model.get_submodule("backbone") if t == LAYER_TIME else nn.Module()
            with recorded_layers(backbone) as rec:
                p: Probe | None = method.probe(model, tokens, t, generator)
            if p is None:
                return {}
            out[f"kl_unigram/t{t:g}"] = kl_from_unigram(p.logits, unigram_logp, p.keep)
            if p.prior is not None:
                out[f"prior_share/t{t:g}"] = prior_share(p.logits - p.prior, p.prior, p.keep)
            if t == LAYER_TIME:
                out.update(layer_signatures(backbone, rec, tokens.shape[1], tokens.device))
                if p.sc_estimate is not None and p.clean is not None:
                    cos = torch.cosine_similarity(p.sc_estimate.double(), p.clean.double(), dim=-1)  # (B, L)
                    out["sc_cosine"] = float(cos.mean())
                if p.sc_input is not None:
                    out["sc_input"] = p.sc_input
        rows = method.embedding_rows(model).detach()
        out["emb_rank"] = effective_rank(rows)
        out["emb_min_dist"] = min_pairwise_distance(rows)
    finally:
        model.train(was_training)
    return out


def layer_signatures(
    backbone: nn.Module, rec: dict[str, dict[int, Tensor]], L: int, device: torch.device
) -> dict[str, float]:
    """``attn_entropy/<i>`` and ``pos_cosine/<i>`` from :func:`recorded_layers`' captures."""
    out: dict[str, float] = {}
    rotary = getattr(backbone, "rotary", None)
    for i, blk in enumerate(getattr(backbone, "blocks", [])):
        if i in rec["qkv"] and rotary is not None and not getattr(blk, "causal", False):
            out[f"attn_entropy/{i}"] = attention_entropy(rec["qkv"][i], int(blk.n_heads), rotary(L, device))
        if i in rec["out"]:
            out[f"pos_cosine/{i}"] = position_cosine(rec["out"][i])
    return out
