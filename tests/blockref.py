"""The reference block loop the product's one loop is tested against (not the product's code path).

The generation loop of :mod:`replaid.sampling.loop` (a :class:`~replaid.sampling.batching.BlockBatch` of one
lane, each block written by its kind's :class:`~replaid.sampling.strategy.Kernel`) is checked against this
independent loop: its own per-kind block writers (MDLM's ancestral unmasking, a continuous sampler over a
:class:`~replaid.sampling.blocks.BlockDenoiser`), committed block by block to a KV cache, or, with
``use_cache=False``, with the clean prefix recomputed at every network call as the training pass sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.denoiser import Denoiser
from replaid.diffusion.rng import device_generator
from replaid.model.blocks import prefix_block_mask
from replaid.model.dit import KVCache
from replaid.model.tokens import TokenDiT
from replaid.sampling.blocks import BlockDenoiser, Stop, cached_logits, commit_continuous, commit_masked
from replaid.sampling.continuous import Inpaint, gamma_grid, time_grid
from replaid.sampling.contract import Callback, Committed, SampleResult, SamplerFn, StepInfo
from replaid.sampling.discrete import tempered_probs, unmask_step
from replaid.sampling.registry import get_sampler

if TYPE_CHECKING:
    from replaid.model.replaid import RePlaid

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


def block_logits(model: TokenDiT, ids: Tensor, out: Tensor, start: int, block: int, cache: KVCache | None) -> Tensor:
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


def masked_fill(
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
                probs = tempered_probs(block_logits(model, z, out, s0, block, cache), temperature)  # (B, b, V)
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
    fill = masked_fill(model, ts, device_generator(generator, x.device), temperature, block, callback)
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


def continuous_fill(
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
        cb = None if callback is None else tagged(callback, k)
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
    fill = continuous_fill(model, sampler, known, gammas, gen, callback, block, dict(options or {}), None)
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


def tagged(callback: Callback, k: int) -> Callback:
    def call(info: StepInfo) -> None:
        callback(StepInfo(**info, block=k))

    return call


def any_length(
    method: Any,
    model: Any,
    prompt: Tensor,
    max_tokens: int,
    *,
    sampler: str | None = None,
    steps: int = 64,
    generator: torch.Generator | None = None,
    window: int | None = None,
    use_cache: bool = True,
    temperature: float = 1.0,
    callback: Callback | None = None,
) -> SampleResult:
    """The reference of :func:`replaid.sampling.loop.sample_any_length` for MDLM and continuous block runs:
    ``prompt`` (B, P), then whole blocks to cover ``max_tokens``."""
    b = int(getattr(method, "block", 0) or method.cfg.data.seq_len)
    B, P = prompt.shape
    N = -(-(P + max_tokens) // b) * b
    known = (torch.arange(N) < P).expand(B, N)
    if method.kind.continuous:
        ids = torch.zeros(B, N, dtype=torch.long)
        ids[:, :P] = prompt
        fn = get_sampler(method, sampler).fn
        return sample_blocks_continuous(
            model, fn, ids, known, gamma_grid(model.schedule, steps), generator=generator, callback=callback,
            block=b, use_cache=use_cache, window=window,
        )  # fmt: skip
    x = torch.full((B, N), int(model.n_out), dtype=torch.long)
    x[:, :P] = prompt
    return sample_blocks(
        model, x, time_grid(steps), generator=generator, callback=callback, temperature=temperature, block=b,
        use_cache=use_cache, window=window,
    )  # fmt: skip
