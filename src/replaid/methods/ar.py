"""Autoregressive baseline: the same DiT blocks with causal attention and no time conditioning.

Convention (exact NLL of all L tokens): the input is ``[BOS, x_0, ..., x_{L-2}]`` where BOS is a
dedicated *input-only* id ``V`` (the network outputs V logits, never BOS), and position l predicts
``x_l``. So ``nll`` is ``-(1/L) sum_l log p(x_l | BOS, x_<l)``, comparable per token with the
diffusion bounds on the same L tokens (no position is left unscored). With packed data the BOS
simply marks the start of the window, not of a document.

Sampling is ancestral (temperature, optional nucleus/top-p) with a KV cache
(:meth:`~replaid.model.tokens.TokenDiT.forward_cached`), one network call per token
(:func:`replaid.sampling.discrete.sample_ar`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from replaid.config import check
from replaid.diffusion.nelbo import masked_mean
from replaid.methods.base import Kind, Method, Metrics
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT
from replaid.regions import AGGREGATION, region


def shift_right(tokens: Tensor, bos: int) -> Tensor:
    """(B, L) -> (B, L): ``[BOS, x_0, ..., x_{L-2}]``."""
    return torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], dim=1)


@dataclass
class AROptions:
    """``method=ar``: the config section ``ar``."""

    top_p: float = 1.0  # nucleus sampling mass (1.0 = off)

    def validate(self) -> None:
        check(0 < self.top_p <= 1, "ar.top_p", "must be in (0, 1]")


class ARMethod(Method[TokenDiT]):
    name = "ar"
    kind = Kind.AUTOREGRESSIVE
    description = "autoregressive (exact NLL)"
    samplers = ("ancestral",)
    bound = "nll"
    conditional = "exact"
    options = AROptions
    model_keys = TOKEN_MODEL_KEYS

    def stream_block(self) -> int:
        """1: a completion is written token by token over the KV cache, to any length past ``data.seq_len``
        with a sliding window (:class:`replaid.sampling.batching.ARKernel`)."""
        return 1

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=False, causal=True)

    def _ce(self, model: TokenDiT, tokens: Tensor) -> Tensor:
        """``-log p(x_l | BOS, x_<l)`` (B, L) float32, by the fused chunked cross-entropy (no full float32 logits)."""
        return model.token_nll(model.features(shift_right(tokens, model.n_in - 1)), tokens)

    def _nll_rows(self, model: TokenDiT, tokens: Tensor, mask: Tensor | None) -> Tensor:
        return masked_mean(self._ce(model, tokens), mask)  # (B,) float64

    @torch.no_grad()
    def conditional_nll(
        self, model: TokenDiT, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """Exact ``-sum_{l in target} log p(x_l | BOS, x_<l)``: the target must be a suffix of each row
        (the context, all that precedes it, is what the model conditions on)."""
        t = target.bool()
        if bool((t[:, :-1] & ~t[:, 1:]).any()):
            raise ValueError("an AR conditional needs the scored tokens at the end of the row, after their context")
        return (self._ce(model, tokens).double() * t.double()).sum(1)

    def train_loss(
        self,
        model: TokenDiT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, Metrics]:
        nll = self._nll_rows(model, tokens, mask)
        with region(AGGREGATION):  # float64
            loss = nll.mean()
        return loss, {"loss": nll.detach(), "nll": nll.detach()}

    @torch.no_grad()
    def eval_bound(
        self, model: TokenDiT, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        return {"nll": self._nll_rows(model, tokens, mask)}

    def greedy_logits(self, model: TokenDiT, tokens: Tensor, target: Tensor, seed: int) -> Tensor:
        """Teacher-forced logits: the argmax is exact greedy decoding."""
        logits: Tensor = model(shift_right(tokens, model.n_in - 1))
        return logits

    def embedding_rows(self, model: TokenDiT) -> Tensor:
        return model.rows(model.n_out)
