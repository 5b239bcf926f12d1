"""ODE-based likelihood: the gamma-space PFODE, Hutchinson divergence and the K-IWAE bound.

Paper appendix "ODE-based Likelihood Estimation":

* gamma-space PFODE (eq. ode-pfode-gamma): ``dz/dgamma = 1/2 (alpha^2 z - alpha x_theta(z, gamma) E)``.
* log-weight (eq. ode-logweight-gamma), written here with every constant:

      log w = log p(x | z_0) + log p(z_0) - log q(z_0 | x)
      log p(x | z_0) = sum_l log x_theta^l(z_0, gamma_0)[x_l]
      log p(z_0)     = -(L d_e / 2) log 2pi - 1/2 ||z_1||^2 + int_{gamma_0}^{gamma_1} div v dgamma
      -log q(z_0|x)  = (L d_e / 2) log 2pi + (L d_e / 2) log sigma_0^2 + ||z_0 - alpha_0 e||^2 / (2 sigma_0^2)

  The two ``log 2pi`` terms cancel, which gives the paper's formula. ``log p(z_0) = log p(z_1) +
  int div`` because ``d/dgamma log p_gamma(z(gamma)) = -div v`` along the forward ODE.
* K-IWAE (eq. ode-iwae): ``log p(x) >= E log (1/K) sum_k w^(k)``, ``z_0^(k) ~ q(z_0|x)``.
* self-conditioning (section "Self-conditioning and the Chain-rule Trace"): the drift at z uses
  ``e_sc(z) = x_theta(z, gamma, 0) E``. ``selfcond_correction=True`` recomputes ``e_sc`` at every
  perturbed state (the divergence of the composition, eq. ode-selfcond-divergence);
  ``False`` caches it at the unperturbed state (LangFlow's estimator, drops the chain-rule term).

* Hutchinson noise and the IWAE: the log-weight carries the zero-mean noise ``n`` of the
  Hutchinson estimate of ``int div``; ``log w`` stays unbiased (K = 1) but the log-mean-exp over K
  samples is biased upward (towards a lower NLL). With ``n_hutch >= 2`` the sample variance of the
  probes at each drift evaluation gives ``s^2 = Var(n)`` per sample (Heun: ``sum (dg/2)^2 (v_a + v_b)``);
  the delta method gives the bias of ``log (1/K) sum_k w_k``:
  ``E[LME(l + n)] - LME(l) ~ 1/2 sum_k s_k^2 (w~_k - w~_k^2)``, ``w~ = softmax(l)``
  (:func:`iwae_noise_bias`; 0 at K = 1, ``s^2/2 (1 - 1/K)`` for equal weights).

Token masks are not supported: every position of ``tokens`` is scored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from replaid.config import MAX_SOLVER_STEPS, ODE_TOL_MIN
from replaid.diffusion.denoiser import Denoiser, DenoiserOutput, alpha_sigma

if TYPE_CHECKING:
    from replaid.methods.replaid import ContinuousNet

LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------------------------------------
# drift and divergence
# ---------------------------------------------------------------------------------------------
def _ab(gamma: Tensor) -> tuple[Tensor, Tensor]:
    """(alpha, sigma) as (B, 1, 1) float64."""
    a, s = alpha_sigma(gamma.double())
    return a.view(-1, 1, 1), s.view(-1, 1, 1)


class PFODE:
    """The gamma-space PFODE drift of a denoiser, with or without self-conditioning.

    ``self_cond=None`` follows ``denoiser.self_conditioning``. ``nfe`` counts denoiser calls.
    """

    def __init__(self, denoiser: Denoiser, self_cond: bool | None = None, selfcond_correction: bool = True) -> None:
        self.den = denoiser
        self.sc = bool(denoiser.self_conditioning if self_cond is None else self_cond)
        self.correction = selfcond_correction
        self.nfe = 0
        self.last_div_var: Tensor | None = None  # (B,) variance of the last divergence estimate

    def _call(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None) -> DenoiserOutput:
        self.nfe += 1
        return self.den(z.float(), gamma.double(), e_sc)

    def self_cond_input(self, z: Tensor, gamma: Tensor) -> Tensor | None:
        """``e_sc(z) = x_theta(z, gamma, 0) E`` (the bootstrap pass), or None without s.c."""
        return self._call(z, gamma, None).e_hat if self.sc else None

    def predict(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None, use_cached: bool = False) -> DenoiserOutput:
        """Evaluation-time prediction; ``use_cached`` reuses the given ``e_sc`` instead of recomputing."""
        if self.sc and not use_cached:
            e_sc = self.self_cond_input(z, gamma)
        return self._call(z, gamma, e_sc if self.sc else None)

    def drift(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None, use_cached: bool = False) -> Tensor:
        """``1/2 (alpha^2 z - alpha x_theta E)`` (eq. ode-pfode-gamma), (B, L, d_e) in z's dtype."""
        e_hat = self.predict(z, gamma, e_sc, use_cached).e_hat
        a, _ = _ab(gamma)
        return (0.5 * (a**2 * z.double() - a * e_hat.double())).to(z.dtype)

    @torch.no_grad()
    def drift_and_div(
        self,
        z: Tensor,
        gamma: Tensor,
        n_hutch: int = 1,
        probe: str = "rademacher",
        jvp: str = "fd",
        h: float = 1e-3,
        generator: torch.Generator | None = None,
        probes: Sequence[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Drift (B, L, d_e) and Hutchinson estimate of its divergence (B,) float64 at (z, gamma);
        ``probes`` fixes the Hutchinson vectors (an adaptive solver needs a deterministic drift)."""
        e_sc = self.self_cond_input(z, gamma)
        v = self.drift(z, gamma, e_sc, use_cached=True)
        if self.sc and self.correction:
            f = lambda zz: self.drift(zz, gamma)
        else:
            f = lambda zz: self.drift(zz, gamma, e_sc, use_cached=True)
        div, self.last_div_var = hutchinson_divergence_and_var(f, z, n_hutch, probe, jvp, h, generator, probes)
        return v, div


def draw_probe(
    shape: tuple[int, ...], probe: str, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """Rademacher (+-1) or standard Gaussian probe with ``E[xi xi^T] = I``."""
    if probe == "rademacher":
        xi = torch.randint(0, 2, shape, generator=generator).to(torch.float64) * 2 - 1
    elif probe == "gaussian":
        xi = torch.randn(shape, generator=generator, dtype=torch.float64)
    else:
        raise ValueError(f"unknown Hutchinson probe {probe!r}; use rademacher or gaussian")
    return xi.to(device=device, dtype=dtype)


def hutchinson_divergence(
    f: Callable[[Tensor], Tensor],
    z: Tensor,
    n_hutch: int = 1,
    probe: str = "rademacher",
    jvp: str = "fd",
    h: float = 1e-3,
    generator: torch.Generator | None = None,
    probes: Sequence[Tensor] | None = None,
) -> Tensor:
    """``mean_j xi_j^T (df/dz) xi_j`` per row (B,) float64 (Hutchinson's estimator).

    ``jvp="fd"``: central difference ``(f(z + h xi) - f(z - h xi)) / 2h``; ``jvp="autograd"``:
    ``torch.func.jvp``. The divergence is over all non-batch dims of z (B, ...). ``probes``: given
    vectors (each shaped like z) instead of ``n_hutch`` fresh draws.
    """
    return hutchinson_divergence_and_var(f, z, n_hutch, probe, jvp, h, generator, probes)[0]


def hutchinson_divergence_and_var(
    f: Callable[[Tensor], Tensor],
    z: Tensor,
    n_hutch: int = 1,
    probe: str = "rademacher",
    jvp: str = "fd",
    h: float = 1e-3,
    generator: torch.Generator | None = None,
    probes: Sequence[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`hutchinson_divergence` and the estimated variance of that mean, ``S^2 / n`` with ``S^2``
    the sample variance of the n per-probe values (B,) float64 (NaN when n = 1)."""
    B = z.shape[0]
    if probes is not None:
        n_hutch = len(probes)
    vals = []
    for j in range(n_hutch):
        xi = (
            probes[j].to(z.dtype)
            if probes is not None
            else draw_probe(tuple(z.shape), probe, generator, z.device, z.dtype)
        )
        if jvp == "fd":
            jv = (f(z + h * xi).double() - f(z - h * xi).double()) / (2 * h)
        elif jvp == "autograd":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):  # forward AD needs the math SDPA
                jv = torch.func.jvp(f, (z,), (xi,))[1]
            jv = jv.detach().double()
        else:
            raise ValueError(f"unknown jvp mode {jvp!r}; use fd or autograd")
        vals.append((xi.double() * jv).reshape(B, -1).sum(1))
    v = torch.stack(vals)  # (n, B)
    var = v.var(0) / n_hutch if n_hutch > 1 else torch.full((B,), float("nan"), dtype=torch.float64, device=z.device)
    return v.mean(0), var


# ---------------------------------------------------------------------------------------------
# log-weights
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def ode_log_weight(
    denoiser: Denoiser,
    tokens: Tensor,
    gamma_0: float,
    gamma_1: float,
    *,
    steps: int = 128,
    n_hutch: int = 1,
    probe: str = "rademacher",
    jvp: str = "fd",
    h: float = 1e-3,
    self_cond: bool | None = None,
    selfcond_correction: bool = True,
    generator: torch.Generator | None = None,
    ode: PFODE | None = None,
    solver: str = "heun",
    rtol: float = 1e-5,
    atol: float = 1e-5,
    max_steps: int = MAX_SOLVER_STEPS,
    callback: Callable[[float], None] | None = None,
) -> dict[str, Tensor]:
    """One importance sample per row: ``log w`` (eq. ode-logweight-gamma) for tokens (B, L).

    ``solver="heun"``: Heun2 on a uniform gamma grid of ``steps`` steps from gamma_0 to gamma_1,
    fresh Hutchinson probes at every drift evaluation. ``solver="dopri5"``: torchdiffeq's adaptive
    Dormand-Prince (``rtol``, ``atol`` in [ODE_TOL_MIN, 1], at most ``max_steps`` accepted or rejected
    steps per solve; beyond it a ValueError says so) on the augmented state (z, int div) in float64, with the
    probes fixed per row for the whole solve (FFJORD) so the drift is deterministic. Returns float64
    (B,) tensors ``log_w``, ``log_px_z0``, ``log_q``, ``log_pz1``, ``div_int`` (the log-weight's pieces)
    and ``div_var``, the estimated variance of ``div_int``'s Hutchinson noise (Heun with
    ``n_hutch >= 2``; NaN otherwise).
    ``callback(frac)`` reports the fraction of the gamma path solved (after each Heun step, or at each
    dopri5 evaluation beyond the furthest gamma reached so far).
    """
    ode = ode or PFODE(denoiser, self_cond, selfcond_correction)
    E = denoiser.embedding_matrix()
    dev = E.device
    tokens = tokens.to(dev)
    B, L = tokens.shape
    e = E[tokens].double()  # (B, L, d_e)
    d_e = e.shape[-1]
    g0 = torch.full((B,), float(gamma_0), dtype=torch.float64, device=dev)
    a0, s0 = _ab(g0)
    eps = torch.randn(e.shape, generator=generator, dtype=torch.float64).to(dev)
    z0 = (a0 * e + s0 * eps).float()  # (B, L, d_e) ~ q(z_0 | x)

    logits = ode.predict(z0, g0).logits  # (B, L, V)
    log_px_z0 = torch.log_softmax(logits.double(), -1).gather(-1, tokens[..., None]).squeeze(-1).sum(1)
    n = L * d_e
    log_q = (
        -0.5 * n * LOG_2PI
        - 0.5 * n * torch.log(s0.view(-1) ** 2)
        - ((z0.double() - a0 * e) ** 2).reshape(B, -1).sum(1) / (2 * s0.view(-1) ** 2)
    )

    div_var = torch.full((B,), float("nan"), dtype=torch.float64, device=dev)
    if solver == "heun":
        z, div_int, div_var = _solve_heun(
            ode, z0, gamma_0, gamma_1, steps, callback, n_hutch=n_hutch, probe=probe, jvp=jvp, h=h, generator=generator
        )
    elif solver == "dopri5":
        probes = [draw_probe(tuple(z0.shape), probe, generator, dev, torch.float64) for _ in range(n_hutch)]
        z, div_int = _solve_adaptive(
            ode, z0, gamma_0, gamma_1, rtol, atol, callback, max_steps=max_steps, probes=probes, jvp=jvp, h=h
        )
    else:
        raise ValueError(f"unknown ODE solver {solver!r}; use heun or dopri5")
    log_pz1 = -0.5 * n * LOG_2PI - 0.5 * (z.double() ** 2).reshape(B, -1).sum(1)
    log_w = log_px_z0 + log_pz1 + div_int - log_q
    return {
        "log_w": log_w,
        "log_px_z0": log_px_z0,
        "log_q": log_q,
        "log_pz1": log_pz1,
        "div_int": div_int,
        "div_var": div_var,
    }


def _solve_heun(
    ode: PFODE,
    z0: Tensor,
    gamma_0: float,
    gamma_1: float,
    steps: int,
    callback: Callable[[float], None] | None = None,
    **kw: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Heun2 from gamma_0 to gamma_1: (z(gamma_1), int div dgamma (B,) float64, its noise variance (B,)).
    The probes of the two evaluations of every step are independent, so the variances add."""
    B, dev = z0.shape[0], z0.device
    grid = torch.linspace(float(gamma_0), float(gamma_1), steps + 1, dtype=torch.float64)
    z, div_int = z0, torch.zeros(B, dtype=torch.float64, device=dev)
    div_var = torch.zeros(B, dtype=torch.float64, device=dev)
    for i in range(steps):
        ga, gb = grid[i].item(), grid[i + 1].item()
        dg = gb - ga
        va, da = ode.drift_and_div(z, torch.full((B,), ga, dtype=torch.float64, device=dev), **kw)
        var_a = ode.last_div_var
        z_pred = z + dg * va
        vb, db = ode.drift_and_div(z_pred, torch.full((B,), gb, dtype=torch.float64, device=dev), **kw)
        z = (z.double() + 0.5 * dg * (va.double() + vb.double())).to(z0.dtype)
        div_int += 0.5 * dg * (da + db)
        var_b = ode.last_div_var
        assert var_a is not None and var_b is not None  # drift_and_div sets them
        div_var += (0.5 * dg) ** 2 * (var_a + var_b)
        if callback is not None:
            callback((i + 1) / steps)
    return z, div_int, div_var


def _solve_adaptive(
    ode: PFODE,
    z0: Tensor,
    gamma_0: float,
    gamma_1: float,
    rtol: float,
    atol: float,
    callback: Callable[[float], None] | None = None,
    max_steps: int = MAX_SOLVER_STEPS,
    **kw: Any,
) -> tuple[Tensor, Tensor]:
    """torchdiffeq dopri5 on (z, int div) in float64 with fixed probes (``kw["probes"]``): at most
    ``max_steps`` steps (accepted or rejected), else a ValueError naming the budget; tolerances below
    :data:`~replaid.config.ODE_TOL_MIN` (what float64 resolves) are refused before the solve."""
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not (math.isfinite(tol) and ODE_TOL_MIN <= tol <= 1):
            raise ValueError(
                f"--{name} {tol:g}: must be in [{ODE_TOL_MIN:g}, 1]; the float64 solve cannot resolve a smaller "
                f"tolerance (its step size underflows)"
            )
    if int(max_steps) < 1:
        raise ValueError(f"--max-solver-steps {max_steps}: must be >= 1")
    try:
        from torchdiffeq import odeint
    except ImportError:
        raise ValueError("--solver dopri5 needs torchdiffeq: pip install torchdiffeq") from None
    B, dev = z0.shape[0], z0.device
    reached = [0.0]

    def f(g: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        frac = (float(g) - float(gamma_0)) / (float(gamma_1) - float(gamma_0))
        if callback is not None and frac > reached[0]:
            reached[0] = frac
            callback(min(frac, 1.0))
        v, div = ode.drift_and_div(state[0], g.to(torch.float64).expand(B), **kw)
        return v.double(), div

    y0 = (z0.double(), torch.zeros(B, dtype=torch.float64, device=dev))
    ts = torch.tensor([float(gamma_0), float(gamma_1)], dtype=torch.float64, device=dev)
    try:
        zs, divs = odeint(f, y0, ts, rtol=rtol, atol=atol, method="dopri5", options={"max_num_steps": int(max_steps)})
    except AssertionError as e:  # torchdiffeq's own checks: the step budget, a step size that underflows
        if "max_num_steps" not in str(e) and "underflow" not in str(e):
            raise
        what = "ran out of its step budget" if "max_num_steps" in str(e) else "needed a step below float64's resolution"
        raise ValueError(
            f"the dopri5 solve {what} after reaching {reached[0]:.1%} of the gamma path "
            f"(--max-solver-steps {int(max_steps)}, --rtol {rtol:g}, --atol {atol:g}); loosen --rtol/--atol, "
            f"raise --max-solver-steps, or use --solver heun"
        ) from None
    return zs[-1].to(z0.dtype), divs[-1]


def ode_log_weights(
    denoiser: Denoiser,
    tokens: Tensor,
    gamma_0: float,
    gamma_1: float,
    K: int = 1,
    batch_size: int = 16,
    progress: Callable[[int, int], None] | None = None,
    generator: torch.Generator | None = None,
    return_var: bool = False,
    **kw: Any,
) -> tuple[Tensor, int] | tuple[Tensor, int, Tensor]:
    """Log-weights (N, K) float64 (CPU) of K importance samples per sequence of tokens (N, L),
    computed ``batch_size`` rows at a time. Returns ``(log_w, nfe)`` (and, with ``return_var``, the
    Hutchinson noise variances (N, K) of the log-weights); ``kw`` go to :func:`ode_log_weight`.
    ``progress(rows_done, rows)`` is called as each batch's solve advances (fractional rows done)."""
    ode = PFODE(denoiser, kw.pop("self_cond", None), kw.pop("selfcond_correction", True))
    N = tokens.shape[0]
    rows = tokens.repeat_interleave(K, 0)  # (N K, L): row n K + k is sample k of sequence n
    out, var = [], []
    for i in range(0, rows.shape[0], batch_size):
        b = min(batch_size, rows.shape[0] - i)
        step = None if progress is None else (lambda frac, i=i, b=b: progress(i + b * frac, rows.shape[0]))
        r = ode_log_weight(
            denoiser, rows[i : i + b], gamma_0, gamma_1, ode=ode, generator=generator, callback=step, **kw
        )
        out.append(r["log_w"].cpu())
        var.append(r["div_var"].cpu())
        if progress is not None:
            progress(i + b, rows.shape[0])
    if return_var:
        return torch.cat(out).view(N, K), ode.nfe, torch.cat(var).view(N, K)
    return torch.cat(out).view(N, K), ode.nfe


# ---------------------------------------------------------------------------------------------
# IWAE K-curve
# ---------------------------------------------------------------------------------------------
def iwae(log_w: Tensor) -> Tensor:
    """``log (1/K) sum_k w_k`` over the last dim (eq. ode-iwae), float64."""
    log_w = log_w.double()
    return torch.logsumexp(log_w, -1) - math.log(log_w.shape[-1])


def iwae_noise_bias(log_w: Tensor, noise_var: Tensor) -> Tensor:
    """Delta-method upward bias of ``log (1/K) sum_k w_k`` (last dim) caused by independent zero-mean
    noise of variance ``noise_var`` on each log-weight: ``1/2 sum_k s_k^2 (w~_k - w~_k^2)``,
    ``w~ = softmax(log_w)``. 0 for K = 1; ``s^2/2 (1 - 1/K)`` for equal weights. float64, shape[:-1]."""
    wt = torch.softmax(log_w.double(), -1)
    return 0.5 * (noise_var.double() * (wt - wt**2)).sum(-1)


def iwae_bias_curve(log_w: Tensor, noise_var: Tensor, L: int, Ks: Sequence[int]) -> dict[int, float]:
    """Per-token Hutchinson bias of the K-IWAE (groups mode, as :func:`iwae_curve`): the amount by
    which the reported NLL of each K is *too low*, ``mean_n mean_groups bias / L``. NaN without variances."""
    N, Kmax = log_w.shape
    out = {}
    for K in Ks:
        G = Kmax // K
        b = iwae_noise_bias(log_w[:, : G * K].reshape(N, G, K), noise_var[:, : G * K].reshape(N, G, K))
        out[int(K)] = float(b.mean()) / L
    return out


def iwae_curve(
    log_w: Tensor,
    L: int,
    Ks: Sequence[int] | None = None,
    mode: str = "groups",
    n_subsets: int = 32,
    generator: torch.Generator | None = None,
) -> dict[int, dict[str, float]]:
    """Per-token NLL of the K-IWAE for K in ``Ks`` (default 1, 2, 4, ... <= K_max) from log-weights (N, K_max).

    ``mode="groups"``: average the K-IWAE over the K_max // K disjoint groups of each sequence;
    ``"random"``: over ``n_subsets`` random K-subsets. Returns ``{K: {nats, stderr, ppl}}`` with
    ``nats = -mean_n iwae_n / L`` and its standard error over sequences.
    """
    N, Kmax = log_w.shape
    if Ks is None:
        Ks = [2**i for i in range(int(math.log2(Kmax)) + 1)]
    res = {}
    for K in Ks:
        if K > Kmax:
            raise ValueError(f"K={K} exceeds the {Kmax} log-weights per sequence")
        if mode == "groups":
            G = Kmax // K
            per_seq = iwae(log_w[:, : G * K].reshape(N, G, K)).mean(1)  # (N,)
        elif mode == "random":
            idx = torch.stack([torch.randperm(Kmax, generator=generator)[:K] for _ in range(n_subsets)])  # (S, K)
            per_seq = iwae(log_w[:, idx]).mean(1)
        else:
            raise ValueError(f"unknown subsampling mode {mode!r}; use groups or random")
        nll = -per_seq / L
        se = float(nll.std() / math.sqrt(N)) if N > 1 else float("nan")
        res[int(K)] = {"nats": float(nll.mean()), "stderr": se, "ppl": math.exp(float(nll.mean()))}
    return res


def fit_inverse_k(curve: dict[int, dict[str, float]], k_min: int = 4) -> dict[str, Any]:
    """Least-squares fit of the per-token NLL to ``a + b / K`` on K >= k_min (all K if fewer than 2).

    Returns ``a`` (the K -> inf asymptote), ``b``, ``ppl_inf = exp(a)`` and the K's used."""
    Ks = sorted(curve)
    use = [k for k in Ks if k >= k_min]
    if len(use) < 2:
        use = Ks
    y = torch.tensor([curve[k]["nats"] for k in use], dtype=torch.float64)
    if len(use) < 2:
        a, b = float(y[0]), 0.0
    else:
        X = torch.stack([torch.ones(len(use), dtype=torch.float64), 1.0 / torch.tensor(use, dtype=torch.float64)], 1)
        sol = torch.linalg.lstsq(X, y[:, None]).solution.view(-1)
        a, b = float(sol[0]), float(sol[1])
    return {"a": a, "b": b, "ppl_inf": math.exp(a), "fit_K": use}


def plot_k_curve(
    curve: dict[int, dict[str, float]],
    fit: dict[str, Any] | None = None,
    path: str = "kcurve.png",
    nelbo_nats: float | None = None,
    title: str = "ODE K-IWAE",
    sequences: int | None = None,
) -> None:
    """PNG of per-token NLL and PPL vs K (log2 axis) with the a + b/K fit and a NELBO line.

    Error bars: +-1 standard error of the mean over the scored sequences (``curve[K]["stderr"]``), i.e.
    sequence-to-sequence spread; every K uses the same sequences, so differences between K are much
    more precise than the bars. The legend and this explanation sit below the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ks = sorted(curve)
    y = [curve[k]["nats"] for k in Ks]
    se = [curve[k]["stderr"] if math.isfinite(curve[k]["stderr"]) else 0.0 for k in Ks]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
    for ax, tr, lab in ((axes[0], lambda v: v, "NLL (nats / token)"), (axes[1], math.exp, "PPL")):
        ax.errorbar(
            Ks,
            [tr(v) for v in y],
            yerr=[tr(v) * s if tr is math.exp else s for v, s in zip(y, se, strict=True)],
            marker="o",
            capsize=3,
            label="K-IWAE (bars: +-1 s.e. over sequences)",
        )
        if fit is not None:
            kk = torch.logspace(0, math.log10(max(Ks) * 2), 100).tolist()
            ax.plot(
                kk,
                [tr(fit["a"] + fit["b"] / k) for k in kk],
                ":",
                label=f"a + b/K fit (PPL_inf = {fit['ppl_inf']:.3g})",
            )
        if nelbo_nats is not None:
            ax.axhline(tr(nelbo_nats), color="gray", ls="--", label="VDM NELBO")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel(lab)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False)
    n = f"the {sequences} scored sequences" if sequences else "the scored sequences"
    fig.text(
        0.5,
        0.075,
        f"error bars: +-1 standard error of the mean over {n} (the same sequences at every K, "
        "so the K-to-K differences are more precise than the bars)",
        ha="center",
        fontsize=8,
        color="0.3",
    )
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class LikelihoodResult:
    log_w: Tensor  # (N, K) float64
    L: int
    curve: dict[int, dict[str, float]] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    nfe: int = 0
    seconds: float = 0.0
    noise_var: Tensor | None = None  # (N, K) Hutchinson noise variance of each log-weight

    def summary(self) -> dict[str, Any]:
        Ks = sorted(self.curve)
        bias = (
            iwae_bias_curve(self.log_w, self.noise_var, self.L, Ks)
            if self.noise_var is not None and bool(torch.isfinite(self.noise_var).all())
            else None
        )
        return {
            "hutchinson_bias_nats": None if bias is None else {str(k): v for k, v in bias.items()},
            "hutchinson_logw_std": (
                None if bias is None or self.noise_var is None else float(self.noise_var.clamp_min(0).sqrt().mean())
            ),
            "nats_per_token_bias_corrected": (
                None if bias is None else {str(k): self.curve[k]["nats"] + bias[k] for k in Ks}
            ),
            "ppl_K1": self.curve[Ks[0]]["ppl"],
            "ppl_Kmax": self.curve[Ks[-1]]["ppl"],
            "K_max": Ks[-1],
            "nats_per_token": {str(k): self.curve[k]["nats"] for k in Ks},
            "stderr_nats": {str(k): self.curve[k]["stderr"] for k in Ks},
            "ppl": {str(k): self.curve[k]["ppl"] for k in Ks},
            "fit_a": self.fit["a"],
            "fit_b": self.fit["b"],
            "fit_K": self.fit["fit_K"],
            "ppl_inf": self.fit["ppl_inf"],
            "nfe": self.nfe,
            "seconds": self.seconds,
            "sequences": int(self.log_w.shape[0]),
            "seq_len": self.L,
        }


def estimate_likelihood(
    denoiser: Denoiser,
    tokens: Tensor,
    gamma_0: float,
    gamma_1: float,
    K: int = 1,
    batch_size: int = 16,
    seed: int = 0,
    subsample: str = "groups",
    **kw: Any,
) -> LikelihoodResult:
    """Log-weights, K-curve and ``a + b/K`` fit for tokens (N, L); ``kw`` go to :func:`ode_log_weight`."""
    t0 = time.time()
    gen = torch.Generator().manual_seed(seed)
    log_w, nfe, var = cast(
        tuple[Tensor, int, Tensor],
        ode_log_weights(
            denoiser,
            tokens,
            gamma_0,
            gamma_1,
            K,
            batch_size,
            generator=gen,
            progress=kw.pop("progress", None),
            return_var=True,
            **kw,
        ),
    )
    L = tokens.shape[1]
    curve = iwae_curve(log_w, L, mode=subsample, generator=gen)
    return LikelihoodResult(log_w, L, curve, fit_inverse_k(curve), nfe, time.time() - t0, var)


def schedule_endpoints(model: ContinuousNet) -> tuple[float, float]:
    """``(gamma(0), gamma(1))`` of a continuous model's ``schedule(t) -> (gamma, gamma')``."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        g, _ = model.schedule(torch.tensor([0.0, 1.0], dtype=torch.float64, device=dev))
    return float(g[0]), float(g[1])
