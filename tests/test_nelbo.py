"""NELBO pieces against closed forms, float64 references and the Bayes-optimal oracle."""

import math

import pytest
import torch

from replaid.config import ModelConfig
from replaid.diffusion.denoiser import alpha_sigma
from replaid.diffusion.nelbo import diffusion_loss, forward_noise, nelbo_per_sequence, prior_kl, recon_nll
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.methods.replaid import DiffusionOptions
from replaid.model.replaid import RePlaid

P = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.1, 0.05])


def linear_schedule(g0, g1):
    return lambda t: (g0 + (g1 - g0) * t.double(), torch.full_like(t.double(), g1 - g0))


def test_prior_kl_closed_form_value():
    """About 0.00126 nats per token at gamma_1 = 6, d_e = 16 (reference notes)."""
    E = random_unit_embeddings(50, 16, 1)
    e = E[torch.randint(0, 50, (3, 7))]
    kl = prior_kl(e, torch.tensor(6.0))
    assert torch.allclose(kl, torch.full((3,), kl[0].item(), dtype=torch.float64))
    assert abs(kl[0].item() - 0.00126) < 1e-5
    # independent: KL(N(a e, s^2 I) || N(0, I)) summed over d_e coordinates, float64
    a2, s2 = 1 / (1 + math.exp(6.0)), 1 / (1 + math.exp(-6.0))
    ref = 0.5 * (16 * (s2 - 1 - math.log(s2)) + a2 * 1.0)
    assert abs(kl[0].item() - ref) < 1e-12


def test_prior_kl_monte_carlo():
    """Closed form against a Monte-Carlo estimate of E_q[log q - log p]."""
    g1 = torch.tensor(1.0, dtype=torch.float64)
    E = random_unit_embeddings(10, 4, 2)
    e = E[torch.tensor([[3]])]  # (1, 1, 4)
    a, s = alpha_sigma(g1)
    z = a * e + s * torch.randn(200_000, 1, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logq = (-0.5 * ((z - a * e) / s) ** 2 - torch.log(s) - 0.5 * math.log(2 * math.pi)).sum(-1)
    logp = (-0.5 * z**2 - 0.5 * math.log(2 * math.pi)).sum(-1)
    mc = (logq - logp).mean().item()
    assert abs(prior_kl(e, g1).item() - mc) < 3e-3


def test_recon_and_diffusion_against_float64_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    tok = torch.randint(0, 7, (2, 5), generator=g)
    ref = -torch.log_softmax(logits.double(), -1).gather(-1, tok[..., None]).squeeze(-1).mean(1)
    assert torch.allclose(recon_nll(logits, tok), ref, atol=1e-6)
    e_hat, e = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    gamma, dgamma = torch.tensor([0.3, -2.0], dtype=torch.float64), torch.tensor([9.0, 4.0], dtype=torch.float64)
    snr_prime = -dgamma * torch.exp(-gamma)
    ref = -0.5 * snr_prime * ((e_hat.double() - e.double()) ** 2).sum(-1).mean(1)
    assert torch.allclose(diffusion_loss(e_hat, e, gamma, dgamma), ref, atol=1e-6)
    # masks count only real positions
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    r = recon_nll(logits, tok, mask)
    full = -torch.log_softmax(logits.double(), -1).gather(-1, tok[..., None]).squeeze(-1)
    assert torch.allclose(r[0], full[0, :2].mean(), atol=1e-6)


def test_forward_noise_moments():
    gamma = torch.tensor([0.5], dtype=torch.float64)
    e = torch.ones(1, 1, 1)
    eps = torch.randn(100_000, 1, 1, generator=torch.Generator().manual_seed(1))
    z = forward_noise(e.expand(100_000, 1, 1), gamma.expand(100_000), eps)
    a, s = alpha_sigma(gamma)
    assert abs(z.mean().item() - a.item()) < 0.01 and abs(z.std().item() - s.item()) < 0.01
    assert abs(a.item() ** 2 + s.item() ** 2 - 1) < 1e-12


def oracle_gap(g0, g1, n_seq=3000, L=8, t_samples=32, seed=0):
    E = random_unit_embeddings(6, 4, 0)
    o = OracleDenoiser(P, E)
    g = torch.Generator().manual_seed(seed)
    x = o.sample_tokens((n_seq, L), g)
    r = nelbo_per_sequence(o, linear_schedule(g0, g1), x, t_samples, generator=g)
    nll = -torch.log(o.p[x]).mean(1)  # exact per-token NLL of each sequence
    gap = r["nelbo"] - nll
    return gap.mean().item(), (gap.std() / math.sqrt(n_seq)).item(), o.entropy(), r


def test_oracle_nelbo_upper_bounds_entropy_narrow():
    """Narrow endpoints leave information on the table: a clearly positive gap."""
    gap, se, H, r = oracle_gap(-1.0, 2.0)
    assert gap > 5 * se
    assert r["nelbo"].mean().item() > H


def test_oracle_nelbo_tight_for_wide_endpoints():
    """With the Bayes-optimal denoiser and wide endpoints the NELBO is within 1% of H(p),
    and never significantly below the exact NLL."""
    gap, se, H, r = oracle_gap(-12.0, 12.0, n_seq=4000, t_samples=64)
    assert gap > -3.5 * se, (gap, se)
    assert abs(r["nelbo"].mean().item() - H) / H < 0.01
    assert abs(gap) < 0.01 * H


def test_zero_network_logits_are_exact_posterior_under_uniform_prior():
    """Head zero-initialised: logits = exact Gaussian posterior log-probs (up to a constant)."""
    torch.manual_seed(0)
    V, d = 11, 16
    m = RePlaid(ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=d), DiffusionOptions(), V)
    E = m.embedding_matrix().double()
    z = torch.randn(2, 3, d)
    gamma = torch.tensor([0.7, -1.5], dtype=torch.float64)
    out = m(z, gamma, None)
    uniform = OracleDenoiser(torch.ones(V), E)  # exact posterior with a uniform prior
    ref = torch.log_softmax(uniform.logits64(z, gamma), -1)
    assert torch.allclose(torch.log_softmax(out.logits.double(), -1), ref, atol=1e-4)
    assert torch.allclose(out.e_hat.double(), torch.softmax(ref, -1) @ E, atol=1e-5)


