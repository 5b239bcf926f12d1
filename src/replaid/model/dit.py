"""DiT backbone aligned with MDLM's (paper appendix "Aligning Plaid ...", table 1).

LayerNorm, bidirectional (or causal) attention with rotary embeddings through PyTorch SDPA,
MLP with biases and GELU(tanh), AdaLN-Zero modulation with learnable gates on both residual
branches. The residual stream stays float32; under bf16 autocast the matmuls run in bf16.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class Rotary(nn.Module):
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


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, L, hd); rotate pairs (x1, x2) = halves of the head dim."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """One pre-LN transformer block with AdaLN-Zero (identity at initialisation)."""

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        cond_dim: Optional[int],
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
            self.adaLN = nn.Linear(cond_dim, 6 * hidden)
            nn.init.zeros_(self.adaLN.weight)
            nn.init.zeros_(self.adaLN.bias)
        else:  # no conditioning (AR): zero-initialised learnable gates keep the block the identity
            self.adaLN = None
            self.gates = nn.Parameter(torch.zeros(2, hidden))

    def attention(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # (B, H, L, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.attn_out(y.transpose(1, 2).reshape(B, L, D))

    def forward(self, x: Tensor, c: Optional[Tensor], rope: tuple[Tensor, Tensor]) -> Tensor:
        # x: (B, L, D) float32 residual stream; c: (B, cond_dim)
        if self.adaLN is not None:
            sh1, sc1, g1, sh2, sc2, g2 = self.adaLN(c).float().chunk(6, dim=-1)
            h = modulate(self.norm1(x), sh1, sc1)
            x = x + g1[:, None] * F.dropout(self.attention(h, rope).float(), self.dropout, self.training)
            h = modulate(self.norm2(x), sh2, sc2)
            x = x + g2[:, None] * F.dropout(self.mlp(h).float(), self.dropout, self.training)
        else:
            x = x + self.gates[0] * F.dropout(self.attention(self.norm1(x), rope).float(), self.dropout, self.training)
            x = x + self.gates[1] * F.dropout(self.mlp(self.norm2(x)).float(), self.dropout, self.training)
        return x


class FinalLayer(nn.Module):
    """LayerNorm + AdaLN shift/scale + linear head; the head is zero-initialised."""

    def __init__(self, hidden: int, out_dim: int, cond_dim: Optional[int]):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.linear = nn.Linear(hidden, out_dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.adaLN = nn.Linear(cond_dim, 2 * hidden) if cond_dim is not None else None
        if self.adaLN is not None:
            nn.init.zeros_(self.adaLN.weight)
            nn.init.zeros_(self.adaLN.bias)

    def features(self, x: Tensor, c: Optional[Tensor]) -> Tensor:
        h = self.norm(x)
        if self.adaLN is not None:
            shift, scale = self.adaLN(c).float().chunk(2, dim=-1)
            h = modulate(h, shift, scale)
        return h


class TimeEmbedding(nn.Module):
    """Sinusoidal features of gamma, ``[sin(f gamma), cos(f gamma)]``, ``f = exp(linspace(-5, 5, n/2))`` (Plaid)."""

    def __init__(self, n_features: int = 64):
        super().__init__()
        self.register_buffer(
            "freqs", torch.exp(torch.linspace(-5, 5, n_features // 2, dtype=torch.float64)), persistent=False
        )

    def forward(self, gamma: Tensor) -> Tensor:  # (B,) float64 -> (B, n) float32
        a = gamma.double()[:, None] * self.freqs
        return torch.cat([a.sin(), a.cos()], dim=-1).float()


class DiTTimestepFeatures(nn.Module):
    """The DiT ``TimestepEmbedder`` features (MDLM, Duo, LangFlow): ``[cos(x f), sin(x f)]`` with
    ``f_k = 10000^(-k / (n/2))``, in float64. ``of_t=True``: ``x = sigma = -log(1 - t) = -log(alpha_t)``
    for a discrete noise level ``t = 1 - alpha_t`` (MDLM/Duo); ``of_t=False``: ``x`` is the input itself
    (LangFlow feeds gamma)."""

    def __init__(self, n_features: int = 256, of_t: bool = True, max_period: float = 10_000.0):
        super().__init__()
        half = n_features // 2
        f = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
        self.register_buffer("freqs", f, persistent=False)
        self.of_t = of_t

    def forward(self, t: Tensor) -> Tensor:  # (B,) -> (B, n) float32
        x = -torch.log1p(-t.double()) if self.of_t else t.double()
        a = x[:, None] * self.freqs
        return torch.cat([a.cos(), a.sin()], dim=-1).float()


class Backbone(nn.Module):
    """Stack of DiT blocks on an input sequence of hidden vectors (the shared transformer)."""

    def __init__(
        self,
        hidden: int,
        n_layers: int,
        n_heads: int,
        cond_dim: Optional[int],
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
            for lin in (blk.qkv, blk.attn_out, blk.mlp[0], blk.mlp[2]):
                nn.init.normal_(lin.weight, std=0.02)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor, c: Optional[Tensor]) -> Tensor:
        rope = self.rotary(x.shape[1], x.device)
        for blk in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(blk, x, c, rope, use_reentrant=False)
            else:
                x = blk(x, c, rope)
        return x


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
