"""Statistics over training seeds: what a grid of runs may claim.

A difference between trained runs is a claim about training, so its interval comes from seeds,
not from the evaluation's standard error. For a cell with per-seed bounds ``x_1..x_n`` (nats/token):

    mean = (1/n) sum x_s,   sd = sqrt(sum (x_s - mean)^2 / (n - 1))
    interval = mean -+ t_{(1+c)/2, n-1} sd / sqrt(n)                     (Student t, confidence c)

A paired difference against a reference cell uses the seeds both cells ran (same seed = same
initial weights and data order): ``d_s = x_s - r_s``, with the interval above computed on ``d``.
It is *not determined* when that interval contains 0 (or fewer than two common seeds exist).

Distance below unigram: ``u_s - x_s`` with ``u_s`` the unigram NLL of the same evaluated tokens.
A cell less than :data:`PLATEAU_NATS` below unigram (on the mean) is *on the plateau*: its
embeddings, schedule and geometry say nothing about what training does, and are not interpreted.

Plateau exit of a run (:func:`plateau_exit`): the first logged training step from which the training
bound stays at least :data:`PLATEAU_NATS` below the unigram NLL of the same training tokens, i.e. the
smallest logged ``s`` with ``u_k - x_k >= PLATEAU_NATS`` for every logged ``k >= s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy import stats

PLATEAU_NATS = 0.3  # a cell must be at least this far below the unigram bound to be interpreted
MIN_SEEDS = 3  # a paired difference over fewer seeds gets no verdict (its interval is shown, not read)


def plateau_exit(
    steps: Sequence[int], bound: Sequence[float], unigram: Sequence[float], margin: float = PLATEAU_NATS
) -> int | None:
    """The plateau-exit step of one training curve (module docstring): the first logged step from
    which ``unigram - bound >= margin`` at every later logged step; None when the last logged step is
    not that far below (the run has not left the plateau). A dip below that returns counts only
    from its last return. Steps must be increasing; non-finite bounds count as on the plateau."""
    if not len(steps) == len(bound) == len(unigram):
        raise ValueError(f"steps, bound and unigram differ in length ({len(steps)}, {len(bound)}, {len(unigram)})")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError("steps must be strictly increasing")
    exit_step = None
    for st, x, u in zip(steps, bound, unigram, strict=True):
        below = math.isfinite(x) and math.isfinite(u) and u - x >= margin
        if not below:
            exit_step = None
        elif exit_step is None:
            exit_step = int(st)
    return exit_step


@dataclass
class Interval:
    """Mean of ``values`` with its two-sided Student-t interval (``lo``/``hi`` NaN for n < 2)."""

    n: int
    mean: float
    sd: float
    lo: float
    hi: float
    confidence: float

    @property
    def contains_zero(self) -> bool:
        return not (self.lo > 0 or self.hi < 0)  # NaN bounds (n < 2) count as containing 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": self.mean,
            "sd": self.sd,
            "lo": self.lo,
            "hi": self.hi,
            "confidence": self.confidence,
        }


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Two-sided Student-t interval of the mean (module docstring). ``values``: finite floats."""
    xs = [float(v) for v in values]
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if any(not math.isfinite(v) for v in xs):
        raise ValueError(f"non-finite value among {xs}")
    n = len(xs)
    if n == 0:
        nan = float("nan")
        return Interval(0, nan, nan, nan, nan, confidence)
    mean = math.fsum(xs) / n
    if n < 2:
        return Interval(1, mean, float("nan"), float("nan"), float("nan"), confidence)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in xs) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half, confidence)


@dataclass
class PairedDifference:
    """``cell - reference`` over the seeds both ran."""

    cell: str
    reference: str
    seeds: list[int]
    diffs: list[float]
    interval: Interval

    @property
    def verdict(self) -> str:
        """``lower``/``higher`` (the cell's bound is below/above the reference's) or ``not determined`` (the
        interval contains 0, or fewer than :data:`MIN_SEEDS` seeds)."""
        if self.interval.n < MIN_SEEDS or self.interval.contains_zero:
            return "not determined"
        return "lower" if self.interval.hi < 0 else "higher"

    def as_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "reference": self.reference,
            "seeds": self.seeds,
            "diffs": self.diffs,
            **{f"diff_{k}": v for k, v in self.interval.as_dict().items()},
            "verdict": self.verdict,
        }


def paired_difference(
    cell: str, values: dict[int, float], reference: str, ref_values: dict[int, float], confidence: float = 0.95
) -> PairedDifference:
    """``values``/``ref_values``: seed -> bound. Only seeds present in both enter."""
    seeds = sorted(set(values) & set(ref_values))
    diffs = [values[s] - ref_values[s] for s in seeds]
    return PairedDifference(cell, reference, seeds, diffs, t_interval(diffs, confidence))


@dataclass
class CellSummary:
    """One grid cell: its per-seed bounds and unigram NLLs, and what may be said of them."""

    name: str
    values: dict[int, float]  # seed -> bound (nats/token)
    unigram: dict[int, float] = field(default_factory=dict)  # seed -> unigram NLL of the same tokens
    confidence: float = 0.95

    @property
    def interval(self) -> Interval:
        return t_interval([self.values[s] for s in sorted(self.values)], self.confidence)

    @property
    def below_unigram(self) -> Interval | None:
        seeds = sorted(set(self.values) & set(self.unigram))
        if not seeds:
            return None
        return t_interval([self.unigram[s] - self.values[s] for s in seeds], self.confidence)

    @property
    def on_plateau(self) -> bool | None:
        """True when the mean distance below unigram is under :data:`PLATEAU_NATS` (None: unknown)."""
        b = self.below_unigram
        return None if b is None else b.mean < PLATEAU_NATS
