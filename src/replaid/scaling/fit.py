"""Scaling-law fits of an IsoFLOP study (paper sec. 4.3-4.4; Hoffmann et al. 2022).

Natural logarithms throughout. Per method and budget C, the paper's quadratic in log-log

    log L(N; C) = a_C (log N)^2 + b_C log N + c_C,   N*_C = exp(-b_C / 2a_C),   L*_C = L(N*_C; C);

per method the power laws ``log L*_C = alpha log C + beta`` and ``log N*_C = alpha' log C + beta'``,
fitted to the budgets whose minimum lies within the sizes run (bracketed; the others are reported
and warned about, not extrapolated) and where some size beats the unigram loss by two standard
errors (when the runs report it; before that a method has learned nothing its size could change);
the compute multiplier of method m against a reference r at reference compute C, the k with
``L*_m(k C) = L*_r(C)``:

    log k(C) = ((alpha_r - alpha_m) log C + beta_r - beta_m) / alpha_m,

summarised by its median (and range) over the fitted budget range; the parameter ratio
``N*_m(C) / N*_r(C)`` likewise (< 1: fewer parameters at equal compute). Chinchilla's approach 3,
``L(N, D) = E + A / N^a + B / D^b``, is fitted per method by L-BFGS on a Huber loss of log L from a
grid of starts; from it, the over-training crossover ("green line") of two methods: for each N the
training compute C_x at which both have the same loss, and C_x as a multiple of each method's own
compute-optimal compute at that N (the inverse of its N* law). Tokens and compute are linked per
method by ``C = kappa N D`` with kappa the median of the runs' FLOPs / (N D).

Intervals: a bootstrap that redoes every fit. Its noise is measured where the study has seed
replicates (runs of one (method, budget, N) with different ``train.seed``): each replicate resamples
a point's seeds with replacement and takes the mean log-loss; a method's points without replicates get
Gaussian noise of the pooled seed sd ``s^2 = sum_i sum_j (y_ij - ybar_i)^2 / sum_i (k_i - 1)``. A
method without any replicates gets *assumed* noise: the residual sd of its budget's quadratic (ddof = 3,
often one degree of freedom), or the evaluation's standard error where a budget has three sizes; the
report says which. Intervals are the 2.5 and 97.5 percentiles.

What the fits cannot tell is said, not turned into a finding: a parametric fit with a parameter
within ``BOUND_TOL`` of its box is *degenerate*, and a crossover from it is "not determined"; a
budget whose best run is its smallest (largest) size is an *edge minimum* whose N* is only bounded
(below the next size up, above the next size down); the N* ratio and the compute multiplier come with
their leave-one-budget-out range (each budget of the laws dropped in turn, everything refitted).
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaid.scaling.plan import results_table

LOG_TOL = 0.15  # budgets whose FLOPs lie within 15% (in log) are one IsoFLOP group
# The box of the parametric fit, per parameter of theta = (log A, log B, log E, a, b), and how close
# (a fraction of the box's width) a fitted parameter may come to an edge before the fit is degenerate.
THETA_NAMES = ("A", "B", "E", "a", "b")
THETA_BOUNDS = ((-10.0, 40.0), (-10.0, 40.0), (-5.0, 3.0), (0.0, 2.5), (0.0, 2.5))
BOUND_TOL = 1e-3
NEAR_TOL = 0.01  # fits from other starts whose Huber loss is within 1% of the best are "as good"


# ------------------------------------------------------------------ reading


def read_points(source: str | Path) -> list[dict[str, Any]]:
    """Rows ``{method, budget, flops, params, loss, tokens?, stderr?, unigram?}`` from a sweep folder or a CSV."""
    p = Path(source)
    if p.is_dir():
        rows = results_table(p)
        if not rows:
            raise ValueError(f"sweep {p} has no finished run yet; run 'replaid scaling run {p}' first")
        return _finite(rows, f"sweep {p}")
    if not p.is_file():
        raise FileNotFoundError(f"{p} is neither a sweep folder nor a CSV file; pass one made by 'replaid scaling'")
    try:
        with open(p, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8 text (byte {e.start}); pass a CSV file") from None
    need = {"method", "flops", "params", "loss"}
    if not rows or not need <= set(rows[0]):
        raise ValueError(
            f"{p} needs the columns method,flops,params,loss (optional tokens, budget, stderr, unigram, seed, "
            f"size, id); "
            f"it has {', '.join(rows[0]) if rows else 'no rows'}"
        )
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            d = {
                "method": r["method"],
                "flops": float(r["flops"]),
                "params": float(r["params"]),
                "loss": float(r["loss"]),
            }
            for k in ("tokens", "budget", "stderr", "unigram"):
                if r.get(k) not in (None, ""):
                    d[k] = float(r[k])
            if r.get("seed") not in (None, ""):
                d["seed"] = int(r["seed"])
        except ValueError:
            raise ValueError(f"{p} line {i}: flops, params, loss (and seed) must be numbers") from None
        for k in ("size", "id"):
            if r.get(k):
                d[k] = r[k]
        if d["flops"] <= 0 or d["params"] <= 0 or d["loss"] <= 0:
            raise ValueError(f"{p} line {i}: flops, params and loss must be positive")
        out.append(d)
    return _finite(out, str(p))


def _finite(rows: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """``rows``, refused when a number is NaN/Inf (a diverged run must not reach a fit)."""
    for i, r in enumerate(rows):
        bad = [k for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            name = r.get("id") or f"line {i + 2}"
            raise ValueError(
                f"{where} {name}: {bad[0]} is {r[bad[0]]} (not finite); drop or rerun that run before fitting"
            )
    return rows


def group_budgets(rows: list[dict[str, Any]]) -> list[float]:
    """Attach ``budget`` (nominal C) to rows without one: FLOPs within LOG_TOL share a group (its
    geometric mean). Returns the sorted budgets."""
    free = sorted((r for r in rows if "budget" not in r), key=lambda r: r["flops"])
    groups: list[list[dict[str, Any]]] = []
    for r in free:
        if groups and math.log(r["flops"]) - math.log(groups[-1][0]["flops"]) < LOG_TOL:
            groups[-1].append(r)
        else:
            groups.append([r])
    for g in groups:
        c = float(np.exp(np.mean([math.log(r["flops"]) for r in g])))
        for r in g:
            r["budget"] = float(f"{c:.3g}")
    return sorted({r["budget"] for r in rows})


# ------------------------------------------------------------------ per-budget quadratic


# the largest natural log whose exp is a finite float64 (exp(709.78) = 1.8e308)
LOG_FINITE = math.log(np.finfo(np.float64).max)


def isoflop_min(logn: np.ndarray, logl: np.ndarray) -> dict[str, Any]:
    """Quadratic in log-log; its minimum (NaN when the parabola opens downwards, and NaN with
    ``vertex_beyond`` set when it is so flat that its vertex N* or L* lies beyond the finite range:
    a degenerate fit, reported as such, never an OverflowError)."""
    a, b, c = np.polyfit(logn, logl, 2)
    if a <= 0:
        return {"a": a, "b": b, "c": c, "log_n_opt": math.nan, "log_l_opt": math.nan}
    x = -b / (2 * a)
    y = c - b * b / (4 * a)
    if not (abs(x) < LOG_FINITE and abs(y) < LOG_FINITE):
        return {"a": a, "b": b, "c": c, "log_n_opt": math.nan, "log_l_opt": math.nan, "vertex_beyond": float(x)}
    return {"a": a, "b": b, "c": c, "log_n_opt": x, "log_l_opt": y}


def linfit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept (the paper's power-law fit in log-log)."""
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return math.nan, math.nan
    s, i = np.polyfit(x[ok], y[ok], 1)
    return float(s), float(i)


