"""The VDM NELBO of paper eq. (4): prior KL + reconstruction CE + continuous-time diffusion loss.

All terms are *per token* (sequence sums divided by the number of positions) and aggregated in
float64 (precision table). Functions take any :class:`~replaid.denoiser.Denoiser` and a schedule
callable ``t -> (gamma(t), gamma'(t))``, so the closed-form oracle plugs into the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.diffusion.denoiser import Denoiser, alpha_sigma, per_position
from replaid.regions import AGGREGATION, ELEMENT_LOSS, region

# The dtype of each piece, measured against a float64 reference in tests/test_float64_pieces.py (tolerances and
# verdicts there and in docs/architecture.md, "Precision"):
# * NOISE_DTYPE, ``z_t = alpha e + sigma eps``: float32 holds (z to 2 float32 ulps, the per-token NELBO to 1e-7
#   relative): moved from float64 (the (B, L, d_e) mix was the loss's one wide float64 tensor);
# * PRIOR_DTYPE, the prior KL: float32 loses 2.8e-4 relative of the term and of its gamma_1 gradient at
#   gamma_1 = 6 (d_e = 16; 3e-2 at gamma_1 = 10, d_e = 64), ``sigma_1^2 - 1 - log sigma_1^2`` cancelling: kept float64;
# * LOSS_DTYPE, the SNR' weighting and the aggregation: float32 holds (2e-7 relative), kept float64 (the
#   per-row bounds are float64 to their callers and the precision audit's row).
NOISE_DTYPE = torch.float32
PRIOR_DTYPE = torch.float64
LOSS_DTYPE = torch.float64

ScheduleFn = Callable[[Tensor], tuple[Tensor, Tensor]]
Predict = Callable[[Tensor, Tensor], Iterable[Tensor]]  # (z, gamma) -> a DenoiserOutput or a (logits, e_hat) pair


def forward_noise(e: Tensor, gamma: Tensor, eps: Tensor) -> Tensor:
    """``z_t = alpha_t e + sigma_t eps`` (eq. 1). e, eps: (B, L, d_e); gamma: (B,) or per token (B, L)."""
    alpha, sigma = alpha_sigma(gamma.to(NOISE_DTYPE))
    return (per_position(alpha) * e.to(NOISE_DTYPE) + per_position(sigma) * eps.to(NOISE_DTYPE)).float()


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean over positions (dim 1) of x (B, L), counting only ``mask`` positions. float64."""
    with region(AGGREGATION):
        x = x.to(LOSS_DTYPE)
        if mask is None:
            return x.mean(1)
        m = mask.to(LOSS_DTYPE)
        return (x * m).sum(1) / m.sum(1).clamp_min(1)


def prior_kl(e: Tensor, gamma_1: Tensor, mask: Tensor | None = None) -> Tensor:
    """``KL(q(z_1|x) || N(0, I))`` per token (appendix "Derivation ..."), per row (B,) float64:
    ``1/2 [d_e (sigma_1^2 - 1 - log sigma_1^2) + alpha_1^2 ||e||^2]``."""
    return masked_mean(prior_terms(e, gamma_1), mask)


def prior_terms(e: Tensor, gamma_1: Tensor) -> Tensor:
    """:func:`prior_kl` per position (B, L) float64."""
    d_e = e.shape[-1]
    with region(ELEMENT_LOSS):  # float64: the schedule's endpoint enters it
        g1 = gamma_1.to(PRIOR_DTYPE).reshape(-1, 1)  # (B, 1) or (1, 1)
        s1, a1 = torch.sigmoid(g1), torch.sigmoid(-g1)
        return 0.5 * (d_e * (s1 - 1 - F.logsigmoid(g1)) + a1 * (e.to(PRIOR_DTYPE) ** 2).sum(-1))  # (B, L)


