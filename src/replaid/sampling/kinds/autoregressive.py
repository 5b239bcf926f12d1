"""The autoregressive kind: left to right over a KV cache, exact likelihood.

Its sampler writes one token per step after the prompt (:data:`~replaid.sampling.starts.start_autoregressive`);
a completion of any length is blocks of one token (:class:`~replaid.sampling.batching.ARKernel`, requests
joining a running batch at every token). The
playground shows the tokens so far (later positions :data:`~replaid.sampling.strategy.EMPTY_ID`) and the
probability each was drawn with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from replaid.methods.base import Kind
from replaid.sampling import discrete
from replaid.sampling.batching import ar_kernel
from replaid.sampling.contract import StepInfo
from replaid.sampling.registry import Sampler, per_step
from replaid.sampling.starts import start_autoregressive
from replaid.sampling.strategy import EMPTY_ID, Frame, KindStrategy

SAMPLERS = (
    Sampler(
        Kind.AUTOREGRESSIVE,
        "ancestral",
        discrete.sample_ar,
        "left to right with a KV cache, one NFE per generated token",
        per_step,
    ),
)


def frames(B: int, L: int, model: Any) -> Callable[[StepInfo], Frame]:
    """The tokens so far (EMPTY_ID after them), each with the probability it was drawn with."""
    conf = torch.zeros(B, L, dtype=torch.float64)

    def read(info: StepInfo) -> Frame:
        pos, toks = info["pos"], info["tokens"].cpu()
        conf[:, pos] = info["probs"].cpu().gather(-1, toks[:, pos : pos + 1]).squeeze(-1)
        ids = torch.full((B, L), EMPTY_ID, dtype=torch.long)
        ids[:, : pos + 1] = toks[:, : pos + 1]
        return ids, conf.float(), False

    return read


STRATEGY = KindStrategy(start=start_autoregressive, samplers=SAMPLERS, frames=frames, kernel=ar_kernel)
