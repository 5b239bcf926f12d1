"""The original Plaid: RePlaid's diffusion math (VDM NELBO, learned schedule and embeddings,
adaptive split, self-conditioning, samplers) around the original Plaid transformer
(:mod:`replaid.model.plaid_backbone`). Only the model differs from :class:`RePlaidMethod`.

Not done here: muP-rescaled per-component learning rates of the paper's Plaid 0.1B table (they
need a backbone split into matrices vs norms/head groups; leave to a preset), and Plaid's
output-prior ``bias_scale`` ramp 0 -> 1 over the first 5000 steps (RePlaid adds it in full).
"""
from __future__ import annotations

from ..model.plaid_backbone import PlaidModel
from .replaid import RePlaidMethod


class PlaidMethod(RePlaidMethod):
    name = "plaid"

    def build_model(self, vocab_size: int) -> PlaidModel:
        return PlaidModel(self.cfg.model, self.cfg.diffusion, vocab_size)
