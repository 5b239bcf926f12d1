"""Samplers of the discrete methods (AR, MDLM, Duo) as plain functions with the one sampler contract
(:mod:`replaid.sampling.contract`): the network, the initial state (B, L) of token ids built as the kind
declares (:mod:`replaid.sampling.starts`: all [MASK] for MDLM, uniform noise for Duo, the prompt for AR),
the grid it walks, a generator and a callback, then the sampler's own options:

    sample_mdlm(model, x, ts, *, generator, callback, temperature, disable_progress) -> SampleResult
    sample_duo(model, x, ts, *, generator, callback, temperature, known, disable_progress) -> SampleResult
    sample_ar(model, x, positions, *, generator, callback, temperature, top_p, disable_progress) -> SampleResult

``ts``: (T + 1,) float64 from 1 to 0 (:func:`replaid.sampling.continuous.time_grid`); ``positions``:
``n_prefix, n_prefix + 1, ..., L`` (AR's step i fills position ``positions[i]``). Every draw is an
exponential race in float64 on the model's device. The callback (what the playground draws) gets one
:class:`~replaid.sampling.contract.StepInfo` per step, documented on each sampler.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.rng import Gen, device_generator, exponential, rand
from replaid.model.dit import KVCache
from replaid.model.tokens import TokenDiT
from replaid.sampling.contract import Callback, SampleResult


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise. (B, V)."""
    if top_p >= 1.0:
        return probs
    sp, idx = probs.sort(dim=-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p  # the top token is always kept
    sp = sp * keep
    out = torch.zeros_like(probs).scatter(-1, idx, sp)
    return out / out.sum(-1, keepdim=True)


def tempered_probs(logits: Tensor, temperature: float) -> Tensor:
    """``softmax(logits / temperature)`` over the last dim in float64; ``temperature = 0`` is its limit,
    the one-hot of the argmax (greedy decoding: every draw from it returns the argmax)."""
    lg = logits.double()
    if temperature == 0:
        return torch.zeros_like(lg).scatter_(-1, lg.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(lg / temperature, -1)


def exponential_race(probs: Tensor, generator: Gen | None) -> Tensor:
    """Categorical draw over the last dim by Gumbel-max as an exponential race:
    ``argmax_v p_v / E_v`` with ``E_v ~ Exp(1)`` drawn in float64 on ``probs``' device (from a
    generator there, derived from ``generator`` when it lives elsewhere)."""
    gen = device_generator(generator, probs.device)
    e = exponential(tuple(probs.shape), gen, probs.device, torch.float64)
    return (probs.double() / e).argmax(-1)


@torch.no_grad()
def sample_ar(
    model: TokenDiT,
    x: Tensor,
    positions: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    disable_progress: bool = True,
) -> SampleResult:
    """Ancestral sampling with a KV cache from the prefix ``x[:, :n_prefix]`` (B, L), ``positions`` =
    ``n_prefix, ..., L`` (consecutive); the rest of ``x`` is overwritten. Returns the tokens (B, L) and the
    number of network calls (one per generated token).

    ``callback`` is called after each new token with ``{"i", "T": number of generated positions,
    "pos", "z" = "tokens": (B, L) (valid up to pos), "probs": (B, V) float64 distribution drawn from}``."""
    dev = x.device
    B, L = x.shape
    pos_list = [int(p) for p in positions.tolist()]
    if not pos_list or pos_list[-1] != L or pos_list != list(range(pos_list[0], L + 1)) or pos_list[0] < 0:
        raise ValueError(f"positions must run n_prefix, n_prefix + 1, ..., L = {L}; got {pos_list}")
    n_prefix = pos_list[0]
    bos = model.n_in - 1
    out = x.clone()
    cache = KVCache()  # one (k, v) per block, filled by each call
    inp = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=dev), out[:, :n_prefix]], dim=1)
    logits = model.forward_cached(inp, cache, 0)[:, -1]
    nfe = 1
    for pos in tqdm(range(n_prefix, L), disable=disable_progress, desc="ar", leave=False):
        probs = top_p_filter(tempered_probs(logits, temperature), top_p)  # (B, V) float64
        out[:, pos] = exponential_race(probs, generator)  # Gumbel-max through an exponential race, in float64
        if callback is not None:
            callback(
                {
                    "i": pos - n_prefix,
                    "T": L - n_prefix,
                    "pos": pos,
                    "tokens": out,
                    "z": out,
                    "probs": probs,
                    "nfe": nfe,
                }
            )
        if pos + 1 < L:
            logits = model.forward_cached(out[:, pos : pos + 1], cache, pos + 1)[:, -1]
            nfe += 1
    return SampleResult(out, nfe)


