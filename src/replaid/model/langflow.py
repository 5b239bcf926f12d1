"""LangFlow's denoiser on replaid's DiT blocks (for converted official checkpoints).

LangFlow (nealchen2003/LangFlow, ``langflow/model.py``) is an embedding-space VP diffusion model
like RePlaid, but its network differs from :class:`replaid.model.replaid.RePlaid` in ways no
RePlaid option covers, so it is its own :class:`~replaid.diffusion.denoiser.Denoiser`:

    E      = sqrt(D) * rows of W normalised        (V, D), D = hidden (RePlaid: unit rows, d_e = 16)
    h_0    = z + W_sc [z ; e_sc]                    no input scaling, no input projection of z, no time
                                                    added at the input (RePlaid: W_z z/sqrt(a^2/d_e+s^2)
                                                    + W_sc sqrt(d_e) e_sc + W_t feat(gamma))
    c      = silu(MLP(DiT features of gamma))       256 cos|sin features, 10000^(-k/128) (RePlaid: Plaid's
                                                    64 sin|cos features, exp(linspace(-5, 5)))
    h      = DiT(h_0; AdaLN-Zero(c))                identical blocks (LayerNorm without bias -> bias 0)
    logits = head(h) + (alpha / sigma^2) z E^T      LangFlow's c_skip = exp((softplus(-g) - g)/2) = alpha/sigma^2
    e_hat  = softmax(logits) E

Noise schedule: LangFlow's Gumbel proposal, ``gamma(t) = loc - scale log(-log t)`` clamped to
``[gamma_min, gamma_max]`` with ``gamma_min = loc - scale log(-log c)``, ``gamma_max = loc - scale log c``
(``c`` = cutoff); only its endpoints enter the ODE likelihood (integrated in gamma).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from replaid.diffusion.denoiser import DenoiserOutput, prior_logits
from replaid.model.dit import Backbone, DiTTimestepFeatures, FinalLayer


class GumbelSchedule(nn.Module):
    """LangFlow's ``GumbelProposal`` as a schedule ``t -> (gamma(t), gamma'(t))`` in float64."""

    def __init__(self, loc: float, scale: float, cutoff: float):
        super().__init__()
        self.loc, self.scale, self.cutoff = float(loc), float(scale), float(cutoff)

    def endpoints(self) -> tuple[float, float]:
        c = self.cutoff
        return self.loc - self.scale * math.log(-math.log(c)), self.loc - self.scale * math.log(c)

    def forward(self, t: Tensor) -> tuple[Tensor, Tensor]:
        g_min, g_max = self.endpoints()
        t = t.double().clamp(1e-300, 1 - 1e-16)
        g = self.loc - self.scale * torch.log(-torch.log(t))
        dg = self.scale / (t * -torch.log(t))
        inside = (g > g_min) & (g < g_max)
        return g.clamp(g_min, g_max), torch.where(inside, dg, torch.zeros_like(dg))


class LangFlowDenoiser(nn.Module):
    """``(z, gamma, e_sc) -> (logits, e_hat)`` with LangFlow's parameterisation (module docstring)."""

    def __init__(
        self,
        vocab_size: int,
        hidden: int,
        n_layers: int,
        n_heads: int,
        cond_dim: int,
        self_conditioning: bool = True,
        loc: float = 4.723,
        scale: float = 0.852,
        cutoff: float = 1e-5,
    ):
        super().__init__()
        self.vocab_size, self.hidden, self.self_conditioning = vocab_size, hidden, self_conditioning
        self.weight = nn.Parameter(torch.randn(vocab_size, hidden))
        self.sc_proj = nn.Linear(2 * hidden, hidden, bias=False) if self_conditioning else None
        self.time_features = DiTTimestepFeatures(256, of_t=False)
        self.cond = nn.Sequential(nn.Linear(256, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim), nn.SiLU())
        self.backbone = Backbone(hidden, n_layers, n_heads, cond_dim, 4, 0.0, causal=False)
        self.final = FinalLayer(hidden, vocab_size, cond_dim)
        self.schedule = GumbelSchedule(loc, scale, cutoff)

    def embedding_matrix(self) -> Tensor:  # (V, D) float32, rows of norm sqrt(D)
        return F.normalize(self.weight.float(), dim=-1) * math.sqrt(self.hidden)

    def forward(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        # z: (B, L, D); gamma: (B,); e_sc: (B, L, D) or None (= zeros, as LangFlow)
        x = z.float()
        if self.sc_proj is not None:
            x = x + self.sc_proj(torch.cat([x, torch.zeros_like(x) if e_sc is None else e_sc.float()], -1))
        c = self.cond(self.time_features(gamma.reshape(-1).expand(z.shape[0])))
        h = self.backbone(x, c)
        E = self.embedding_matrix()
        logits = self.final.linear(self.final.features(h, c)).float() + prior_logits(z, gamma, E)
        return DenoiserOutput(logits, torch.softmax(logits, -1) @ E)
