"""Every sampler of every method in one registry, keyed by (method kind, name).

A method declares the names it offers (:attr:`replaid.methods.base.Method.samplers`, the default
first); this table says which plain function each (kind, name) is (every one with the signature of
:class:`~replaid.sampling.contract.SamplerFn`), how its kind starts it (initial state, grid, generator,
options: :data:`replaid.sampling.starts.STARTS`) and how many network calls a T-step run makes. The
CLI's ``--sampler`` choices are :data:`SAMPLER_NAMES`, named in the torch-free
:mod:`replaid.sampling.names` (checked here against the table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replaid.methods.base import Kind, Method
from replaid.sampling import continuous, discrete
from replaid.sampling.contract import SamplerFn
from replaid.sampling.names import SAMPLER_NAMES
from replaid.sampling.starts import STARTS, Starter


@dataclass(frozen=True)
class Sampler:
    kind: Kind
    name: str
    fn: SamplerFn
    description: str
    nfe: Callable[[int], int]  # network calls of a T-step run (T = len(grid) - 1)
    nfe_exact: bool = True  # False: ``nfe`` is an upper bound (MDLM reuses an unchanged step's output)

    @property
    def start(self) -> Starter:
        """How this sampler's kind builds a request's initial state, grid, generator and options."""
        return STARTS[self.kind]


def _plus_readout(T: int) -> int:
    return T + 1


def _per_step(T: int) -> int:
    return T


REGISTRY: dict[tuple[Kind, str], Sampler] = {
    (s.kind, s.name): s
    for s in (
        Sampler(
            Kind.CONTINUOUS, "ddpm", continuous.sample_ddpm, "stochastic ancestral (Plaid's), T + 1 NFE", _plus_readout
        ),
        Sampler(Kind.CONTINUOUS, "ddim", continuous.sample_ddim, "deterministic DDIM, T + 1 NFE", _plus_readout),
        Sampler(Kind.CONTINUOUS, "dpmpp2m", continuous.sample_dpmpp_2m, "DPM-Solver++(2M), T + 1 NFE", _plus_readout),
        Sampler(
            Kind.CONTINUOUS,
            "heun",
            continuous.sample_heun,
            "Heun (EDM) predictor-corrector, 2T NFE",
            lambda T: 2 * T,  # the corrector is skipped on the last step, + 1 readout
        ),
        Sampler(
            Kind.CONTINUOUS,
            "consistency",
            continuous.sample_consistency,
            "multistep consistency sampling (consistency-distilled students), T NFE",
            _per_step,  # the last prediction is the readout
        ),
        Sampler(
            Kind.MASKED, "ancestral", discrete.sample_mdlm, "MDLM ancestral unmasking, at most T NFE", _per_step, False
        ),
        Sampler(Kind.UNIFORM, "ancestral", discrete.sample_duo, "Duo ancestral, T NFE", _per_step),
        Sampler(
            Kind.AUTOREGRESSIVE,
            "ancestral",
            discrete.sample_ar,
            "left to right with a KV cache, one NFE per generated token",
            _per_step,
        ),
    )
}
assert tuple(dict.fromkeys(name for _, name in REGISTRY)) == SAMPLER_NAMES, "keep sampling.names.SAMPLER_NAMES in step"


def get_sampler(method: Method[Any], name: str | None = None) -> Sampler:
    """The registered sampler ``name`` (None: the method's default) for ``method``'s kind."""
    name = name or method.samplers[0]
    if name not in method.samplers or (method.kind, name) not in REGISTRY:
        raise ValueError(
            f"sampler {name!r} is not available for a {method.name} run; choose {', '.join(method.samplers)}"
        )
    return REGISTRY[method.kind, name]


def samplers_of(kind: Kind) -> dict[str, Sampler]:
    """The registered samplers of ``kind`` by name, in the registry's order."""
    return {name: s for (k, name), s in REGISTRY.items() if k is kind}


def nfe_for(kind: Kind, name: str, T: int) -> int:
    """Network calls of a T-step run of the registered sampler (kind, name) (an upper bound where
    ``nfe_exact`` is False)."""
    if (kind, name) not in REGISTRY:
        raise ValueError(f"unknown sampler {name!r} for {kind.value} methods")
    if int(T) < 1:
        raise ValueError(f"need at least one sampling step, got T={T}")
    return REGISTRY[kind, name].nfe(int(T))