def multiplier_curve(law_m: tuple[float, float], law_r: tuple[float, float], logc: np.ndarray) -> np.ndarray:
    """k(C) with L*_m(k C) = L*_r(C) for power laws (alpha, beta) of log L* in log C."""
    (am, bm), (ar, br) = law_m, law_r
    return np.exp(((ar - am) * logc + br - bm) / am)


# ------------------------------------------------------------------ Chinchilla approach 3


def _lse_model(theta: np.ndarray, logn: np.ndarray, logd: np.ndarray) -> np.ndarray:
    """log L(N, D) for theta = (log A, log B, log E, a, b)."""
    la, lb, le, a, b = theta
    out: np.ndarray = np.logaddexp(np.logaddexp(la - a * logn, lb - b * logd), le)
    return out


def fit_parametric(
    n: np.ndarray, d: np.ndarray, loss: np.ndarray, delta: float = 1e-3, init: np.ndarray | None = None
) -> dict[str, Any]:
    """``L = E + A/N^a + B/D^b`` by L-BFGS-B on the Huber loss of log L (Hoffmann et al.'s
    approach 3) from a grid of starts (or from ``init``). ``at_bound`` lists the parameters the box
    ``THETA_BOUNDS`` decides (in the best fit or in one as good): a non-empty list is a degenerate fit."""
    from scipy.optimize import minimize

    o = np.lexsort((d, n))  # the same optimum whatever the order of the runs
    logn, logd, logl = np.log(n)[o], np.log(d)[o], np.log(loss)[o]

    def obj(th: np.ndarray) -> tuple[float, np.ndarray]:  # Huber(log L_model - log L) and its exact gradient
        la, lb, le, a, b = th
        t = np.stack([la - a * logn, lb - b * logd, np.full_like(logn, le)])  # (3, n)
        m = np.logaddexp(np.logaddexp(t[0], t[1]), t[2])
        w = np.exp(t - m)  # softmax weights d m / d t_i
        r = m - logl
        ar = np.abs(r)
        h = np.where(ar <= delta, r, delta * np.sign(r))
        g = np.array([h @ w[0], h @ w[1], h @ w[2], -(h * w[0]) @ logn, -(h * w[1]) @ logd])
        return float(np.sum(np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta)))), g

    bounds = list(THETA_BOUNDS)
    if init is not None:
        starts = [init]
    else:
        le0 = math.log(max(loss.min() * 0.5, 1e-3))
        starts = [
            np.array([la, lb, le, a, b])
            for la in (0.0, 6.0, 12.0)
            for lb in (0.0, 6.0, 12.0)
            for le in (le0, le0 + 0.5)
            for a in (0.25, 0.7)
            for b in (0.25, 0.7)
        ]
    fits = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in starts:
            fits.append(minimize(obj, s, method="L-BFGS-B", jac=True, bounds=bounds))
    best = min(fits, key=lambda r: r.fun)
    la, lb, le, a, b = best.x
    # a parameter on its bound in the best fit, or in any start whose fit is as good (Huber within
    # NEAR_TOL): the data do not pin it, the box does
    hits = at_bounds(best.x)
    near = [h for r in fits if r.fun <= best.fun * (1 + NEAR_TOL) + 1e-15 for h in at_bounds(r.x) if h not in hits]
    hits += [f"an equally good fit (Huber loss within {NEAR_TOL:.0%}) has {h}" for h in dict.fromkeys(near)]
    if init is None and not any(h.startswith("E ") for h in hits):  # the profile at E's lower bound
        lo = THETA_BOUNDS[2][0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pins = {(*st[:2], lo, *st[3:]) for st in [best.x, *starts]}
            box = bounds[:2] + [(lo, lo)] + bounds[3:]
            pin = min(minimize(obj, np.array(st), method="L-BFGS-B", jac=True, bounds=box).fun for st in pins)
        if pin <= best.fun * (1 + NEAR_TOL):
            hits.append(
                f"E is not determined: pinned at its lower bound exp({lo:g}) the fit is as good (Huber loss within {NEAR_TOL:.0%})"
            )
    return {
        "E": math.exp(le),
        "A": math.exp(la),
        "B": math.exp(lb),
        "a": float(a),
        "b": float(b),
        "theta": [float(v) for v in best.x],
        "huber": float(best.fun),
        "at_bound": hits,
    }


def at_bounds(theta: Sequence[float] | np.ndarray) -> list[str]:
    """The parameters of theta = (log A, log B, log E, a, b) within ``BOUND_TOL`` x (box width) of
    an edge of ``THETA_BOUNDS``, e.g. "E sits on its lower bound exp(-5)": the optimiser stopped
    at the box, so the value is the box's, not the data's."""
    out = []
    for name, v, (lo, hi) in zip(THETA_NAMES, theta, THETA_BOUNDS, strict=True):
        for side, edge in (("lower", lo), ("upper", hi)):
            if abs(float(v) - edge) <= BOUND_TOL * (hi - lo):
                shown = f"exp({edge:g})" if name in ("A", "B", "E") else f"{edge:g}"
                out.append(f"{name} sits on its {side} bound {shown}")
    return out


def parametric_loss(p: dict[str, Any], n: float | np.ndarray, d: float | np.ndarray) -> Any:
    return p["E"] + p["A"] / np.power(n, p["a"]) + p["B"] / np.power(d, p["b"])


def crossover(
    pa: dict[str, Any],
    pb: dict[str, Any],
    kappa_a: float,
    kappa_b: float,
    npow_a: tuple[float, float],
    npow_b: tuple[float, float],
    n_grid: np.ndarray,
    logc_span: tuple[float, float] = (-5.0, 12.0),
) -> list[dict[str, Any]]:
    """For each N: the compute C_x at which methods A and B of equal size N reach equal loss
    (``L_A(N, C/(kappa_A N)) = L_B(N, C/(kappa_B N))``), and C_x over each one's compute-optimal
    compute at N (from ``log N* = alpha' log C + beta'``). Empty entries where no root lies within
    ``logc_span`` decades (log10) of that optimal compute."""
    from scipy.optimize import brentq

    out = []
    for n in n_grid:
        copt_a = math.exp((math.log(n) - npow_a[1]) / npow_a[0])
        copt_b = math.exp((math.log(n) - npow_b[1]) / npow_b[0])

        def diff(logc: float, n: float = n) -> float:  # binds this iteration's n (bugbear B023)
            c = math.exp(logc)
            return math.log(parametric_loss(pa, n, c / (kappa_a * n))) - math.log(
                parametric_loss(pb, n, c / (kappa_b * n))
            )

        lo = math.log(min(copt_a, copt_b)) + logc_span[0] * math.log(10)
        hi = math.log(max(copt_a, copt_b)) + logc_span[1] * math.log(10)
        grid = np.linspace(lo, hi, 400)
        cg = np.exp(grid)
        vals = np.log(parametric_loss(pa, n, cg / (kappa_a * n))) - np.log(parametric_loss(pb, n, cg / (kappa_b * n)))
        root = None
        sign = np.nonzero(np.diff(np.sign(vals)) != 0)[0]
        if len(sign):  # several crossings: the one nearest (in log C) the two compute optima
            mid = 0.5 * (math.log(copt_a) + math.log(copt_b))
            i = min(sign, key=lambda j: abs(grid[j] - mid))
            root = brentq(diff, grid[i], grid[i + 1])
        entry = {"params": float(n), "copt_a": copt_a, "copt_b": copt_b}
        if root is not None:
            cx = math.exp(root)
            entry.update(flops=cx, mult_a=cx / copt_a, mult_b=cx / copt_b, a_better_above=bool(diff(root + 0.1) < 0))
        out.append(entry)
    return out


# ------------------------------------------------------------------ the whole analysis


def _analyse(
    points: dict[str, dict[str, Any]],
    budgets: list[float],
    reference: str,
    logc_grid: np.ndarray,
    exclude: frozenset[tuple[str, float]] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """Per-budget minima, power laws and multipliers for perturbed or original log-losses;
    ``exclude``: (method, budget) pairs left out of the laws (at the unigram level)."""
    res: dict[str, dict[str, Any]] = {}
    for m, pts in points.items():
        mins: list[dict[str, Any] | None] = []
        for b in budgets:
            sel = pts["budget"] == b
            if sel.sum() < 3:
                mins.append(None)
                continue
            q = isoflop_min(pts["logn"][sel], pts["logl"][sel])
            x = pts["logn"][sel]
            q["bracketed"] = bool(np.isfinite(q["log_n_opt"]) and x.min() <= q["log_n_opt"] <= x.max())
            mins.append(q)
        # the laws use bracketed minima only: an extrapolated N*_C is the parabola's guess, not a measurement
        use = [q is not None and q["bracketed"] and (m, b) not in exclude for q, b in zip(mins, budgets, strict=True)]
        logc = np.array([math.log(b) for b, u in zip(budgets, use, strict=True) if u])
        ln = np.array([q["log_n_opt"] for q, u in zip(mins, use, strict=True) if u and q is not None])
        ll = np.array([q["log_l_opt"] for q, u in zip(mins, use, strict=True) if u and q is not None])
        res[m] = {"mins": mins, "loss_law": linfit(logc, ll), "param_law": linfit(logc, ln)}
    if reference in res:
        r = res[reference]
        for v in res.values():
            k = multiplier_curve(v["loss_law"], r["loss_law"], logc_grid)
            pr = np.exp((v["param_law"][0] - r["param_law"][0]) * logc_grid + v["param_law"][1] - r["param_law"][1])
            v["mult"], v["pratio"] = k, pr
    return res


def _ci(samples: Sequence[float | None]) -> list[float]:
    a = np.array([s for s in samples if s is not None and np.isfinite(s)])
    if len(a) < 10:
        return [math.nan, math.nan]
    return [float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))]


