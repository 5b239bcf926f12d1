"""Per-timestep diagnostics and the closed-form optimal noise schedule.

Paper section "Benefits of Learning the Noise Schedule" and appendix "Constant Per-Timestep
Diffusion Loss". All quantities are per token (length-normalised):

* per-timestep diffusion loss ``l(t) = 1/2 gamma'(t) w(gamma(t))``, ``w(gamma) = e^{-gamma} MSE(gamma)``,
  ``MSE = (1/L) sum_l ||e_hat^l - e^l||^2``;
* per-timestep CE (eq. ce-loss-per-t, one-shot decoding) ``-(1/L) sum_l log x_theta^l(z_t)[x^l]`` and the
  decoding error rate ``mean_l [argmax x_theta^l != x^l]``;
* the optimal schedule (eq. optimal-gamma) ``gamma*(t) = G^{-1}(2 kappa t)`` with
  ``G(gamma) = int_{gamma_0}^{gamma} w``, ``kappa = G(gamma_1) / 2``, under which
  ``l_{gamma*}(t) = kappa`` for all t (eq. optimal-per-timestep-diffusion).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.diffusion.denoiser import DenoiserOutput
from replaid.diffusion.nelbo import forward_noise
from replaid.model.replaid import denoise

if TYPE_CHECKING:
    from replaid.methods.replaid import ContinuousNet

Predict = Callable[[Tensor, Tensor], DenoiserOutput]  # (z, gamma) -> DenoiserOutput


@torch.no_grad()
def measure_at_gammas(
    predict: Predict,
    E: Tensor,
    batches: Iterable[Tensor],
    gammas: Tensor,
    generator: torch.Generator | None = None,
    advance: Callable[[int], None] | None = None,
) -> dict[str, np.ndarray]:
    """MSE, CE and error rate per token at each gamma (G,), averaged over token batches (B, L).

    ``predict(z, gamma)`` is the evaluation-time prediction (e.g. ``denoise(model, ...)`` with s.c.).
    ``advance(1)`` is called after each (batch, gamma) prediction (a progress bar's ``update``).
    Returns float64 arrays (G,): ``mse``, ``ce``, ``err``.
    """
    gammas = gammas.double().cpu()
    G = len(gammas)
    sums = {k: np.zeros(G) for k in ("mse", "ce", "err")}
    n_tok = 0
    dev = E.device
    for tokens in batches:
        tokens = tokens.to(dev)
        B, L = tokens.shape
        e = E[tokens].float()  # (B, L, d_e)
        for i in range(G):
            g = torch.full((B,), float(gammas[i]), dtype=torch.float64, device=dev)
            eps = torch.randn(e.shape, generator=generator).to(dev)
            out = predict(forward_noise(e, g, eps), g)
            logits, e_hat = out.logits.float(), out.e_hat.float()  # (B, L, V), (B, L, d_e)
            sums["mse"][i] += float(((e_hat - e) ** 2).sum(-1).double().sum())
            sums["ce"][i] += float(
                F.cross_entropy(logits.reshape(B * L, -1), tokens.reshape(-1), reduction="sum").double()
            )
            sums["err"][i] += float((logits.argmax(-1) != tokens).double().sum())
            if advance is not None:
                advance(1)
        n_tok += B * L
    if n_tok == 0:
        raise ValueError("no tokens to measure the per-timestep curves on")
    return {k: v / n_tok for k, v in sums.items()}


def optimal_schedule(gammas: npt.ArrayLike, mse: npt.ArrayLike, fine: int = 4097) -> dict[str, Any]:
    """Closed-form gamma* from MSE measured on an increasing gamma grid spanning [gamma_0, gamma_1].

    ``w = e^{-gamma} MSE`` is linearly interpolated on ``fine`` points, ``G`` is its cumulative
    trapezoid and ``gamma*(t) = G^{-1}(2 kappa t)`` by monotone (piecewise-linear) inversion.
    Returns ``kappa``, ``gamma_0``, ``gamma_1`` and callables ``gamma_star(t)``, ``w(gamma)``,
    ``loss_star(t)`` (the per-timestep diffusion loss under gamma*, numerically differentiated).
    """
    g = np.asarray(gammas, dtype=np.float64)
    m = np.asarray(mse, dtype=np.float64)
    if g.ndim != 1 or len(g) < 2 or np.any(np.diff(g) <= 0):
        raise ValueError("optimal_schedule needs an increasing gamma grid with at least 2 points")
    gf = np.linspace(g[0], g[-1], fine)
    wf = np.exp(-gf) * np.interp(gf, g, m)
    wf = np.maximum(wf, 1e-300)  # w > 0 keeps G strictly increasing
    Gf = np.concatenate([[0.0], np.cumsum(0.5 * (wf[1:] + wf[:-1]) * np.diff(gf))])
    kappa = 0.5 * Gf[-1]

    def w(gamma: npt.ArrayLike) -> np.ndarray:
        gamma = np.asarray(gamma, dtype=np.float64)
        out: np.ndarray = np.exp(-gamma) * np.interp(gamma, g, m)
        return out

    def gamma_star(t: npt.ArrayLike) -> np.ndarray:
        out: np.ndarray = np.interp(2 * kappa * np.clip(np.asarray(t, dtype=np.float64), 0, 1), Gf, gf)
        return out

    def loss_star(t: npt.ArrayLike, dt: float = 1e-4) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        lo, hi = np.clip(t - dt, 0, 1), np.clip(t + dt, 0, 1)
        dgs = (gamma_star(hi) - gamma_star(lo)) / (hi - lo)
        out: np.ndarray = 0.5 * dgs * w(gamma_star(t))
        return out

    return {
        "kappa": float(kappa),
        "gamma_0": float(g[0]),
        "gamma_1": float(g[-1]),
        "gamma_star": gamma_star,
        "w": w,
        "loss_star": loss_star,
    }


def linear_r2(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """R^2 of the least-squares line through (x, y)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    A = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    ss_res = float(((y - A @ coef) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def time_grid(n: int) -> np.ndarray:
    """``n`` midpoints ``(i + 1/2) / n`` in (0, 1)."""
    return (np.arange(n) + 0.5) / n


def diagnose_predictions(grid: int) -> int:
    """Predictions per batch of :func:`diagnose`: the t grid, then a gamma grid twice as fine."""
    return grid + 2 * grid - 1


@torch.no_grad()
def diagnose(
    model: ContinuousNet,
    batches: list[Tensor],
    grid: int = 33,
    self_cond: bool | None = None,
    seed: int = 0,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Per-timestep curves of a model with a learned schedule, and the closed-form gamma*.

    The model needs ``schedule(t) -> (gamma, gamma')`` and the denoiser interface; predictions use
    :func:`replaid.model.replaid.denoise` (self-conditioning as in evaluation). Returns
    ``{"t": {...arrays over the t grid}, "gamma": {...arrays over the gamma grid}, "summary": {...}}``.
    ``advance(1)`` is called after each of the ``len(batches) * diagnose_predictions(grid)`` predictions.
    """
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    E = model.embedding_matrix()
    predict = lambda z, g: denoise(model, z, g, self_cond)
    t = time_grid(grid)
    tt = torch.tensor(t, dtype=torch.float64, device=dev)
    gam, dgam = (x.double().cpu().numpy() for x in model.schedule(tt))
    ends = model.schedule(torch.tensor([0.0, 1.0], dtype=torch.float64, device=dev))[0].double().cpu().numpy()
    g0, g1 = float(ends[0]), float(ends[1])

    at_t = measure_at_gammas(predict, E, batches, torch.tensor(gam), gen, advance)
    loss_t = 0.5 * dgam * np.exp(-gam) * at_t["mse"]
    gg = np.linspace(g0, g1, diagnose_predictions(grid) - grid)
    at_g = measure_at_gammas(predict, E, batches, torch.tensor(gg), gen, advance)
    opt = optimal_schedule(gg, at_g["mse"])
    gstar = opt["gamma_star"](t)
    loss_star = opt["loss_star"](t)
    ce_star = np.interp(gstar, gg, at_g["ce"])
    err_star = np.interp(gstar, gg, at_g["err"])
    curves_t = {
        "t": t,
        "gamma": gam,
        "dgamma": dgam,
        "mse": at_t["mse"],
        "ce": at_t["ce"],
        "err": at_t["err"],
        "diffusion_loss": loss_t,
        "gamma_star": gstar,
        "diffusion_loss_star": loss_star,
        "ce_star": ce_star,
        "err_star": err_star,
    }
    curves_g = {"gamma": gg, "mse": at_g["mse"], "w": opt["w"](gg), "ce": at_g["ce"], "err": at_g["err"]}
    summary = {
        "gamma_0": g0,
        "gamma_1": g1,
        "kappa": opt["kappa"],
        "diffusion_loss_mean": float(loss_t.mean()),
        "diffusion_loss_std": float(loss_t.std()),
        "diffusion_loss_cv": float(loss_t.std() / abs(loss_t.mean())) if loss_t.mean() != 0 else float("nan"),
        "diffusion_loss_star_std": float(loss_star.std()),
        "ce_linear_r2": linear_r2(t, at_t["ce"]),
        "ce_star_linear_r2": linear_r2(t, ce_star),
        "err_linear_r2": linear_r2(t, at_t["err"]),
        "gamma_star_max_abs_dev": float(np.abs(gstar - gam).max()),
        "grid": grid,
        "tokens": int(sum(b.numel() for b in batches)),
        "self_conditioning": bool(model.self_conditioning if self_cond is None else self_cond),
    }
    summary["ce_near_linear"] = summary["ce_linear_r2"] >= 0.95
    return {"t": curves_t, "gamma": curves_g, "summary": summary}


def write_csv(path: str | os.PathLike[str], cols: Mapping[str, npt.ArrayLike]) -> None:
    keys = list(cols)
    rows = np.stack([np.asarray(cols[k], dtype=np.float64) for k in keys], 1)
    np.savetxt(path, rows, delimiter=",", header=",".join(keys), comments="", fmt="%.10g")


def plot_diagnostics(res: dict[str, Any], out_dir: str | os.PathLike[str], title: str = "") -> list[str]:
    """PNGs: diffusion loss (learned vs gamma*), CE, error rate and gamma(t) vs t, each titled with
    ``title`` (the run). Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    c = res["t"]
    out = Path(out_dir)
    specs = [
        (
            "diffusion_loss.png",
            "per-timestep diffusion loss (nats / token)",
            [("diffusion_loss", "learned gamma"), ("diffusion_loss_star", "closed-form gamma*")],
        ),
        ("ce.png", "per-timestep CE (nats / token)", [("ce", "learned gamma"), ("ce_star", "closed-form gamma*")]),
        ("error_rate.png", "decoding error rate", [("err", "learned gamma"), ("err_star", "closed-form gamma*")]),
        ("gamma.png", "gamma(t)", [("gamma", "learned gamma"), ("gamma_star", "closed-form gamma*")]),
    ]
    paths = []
    for name, ylabel, lines in specs:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for key, lab in lines:
            ax.plot(c["t"], c[key], marker=".", label=lab)
        if name == "diffusion_loss.png":
            ax.axhline(res["summary"]["kappa"], color="gray", ls=":", label="kappa")
        sub = f"linear-fit R^2 = {res['summary']['ce_linear_r2']:.3f}" if name == "ce.png" else ""
        ax.set_title("\n".join(x for x in (title, sub) if x), fontsize=9)
        ax.set_xlabel("t")
        ax.set_ylabel(ylabel)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        paths.append(str(out / name))
    return paths


def unit_interval(x: npt.ArrayLike) -> np.ndarray:
    """Min-max rescaling of ``x`` to [0, 1] (all zeros when ``x`` is constant)."""
    x = np.asarray(x, dtype=np.float64)
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def ce_overlay(curves: list[tuple[str, np.ndarray, np.ndarray]]) -> list[dict[str, Any]]:
    """Per-timestep CE curves of several runs made comparable (appendix "Near-Linear Per-Timestep CE for
    Diverse Embeddings"): ``t`` and ``CE(t)`` each rescaled to [0, 1], with the R^2 of a straight-line
    fit (affine-invariant, so equal to the raw curve's). ``curves``: (label, t, ce) triples."""
    out = []
    for label, t, ce in curves:
        t01, ce01 = unit_interval(t), unit_interval(ce)
        out.append(
            {
                "label": label,
                "t": t01,
                "ce": ce01,
                "r2": linear_r2(t01, ce01),
                "ce_min": float(np.min(ce)),
                "ce_max": float(np.max(ce)),
            }
        )
    return out


def plot_ce_overlay(items: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot([0, 1], [0, 1], color="gray", ls=":", lw=0.8, label="linear")
    for i, it in enumerate(items):
        ax.plot(it["t"], it["ce"], marker=".", color=f"C{i % 10}", label=f"{it['label']} (R^2 = {it['r2']:.3f})")
    ax.set_xlabel("t (normalised to [0, 1])")
    ax.set_ylabel("per-timestep CE (normalised to [0, 1])")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
