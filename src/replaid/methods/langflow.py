"""LangFlow (converted official checkpoints) as an evaluation-only method.

The network is :class:`replaid.model.langflow.LangFlowDenoiser` (LangFlow's parameterisation on our
DiT blocks) with its Gumbel noise schedule. Everything else is RePlaid's, because both are VP
diffusions on token embeddings behind the same denoiser interface:

* ``eval_bound``: the continuous-time VDM NELBO (``nelbo_per_sequence``: reconstruction at
  ``gamma(0) = gamma_min``, diffusion term ``-1/2 SNR'(t) ||e - e_hat||^2`` at stratified t, prior KL at
  ``gamma(1) = gamma_max``) under LangFlow's schedule, with self-conditioning as at RePlaid's
  evaluation (a first pass feeds the second). LangFlow itself reports its ODE bound instead:
  ``replaid likelihood`` (``--selfcond-correction off`` is LangFlow's estimator).
* sampling: replaid's samplers on LangFlow's gamma grid (``replaid sample``).
* training: not implemented (one-line error).
"""
from __future__ import annotations

from replaid.config import ConfigError
from replaid.methods.replaid import RePlaidMethod
from replaid.model.langflow import LangFlowDenoiser


class LangFlowMethod(RePlaidMethod):
    name = "langflow"

    def build_model(self, vocab_size: int) -> LangFlowDenoiser:
        m, b = self.cfg.model, self.cfg.baseline
        return LangFlowDenoiser(vocab_size, m.hidden, m.n_layers, m.n_heads, m.cond_dim, m.self_conditioning,
                                b.langflow_gumbel_loc, b.langflow_gumbel_scale, b.langflow_gumbel_cutoff)

    def train_loss(self, *args, **kwargs):
        raise ConfigError("method=langflow is for converted LangFlow checkpoints (evaluation and sampling); "
                          "training it is not implemented: train method=replaid instead")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass  # no training statistics (RePlaid's adaptive split is a training device)
