"""The original Plaid: RePlaid's diffusion math (VDM NELBO, learned schedule and embeddings,
adaptive split, self-conditioning, samplers) around the original Plaid transformer
(:mod:`replaid.model.plaid_backbone`). Only the model differs from :class:`RePlaidMethod`.

Plaid's optimiser (paper table "Optimization details for Plaid at the 0.1B scale": per-component
muP-rescaled AdamW values, with the backbone matrices apart from the norms and the head, see
:meth:`PlaidModel.param_groups`) is :func:`replaid.presets.optim_plaid`; its output-prior
``bias_scale`` ramp (0 -> 1 over the first 5000 steps) is ``diffusion.prior_ramp_steps``. Both are
set by the ``owt-0.1b-plaid`` preset. The table's values are for hidden 768; at other widths
muP would rescale the matrix learning rates, which the small presets do not do.
"""

from __future__ import annotations

from replaid.methods.replaid import CONTINUOUS_MODEL_KEYS, RePlaidMethod
from replaid.model.plaid_backbone import PlaidModel


class PlaidMethod(RePlaidMethod):
    name = "plaid"
    description = "Plaid (continuous diffusion, original backbone; NELBO bound)"
    model_keys = CONTINUOUS_MODEL_KEYS  # RePlaid's options (section diffusion); not its in_z/AdaLN/readout keys

    def build_model(self, vocab_size: int) -> PlaidModel:
        return PlaidModel(self.cfg.model, self.opts, vocab_size)
