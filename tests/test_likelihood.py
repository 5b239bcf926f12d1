"""ODE/IWAE likelihood: oracle check, Hutchinson, FD vs JVP, self-conditioning chain rule, K-curve.

The tests that solve the ODE take the ``device`` fixture (``pytest --device cuda``): the oracle or the
model lives there; tokens, noise and probes are drawn from the seeded CPU generators."""

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from replaid.config import ModelConfig
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.eval.likelihood import (
    PFODE,
    estimate_likelihood,
    fit_inverse_k,
    hutchinson_divergence,
    iwae_curve,
    ode_log_weight,
    plot_k_curve,
)
from replaid.methods.replaid import DiffusionOptions
from replaid.model.replaid import RePlaid

P = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.07, 0.05, 0.03])


def oracle(device="cpu"):
    return OracleDenoiser(P, random_unit_embeddings(8, 4, seed=0)).to(device)


def test_oracle_iwae_matches_exact_log_likelihood(device):
    o = oracle(device)
    N, L, K = 16, 4, 8
    tok = o.sample_tokens((N, L), torch.Generator().manual_seed(1))
    exact = (-o.p.log()[tok].sum(1) / L).cpu()  # (N,) exact NLL per token
    # gamma_1 = 10: the prior mismatch KL(q(z_1) || N(0, I)) is ~1e-5 nats
    r = estimate_likelihood(o, tok, -3.0, 10.0, K=K, batch_size=512, steps=64, n_hutch=4, seed=0)
    diff1 = -r.log_w / L - exact[:, None]  # (N, K) per-sample K=1 error
    se1 = float(diff1.mean(1).std() / math.sqrt(N))
    assert abs(float(diff1.mean())) < 3 * se1 + 5e-3, (float(diff1.mean()), se1)
    diffK = r.curve[K]["nats"] - float(exact.mean())
    assert abs(diffK) < 3 * se1 + 1e-2, diffK
    # tightens with K (nats non-increasing within noise)
    Ks = sorted(r.curve)
    for a, b in zip(Ks, Ks[1:], strict=False):
        assert r.curve[b]["nats"] <= r.curve[a]["nats"] + 1e-3
    s = r.summary()
    assert s["nfe"] > 0 and set(s["nats_per_token"]) == {"1", "2", "4", "8"}


def test_log_weight_pieces_and_constants(device):
    """With the oracle the weight is (nearly) constant, = p(x); pieces are finite."""
    o = oracle(device)
    tok = o.sample_tokens((4, 3), torch.Generator().manual_seed(2))
    out = ode_log_weight(o, tok, -3.0, 10.0, steps=32, n_hutch=4, generator=torch.Generator().manual_seed(0))
    exact = o.p.log()[tok].sum(1)
    assert (out["log_w"] - exact).abs().max() < 1.5 and abs(float((out["log_w"] - exact).mean())) < 0.5
    assert all(torch.isfinite(v).all() for v in out.values())
    assert out["log_w"].device == o.p.device


@pytest.mark.parametrize("probe", ["rademacher", "gaussian"])
def test_hutchinson_unbiased_on_linear_drift(probe):
    g = torch.Generator().manual_seed(0)
    n = 6
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    f = lambda z: (z.reshape(z.shape[0], -1) @ A.t()).reshape(z.shape)
    z = torch.randn(4000, 2, 3, dtype=torch.float64)
    est = hutchinson_divergence(f, z, n_hutch=1, probe=probe, jvp="fd", generator=g)
    se = float(est.std() / math.sqrt(len(est)))
    assert abs(float(est.mean()) - float(A.trace())) < 4 * se
    exact = hutchinson_divergence(
        f, z[:3], n_hutch=1, probe=probe, jvp="autograd", generator=torch.Generator().manual_seed(5)
    )
    fd = hutchinson_divergence(f, z[:3], n_hutch=1, probe=probe, jvp="fd", generator=torch.Generator().manual_seed(5))
    assert torch.allclose(exact, fd, atol=1e-6)


