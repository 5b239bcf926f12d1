"""A method from outside replaid, in one file: an autoregressive model trained with label smoothing.

Its package registers it through the entry-point group ``replaid.methods``::

    [project.entry-points."replaid.methods"]
    smooth-ar = "smooth_ar:SmoothAR"

after which ``replaid train --method smooth-ar smooth.smoothing=0.1``, ``replaid eval``, ``replaid sample``
and ``replaid export`` take it as they take the built-in methods (tests/test_external_method.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.config import check
from replaid.diffusion.nelbo import masked_mean
from replaid.methods import Kind, Method
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT


@dataclass
class SmoothOptions:
    """The config section ``smooth``."""

    smoothing: float = 0.0  # label-smoothing mass of the training loss (evaluation: the exact NLL)

    def validate(self) -> None:
        check(0 <= self.smoothing < 1, "smooth.smoothing", "must be in [0, 1)")


class SmoothAR(Method[TokenDiT]):
    name = "smooth-ar"
    kind = Kind.AUTOREGRESSIVE
    description = "autoregressive, label-smoothed training (exact NLL)"
    samplers = ("ancestral",)
    bound = "nll"
    conditional = "exact"
    options = SmoothOptions
    section = "smooth"
    model_keys = TOKEN_MODEL_KEYS

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=False, causal=True)

    def _logits(self, model: TokenDiT, tokens: Tensor) -> Tensor:
        bos = torch.full_like(tokens[:, :1], model.n_in - 1)  # BOS: the input-only id V
        return model(torch.cat([bos, tokens[:, :-1]], dim=1)).float()  # (B, L, V)

    def _ce(self, model: TokenDiT, tokens: Tensor, smoothing: float = 0.0) -> Tensor:
        B, L = tokens.shape
        logits = self._logits(model, tokens).reshape(B * L, -1)
        return F.cross_entropy(logits, tokens.reshape(-1), reduction="none", label_smoothing=smoothing).view(B, L)

    def train_loss(
        self,
        model: TokenDiT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, dict]:
        loss = masked_mean(self._ce(model, tokens, self.cfg.options.smoothing), mask)
        return loss.mean(), {"loss": loss.detach()}

    @torch.no_grad()
    def eval_bound(
        self, model: TokenDiT, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        return {"nll": masked_mean(self._ce(model, tokens), mask)}

    @torch.no_grad()
    def conditional_nll(
        self, model: TokenDiT, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return (self._ce(model, tokens).double() * target.double()).sum(1)

    def embedding_rows(self, model: TokenDiT) -> Tensor:
        return model.rows(model.n_out)
