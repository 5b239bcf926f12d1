"""Per-timestep diagnostics: the closed-form gamma* flattens the diffusion loss; the command runs."""

import json

import numpy as np
import pytest
import torch

from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.eval.diagnostics import linear_r2, measure_at_gammas, optimal_schedule, time_grid


def _check_flat(gg, mse):
    opt = optimal_schedule(gg, mse)
    t = time_grid(33)
    ls = opt["loss_star"](t)
    assert np.allclose(ls, opt["kappa"], rtol=2e-2), (ls.min(), ls.max(), opt["kappa"])
    assert opt["gamma_star"](0.0) == pytest.approx(gg[0]) and opt["gamma_star"](1.0) == pytest.approx(gg[-1])
    assert np.all(np.diff(opt["gamma_star"](t)) > 0)
    # kappa = 1/2 int w
    fine = np.linspace(gg[0], gg[-1], 20001)
    w = np.exp(-fine) * np.interp(fine, gg, mse)
    assert opt["kappa"] == pytest.approx(0.5 * np.trapezoid(w, fine), rel=1e-4)
    return opt


def test_optimal_schedule_flattens_sigmoid_mse():
    gg = np.linspace(-3.0, 6.0, 401)
    mse = 1 / (1 + np.exp(-gg))  # MSE(gamma) = sigmoid(gamma)
    opt = _check_flat(gg, mse)
    # closed form: w = e^{-g} sigmoid(g) = sigmoid(-g) -> G = log(1+e^{-g0}) - log(1+e^{-g})
    kappa = 0.5 * (np.log1p(np.exp(3.0)) - np.log1p(np.exp(-6.0)))
    assert opt["kappa"] == pytest.approx(kappa, rel=1e-4)


def test_optimal_schedule_flattens_oracle_mse():
    o = OracleDenoiser(torch.tensor([0.4, 0.3, 0.2, 0.1]), random_unit_embeddings(4, 3, seed=1))
    tokens = [o.sample_tokens((32, 8), torch.Generator().manual_seed(0))]
    gg = np.linspace(-4.0, 6.0, 41)
    m = measure_at_gammas(
        lambda z, g: o(z, g), o.embedding_matrix(), tokens, torch.tensor(gg), torch.Generator().manual_seed(0)
    )
    assert m["mse"][0] < m["mse"][-1] and m["ce"][0] < m["ce"][-1]
    assert m["ce"][-1] == pytest.approx(o.entropy(), abs=0.2)  # pure noise: CE -> H(p) (sample noise)
    _check_flat(gg, m["mse"])


def test_linear_r2():
    x = np.linspace(0, 1, 20)
    assert linear_r2(x, 3 * x + 1) == pytest.approx(1.0)
    assert linear_r2(x, np.cos(8 * x)) < 0.5


def test_diagnose_command(tmp_path):
    from replaid.cli import main

    run = tmp_path / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=3"]) == 0
    out = tmp_path / "diag"
    assert main(["diagnose", str(run), "--out", str(out), "--batches", "1", "--grid", "9", "--json"]) == 0
    s = json.loads((out / "diagnose.json").read_text())
    for k in ("kappa", "ce_linear_r2", "diffusion_loss_mean", "gamma_0", "gamma_1", "ce_near_linear"):
        assert k in s
    for f in ("curves.csv", "gamma_curves.csv", "diffusion_loss.png", "ce.png", "error_rate.png", "gamma.png"):
        assert (out / f).is_file(), f
    rows = np.loadtxt(out / "curves.csv", delimiter=",", skiprows=1)
    assert rows.shape[0] == 9 and np.isfinite(rows).all()


def test_oracle_ce_is_linear_in_t_along_gamma_star():
    """Per-timestep CE proposition: for the Bayes-optimal denoiser CE(gamma) = H(x | z_gamma) and, by
    I-MMSE, dCE/dgamma = w(gamma)/2, so along gamma* (l(t) = kappa) the CE is linear in t with slope
    kappa: R^2 > 0.999 and the fitted slope within 3% of kappa (measured from the MSE curve)."""
    o = OracleDenoiser(torch.tensor([0.4, 0.3, 0.2, 0.1]), random_unit_embeddings(4, 3, seed=1))
    tokens = [o.sample_tokens((512, 16), torch.Generator().manual_seed(0))]
    gg = np.linspace(-4.0, 6.0, 81)
    m = measure_at_gammas(
        lambda z, g: o(z, g), o.embedding_matrix(), tokens, torch.tensor(gg), torch.Generator().manual_seed(1)
    )
    opt = optimal_schedule(gg, m["mse"])
    t = np.linspace(0.0, 1.0, 17)
    ce = measure_at_gammas(
        lambda z, g: o(z, g),
        o.embedding_matrix(),
        tokens,
        torch.tensor(opt["gamma_star"](t)),
        torch.Generator().manual_seed(2),
    )["ce"]
    assert linear_r2(t, ce) > 0.999, linear_r2(t, ce)
    slope = np.polyfit(t, ce, 1)[0]
    assert slope == pytest.approx(opt["kappa"], rel=0.03), (slope, opt["kappa"])
