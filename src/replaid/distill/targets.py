"""The maths of distilling RePlaid's probability-flow ODE (no I/O): progressive-distillation targets
and the consistency-distillation loss, in gamma space with the logits parameterisation.

Notation (docs/notation.md): ``alpha^2 = sigmoid(-gamma)``, ``sigma^2 = sigmoid(gamma)`` (``sigma`` is
the noise std), ``z_t = alpha_t e + sigma_t eps``. The denoiser outputs token logits and the clean
embedding ``e_hat = softmax(logits) @ E`` (paper eq. (3)); samplers step from ``gamma_t`` to
``gamma_s < gamma_t``.

Progressive distillation (Salimans & Ho 2022), derived for this parameterisation
--------------------------------------------------------------------------------------
The PF-ODE in gamma space (paper eq. (ode-pfode-gamma)) is ``dz/dgamma = (alpha^2 z - alpha e_hat) / 2``.
Holding ``e_hat`` fixed over a step (the exponential integrator linearised at ``e_hat``) gives DDIM,
paper eq. (plaid-ddim)::

    z_s = alpha_s e_hat + sigma_s (z_t - alpha_t e_hat) / sigma_t
        = (sigma_s / sigma_t) z_t + c(t, s) e_hat,   c(t, s) = alpha_s - sigma_s alpha_t / sigma_t.   (D1)

``c`` is affine-free of ``z``: writing ``sigma / alpha = exp(gamma / 2)``,
``c(t, s) = alpha_s (1 - exp((gamma_s - gamma_t) / 2)) = -alpha_s expm1((gamma_s - gamma_t) / 2) > 0``
for ``gamma_s < gamma_t``, so (D1) is invertible in ``e_hat``.

The teacher takes two DDIM steps ``t -> t' -> s`` (``t'`` the midpoint of the student's step on the
uniform time grid), each with its own prediction ``e_1 = teacher(z_t)``, ``e_2 = teacher(z_t')``::

    z_t' = (sigma_t' / sigma_t) z_t + c(t, t') e_1,    z''_s = (sigma_s / sigma_t') z_t' + c(t', s) e_2.   (D2)

The student's one step (D1) lands on ``z''_s`` exactly when its clean embedding is::

    e_tilde = (z''_s - (sigma_s / sigma_t) z_t) / c(t, s).                                               (D3)

(Salimans & Ho's eq. for x-prediction, with ``x`` the embedding.) (D3) holds for any endpoint ``z''_s``:
with ``solver="heun"`` the teacher takes two Heun (EDM) steps instead of (D2), four calls, and the
student's one DDIM step is trained to land where Heun lands (``replaid distill --teacher-solver heun``,
the first round only: later rounds' teachers are students trained to take DDIM steps). The student is trained on
``w(t) ||e_hat_student(z_t) - e_tilde||^2`` with their truncated-SNR weight ``w = max(SNR_t, 1)``,
``SNR = exp(-gamma)``. In the logits parameterisation ``e_hat = softmax(logits) @ E`` lies in the convex
hull of the embedding rows, while ``e_tilde`` need not: the loss then has a positive floor (the student
matches the hull point nearest in the metric), and no logit vector is a "target" (many give the same
``e_hat``). The loss is therefore taken on embeddings, where DDIM uses the prediction, never on logits;
the final tokens remain the argmax of the student's own logits at ``gamma(0)``.

Self-conditioning: the teacher runs its sampling protocol *within* the student's step (its first call
gets no self-conditioning input, its second gets ``e_1``, as ``sample_ddim`` does), and is reset at each
student step; the student sees no self-conditioning input (its config says ``self_conditioning: false``,
so its samplers and evaluation feed none). Its network still has the input, fed zeros, which the teacher
was trained on for 1 - ``sc_rate`` of its rows.

Consistency distillation (Song et al. 2023)
-------------------------------------------
The consistency function maps a latent at any level to the end of its PF-ODE trajectory at the cleanest
level ``gamma_min = gamma(0)``. It is parameterised through the student's clean embedding by one DDIM
step to the end::

    f(z, gamma) = (sigma_min / sigma) z + c(gamma, gamma_min) e_hat(z, gamma).                            (C1)

At ``gamma = gamma_min``, ``c = 0`` and ``sigma_min / sigma = 1``: ``f(z, gamma_min) = z`` for every
network, the boundary condition, by construction (Song et al.'s ``c_skip = 1, c_out = 0``). The loss
on adjacent levels ``gamma_i > gamma_{i+1}`` of the grid is::

    L = || f_student(z_i, gamma_i) - f_target(Phi(z_i; gamma_i -> gamma_{i+1}), gamma_{i+1}) ||^2 / alpha_min^2   (C2)

with ``Phi`` one teacher ODE step (Heun or DDIM) and ``f_target`` the EMA student (no gradient). It is
zero when the student is the exact ODE map and ``Phi`` the exact flow (tested with the oracle).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from replaid.sampling.continuous import _alpha_sigma, ddim_step, heun_step

# A denoiser step the distillers call: (z (B, L, d_e) float64, gamma float, e_sc or None) -> e_hat float64
EHat = Callable[[Tensor, float, Tensor | None], Tensor]


def ddim_coeffs(gamma_t: float, gamma_s: float) -> tuple[float, float]:
    """(D1): ``z_s = a z_t + c e_hat`` with ``a = sigma_s / sigma_t``, ``c = -alpha_s expm1((gamma_s - gamma_t) / 2)``."""
    _, s_t = _alpha_sigma(gamma_t)
    a_s, s_s = _alpha_sigma(gamma_s)
    return s_s / s_t, -a_s * math.expm1(0.5 * (gamma_s - gamma_t))


def ddim_coeffs_rows(gamma_t: Tensor, gamma_s: float) -> tuple[Tensor, Tensor]:
    """:func:`ddim_coeffs` for per-row ``gamma_t`` (B,) float64 and one ``gamma_s``; (B,) each."""
    a_s, s_s = _alpha_sigma(gamma_s)
    s_t = torch.sigmoid(gamma_t.double()).sqrt()
    return s_s / s_t, -a_s * torch.expm1(0.5 * (gamma_s - gamma_t.double()))


def ddim_inverse(z_t: Tensor, z_s: Tensor, gamma_t: float, gamma_s: float) -> Tensor:
    """(D3): the clean embedding whose one DDIM step ``gamma_t -> gamma_s`` takes ``z_t`` to ``z_s``.
    z_t, z_s: (B, L, d_e)."""
    if not gamma_s < gamma_t:
        raise ValueError(f"need gamma_s < gamma_t, got {gamma_s} >= {gamma_t}")
    a, c = ddim_coeffs(gamma_t, gamma_s)
    return (z_s - a * z_t) / c


def _heun(
    teacher: EHat, z: Tensor, gamma_t: float, gamma_s: float, self_cond: bool, e_sc: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One Heun step ``gamma_t -> gamma_s`` (predictor and corrector, VE form, as ``sample_heun``'s inner
    steps): its first call gets ``e_sc``, its corrector call the first call's ``e_hat`` when ``self_cond``.
    Returns (``z_s``, the corrector call's ``e_hat``)."""
    (a_t, _), (a_s, _) = _alpha_sigma(gamma_t), _alpha_sigma(gamma_s)
    st_t, st_s = math.exp(0.5 * gamma_t), math.exp(0.5 * gamma_s)
    e = teacher(z, gamma_t, e_sc)
    zb = z / a_t  # (B, L, d_e)
    zb_pred = heun_step(zb, e, st_t, st_s)
    e_pred = teacher(a_s * zb_pred, gamma_s, e if self_cond else None)
    return a_s * heun_step(zb, e, st_t, st_s, e_pred, zb_pred), e_pred


