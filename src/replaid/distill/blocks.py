"""Progressive distillation of a block model's per-block PF-ODE (no I/O).

A block-diffusion RePlaid run (``diffusion.block_size`` = b < ``seq_len``) samples block by block
(:mod:`replaid.sampling.blocks`): block k runs the PF-ODE of its own latent (B, b, d_e) from noise,
the committed clean blocks ``< k`` as context (the KV cache, or the clean prefix recomputed). Its
distillation is :mod:`replaid.distill.targets`'s (D1)-(D3) applied to that ODE: the teacher takes two
steps ``t -> t' -> s`` of one block with the clean blocks before it as context, and the student, a
copy of the block model, is trained so that its one DDIM step from ``t`` lands where the teacher's two
land, ``e_tilde = (z''_s - (sigma_s / sigma_t) z_t) / c(t, s)``, loss ``max(SNR_t, 1) ||e_hat - e_tilde||^2``.

**Vectorised over blocks.** The block model's training pass (:meth:`~replaid.model.replaid.RePlaid.
block_features`) runs the noisy rows and the clean copy side by side under the block-diffusion mask:
noisy block k sees only its own noisy block and the clean blocks before it, at its own noise level
(gamma per token). So one pass over a sequence evaluates every block's denoiser on its own clean
prefix at once, exactly the per-block ODE's denoiser (to float32 rounding: tests/test_blocks_continuous
checks the pass against the sampler's cache and prefix passes). A training example is therefore a
(row, block) pair: each block of each row takes its own random student step ``k`` of the K-step grid
(the noise drawn per token), the teacher's two steps are two vectorised passes with per-token levels
(four with ``heun``), and the student one pass with gradient. The clean copy is the true sequence's:
the context a block sees at sampling time is the clean committed text, never a noisy latent.

Self-conditioning as in :mod:`replaid.distill.targets`: within a student step the teacher's second call
gets its first call's ``e_hat`` (each block its own, as the vectorised pass feeds it); the student none.
The per-token forms of (D1)-(D3) below are :func:`replaid.sampling.continuous.ddim_step` and
:func:`replaid.distill.targets.ddim_inverse` with the levels as (B, L) float64 tensors instead of floats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from replaid.distill.targets import snr_weight
from replaid.model.replaid import BlockContext

# a block model as the distillers call it: z (B, L, d_e) float64, gamma (B, L) float64 per token,
# e_sc or None -> e_hat (B, L, d_e) float64, every block given the clean blocks before it
BlockEHat = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def alpha_sigma_tok(gamma: Tensor) -> tuple[Tensor, Tensor]:
    """``alpha, sigma`` (B, L, 1) float64 of per-token levels ``gamma`` (B, L)."""
    g = gamma.double()[..., None]
    return torch.sigmoid(-g).sqrt(), torch.sigmoid(g).sqrt()


def ddim_step_tok(z: Tensor, e_hat: Tensor, g_t: Tensor, g_s: Tensor) -> Tensor:
    """(D1) per token: ``z_s = alpha_s e_hat + sigma_s (z_t - alpha_t e_hat) / sigma_t``; z, e_hat (B, L, d_e)."""
    (a_t, s_t), (a_s, s_s) = alpha_sigma_tok(g_t), alpha_sigma_tok(g_s)
    return a_s * e_hat + s_s * (z - a_t * e_hat) / s_t


def ddim_coeffs_tok(g_t: Tensor, g_s: Tensor) -> tuple[Tensor, Tensor]:
    """(D1) as ``z_s = a z_t + c e_hat`` per token: ``a = sigma_s / sigma_t``, ``c = -alpha_s expm1((gamma_s - gamma_t) / 2)``; (B, L, 1) each."""
    (_, s_t), (a_s, s_s) = alpha_sigma_tok(g_t), alpha_sigma_tok(g_s)
    return s_s / s_t, -a_s * torch.expm1(0.5 * (g_s.double() - g_t.double()))[..., None]


def ddim_inverse_tok(z_t: Tensor, z_s: Tensor, g_t: Tensor, g_s: Tensor) -> Tensor:
    """(D3) per token: the clean embedding whose one DDIM step ``g_t -> g_s`` takes ``z_t`` to ``z_s``."""
    if not bool((g_s < g_t).all()):
        raise ValueError("need gamma_s < gamma_t at every token")
    a, c = ddim_coeffs_tok(g_t, g_s)
    return (z_s - a * z_t) / c


def _heun_tok(
    teacher: BlockEHat, z: Tensor, g_t: Tensor, g_s: Tensor, self_cond: bool, e_sc: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One Heun (EDM, VE form) step per token, as :func:`replaid.distill.targets._heun`: in ``z_bar = z /
    alpha`` and ``sigma_tilde = exp(gamma / 2)``, an Euler predictor then the trapezoid corrector."""
    (a_t, _), (a_s, _) = alpha_sigma_tok(g_t), alpha_sigma_tok(g_s)
    st_t, st_s = torch.exp(0.5 * g_t.double())[..., None], torch.exp(0.5 * g_s.double())[..., None]
    e = teacher(z, g_t, e_sc)
    zb = z / a_t
    d = (zb - e) / st_t
    zb_pred = zb + (st_s - st_t) * d
    e_pred = teacher(a_s * zb_pred, g_s, e if self_cond else None)
    d_pred = (zb_pred - e_pred) / st_s
    return a_s * (zb + 0.5 * (st_s - st_t) * (d + d_pred)), e_pred


