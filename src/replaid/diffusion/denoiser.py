"""The denoiser interface every sampler, likelihood estimator and loss sees.

A denoiser maps a noisy latent and its log-SNR-type noise level to a categorical prediction
of the clean tokens and the implied clean embedding (paper eq. (3) and section 2):

    logits, e_hat = denoiser(z_t, gamma, e_sc)

* ``z_t``   (B, L, d_e) float32 noisy latent, ``z_t = alpha e + sigma eps``.
* ``gamma`` (B,) float64, ``gamma = log(sigma^2 / alpha^2)``.
* ``e_sc``  (B, L, d_e) float32 self-conditioning input (the previous clean-embedding
  prediction) or ``None`` for "no self-conditioning input" (the same as zeros).
* ``logits`` (B, L, V) float32: ``x_hat = softmax(logits)``.
* ``e_hat``  (B, L, d_e) float32: ``x_hat @ E`` (categorical reparameterisation).

The wrapper hides the parameterisation (network, output prior logits, temperature) from the
samplers, in the spirit of k-diffusion's ``Denoiser`` wrappers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass
class DenoiserOutput:
    logits: Tensor  # (B, L, V) float32
    e_hat: Tensor  # (B, L, d_e) float32

    def __iter__(self) -> Iterator[Tensor]:  # allows ``logits, e_hat = out``
        yield self.logits
        yield self.e_hat


class Denoiser(Protocol):
    """Anything with an embedding matrix that maps (z_t, gamma, e_sc) to (logits, e_hat)."""

    @property
    def self_conditioning(self) -> bool:  # read only: a wrapper may pass on the inner denoiser's
        """Whether the model was trained to use a self-conditioning input."""

    def embedding_matrix(self) -> Tensor:  # (V, d_e), unit rows
        ...

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput: ...


# The dtype of the output prior's per-row scale ``alpha / sigma^2`` (:func:`prior_logits`). Measured in
# tests/test_float64_pieces.py: float32 holds it to 9.1e-7 relative over gamma in [-20, 20] (tolerance 1e-5; the
# logits are float32 either way), but it moves the samplers' recorded callback payloads
# (tests/test_sampler_identity.py, LangFlow's): kept float64, a (B,) scale that costs nothing.
PRIOR_SCALE_DTYPE = torch.float64


def alpha_sigma(gamma: Tensor) -> tuple[Tensor, Tensor]:
    """Variance-preserving ``alpha = sqrt(sigmoid(-gamma))``, ``sigma = sqrt(sigmoid(gamma))``."""
    return torch.sigmoid(-gamma).sqrt(), torch.sigmoid(gamma).sqrt()


def per_position(x: Tensor) -> Tensor:
    """A per-row quantity (B,) as (B, 1, 1), a per-token one (B, L) as (B, L, 1) (block diffusion: every
    block at its own noise level), to scale (B, L, d) tensors."""
    return x.view(-1, 1, 1) if x.dim() <= 1 else x[..., None]


def prior_logits(z: Tensor, gamma: Tensor, E: Tensor, row_norms: bool = False) -> Tensor:
    """Output prior logits ``(alpha / sigma^2) z E^T`` in float32 (section 2, "output prior logits").

    With unit-norm rows this is ``log N(z; alpha e_v, sigma^2 I)`` up to a constant shared by
    all tokens v, i.e. the exact posterior logits under a uniform token prior. ``row_norms=True``
    (rows of any length) adds ``-alpha^2 ||e_v||^2 / (2 sigma^2)``, which keeps that identity.
    z: (B, L, d_e); gamma: (B,) or per token (B, L); E: (V, d_e). Returns (B, L, V) float32.
    """
    alpha, sigma = alpha_sigma(gamma.to(PRIOR_SCALE_DTYPE))
    scale = per_position((alpha / sigma**2).float())  # (B, 1, 1) or (B, L, 1)
    out = scale * (z.float() @ E.float().t())
    if row_norms:
        half = per_position((0.5 * alpha**2 / sigma**2).float())  # (B, 1, 1) or (B, L, 1)
        out = out - half * (E.float() ** 2).sum(-1)  # (B, L, V)
    return out
