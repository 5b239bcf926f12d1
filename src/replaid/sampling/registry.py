"""Every sampler of every method, found by (method kind, name).

A method declares the names it offers (:attr:`replaid.methods.base.Method.samplers`, the default
first); its kind's strategy (:mod:`replaid.sampling.strategy`) declares which plain function each name is
(every one with the signature of :class:`~replaid.sampling.contract.SamplerFn`), how the kind starts it
(initial state, grid, generator, options) and how many network calls a T-step run makes. :data:`REGISTRY`
is the table of this repository's kinds, read through their strategies (a plug-in kind's samplers are
found the same way by :func:`get_sampler`). The CLI's ``--sampler`` choices are :data:`SAMPLER_NAMES`,
named in the torch-free :mod:`replaid.sampling.names` (a test checks them against the table).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from replaid.methods.base import KINDS, Kind, Method
from replaid.sampling.strategy import Sampler, strategy_of

__all__ = ["REGISTRY", "Sampler", "get_sampler", "nfe_for", "per_step", "plus_readout", "samplers_of"]


def plus_readout(T: int) -> int:
    """T steps and the readout's call."""
    return T + 1


def per_step(T: int) -> int:
    """One call per step."""
    return T


class _Table(Mapping[tuple[Kind, str], Sampler]):
    """The samplers of this repository's kinds by (kind, name), read from their strategies on use."""

    def __getitem__(self, key: tuple[Kind, str]) -> Sampler:
        kind, name = key
        return strategy_of(kind).by_name[name]

    def __iter__(self) -> Iterator[tuple[Kind, str]]:
        return ((k, s.name) for k in KINDS for s in strategy_of(k).samplers)

    def __len__(self) -> int:
        return sum(len(strategy_of(k).samplers) for k in KINDS)


REGISTRY: Mapping[tuple[Kind, str], Sampler] = _Table()


def get_sampler(method: Method[Any], name: str | None = None) -> Sampler:
    """The registered sampler ``name`` (None: the method's default) for ``method``'s kind."""
    name = name or method.samplers[0]
    own = strategy_of(method.kind).by_name
    if name not in method.samplers or name not in own:
        raise ValueError(
            f"sampler {name!r} is not available for a {method.name} run; choose {', '.join(method.samplers)}"
        )
    return own[name]


def samplers_of(kind: Kind) -> dict[str, Sampler]:
    """The registered samplers of ``kind`` by name, in its strategy's order."""
    return dict(strategy_of(kind).by_name)


def nfe_for(kind: Kind, name: str, T: int) -> int:
    """Network calls of a T-step run of the registered sampler (kind, name) (an upper bound where
    ``nfe_exact`` is False)."""
    own = strategy_of(kind).by_name
    if name not in own:
        raise ValueError(f"unknown sampler {name!r} for {kind.value} methods")
    if int(T) < 1:
        raise ValueError(f"need at least one sampling step, got T={T}")
    return own[name].nfe(int(T))
