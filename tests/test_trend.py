"""replaid grid trend (issue 34 §2): a grid read at several step counts; the gap trend's slopes against
scipy's regression, its verdicts on planted gaps, and the per-step reports against the runs' own logs."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

from replaid.scaling.trend import gap_trend

T975_2 = 4.302652729911275  # t_{0.975, 2}


def test_gap_trend_slopes_equal_scipy_and_the_interval_is_the_t_interval():
    rng = np.random.default_rng(0)
    x = np.log10([1e12, 2e12, 4e12, 8e12])
    gaps = {k: (0.5 - 0.2 * (x - x[0]) + rng.normal(0, 0.01, 4)).tolist() for k in range(3)}
    g = gap_trend(x.tolist(), gaps)
    want = [stats.linregress(x, gaps[k]).slope for k in range(3)]
    assert g["slopes"] == pytest.approx(want, abs=1e-12)
    m, sd = np.mean(want), np.std(want, ddof=1)
    assert (g["slope_lo"], g["slope_hi"]) == pytest.approx(
        (m - T975_2 * sd / math.sqrt(3), m + T975_2 * sd / math.sqrt(3))
    )
    assert g["verdict"] == "shrinks" and not g["flips"]


@pytest.mark.parametrize(
    "start,slope,verdict",
    [
        (0.5, -0.1, "shrinks"),  # positive gap falling (to about 0.1)
        (0.5, +0.1, "grows"),
        (-0.5, +0.1, "shrinks"),  # negative gap rising towards 0
        (-0.5, -0.1, "grows"),
        (0.3, -0.3, "shrinks, flips sign"),  # +0.3 at the first budget, about -0.6 at the last
        (0.5, 0.0, "not determined"),
    ],
)
def test_gap_trend_verdicts_on_planted_gaps(start, slope, verdict):
    rng = np.random.default_rng(1)
    x = np.log10([1e12, 2e12, 4e12, 8e12, 1.6e13])
    gaps = {k: (start + slope * (x - x[0]) / 0.3 + rng.normal(0, 0.01, 5)).tolist() for k in range(3)}
    assert gap_trend(x.tolist(), gaps)["verdict"] == verdict


def test_gap_trend_not_fitted_on_too_few_points():
    assert gap_trend([12.0, 12.3], {0: [0.1, 0.2], 1: [0.1, 0.2]})["verdict"].startswith("not fitted")
    assert gap_trend([12.0, 12.3, 12.6], {0: [0.1, 0.2, 0.3]})["verdict"].startswith("not fitted")
    # two seeds: fitted, but no verdict (a difference takes its interval from 3 or more seeds)
    two = gap_trend([12.0, 12.3, 12.6], {0: [0.5, 0.4, 0.3], 1: [0.51, 0.41, 0.3]})
    assert "slope_mean" in two and two["verdict"].startswith("not determined (2 seeds")


@pytest.mark.slow
def test_grid_trend_end_to_end_reads_each_step_from_the_runs_logs(tmp_path, capsys):
    from replaid.cli import main

    g = tmp_path / "g"
    over = ["train.steps=6", "train.eval_every=2", "eval.max_batches=1", "train.log_every=2", "train.num_threads=1"]
    argv = ["grid", "plan", "--base", "debug", "--out", str(g), "--seeds", "2", "--reference", "ref"]
    argv += ["--cell", "ref", "--cell", "nosc", "model.self_conditioning=false", "--", *over]
    assert main(argv) == 0
    assert main(["grid", "run", str(g), "--python", "inprocess", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["grid", "trend", str(g), "--steps", "2", "4", "6", "--json", "--out", str(tmp_path / "t")]) == 0
    tr = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [p["step"] for p in tr["steps"]] == [2, 4, 6]
    for p in tr["steps"]:
        vals = {}
        for run in (g / "runs").iterdir():
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            ev = [r for r in rows if r["step"] == p["step"] and "eval/nelbo_nats_per_token" in r]
            vals[run.name] = ev[-1]["eval/nelbo_nats_per_token"]
        nosc = next(c for c in p["report"]["cells"] if c["cell"] == "nosc")
        assert nosc["paired"]["diffs"] == pytest.approx([vals[f"nosc__s{k}"] - vals[f"ref__s{k}"] for k in (0, 1)])
        cfg = json.loads((g / "configs" / "ref__s0.json").read_text())
        assert p["cells"]["ref"]["tokens"] == p["step"] * cfg["train"]["batch_size"] * cfg["data"]["seq_len"]
        assert 0 < p["cells"]["ref"]["passes"] < 10
    assert tr["gaps"]["nosc"]["points"] == 3 and len(tr["gaps"]["nosc"]["slopes"]) == 2
    assert (tmp_path / "t" / "trend.png").stat().st_size > 1000 and "| 6 | nosc |" in (
        tmp_path / "t" / "trend.md"
    ).read_text()
    counted = p["cells"]["ref"]["tokens"] / p["cells"]["ref"]["passes"]
    # a committed grid carries no tokenizer: its train split's size is given, and the passes follow it
    for run in (g / "runs").iterdir():
        shutil.rmtree(run / "tokenizer")
    assert main(["grid", "trend", str(g), "--steps", "6", "--json", "--out", str(tmp_path / "t")]) == 0
    bare = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert bare["steps"][0]["cells"]["ref"]["passes"] is None
    argv = ["grid", "trend", str(g), "--steps", "6", "--json", "--train-tokens", str(round(counted))]
    assert main([*argv, "--out", str(tmp_path / "t")]) == 0
    given = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert given["steps"][0]["cells"]["nosc"]["passes"] == pytest.approx(p["cells"]["nosc"]["passes"], rel=1e-6)
    assert main(["grid", "trend", str(g), "--steps", "3"]) == 2  # no evaluation logged at step 3
    assert main(["grid", "trend", str(g), "--steps", "60"]) == 2  # beyond the runs


def test_crossing_is_the_interpolated_last_sign_change():
    from replaid.scaling.trend import crossing

    assert crossing([1.0, 2.0, 3.0], [0.4, 0.1, -0.2]) == pytest.approx(2.0 + 0.1 / 0.3)
    assert crossing([1.0, 2.0, 3.0, 4.0], [0.4, -0.1, 0.1, -0.3]) == pytest.approx(3.0 + 0.1 / 0.4)  # the last one
    assert crossing([1.0, 2.0, 3.0], [0.4, 0.0, -0.2]) == 2.0
    assert crossing([1.0, 2.0, 3.0], [0.4, 0.2, 0.1]) is None
    x = [12.0, 12.3, 12.6, 12.9]
    g = gap_trend(x, {k: [0.3 + d, 0.1 + d, -0.1 + d, -0.3 + d] for k, d in enumerate((-0.02, 0.0, 0.02))})
    want = [crossing(x, [0.3 + d, 0.1 + d, -0.1 + d, -0.3 + d]) for d in (-0.02, 0.0, 0.02)]
    assert g["crossing_log10_flops"] == pytest.approx(want) and g["crossing_mean"] == pytest.approx(np.mean(want))
    assert "do not cross" in gap_trend(x, {0: [0.3, 0.2, 0.1, 0.05], 1: [0.3, 0.1, -0.1, -0.2]})["crossing"]
