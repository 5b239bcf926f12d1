"""Every sampler of every method in one registry, keyed by (method kind, name).

A method declares the names it offers (:attr:`replaid.methods.base.Method.samplers`, the default
first); this table says which plain function each (kind, name) is and how many network calls a
T-step run makes. The CLI's ``--sampler`` choices are :data:`SAMPLER_NAMES`, named in the torch-free
:mod:`replaid.sampling.names` (checked here against the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from replaid.methods.base import Kind, Method
from replaid.sampling import continuous, discrete
from replaid.sampling.names import SAMPLER_NAMES


@dataclass(frozen=True)
class Sampler:
    kind: Kind
    name: str
    fn: Callable
    description: str
    nfe: Optional[Callable[[int], int]] = None  # denoiser calls of a T-step run, where fixed


def _continuous(name: str, description: str) -> Sampler:
    def nfe(T: int) -> int:
        return continuous.nfe_for(name, T)

    return Sampler(Kind.CONTINUOUS, name, continuous.SAMPLERS[name], description, nfe)


REGISTRY: dict[tuple[Kind, str], Sampler] = {
    (s.kind, s.name): s
    for s in (
        _continuous("ddpm", "stochastic ancestral (Plaid's), T + 1 NFE"),
        _continuous("ddim", "deterministic DDIM, T + 1 NFE"),
        _continuous("dpmpp2m", "DPM-Solver++(2M), T + 1 NFE"),
        _continuous("heun", "Heun (EDM) predictor-corrector, 2T NFE"),
        _continuous("consistency", "multistep consistency sampling (consistency-distilled students), T NFE"),
        Sampler(Kind.MASKED, "ancestral", discrete.sample_mdlm, "MDLM ancestral unmasking, at most T NFE"),
        Sampler(Kind.UNIFORM, "ancestral", discrete.sample_duo, "Duo ancestral, T NFE", lambda T: T),
        Sampler(
            Kind.AUTOREGRESSIVE, "ancestral", discrete.sample_ar, "left to right with a KV cache, one NFE per token"
        ),
    )
}
assert tuple(dict.fromkeys(name for _, name in REGISTRY)) == SAMPLER_NAMES, "keep sampling.names.SAMPLER_NAMES in step"


def samplers_for(method: Method[Any]) -> tuple[str, ...]:
    """The sampler names ``method`` offers (its default first)."""
    return method.samplers


def get_sampler(method: Method[Any], name: Optional[str] = None) -> Sampler:
    """The registered sampler ``name`` (None: the method's default) for ``method``'s kind."""
    name = name or method.samplers[0]
    if name not in method.samplers or (method.kind, name) not in REGISTRY:
        raise ValueError(
            f"sampler {name!r} is not available for a {method.name} run; choose {', '.join(method.samplers)}"
        )
    return REGISTRY[method.kind, name]
