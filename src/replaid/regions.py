"""Named regions of a training step: the paper's precision table and the profiler's breakdown.

``with region("output prior logits"): ...`` marks the operations of one row of the precision table
(input projections, attention, final logit head, output prior logits, categorical reparameterisation,
per-element loss, loss aggregation) or one part of the step (the self-conditioning pass). With no
listener it is one list check and a shared no-op context, and under ``torch.compile`` it is always
the no-op (nothing to trace). Listeners are:

* the precision audit (tests/test_precision_audit.py), which attributes each aten op to the innermost
  region, and
* :func:`profiled`, which opens a ``torch.profiler.record_function`` per region, so that the profiler
  breakdown (benchmarks/bench_breakdown.py) names them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any

import torch

Listener = Callable[[str, bool], None]  # (name, entering)
_LISTENERS: list[Listener] = []
_NULL: nullcontext[None] = nullcontext()

# the rows of the paper's precision table (appendix, "Precision details for RePlaid") that a step marks
INPUT_PROJECTIONS = "input projections"
ATTENTION = "attention"
MLP = "MLP"
RESIDUAL = "residual stream"
HEAD = "final logit head"
PRIOR = "output prior logits"
REPARAM = "categorical reparameterisation"
ELEMENT_LOSS = "per-element loss"
AGGREGATION = "loss aggregation"
SELF_CONDITIONING = "self-conditioning pass"


class _Region:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        for fn in list(_LISTENERS):
            fn(self.name, True)

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for fn in reversed(list(_LISTENERS)):
            fn(self.name, False)


def region(name: str) -> AbstractContextManager[None]:
    """A context naming the operations inside it (module docstring); a no-op unless listened to."""
    if not _LISTENERS or torch.compiler.is_compiling():
        return _NULL
    return _Region(name)


@contextmanager
def listen(fn: Listener) -> Iterator[None]:
    """Call ``fn(name, entering)`` at every region's entry and exit while inside."""
    _LISTENERS.append(fn)
    try:
        yield
    finally:
        _LISTENERS.remove(fn)


@contextmanager
def profiled() -> Iterator[None]:
    """Every region as a ``torch.profiler.record_function`` of its name (for the profiler's tables)."""
    stack: list[Any] = []

    def fn(name: str, entering: bool) -> None:
        if entering:
            rf = torch.profiler.record_function(name)
            rf.__enter__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            stack.append(rf)
        else:
            stack.pop().__exit__(None, None, None)

    with listen(fn):
        yield
