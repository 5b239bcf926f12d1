"""Block-by-block generation for block diffusion (issue 39 §2; BD3-LM's semi-autoregressive sampler).

A run trained with blocks of ``b`` tokens (``mdlm.block_size``) writes text of any length: block k is
denoised from all-[MASK] by MDLM's ancestral steps, attending to the committed clean blocks before it,
then committed by one clean forward pass whose keys and values go to a
:class:`~replaid.model.dit.KVCache`. The cache is exact: its keys are those the training pass computes
for the clean copy (clean rows attend block-causally), so cached and uncached generation draw the same
tokens (``use_cache=False`` recomputes the clean prefix at every step, the reference).

Past the training context a ``window`` keeps the last ``window`` committed rows: rotary scores depend
on position differences only, so positions keep counting and every query-key offset stays inside the
window, i.e. inside what the model was trained on; what falls out of the window is no longer seen.

A prompt fills the first positions: its whole blocks are committed first (prefill), and a block it
covers in part is denoised with the prompt's tokens kept. ``stop`` (rows' tokens so far -> (B,) bool)
ends generation once every row is done; the caller cuts each row at its stop.

:func:`iter_blocks` is the generator under it: it yields each block once committed (what a stream
prints as it comes, :mod:`replaid.sampling.stream`); :func:`sample_blocks` runs it to the end or the stop.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Iterator, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.rng import device_generator
from replaid.model.dit import KVCache
from replaid.model.tokens import TokenDiT
from replaid.sampling.continuous import time_grid
from replaid.sampling.contract import Callback, Committed, SampleResult
from replaid.sampling.discrete import tempered_probs, unmask_step
from replaid.sampling.request import SampleRequest


def _block_logits(
    model: TokenDiT, ids: Tensor, out: Tensor, start: int, block: int, cache: Optional[KVCache]
) -> Tensor:
    """Logits (B, b, V) of the noisy block ``ids`` (B, b) at positions ``start ..``: against the cache, or
    (no cache) against the clean prefix ``out[:, :start]`` recomputed as the training pass sees it."""
    B = ids.shape[0]
    c = model.conditioning(None, B, ids.device)
    if cache is not None:
        assert cache.next_pos == start  # blocks are committed in order: the cache's next positions are these
        h = model.backbone(model.input_states(ids), c, cache=cache)
    else:
        n = start + block
        h = torch.cat([model.input_states(out[:, :start]), model.input_states(ids)], dim=1)
        blk = torch.arange(n, device=ids.device) // block
        mask = blk[:, None] >= blk[None, :]  # clean prefix block-causal ...
        mask[start:, :] = True  # ... the noisy block sees the whole prefix and itself
        mask[:start, start:] = False
        h = model.backbone(h, c, mask=mask)[:, start:]  # positions 0 .. n-1
    return model.head(model.final.features(h, c))


def _commit(model: TokenDiT, ids: Tensor, start: int, cache: KVCache) -> None:
    """One clean pass over the finished block ``ids`` (B, b), its keys and values written to the cache."""
    assert cache.next_pos == start
    c = model.conditioning(None, ids.shape[0], ids.device)
    model.backbone(model.input_states(ids), c, cache=cache, commit=True)  # at the cache's next positions


@torch.no_grad()  # torch enters it around each step of a generator function
def iter_blocks(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: Optional[torch.Generator] = None,
    callback: Optional[Callback] = None,
    temperature: float = 1.0,
    block: int = 0,
    use_cache: bool = True,
    window: Optional[int] = None,
    disable_progress: bool = True,
) -> Generator[Committed, None, None]:
    """Generate ``x`` (B, N) block by block (module docstring), yielding each block once it is committed:
    a :class:`~replaid.sampling.contract.Committed` with its tokens (B, block), its start position and the
    network calls so far (denoising calls plus one commit pass per block). Blocks wholly of the prompt
    are prefilled and yielded too (``prompt`` True). Stopping early is closing the iterator."""
    if block < 1 or x.shape[1] % block:
        raise ValueError(f"the length {x.shape[1]} must be a positive multiple of the block size {block}")
    if use_cache is False and window is not None:
        raise ValueError("a window is a property of the cache: use_cache=False sees the whole prefix")
    dev = x.device
    V = model.n_out
    N = x.shape[1]
    steps = len(ts) - 1
    gen = device_generator(generator, dev)
    out = x.clone()
    cache = KVCache(window=window) if use_cache else None
    nfe = 0
    for k in tqdm(range(N // block), disable=disable_progress, desc="blocks", leave=False):
        s0, e0 = k * block, (k + 1) * block
        z = out[:, s0:e0]
        if bool((z != V).all()):  # a block of the prompt: committed as it is (prefill)
            if cache is not None:
                _commit(model, z, s0, cache)
                nfe += 1
            yield Committed(z, s0, nfe, prompt=True)
            continue
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
        if cache is not None:
            _commit(model, z, s0, cache)
            nfe += 1
        yield Committed(z, s0, nfe)


@torch.no_grad()
def sample_blocks(
    model: TokenDiT,
    x: Tensor,
    ts: Tensor,
    *,
    generator: Optional[torch.Generator] = None,
    callback: Optional[Callback] = None,
    temperature: float = 1.0,
    block: int = 0,
    use_cache: bool = True,
    window: Optional[int] = None,
    stop: Optional[Callable[[Tensor], Tensor]] = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Generate ``x`` (B, N) block by block (module docstring, :func:`iter_blocks`): [MASK] (id V) where to
    write, the prompt's tokens elsewhere (only in the first blocks); ``N`` a multiple of ``block``; ``ts``
    (T + 1,) from 1 to 0, every block's grid. Returns the tokens up to the last block written (all rows
    stopped, or N) and the network calls (denoising calls plus one commit pass per block).

    ``callback`` gets ``{"i", "T", "t", "s", "z": (B, N) tokens so far (mask id V), "probs": (B, b, V),
    "block": k}`` after each step."""
    out = x.clone()
    nfe, end = 0, 0
    blocks = iter_blocks(
        model,
        x,
        ts,
        generator=generator,
        callback=callback,
        temperature=temperature,
        block=block,
        use_cache=use_cache,
        window=window,
        disable_progress=disable_progress,
    )
    for c in blocks:
        end = c.start + c.tokens.shape[1]
        out[:, c.start : end] = c.tokens
        nfe = c.nfe
        if not c.prompt and stop is not None and bool(stop(out[:, :end]).all()):
            blocks.close()
            break
    return SampleResult(out[:, :end], nfe)


