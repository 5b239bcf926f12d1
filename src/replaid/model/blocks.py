"""Block diffusion's attention layout (BD3-LM, Arriola et al. 2025, section 3.2).

A sequence of ``L`` tokens is cut into ``L / b`` blocks of ``b`` tokens. Training runs the noisy
sequence ``x_t`` and the clean ``x_0`` side by side as one input of ``2L`` rows, ``[x_t, x_0]``,
under one boolean mask (True = attend), the union of BD3-LM's three:

* block diagonal: a noisy row sees the noisy rows of its own block;
* offset block-causal: a noisy row sees the clean rows of the blocks before its own;
* block-causal: a clean row sees the clean rows of its own block and of those before.

Clean rows never see noisy ones, so the clean half computes exactly what the sampler's KV cache
holds for committed blocks, and each noisy block's output equals a pass over its clean prefix and
itself alone. Both halves take rotary positions ``0 .. L-1`` (:func:`pair_positions`), as in
BD3-LM's reference code, which applies the rotary tables of ``x[:, :L]`` to both halves.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_block_size(L: int, block: int) -> None:
    """A block size must divide the sequence length."""
    if block < 1 or L % block:
        raise ValueError(f"block size {block} must be a positive divisor of the sequence length {L}")


def block_ids(L: int, block: int, device: torch.device | None = None) -> Tensor:
    """(L,) the block of each position: ``i // block``."""
    check_block_size(L, block)
    return torch.arange(L, device=device) // block


def block_diffusion_mask(L: int, block: int, device: torch.device | None = None) -> Tensor:
    """(2L, 2L) bool over ``[x_t, x_0]`` (module docstring): True where row i may attend to row j."""
    b = block_ids(L, block, device)
    bq, bk = b[:, None], b[None, :]
    noisy_noisy = bq == bk  # block diagonal
    noisy_clean = bq > bk  # offset block-causal
    clean_clean = bq >= bk  # block-causal
    clean_noisy = torch.zeros(L, L, dtype=torch.bool, device=device)
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)
    bottom = torch.cat([clean_noisy, clean_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


def pair_positions(L: int, device: torch.device | None = None) -> Tensor:
    """(2L,) rotary positions of ``[x_t, x_0]``: ``0 .. L-1`` twice."""
    p = torch.arange(L, device=device)
    return torch.cat([p, p])


def prefix_block_mask(start: int, block: int, device: torch.device | None = None) -> Tensor:
    """(n, n) bool, ``n = start + block``: a clean prefix of ``start`` rows then one noisy block, as the
    training mask lets them see each other (True = attend): the prefix block-causally among itself,
    the noisy block the whole prefix and itself. The uncached reference of the block samplers."""
    n = start + block
    b = torch.arange(n, device=device) // block
    mask = b[:, None] >= b[None, :]  # clean prefix block-causal ...
    mask[start:, :] = True  # ... the noisy block sees the whole prefix and itself
    mask[:start, start:] = False
    return mask
