"""The pieces of block-by-block generation (BD3-LM's semi-autoregressive sampler) at the model's level.

A run trained with blocks of ``b`` tokens (``mdlm.block_size``, ``diffusion.block_size``) writes text of
any length: block k is denoised from noise, attending to the committed clean blocks before it, then
committed by one clean forward pass whose keys and values go to a :class:`~replaid.model.dit.KVCache`.
The cache is exact: its keys are those the training pass computes for the clean copy (clean rows attend
block-causally). This module holds what each kind's kernel (:mod:`replaid.sampling.batching`) calls: the
noisy block's logits over the cache and the clean commit (MDLM, :func:`cached_logits`,
:func:`commit_masked`), AR's causal commit, prefill and draw (:func:`commit_ar`, :func:`prefill_ar`,
:func:`draw_ar`), and a continuous model's denoiser seeing the committed blocks (:class:`BlockDenoiser`,
:func:`commit_continuous`); the loop that runs them is :mod:`replaid.sampling.loop`.

Past the training context a ``window`` keeps the last ``window`` committed rows: rotary scores depend
on position differences only, so positions keep counting and every query-key offset stays inside the
window, i.e. inside what the model was trained on; what falls out of the window is no longer seen.

A prompt fills the first positions: its whole blocks are committed first (prefill), and a block it
covers in part is denoised with the prompt's tokens kept (MDLM: never masked; continuous: replaced by
their forward samples at every level, :class:`~replaid.sampling.continuous.Inpaint`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from replaid.diffusion.denoiser import DenoiserOutput
from replaid.diffusion.rng import Gen
from replaid.model.blocks import prefix_block_mask
from replaid.model.dit import KVCache, per_token
from replaid.model.tokens import TokenDiT
from replaid.sampling.discrete import exponential_race, tempered_probs, top_p_filter

if TYPE_CHECKING:
    from replaid.model.replaid import RePlaid
    from replaid.store.loading import Run

Stop = Callable[[Tensor], Tensor]  # rows' tokens so far (B, n) -> (B,) bool: this row is done


# ------------------------------------------------------------------ MDLM (BD3-LM)


def cached_logits(model: TokenDiT, ids: Tensor, cache: KVCache) -> Tensor:
    """Logits (B, b, V) of the noisy block ``ids`` (B, b) at the cache's next positions, seeing its keys."""
    c = model.conditioning(None, ids.shape[0], ids.device)
    h = model.backbone(model.input_states(ids), c, cache=cache)
    return model.head(model.final.features(h, c))


def commit_masked(model: TokenDiT, ids: Tensor, start: int, cache: KVCache) -> None:
    """One clean pass over the finished block ``ids`` (B, b), its keys and values written to the cache."""
    assert cache.next_pos == start
    c = model.conditioning(None, ids.shape[0], ids.device)
    model.backbone(model.input_states(ids), c, cache=cache, commit=True)  # at the cache's next positions