def test_fd_and_jvp_paths_agree_on_oracle(device):
    o = oracle(device)
    tok = o.sample_tokens((6, 4), torch.Generator().manual_seed(3))
    kw = dict(steps=16, n_hutch=2)
    a = ode_log_weight(o, tok, -3.0, 6.0, jvp="fd", generator=torch.Generator().manual_seed(7), **kw)
    b = ode_log_weight(o, tok, -3.0, 6.0, jvp="autograd", generator=torch.Generator().manual_seed(7), **kw)
    assert torch.allclose(a["log_w"], b["log_w"], atol=2e-2), (a["log_w"], b["log_w"])


def tiny_model(self_conditioning=True, device="cpu"):
    torch.manual_seed(0)
    m = RePlaid(
        ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4, self_conditioning=self_conditioning),
        DiffusionOptions(),
        vocab_size=12,
    )
    with torch.no_grad():  # perturb the zero-initialised parameters so every path matters
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.double().float().eval().to(device)


def test_selfcond_chain_rule_term(device):
    m = tiny_model(True, device)
    z = torch.randn(3, 5, 4).to(device)
    gamma = torch.full((3,), -1.0, dtype=torch.float64, device=device)
    divs = {}
    for corr in (True, False):
        for jvp in ("fd", "autograd"):
            ode = PFODE(m, selfcond_correction=corr)
            _, d = ode.drift_and_div(z, gamma, n_hutch=4, jvp=jvp, h=1e-3, generator=torch.Generator().manual_seed(0))
            divs[corr, jvp] = d
    for corr in (True, False):
        assert torch.allclose(divs[corr, "fd"], divs[corr, "autograd"], atol=1e-2)
    chain = divs[True, "autograd"] - divs[False, "autograd"]
    # the chain-rule trace is present (and, here, negative as the paper argues)
    assert chain.abs().max() > 0.05, chain

    m0 = tiny_model(False, device)
    a = PFODE(m0, selfcond_correction=True).drift_and_div(z, gamma, generator=torch.Generator().manual_seed(0))[1]
    b = PFODE(m0, selfcond_correction=False).drift_and_div(z, gamma, generator=torch.Generator().manual_seed(0))[1]
    assert torch.equal(a, b)


