"""The uniform kind (Duo): uniform-state discrete diffusion over token ids.

Its sampler starts from uniform noise drawn on the model's device, the prompt kept, on the time grid
1 -> 0 (:data:`~replaid.sampling.starts.start_uniform`); it has no block generator. The playground shows
the state z_s and x_theta's probability of each of its tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replaid.methods.base import Kind
from replaid.sampling import discrete
from replaid.sampling.contract import StepInfo
from replaid.sampling.registry import Sampler, per_step
from replaid.sampling.starts import start_uniform
from replaid.sampling.strategy import Frame, KindStrategy

SAMPLERS = (Sampler(Kind.UNIFORM, "ancestral", discrete.sample_duo, "Duo ancestral, T NFE", per_step),)


def frames(B: int, L: int, model: Any) -> Callable[[StepInfo], Frame]:
    """The state z_s and x_theta's probability of each of its tokens."""

    def read(info: StepInfo) -> Frame:
        z, p = info["z"].cpu(), info["probs"].cpu()
        return z, p.gather(-1, z.unsqueeze(-1)).squeeze(-1).float(), False

    return read


STRATEGY = KindStrategy(start=start_uniform, samplers=SAMPLERS, frames=frames)
