"""Learned monotone noise schedule ``gamma(t) = gamma_0 + (gamma_1 - gamma_0) gamma_tilde(t)``.

Paper section 2 ("Learnable noise schedule") and appendix "Learning Noise Schedule in VDMs".
The shape ``gamma_tilde`` is a monotone MLP evaluated in float64 and normalised so that
``gamma_tilde(0) = 0`` and ``gamma_tilde(1) = 1`` exactly; its derivative is exact (analytic).
The endpoints are learnable scalars. The variance-minimisation hook makes the shape follow the
gradient of E[L_diff^2] while the endpoints follow the gradient of the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The dtype every evaluation of the schedule runs in. Measured in tests/test_float64_pieces.py: float32 holds the
# SNR' weight gamma' e^-gamma to 3.3e-6 relative and the variance hook's gradient to 1.2e-5 (tolerance 1e-4), but the
# schedule's float64 outputs are an interface (samplers' grids, the precision audit's row, the tests that pin it),
# so it stays float64 (the table in docs/architecture.md, "Precision").
SCHEDULE_DTYPE = torch.float64


class MonotoneShape(nn.Module):
    """``g(t) = sum_j w2_j tanh(w1_j (t - 1/2) + b1_j)``, ``w1 = softplus(a)``, ``w2 = 0.01 softplus(c)``.

    ``gamma_tilde(t) = (g(t) - g(0)) / (g(1) - g(0))`` is strictly increasing with exact endpoints.
    Parameters are stored in float32; every evaluation is float64.
    """

    def __init__(self, hidden: int = 1024, seed: int | None = None):
        super().__init__()
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        self.a = nn.Parameter(torch.randn(hidden, generator=g))
        self.b = nn.Parameter(torch.randn(hidden, generator=g))
        self.c = nn.Parameter(torch.zeros(hidden))

    def _g(self, t: Tensor) -> tuple[Tensor, Tensor]:
        dt = SCHEDULE_DTYPE
        w1 = F.softplus(self.a.to(dt))
        w2 = 0.01 * F.softplus(self.c.to(dt))
        u = torch.tanh(w1 * (t.to(dt)[..., None] - 0.5) + self.b.to(dt))  # (..., H)
        g = (w2 * u).sum(-1)
        dg = (w2 * w1 * (1 - u * u)).sum(-1)
        return g, dg

    def forward(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Returns ``(gamma_tilde(t), gamma_tilde'(t))`` in float64, shapes of ``t``."""
        g, dg = self._g(t)
        ends, _ = self._g(torch.arange(2, dtype=SCHEDULE_DTYPE, device=t.device))  # t = 0, 1: no host copy
        span = ends[1] - ends[0]
        return (g - ends[0]) / span, dg / span


class LinearShape(nn.Module):
    """Fixed shape ``gamma_tilde(t) = t`` (ablation "without a learned schedule")."""

    def forward(self, t: Tensor) -> tuple[Tensor, Tensor]:
        t = t.to(SCHEDULE_DTYPE)
        return t, torch.ones_like(t)


class NoiseSchedule(nn.Module):
    """``gamma(t)`` with learnable endpoints; all outputs float64."""

    def __init__(
        self,
        gamma_0: float = -3.0,
        gamma_1: float = 6.0,
        shape: str = "learned",
        hidden: int = 1024,
        learn_endpoints: bool = True,
    ):
        super().__init__()
        self.shape = MonotoneShape(hidden) if shape == "learned" else LinearShape()
        # shape (1,), not scalars, so FSDP2 can shard them like every other parameter
        self.gamma_0 = nn.Parameter(torch.tensor([float(gamma_0)]), requires_grad=learn_endpoints)
        self.gamma_1 = nn.Parameter(torch.tensor([float(gamma_1)]), requires_grad=learn_endpoints)

    def endpoints(self) -> tuple[Tensor, Tensor]:
        """``(gamma_0, gamma_1)`` as float64 scalars."""
        return self.gamma_0.to(SCHEDULE_DTYPE).reshape(()), self.gamma_1.to(SCHEDULE_DTYPE).reshape(())

    def forward(
        self, t: Tensor, var_hook_weight: Tensor | None = None, detach_shape: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(gamma(t), gamma'(t))`` in float64.

        var_hook_weight: (B,) float64 tensor *filled in later* (before backward) with the detached
            per-row diffusion loss; the gradient reaching the shape outputs is multiplied by
            ``2 * weight`` (paper's code figure). Rows with weight 0 pass no gradient to the shape.
        detach_shape: (B,) bool, rows whose shape outputs are detached (recon and s.c. rows).
        """
        gt, dgt = self.shape(t)
        if detach_shape is not None and gt.requires_grad:
            keep = (~detach_shape).to(gt.dtype)
            gt = gt * keep + gt.detach() * (1 - keep)
            dgt = dgt * keep + dgt.detach() * (1 - keep)
        if var_hook_weight is not None and gt.requires_grad:
            gt.register_hook(lambda g: g * 2.0 * var_hook_weight.to(g.dtype))
            dgt.register_hook(lambda g: g * 2.0 * var_hook_weight.to(g.dtype))
        g0, g1 = self.endpoints()
        return g0 + (g1 - g0) * gt, (g1 - g0) * dgt

    @torch.no_grad()
    def gamma(self, t: Tensor) -> Tensor:
        return self.forward(t)[0]
