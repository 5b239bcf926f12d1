"""DiT backbone aligned with MDLM's (paper appendix "Aligning Plaid ...", table 1).

LayerNorm, bidirectional (or causal) attention with rotary embeddings through PyTorch SDPA,
MLP with biases and GELU(tanh), AdaLN-Zero modulation with learnable gates on both residual
branches. The residual stream stays float32; under bf16 autocast the matmuls run in bf16.

Beyond one full sequence, :meth:`Backbone.forward` also takes explicit rotary
``positions``, a boolean attention ``mask`` (True = attend) and a :class:`KVCache`: block diffusion
trains on ``[x_t, x_0]`` under :func:`replaid.model.blocks.block_diffusion_mask` and samples block by
block against the cached keys of the committed blocks. The conditioning ``c`` may be per sequence
(B, cond) or per token (B, L, cond), so that every block carries its own noise level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from replaid.regions import ATTENTION, region


class Rotary(nn.Module):
    inv_freq: Tensor
    """Rotary position embedding tables (cos, sin) of shape (L, head_dim / 2)."""

    def __init__(self, head_dim: int, base: float = 10_000.0):
        super().__init__()
        inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self._cache: tuple[int, torch.device, Tensor, Tensor] | None = None

    def forward(self, L: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._cache is None or self._cache[0] != L or self._cache[1] != device:
            pos = torch.arange(L, device=device, dtype=torch.float32)
            f = torch.outer(pos, self.inv_freq.to(device))  # (L, hd/2)
            self._cache = (L, device, f.cos(), f.sin())
        return self._cache[2], self._cache[3]

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The (cos, sin) rows of the given positions (n,): (n, hd/2) each, computed as :meth:`forward`'s."""
        L = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = self(L, positions.device)
        return cos[positions], sin[positions]


def wide(t: Tensor) -> Tensor:
    """``t`` at float32 or wider: bf16/fp16 to float32 (as ``.float()``), float64 kept (a float64 reference)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, L, hd); rotate pairs (x1, x2) = halves of the head dim."""
    x1, x2 = wide(x).chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


def per_token(m: Tensor) -> Tensor:
    """A modulation (B, D) per sequence as (B, 1, D); one already per token (B, L, D) as it is."""
    return m[:, None] if m.dim() == 2 else m


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + per_token(scale)) + per_token(shift)


