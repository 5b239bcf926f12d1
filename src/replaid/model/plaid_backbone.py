"""The original Plaid transformer (the paper's pre-alignment "Plaid" row), and a Plaid model with
the RePlaid denoiser interface.

As igul222/plaid ``lib/models.py`` (code followed where it differs from the paper):

* Blocks: pre-RMSNorm (learnable scale, epsilon 1e-5 as apex's ``FusedRMSNorm``), bias-free
  qkv / attention-out / MLP, rotary attention (bidirectional), each residual branch scaled by
  ``1/sqrt(n_blocks)``, no AdaLN: the time features enter only through the input projection ``in_t``.
* The MLP activation is the **tanh-approximate GELU**: Plaid's fused MLP
  (flash-attn ``FusedMLP``) defaults to ``gelu_approx``. The paper's alignment table lists the
  standard (erf) GELU for Plaid; we follow the code, which is what produced Plaid's numbers.
* PyTorch's default initialisation of every linear layer of the blocks and of the input
  projection ``in_z`` (Plaid sets none of them); ``in_sc``, ``in_t`` and the head start at zero.
* Output: a weight-only LayerNorm, then the muP readout multiplier ``base_width / width``
  (``mup.MuReadout`` with base width 256: ``x *= output_mult / width_mult()``) applied to the
  features before the zero-initialised linear head, in float32; plus the output prior logits as
  in RePlaid (not scaled by the multiplier, as in Plaid, where they are concatenated after it).

:class:`PlaidModel` subclasses :class:`~replaid.model.replaid.RePlaid` and only swaps the
backbone, so the schedule, embeddings, input projections, self-conditioning, ``param_groups()``,
the NELBO and the RePlaid samplers all apply unchanged. muP learning-rate scaling (paper's Plaid
0.1B optimiser table) is *not* applied here; it belongs in a preset.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from replaid.config import ModelConfig
from replaid.diffusion.denoiser import alpha_sigma, per_position
from replaid.model.dit import FinalLayer, KVCache, Rotary, SelfAttention, cached_sdpa, per_token, rope_for
from replaid.model.replaid import RePlaid, ScheduleOptions

MUP_BASE_WIDTH = 256  # Plaid's muP base shapes: the readout multiplier is MUP_BASE_WIDTH / hidden
RMS_EPS = 1e-5  # apex FusedRMSNorm's default


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class PlaidBlock(SelfAttention, nn.Module):
    """``x + s attn(RMSNorm(x))``, then ``x + s MLP(RMSNorm(x))`` with ``s = residual_scale``."""

    def __init__(
        self, hidden: int, n_heads: int, mlp_ratio: int = 4, dropout: float = 0.0, residual_scale: float = 1.0
    ):
        super().__init__()
        self.n_heads, self.dropout, self.residual_scale = n_heads, dropout, residual_scale
        self.norm1 = RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attn_out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = RMSNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, mlp_ratio * hidden, bias=False),
            nn.GELU(approximate="tanh"),
            nn.Linear(mlp_ratio * hidden, hidden, bias=False),
        )

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        commit: bool = False,
    ) -> Tensor:
        s = self.residual_scale
        a = self.attention(self.norm1(x), rope, mask, cache, layer, commit)
        x = x + s * F.dropout(a.float(), self.dropout, self.training)
        x = x + s * F.dropout(self.mlp(self.norm2(x)).float(), self.dropout, self.training)
        return x


class PlaidBackbone(nn.Module):
    def __init__(
        self,
        hidden: int,
        n_layers: int,
        n_heads: int,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        scale = 1.0 / math.sqrt(n_layers)
        self.blocks = nn.ModuleList(PlaidBlock(hidden, n_heads, mlp_ratio, dropout, scale) for _ in range(n_layers))
        self.rotary = Rotary(hidden // n_heads)
        self.activation_checkpointing = activation_checkpointing  # linears keep PyTorch's default init

    def forward(
        self,
        x: Tensor,
        c: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        commit: bool = False,
    ) -> Tensor:
        """x (B, L, D) -> (B, L, D); ``c`` is unused (no AdaLN). ``positions``, ``mask``, ``cache`` and
        ``commit`` as :meth:`replaid.model.dit.Backbone.forward` (block diffusion)."""
        L = x.shape[1]
        rope = rope_for(self.rotary, L, x.device, positions, cache)
        with cached_sdpa(x.device) if cache is not None else nullcontext():  # as Backbone.forward
            for i, blk in enumerate(self.blocks):
                if self.activation_checkpointing and self.training and cache is None:
                    x = checkpoint(blk, x, rope, mask, use_reentrant=False)
                else:
                    x = blk(x, rope, mask, cache, i, commit)
        if cache is not None and commit:
            cache.advance(L)
        return x


class PlaidModel(RePlaid):
    """Plaid: RePlaid's diffusion components around the original Plaid backbone (no AdaLN)."""

    def __init__(self, cfg: ModelConfig, dcfg: ScheduleOptions, vocab_size: int):
        super().__init__(cfg, dcfg, vocab_size)
        del self.cond  # no AdaLN conditioning: time enters through in_t only
        self.backbone = PlaidBackbone(  # type: ignore[assignment]  # a drop-in for Backbone: the same call
            cfg.hidden, cfg.n_layers, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, cfg.activation_checkpointing
        )
        self.final = FinalLayer(cfg.hidden, vocab_size, None)  # LayerNorm + zero-initialised head
        self.final.norm = nn.LayerNorm(cfg.hidden, bias=False)  # Plaid's LayerNorm has a weight only
        assert isinstance(self.in_z, nn.Linear)  # Plaid always projects up
        self.in_z.reset_parameters()  # Plaid's input_linear: PyTorch's default init
        self.readout_mult = MUP_BASE_WIDTH / cfg.hidden  # muP: output_mult / width_mult

    def input_states(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None) -> tuple[Tensor, None]:
        """``h_0`` (B, L, hidden) and no condition (time enters through ``in_t`` only); gamma (B,) or (B, L)."""
        alpha, sigma = alpha_sigma(gamma.double())
        scale = per_position(torch.rsqrt(alpha**2 / self.d_e + sigma**2).float())  # (B, 1, 1) or (B, L, 1)
        h = self.in_z(z.float() * scale) + per_token(self.in_t(self.time_features(gamma)))
        if e_sc is not None:
            h = h + self.in_sc(e_sc.float() * math.sqrt(self.d_e))
        return h, None

    def readout(self, h: Tensor, c: Tensor | None) -> Tensor:
        return self.final.features(h, None) * self.readout_mult

    def head_logits(self, feats: Tensor) -> Tensor:
        with torch.autocast(device_type=feats.device.type, enabled=False):
            out_: Tensor = self.final.linear(feats.float()).float()
            return out_

    def head_dtype(self, device: torch.device) -> torch.dtype:
        return torch.float32  # Plaid's head runs in float32

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """RePlaid's groups with the backbone split as the paper's Plaid table: ``backbone`` holds the
        attention QKV/out and MLP matrices, ``norms_head`` the RMSNorm scales, the output LayerNorm and
        the final linear layer's weight and bias."""
        groups = super().param_groups()
        norms_head = [m.weight for m in self.backbone.modules() if isinstance(m, RMSNorm)]
        norms_head += list(self.final.parameters())
        taken = {id(q) for q in norms_head}
        groups["backbone"] = [q for q in groups["backbone"] if id(q) not in taken]
        groups["norms_head"] = [q for q in norms_head if q.requires_grad]
        return groups
