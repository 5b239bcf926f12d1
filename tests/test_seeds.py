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


# ---------------------------------------------------------------------------------------------- plateau exit


def brute_exit(steps, bound, uni, margin=PLATEAU_NATS):
    """The definition read literally: the smallest logged s with u_k - x_k >= margin for all k >= s."""
    for i, s in enumerate(steps):
        if all(u - x >= margin for x, u in zip(bound[i:], uni[i:], strict=True)):
            return s
    return None


@pytest.mark.parametrize(
    "bound,expected",
    [
        ([6.0, 5.9, 5.6, 5.5, 5.4], 150),  # leaves at the third row: 5.95 - 5.6 = 0.35 >= 0.3
        ([6.0, 5.5, 5.8, 5.5, 5.4], 200),  # dips below at 100, returns to the plateau at 150: counts from 200
        ([6.0, 5.9, 5.8, 5.7, 5.7], None),  # never 0.3 below
        ([5.5, 5.5, 5.5, 5.5, 5.5], 50),  # below from the first logged step
        ([6.0, 5.5, 5.5, 5.5, 5.8], None),  # left, then back on the plateau at the end: not left
        ([5.5, float("nan"), 5.5, 5.5, 5.5], 150),  # a non-finite row counts as on the plateau
    ],
)
def test_plateau_exit_of_planted_curves(bound, expected):
    from replaid.eval.seeds import plateau_exit

    steps, uni = [50, 100, 150, 200, 250], [5.95] * 5
    assert plateau_exit(steps, bound, uni) == expected
    if all(math.isfinite(b) for b in bound):
        assert plateau_exit(steps, bound, uni) == brute_exit(steps, bound, uni)


def test_plateau_exit_reads_each_rows_own_unigram():
    """The reference moves with the rows' tokens: the same bound is off the plateau against one row's
    unigram and on it against another's."""
    from replaid.eval.seeds import plateau_exit

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        steps = sorted(rng.choice(np.arange(1, 1000), n, replace=False).tolist())
        bound = rng.uniform(5.0, 6.2, n).tolist()
        uni = rng.uniform(5.6, 6.1, n).tolist()
        assert plateau_exit(steps, bound, uni) == brute_exit(steps, bound, uni)
    with pytest.raises(ValueError):
        plateau_exit([2, 1], [5.0, 5.0], [6.0, 6.0])
