"""LangFlow (converted official checkpoints) as an evaluation-only method.

The network is :class:`replaid.model.langflow.LangFlowDenoiser` (LangFlow's parameterisation on our
DiT blocks) with its Gumbel noise schedule. Both it and RePlaid are VP diffusions on token embeddings
behind the same denoiser interface (``kind = continuous``), so they share the evaluation and samplers:

* ``eval_bound``: the continuous-time VDM NELBO (``nelbo_per_sequence``: reconstruction at
  ``gamma(0) = gamma_min``, diffusion term ``-1/2 SNR'(t) ||e - e_hat||^2`` at stratified t, prior KL at
  ``gamma(1) = gamma_max``) under LangFlow's schedule, with self-conditioning as at RePlaid's
  evaluation (a first pass feeds the second). LangFlow itself reports its ODE bound instead:
  ``replaid likelihood`` (``--selfcond-correction off`` is LangFlow's estimator).
* sampling: replaid's continuous samplers on LangFlow's gamma grid (``replaid sample``).
* training: not offered (``trainable = False``: the config validation and the trainer refuse it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from replaid.config import check
from replaid.methods.base import Kind, Method
from replaid.methods.replaid import (
    CONTINUOUS_SAMPLERS,
    continuous_conditional_nll,
    continuous_eval_bound,
    schedule_summary,
)
from replaid.model.langflow import LangFlowDenoiser


@dataclass
class LangFlowOptions:
    """``method=langflow`` (converted checkpoints, evaluation only), the config section ``langflow``:
    LangFlow's Gumbel noise schedule."""

    gumbel_loc: float = 4.723
    gumbel_scale: float = 0.852
    gumbel_cutoff: float = 1e-5

    def validate(self) -> None:
        check(self.gumbel_scale > 0, "langflow.gumbel_scale", "must be positive")
        check(0 < self.gumbel_cutoff < 0.5, "langflow.gumbel_cutoff", "must be in (0, 0.5)")


class LangFlowMethod(Method[LangFlowDenoiser]):
    name = "langflow"
    kind = Kind.CONTINUOUS
    description = "LangFlow (converted checkpoint; continuous diffusion, evaluation only)"
    samplers = CONTINUOUS_SAMPLERS
    trainable = False
    options = LangFlowOptions
    model_keys = ("self_conditioning",)

    def build_model(self, vocab_size: int) -> LangFlowDenoiser:
        m, lf = self.cfg.model, self.cfg.options
        return LangFlowDenoiser(
            vocab_size,
            m.hidden,
            m.n_layers,
            m.n_heads,
            m.cond_dim,
            m.self_conditioning,
            lf.gumbel_loc,
            lf.gumbel_scale,
            lf.gumbel_cutoff,
        )

    @torch.no_grad()
    def eval_bound(
        self,
        model: LangFlowDenoiser,
        tokens: Tensor,
        generator: torch.Generator | None,
        mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        return continuous_eval_bound(self.cfg, model, tokens, generator, mask)

    def conditional_nll(
        self, model: LangFlowDenoiser, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return continuous_conditional_nll(self.cfg, model, tokens, target, generator)

    def eval_summary(self, model: LangFlowDenoiser) -> dict[str, float]:
        return schedule_summary(self.cfg, model)

    def embedding_rows(self, model: LangFlowDenoiser) -> Tensor:
        return model.embedding_matrix()
