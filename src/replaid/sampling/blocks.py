"""Block-by-block generation for block diffusion (BD3-LM's semi-autoregressive sampler).

A run trained with blocks of ``b`` tokens (``mdlm.block_size``, ``diffusion.block_size``) writes text of
any length: block k is denoised from noise, attending to the committed clean blocks before it, then
committed by one clean forward pass whose keys and values go to a :class:`~replaid.model.dit.KVCache`.
The cache is exact: its keys are those the training pass computes for the clean copy (clean rows attend
block-causally), so cached and uncached generation draw the same tokens (``use_cache=False``
recomputes the clean prefix at every network call, the reference).

One block loop (:func:`block_loop`) serves every method; what differs is the function that denoises one
block: MDLM's ancestral unmasking from all-[MASK] (:func:`sample_blocks`), or any registered continuous
sampler (DDPM, DDIM, DPM-Solver++, Heun, ...) from ``z ~ N(0, I)`` with a denoiser that sees the committed
blocks (:class:`BlockDenoiser`, :func:`sample_blocks_continuous`). :func:`sample_any_length` is the one
entry point for a run of any block method. The loop is also a generator (:func:`iter_block_loop`) that
gives out each block once it is written (:class:`~replaid.sampling.contract.Committed`); the starters
:func:`start_masked_blocks` and :func:`start_continuous_blocks` build it for a request, which is how
``replaid sample`` and ``/v1/completions`` stream (:mod:`replaid.sampling.stream`).

Past the training context a ``window`` keeps the last ``window`` committed rows: rotary scores depend
on position differences only, so positions keep counting and every query-key offset stays inside the
window, i.e. inside what the model was trained on; what falls out of the window is no longer seen.

A prompt fills the first positions: its whole blocks are committed first (prefill), and a block it
covers in part is denoised with the prompt's tokens kept (MDLM: never masked; continuous: replaced by
their forward samples at every level, :class:`~replaid.sampling.continuous.Inpaint`). ``stop`` (rows'
tokens so far -> (B,) bool) ends generation once every row is done; the caller cuts each row at its stop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.denoiser import Denoiser, DenoiserOutput
from replaid.diffusion.rng import Gen, device_generator
from replaid.methods.base import Method
from replaid.model.blocks import prefix_block_mask
from replaid.model.dit import KVCache, per_token
from replaid.model.tokens import TokenDiT
from replaid.sampling.continuous import Inpaint, gamma_grid, time_grid
from replaid.sampling.contract import Callback, Committed, SampleResult, SamplerFn, StepInfo
from replaid.sampling.discrete import exponential_race, tempered_probs, top_p_filter, unmask_step
from replaid.sampling.registry import get_sampler
from replaid.sampling.request import SampleRequest
from replaid.sampling.strategy import strategy_of

if TYPE_CHECKING:
    from replaid.model.replaid import RePlaid
    from replaid.store.loading import Run

Stop = Callable[[Tensor], Tensor]  # rows' tokens so far (B, n) -> (B,) bool: this row is done
# (k, start, out, cache) -> network calls: write block k (positions start .. start + b) into out (B, N)
FillBlock = Callable[[int, int, Tensor, KVCache | None], int]
Commit = Callable[[Tensor, int, KVCache], None]  # one clean pass of the block's ids (B, b) at start, to the cache


def iter_block_loop(
    out: Tensor,
    known: Tensor,
    block: int,
    fill: FillBlock,
    commit: Commit,
    *,
    use_cache: bool = True,
    window: int | None = None,
    disable_progress: bool = True,
) -> Generator[Committed, None, None]:
    """The one block loop (module docstring) as a generator. ``out`` (B, N) ids, the prompt's in place
    where ``known`` (B, N) bool; block by block, a block wholly known is given out as it is (``prompt``
    True: prefill), any other is written by ``fill``; each is yielded once written, then committed to
    the cache when the consumer asks for the next (so never after the last block, nor after the consumer
    closes the generator: stopping early). ``nfe``: ``fill``'s network calls plus one per commit."""
    B, N = out.shape
    if block < 1 or N % block:
        raise ValueError(f"the length {N} must be a positive multiple of the block size {block}")
    if use_cache is False and window is not None:
        raise ValueError("a window is a property of the cache: use_cache=False sees the whole prefix")
    cache = KVCache(window=window) if use_cache else None
    n_blocks = N // block
    nfe = 0
    for k in tqdm(range(n_blocks), disable=disable_progress, desc="blocks", leave=False):
        s0, e0 = k * block, (k + 1) * block
        prompt = bool(known[:, s0:e0].all())
        if not prompt:
            nfe += fill(k, s0, out, cache)
        yield Committed(out[:, s0:e0], s0, nfe, prompt=prompt)
        if k < n_blocks - 1 and cache is not None:
            commit(out[:, s0:e0], s0, cache)
            nfe += 1


