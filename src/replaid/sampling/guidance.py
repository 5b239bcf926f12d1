"""Guidance of the continuous samplers: classifier guidance and token guidance (lexical constraints).

Derivation for the paper's gamma parameterisation (``alpha^2 = sigmoid(-gamma)``,
``sigma^2 = sigmoid(gamma)``, ``z_t = alpha e + sigma eps``). Tweedie's formula links the score of
the noisy marginal to the denoiser's clean-embedding prediction:

    E[e | z_t] = (z_t + sigma^2 grad_z log p_t(z_t)) / alpha
    =>  s(z_t) := grad_z log p_t(z_t) = (alpha e_hat - z_t) / sigma^2.                     (G1)

Conditioning on an attribute ``y`` (a class, or "the sequence contains these tokens") with Bayes' rule,
``log p_t(z | y) = log p_t(z) + log p(y | z) - log p(y)``, and scaling the likelihood term by ``w``
(``w = 1``: the exact conditional; ``w > 1``: sharpened, classifier guidance of Dhariwal & Nichol):

    s_w(z_t) = s(z_t) + w grad_z log p(y | z_t).                                            (G2)

Feeding (G2) back through (G1) gives the guided clean-embedding prediction

    e_hat_w = (z_t + sigma^2 s_w(z_t)) / alpha = e_hat + w (sigma^2 / alpha) grad_z log p(y | z_t).   (G3)

Every continuous sampler is written in ``e_hat`` only (DDPM's ancestral step, DDIM, DPM-Solver++(2M),
Heun on the VE PF-ODE, whose drift ``(z_bar - e_hat) / sigma_tilde`` is the score's), so a
denoiser -> denoiser wrapper returning (G3) is the guided reverse process for the DDPM sampler and the
guided PF-ODE for the ODE samplers, with no change to the samplers. The logits are returned unguided
(the final argmax readout is at the cleanest level, where (G3)'s term vanishes as sigma^2 -> 0).

``log p(y | z_t)`` comes from an *objective* ``f(z, gamma, logits) -> (B,)``:

* token guidance (:class:`RequireTokens`, Plaid's lexical constraints): the denoiser's own
  ``log x_theta(z_t)``, ``log p(word at j | z_t) = sum_k log x_theta(z_t)[j + k, w_k]`` (the
  denoiser's per-position factorisation); with no position, ``log sum_j p(word at j | z_t)``, the log
  of the expected number of occurrences (a smooth "anywhere");
* classifier guidance (:class:`ClassifierObjective`): ``log_softmax(c(z_t, gamma))[label]`` of a
  classifier trained on noisy latents (:mod:`replaid.training.classifier`).

Objectives add (several required words, or a word and a class): ``log p(y_1, y_2 | z) ~ sum_i log p(y_i | z)``.
At ``w = 0`` the wrapper calls the inner denoiser only, so sampling is bit-identical to the unguided one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from replaid.diffusion.denoiser import Denoiser, DenoiserOutput, alpha_sigma
from replaid.sampling.errors import RequestError, ref

Objective = Callable[[Tensor, Tensor, Tensor], Tensor]  # (z (B, L, d_e), gamma (B,), logits (B, L, V)) -> (B,)


def guidance_gradient(
    denoiser: Denoiser, objective: Objective, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None
) -> tuple[DenoiserOutput, Tensor, Tensor]:
    """One denoiser call with gradients: returns (output, ``grad_z objective`` (B, L, d_e), objective (B,)).
    The self-conditioning input ``e_sc`` is held fixed (detached)."""
    with torch.enable_grad():
        zg = z.detach().requires_grad_(True)
        out = denoiser(zg, gamma, None if e_sc is None else e_sc.detach())
        f = objective(zg, gamma, out.logits)  # (B,)
        (grad,) = torch.autograd.grad(f.sum(), zg)
    return DenoiserOutput(out.logits.detach(), out.e_hat.detach()), grad, f.detach()


class Guided:
    """Denoiser -> denoiser wrapper returning the guided prediction (G3),
    ``e_hat + w (sigma^2 / alpha) grad_z log p(y | z_t)``; ``w = 0`` is the inner denoiser itself."""

    def __init__(self, denoiser: Denoiser, objective: Objective, scale: float):
        if not (scale >= 0 and scale < float("inf")):
            raise ValueError(f"guidance scale must be a finite number >= 0, got {scale}")
        self.inner, self.objective, self.scale = denoiser, objective, float(scale)
        self.self_conditioning = denoiser.self_conditioning

    def embedding_matrix(self) -> Tensor:
        return self.inner.embedding_matrix()

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        if self.scale == 0.0:
            return self.inner(z, gamma, e_sc)
        out, grad, _ = guidance_gradient(self.inner, self.objective, z, gamma, e_sc)
        alpha, sigma = alpha_sigma(gamma.double())
        coef = (self.scale * sigma**2 / alpha).view(-1, 1, 1)  # (B, 1, 1): w sigma^2 / alpha
        e_hat = out.e_hat.double() + coef * grad.double()  # (B, L, d_e), eq. (G3)
        return DenoiserOutput(out.logits, e_hat.to(out.e_hat.dtype))


def _at_least_float32(x: Tensor) -> Tensor:
    """float64 stays float64 (the gradient checks); half precisions become float32."""
    return x if x.dtype == torch.float64 else x.float()


def sum_objectives(objectives: Sequence[Objective]) -> Objective:
    """``sum_i f_i``: independent constraints (a product of likelihoods)."""
    objs = list(objectives)
    if not objs:
        raise ValueError("no guidance objective")
    if len(objs) == 1:
        return objs[0]

    def f(z: Tensor, gamma: Tensor, logits: Tensor) -> Tensor:
        return torch.stack([o(z, gamma, logits) for o in objs]).sum(0)

    return f


@dataclass
class RequireTokens:
    """Token guidance: ``log p(word | z_t)`` under the denoiser's factorised ``x_theta(z_t)`` (module
    docstring). ``ids``: the word's tokens; ``start``/``end``: the word begins at a position in
    ``[start, end)`` (None: anywhere it fits; ``end = start + 1``: exactly at ``start``)."""

    ids: Sequence[int]
    start: int | None = None
    end: int | None = None

    def log_prob_at(self, logits: Tensor) -> Tensor:
        """``log p(word starts at j | z)`` (B, L - k + 1) for every start j where it fits."""
        logp = torch.log_softmax(_at_least_float32(logits), dim=-1)  # (B, L, V)
        k, L = len(self.ids), logits.shape[1]
        n = L - k + 1
        if n < 1:
            raise ValueError(f"a required word of {k} tokens does not fit in {L} positions")
        # sum() starts from the int 0, so its type is Tensor | int; with k >= 1 terms it is a Tensor
        return sum(logp[:, i : i + n, int(t)] for i, t in enumerate(self.ids))  # type: ignore[return-value]

    def __call__(self, z: Tensor, gamma: Tensor, logits: Tensor) -> Tensor:
        per_start = self.log_prob_at(logits)  # (B, n)
        lo = 0 if self.start is None else self.start
        hi = per_start.shape[1] if self.end is None else min(self.end, per_start.shape[1])
        if not 0 <= lo < hi:
            raise ValueError(
                f"required word at positions {self.start}:{self.end} does not fit in the sequence "
                f"({per_start.shape[1]} possible starts)"
            )
        return torch.logsumexp(per_start[:, lo:hi], dim=-1)  # (B,)

    def satisfied(self, tokens: Tensor) -> Tensor:
        """(B,) bool: the sampled tokens (B, L) hold the word at an allowed start."""
        k, L = len(self.ids), tokens.shape[1]
        ids = torch.as_tensor(list(self.ids), device=tokens.device)
        hits = torch.stack([(tokens[:, j : j + k] == ids).all(-1) for j in range(L - k + 1)], dim=1)  # (B, n)
        lo = 0 if self.start is None else self.start
        hi = hits.shape[1] if self.end is None else min(self.end, hits.shape[1])
        return hits[:, lo:hi].any(-1)


@dataclass
class ClassifierObjective:
    """Classifier guidance: ``log p(label | z_t) = log_softmax(classifier(z_t, gamma))[label]``."""

    classifier: Callable[[Tensor, Tensor], Tensor]  # (z (B, L, d_e), gamma (B,)) -> logits (B, C)
    label: int

    def __call__(self, z: Tensor, gamma: Tensor, logits: Tensor) -> Tensor:
        c = self.classifier(z, gamma)  # (B, C)
        return torch.log_softmax(_at_least_float32(c), dim=-1)[:, self.label]


def parse_require(spec: str) -> tuple[str, int | None, int | None]:
    """``--require`` value: ``WORD`` (anywhere), ``WORD@P`` (starting at token P) or ``WORD@A:B``
    (starting in ``[A, B)``); returns (word, start, end)."""
    word, sep, where = spec.rpartition("@")
    if not sep or not word:
        word, where = spec, ""
    if not where:
        if not word.strip():
            raise RequestError(
                f"{ref('require')} needs a word, e.g. {ref('require')} ' king' or {ref('require')} 'king@5'"
            )
        return word, None, None
    try:
        if ":" in where:
            a, b = where.split(":", 1)
            start, end = int(a), int(b)
        else:
            start = int(where)
            end = start + 1
    except ValueError:
        raise RequestError(
            f"{ref('require')} {spec!r}: expected WORD, WORD@POS or WORD@A:B (token positions)"
        ) from None
    if not 0 <= start < end:
        raise RequestError(f"{ref('require')} {spec!r}: the position span must satisfy 0 <= A < B")
    return word, start, end
