"""The diffusion math as properties over random inputs (``hypothesis``), each against an independent
float64 computation written here (numpy / scipy closed forms, Bayes' rule by brute force, complex-step
derivatives), not against the code's own expression.

The fixed-point checks of the same formulas live in test_nelbo.py, test_model.py, test_head.py and
test_samplers.py; these sweep the inputs (endpoints, noise levels, embeddings of any length, masks,
chunk sizes). Every property was seen failing on a planted bug in the code it checks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from replaid.diffusion.denoiser import alpha_sigma, prior_logits
from replaid.diffusion.nelbo import (
    block_shares,
    diffusion_loss,
    diffusion_terms,
    forward_noise,
    low_discrepancy,
    masked_mean,
    prior_kl,
    recon_nll,
)
from replaid.diffusion.oracle import OracleDenoiser
from replaid.diffusion.schedule import NoiseSchedule
from replaid.model.head import prior_softmax_head
from replaid.sampling.continuous import (
    ddim_step,
    ddpm_step,
    dpmpp_2m_extrapolate,
    exp_integrator_step,
    heun_step,
)

# derandomized: the same examples on every run (CI reproduces what a laptop saw); hypothesis shrinks a failure
PROPERTY = settings(max_examples=100, deadline=None, derandomize=True, database=None)

seeds = st.integers(0, 2**31 - 1)
gammas = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)


def randn(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal(shape)


def random_mask(seed: int, B: int, L: int) -> np.ndarray:
    return np.random.default_rng(seed + 1).random((B, L)) < 0.6  # rows may be empty


def np_masked_mean(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return x.mean(1)
    return (x * mask).sum(1) / np.maximum(mask.sum(1), 1)


def t64(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


# ----------------------------------------------------------------------------------------------
# noise schedule, alpha / sigma
# ----------------------------------------------------------------------------------------------


@PROPERTY
@given(
    hidden=st.integers(1, 6),
    seed=seeds,
    spread=st.floats(0.1, 3.0),
    g0=st.floats(-10.0, 5.0),
    width=st.floats(0.5, 15.0),
    t=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
)
def test_learned_schedule_is_the_normalised_monotone_mlp(hidden, seed, spread, g0, width, t):
    """Paper sec. 2 "Learnable noise schedule": gamma(t) = g0 + (g1 - g0)(g(t) - g(0)) / (g(1) - g(0)),
    g(t) = sum_j w2_j tanh(w1_j (t - 1/2) + b_j), strictly increasing, exact endpoints, exact gamma'."""
    s = NoiseSchedule(g0, g0 + width, "learned", hidden=hidden)
    with torch.no_grad():
        for i, p in enumerate((s.shape.a, s.shape.b, s.shape.c)):
            p.copy_(torch.from_numpy(randn(seed + i, hidden, scale=spread)))
    a, b, c = (p.detach().double().numpy() for p in (s.shape.a, s.shape.b, s.shape.c))
    w1, w2 = np.logaddexp(0, a), 0.01 * np.logaddexp(0, c)  # softplus
    G0, G1 = float(np.float32(g0)), float(np.float32(g0 + width))  # the endpoints are float32 parameters

    def g(tt: np.ndarray) -> np.ndarray:
        return (w2 * np.tanh(w1 * (tt[:, None] - 0.5) + b)).sum(-1)

    def dg(tt: np.ndarray) -> np.ndarray:
        return (w2 * w1 / np.cosh(w1 * (tt[:, None] - 0.5) + b) ** 2).sum(-1)

    tt = np.array(sorted(set(t)))
    span = g(np.array([1.0]))[0] - g(np.array([0.0]))[0]
    want = G0 + (G1 - G0) * (g(tt) - g(np.array([0.0]))[0]) / span
    dwant = (G1 - G0) * dg(tt) / span
    gam, dgam = s(t64(tt))
    np.testing.assert_allclose(gam.detach().numpy(), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dgam.detach().numpy(), dwant, rtol=1e-10, atol=1e-12)
    assert (dgam > 0).all()  # strictly increasing ...
    gn = gam.detach().numpy()
    assert (np.diff(gn) >= 0).all() and (np.diff(gn)[np.diff(tt) > 1e-6] > 0).all()  # ... to rounding
    ends, _ = s(torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert ends.tolist() == [G0, G1]  # exact


@PROPERTY
@given(g=st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=16))
def test_alpha_sigma_variance_preserving_with_log_snr_gamma(g):
    """VDM eq. (1)-(2) convention: alpha^2 = sigmoid(-gamma), alpha^2 + sigma^2 = 1, gamma = log(sigma^2 / alpha^2)."""
    gam = np.array(g)
    a, s = (x.numpy() for x in alpha_sigma(t64(gam)))
    np.testing.assert_allclose(a**2, special.expit(-gam), rtol=1e-12, atol=0)
    np.testing.assert_allclose(s**2, special.expit(gam), rtol=1e-12, atol=0)
    np.testing.assert_allclose(a**2 + s**2, 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(2 * np.log(s) - 2 * np.log(a), gam, rtol=0, atol=1e-9)


@PROPERTY
@given(seed=seeds, B=st.integers(1, 3), L=st.integers(1, 5), d=st.integers(1, 5), per_token=st.booleans(), g=gammas)
def test_forward_noise_is_alpha_e_plus_sigma_eps(seed, B, L, d, per_token, g):
    """Paper eq. (1): z_t = alpha_t e + sigma_t eps with alpha_t^2 = 1 / (1 + e^gamma), per row or per token."""
    e, eps = randn(seed, B, L, d), randn(seed + 1, B, L, d)
    gam = g + randn(seed + 2, B, L) if per_token else g + randn(seed + 2, B)
    a2 = 1 / (1 + np.exp(gam))
    a, s = np.sqrt(a2), np.sqrt(1 - a2)
    if not per_token:
        a, s = a[:, None], s[:, None]
    want = a[..., None] * e + s[..., None] * eps
    z = forward_noise(t64(e).float(), t64(gam), t64(eps).float())
    np.testing.assert_allclose(z.double().numpy(), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# NELBO terms
# ----------------------------------------------------------------------------------------------


@PROPERTY
@given(
    seed=seeds,
    B=st.integers(1, 3),
    L=st.integers(1, 6),
    d=st.integers(1, 6),
    norm=st.floats(0.1, 3.0),
    g1=st.lists(st.floats(-8.0, 15.0), min_size=3, max_size=3),
    masked=st.booleans(),
)
def test_prior_kl_is_the_gaussian_kl(seed, B, L, d, norm, g1, masked):
    """Paper eq. (4) prior term: KL(N(alpha_1 e, sigma_1^2 I) || N(0, I)) = 1/2 [tr S + mu.mu - d - log det S]."""
    e = randn(seed, B, L, d, scale=norm)
    gam = np.array(g1[:B])
    mask = random_mask(seed, B, L) if masked else None
    a2, s2 = special.expit(-gam)[:, None], special.expit(gam)[:, None]
    mu_sq = a2 * (e**2).sum(-1)  # ||alpha e||^2 (B, L)
    kl = 0.5 * (d * s2 + mu_sq - d - d * np.log(s2))  # per position
    got = prior_kl(t64(e), t64(gam), None if mask is None else torch.from_numpy(mask))
    np.testing.assert_allclose(got.numpy(), np_masked_mean(kl, mask), rtol=1e-9, atol=1e-12)


@PROPERTY
@given(
    seed=seeds,
    B=st.integers(1, 3),
    L=st.integers(1, 6),
    V=st.integers(2, 12),
    scale=st.floats(0.01, 20.0),
    masked=st.booleans(),
)
def test_recon_nll_is_the_log_softmax_of_the_token(seed, B, L, V, scale, masked):
    """Paper eq. (4) reconstruction term: -(1/L) sum_l log softmax(logits_l)[x_l], masked positions only."""
    logits = randn(seed, B, L, V, scale=scale).astype(np.float32)
    tok = np.random.default_rng(seed + 3).integers(0, V, (B, L))
    mask = random_mask(seed, B, L) if masked else None
    lp = special.log_softmax(logits.astype(np.float64), axis=-1)
    nll = -np.take_along_axis(lp, tok[..., None], -1)[..., 0]
    got = recon_nll(torch.from_numpy(logits), torch.from_numpy(tok), None if mask is None else torch.from_numpy(mask))
    np.testing.assert_allclose(got.numpy(), np_masked_mean(nll, mask), rtol=1e-5, atol=1e-5 * scale)


def snr_prime_complex_step(gam: np.ndarray, dgam: np.ndarray) -> np.ndarray:
    """d/dt SNR(t) for gamma locally linear in t, SNR = alpha^2 / sigma^2 = sigmoid(-gamma) / sigmoid(gamma),
    by the complex step (no subtraction, exact to rounding)."""
    h = 1e-30
    gz = gam + 1j * h * dgam
    snr = (1 / (1 + np.exp(gz))) / (1 / (1 + np.exp(-gz)))
    return snr.imag / h


@PROPERTY
@given(
    seed=seeds,
    B=st.integers(1, 3),
    L=st.integers(1, 6),
    d=st.integers(1, 5),
    g=gammas,
    dg=st.floats(0.01, 30.0),
    masked=st.booleans(),
)
def test_diffusion_loss_is_minus_half_snr_prime_times_the_squared_error(seed, B, L, d, g, dg, masked):
    """Paper eq. (4) (plaid-nelbo) diffusion term: L_diff = -1/2 SNR'(t) ||e_hat - e||^2, SNR' by complex step;
    per row and per token (block diffusion)."""
    e_hat, e = randn(seed, B, L, d).astype(np.float32), randn(seed + 1, B, L, d).astype(np.float32)
    sq = ((e_hat.astype(np.float64) - e) ** 2).sum(-1)  # (B, L)
    mask = random_mask(seed, B, L) if masked else None
    gam, dgam = g + randn(seed + 2, B), dg * np.exp(randn(seed + 3, B, scale=0.3))
    want = -0.5 * snr_prime_complex_step(gam, dgam) * np_masked_mean(sq, mask)
    got = diffusion_loss(
        torch.from_numpy(e_hat),
        torch.from_numpy(e),
        t64(gam),
        t64(dgam),
        None if mask is None else torch.from_numpy(mask),
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=0)
    gam_l, dgam_l = g + randn(seed + 4, B, L), dg * np.exp(randn(seed + 5, B, L, scale=0.3))
    want_l = -0.5 * snr_prime_complex_step(gam_l, dgam_l) * sq
    got_l = diffusion_terms(torch.from_numpy(e_hat), torch.from_numpy(e), t64(gam_l), t64(dgam_l))
    np.testing.assert_allclose(got_l.numpy(), want_l, rtol=1e-5, atol=0)


@PROPERTY
@given(seed=seeds, B=st.integers(1, 3), K=st.integers(1, 4), block=st.integers(1, 4), masked=st.booleans())
def test_block_shares_sum_to_the_masked_token_mean(seed, B, K, block, masked):
    """BD3-LM bound as a sum over blocks: share_k = (sum of block k's masked terms) / (row's count); shares sum to the mean."""
    L = K * block
    x = randn(seed, B, L)
    mask = random_mask(seed, B, L) if masked else None
    m = np.ones((B, L)) if mask is None else mask.astype(np.float64)
    want = (x * m).reshape(B, K, block).sum(-1) / np.maximum(m.sum(1, keepdims=True), 1)
    mt = None if mask is None else torch.from_numpy(mask)
    got = block_shares(t64(x), block, mt)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.sum(1).numpy(), masked_mean(t64(x), mt).numpy(), rtol=1e-12, atol=1e-12)


@PROPERTY
@given(n=st.integers(1, 64), u=st.floats(0.0, 1.0 - 1e-9))  # u within an ulp of 1 may round onto the next stratum
def test_low_discrepancy_times_one_per_stratum(n, u):
    """Kingma et al. (VDM) low-discrepancy sampler: t_i = (i + u) / n, exactly one time in each [i/n, (i+1)/n)."""
    t = low_discrepancy(n, u=u).numpy()
    np.testing.assert_allclose(t, (np.arange(n) + u) / n, rtol=0, atol=1e-15)
    i = np.arange(n)
    assert ((i / n - 1e-15 <= t) & (t < (i + 1) / n)).all() and ((t >= 0) & (t < 1)).all()


# ----------------------------------------------------------------------------------------------
# posterior over tokens: output prior logits, oracle, categorical reparameterisation
# ----------------------------------------------------------------------------------------------


def brute_posterior(z: np.ndarray, gam: np.ndarray, E: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """q(x = v | z) ∝ p_v prod_d N(z_d; alpha e_vd, sigma^2) by Bayes' rule, float64. z (B, L, d), gam (B,) or (B, L)."""
    g = gam if gam.ndim == 2 else np.broadcast_to(gam[:, None], z.shape[:2])
    a, s = np.sqrt(special.expit(-g)), np.sqrt(special.expit(g))
    loglik = stats.norm.logpdf(z[:, :, None, :], a[..., None, None] * E, s[..., None, None]).sum(-1)  # (B, L, V)
    return special.softmax(logp + loglik, axis=-1)


@PROPERTY
@given(
    seed=seeds,
    B=st.integers(1, 3),
    L=st.integers(1, 4),
    V=st.integers(2, 10),
    d=st.integers(1, 6),
    g=st.floats(-4.0, 8.0),
    per_token=st.booleans(),
)
def test_output_prior_logits_are_the_uniform_prior_posterior(seed, B, L, V, d, g, per_token):
    """Paper sec. 2 "output prior logits": softmax((alpha / sigma^2) z E^T) = q(x | z) under a uniform token
    prior for unit rows, and with the row-norm term for rows of any length (Bayes' rule by brute force)."""
    E = randn(seed, V, d)
    E_unit = E / np.linalg.norm(E, axis=-1, keepdims=True)
    gam = g + randn(seed + 1, B, L, scale=0.5) if per_token else g + randn(seed + 1, B, scale=0.5)
    x = np.random.default_rng(seed + 2).integers(0, V, (B, L))
    for Em, row_norms in ((E_unit, False), (E * np.exp(randn(seed + 3, V, 1, scale=0.5)), True)):
        gg = gam if per_token else gam[:, None]
        z = np.sqrt(special.expit(-gg))[..., None] * Em[x] + np.sqrt(special.expit(gg))[..., None] * randn(
            seed + 4, B, L, d
        )
        want = brute_posterior(z, gam, Em, np.zeros(V))
        got = torch.softmax(prior_logits(t64(z).float(), t64(gam), t64(Em).float(), row_norms=row_norms).double(), -1)
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-4)


@PROPERTY
@given(seed=seeds, B=st.integers(1, 3), L=st.integers(1, 4), V=st.integers(2, 10), d=st.integers(1, 6), g=gammas)
def test_oracle_is_bayes_rule_and_e_hat_is_the_posterior_mean(seed, B, L, V, d, g):
    """Definition "Bayes-optimal denoiser": x_hat = p_v N(z; alpha e_v, sigma^2 I) / sum, and eq. (3)
    e_hat = E[e | z] = sum_v x_hat_v e_v, for any prior p and rows of any length."""
    E = randn(seed, V, d) * np.exp(randn(seed + 1, V, 1, scale=0.5))
    p = np.random.default_rng(seed + 2).dirichlet(np.ones(V)) + 1e-3
    p /= p.sum()
    gam = g + randn(seed + 3, B, scale=0.5)
    z = randn(seed + 4, B, L, d, scale=1.5)
    post = brute_posterior(z, gam, E, np.log(p))
    o = OracleDenoiser(t64(p), t64(E))
    got = torch.softmax(o.logits64(t64(z), t64(gam)), -1).numpy()
    np.testing.assert_allclose(got, post, rtol=0, atol=1e-9)
    e_hat = (post[..., :, None] * E).sum(-2)  # the mixture's mean, term by term
    np.testing.assert_allclose(o(t64(z), t64(gam)).e_hat.double().numpy(), e_hat, rtol=1e-5, atol=1e-5)


@PROPERTY
@given(
    seed=seeds,
    N=st.integers(1, 9),
    V=st.integers(2, 15),
    d=st.integers(1, 5),
    chunk=st.integers(1, 10),
    zscale=st.floats(0.0, 10.0),
    prior=st.booleans(),
)
def test_fused_head_is_softmax_mixture_mean_and_cross_entropy(seed, N, V, d, chunk, zscale, prior):
    """Paper eq. (3) categorical reparameterisation: e_hat = softmax(logits) @ E and nll = -log softmax(logits)[x],
    logits = f W^T + b + zs E^T, for any chunking of the rows (scipy float64)."""
    H = 4
    f, W, b = randn(seed, N, H), randn(seed + 1, V, H), randn(seed + 2, V)
    zs = randn(seed + 3, N, d, scale=zscale)
    E = randn(seed + 4, V, d)
    E /= np.linalg.norm(E, axis=-1, keepdims=True)
    target = np.random.default_rng(seed + 5).integers(0, V, N)
    f32 = [torch.from_numpy(x.astype(np.float32)) for x in (f, W, b, zs, E)]
    e_hat, nll = prior_softmax_head(
        f32[0], f32[1], f32[2], f32[3] if prior else None, f32[4], torch.ones(N), torch.from_numpy(target), chunk
    )
    f, W, b, zs, E = (x.double().numpy() for x in f32)  # the float32 inputs, exactly, in float64
    logits = f @ W.T + b + (zs @ E.T if prior else 0.0)
    probs = special.softmax(logits, axis=-1)
    np.testing.assert_allclose(e_hat.double().numpy(), probs @ E, rtol=1e-4, atol=1e-5)
    want = -special.log_softmax(logits, axis=-1)[np.arange(N), target]
    np.testing.assert_allclose(nll.double().numpy(), want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# sampler steps
# ----------------------------------------------------------------------------------------------


@PROPERTY
@given(seed=seeds, gs=st.floats(-8.0, 8.0), gap=st.floats(0.01, 8.0), d=st.integers(1, 4))
def test_ddpm_step_is_the_gaussian_posterior_by_bayes_rule(seed, gs, gap, d):
    """Eq. plaid-ancestral, VDM App. A.4: q(z_s | z_t, x) for s < t, by Bayes' rule from q(z_s | x) and the transition
    q(z_t | z_s) = N(alpha_{t|s} z_s, sigma_{t|s}^2): ancestral step = mean + sqrt(var) eps."""
    gt = gs + gap
    as2, ss2, at2, st2 = special.expit(-gs), special.expit(gs), special.expit(-gt), special.expit(gt)
    a_ts2 = at2 / as2
    s_ts2 = st2 - a_ts2 * ss2  # sigma_{t|s}^2
    var = 1 / (1 / ss2 + a_ts2 / s_ts2)
    z, x, eps = randn(seed, 2, 3, d), randn(seed + 1, 2, 3, d), randn(seed + 2, 2, 3, d)
    mean = var * (math.sqrt(as2) * x / ss2 + math.sqrt(a_ts2) * z / s_ts2)
    got0 = ddpm_step(t64(z), t64(x), gt, gs, torch.zeros(2, 3, d, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(got0, mean, rtol=1e-8, atol=1e-9)
    got = ddpm_step(t64(z), t64(x), gt, gs, t64(eps)).numpy()
    np.testing.assert_allclose(got - got0, math.sqrt(var) * eps, rtol=1e-8, atol=1e-9)


@PROPERTY
@given(seed=seeds, g1=gammas, g2=gammas, d=st.integers(1, 4))
def test_deterministic_steps_keep_the_noise_of_an_exact_prediction(seed, g1, g2, d):
    """DDIM / DPM-Solver++ (1st order) / Euler-VE: with e_hat = e, z_t = alpha_t e + sigma_t eps maps to
    alpha_s e + sigma_s eps (the PF-ODE of a point mass), whatever the direction and size of the step."""
    gt, gs = g1, g2
    e, eps = randn(seed, 2, 3, d), randn(seed + 1, 2, 3, d)
    a = lambda g: math.sqrt(special.expit(-g))
    s = lambda g: math.sqrt(special.expit(g))
    z = a(gt) * e + s(gt) * eps
    want = a(gs) * e + s(gs) * eps
    for got in (
        ddim_step(t64(z), t64(e), gt, gs),
        exp_integrator_step(t64(z), t64(e), gt, gs),
        a(gs) * heun_step(t64(z) / a(gt), t64(e), math.exp(gt / 2), math.exp(gs / 2)),
    ):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)


@PROPERTY
@given(seed=seeds, lam=st.floats(-5.0, 5.0), h_prev=st.floats(0.01, 3.0), h=st.floats(0.01, 3.0))
def test_dpmpp_2m_extrapolation_is_the_midpoint_of_a_linear_prediction(seed, lam, h_prev, h):
    """DPM-Solver++(2M) (Lu et al. 2022, eq. dpmpp-extrap): for e linear in lambda, D = e(lambda_t + h / 2)."""
    c0, c1 = randn(seed, 3, 2), randn(seed + 1, 3, 2)
    e = lambda x: c0 + c1 * x
    D = dpmpp_2m_extrapolate(t64(e(lam)), t64(e(lam - h_prev)), h_prev, h).numpy()
    np.testing.assert_allclose(D, e(lam + h / 2), rtol=1e-9, atol=1e-9)
