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
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.rng import device_generator
from replaid.model.dit import KVCache
from replaid.model.tokens import TokenDiT
from replaid.sampling.contract import Callback, SampleResult
from replaid.sampling.discrete import tempered_probs, unmask_step


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
    """Generate ``x`` (B, N) block by block (module docstring): [MASK] (id V) where to write, the prompt's
    tokens elsewhere (only in the first blocks); ``N`` a multiple of ``block``; ``ts`` (T + 1,) from 1 to 0,
    every block's grid. Returns the tokens up to the last block written (all rows stopped, or N) and
    the network calls (denoising calls plus one commit pass per block).

    ``callback`` gets ``{"i", "T", "t", "s", "z": (B, N) tokens so far (mask id V), "probs": (B, b, V),
    "block": k}`` after each step."""
    if block < 1 or x.shape[1] % block:
        raise ValueError(f"the length {x.shape[1]} must be a positive multiple of the block size {block}")
    if use_cache is False and window is not None:
        raise ValueError("a window is a property of the cache: use_cache=False sees the whole prefix")
    dev = x.device
    V = model.n_out
    B, N = x.shape
    steps = len(ts) - 1
    gen = device_generator(generator, dev)
    out = x.clone()
    cache = KVCache(window=window) if use_cache else None
    nfe, end = 0, 0
    for k in tqdm(range(N // block), disable=disable_progress, desc="blocks", leave=False):
        s0, e0 = k * block, (k + 1) * block
        z = out[:, s0:e0]
        if bool((z != V).all()):  # a block of the prompt: committed as it is (prefill)
            if cache is not None:
                _commit(model, z, s0, cache)
                nfe += 1
            end = e0
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
        end = e0
        if stop is not None and bool(stop(out[:, :end]).all()):
            break
    return SampleResult(out[:, :end], nfe)