@dataclass
class KVCache:
    """The rotated keys and values of committed rows, one (k, v) pair of (B, H, n, hd) per block (layer),
    and the next absolute position. ``window``: keep only the last ``window`` committed rows (a sliding
    window; rotary scores depend only on position differences, so every query-key offset stays below
    the window and inside what the model was trained on; None keeps everything)."""

    window: int | None = None
    layers: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    next_pos: int = 0  # the absolute position of the next committed row (ragged: the largest row's, or more)
    # A ragged batch (continuous batching: rows that joined at different lengths), see :meth:`ragged`:
    rows: Tensor | None = None  # (B,) long: each row's own next position (None: next_pos for every row)
    valid: Tensor | None = None  # (B, n) bool: the slots that hold a key of their row (None: all)
    # What the last commit computed at its last row, per batch row, kept by its writer (AR: the next token's
    # logits (B, V)); it follows the rows as they join, leave and are viewed.
    head: Tensor | None = None

    @property
    def length(self) -> int:
        """Committed rows held (after the window's trim)."""
        return int(self.layers[0][0].shape[2]) if self.layers else 0

    def ragged(self, B: int, device: torch.device) -> KVCache:
        """This cache as a ragged batch of B rows, in place: each row's keys are right-aligned in the
        slots (its latest committed key last), the slots before its first key masked out (``valid``), and
        each row keeps its own rotary positions (``rows``): keys are cached already rotated, so rows of
        different lengths share the slots and every score is the one the row computes alone."""
        if self.rows is None:
            self.rows = torch.full((B,), self.next_pos, dtype=torch.long, device=device)
            self.valid = torch.ones(B, self.length, dtype=torch.bool, device=device)
        return self

    def join(self, other: KVCache) -> None:
        """Append the rows of ``other`` (ragged, as is this one) to the batch, right-aligned: the shorter
        side's slots are padded on the left with masked zeros."""
        assert self.rows is not None and self.valid is not None and other.rows is not None and other.valid is not None
        n, m = self.length, other.length
        layers = []
        for i in range(max(len(self.layers), len(other.layers))):
            like = (self.layers or other.layers)[i][0]
            mine = self._padded(self.keys(i), len(self.rows), n, max(n, m), like)
            theirs = self._padded(other.keys(i), len(other.rows), m, max(n, m), like)
            layers.append((torch.cat([mine[0], theirs[0]]), torch.cat([mine[1], theirs[1]])))
        self.layers = layers
        pad = self.valid.new_zeros(len(self.rows), max(m - n, 0))
        opad = other.valid.new_zeros(len(other.rows), max(n - m, 0))
        self.valid = torch.cat([torch.cat([pad, self.valid], 1), torch.cat([opad, other.valid], 1)])
        self.rows = torch.cat([self.rows, other.rows])
        self.next_pos = max(self.next_pos, other.next_pos)
        if other.head is not None:
            self.head = other.head if self.head is None else torch.cat([self.head, other.head])

    @staticmethod
    def _padded(kv: tuple[Tensor, Tensor] | None, B: int, n: int, to: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """(k, v) (B, H, n, hd) left-padded with zeros to ``to`` slots (none held: all zeros)."""
        H, hd = like.shape[1], like.shape[3]
        if kv is None:
            z = like.new_zeros(B, H, to, hd)
            return z, z
        if to == n:
            return kv
        z = like.new_zeros(B, H, to - n, hd)
        return torch.cat([z, kv[0]], 2), torch.cat([z, kv[1]], 2)

    def view(self, rows: Tensor) -> KVCache:
        """The batch rows ``rows`` (K,) long as a new cache to read (the tensors indexed, this one
        untouched): a pass of only those rows, e.g. the rows whose block changed."""
        return KVCache(
            window=self.window,
            layers=[(k[rows], v[rows]) for k, v in self.layers],
            next_pos=self.next_pos,
            rows=None if self.rows is None else self.rows[rows],
            valid=None if self.valid is None else self.valid[rows],
            head=None if self.head is None else self.head[rows],
        )

    def select(self, keep: Tensor) -> None:
        """Keep only the batch rows ``keep`` (K,) long (rows that finished leave), and drop the leading
        slots that no remaining row uses."""
        assert self.rows is not None and self.valid is not None
        self.rows, self.valid = self.rows[keep], self.valid[keep]
        self.head = None if self.head is None else self.head[keep]
        used = self.valid.any(0).nonzero()
        first = int(used[0]) if len(used) else self.valid.shape[1]
        self.valid = self.valid[:, first:]
        self.layers = [(k[keep][:, :, first:], v[keep][:, :, first:]) for k, v in self.layers]

    def advance(self, L: int) -> None:
        """After a commit of L rows: the next positions move on (a ragged batch's new slots valid, trimmed
        to the window as :meth:`put` trims the keys)."""
        self.next_pos += L
        if self.rows is not None and self.valid is not None:
            self.rows = self.rows + L
            valid = torch.cat([self.valid, self.valid.new_ones(len(self.rows), L)], 1)
            self.valid = valid[:, -self.window :] if self.window is not None else valid

    def key_mask(self, L: int, mask: Tensor | None) -> Tensor | None:
        """The attention mask of L new rows over [cached slots, the L rows]: ``mask`` (L, n + L) (None:
        all), a ragged batch's masked slots removed per row: (B, 1, L, n + L)."""
        if self.valid is None:
            return mask
        B, n = self.valid.shape
        new = self.valid.new_ones(B, L)
        m = torch.cat([self.valid, new], 1)[:, None, None, :].expand(B, 1, L, n + L)
        return m if mask is None else m & mask

    def keys(self, i: int) -> tuple[Tensor, Tensor] | None:
        return self.layers[i] if i < len(self.layers) else None

    def put(self, i: int, k: Tensor, v: Tensor) -> None:
        """Append block ``i``'s new (k, v) rows (B, H, n, hd), trimmed to the window."""
        old = self.keys(i)
        if old is not None:
            k, v = torch.cat([old[0], k], dim=2), torch.cat([old[1], v], dim=2)
        if self.window is not None and k.shape[2] > self.window:
            k, v = k[:, :, -self.window :], v[:, :, -self.window :]
        if i < len(self.layers):
            self.layers[i] = (k, v)
        else:
            self.layers.append((k, v))


# SDPA's cuDNN backend builds an execution plan for every new shape; a KV cache's key length changes at
# every commit (AR: every token), so each cached call paid one. Measured on an H100 (torch 2.11, owt-0.1b,
# batch 1): 40-100 ms per AR call on keys of a new length against 9-13 ms once the length had been seen or
# without cuDNN; block steps 19.5 -> 9.9 ms per NFE (docs/results/blocks/speed-gpu). Cached attention
# on CUDA therefore leaves cuDNN out; fixed-shape passes (training, the full sequence) keep every backend.
NOT_CUDNN: tuple[tuple[SDPBackend, Callable[[], bool]], ...] = (
    (SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled),
    (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled),
    (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled),
)


def cached_sdpa(device: torch.device) -> AbstractContextManager[Any]:
    """The SDPA backends for a pass over a KV cache on ``device``, entered once per pass by the backbones
    (not per layer: ~22 us each): on CUDA the ones the caller allows less cuDNN (its per-shape plans cost
    more than the step when the key length keeps changing; a caller who allows cuDNN alone keeps it);
    elsewhere unchanged."""
    if device.type != "cuda":
        return nullcontext()
    allowed = [backend for backend, enabled in NOT_CUDNN if enabled()]
    return sdpa_kernel(allowed) if allowed else nullcontext()


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rope: tuple[Tensor, Tensor],
    mask: Tensor | None = None,
    cache: KVCache | None = None,
    layer: int = 0,
    commit: bool = False,
    causal: bool = False,
) -> Tensor:
    """Rotary SDPA of q, k, v (B, H, L, hd), shared by every backbone (DiT's, Plaid's): with ``cache``, over
    [cached keys, these keys] (``commit`` appends these rotated keys and values to the cache); ``mask``
    (L, keys) bool, True = attend (None: all, or causal when ``causal`` and there is no cache)."""
    q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # (B, H, L, hd)
    if cache is not None:
        mask = cache.key_mask(q.shape[2], mask)  # a ragged batch: each row's own slots only
        old = cache.keys(layer)
        if commit:
            cache.put(layer, k, v)
        if old is not None:
            k, v = torch.cat([old[0], k], dim=2), torch.cat([old[1], v], dim=2)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # backends: the backbone's cached_sdpa
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def rope_for(
    rotary: Rotary, L: int, device: torch.device, positions: Tensor | None, cache: KVCache | None
) -> tuple[Tensor, Tensor]:
    """The rotary tables of L new rows: ``0..L-1``, the given ``positions`` (L,), or the cache's next
    positions (a slice of the tables, no host read; a ragged batch's: each row's own, (B, 1, L, hd/2))."""
    if positions is None and cache is None:
        out_: tuple[Tensor, Tensor] = rotary(L, device)
        return out_
    if positions is None and cache is not None and cache.rows is not None:  # every row's next <= next_pos
        cos, sin = rotary(cache.next_pos + L, device)
        pos = cache.rows[:, None] + torch.arange(L, device=device)  # (B, L)
        return cos[pos][:, None], sin[pos][:, None]  # (B, 1, L, hd/2)
    if positions is None:
        assert cache is not None
        cos, sin = rotary(cache.next_pos + L, device)
        return cos[cache.next_pos :], sin[cache.next_pos :]
    return rotary.at(positions)