def test_selfcond_log_weights_differ_with_correction(device):
    m = tiny_model(True, device)
    tok = torch.randint(0, 12, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(steps=2, n_hutch=1)
    a = ode_log_weight(m, tok, -3.0, 6.0, selfcond_correction=True, generator=torch.Generator().manual_seed(1), **kw)
    b = ode_log_weight(m, tok, -3.0, 6.0, selfcond_correction=False, generator=torch.Generator().manual_seed(1), **kw)
    assert not torch.allclose(a["log_w"], b["log_w"], atol=1e-3)


def test_k_curve_and_fit(tmp_path):
    g = torch.Generator().manual_seed(0)
    lw = -10 + 1.5 * torch.randn(50, 16, generator=g, dtype=torch.float64)
    curve = iwae_curve(lw, L=5)
    assert sorted(curve) == [1, 2, 4, 8, 16]
    assert curve[1]["nats"] == pytest.approx(float(-lw.mean() / 5))
    assert curve[16]["nats"] < curve[1]["nats"]
    rnd = iwae_curve(lw, L=5, Ks=[1, 4], mode="random", generator=g)
    assert rnd[1]["nats"] == pytest.approx(curve[1]["nats"], abs=0.05)
    # exact a + b / K recovered
    fake = {k: {"nats": 2.0 + 0.5 / k, "stderr": 0.0, "ppl": 0.0} for k in (1, 2, 4, 8, 16)}
    fit = fit_inverse_k(fake)
    assert fit["a"] == pytest.approx(2.0) and fit["b"] == pytest.approx(0.5) and fit["fit_K"] == [4, 8, 16]
    plot_k_curve(curve, fit_inverse_k(curve), str(tmp_path / "k.png"), nelbo_nats=2.1)
    assert (tmp_path / "k.png").stat().st_size > 1000


def test_likelihood_command(tmp_path):
    from replaid.cli import main

    run = tmp_path / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=3"]) == 0
    out = tmp_path / "lik"
    rc = main(["likelihood", str(run), "--num-seqs", "2", "--K", "2", "--steps", "2", "--out", str(out), "--json"])
    assert rc == 0
    if importlib.util.find_spec("torchdiffeq"):
        assert (
            main(
                [
                    "likelihood",
                    str(run),
                    "--num-seqs",
                    "1",
                    "--solver",
                    "dopri5",
                    "--rtol",
                    "1e-3",
                    "--atol",
                    "1e-3",
                    "--out",
                    str(tmp_path / "adaptive"),
                    "--json",
                ]
            )
            == 0
        )
        assert json.loads((tmp_path / "adaptive" / "likelihood.json").read_text())["solver"] == "dopri5"
    res = json.loads((out / "likelihood.json").read_text())
    for k in ("ppl_K1", "ppl_Kmax", "nats_per_token", "fit_a", "fit_b", "ppl_inf", "nelbo_ppl", "nfe", "seconds"):
        assert k in res
    assert np.load(out / "log_weights.npy").shape == (2, 2)
    assert (out / "kcurve.png").is_file()


def test_dopri5_matches_the_exact_likelihood_and_heun(device):
    """The adaptive solver (probes fixed per row for the solve) on the oracle matches the exact NLL."""
    pytest.importorskip("torchdiffeq")
    o = oracle(device)
    N, L = 16, 4
    tok = o.sample_tokens((N, L), torch.Generator().manual_seed(1))
    exact = (-o.p.log()[tok].sum(1) / L).cpu()
    r = estimate_likelihood(
        o, tok, -3.0, 10.0, K=4, batch_size=512, n_hutch=4, seed=0, solver="dopri5", rtol=1e-6, atol=1e-6
    )
    diff = -r.log_w / L - exact[:, None]  # (N, K)
    se = float(diff.mean(1).std() / math.sqrt(N))
    assert abs(float(diff.mean())) < 3 * se + 5e-3, (float(diff.mean()), se)
    assert r.nfe > 0
    # the probes are fixed within a solve: with one sample and one row, two runs with the same seed agree
    a = ode_log_weight(o, tok[:2], -3.0, 10.0, solver="dopri5", generator=torch.Generator().manual_seed(3))
    b = ode_log_weight(o, tok[:2], -3.0, 10.0, solver="dopri5", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a["log_w"], b["log_w"])
    with pytest.raises(ValueError, match="solver"):
        ode_log_weight(o, tok[:2], -3.0, 10.0, solver="rk4")


def test_hutchinson_with_given_probes_is_the_exact_quadratic_form():
    """Fixed probes (the dopri5 path): the estimate is exactly mean_j xi_j^T A xi_j for f(z) = A z."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(6, 6, generator=g, dtype=torch.float64)
    z = torch.randn(3, 6, generator=g, dtype=torch.float64)
    probes = [torch.randn(3, 6, generator=g, dtype=torch.float64) for _ in range(2)]
    ref = sum(torch.einsum("bi,ij,bj->b", xi, A, xi) for xi in probes) / 2
    for jvp in ("fd", "autograd"):
        est = hutchinson_divergence(lambda x: x @ A.T, z, probes=probes, jvp=jvp)
        assert torch.allclose(est, ref, atol=1e-8), jvp


def test_selfcond_divergence_is_the_exact_trace_of_the_composition(device):
    """The corrected divergence equals tr d/dz v(z, gamma, e_sc(z)) with e_sc(z) = x_theta(z, gamma, 0) E,
    computed here by a full Jacobian (autograd) of a drift written from the paper's formula; the cached
    estimator equals the trace with e_sc held fixed; so the chain-rule term (their difference) has the
    right value and sign. Hutchinson with every basis vector as a probe is exact: n * mean_j e_j^T J e_j."""
    m = tiny_model(True, device)
    B, L, d_e = 2, 3, 4
    z = torch.randn(B, L, d_e, generator=torch.Generator().manual_seed(0)).to(device)
    gamma = torch.full((B,), -0.5, dtype=torch.float64, device=device)
    a = torch.sigmoid(-gamma).sqrt().view(-1, 1, 1).float()

    def v_full(zz):  # (B, L, d_e) -> (B, L, d_e), e_sc recomputed at zz
        e_sc = m(zz, gamma, None).e_hat
        return 0.5 * (a**2 * zz - a * m(zz, gamma, e_sc).e_hat)

    e_sc0 = m(z, gamma, None).e_hat.detach()

    def v_cached(zz):
        return 0.5 * (a**2 * zz - a * m(zz, gamma, e_sc0).e_hat)

    def trace(f):
        out = []
        for b in range(B):
            J = torch.autograd.functional.jacobian(lambda y: f(y.unsqueeze(0).expand(B, L, d_e))[b], z[b])
            out.append(J.reshape(L * d_e, L * d_e).trace())
        return torch.stack(out)

    # the per-row Jacobian above uses row b's output of a batch where every row is z[b]: rows are independent
    exact_full, exact_cached = trace(v_full), trace(v_cached)
    n = L * d_e
    basis = [
        torch.zeros(B, n, device=device).index_fill_(1, torch.tensor([i], device=device), 1.0).view(B, L, d_e)
        for i in range(n)
    ]
    with torch.no_grad():
        got = {
            c: n * PFODE(m, selfcond_correction=c).drift_and_div(z, gamma, jvp="autograd", probes=basis)[1]
            for c in (True, False)
        }
    exact_full, exact_cached = exact_full.double(), exact_cached.double()  # float32 model: 1e-4 tolerances
    assert torch.allclose(got[True], exact_full, rtol=1e-4, atol=1e-4), (got[True], exact_full)
    assert torch.allclose(got[False], exact_cached, rtol=1e-4, atol=1e-4), (got[False], exact_cached)
    chain = exact_full - exact_cached
    assert chain.abs().min() > 1e-2  # a real term, which a sign flip would change
    assert torch.allclose(got[True] - got[False], chain, rtol=1e-3, atol=1e-4)


def test_iwae_noise_bias_delta_method_matches_monte_carlo():
    from replaid.eval.likelihood import iwae, iwae_noise_bias

    g = torch.Generator().manual_seed(0)
    lw = torch.randn(8, 1, 8, generator=g, dtype=torch.float64) * 0.7  # 8 sequences, K = 8
    s2 = torch.full_like(lw, 0.04)
    noisy = lw + 0.2 * torch.randn(8, 200_000, 8, generator=g, dtype=torch.float64)
    mc = iwae(noisy).mean(1) - iwae(lw)[:, 0]
    pred = iwae_noise_bias(lw, s2)[:, 0]
    assert torch.allclose(mc, pred, rtol=0.1, atol=2e-3), (mc, pred)
    assert float(iwae_noise_bias(lw[..., :1], s2[..., :1]).abs().max()) == 0.0  # K = 1: unbiased
    eq = iwae_noise_bias(torch.zeros(1, 8, dtype=torch.float64), torch.full((1, 8), 0.5, dtype=torch.float64))
    assert float(eq) == pytest.approx(0.25 * (1 - 1 / 8))


def test_divergence_noise_variance_matches_the_spread_of_repeated_probes(device):
    """div_var, estimated from the spread of the n_hutch probes within one solve, equals the variance
    of int div over repeated solves from one z_0 (Heun's path does not depend on the probes): 400
    copies of one z_0 in a batch draw independent probes."""
    from replaid.eval.likelihood import _solve_heun

    o = oracle(device)
    z0 = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(1)).expand(400, 3, 4).contiguous().to(device)
    z, div, var = _solve_heun(
        PFODE(o),
        z0,
        -3.0,
        4.0,
        6,
        n_hutch=2,
        probe="rademacher",
        jvp="fd",
        h=1e-3,
        generator=torch.Generator().manual_seed(2),
    )
    assert torch.allclose(z, z[:1].expand_as(z))  # one trajectory
    ratio = float(div.var()) / float(var.mean())
    assert 0.75 < ratio < 1.33, ratio  # sampling error of a variance from 400 draws: ~7%
