"""The masked kind (MDLM, BD3-LM with blocks): absorbing-state discrete diffusion over token ids.

Its sampler unmasks from all-[MASK] (id V, the network's ``n_out``) on the time grid 1 -> 0
(:data:`~replaid.sampling.starts.start_masked`); with blocks, block by block over a KV cache
(:class:`~replaid.sampling.batching.MaskedKernel`). The playground shows the state, still-masked
positions as :data:`~replaid.sampling.strategy.MASK_ID`, each token with the probability it was drawn with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from replaid.methods.base import Kind
from replaid.sampling import discrete
from replaid.sampling.batching import masked_kernel
from replaid.sampling.contract import StepInfo
from replaid.sampling.registry import Sampler, per_step
from replaid.sampling.starts import start_masked
from replaid.sampling.strategy import MASK_ID, Frame, KindStrategy

SAMPLERS = (
    Sampler(Kind.MASKED, "ancestral", discrete.sample_mdlm, "MDLM ancestral unmasking, at most T NFE", per_step, False),
)


def frames(B: int, L: int, model: Any) -> Callable[[StepInfo], Frame]:
    """The state z_s, [MASK] shown as MASK_ID; a token keeps the probability x_theta gave it when drawn."""
    V = int(model.n_out)
    conf = torch.zeros(B, L, dtype=torch.float64)  # per position, set when it is unmasked

    def read(info: StepInfo) -> Frame:
        z, p = info["z"].cpu(), info["probs"].cpu()
        new = (z != V) & (conf == 0)
        pz = p.gather(-1, z.clamp(max=V - 1).unsqueeze(-1)).squeeze(-1)  # (B, L)
        conf[new] = pz[new]
        return torch.where(z == V, MASK_ID, z), conf.float(), False

    return read


STRATEGY = KindStrategy(
    start=start_masked,
    samplers=SAMPLERS,
    frames=frames,
    kernel=masked_kernel,
)