class SelfAttention:
    """Rotary multi-head self-attention through a block's ``qkv`` and ``attn_out`` projections, shared by
    :class:`DiTBlock` and Plaid's block (a mixin: the projections stay the block's own parameters, so
    checkpoints keep their keys); ``causal`` blocks mask the future when no cache is given."""

    qkv: nn.Linear
    attn_out: nn.Linear
    n_heads: int
    causal: bool = False

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        commit: bool = False,
    ) -> Tensor:
        """Self-attention of x (B, L, D); with ``cache``, over [cached keys, x's keys] (``mask``: (L,
        cached + L) bool, True = attend; None = all, or causal for a causal block without a cache);
        ``commit`` appends x's rotated keys and values to the cache."""
        B, L, D = x.shape
        with region(ATTENTION):  # bf16 under autocast (precision table)
            q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
            y = attend(q, k, v, rope, mask, cache, layer, commit, self.causal)  # (B, H, L, hd)
            out_: Tensor = self.attn_out(y.transpose(1, 2).reshape(B, L, D))
        return out_


class DiTBlock(SelfAttention, nn.Module):
    """One pre-LN transformer block with AdaLN-Zero (identity at initialisation)."""

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        cond_dim: int | None,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        causal: bool = False,
    ):
        super().__init__()
        self.n_heads, self.causal, self.dropout = n_heads, causal, dropout
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attn_out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, mlp_ratio * hidden), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * hidden, hidden)
        )
        if cond_dim is not None:  # AdaLN-Zero: shift, scale, gate for attention and MLP
            self.adaLN: nn.Linear | None = nn.Linear(cond_dim, 6 * hidden)
            nn.init.zeros_(self.adaLN.weight)
            nn.init.zeros_(self.adaLN.bias)
        else:  # no conditioning (AR): zero-initialised learnable gates keep the block the identity
            self.adaLN = None
            self.gates = nn.Parameter(torch.zeros(2, hidden))

    def forward(
        self,
        x: Tensor,
        c: Tensor | None,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        commit: bool = False,
    ) -> Tensor:
        # x: (B, L, D) float32 residual stream; c: (B, cond_dim) or per token (B, L, cond_dim)
        kw: dict[str, Any] = {"mask": mask, "cache": cache, "layer": layer, "commit": commit}
        if self.adaLN is not None:
            sh1, sc1, g1, sh2, sc2, g2 = wide(self.adaLN(c)).chunk(6, dim=-1)
            h = modulate(self.norm1(x), sh1, sc1)
            x = x + per_token(g1) * F.dropout(wide(self.attention(h, rope, **kw)), self.dropout, self.training)
            h = modulate(self.norm2(x), sh2, sc2)
            x = x + per_token(g2) * F.dropout(wide(self.mlp(h)), self.dropout, self.training)
        else:
            a = self.attention(self.norm1(x), rope, **kw)
            x = x + self.gates[0] * F.dropout(wide(a), self.dropout, self.training)
            x = x + self.gates[1] * F.dropout(wide(self.mlp(self.norm2(x))), self.dropout, self.training)
        return x