def recon_nll(logits: Tensor, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
    """``-(1/L) sum_l log x_hat^l[x^l]`` per row (B,), cross-entropy in float32, mean in float64."""
    B, L, V = logits.shape
    with region(ELEMENT_LOSS):
        ce = F.cross_entropy(logits.float().reshape(B * L, V), tokens.reshape(B * L), reduction="none")
    return masked_mean(ce.view(B, L), mask)


def diffusion_loss(e_hat: Tensor, e: Tensor, gamma: Tensor, dgamma: Tensor, mask: Tensor | None = None) -> Tensor:
    """``-1/2 SNR'(t) (1/L) sum_l ||e_hat - e||^2`` per row (B,) float64, ``SNR' = -gamma' e^{-gamma}``."""
    with region(ELEMENT_LOSS):  # float32
        sq = ((e_hat.float() - e.float()) ** 2).sum(-1)  # (B, L)
    mse = masked_mean(sq, mask)  # (B,)
    with region(AGGREGATION):  # the SNR' weighting: float64
        return 0.5 * dgamma.to(LOSS_DTYPE) * torch.exp(-gamma.to(LOSS_DTYPE)) * mse


def diffusion_terms(e_hat: Tensor, e: Tensor, gamma: Tensor, dgamma: Tensor) -> Tensor:
    """:func:`diffusion_loss` per position (B, L) float64, ``-1/2 SNR'(t_l) ||e_hat_l - e_l||^2``, with
    per-token gamma, gamma' (B, L) (block diffusion: each block at its own time)."""
    with region(ELEMENT_LOSS):  # float32
        sq = ((e_hat.float() - e.float()) ** 2).sum(-1)  # (B, L)
    with region(AGGREGATION):  # the SNR' weighting: float64
        return 0.5 * dgamma.to(LOSS_DTYPE) * torch.exp(-gamma.to(LOSS_DTYPE)) * sq.to(LOSS_DTYPE)


def block_shares(x: Tensor, block: int, mask: Tensor | None = None) -> Tensor:
    """Per-position terms x (B, L) as each block's share (B, L / block) of their :func:`masked_mean`:
    the block's sum over its (``mask``) positions divided by the row's count, so the shares of a row
    sum to its per-token mean."""
    B, L = x.shape
    x = x.to(LOSS_DTYPE)
    if mask is None:
        return x.view(B, L // block, block).sum(-1) / L
    m = mask.to(LOSS_DTYPE)
    return (x * m).view(B, L // block, block).sum(-1) / m.sum(1, keepdim=True).clamp_min(1)


def low_discrepancy(
    n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None, u: float | None = None
) -> Tensor:
    """``t_i = (i + u) / n`` with one shared ``u ~ U[0, 1)`` (float64, shape (n,))."""
    if u is None:
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return (torch.arange(n, dtype=torch.float64, device=device) + u) / n


def stratified_time_average(
    fn: Callable[[Tensor], Tensor],
    B: int,
    K: int,
    generator: torch.Generator | None,
    lo: float = 0.0,
    hi: float = 1.0,
    device: torch.device | str | None = None,
) -> Tensor:
    """``(1/K) sum_k fn(t_k)`` with per-sequence stratified times ``t_k = lo + (hi - lo)(k + u_b)/K``,
    ``u_b ~ U[0, 1)``: an unbiased, low-variance estimate of ``E_{t ~ U[lo, hi]} fn(t)``. fn: (B,) -> (B,)."""
    u = torch.rand(B, generator=generator, dtype=torch.float64).to(device)
    total = torch.zeros(B, dtype=torch.float64, device=device)
    for k in range(K):
        total += fn(lo + (hi - lo) * (k + u) / K).double() / K
    return total


@torch.no_grad()
def nelbo_per_sequence(
    denoiser: Denoiser,
    schedule: ScheduleFn,
    tokens: Tensor,
    t_samples: int = 4,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    predict: Predict | None = None,
) -> dict[str, Tensor]:
    """Unbiased estimate of the per-token NELBO of every sequence in ``tokens`` (B, L).

    Reconstruction at t = 0 (one z_0 per sequence), diffusion at ``t_samples`` stratified times per
    sequence (t_k = (k + u_b) / K), prior in closed form. ``predict(z, gamma)`` gives
    (logits, e_hat) and defaults to ``denoiser(z, gamma, None)``; pass a self-conditioning wrapper
    to evaluate with s.c. on. Returns float64 tensors (B,): recon, diffusion, prior, nelbo.
    """
    predict = predict or (lambda z, g: denoiser(z, g, None))
    E = denoiser.embedding_matrix()
    dev = E.device
    tokens = tokens.to(dev)
    B = tokens.shape[0]
    e = E[tokens]  # (B, L, d_e)
    zero, one = torch.zeros(B, dtype=torch.float64, device=dev), torch.ones(B, dtype=torch.float64, device=dev)
    gamma_0, _ = schedule(zero)
    gamma_1, _ = schedule(one)

    eps = torch.randn(e.shape, generator=generator, device="cpu").to(dev)
    logits, _ = predict(forward_noise(e, gamma_0, eps), gamma_0)  # a DenoiserOutput or a (logits, e_hat) pair
    recon = recon_nll(logits, tokens, mask)

    diff = torch.zeros(B, dtype=torch.float64, device=dev)
    u = torch.rand(B, generator=generator, dtype=torch.float64).to(dev)
    for k in range(t_samples):
        t = (k + u) / t_samples
        gamma, dgamma = schedule(t)
        eps = torch.randn(e.shape, generator=generator, device="cpu").to(dev)
        _, e_hat = predict(forward_noise(e, gamma, eps), gamma)
        diff += diffusion_loss(e_hat, e, gamma, dgamma, mask) / t_samples

    prior = prior_kl(e, gamma_1, mask)
    return {"recon": recon, "diffusion": diff, "prior": prior, "nelbo": recon + diff + prior}


@torch.no_grad()
def block_nelbo_per_sequence(
    denoiser: Denoiser,
    schedule: ScheduleFn,
    tokens: Tensor,
    block: int,
    predict: Predict,
    t_samples: int = 4,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Block diffusion's NELBO (BD3-LM with eq. 4 per block): ``sum_k NELBO(x^k | x^{<k})``, each block's
    VDM bound given the clean blocks before it, every block at its own times. Returns each block's
    share (:func:`block_shares`) of the per-token recon, diffusion, prior and nelbo, (B, L / block)
    float64, so a row's shares sum to its per-token bound.

    ``predict(z, gamma)`` gives (logits, e_hat) of every block at once with gamma per token (B, L),
    block k seeing the clean blocks before it (the vectorised pass). Reconstruction at t = 0 for every
    block, diffusion at ``t_samples`` stratified times per (row, block) (``t = (s + u_bk) / S``), prior
    in closed form (it does not depend on the network, so per block it is the whole-sequence term)."""
    E = denoiser.embedding_matrix()
    dev = E.device
    tokens = tokens.to(dev)
    B, L = tokens.shape
    K = L // block
    e = E[tokens]  # (B, L, d_e)

    def per_token(t: Tensor) -> tuple[Tensor, Tensor]:  # (B, K) times -> (gamma, gamma') per token (B, L)
        gamma, dgamma = schedule(t)
        return gamma.repeat_interleave(block, dim=1), dgamma.repeat_interleave(block, dim=1)

    gamma_0, _ = per_token(torch.zeros(B, K, dtype=torch.float64, device=dev))
    gamma_1, _ = schedule(torch.ones(B, dtype=torch.float64, device=dev))
    eps = torch.randn(e.shape, generator=generator, device="cpu").to(dev)
    logits, _ = predict(forward_noise(e, gamma_0, eps), gamma_0)
    ce = F.cross_entropy(logits.float().reshape(B * L, -1), tokens.reshape(B * L), reduction="none").view(B, L)
    recon = block_shares(ce, block, mask)

    diff = torch.zeros(B, K, dtype=torch.float64, device=dev)
    u = torch.rand(B, K, generator=generator, dtype=torch.float64).to(dev)
    for k in range(t_samples):
        gamma, dgamma = per_token((k + u) / t_samples)
        eps = torch.randn(e.shape, generator=generator, device="cpu").to(dev)
        _, e_hat = predict(forward_noise(e, gamma, eps), gamma)
        diff += block_shares(diffusion_terms(e_hat, e, gamma, dgamma), block, mask) / t_samples

    prior = block_shares(prior_terms(e, gamma_1), block, mask)
    return {"recon": recon, "diffusion": diff, "prior": prior, "nelbo": recon + diff + prior}
