"""The over-training crossover measured from runs (issue 34 §3; ``replaid.scaling.overtrain``): planted
curves with a known crossing, pairing by seed against a hand computation, and the command on a CSV."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from replaid.cli import main
from replaid.scaling import overtrain as ot


def _rows(method: str, budgets: list[float], law, seeds=(0, 1, 2), noise=(0.0, 0.01, -0.01)) -> list[dict]:
    return [
        {"method": method, "flops": c, "params": 4e4, "loss": law(c) + noise[s], "seed": s, "tokens": c / 4e5}
        for c in budgets
        for s in seeds
    ]


def line(a: float, slope: float):
    """A loss linear in log10 FLOPs: a + slope * log10(C / 1e11)."""
    return lambda c: a + slope * math.log10(c / 1e11)


def test_planted_curves_cross_where_the_lines_do_and_the_factors_follow():
    # A starts higher and falls faster: 6 - 0.5 x = 5 - 0.2 x at x = 10/3, C = 1e11 * 10^(10/3)
    rows = _rows("a", [1e12, 3e12, 1e13, 3e13, 1e14, 3e14, 1e15], line(6, -0.5))
    rows += _rows("b", [1e11, 3e11, 1e12, 3e12, 1e13, 3e13, 1e14, 3e14, 1e15], line(5, -0.2))
    res = ot.overtrain(rows, {"a": 1e12, "b": 1e11}, "a", "b")
    x = 1e11 * 10 ** (10 / 3)
    assert res["crossing_flops"] == pytest.approx(x, rel=1e-9)
    assert res["factors"] == pytest.approx({"a": x / 1e12, "b": x / 1e11}, rel=1e-9)
    assert res["verdict"].startswith("a crosses b")
    first = res["a_minus_b_at_a"][0]  # at 1e12: 5.5 - 4.8 = +0.7 on every seed (the same noise per seed)
    assert first["mean"] == pytest.approx(0.7) and first["verdict"] == "higher"


def test_no_crossing_is_not_reached_and_names_the_side():
    rows = _rows("a", [2e12, 6e12, 9e12], line(6.0, -0.1))
    rows += _rows("b", [5e11, 1.5e12, 4.3e12], line(5.6, -0.5))
    res = ot.overtrain(rows, {"a": 2e12, "b": 5e11}, "a", "b")
    assert res["crossing_flops"] is None and res["factors"] is None
    assert res["verdict"].startswith("not reached") and "stays above b" in res["verdict"]
    assert "higher)" in res["verdict"]  # b - a at b's last budget, read as a - b: a higher
    assert res["overlap"] == pytest.approx([2e12, 4.3e12])
    # model-free: a at 2e12 against b's largest budget at no more compute, 1.5e12; a at 6e12 and 9e12: 4.3e12
    dom = res["a_at_more_compute"]
    assert [(p["flops"], p["b_flops"]) for p in dom] == [(2e12, 1.5e12), (6e12, 4.3e12), (9e12, 4.3e12)]
    want = line(6.0, -0.1)(2e12) - line(5.6, -0.5)(1.5e12)
    assert dom[0]["diffs"] == pytest.approx([want] * 3) and dom[0]["verdict"] == "a above b"


def test_differences_are_paired_by_seed_against_the_other_curve_interpolated_in_log_flops():
    rng = np.random.default_rng(0)
    rows = []
    for s in range(3):
        for c in (1e12, 4e12):
            rows.append({"method": "a", "flops": c, "params": 1.0, "loss": float(5 + rng.normal(0, 0.1)), "seed": s})
        for c in (5e11, 2e12, 8e12):
            rows.append({"method": "b", "flops": c, "params": 1.0, "loss": float(4 + rng.normal(0, 0.1)), "seed": s})
    got = ot.compare(rows, "a", "b")
    assert [p["flops"] for p in got] == [1e12, 4e12]
    for p in got:
        want = []
        for s in range(3):
            la = next(r["loss"] for r in rows if r["method"] == "a" and r["seed"] == s and r["flops"] == p["flops"])
            (f0, l0), (f1, l1) = (
                sorted((r["flops"], r["loss"]) for r in rows if r["method"] == "b" and r["seed"] == s)[:2]
                if p["flops"] < 2e12
                else sorted((r["flops"], r["loss"]) for r in rows if r["method"] == "b" and r["seed"] == s)[1:]
            )
            w = (math.log(p["flops"]) - math.log(f0)) / (math.log(f1) - math.log(f0))
            want.append(la - (l0 + w * (l1 - l0)))
        assert p["diffs"] == pytest.approx(want, abs=1e-12)
        assert p["mean"] == pytest.approx(np.mean(want))
    assert ot.interp_log([(1e12, 1.0), (1e13, 2.0)], 1e14) is None  # outside: no extrapolation


def test_a_method_on_the_unigram_plateau_makes_the_verdict_not_determined():
    rows = [{**r, "unigram": 6.0} for r in _rows("a", [2e12, 6e12], line(5.95, -0.1))]
    rows += [{**r, "unigram": 6.0} for r in _rows("b", [5e11, 1.5e12, 4.3e12], line(5.6, -0.5))]
    res = ot.overtrain(rows, {"a": 2e12, "b": 5e11}, "a", "b")
    assert [p["on_plateau"] for p in res["budgets"]["a"]] == [True, True]
    assert (
        res["budgets"]["b"][0]["below_unigram"] == pytest.approx(6.0 - line(5.6, -0.5)(5e11))
        and not res["budgets"]["b"][0]["on_plateau"]
    )
    assert res["verdict"].startswith("not determined: a is on the unigram plateau")
    # a's last budget off the plateau (0.5 below the unigram bound), above b with more compute: read
    rows += [
        {"method": "a", "flops": 9e12, "params": 4e4, "loss": 5.5 + d, "seed": k, "unigram": 6.0}
        for k, d in enumerate((0.0, 0.01, -0.01))
    ]
    res = ot.overtrain(rows, {"a": 2e12, "b": 5e11}, "a", "b")
    assert res["verdict"].startswith("not reached") and res["verdict"].endswith(
        "a is on the unigram plateau at 2e+12, 6e+12 FLOPs"
    )


def test_the_command_writes_the_page_from_a_csv(tmp_path, capsys):
    rows = _rows("replaid", [2e12, 6e12], line(6.0, -0.1)) + _rows("mdlm", [5e11, 1.5e12, 4.3e12], line(5.6, -0.5))
    src = tmp_path / "runs.csv"
    with open(src, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "seed", "tokens"])
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "ot"
    argv = ["scaling", "overtrain", str(src), "--optimum", "replaid=2e12", "mdlm=5e11", "--corpus-tokens", "10000000"]
    assert main([*argv, "--out", str(out)]) == 0
    res = json.loads((out / "overtrain.json").read_text())
    assert res["budgets"]["replaid"][1]["factor"] == pytest.approx(3.0)
    assert res["budgets"]["mdlm"][0]["passes"] == pytest.approx(5e11 / 4e5 / 1e7)
    assert (out / "overtrain.png").stat().st_size > 1000 and "not reached" in (out / "overtrain.md").read_text()
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + len(rows)
    capsys.readouterr()
    assert main(["scaling", "overtrain", str(src), "--optimum", "replaid=2e12", "mdlm=x", "--out", str(out)]) == 2
    assert "--optimum mdlm=x" in capsys.readouterr().err
    assert main(["scaling", "overtrain", str(src), "--optimum", "replaid=2e12", "ar=1e11", "--out", str(out)]) == 2
    assert "no finished run of ar" in capsys.readouterr().err