class FinalLayer(nn.Module):
    """LayerNorm + AdaLN shift/scale + linear head; the head is zero-initialised."""

    def __init__(self, hidden: int, out_dim: int, cond_dim: int | None):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.linear = nn.Linear(hidden, out_dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.adaLN = nn.Linear(cond_dim, 2 * hidden) if cond_dim is not None else None
        if self.adaLN is not None:
            nn.init.zeros_(self.adaLN.weight)
            nn.init.zeros_(self.adaLN.bias)

    def features(self, x: Tensor, c: Tensor | None) -> Tensor:
        h = self.norm(x)
        if self.adaLN is not None:
            shift, scale = wide(self.adaLN(c)).chunk(2, dim=-1)
            h = modulate(h, shift, scale)  # c: (B, cond) or per token (B, L, cond)
        out_: Tensor = h
        return out_


class TimeEmbedding(nn.Module):
    """Sinusoidal features of gamma, ``[sin(f gamma), cos(f gamma)]``, ``f = exp(linspace(-5, 5, n/2))`` (Plaid)."""

    freqs: Tensor

    def __init__(self, n_features: int = 64):
        super().__init__()
        self.register_buffer(
            "freqs", torch.exp(torch.linspace(-5, 5, n_features // 2, dtype=torch.float64)), persistent=False
        )

    def forward(self, gamma: Tensor) -> Tensor:  # (B,) or per token (B, L) float64 -> (..., n) float32
        a = gamma.double()[..., None] * self.freqs
        return torch.cat([a.sin(), a.cos()], dim=-1).float()


class DiTTimestepFeatures(nn.Module):
    """The DiT ``TimestepEmbedder`` features (MDLM, Duo, LangFlow): ``[cos(x f), sin(x f)]`` with
    ``f_k = 10000^(-k / (n/2))``, in float64. ``of_t=True``: ``x = sigma = -log(1 - t) = -log(alpha_t)``
    for a discrete noise level ``t = 1 - alpha_t`` (MDLM/Duo); ``of_t=False``: ``x`` is the input itself
    (LangFlow feeds gamma)."""

    freqs: Tensor

    def __init__(self, n_features: int = 256, of_t: bool = True, max_period: float = 10_000.0):
        super().__init__()
        half = n_features // 2
        f = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
        self.register_buffer("freqs", f, persistent=False)
        self.of_t = of_t

    def forward(self, t: Tensor) -> Tensor:  # (B,) or per token (B, L) -> (..., n) float32
        x = -torch.log1p(-t.double()) if self.of_t else t.double()
        a = x[..., None] * self.freqs
        return torch.cat([a.cos(), a.sin()], dim=-1).float()


class Backbone(nn.Module):
    """Stack of DiT blocks on an input sequence of hidden vectors (the shared transformer)."""

    def __init__(
        self,
        hidden: int,
        n_layers: int,
        n_heads: int,
        cond_dim: int | None,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        causal: bool = False,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        self.blocks = nn.ModuleList(
            DiTBlock(hidden, n_heads, cond_dim, mlp_ratio, dropout, causal) for _ in range(n_layers)
        )
        self.rotary = Rotary(hidden // n_heads)
        self.activation_checkpointing = activation_checkpointing
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for blk in self.blocks:
            blk = cast(DiTBlock, blk)
            for lin in (blk.qkv, blk.attn_out, cast(nn.Linear, blk.mlp[0]), cast(nn.Linear, blk.mlp[2])):
                nn.init.normal_(lin.weight, std=0.02)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def forward(
        self,
        x: Tensor,
        c: Tensor | None,
        *,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        commit: bool = False,
    ) -> Tensor:
        """x (B, L, D) -> (B, L, D). ``positions`` (L,): each row's rotary position (default: ``0..L-1``,
        or the cache's next positions); ``mask`` (L, keys) bool, True = attend, keys = cached + L; with
        a ``cache`` and no mask every row sees every cached key and the new rows (causal blocks: the
        new rows up to their own); ``commit`` writes the rows' keys to the cache and advances it."""
        L = x.shape[1]
        rope = rope_for(self.rotary, L, x.device, positions, cache)
        if cache is not None and mask is None and self.blocks[0].causal and L > 1:
            n = cache.length
            mask = torch.ones(L, n + L, dtype=torch.bool, device=x.device).tril(diagonal=n)
        with cached_sdpa(x.device) if cache is not None else nullcontext():  # one policy for every layer
            for i, blk in enumerate(self.blocks):
                if self.activation_checkpointing and self.training and cache is None:
                    x = checkpoint(blk, x, c, rope, mask, use_reentrant=False)
                else:
                    x = blk(x, c, rope, mask, cache, i, commit)
        if cache is not None and commit:
            cache.advance(L)
        return x


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
