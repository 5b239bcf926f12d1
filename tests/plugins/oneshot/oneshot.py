"""A method of a new kind from outside replaid, in one file: the kind, its sampling strategy and its method.

The kind, ``oneshot``, writes every position in one network call: the network sees all-[MASK] input and
gives each position its own distribution, drawn independently (a position-wise factorised model, whose
exact NLL is its cross-entropy). Nothing in replaid names it: the kind names its strategy
(``oneshot:STRATEGY``), the method names the kind, and the package registers the method through the
entry-point group ``replaid.methods``::

    [project.entry-points."replaid.methods"]
    oneshot = "oneshot:OneShot"

after which ``replaid train --method oneshot``, ``replaid eval``, ``replaid sample``, the playground and
``/v1/completions`` take it (tests/test_kinds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.diffusion.nelbo import masked_mean
from replaid.methods import Kind, Method
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT
from replaid.sampling.contract import Callback, SampleResult, StepInfo
from replaid.sampling.discrete import exponential_race, tempered_probs
from replaid.sampling.registry import per_step
from replaid.sampling.starts import DiscreteStart
from replaid.sampling.strategy import Frame, KindStrategy, Sampler

ONESHOT = Kind("oneshot", "oneshot:STRATEGY", mask_token=True)


@torch.no_grad()
def sample_oneshot(
    net: TokenDiT,
    x: Tensor,
    grid: Tensor,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    disable_progress: bool = True,
) -> SampleResult:
    """Every [MASK] position of ``x`` (B, L) drawn at once from the network's output (one call)."""
    V = int(net.n_out)
    probs = tempered_probs(net(torch.full_like(x, V)), temperature)  # (B, L, V)
    drawn = exponential_race(probs, generator)  # (B, L)
    tokens = torch.where(x == V, drawn, x)
    if callback is not None:
        callback(StepInfo(i=0, T=1, z=tokens, probs=probs, nfe=1))
    return SampleResult(tokens, 1)


def frames(B: int, L: int, model: Any) -> Callable[[StepInfo], Frame]:
    def read(info: StepInfo) -> Frame:
        z, p = info["z"].cpu(), info["probs"].cpu()
        return z, p.gather(-1, z.unsqueeze(-1)).squeeze(-1).float(), True

    return read


STRATEGY = KindStrategy(
    start=DiscreteStart(
        initial=lambda B, L, V, dev, gen: torch.full((B, L), V, dtype=torch.long, device=dev),
        on_device=False,
        grid=lambda req, n, L: torch.linspace(1, 0, 2, dtype=torch.float64),
        steps=lambda req, L: 1,
        options=lambda run, req, n, L: {},
    ),
    samplers=(Sampler(ONESHOT, "ancestral", sample_oneshot, "every position at once, 1 NFE", per_step),),
    frames=frames,
)


class OneShot(Method[TokenDiT]):
    name = "oneshot"
    kind = ONESHOT
    description = "every position drawn at once from all-[MASK] input (exact NLL of a factorised model)"
    samplers = ("ancestral",)
    bound = "nll"
    conditional = "exact"
    model_keys = TOKEN_MODEL_KEYS

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=False)

    def _ce(self, model: TokenDiT, tokens: Tensor) -> Tensor:
        logits = model(torch.full_like(tokens, model.n_out)).float()  # (B, L, V)
        return F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")  # (B, L)

    def train_loss(
        self,
        model: TokenDiT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, dict]:
        loss = masked_mean(self._ce(model, tokens), mask)
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
