"""Closed-form Bayes-optimal denoiser for i.i.d. tokens (the project's key test oracle).

If every position holds an i.i.d. token ``x ~ p`` (a known distribution over V tokens) and
the embeddings ``E`` (V, d_e) are fixed, the posterior of a position given its latent is

    q(x = v | z) ∝ p_v N(z; alpha e_v, sigma^2 I)
                 ∝ exp(log p_v + (alpha / sigma^2) z·e_v - alpha^2 ||e_v||^2 / (2 sigma^2))

(paper Definition "Bayes-optimal denoiser"). Positions are independent, so the per-position
posterior is the exact Bayes-optimal ``x_theta`` and ``e_hat = E[e | z]``. With unit rows the
last term is a constant and the logits are ``log p`` plus the output prior logits.

The exact data log-likelihood is ``sum_l log p(x_l)`` and the entropy per token ``H(p)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from replaid.diffusion.denoiser import DenoiserOutput, alpha_sigma


class OracleDenoiser:
    """Bayes-optimal denoiser for i.i.d. tokens from ``p`` with embeddings ``E``."""

    self_conditioning = False

    def __init__(self, p: Tensor, E: Tensor):
        assert p.ndim == 1 and E.ndim == 2 and p.shape[0] == E.shape[0]
        self.p = p.double() / p.double().sum()  # (V,)
        self.E = E.double()  # (V, d_e)
        self.nfe = 0

    def to(self, device: torch.device | str) -> OracleDenoiser:
        """The same oracle with ``p`` and ``E`` on ``device`` (its computations run there)."""
        o = OracleDenoiser.__new__(OracleDenoiser)  # p as it is (no second normalisation)
        o.p, o.E, o.nfe = self.p.to(device), self.E.to(device), 0
        return o

    def embedding_matrix(self) -> Tensor:
        return self.E.float()

    @property
    def vocab_size(self) -> int:
        return self.p.shape[0]

    def logits64(self, z: Tensor, gamma: Tensor) -> Tensor:
        """Exact posterior logits in float64. z: (B, L, d_e); gamma: (B,). Returns (B, L, V)."""
        alpha, sigma = alpha_sigma(gamma.double())
        a = alpha.view(-1, 1, 1)
        s2 = (sigma**2).view(-1, 1, 1)
        sq = (self.E**2).sum(-1)  # (V,)
        return self.p.log() + (a / s2) * (z.double() @ self.E.t()) - (a**2 / (2 * s2)) * sq

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        self.nfe += 1
        logits = self.logits64(z, gamma)
        e_hat = torch.softmax(logits, -1) @ self.E
        return DenoiserOutput(logits.float(), e_hat.float())

    def entropy(self) -> float:
        """H(p) in nats: the exact NLL per token."""
        return float(-(self.p * self.p.log()).sum())

    def sample_tokens(self, shape: tuple[int, ...], generator: torch.Generator | None = None) -> Tensor:
        """i.i.d. tokens from ``p``, drawn with the (CPU) ``generator`` on the host, so every device gets
        the same tokens for a seed; returned on ``p``'s device."""
        idx = torch.multinomial(
            self.p.float().cpu(), int(torch.tensor(shape).prod()), replacement=True, generator=generator
        )
        return idx.view(*shape).to(self.p.device)


def random_unit_embeddings(V: int, d_e: int, seed: int = 0) -> Tensor:
    """(V, d_e) float64 embeddings with unit rows, drawn from a seeded Gaussian."""
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(V, d_e, generator=g, dtype=torch.float64)
    unit: Tensor = E / E.norm(dim=-1, keepdim=True)
    return unit