def test_output_prior_switch():
    V, d = 11, 16
    m = RePlaid(
        ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=d, output_prior=False), DiffusionOptions(), V
    )
    out = m(torch.randn(1, 3, d), torch.zeros(1, dtype=torch.float64))
    assert torch.allclose(out.logits, torch.zeros_like(out.logits))


@pytest.mark.parametrize("mode", ["one-hot", "frozen-random"])
def test_embedding_modes(mode):
    V = 9
    m = RePlaid(
        ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4, embeddings=mode), DiffusionOptions(), V
    )
    E = m.embedding_matrix()
    assert torch.allclose(E.norm(dim=-1), torch.ones(V), atol=1e-5)
    assert not m.embedding.weight.requires_grad
    if mode == "one-hot":
        assert torch.equal(E, torch.eye(V))


def test_oracle_nelbo_gap_equals_prior_marginal_kl_narrow():
    """With the Bayes-optimal denoiser (exact reverse process) E_x[NELBO] - H(p) = KL(q(z_1) || N(0, I))
    per token, q(z_1) = sum_v p_v N(alpha_1 e_v, sigma_1^2 I) (the data log-likelihood bound is loose
    only through the prior at t = 1). The KL by Monte Carlo with 400k draws; equal within 4 s.e."""
    g0, g1 = -1.0, 2.0
    gap, se, H, _ = oracle_gap(g0, g1, n_seq=3000, t_samples=32)
    E = random_unit_embeddings(6, 4, 0)
    p = P.double() / P.double().sum()
    a1, s1 = alpha_sigma(torch.tensor([g1], dtype=torch.float64))
    a1, s1 = float(a1), float(s1)
    g = torch.Generator().manual_seed(11)
    n = 400_000
    v = torch.multinomial(p, n, replacement=True, generator=g)
    z = a1 * E[v] + s1 * torch.randn(n, 4, generator=g, dtype=torch.float64)
    log_q = torch.logsumexp(p.log() - ((z[:, None, :] - a1 * E[None]) ** 2).sum(-1) / (2 * s1**2), 1) - 2 * math.log(
        2 * math.pi * s1**2
    )
    log_n = -(z**2).sum(-1) / 2 - 2 * math.log(2 * math.pi)
    d = log_q - log_n
    kl, kl_se = float(d.mean()), float(d.std()) / math.sqrt(n)
    assert kl > 0.02  # narrow endpoints: a clearly visible gap
    assert abs(gap - kl) < 4 * math.hypot(se, kl_se), (gap, kl, se, kl_se)


def test_prior_logits_with_row_norms_are_the_gaussian_log_density():
    """Mutation survivor (denoiser.py, the row-norm term): for rows of any length the prior logits with
    ``row_norms=True`` equal log N(z; alpha e_v, sigma^2 I) up to one constant per position."""
    from replaid.diffusion.denoiser import prior_logits

    g = torch.Generator().manual_seed(0)
    E = torch.randn(7, 3, generator=g, dtype=torch.float64) * torch.tensor(
        [[0.5], [1], [2], [1.5], [0.7], [1.2], [3.0]], dtype=torch.float64
    )
    z = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    gamma = torch.tensor([-1.0, 0.5], dtype=torch.float64)
    a, s = alpha_sigma(gamma)
    logn = -((z[:, :, None, :] - a.view(-1, 1, 1, 1) * E) ** 2).sum(-1) / (2 * s.view(-1, 1, 1) ** 2)  # (B, L, V)
    got = prior_logits(z, gamma, E, row_norms=True).double()
    diff = got - logn
    assert torch.allclose(diff, diff[..., :1].expand_as(diff), atol=1e-4)
