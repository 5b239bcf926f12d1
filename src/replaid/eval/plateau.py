"""The plateau study's per-run quantities: a training curve's bound at a budget, its plateau
exit, and its offset above a reference method's curve at equal compute, with the compute multiplier.

A run's curve is its logged training rows (:func:`replaid.scaling.grid.training_rows`): before one pass
over the train split each row's batch is unseen when it is scored, so a row's bound estimates the
held-out bound. ``bound_at(step)`` averages the rows in ``(step - window, step]``.

The offset at budget C (FLOPs) is ``bound - ref(C)``, ``ref`` the reference curve (MDLM's, same seed)
read at C by linear interpolation in ``log C``; the compute multiplier is ``C / C_ref``, ``C_ref`` the
compute at which the reference curve first reaches the bound (the same interpolation; None when it
does not within its run). Both are read once both runs have left the plateau.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """A run's training curve: steps (increasing), bound and unigram NLL per logged row, FLOPs per step
    (``flops[i]``: the compute spent up to ``steps[i]``)."""

    steps: Sequence[int]
    bound: Sequence[float]
    unigram: Sequence[float]
    flops: Sequence[float]

    def window(self, step: int, window: int) -> list[int]:
        return [i for i, s in enumerate(self.steps) if step - window < s <= step]

    def bound_at(self, step: int, window: int = 150) -> float:
        """Mean bound of the rows logged in ``(step - window, step]`` (NaN when none)."""
        idx = self.window(step, window)
        return sum(self.bound[i] for i in idx) / len(idx) if idx else math.nan

    def below_unigram_at(self, step: int, window: int = 150) -> float:
        """Mean of ``unigram - bound`` over the same rows (positive: below the unigram bound)."""
        idx = self.window(step, window)
        return sum(self.unigram[i] - self.bound[i] for i in idx) / len(idx) if idx else math.nan

    def flops_at(self, step: int) -> float:
        return interp_log_x([float(s) for s in self.steps], list(self.flops), float(step))

    def smoothed(self, window: int = 150) -> tuple[list[float], list[float]]:
        """(FLOPs, bound) at every logged step, the bound averaged as :meth:`bound_at`."""
        return [float(f) for f in self.flops], [self.bound_at(int(s), window) for s in self.steps]


def interp_log_x(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x, linear in log x between the bracketing points of increasing xs (NaN outside them)."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return math.nan


def first_crossing(xs: Sequence[float], ys: Sequence[float], level: float) -> float | None:
    """The smallest x (log-linear between points) at which the curve ys(xs) first reaches ``level`` or
    below; None when it never does."""
    for i, y in enumerate(ys):
        if not math.isfinite(y):
            continue
        if y <= level:
            if i == 0 or not math.isfinite(ys[i - 1]):
                return float(xs[i])
            x0, x1, y0 = xs[i - 1], xs[i], ys[i - 1]
            w = (y0 - level) / (y0 - y)
            return math.exp(math.log(x0) + w * (math.log(x1) - math.log(x0)))
    return None


@dataclass(frozen=True)
class Offset:
    """A run's position against the reference curve at one budget."""

    flops: float  # the run's compute at the budget
    bound: float
    ref_bound: float  # the reference's bound at the same compute (NaN: outside its run)
    ref_flops: float | None  # compute at which the reference first reaches ``bound`` (None: never)

    @property
    def offset(self) -> float:
        return self.bound - self.ref_bound

    @property
    def multiplier(self) -> float | None:
        """How many times the reference's compute the run spent for its bound (None: not reached)."""
        return None if self.ref_flops is None else self.flops / self.ref_flops


def offset_against(run: Curve, ref: Curve, step: int, window: int = 150) -> Offset:
    """:class:`Offset` of ``run`` at ``step`` against ``ref`` (module docstring)."""
    c = run.flops_at(step)
    b = run.bound_at(step, window)
    xs, ys = ref.smoothed(window)
    return Offset(c, b, interp_log_x(xs, ys, c), first_crossing(xs, ys, b))