def start_masked_blocks(
    run: Any, req: SampleRequest, prompt: Tensor, length: int, callback: Optional[Callback]
) -> Callable[[int], Iterator[Committed]]:
    """MDLM with blocks as a :class:`~replaid.sampling.stream.BlockStarter`: ``batch(B)`` writes B rows of
    ``length`` tokens (rounded up to whole blocks), ``prompt`` (P,) first, with ``req.steps`` ancestral steps
    per block at ``req.temperature``; past the training length the cache keeps the last ``seq_len - block``
    committed rows (the longest prefix a block saw in training). The batches of one request draw in
    order from one generator seeded with ``req.seed``."""
    model = run.model
    block, L = run.method.block_size(), run.cfg.data.seq_len
    dev = next(model.parameters()).device
    V = int(model.n_out)
    N = -(-length // block) * block
    gen = torch.Generator().manual_seed(req.seed)
    ts = time_grid(req.steps)

    def batch(B: int) -> Iterator[Committed]:
        x = torch.full((B, N), V, dtype=torch.long, device=dev)
        x[:, : len(prompt)] = prompt.to(dev)
        return iter_blocks(
            model,
            x,
            ts,
            generator=gen,
            callback=callback,
            temperature=req.temperature,
            block=block,
            window=L - block,
            disable_progress=not req.progress,
        )

    return batch