def block_loop(
    out: Tensor,
    known: Tensor,
    block: int,
    fill: FillBlock,
    commit: Commit,
    *,
    use_cache: bool = True,
    window: int | None = None,
    stop: Stop | None = None,
    on_block: Callable[[int, Tensor], None] | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """:func:`iter_block_loop` run to the end or to ``stop`` (checked after every block). ``on_block(k,
    ids (B, b))`` is told each block written (not the prompt's). Returns the ids up to the last block
    and the network calls."""
    blocks = iter_block_loop(
        out, known, block, fill, commit, use_cache=use_cache, window=window, disable_progress=disable_progress
    )
    nfe, end = 0, 0
    for c in blocks:
        end, nfe = c.start + block, c.nfe
        if not c.prompt and on_block is not None:
            on_block(c.start // block, c.tokens)
        if stop is not None and bool(stop(out[:, :end]).all()):
            blocks.close()
            break
    return SampleResult(out[:, :end], nfe)


# ------------------------------------------------------------------ MDLM (BD3-LM)


def _block_logits(model: TokenDiT, ids: Tensor, out: Tensor, start: int, block: int, cache: KVCache | None) -> Tensor:
    """Logits (B, b, V) of the noisy block ``ids`` (B, b) at positions ``start ..``: against the cache, or
    (no cache) against the clean prefix ``out[:, :start]`` recomputed as the training pass sees it."""
    if cache is not None:
        assert cache.next_pos == start  # blocks are committed in order: the cache's next positions are these
        return cached_logits(model, ids, cache)
    c = model.conditioning(None, ids.shape[0], ids.device)
    h = torch.cat([model.input_states(out[:, :start]), model.input_states(ids)], dim=1)
    mask = prefix_block_mask(start, block, ids.device)
    h = model.backbone(h, c, mask=mask)[:, start:]  # positions 0 .. start + b - 1
    return model.head(model.final.features(h, c))


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


def _masked_fill(
    model: TokenDiT,
    ts: Tensor,
    gen: torch.Generator | None,
    temperature: float,
    block: int,
    callback: Callback | None,
) -> FillBlock:
    """MDLM's block writer: ancestral unmasking of block k from all-[MASK] on ``ts``."""
    steps = len(ts) - 1

    def fill(k: int, s0: int, out: Tensor, cache: KVCache | None) -> int:
        e0, nfe = s0 + block, 0
        z = out[:, s0:e0]
        probs = None
        for i in range(steps):
            t, s = float(ts[i]), float(ts[i + 1])
            if probs is None:  # no time conditioning: an unchanged block gives the same output
                probs = tempered_probs(_block_logits(model, z, out, s0, block, cache), temperature)  # (B, b, V)
                nfe += 1
            z_new = unmask_step(z, probs, t, s, gen)
            used = probs
            if not torch.equal(z_new, z):
                probs = None
            z = z_new
            out[:, s0:e0] = z
            if callback is not None:
                callback({"i": i, "T": steps, "t": t, "s": s, "z": out, "probs": used, "block": k})
        return nfe

    return fill


@torch.no_grad()
def sample_blocks(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    block: int = 0,
    use_cache: bool = True,
    window: int | None = None,
    stop: Stop | None = None,
    on_block: Callable[[int, Tensor], None] | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """MDLM: generate ``x`` (B, N) block by block (module docstring): [MASK] (id V) where to write, the
    prompt's tokens elsewhere (only in the first blocks); ``N`` a multiple of ``block``; ``ts`` (T + 1,)
    from 1 to 0, every block's grid. Returns the tokens up to the last block written (all rows stopped,
    or N) and the network calls (denoising calls plus one commit pass per block that another follows).

    ``callback`` gets ``{"i", "T", "t", "s", "z": (B, N) tokens so far (mask id V), "probs": (B, b, V),
    "block": k}`` after each step."""
    fill = _masked_fill(model, ts, device_generator(generator, x.device), temperature, block, callback)
    return block_loop(
        x.clone(),
        x != model.n_out,
        block,
        fill,
        lambda ids, s0, cache: commit_masked(model, ids, s0, cache),
        use_cache=use_cache,
        window=window,
        stop=stop,
        on_block=on_block,
        disable_progress=disable_progress,
    )


@torch.no_grad()  # torch enters it around each step of a generator function
def iter_blocks(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    block: int = 0,
    use_cache: bool = True,
    window: int | None = None,
    disable_progress: bool = True,
) -> Generator[Committed, None, None]:
    """:func:`sample_blocks` as a generator: each block of ``x`` (B, N) given out once written
    (:func:`iter_block_loop`); stopping early is closing it."""
    fill = _masked_fill(model, ts, device_generator(generator, x.device), temperature, block, callback)
    yield from iter_block_loop(
        x.clone(),
        x != model.n_out,
        block,
        fill,
        lambda ids, s0, cache: commit_masked(model, ids, s0, cache),
        use_cache=use_cache,
        window=window,
        disable_progress=disable_progress,
    )


@dataclass(frozen=True)
class BlockRows:
    """What both block starters (:class:`~replaid.sampling.stream.BlockStarter`) take from the run, the
    prompt and the length: the ``model``, its ``block`` size, the row length ``N`` (``length`` rounded up
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


def start_masked_blocks(
    run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
) -> Callable[[int], Iterator[Committed]]:
    """MDLM with blocks as a :class:`~replaid.sampling.stream.BlockStarter`: ``batch(B)`` writes B rows of
    ``length`` tokens (rounded up to whole blocks), ``prompt`` (P,) first, with ``req.steps`` ancestral steps
    per block at ``req.temperature``, the cache's window as :class:`BlockRows` says. The batches of one
    request draw in order from one generator seeded with ``req.seed``."""
    r = BlockRows.of(run, prompt, length)
    V = int(r.model.n_out)
    gen = torch.Generator().manual_seed(req.seed)
    ts = time_grid(req.steps)

    def batch(B: int) -> Iterator[Committed]:
        return iter_blocks(
            r.model,
            r.ids(B, V),
            ts,
            generator=gen,
            callback=callback,
            temperature=req.temperature,
            block=r.block,
            window=r.window,
            disable_progress=not req.progress,
        )

    return batch


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


def start_ar_blocks(
    run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
) -> Callable[[int], Iterator[Committed]]:
    """AR as a :class:`~replaid.sampling.stream.BlockStarter`: blocks of one token (the KV cache's
    commit of token j gives token j + 1's logits), ``batch(B)`` writing B rows of ``length`` tokens,
    ``prompt`` (P,) first, at ``req.temperature`` within ``req.top_p`` (else the run's ``ar.top_p``);
    past ``data.seq_len`` the window keeps the last ``seq_len - 1`` committed tokens, so that every query
    sees at most the ``seq_len`` keys of training (BOS and ``seq_len - 1`` tokens). One generator seeded
    with ``req.seed`` draws every token of the request's batches in order (as ``sample_ar``). ``callback``
    gets ``sample_ar``'s ``{"i", "T", "pos", "tokens", "z", "probs", "nfe"}`` after each token."""
    r = BlockRows.of(run, prompt, length)
    gen = torch.Generator().manual_seed(req.seed)
    top_p = req.top_p if req.top_p is not None else run.cfg.ar.top_p
    P = len(prompt)

    @torch.no_grad()  # torch enters it around each step of a generator function
    def batch(B: int) -> Generator[Committed, None, None]:
        g = device_generator(gen, r.device)

        def fill(k: int, s0: int, out: Tensor, cache: KVCache | None) -> int:
            assert cache is not None
            calls = 0
            if cache.head is None:  # an empty prompt: BOS alone
                commit_ar(r.model, out[:, :0], cache)
                calls = 1
            out[:, s0], probs = draw_ar(cache, req.temperature, top_p, g)
            if callback is not None:
                info = {"i": s0 - P, "T": r.N - P, "pos": s0, "tokens": out, "z": out, "probs": probs, "nfe": calls}
                callback(cast(StepInfo, info))
            return calls

        yield from iter_block_loop(
            r.ids(B, 0),
            r.known(B),
            1,
            fill,
            lambda ids, s0, cache: commit_ar(r.model, ids, cache),
            window=r.window,
            disable_progress=not req.progress,
        )

    return batch


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


def _continuous_fill(
    model: RePlaid,
    sampler: SamplerFn,
    known: Tensor,
    gammas: Tensor,
    gen: torch.Generator | None,
    callback: Callback | None,
    block: int,
    options: dict[str, Any],
    wrap: Callable[[Denoiser], Denoiser] | None,
) -> FillBlock:
    """A continuous method's block writer: ``sampler`` from ``z ~ N(0, I)`` with a :class:`BlockDenoiser`
    (``wrap``ped, e.g. by the request's temperatures), the prompt's positions by replacement."""
    E = model.embedding_matrix().detach()

    def fill(k: int, s0: int, out: Tensor, cache: KVCache | None) -> int:
        e0 = s0 + block
        den: Denoiser = BlockDenoiser(model, s0, cache, None if cache is not None else out[:, :s0])
        if wrap is not None:
            den = wrap(den)
        z = torch.randn(out.shape[0], block, E.shape[1], generator=gen, device=out.device)  # (B, b, d_e)
        kn = known[:, s0:e0]
        inpaint = Inpaint(out[:, s0:e0], kn, E) if bool(kn.any()) else None
        cb = None if callback is None else _tagged(callback, k)
        res = sampler(den, z, gammas, generator=gen, callback=cb, **{**options, "inpaint": inpaint})
        out[:, s0:e0] = res.tokens
        return res.nfe

    return fill


@torch.no_grad()
def sample_blocks_continuous(
    model: RePlaid,
    sampler: SamplerFn,
    ids: Tensor,
    known: Tensor,
    gammas: Tensor,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    block: int = 0,
    use_cache: bool = True,
    window: int | None = None,
    stop: Stop | None = None,
    on_block: Callable[[int, Tensor], None] | None = None,
    options: dict[str, Any] | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """A continuous model (RePlaid, Plaid): write ``ids`` (B, N) where not ``known`` (B, N) bool (the
    prompt's ids in place), block by block: each block from ``z ~ N(0, I)`` (B, b, d_e) drawn from
    ``generator``, by ``sampler`` (any registered continuous sampler, e.g. ``sample_ddim``) on ``gammas``
    with a :class:`BlockDenoiser` (its own self-conditioning chain, per block); the prompt's positions of
    a block it covers in part by replacement. ``options``: the sampler's own keywords (``self_cond``,
    ``disable_progress``). ``callback``: the sampler's :class:`StepInfo` with ``"block": k`` added."""
    gen = device_generator(generator, ids.device)
    fill = _continuous_fill(model, sampler, known, gammas, gen, callback, block, dict(options or {}), None)
    return block_loop(
        ids.clone(),
        known,
        block,
        fill,
        lambda blk, s0, cache: commit_continuous(model, blk, s0, cache),
        use_cache=use_cache,
        window=window,
        stop=stop,
        on_block=on_block,
        disable_progress=disable_progress,
    )


def start_continuous_blocks(
    run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
) -> Callable[[int], Iterator[Committed]]:
    """RePlaid or Plaid with blocks as a :class:`~replaid.sampling.stream.BlockStarter`: as
    :func:`start_masked_blocks`, each block written by the request's continuous sampler (``req.sampler``,
    ``req.steps`` per block, self-conditioning as ``req.self_cond``) with the request's logit and score
    temperatures applied to the block denoiser."""
    from replaid.sampling.starts import denoiser_for  # the request's temperatures, as the full-sequence samplers

    r = BlockRows.of(run, prompt, length)
    model = r.model
    fn = get_sampler(run.method, req.sampler).fn
    gammas = gamma_grid(model.schedule, req.steps)
    gen = device_generator(torch.Generator().manual_seed(req.seed), r.device)
    options = {"self_cond": None if req.self_cond else False, "disable_progress": True}

    def batch(B: int) -> Iterator[Committed]:
        known = r.known(B)
        fill = _continuous_fill(
            model, fn, known, gammas, gen, callback, r.block, options, lambda d: denoiser_for(d, req)
        )
        return iter_block_loop(
            r.ids(B, 0),
            known,
            r.block,
            fill,
            lambda blk, s0, cache: commit_continuous(model, blk, s0, cache),
            window=r.window,
            disable_progress=not req.progress,
        )

    return batch


def _tagged(callback: Callback, k: int) -> Callback:
    def call(info: StepInfo) -> None:
        callback(StepInfo(**info, block=k))

    return call


def any_length_masked(
    model: TokenDiT, fn: SamplerFn, prompt: Tensor, N: int, *, steps: int, temperature: float, **loop: Any
) -> SampleResult:
    """MDLM's :func:`sample_any_length`: ``prompt`` (B, P) then [MASK] to ``N``, :func:`sample_blocks` with
    ``steps`` ancestral steps per block at ``temperature`` (``fn``, its one sampler, is that loop)."""
    x = torch.full((prompt.shape[0], N), int(model.n_out), dtype=torch.long, device=prompt.device)
    x[:, : prompt.shape[1]] = prompt
    return sample_blocks(model, x, time_grid(steps), temperature=temperature, **loop)


def any_length_continuous(
    model: RePlaid, fn: SamplerFn, prompt: Tensor, N: int, *, steps: int, temperature: float, **loop: Any
) -> SampleResult:
    """A continuous method's :func:`sample_any_length`: ``prompt`` (B, P) kept, the rest to ``N`` written by
    :func:`sample_blocks_continuous` with the sampler ``fn`` on ``steps`` levels per block (``temperature``
    is MDLM's; a continuous request's temperatures wrap its denoiser)."""
    B, P = prompt.shape
    ids = torch.zeros(B, N, dtype=torch.long, device=prompt.device)
    ids[:, :P] = prompt
    known = (torch.arange(N, device=prompt.device) < P).expand(B, N)  # (B, N)
    return sample_blocks_continuous(model, fn, ids, known, gamma_grid(model.schedule, steps), **loop)


# ------------------------------------------------------------------ any method, any length


@dataclass
class AnyLength:
    """What :func:`sample_any_length` wrote: ``tokens`` (B, n) the prompt then the generated ids, up to
    the last block written (whole blocks: the caller trims to ``prompt_len + max_tokens`` and at its
    stop); ``blocks`` (start position, ids (B, b)) of each block written, in order (the prompt's whole
    blocks are not written); ``nfe`` the network calls."""

    tokens: Tensor
    prompt_len: int
    nfe: int
    blocks: list[tuple[int, Tensor]] = field(default_factory=list)


def block_size_of(method: Method[Any]) -> int:
    """The block size of a run's method: its ``block`` (MDLM, RePlaid, Plaid), ``seq_len`` without blocks."""
    return int(getattr(method, "block", 0) or method.cfg.data.seq_len)


@torch.no_grad()
def sample_any_length(
    method: Method[Any],
    model: Any,
    prompt_ids: Tensor,
    max_tokens: int,
    stop: Stop | None = None,
    sampler: str | None = None,
    steps: int = 64,
    window: int | None = None,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    *,
    on_block: Callable[[int, Tensor], None] | None = None,
    use_cache: bool = True,
    temperature: float = 1.0,
) -> AnyLength:
    """Generate ``max_tokens`` ids after ``prompt_ids`` (B, P) long (P may be 0) with a run of MDLM,
    RePlaid or Plaid, block by block (module docstring): N = ``ceil((P + max_tokens) / b)`` whole blocks.
    A run without blocks is one block of ``seq_len`` (the whole-sequence sampler; P + max_tokens <= seq_len).

    ``sampler``: a registered name of the method (None: its default); ``steps``: each block's T;
    ``window``: the KV cache's committed rows (None: all; past ``seq_len`` pass at most ``seq_len - b``
    to stay inside the trained context); ``generator``: every draw's (a CPU generator is moved to the
    model's device as :func:`replaid.diffusion.rng.device_generator` does); ``callback``: each step's
    :class:`StepInfo` with ``block``; ``on_block(k, ids)``: each block as it is written (streaming);
    ``temperature``: MDLM's. Returns :class:`AnyLength`."""
    b = block_size_of(method)
    L = method.cfg.data.seq_len
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids[None]
    Bn, P = prompt_ids.shape
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    N = math.ceil((P + max_tokens) / b) * b
    if b >= L and N > L:
        raise ValueError(
            f"this {method.name} run has no blocks: it writes at most data.seq_len={L} tokens "
            f"(prompt {P} + max_tokens {max_tokens})"
        )
    dev = next(model.parameters()).device
    fn = get_sampler(method, sampler).fn
    written: list[tuple[int, Tensor]] = []

    def tell(k: int, ids: Tensor) -> None:
        written.append((k * b, ids.clone()))
        if on_block is not None:
            on_block(k, ids)

    write = strategy_of(method.kind).any_length
    if write is None:
        raise ValueError(f"a {method.name} run has no block sampler: sample it with 'replaid sample'")
    res = write(
        model,
        fn,
        prompt_ids.to(dev),
        N,
        steps=steps,
        temperature=temperature,
        generator=generator,
        callback=callback,
        block=b,
        use_cache=use_cache,
        window=window,
        stop=stop,
        on_block=tell,
    )
    return AnyLength(res.tokens, P, res.nfe, written)