def teacher_two_step_tok(
    teacher: BlockEHat,
    z_t: Tensor,
    g_t: Tensor,
    g_mid: Tensor,
    g_s: Tensor,
    self_cond: bool,
    solver: str = "ddim",
) -> Tensor:
    """(D2) per token: the teacher's two ``solver`` steps ``g_t -> g_mid -> g_s`` (each (B, L) float64),
    its second call self-conditioned on its first when ``self_cond``. z_t (B, L, d_e) float64 -> ``z''_s``."""
    if solver == "heun":
        z_mid, e1 = _heun_tok(teacher, z_t, g_t, g_mid, self_cond, None)
        return _heun_tok(teacher, z_mid, g_mid, g_s, self_cond, e1 if self_cond else None)[0]
    if solver != "ddim":
        raise ValueError(f"unknown teacher solver {solver!r}; choose ddim or heun")
    e1 = teacher(z_t, g_t, None)
    z_mid = ddim_step_tok(z_t, e1, g_t, g_mid)
    e2 = teacher(z_mid, g_mid, e1 if self_cond else None)
    return ddim_step_tok(z_mid, e2, g_mid, g_s)


def block_ehat_fn(model: torch.nn.Module, context: BlockContext) -> BlockEHat:
    """``model`` (a block RePlaid) as a :data:`BlockEHat` with the clean copy ``context`` (no gradient
    is stopped here: the caller's ``torch.no_grad`` does that for the teacher)."""
    dtype = next(model.parameters()).dtype

    def call(z: Tensor, gamma: Tensor, e_sc: Tensor | None) -> Tensor:
        sc = None if e_sc is None else e_sc.to(dtype)
        e_hat: Tensor = model(z.to(dtype), gamma.to(z.device, torch.float64), sc, context=context).e_hat.double()
        return e_hat

    return call


def draw_block_levels(
    E: Tensor, tokens: Tensor, block: int, g_teacher: Tensor, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each (row, block) at a random student step ``k`` of the K-step grid (``K = (len(g_teacher) - 1) / 2``)
    and ``z_t`` drawn from ``q(z_t | x)`` per token. Returns the per-token levels ``g_t, g_mid, g_s``
    (B, L) float64 (the teacher grid's entries ``2k, 2k + 1, 2k + 2``) and ``z_t`` (B, L, d_e) float64."""
    B, L = tokens.shape
    K = (len(g_teacher) - 1) // 2
    idx = torch.randint(0, K, (B, L // block), generator=gen).repeat_interleave(block, dim=1)  # (B, L)
    dev = tokens.device
    g_t, g_mid, g_s = (g_teacher[2 * idx + j].to(dev) for j in range(3))
    e = E.double().to(dev)[tokens]  # (B, L, d_e)
    a, s = alpha_sigma_tok(g_t)
    eps = torch.randn(e.shape, generator=gen, dtype=torch.float64).to(dev)
    return g_t, g_mid, g_s, a * e + s * eps


def block_progressive_target(
    teacher: torch.nn.Module,
    teacher_sc: bool,
    E: Tensor,
    tokens: Tensor,
    block: int,
    g_teacher: Tensor,
    gen: torch.Generator,
    solver: str = "ddim",
) -> tuple[Tensor, Tensor, Tensor, BlockContext]:
    """The draws and targets of one batch (module docstring): every (row, block) at its own student step
    (:func:`draw_block_levels`), the target ``e_tilde`` (D3) of the teacher's two ``solver`` steps of that
    block given the clean blocks before it. ``E`` (V, d_e) is the frozen embedding matrix, whose rows of
    ``tokens`` (B, L) are the clean copy. Returns ``g_t`` (B, L), ``z_t`` and ``e_tilde`` (B, L, d_e)
    float64, and the clean-copy context."""
    g_t, g_mid, g_s, z = draw_block_levels(E, tokens, block, g_teacher, gen)
    ctx = BlockContext(E.to(tokens.device)[tokens].float(), block)  # the clean copy (B, L, d_e)
    with torch.no_grad():
        z_s = teacher_two_step_tok(block_ehat_fn(teacher, ctx), z, g_t, g_mid, g_s, teacher_sc, solver)
        target = ddim_inverse_tok(z, z_s, g_t, g_s)
    return g_t, z, target, ctx


def block_progressive_batch(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    teacher_sc: bool,
    E: Tensor,
    tokens: Tensor,
    block: int,
    g_teacher: Tensor,
    gen: torch.Generator,
    solver: str = "ddim",
) -> tuple[Tensor, Tensor]:
    """Progressive-distillation loss of one batch of a block model: the student's ``e_hat`` (with
    gradient, no self-conditioning input, the same clean copy as context) against
    :func:`block_progressive_target`, weight ``max(SNR_t, 1)`` per block. Returns (scalar loss: the mean
    over (row, block) of the weighted block means, per-row unweighted ``mean ||e_hat - e_tilde||^2`` (B,))."""
    g_t, z, target, ctx = block_progressive_target(teacher, teacher_sc, E, tokens, block, g_teacher, gen, solver)
    sq = ((block_ehat_fn(student, ctx)(z, g_t, None) - target) ** 2).mean(-1)  # (B, L)
    return (snr_weight(g_t) * sq).mean(), sq.detach().mean(1)