def unmask_step(z: Tensor, probs: Tensor, t: float, s: float, gen: Gen | None) -> Tensor:
    """One step of MDLM's ancestral sampler from t to s: each [MASK] (id V = ``probs``' last dim) stays
    masked with probability ``s/t`` (q(z_s | z_t = mask, x_theta)), else takes a token drawn from
    ``probs``; unmasked positions stay. ``z`` (B, n), ``probs`` (B, n, V) float64."""
    V = probs.shape[-1]
    stay = rand(tuple(z.shape), gen, z.device, torch.float64) < s / t
    draw = torch.where(stay, V, exponential_race(probs, gen))
    return torch.where(z == V, draw, z)


@torch.no_grad()
def sample_mdlm(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    disable_progress: bool = True,
) -> SampleResult:
    """MDLM's ancestral sampler on the grid ``ts`` (1 -> 0), float64, from ``x`` (B, L): [MASK] (id V)
    where to generate, the given tokens elsewhere. Each masked position is unmasked between t and s
    with probability ``(t - s)/t`` to a token drawn from ``x_theta``; unmasked positions stay. Without
    time conditioning a step that unmasks nothing leaves the input unchanged and its output is reused.
    Returns the tokens and the network calls.

    ``callback`` (k-diffusion style) is called after each step with ``{"i", "T", "t", "s",
    "z": (B, L) state at s (mask id ``V``), "probs": (B, L, V) float64 x_theta used}``."""
    dev = x.device
    B, L = x.shape
    steps = len(ts) - 1
    z = x
    gen = device_generator(generator, dev)  # all draws on the model's device
    probs, nfe = None, 0
    for k in tqdm(range(steps), disable=disable_progress, desc="mdlm", leave=False):
        t, s = float(ts[k]), float(ts[k + 1])
        if probs is None or model.time_conditioning:
            tt = torch.full((B,), t, device=dev) if model.time_conditioning else None
            probs = tempered_probs(model(z, tt), temperature)  # (B, L, V) float64: x_theta
            nfe += 1
        z_new = unmask_step(z, probs, t, s, gen)
        if not torch.equal(z_new, z):
            probs_used, probs = probs, None  # the input changed: recompute at the next step
        else:
            probs_used = probs
        z = z_new
        if callback is not None:
            callback({"i": k, "T": steps, "t": t, "s": s, "z": z, "probs": probs_used, "nfe": nfe})
    return SampleResult(z, nfe)


@torch.no_grad()
def sample_duo(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    known: Tensor | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Duo's ancestral sampler, float64, on the grid ``ts`` (1 -> 0) from ``x`` (B, L) (uniform noise;
    ``known`` (L,) bool: positions of ``x`` kept as they are after every step):
    ``p(z_s = j | z_t = i) ∝ (a_ts [j = i] + (1 - a_ts)/V) (a_s x_theta_j + (1 - a_s)/V)``.

    ``callback`` is called after each step with ``{"i", "T", "t", "s", "z": (B, L) state at s,
    "probs": (B, L, V) float64 x_theta at t}``."""
    dev = x.device
    V = model.n_out
    B, L = x.shape
    steps = len(ts) - 1
    gen = device_generator(generator, dev)  # all draws on the model's device
    given = x.clone()
    z = x
    for k in tqdm(range(steps), disable=disable_progress, desc="duo", leave=False):
        t, s = float(ts[k]), float(ts[k + 1])
        a_t, a_s = 1 - t, 1 - s
        a_ts = a_t / a_s
        logits = model(z, torch.full((B,), t, device=dev))
        xt = tempered_probs(logits, temperature)  # (B, L, V) float64
        prior = a_s * xt + (1 - a_s) / V
        trans = torch.full_like(prior, (1 - a_ts) / V)
        trans.scatter_add_(-1, z.unsqueeze(-1), torch.full((B, L, 1), a_ts, dtype=torch.float64, device=dev))
        post = prior * trans
        z = exponential_race(post / post.sum(-1, keepdim=True), gen)
        if known is not None:
            z = torch.where(known.to(dev), given, z)
        if callback is not None:
            callback({"i": k, "T": steps, "t": t, "s": s, "z": z, "probs": xt, "nfe": k + 1})
    return SampleResult(z, steps)