def teacher_two_step(
    teacher: EHat,
    z_t: Tensor,
    gamma_t: float,
    gamma_mid: float,
    gamma_s: float,
    self_cond: bool,
    solver: str = "ddim",
) -> Tensor:
    """(D2): the teacher's two steps ``gamma_t -> gamma_mid -> gamma_s``, each call after the first
    self-conditioned on the previous call's ``e_hat`` when ``self_cond`` (the samplers' protocol).
    ``solver``: ``ddim`` (2 calls, (D2) as written) or ``heun`` (4 calls: predictor and corrector in
    each step, EDM's VE form as :func:`replaid.sampling.continuous.sample_heun`). The student still
    takes one DDIM step: (D3) inverts whatever endpoint the teacher reaches.
    z_t (B, L, d_e) float64; returns ``z''_s``."""
    if solver == "heun":
        z_mid, e1 = _heun(teacher, z_t, gamma_t, gamma_mid, self_cond, None)
        z_s, _ = _heun(teacher, z_mid, gamma_mid, gamma_s, self_cond, e1 if self_cond else None)
        return z_s
    if solver != "ddim":
        raise ValueError(f"unknown teacher solver {solver!r}; choose ddim or heun")
    e1 = teacher(z_t, gamma_t, None)
    z_mid = ddim_step(z_t, e1, gamma_t, gamma_mid)
    e2 = teacher(z_mid, gamma_mid, e1 if self_cond else None)
    return ddim_step(z_mid, e2, gamma_mid, gamma_s)