@dataclass(frozen=True)
class BlockRows:
    """What a request written block by block (:func:`~replaid.sampling.loop.start_blocks`, a scheduler's
    lane) takes from the run, the prompt and the length: the ``model``, its ``block`` size, the row length ``N`` (``length`` rounded up
    to whole blocks), the cache's ``window`` (past the training length it keeps the last ``seq_len - block``
    committed rows: the longest prefix a block saw in training) and the ``prompt`` (P,) on the model's
    device."""

    model: Any
    block: int
    N: int
    window: int
    prompt: Tensor

    @classmethod
    def of(cls, run: Run, prompt: Tensor, length: int) -> BlockRows:
        block = run.method.stream_block()
        dev = next(run.model.parameters()).device
        return cls(run.model, block, -(-length // block) * block, run.cfg.data.seq_len - block, prompt.to(dev))

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.prompt.device

    def ids(self, B: int, fill: int) -> Tensor:
        """(B, N) ids: the prompt's first, ``fill`` after them."""
        x = torch.full((B, self.N), fill, dtype=torch.long, device=self.device)
        x[:, : len(self.prompt)] = self.prompt
        return x

    def known(self, B: int) -> Tensor:
        """(B, N) bool: the prompt's positions."""
        return (torch.arange(self.N, device=self.device) < len(self.prompt)).expand(B, self.N)


# ------------------------------------------------------------------ AR: blocks of one token


def commit_ar(model: TokenDiT, ids: Tensor, cache: KVCache) -> None:
    """One causal pass of the written tokens ``ids`` (B, n) over the cache, their keys to it; BOS goes
    first while nothing is cached (AR's input is ``[BOS, x_0, ...]``, :mod:`replaid.methods.ar`, so ``x_j``
    sits at input position ``j + 1``). The logits of its last row, the next token's, become ``cache.head``
    (B, V) float32. n may be 0 (BOS alone: what an empty prompt starts from)."""
    if cache.length == 0 and cache.next_pos == 0:
        ids = torch.cat([ids.new_full((ids.shape[0], 1), model.n_in - 1), ids], 1)
    cache.head = model.forward_cached(ids, cache, cache.next_pos)[:, -1]  # (B, V)


def prefill_ar(model: TokenDiT, ids: Tensor, cache: KVCache) -> int:
    """The prompt ``ids`` (B, P) into an empty cache in as few passes as a token-by-token prefill sees the
    same keys: BOS and the tokens that fit the cache's window in one causal pass, then one pass per token
    (a query sees at most ``window`` keys before it). Returns the passes."""
    first = ids.shape[1] if cache.window is None else min(ids.shape[1], cache.window)
    commit_ar(model, ids[:, :first], cache)
    for j in range(first, ids.shape[1]):
        commit_ar(model, ids[:, j : j + 1], cache)
    return 1 + ids.shape[1] - first


def draw_ar(cache: KVCache, temperature: float, top_p: float, gen: Gen | None) -> tuple[Tensor, Tensor]:
    """The next token (B,) drawn from ``cache.head`` at ``temperature`` within the ``top_p`` nucleus, as
    :func:`~replaid.sampling.discrete.sample_ar` draws it, and the distribution (B, V) float64."""
    assert cache.head is not None, "commit_ar first: BOS or the prompt"
    probs = top_p_filter(tempered_probs(cache.head, temperature), top_p)  # (B, V) float64
    return exponential_race(probs, gen), probs


# ------------------------------------------------------------------ continuous methods (RePlaid, Plaid)


class BlockDenoiser:
    """A continuous model's denoiser (:class:`~replaid.diffusion.denoiser.Denoiser`) for the noisy block
    at positions ``start ..``, seeing the committed clean blocks before it: the ``cache``'s keys, or (no
    cache) the clean ``prefix`` ids (B, start) recomputed as the training pass sees them (each clean block
    ``alpha_0 e`` at ``gamma_0``: :meth:`~replaid.model.replaid.RePlaid.clean_states`). With nothing
    before it (the first block) it is the plain model. gamma (B,) per row, as every sampler passes it."""

    def __init__(self, model: RePlaid, start: int, cache: KVCache | None = None, prefix: Tensor | None = None):
        self.model, self.start, self.cache, self.prefix = model, start, cache, prefix
        self.self_conditioning = model.self_conditioning

    def embedding_matrix(self) -> Tensor:
        return self.model.embedding_matrix()

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        m, s0 = self.model, self.start
        if s0 == 0:  # nothing committed before: the model itself (a one-block run is the whole-sequence sampler)
            out: DenoiserOutput = m(z, gamma, e_sc)
            return out
        h, c = m.input_states(z, gamma, e_sc)  # (B, b, hidden), (B, cond) or None
        if self.cache is not None:
            assert self.cache.next_pos == s0  # blocks are committed in order
            h = m.backbone(h, c, cache=self.cache)
        else:
            assert self.prefix is not None
            b = z.shape[1]
            h_c, c_c = m.clean_states(m.embedding_matrix()[self.prefix])  # (B, start, hidden)
            cc = None if c is None or c_c is None else torch.cat([c_c, per_token(c).expand(-1, b, -1)], dim=1)
            h = m.backbone(torch.cat([h_c, h], dim=1), cc, mask=prefix_block_mask(s0, b, z.device))[:, s0:]
        return m.output(m.readout(h, c), z, gamma, m.embedding_matrix())


def commit_continuous(model: RePlaid, ids: Tensor, start: int, cache: KVCache) -> None:
    """One clean pass over a finished block's ids (B, b) (as the training pass's clean copy), its keys
    and values written to the cache."""
    assert cache.next_pos == start
    h, c = model.clean_states(model.embedding_matrix()[ids])
    model.backbone(h, c, cache=cache, commit=True)  # at the cache's next positions
