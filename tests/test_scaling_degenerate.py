"""Scaling fits that say when they cannot tell (issue 22 sec. 5): a parametric fit pinned on its box
is degenerate and its crossover "not determined"; an edge minimum bounds N* only; the leave-one-budget-
out range of the N* ratio and compute multiplier (and when it cannot be computed); the bootstrap's
noise from seed replicates, against a direct resampling."""

import csv
import math

import numpy as np
import pytest

from replaid.scaling import fit as sf
from replaid.scaling import report

BUDGETS = [1e17, 3e17, 1e18, 3e18]


def _chinchilla_rows(method: str, E: float, A: float, a: float, B: float, b: float, seed: int = 0) -> list[dict]:
    """An IsoFLOP study drawn from ``L = E + A/N^a + B/D^b`` with D = C / (6 N): per budget, seven
    sizes around the size of lowest loss (found on a dense grid), 0.1% noise on L."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in BUDGETS:
        grid = np.geomspace(1e5, 1e11, 4000)
        n_opt = grid[np.argmin(E + A / grid**a + B / (c / (6 * grid)) ** b)]
        for n in n_opt * np.exp(np.linspace(-1.5, 1.5, 7)):
            d = c / (6 * n)
            loss = (E + A / n**a + B / d**b) * math.exp(0.001 * rng.standard_normal())
            rows.append({"method": method, "flops": c, "params": float(n), "loss": loss, "tokens": d})
    return rows


def _quadratic_rows(method, budgets, x0s, curv=0.08, c0=1.5, sizes=None, seeds=None, spread=0.0):
    """Rows with log L = curv (log N - x0_C)^2 + c0 - 0.05 log10(C) exactly at each size's seed mean;
    ``seeds`` replicates per size deviate by ``spread`` x a fixed standardised pattern (mean 0, sd 1)."""
    rows = []
    z = None
    if seeds:
        z = np.linspace(-1.0, 1.0, seeds)
        z = (z - z.mean()) / z.std(ddof=1)
    for c, x0 in zip(budgets, x0s, strict=True):
        for j, x in enumerate(sizes if sizes is not None else np.linspace(x0 - 1.2, x0 + 1.2, 7)):
            mean = curv * (x - x0) ** 2 + c0 - 0.05 * math.log10(c)
            devs = [0.0] if z is None else list(spread * np.roll(z, j))
            for s, dv in enumerate(devs):
                rows.append(
                    {"method": method, "flops": c, "params": math.exp(x), "loss": math.exp(mean + dv), "seed": s}
                )
    return rows


# ------------------------------------------------------------------ a pinned E


def test_a_fit_on_its_lower_bound_of_E_is_degenerate_and_the_crossover_not_determined(tmp_path):
    """MDLM's law has E = 0: the fit can only put E on its box's lower edge exp(-5). That fit is
    flagged, and the crossover it would have produced reads "not determined" with the reason; with a
    real E (Hoffmann et al.'s law for both) the fits are not degenerate and a verdict is reached."""
    good = _chinchilla_rows("replaid", 1.69, 406.4, 0.34, 410.7, 0.28, seed=1)
    pinned = _chinchilla_rows("mdlm", 0.0, 406.4, 0.34, 410.7, 0.28, seed=2)
    res = sf.fit_points(good + pinned, reference="replaid", n_boot=20, n_boot_parametric=5)
    pm = res["methods"]["mdlm"]["parametric"]
    assert pm["degenerate"] and "E sits on its lower bound exp(-5)" in pm["at_bound"]
    assert pm["E"] == pytest.approx(math.exp(-5), rel=1e-6)
    assert not res["methods"]["replaid"]["parametric"]["degenerate"]
    cx = res["crossover"]
    assert cx["verdict"] == "not determined"
    assert "mdlm" in cx["reason"] and "exp(-5)" in cx["reason"] and "replaid" not in cx["reason"]
    assert "mult_a_median" not in cx and not any("flops" in e for e in cx["line"])
    assert any("degenerate" in w and w.startswith("mdlm") for w in res["warnings"])
    md = report.report_markdown(res, "synthetic")
    assert "**Verdict**: crossover replaid vs mdlm: not determined (mdlm's L(N, D) fit is degenerate" in md
    assert "| mdlm |" in md and "**yes**: E sits on its lower bound exp(-5)" in md
    assert sf.crossover_text(cx) in sf.summary_text(res)

    # control: the same study with a real E for MDLM -> not degenerate, a verdict other than "not determined"
    real = _chinchilla_rows("mdlm", 1.9, 300.0, 0.34, 600.0, 0.28, seed=2)
    res = sf.fit_points(good + real, reference="replaid", n_boot=20, n_boot_parametric=5)
    assert not res["methods"]["mdlm"]["parametric"]["degenerate"]
    assert res["methods"]["mdlm"]["parametric"]["E"] == pytest.approx(1.9, rel=0.1)
    assert res["crossover"]["verdict"] in ("found", "none in the range searched")


def test_at_bounds_names_each_parameter_on_its_box():
    lo = [b[0] for b in sf.THETA_BOUNDS]
    assert sf.at_bounds([5.0, 5.0, -5.0, 0.3, 0.3]) == ["E sits on its lower bound exp(-5)"]
    assert sf.at_bounds([5.0, 5.0, 0.0, 2.5, 0.3]) == ["a sits on its upper bound 2.5"]
    assert sf.at_bounds([5.0, 5.0, -5.0 + 0.02, 0.3, 0.3]) == []  # 0.02 > 1e-3 x 8: off the bound
    assert len(sf.at_bounds(lo)) == 5


# ------------------------------------------------------------------ edge minima


def test_an_edge_minimum_is_flagged_and_its_n_star_reported_as_a_bound():
    """Budget 1e18's sizes start at its optimum (the best run is the smallest size): N* is only
    below the next size up. Budget 3e18's sizes end at its optimum: N* is above the next size down."""
    xs = np.linspace(-1.2, 1.2, 7)
    rows = _quadratic_rows("ar", BUDGETS[:2], [14.0, 14.5])
    rows += _quadratic_rows("ar", [1e18], [15.0], sizes=15.0 + np.abs(xs) + 0.05)  # best: smallest size
    rows += _quadratic_rows("ar", [3e18], [15.5], sizes=15.5 - np.abs(xs) - 0.05)  # best: largest size
    rows = [r for i, r in enumerate(rows) if r["params"] not in {x["params"] for x in rows[:i]}]
    res = sf.fit_points(rows, reference="ar", n_boot=20, parametric=False)
    q = {b["budget"]: b for b in res["methods"]["ar"]["budgets"]}
    assert q[1e17]["edge_minimum"] is None and q[1e17]["n_opt_bound"] is None
    sizes = lambda c: sorted(r["params"] for r in rows if r["flops"] == c)
    assert q[1e18]["edge_minimum"] == "smallest"
    assert q[1e18]["n_opt_bound"] == ["<", pytest.approx(sizes(1e18)[1], rel=1e-12)]
    assert q[3e18]["edge_minimum"] == "largest"
    assert q[3e18]["n_opt_bound"] == [">", pytest.approx(sizes(3e18)[-2], rel=1e-12)]
    assert any("ar at C=1e+18: edge minimum" in w and "N* <" in w for w in res["warnings"])
    md = report.report_markdown(res, "synthetic")
    assert f"< {sizes(1e18)[1]:.3g} (edge minimum at the smallest size" in md
    assert f"> {sizes(3e18)[-2]:.3g} (edge minimum at the largest size" in md


# ------------------------------------------------------------------ leave one budget out


def test_leave_one_budget_out_matches_a_refit_and_says_when_it_cannot_be_computed():
    """Four budgets: dropping a middle one gives what a fit without its runs gives (same span of C);
    the range spans every drop. One budget: the laws and the range cannot be computed, and the
    report says so."""
    x_ar = [10.0, 10.6, 11.0, 11.7]  # N* ratio changes with the budget, so every drop moves it
    x_md = [9.4, 9.9, 10.5, 10.8]
    rows = _quadratic_rows("ar", BUDGETS, x_ar) + _quadratic_rows("mdlm", BUDGETS, x_md, c0=1.7)
    res = sf.fit_points(rows, reference="ar", n_boot=20, parametric=False)
    loo = res["methods"]["mdlm"]["leave_one_budget_out"]
    assert loo["computed"] and [d["dropped"] for d in loo["drops"]] == BUDGETS
    rest = sf.fit_points([r for r in rows if r["flops"] != 3e17], reference="ar", n_boot=0, parametric=False)
    d = next(d for d in loo["drops"] if d["dropped"] == 3e17)
    assert d["param_ratio"] == pytest.approx(rest["methods"]["mdlm"]["param_ratio"], rel=1e-9)
    assert d["compute_multiplier"] == pytest.approx(rest["methods"]["mdlm"]["compute_multiplier"], rel=1e-9)
    prs = [d["param_ratio"] for d in loo["drops"]]
    assert loo["param_ratio_range"] == [min(prs), max(prs)] and min(prs) < max(prs)
    assert "leave_one_budget_out" not in res["methods"]["ar"]
    md = report.report_markdown(res, "synthetic")
    assert "### Leave one budget out" in md and f"| 3e+17 | {d['param_ratio']:.3g} |" in md

    two = [r for r in rows if r["flops"] in (1e17, 1e18)]  # a law from 2 budgets; dropping one leaves 1
    loo = sf.fit_points(two, reference="ar", n_boot=0, parametric=False)["methods"]["mdlm"]["leave_one_budget_out"]
    assert not loo["computed"] and "mdlm has 2, ar 2" in loo["reason"]

    one = [r for r in rows if r["flops"] == 1e18]
    res = sf.fit_points(one, reference="ar", n_boot=20, parametric=False)
    loo = res["methods"]["mdlm"]["leave_one_budget_out"]
    assert not loo["computed"] and loo["reason"].startswith("cannot be computed")
    assert "mdlm has 1, ar 1" in loo["reason"]
    assert res["methods"]["mdlm"]["param_ratio"] is None
    assert f"- mdlm: {loo['reason']}." in report.report_markdown(res, "synthetic")
    assert "not computed" in sf.summary_text(res)


# ------------------------------------------------------------------ the bootstrap's noise


def _direct_width(rows, n_boot, rng) -> float:
    """The 95% interval width of L* from resampling each size's seeds directly (one budget)."""
    by = {}
    for r in rows:
        by.setdefault(r["params"], []).append(math.log(r["loss"]))
    ns = sorted(by)
    x = np.log(ns)
    ys = [np.array(by[n]) for n in ns]
    out = []
    for _ in range(n_boot):
        y = np.array([s[rng.integers(0, len(s), len(s))].mean() for s in ys])
        a, b, c = np.polyfit(x, y, 2)
        out.append(math.exp(c - b * b / (4 * a)))
    lo, hi = np.percentile(out, [2.5, 97.5])
    return float(hi - lo)


def test_the_bootstrap_resamples_seed_replicates_and_its_interval_tracks_their_spread(tmp_path):
    """Five seeds per size whose means lie exactly on a parabola: the quadratic's residuals are zero,
    so noise taken from them would give a zero-width interval. Resampling the seeds gives the width a
    direct resampling gives, and twice the spread gives twice the width."""
    s = 0.01
    rows = _quadratic_rows("ar", [1e18], [11.0], seeds=5, spread=s)
    res = sf.fit_points(rows, reference="ar", n_boot=2000, seed=3, parametric=False)
    q = res["methods"]["ar"]["budgets"][0]
    assert q["seeds"] == [5, 5] and q["noise"].startswith("measured: 5-5 seeds")
    assert res["methods"]["ar"]["noise"].startswith("measured from seed replicates")
    devs = [math.log(r["loss"]) for r in rows]
    pooled = math.sqrt(
        sum(np.var(devs[i : i + 5], ddof=1) * 4 for i in range(0, len(devs), 5)) / (4 * (len(devs) // 5))
    )
    assert res["methods"]["ar"]["noise_pooled_sd"] == pytest.approx(pooled, rel=1e-9)
    assert pooled == pytest.approx(s, rel=1e-9)
    width = q["loss_opt_ci"][1] - q["loss_opt_ci"][0]
    direct = _direct_width(rows, 2000, np.random.default_rng(0))
    assert width == pytest.approx(direct, rel=0.15)
    assert width > 0.002  # residual noise would give ~0
    res2 = sf.fit_points(
        _quadratic_rows("ar", [1e18], [11.0], seeds=5, spread=2 * s),
        reference="ar",
        n_boot=2000,
        seed=3,
        parametric=False,
    )
    q2 = res2["methods"]["ar"]["budgets"][0]
    assert q2["loss_opt_ci"][1] - q2["loss_opt_ci"][0] == pytest.approx(2 * width, rel=0.05)

    # without replicates the noise is assumed, and said to be
    one = sf.fit_points([r for r in rows if r["seed"] == 0], reference="ar", n_boot=50, parametric=False)
    assert one["methods"]["ar"]["noise"].startswith("assumed")
    assert one["methods"]["ar"]["budgets"][0]["noise"].startswith("assumed (no seed replicates)")

    # a CSV with a seed column: replicates are kept, an exact repeat counts once
    path = tmp_path / "reps.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "seed"])
        w.writeheader()
        w.writerows(rows + rows[:1])
    got, notes = sf.read_sources(path)
    assert len(got) == len(rows) and len(notes) == 1 and {r["seed"] for r in got} == set(range(5))