def progressive_target(
    teacher: EHat,
    z_t: Tensor,
    gamma_t: float,
    gamma_mid: float,
    gamma_s: float,
    self_cond: bool,
    solver: str = "ddim",
) -> Tensor:
    """``e_tilde`` (D3) of the teacher's two-step endpoint (D2). (B, L, d_e) float64."""
    z_s = teacher_two_step(teacher, z_t, gamma_t, gamma_mid, gamma_s, self_cond, solver)
    return ddim_inverse(z_t, z_s, gamma_t, gamma_s)


def snr_weight(gamma: Tensor) -> Tensor:
    """Salimans & Ho's truncated-SNR weight ``max(SNR, 1)``, ``SNR = exp(-gamma)``."""
    return torch.clamp(torch.exp(-gamma), min=1.0)


def consistency_map(z: Tensor, e_hat: Tensor, gamma: float, gamma_min: float) -> Tensor:
    """(C1): ``f(z, gamma)``, one DDIM step to ``gamma_min``; the identity at ``gamma == gamma_min``."""
    if gamma == gamma_min:
        return z
    return ddim_step(z, e_hat, gamma, gamma_min)


def teacher_ode_step(teacher: EHat, z: Tensor, gamma_t: float, gamma_s: float, solver: str, self_cond: bool) -> Tensor:
    """One teacher PF-ODE step ``gamma_t -> gamma_s`` (``Phi`` in (C2)): ``heun`` (2 calls, EDM's
    VE form, as :func:`replaid.sampling.continuous.sample_heun`) or ``ddim`` (1 call)."""
    if solver == "heun":
        return _heun(teacher, z, gamma_t, gamma_s, self_cond, None)[0]
    if solver != "ddim":
        raise ValueError(f"unknown teacher solver {solver!r}; choose heun or ddim")
    return ddim_step(z, teacher(z, gamma_t, None), gamma_t, gamma_s)


def consistency_loss(f_student: Tensor, f_target: Tensor, gamma_min: float, weight: Tensor | None = None) -> Tensor:
    """(C2) per row: mean over (L, d_e) of ``||f_student - f_target||^2 / alpha_min^2`` (embedding
    units), times ``weight`` (B,) if given. f_*: (B, L, d_e). Returns (B,)."""
    a_min, _ = _alpha_sigma(gamma_min)
    d = ((f_student - f_target) ** 2).flatten(1).mean(1) / a_min**2  # (B,)
    return d if weight is None else d * weight


# ----------------------------------------------------------------------------------------------
# one batch of each loss (the loop in ``loop.py`` and the tests call these)
# ----------------------------------------------------------------------------------------------


def noisy_latents(E: Tensor, tokens: Tensor, gammas: Tensor, gen: torch.Generator) -> Tensor:
    """``z = alpha e + sigma eps`` at per-row ``gammas`` (B,) float64 (noise drawn on the CPU by ``gen``).
    tokens (B, L) -> (B, L, d_e) float64 on ``tokens``' device."""
    e = E.double().to(tokens.device)[tokens]  # (B, L, d_e)
    g = gammas.double().to(tokens.device)
    a, s = torch.sigmoid(-g).sqrt().view(-1, 1, 1), torch.sigmoid(g).sqrt().view(-1, 1, 1)
    eps = torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e.device)
    return a * e + s * eps


