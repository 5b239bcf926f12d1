"""The continuous kind (RePlaid, Plaid, LangFlow): VP diffusion on token embeddings under a noise schedule.

Its samplers walk the schedule's grid from ``z ~ N(0, I)`` (B, L, d_e) with the denoiser
(:func:`~replaid.sampling.starts.start_continuous`); with blocks, each block is one such walk seeing the
committed blocks (:class:`~replaid.sampling.batching.ContinuousKernel`). The playground shows the
argmax of each step's logits and its probability, then the readout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from replaid.methods.base import Kind
from replaid.sampling import continuous
from replaid.sampling.batching import continuous_kernel
from replaid.sampling.contract import StepInfo
from replaid.sampling.registry import Sampler, per_step, plus_readout
from replaid.sampling.starts import start_continuous
from replaid.sampling.strategy import Frame, KindStrategy

SAMPLERS = (
    Sampler(Kind.CONTINUOUS, "ddpm", continuous.sample_ddpm, "stochastic ancestral (Plaid's), T + 1 NFE", plus_readout),
    Sampler(Kind.CONTINUOUS, "ddim", continuous.sample_ddim, "deterministic DDIM, T + 1 NFE", plus_readout),
    Sampler(Kind.CONTINUOUS, "dpmpp2m", continuous.sample_dpmpp_2m, "DPM-Solver++(2M), T + 1 NFE", plus_readout),
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
        per_step,  # the last prediction is the readout
    ),
)


def frames(B: int, L: int, model: Any) -> Callable[[StepInfo], Frame]:
    """Each step's best guess of the clean text (the logits' argmax, its probability); the readout's tokens."""

    def read(info: StepInfo) -> Frame:
        p = torch.softmax(info["logits"].float(), -1)  # (B, L, V)
        conf, ids = p.max(-1)
        final = bool(info.get("final"))
        return (info["tokens"] if final else ids), conf, final

    return read


STRATEGY = KindStrategy(
    start=start_continuous,
    samplers=SAMPLERS,
    frames=frames,
    kernel=continuous_kernel,
)
