"""Statistics over seeds (replaid.eval.seeds) against independent float64 computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replaid.eval.seeds import PLATEAU_NATS, CellSummary, paired_difference, t_interval

# Student t quantiles t_{0.975, df}, from tables (independent of scipy)
T975 = {1: 12.706204736174698, 2: 4.302652729911275, 3: 3.182446305284263, 4: 2.7764451051977987}


def reference_interval(x: list[float]) -> tuple[float, float, float]:
    a = np.asarray(x, dtype=np.float64)
    m = a.mean()
    half = T975[len(a) - 1] * a.std(ddof=1) / math.sqrt(len(a))
    return m, m - half, m + half


@pytest.mark.parametrize("x", [[5.51, 5.58, 5.49], [1.0, 2.0], [3.1, 3.0, 3.3, 2.9, 3.05]])
def test_t_interval_matches_float64_reference(x):
    iv = t_interval(x)
    m, lo, hi = reference_interval(x)
    assert iv.n == len(x)
    assert iv.mean == pytest.approx(m, abs=1e-12)
    assert iv.lo == pytest.approx(lo, abs=1e-10) and iv.hi == pytest.approx(hi, abs=1e-10)


def test_t_interval_degenerate_sizes():
    assert math.isnan(t_interval([]).mean)
    one = t_interval([2.5])
    assert one.mean == 2.5 and math.isnan(one.lo) and one.contains_zero
    with pytest.raises(ValueError):
        t_interval([1.0, float("nan")])


def test_paired_difference_uses_common_seeds_only():
    cell = {0: 5.40, 1: 5.45, 2: 5.42, 3: 9.99}  # seed 3 has no reference partner
    ref = {0: 5.50, 1: 5.58, 2: 5.51, 4: 0.0}
    pd = paired_difference("plaid", cell, "replaid", ref)
    assert pd.seeds == [0, 1, 2]
    d = [cell[s] - ref[s] for s in (0, 1, 2)]
    m, lo, hi = reference_interval(d)
    assert pd.interval.mean == pytest.approx(m) and pd.interval.lo == pytest.approx(lo)
    assert pd.interval.hi == pytest.approx(hi)
    assert pd.verdict == "lower"  # every diff about -0.1 with small spread


def test_paired_difference_not_determined_when_interval_contains_zero():
    pd = paired_difference("a", {0: 1.0, 1: 1.2, 2: 0.9}, "b", {0: 1.1, 1: 1.0, 2: 1.0})
    assert pd.interval.lo < 0 < pd.interval.hi
    assert pd.verdict == "not determined"
    assert paired_difference("a", {0: 1.0}, "b", {0: 2.0}).verdict == "not determined"  # one seed
    two = paired_difference("a", {0: 1.0, 1: 1.01}, "b", {0: 2.0, 1: 2.0})  # excludes 0, but 2 seeds
    assert two.interval.hi < 0 and two.verdict == "not determined"


def test_plateau_flag():
    uni = {0: 6.0, 1: 6.0, 2: 6.0}
    off = CellSummary("off", {0: 5.0, 1: 5.1, 2: 4.9}, uni)
    on = CellSummary("on", {s: 6.0 - PLATEAU_NATS / 2 for s in uni}, uni)
    assert off.below_unigram.mean == pytest.approx(1.0) and off.on_plateau is False
    assert on.on_plateau is True
    assert CellSummary("x", {0: 1.0}).on_plateau is None