def student_ehat(student: torch.nn.Module, z: Tensor, gammas: Tensor) -> Tensor:
    """The student's ``e_hat`` with gradient and no self-conditioning input, per-row ``gammas`` (B,).
    z (B, L, d_e) float64 -> (B, L, d_e) float64."""
    dtype = next(student.parameters()).dtype  # float32 networks; a float64 one (tests) keeps float64
    e_hat: Tensor = student(z.to(dtype), gammas.to(z.device, torch.float64), None).e_hat.double()
    return e_hat


def _rows_by_level(idx: Tensor, device: torch.device) -> list[tuple[int, Tensor]]:
    """(level k, the rows drawn at it) for each level present in ``idx`` (B,)."""
    levels: list[int] = idx.unique().tolist()  # type: ignore[no-untyped-call]  # torch leaves Tensor.unique unannotated
    return [(k, (idx == k).nonzero().squeeze(1).to(device)) for k in levels]


def progressive_batch(
    student: torch.nn.Module,
    teacher: EHat,
    teacher_sc: bool,
    E: Tensor,
    tokens: Tensor,
    g_teacher: Tensor,
    gen: torch.Generator,
    solver: str = "ddim",
) -> tuple[Tensor, Tensor]:
    """Progressive-distillation loss of one batch: each row at a random student step ``k`` of the
    ``K = (len(g_teacher) - 1) / 2``-step grid (``g_teacher[2k]`` -> ``g_teacher[2k + 2]``), ``z_t`` drawn
    from ``q(z_t | x)``, the target (D3) of the teacher's two ``solver`` steps, weight ``max(SNR, 1)``.
    Returns (scalar loss, per-row unweighted ``mean ||e_hat - e_tilde||^2`` (B,))."""
    K = (len(g_teacher) - 1) // 2
    idx = torch.randint(0, K, (tokens.shape[0],), generator=gen)  # (B,) the student's step of each row
    gt = g_teacher[2 * idx]  # (B,)
    z = noisy_latents(E, tokens, gt, gen)  # (B, L, d_e)
    target = torch.empty_like(z)
    with torch.no_grad():
        for k, rows in _rows_by_level(idx, z.device):
            g3 = g_teacher[2 * k : 2 * k + 3].tolist()
            target[rows] = progressive_target(teacher, z[rows], g3[0], g3[1], g3[2], teacher_sc, solver)
    per_row = ((student_ehat(student, z, gt) - target) ** 2).flatten(1).mean(1)  # (B,)
    return (snr_weight(gt).to(z.device) * per_row).mean(), per_row.detach()


def consistency_batch(
    student: torch.nn.Module,
    teacher_step: Callable[[Tensor, float, float], Tensor],
    target_net: EHat,
    E: Tensor,
    tokens: Tensor,
    g: Tensor,
    gen: torch.Generator,
) -> Tensor:
    """Consistency-distillation loss (C2) of one batch: each row at a random level ``i`` of the grid ``g``
    (N + 1,), one teacher step ``teacher_step(z, g[i], g[i + 1])`` (e.g. :func:`teacher_ode_step`), the
    target network's ``f`` there (the identity at the last level: the boundary condition), the student's
    ``f`` at ``g[i]``. Returns the scalar loss."""
    N, g_min = len(g) - 1, float(g[-1])
    idx = torch.randint(0, N, (tokens.shape[0],), generator=gen)  # (B,)
    gi = g[idx]  # (B,)
    z = noisy_latents(E, tokens, gi, gen)  # (B, L, d_e)
    f_target = torch.empty_like(z)
    with torch.no_grad():
        for k, rows in _rows_by_level(idx, z.device):
            gk, gk1 = float(g[k]), float(g[k + 1])
            z_next = teacher_step(z[rows], gk, gk1)
            e_next = target_net(z_next, gk1, None) if k + 1 < N else z_next  # unused at gamma_min
            f_target[rows] = consistency_map(z_next, e_next, gk1, g_min)
    a, c = ddim_coeffs_rows(gi, g_min)  # (B,) each: (C1) per row
    f_student = a.to(z).view(-1, 1, 1) * z + c.to(z).view(-1, 1, 1) * student_ehat(student, z, gi)
    return consistency_loss(f_student, f_target, g_min).mean()