def _f(x: float | np.floating[Any] | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


@dataclass
class Noise:
    """Where one method's bootstrap noise comes from: ``scale`` (per point, the sd of the Gaussian
    draw of log L for points without seed replicates), ``pooled_sd`` (the seed replicates' pooled sd
    of log L, None without replicates), ``source`` (per budget, in words)."""

    scale: np.ndarray
    pooled_sd: float | None = None
    source: dict[float, str] = field(default_factory=dict)


def _points(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One point per (budget, N): log L is the mean over its seed replicates, ``seeds`` their log L."""
    groups: dict[tuple[float, int], list[dict[str, Any]]] = {}
    for r in rs:
        groups.setdefault((r["budget"], round(r["params"])), []).append(r)
    g = [groups[k] for k in sorted(groups)]
    seeds = [np.log([r["loss"] for r in grp]) for grp in g]
    mean: Callable[[str, list[dict[str, Any]]], float] = lambda key, grp: float(
        np.nanmean([r.get(key) or math.nan for r in grp])
    )
    logl = np.array([s.mean() for s in seeds])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of a point without stderr/unigram
        return {
            "budget": np.array([grp[0]["budget"] for grp in g]),
            "logn": np.log([grp[0]["params"] for grp in g]),
            "logl": logl,
            "loss": np.exp(logl),
            "params": np.array([grp[0]["params"] for grp in g], dtype=float),
            "flops": np.array([mean("flops", grp) for grp in g]),
            "tokens": np.array([np.mean([r.get("tokens", r["flops"] / (6 * r["params"])) for r in grp]) for grp in g]),
            "stderr": np.array([mean("stderr", grp) for grp in g]),
            "unigram": np.array([mean("unigram", grp) for grp in g]),
            "seeds": seeds,
            "n_seeds": np.array([len(s) for s in seeds]),
        }


def noise_model(p: dict[str, Any], mins: list[dict[str, Any] | None], budgets: list[float]) -> Noise:
    """The bootstrap's noise for one method's points ``p`` (see the module docstring): measured from
    seed replicates where they exist, else assumed from each budget's quadratic (``mins``)."""
    reps = [s for s in p["seeds"] if len(s) > 1]
    scale = np.zeros(len(p["logl"]))
    if reps:
        dof = sum(len(s) - 1 for s in reps)
        pooled = math.sqrt(sum(float(((s - s.mean()) ** 2).sum()) for s in reps) / dof)
        scale[:] = pooled
        noise = Noise(scale, pooled)
        for b in budgets:
            k = p["n_seeds"][p["budget"] == b]
            if not len(k):
                continue
            if (k > 1).all():
                noise.source[b] = f"measured: {k.min()}-{k.max()} seeds at each size, resampled"
            else:
                noise.source[b] = (
                    f"measured: seeds resampled at {int((k > 1).sum())} of {len(k)} sizes; the others drawn "
                    f"with the pooled seed sd {pooled:.4f} of log L ({dof} degrees of freedom)"
                )
        return noise
    noise = Noise(scale)
    for b, q in zip(budgets, mins, strict=True):
        sel = p["budget"] == b
        if q is None:
            continue
        x, y = p["logn"][sel], p["logl"][sel]
        if sel.sum() > 3:
            resid = y - np.polyval([q["a"], q["b"], q["c"]], x)
            scale[sel] = math.sqrt(float(resid @ resid) / (sel.sum() - 3))
            noise.source[b] = (
                f"assumed (no seed replicates): the residual sd of its quadratic, {int(sel.sum()) - 3} "
                "degree(s) of freedom"
            )
        else:
            se = p["stderr"][sel] / p["loss"][sel]
            scale[sel] = float(np.nanmean(se)) if np.isfinite(se).any() else 0.0
            noise.source[b] = "assumed (no seed replicates): the evaluation's standard error (3 sizes, no residual)"
    return noise


def draw(p: dict[str, Any], noise: Noise, rng: np.random.Generator) -> np.ndarray:
    """One bootstrap replicate of a method's log-losses: a point with seed replicates resamples them
    (with replacement) and takes their mean; the others get Gaussian noise of ``noise.scale``."""
    y: np.ndarray = p["logl"] + rng.standard_normal(len(p["logl"])) * noise.scale
    for i, s in enumerate(p["seeds"]):
        if len(s) > 1:
            y[i] = s[rng.integers(0, len(s), len(s))].mean()
    return y


def edge_minimum(logn: np.ndarray, logl: np.ndarray) -> tuple[str | None, list[Any] | None]:
    """Whether a budget's best run is its smallest or largest size; then N* is only bounded: a convex
    curve whose lowest point among the sizes is the smallest has its minimum below the next size up
    (``["<", N_2]``), and above the next size down for the largest (``[">", N_{k-1}]``)."""
    order = np.argsort(logn)
    i = int(np.argmin(logl[order]))
    if i == 0:
        return "smallest", ["<", float(math.exp(logn[order][1]))]
    if i == len(order) - 1:
        return "largest", [">", float(math.exp(logn[order][-2]))]
    return None, None


def _law_budgets(v: dict[str, Any], m: str, budgets: list[float], exclude: frozenset[tuple[str, float]]) -> list[float]:
    return [
        b for q, b in zip(v["mins"], budgets, strict=True) if q is not None and q["bracketed"] and (m, b) not in exclude
    ]


def leave_one_budget_out(
    points: dict[str, dict[str, Any]],
    budgets: list[float],
    reference: str,
    logc_grid: np.ndarray,
    flat: frozenset[tuple[str, float]],
    base: dict[str, dict[str, Any]],
    m: str,
) -> dict[str, Any]:
    """The N* ratio and compute multiplier of ``m`` against the reference (medians over ``logc_grid``)
    refitted with each budget of either one's laws dropped, and their range. Needs three budgets in
    both laws, so that two remain."""
    lm, lr = _law_budgets(base[m], m, budgets, flat), _law_budgets(base[reference], reference, budgets, flat)
    if len(lm) < 3 or len(lr) < 3:
        return {
            "computed": False,
            "reason": f"cannot be computed: it needs 3 budgets in the laws of both {m} and {reference} "
            f"(dropping one must leave 2 for a power law); {m} has {len(lm)}, {reference} {len(lr)}",
        }
    drops = []
    for b in sorted(set(lm) | set(lr)):
        r = _analyse(points, budgets, reference, logc_grid, flat | {(x, b) for x in points})
        drops.append(
            {
                "dropped": b,
                "compute_multiplier": _f(np.median(r[m]["mult"])),
                "param_ratio": _f(np.median(r[m]["pratio"])),
            }
        )

    def rng_(k: str) -> list[float | None]:
        v = [x for x in (d[k] for d in drops) if x is not None]
        return [min(v), max(v)] if v else [None, None]

    return {
        "computed": True,
        "drops": drops,
        "compute_multiplier_range": rng_("compute_multiplier"),
        "param_ratio_range": rng_("param_ratio"),
    }


def fit_points(
    rows: list[dict[str, Any]],
    reference: str = "ar",
    n_boot: int = 1000,
    seed: int = 0,
    crossover_pair: tuple[str, str] | None = None,
    n_boot_parametric: int = 100,
    parametric: bool = True,
) -> dict[str, Any]:
    """Every fit of the study; see the module docstring (``parametric=False``: no L(N, D) fit and
    no crossover). Returns a JSON-able dict. Phases: read the points, mark the budgets at the unigram
    level, fit (with the noise bootstrap), then per method the budgets, the laws and L(N, D)."""
    rows = [dict(r) for r in rows]
    budgets = group_budgets(rows)
    methods = sorted({r["method"] for r in rows}, key=lambda m: (m != reference, m))
    warn: list[str] = []
    points = {m: _points([r for r in rows if r["method"] == m]) for m in methods}
    if reference not in points:
        warn.append(f"reference method '{reference}' has no runs; compute multipliers are not computed")
    logc_grid = np.linspace(math.log(budgets[0]), math.log(budgets[-1]), 25)
    flat = _unigram_level(points, budgets, warn)
    base = _analyse(points, budgets, reference, logc_grid, flat)
    noise = {m: noise_model(points[m], base[m]["mins"], budgets) for m in methods}
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        pert = {m: {**p, "logl": draw(p, noise[m], rng)} for m, p in points.items()}
        boots.append(_analyse(pert, budgets, reference, logc_grid, flat))

    out: dict[str, Any] = {
        "reference": reference,
        "budgets": budgets,
        "log": "natural",
        "n_boot": n_boot,
        "methods": {},
        "warnings": warn,
    }
    for m in methods:
        per_budget = _budget_rows(m, base[m], points[m], budgets, boots, noise[m], flat, warn)
        mo = _laws(m, base[m], points[m], boots, noise[m], per_budget)
        if "mult" in base[m] and m != reference:
            mo["leave_one_budget_out"] = leave_one_budget_out(points, budgets, reference, logc_grid, flat, base, m)
        if parametric:
            par = _parametric(m, points[m], noise[m], flat, rng, n_boot_parametric, warn)
            if par is not None:
                mo["parametric"] = par
        out["methods"][m] = mo

    # the over-training crossover (green line)
    pair = crossover_pair or (("replaid", "mdlm") if {"replaid", "mdlm"} <= set(methods) else None)
    if pair and all(x in out["methods"] and "parametric" in out["methods"][x] for x in pair):
        out["crossover"] = _crossover_result(pair, out["methods"], points, warn)
    out["points"] = [
        {k: (float(v) if isinstance(v, (int, float, np.floating)) and k != "seed" else v) for k, v in r.items()}
        for r in rows
    ]
    for mo in out["methods"].values():
        mo.get("parametric", {}).pop("boot", None)
    return out


def _unigram_level(
    points: dict[str, dict[str, Any]], budgets: list[float], warn: list[str]
) -> frozenset[tuple[str, float]]:
    """The (method, budget) cells where no size beats the unigram loss by 2 standard errors: such a
    budget has learned nothing yet, its IsoFLOP "minimum" is noise around the unigram level, not a
    point of the scaling law."""
    flat: set[tuple[str, float]] = set()
    for m, p in points.items():
        for b in budgets:
            sel = p["budget"] == b
            if not sel.sum() or not np.isfinite(p["unigram"][sel]).all():
                continue
            i = np.flatnonzero(sel)[np.argmin(p["loss"][sel])]
            se = p["stderr"][i] if np.isfinite(p["stderr"][i]) else 0.0
            if p["loss"][i] >= p["unigram"][i] - 2 * se:
                flat.add((m, b))
                warn.append(
                    f"{m} at C={b:.3g}: no size beats the unigram loss ({p['unigram'][i]:.4f}) by 2 standard "
                    f"errors (best {p['loss'][i]:.4f} +- {se:.4f}); left out of the laws"
                )
    return frozenset(flat)


def _not_bracketed(q: dict[str, Any], lo: float, hi: float) -> str:
    """Why a budget's IsoFLOP minimum is not bracketed by the sizes run [exp(lo), exp(hi)], and which
    sizes to add."""
    beyond = q.get("vertex_beyond")
    if beyond is not None:
        why = (
            f"degenerate: the quadratic is nearly flat, its vertex N* = exp({beyond:.3g}) lies beyond the finite range"
        )
    elif not np.isfinite(q["log_n_opt"]):
        why = "the quadratic opens downwards"
    else:
        why = f"N* = {math.exp(q['log_n_opt']):.3g} lies outside the sizes run [{math.exp(lo):.3g}, {math.exp(hi):.3g}]"
    x_opt = beyond if beyond is not None else q["log_n_opt"]
    where = "sizes on both sides" if not np.isfinite(x_opt) else "smaller sizes" if x_opt < lo else "larger sizes"
    return f"minimum not bracketed ({why}); add {where}"


def _budget_rows(
    m: str,
    v: dict[str, Any],
    pts: dict[str, Any],
    budgets: list[float],
    boots: list[dict[str, Any]],
    noise: Noise,
    flat: frozenset[tuple[str, float]],
    warn: list[str],
) -> list[dict[str, Any]]:
    """Method ``m``'s IsoFLOP minimum per budget (``v``: its fit), with bootstrap intervals and warnings."""
    rows = []
    for i, (b, q) in enumerate(zip(budgets, v["mins"], strict=True)):
        sel = pts["budget"] == b
        if q is None:
            if sel.sum():
                warn.append(f"{m} at C={b:.3g}: only {int(sel.sum())} size(s); need 3 for the quadratic")
            continue
        bracketed = q["bracketed"]
        if not bracketed:
            warn.append(f"{m} at C={b:.3g}: " + _not_bracketed(q, pts["logn"][sel].min(), pts["logn"][sel].max()))
        edge, bound = edge_minimum(pts["logn"][sel], pts["logl"][sel])
        if edge and bound:
            in_laws = bracketed and (m, b) not in flat
            warn.append(
                f"{m} at C={b:.3g}: edge minimum: its best run is the {edge} size run, so N* is only "
                f"bounded (N* {bound[0]} {bound[1]:.3g})"
                + (
                    "; the quadratic's vertex still enters the laws (see the leave-one-budget-out range)"
                    if in_laws
                    else ""
                )
            )
        bq = [bt[m]["mins"][i] for bt in boots]
        k = pts["n_seeds"][sel]
        rows.append(
            {
                "budget": b,
                "n_opt": _f(math.exp(q["log_n_opt"]) if np.isfinite(q["log_n_opt"]) else math.nan),
                "n_opt_ci": _ci([math.exp(x["log_n_opt"]) if x and np.isfinite(x["log_n_opt"]) else None for x in bq]),
                "loss_opt": _f(math.exp(q["log_l_opt"]) if np.isfinite(q["log_l_opt"]) else math.nan),
                "loss_opt_ci": _ci(
                    [math.exp(x["log_l_opt"]) if x and np.isfinite(x["log_l_opt"]) else None for x in bq]
                ),
                "bracketed": bracketed,
                "at_unigram_level": (m, b) in flat,
                "edge_minimum": edge,
                "n_opt_bound": bound,
                "quad": [float(q["a"]), float(q["b"]), float(q["c"])],
                "sizes": int(sel.sum()),
                "seeds": [int(k.min()), int(k.max())],
                "noise": noise.source.get(b, ""),
                "noise_log": float(noise.scale[sel].mean()) if noise.pooled_sd is None or (k < 2).any() else None,
            }
        )
    return rows


def _laws(
    m: str,
    v: dict[str, Any],
    pts: dict[str, Any],
    boots: list[dict[str, Any]],
    noise: Noise,
    per_budget: list[dict[str, Any]],
) -> dict[str, Any]:
    """Method ``m``'s loss and parameter laws and its compute multiplier, with bootstrap intervals."""
    (al, be), (alp, bep) = v["loss_law"], v["param_law"]
    mo: dict[str, Any] = {
        "alpha": _f(al),
        "beta": _f(be),
        "alpha_prime": _f(alp),
        "beta_prime": _f(bep),
        "alpha_ci": _ci([bt[m]["loss_law"][0] for bt in boots]),
        "beta_ci": _ci([bt[m]["loss_law"][1] for bt in boots]),
        "alpha_prime_ci": _ci([bt[m]["param_law"][0] for bt in boots]),
        "beta_prime_ci": _ci([bt[m]["param_law"][1] for bt in boots]),
        "budgets": per_budget,
        "kappa": float(np.median(pts["flops"] / (pts["params"] * pts["tokens"]))),
        "noise_pooled_sd": noise.pooled_sd,
        "noise": (
            f"measured from seed replicates (pooled sd of log L {noise.pooled_sd:.4f})"
            if noise.pooled_sd is not None
            else "assumed: no seed replicates (residuals of each budget's quadratic, or the evaluation's standard error)"
        ),
    }
    if "mult" in v:
        km, pr = v["mult"], v["pratio"]
        mo.update(
            compute_multiplier=_f(np.median(km)),
            compute_multiplier_range=[_f(km.min()), _f(km.max())],
            compute_multiplier_ci=_ci([float(np.median(bt[m]["mult"])) for bt in boots]),
            param_ratio=_f(np.median(pr)),
            param_ratio_range=[_f(pr.min()), _f(pr.max())],
            param_ratio_ci=_ci([float(np.median(bt[m]["pratio"])) for bt in boots]),
        )
    return mo


def _parametric(
    m: str,
    pts: dict[str, Any],
    noise: Noise,
    flat: frozenset[tuple[str, float]],
    rng: np.random.Generator,
    n_boot: int,
    warn: list[str],
) -> dict[str, Any] | None:
    """Chinchilla approach 3 for method ``m``, on the points of the budgets past the unigram level, with
    ``n_boot`` noise-bootstrap refits; None with fewer than 5 points."""
    keep = np.array([(m, bb) not in flat for bb in pts["budget"]], dtype=bool)
    p = {k: pts[k][keep] for k in ("params", "tokens", "loss")}
    if len(p["loss"]) < 5:
        return None
    par = fit_parametric(p["params"], p["tokens"], p["loss"])
    sub = {**pts, "logl": pts["logl"][keep], "seeds": [s for s, k_ in zip(pts["seeds"], keep, strict=True) if k_]}
    sub_noise = Noise(noise.scale[keep], noise.pooled_sd)
    bs = [
        fit_parametric(p["params"], p["tokens"], np.exp(draw(sub, sub_noise, rng)), init=np.array(par["theta"]))
        for _ in range(n_boot)
    ]
    for k in THETA_NAMES:
        par[f"{k}_ci"] = _ci([q[k] for q in bs])
    par["degenerate"] = bool(par["at_bound"])
    par["boot_at_bound"] = float(np.mean([bool(q["at_bound"]) for q in bs])) if bs else None
    if par["degenerate"]:
        warn.append(f"{m}: the parametric L(N, D) fit is degenerate ({'; '.join(par['at_bound'])})")
    par["boot"] = [q["theta"] for q in bs]
    return par


def _crossover_result(
    pair: tuple[str, str], mos: dict[str, dict[str, Any]], points: dict[str, dict[str, Any]], warn: list[str]
) -> dict[str, Any]:
    """The crossover of ``pair`` with its verdict: "not determined" (and why) when a parameter law is
    missing or either L(N, D) fit is degenerate; else "found" or "none in the range searched"."""
    a, b = pair
    ma, mb = mos[a], mos[b]
    allp = np.concatenate([points[a]["params"], points[b]["params"]])
    n_grid = np.exp(np.linspace(np.log(allp.min()), np.log(allp.max()), 9))
    cx: dict[str, Any] = {"methods": [a, b], "line": [{"params": float(n)} for n in n_grid]}
    why = [
        f"{x}'s L(N, D) fit is degenerate: {'; '.join(mos[x]['parametric']['at_bound'])}"
        for x in pair
        if mos[x]["parametric"]["degenerate"]
    ]
    if None in (ma["alpha_prime"], mb["alpha_prime"]):
        why.append("a parameter law is missing")
    if why:
        cx.update(verdict="not determined", reason="; ".join(why))
        warn.append(f"crossover {a} vs {b}: not determined ({cx['reason']})")
        return cx
    law: Callable[[dict[str, Any]], tuple[float, float]] = lambda mo: (mo["alpha_prime"], mo["beta_prime"])
    cx["line"] = crossover(ma["parametric"], mb["parametric"], ma["kappa"], mb["kappa"], law(ma), law(mb), n_grid)
    found = [e for e in cx["line"] if "flops" in e]
    if not found:
        cx.update(verdict="none in the range searched")
        warn.append(f"crossover {a} vs {b}: the fitted L(N, D) curves do not cross in the range searched")
        return cx
    cx["verdict"] = "found"
    cx["mult_a_median"] = float(np.median([e["mult_a"] for e in found]))
    cx["mult_b_median"] = float(np.median([e["mult_b"] for e in found]))
    # interval: the same from the bootstrap parametric fits
    ka, kb = [], []
    nb = min(len(ma["parametric"]["boot"]), len(mb["parametric"]["boot"]))
    for i in range(nb):
        pa = _theta_to_p(ma["parametric"]["boot"][i])
        pb = _theta_to_p(mb["parametric"]["boot"][i])
        f = [e for e in crossover(pa, pb, ma["kappa"], mb["kappa"], law(ma), law(mb), n_grid) if "flops" in e]
        if f:
            ka.append(float(np.median([e["mult_a"] for e in f])))
            kb.append(float(np.median([e["mult_b"] for e in f])))
    cx["mult_a_ci"], cx["mult_b_ci"] = _ci(ka), _ci(kb)
    cx["boot_found"] = f"{len(ka)}/{nb}"
    return cx


def _theta_to_p(th: Sequence[float]) -> dict[str, Any]:
    la, lb, le, a, b = th
    return {"E": math.exp(le), "A": math.exp(la), "B": math.exp(lb), "a": a, "b": b}


# ------------------------------------------------------------------ output


def fmt_n_opt(q: dict[str, Any]) -> str:
    """A budget's N*: its value and interval, or for an edge minimum the bound (and the vertex)."""
    if q.get("edge_minimum"):
        op, v = q["n_opt_bound"]
        return f"{op} {v:.3g} (edge minimum at the {q['edge_minimum']} size; vertex {fmt(q['n_opt'])})"
    return f"{fmt(q['n_opt'])} {fmt_ci(q['n_opt_ci'])}"


def fmt_loo(loo: dict[str, Any] | None, key: str) -> str:
    """The leave-one-budget-out range of ``key`` (param_ratio or compute_multiplier), or why not."""
    if not loo:
        return "n/a"
    if not loo["computed"]:
        return "not computed"
    lo, hi = loo[f"{key}_range"]
    return f"{fmt(lo)}-{fmt(hi)}"


def crossover_text(cx: dict[str, Any]) -> str:
    """The crossover's verdict in one sentence."""
    a, b = cx["methods"]
    v = cx.get("verdict")
    if v == "not determined":
        return f"crossover {a} vs {b}: not determined ({cx['reason']})"
    if v == "found":
        return (
            f"crossover {a} vs {b}: {a} at {cx['mult_a_median']:.3g}x its optimal compute "
            f"{fmt_ci(cx['mult_a_ci'])} matches {b} at {cx['mult_b_median']:.3g}x {fmt_ci(cx['mult_b_ci'])}"
        )
    return f"crossover {a} vs {b}: the fitted L(N, D) curves do not cross in the range searched"


def summary_text(res: dict[str, Any]) -> str:
    lines = [f"reference: {res['reference']}   budgets: {', '.join(f'{b:.3g}' for b in res['budgets'])}"]
    for m, mo in res["methods"].items():
        lines.append(
            f"\n{m}: alpha = {fmt(mo['alpha'])} {fmt_ci(mo['alpha_ci'])}   "
            f"alpha' = {fmt(mo['alpha_prime'])} {fmt_ci(mo['alpha_prime_ci'])}   noise: {mo['noise']}"
        )
        for q in mo["budgets"]:
            lines.append(
                f"  C={q['budget']:.3g}: N* = {fmt_n_opt(q)}  "
                f"L* = {fmt(q['loss_opt'], 4)} {fmt_ci(q['loss_opt_ci'], 4)}"
                f"{'' if q['bracketed'] else '  (not bracketed)'}"
            )
        if "compute_multiplier" in mo:
            loo = mo.get("leave_one_budget_out")
            lines.append(
                f"  compute multiplier vs {res['reference']}: {fmt(mo['compute_multiplier'])} "
                f"{fmt_ci(mo['compute_multiplier_ci'])} (range over budgets "
                f"{fmt(mo['compute_multiplier_range'][0])}-{fmt(mo['compute_multiplier_range'][1])}; "
                f"leave one budget out {fmt_loo(loo, 'compute_multiplier')})   "
                f"N* ratio: {fmt(mo['param_ratio'])} {fmt_ci(mo['param_ratio_ci'])} "
                f"(leave one budget out {fmt_loo(loo, 'param_ratio')})"
            )
            if loo and not loo["computed"]:
                lines.append(f"  leave one budget out: {loo['reason']}")
        if "parametric" in mo:
            p = mo["parametric"]
            lines.append(
                f"  L(N,D) = {p['E']:.3g} + {p['A']:.3g}/N^{p['a']:.3g} + {p['B']:.3g}/D^{p['b']:.3g}"
                + (f"  DEGENERATE: {'; '.join(p['at_bound'])}" if p["degenerate"] else "")
            )
    if res.get("crossover"):
        lines.append("\n" + crossover_text(res["crossover"]))
    return "\n".join(lines)


def fmt(x: float | None, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{d}g}"


def fmt_ci(ci: Sequence[float | None] | None, d: int = 3) -> str:
    if not ci or any(c is None or not math.isfinite(c) for c in ci):
        return "[n/a]"
    return f"[{ci[0]:.{d}g}, {ci[1]:.{d}g}]"


def read_sources(sources: str | Path | Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of several sweeps or CSVs as one study. A run present in more than one (the same
    method, FLOPs, N and seed: a finished run copied into a second sweep) counts once; so does a
    repeated CSV row. Runs that differ only in ``seed`` are seed replicates of one point. Returns the
    rows and a note per duplicate left out."""
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, int, int, Any], dict[str, Any]] = {}
    notes: list[str] = []
    for src in [sources] if isinstance(sources, (str, Path)) else sources:
        for r in read_points(src):
            key = (r["method"], round(r["flops"]), round(r["params"]), r.get("seed", 0))
            if key in seen:
                if abs(seen[key]["loss"] - r["loss"]) > 1e-9:
                    raise ValueError(
                        f"{src}: {r['method']} with N={r['params']:.0f}, C={r['flops']:.4g} and seed "
                        f"{r.get('seed', 0)} is also "
                        f"in an earlier source with another loss ({seen[key]['loss']:.6f} vs "
                        f"{r['loss']:.6f}); keep one of the two runs, or give a replicate its own train.seed"
                    )
                notes.append(f"{r.get('id') or r['method']} appears in several sources; counted once")
                continue
            seen[key] = r
            rows.append(r)
    return rows, notes
