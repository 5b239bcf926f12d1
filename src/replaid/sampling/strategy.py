"""One strategy per method kind: everything sampling asks of a kind, declared in the kind's own file.

A :class:`~replaid.methods.base.Kind` names its strategy (``kind.strategy``, ``module:NAME``); this
repository's are :mod:`.continuous`, :mod:`.masked`, :mod:`.uniform` and :mod:`.autoregressive`. A
:class:`KindStrategy` holds

* ``start``: how a request starts the kind's samplers (:data:`replaid.sampling.starts.Starter`);
* ``samplers``: its registered samplers (:class:`Sampler`), the default first;
* ``kernel``: how it writes and commits one block of a batch of rows (:class:`Kernel`), from the method,
  its network and a request; the one block loop (:mod:`replaid.sampling.loop`) runs it for a request
  alone (the CLI, :func:`~replaid.sampling.loop.sample_any_length`) and ``replaid serve`` for many
  requests sharing a batch; None where the kind has no blocks;
* ``frames``: what the playground draws of each sampler step (:data:`FrameReader`).

The rest of what differs by kind is asked of the kind's capabilities (``kind.continuous``,
``left_to_right``, ``mask_token``) or of the method (``Method.greedy_logits``: lm-eval's check).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from replaid.diffusion.rng import RowGenerators
from replaid.methods.base import Kind, Method
from replaid.model.dit import KVCache
from replaid.sampling.contract import Callback, Committed, SamplerFn, StepInfo
from replaid.sampling.request import SampleRequest
from replaid.sampling.starts import Starter

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = [
    "EMPTY_ID",
    "MASK_ID",
    "BlockStarter",
    "Frame",
    "FrameReader",
    "Kernel",
    "KindStrategy",
    "Sampler",
    "strategy_of",
]

MASK_ID, EMPTY_ID = -1, -2  # display ids of a frame: a masked position (MDLM), a not-yet-written one (AR)

# A frame of one sampler step: display ids (B, L) long, confidence (B, L) float in [0, 1], and whether it
# is the readout (the returned tokens)
Frame = tuple[Tensor, Tensor, bool]
# (B, L, model) -> the reader turning each step's StepInfo into a Frame (it may keep state across steps)
FrameReader = Callable[[int, int, Any], Callable[[StepInfo], Frame]]


@dataclass(frozen=True)
class Sampler:
    """A registered sampler: its kind, name, plain function and network calls."""

    kind: Kind
    name: str
    fn: SamplerFn
    description: str
    nfe: Callable[[int], int]  # network calls of a T-step run (T = len(grid) - 1)
    nfe_exact: bool = True  # False: ``nfe`` is an upper bound (MDLM reuses an unchanged step's output)

    @property
    def start(self) -> Starter:
        """How this sampler's kind builds a request's initial state, grid, generator and options."""
        return strategy_of(self.kind).start


class BlockStarter(Protocol):
    """How a kind's run writes a request block by block (:mod:`replaid.sampling.stream`)."""

    def __call__(
        self, run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
    ) -> Callable[[int], Iterator[Committed]]: ...


class Kernel(Protocol):
    """How a method writes one block of a ragged batch and commits it (:mod:`replaid.sampling.batching`)."""

    def fill(
        self, ids: Tensor, known: Tensor, cache: KVCache, gen: RowGenerators, callback: Callback | None = None
    ) -> tuple[Tensor, Tensor]:
        """The block's ids (B, b) (the prompt's where ``known`` (B, b)) written: (ids (B, b), which rows
        took part in each network call (B, calls) bool); ``callback`` gets each step's :class:`StepInfo`
        (the block's state ``z`` (B, b) and what the kind's sampler documents)."""
        ...

    def commit(self, ids: Tensor, cache: KVCache) -> None:
        """One clean pass of the finished block (B, b), its keys to the cache."""
        ...

    def prefill(self, ids: Tensor, block: int, cache: KVCache) -> int:
        """The prompt's whole blocks ``ids`` (n, k b) into a lane's empty cache, as the lane alone commits
        them; returns the network calls."""
        ...


@dataclass(frozen=True)
class KindStrategy:
    """What sampling asks of one kind (module docstring)."""

    start: Starter
    samplers: tuple[Sampler, ...]
    frames: FrameReader
    kernel: Callable[[Method[Any], Any, SampleRequest], Kernel] | None = None
    by_name: Mapping[str, Sampler] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {s.name: s for s in self.samplers})


@functools.cache
def strategy_of(kind: Kind) -> KindStrategy:
    """The strategy ``kind.strategy`` names, imported on first use (one line naming the kind otherwise)."""
    module, _, name = kind.strategy.partition(":")
    try:
        found: Any = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"the {kind.value} kind's strategy {kind.strategy!r} does not import: {e}") from e
    if not isinstance(found, KindStrategy):
        raise ValueError(f"the {kind.value} kind's strategy {kind.strategy!r} is not a KindStrategy")
    return found
