"""The plateau study's offset and compute multiplier (issue 48 §2) against closed forms."""

from __future__ import annotations

import math

import pytest

from replaid.eval.plateau import Curve, first_crossing, interp_log_x, offset_against


def power_law(steps, flops_per_step, a=6.0, k=0.4, shift=1.0):
    """bound = a - k log(C / shift): a curve straight in log compute, ``shift`` times less efficient."""
    fl = [flops_per_step * s for s in steps]
    return Curve(steps, [a - k * math.log(c / shift) for c in fl], [7.0] * len(steps), fl)


def test_log_interpolation_and_crossing_are_exact_on_a_log_linear_curve():
    xs = [1e10, 3e10, 1e11, 4e11]
    ys = [5.0 - 0.3 * math.log(x) for x in xs]
    assert interp_log_x(xs, ys, 2e11) == pytest.approx(5.0 - 0.3 * math.log(2e11), rel=1e-12)
    assert math.isnan(interp_log_x(xs, ys, 1e12))  # outside the run: not extrapolated
    level = 5.0 - 0.3 * math.log(5e10)
    assert first_crossing(xs, ys, level) == pytest.approx(5e10, rel=1e-10)
    assert first_crossing(xs, ys, -100.0) is None
    assert first_crossing([1.0, 2.0, 4.0], [6.0, 5.0, 5.5], 5.2) == pytest.approx(2 ** (0.8), rel=1e-12)  # the first


def test_offset_and_multiplier_against_a_shifted_reference():
    steps = list(range(50, 2450, 50))
    ref = power_law(steps, 1e9)
    run = power_law(steps, 1.2e9, shift=2.5)  # 1.2x the FLOPs per step and 2.5x less efficient per FLOP
    o = offset_against(run, ref, 1200, window=1)
    assert o.flops == pytest.approx(1.2e9 * 1200)
    assert o.multiplier == pytest.approx(2.5, rel=1e-9)  # the reference reaches the bound with 2.5x less
    assert o.offset == pytest.approx(0.4 * math.log(2.5), rel=1e-9)  # k log m above it at equal compute
    same = offset_against(ref, ref, 1200, window=1)
    assert same.offset == pytest.approx(0.0, abs=1e-12) and same.multiplier == pytest.approx(1.0)


def test_bound_at_averages_the_window_and_reads_below_unigram():
    c = Curve([50, 100, 150, 200], [6.0, 5.0, 4.0, 3.0], [7.0, 7.0, 7.0, 7.5], [1.0, 2.0, 3.0, 4.0])
    assert c.bound_at(200, window=150) == pytest.approx(4.0)  # rows 100, 150, 200 (not 50)
    assert c.below_unigram_at(200, window=100) == pytest.approx(((7.0 - 4.0) + (7.5 - 3.0)) / 2)
    assert math.isnan(c.bound_at(10))
