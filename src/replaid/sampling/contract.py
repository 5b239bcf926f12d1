"""The one sampler contract, k-diffusion style: every sampler of every method is a plain function

    fn(net, state, grid, *, generator, callback, **options) -> SampleResult

* ``net``: what the sampler calls: a continuous method's denoiser (``(z, gamma, e_sc) -> (logits, e_hat)``,
  possibly wrapped by temperature and guidance terms), or a discrete method's network (token ids -> logits);
* ``state``: the initial state, built by the caller as its kind declares
  (each kind's ``start``, :mod:`replaid.sampling.strategy`): a latent ``z ~ N(0, I)`` (B, L, d_e) for continuous methods,
  token ids (B, L) for discrete ones (all [MASK] for MDLM, uniform noise for Duo, the prompt for AR), with
  given tokens already in place;
* ``grid``: (T + 1,) the points the sampler walks; step ``i`` (0 <= i < T) goes from ``grid[i]`` to
  ``grid[i + 1]``: noise levels ``gamma`` (continuous), times ``t`` from 1 to 0 (MDLM, Duo), or the number of
  tokens filled so far (AR: ``n_prefix, n_prefix + 1, ..., L``);
* ``generator``: the seeded ``torch.Generator`` every draw comes from;
* ``callback``: called once per step with a :class:`StepInfo` (``i``, ``T``, ``z`` the state after the step,
  and what each sampler documents);
* ``options``: the sampler's own keywords, each with a default (``disable_progress`` for all;
  ``self_cond`` and ``inpaint`` for continuous samplers; ``temperature`` for discrete ones, ``known`` for
  Duo, ``top_p`` for AR). Which options a request sets is its kind's business
  (:mod:`replaid.sampling.starts`), not the caller's.

The result is a :class:`SampleResult`: the tokens (B, L) and the network calls made (NFE); continuous
samplers add the final latent and readout logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import torch
from torch import Tensor

__all__ = ["Callback", "Committed", "SampleResult", "SamplerFn", "StepInfo", "STEP_KEYS"]


class StepInfo(TypedDict, total=False):
    """What a sampler's callback receives after each step (k-diffusion's callback dict, typed).

    Every sampler sets ``i`` (the step, 0-based), ``T`` (the number of steps) and ``z`` (the state after
    the step: the latent (B, L, d_e) or token ids (B, L)). Continuous samplers add ``gamma``,
    ``gamma_next``, ``e_hat`` and ``logits``; MDLM and Duo ``t``, ``s`` and ``probs`` (B, L, V) float64;
    AR ``pos`` (the position drawn), ``tokens`` (= ``z``) and ``probs`` (B, V) float64. ``generate``'s own
    readout call for continuous methods has ``final`` True, ``tokens`` and ``logits``."""

    i: int
    T: int
    z: Tensor
    gamma: float
    gamma_next: float
    e_hat: Tensor
    logits: Tensor
    t: float
    s: float
    probs: Tensor
    pos: int
    tokens: Tensor
    final: bool
    block: int  # block-by-block generation (sampling/loop.py): the block being written
    start: int  # and its first position
    nfe: int  # the network calls of this sampler call so far (the registered samplers set it)


STEP_KEYS = ("i", "T", "z")  # the keys every sampler's StepInfo has

Callback = Callable[[StepInfo], None]


@dataclass
class SampleResult:
    tokens: Tensor  # (B, L) long: the samples (given positions kept)
    nfe: int  # counted network calls
    z0: Tensor | None = None  # continuous: (B, L, d_e) final latent at gammas[T], dtype of the input z
    logits: Tensor | None = None  # continuous: (B, L, V) readout logits at gammas[T]


@dataclass
class Committed:
    """One block of a block-by-block generator, final once yielded (:mod:`replaid.sampling.stream`)."""

    tokens: Tensor  # (B, n) long: the block's tokens (prompt tokens kept)
    start: int  # the position of its first token in the sequence (the prompt included)
    nfe: int  # network calls so far
    prompt: bool = False  # wholly the prompt's (prefilled; nothing generated)


class SamplerFn(Protocol):
    """The signature every registered sampler has (module docstring). Its own options are further
    keyword-only parameters, each with a default, so that every sampler can be called with just these
    (the type checker verifies that of each function the registry holds)."""

    def __call__(
        self,
        net: Any,
        state: Tensor,
        grid: Tensor,
        /,
        *,
        generator: torch.Generator | None = None,
        callback: Callback | None = None,
    ) -> SampleResult: ...
