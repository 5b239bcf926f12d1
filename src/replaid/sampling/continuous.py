"""Samplers of the continuous methods (RePlaid, Plaid, LangFlow): plain functions in the style of
k-diffusion (paper appendix "Sampler Update Formulas").

Every sampler has the one sampler contract (:mod:`replaid.sampling.contract`) with its own options:

    sample_X(denoiser, z, gammas, *, generator=None, callback=None, self_cond=None,
             inpaint=None, disable_progress=True) -> SampleResult

The registry (:data:`replaid.sampling.registry.REGISTRY`) holds them with their NFE.

* ``z``       (B, L, d_e) starting latent at t = 1 (the caller draws ``N(0, I)``).
* ``gammas``  1-D float64 tensor of length T + 1, strictly decreasing: ``gammas[0] = gamma(1)``
  (noisiest) ... ``gammas[T] = gamma(0)`` (cleanest); see :func:`gamma_grid`.
* Step ``i`` (0 <= i < T) evaluates the denoiser at ``(z, gammas[i])`` and moves the latent to
  ``gammas[i + 1]``. After the last step one more evaluation at ``gammas[T]`` gives the tokens
  as the ``argmax`` of its logits. NFE = T + 1 for DDPM, DDIM, DPM-Solver++(2M) and 2T for
  Heun (its corrector is skipped on the last step, as in EDM: 2(T - 1) + 1 + 1 readout).
  Multistep consistency sampling (:func:`sample_consistency`) makes no extra readout: NFE = T.

Notation: ``alpha^2 = sigmoid(-gamma)``, ``sigma^2 = sigmoid(gamma)`` (``sigma`` is always the
noise standard deviation), ``lambda = -gamma / 2 = log(alpha / sigma)``. The step coefficients
are computed in float64 from the grid, and the working latent is kept in float64; the denoiser
receives the latent in the dtype of the caller's ``z`` and ``SampleResult.z0`` is returned in
that dtype.

Options that change the denoiser (temperatures; later a guidance term adding ``w grad log p`` to
the prediction) are denoiser -> denoiser wrappers (:class:`LogitTemperature`, :class:`ScoreTemperature`),
so samplers never see them. Inpainting / infilling uses the replacement scheme (:class:`Inpaint`).
Editing (SDEdit) starts part-way: a grid from ``t_start < 1`` (:func:`time_grid`) and a ``z`` drawn
at ``gamma(t_start)`` by the caller; the samplers need nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.denoiser import Denoiser, DenoiserOutput, alpha_sigma
from replaid.diffusion.rng import Gen, RowGenerators, device_generator, randn
from replaid.sampling.contract import Callback, SampleResult, StepInfo

__all__ = [
    "SampleResult",
    "StepInfo",
    "time_grid",
    "gamma_grid",
    "ddpm_step",
    "ddim_step",
    "dpmpp_2m_extrapolate",
    "exp_integrator_step",
    "heun_step",
    "sample_ddpm",
    "sample_ddim",
    "sample_dpmpp_2m",
    "sample_heun",
    "sample_consistency",
    "LogitTemperature",
    "ScoreTemperature",
    "Inpaint",
    "prefix_inpaint",
    "parse_infill_spans",
    "infill_inpaint",
    "TrajectoryRecorder",
    "trajectory_recorder",
]


# ----------------------------------------------------------------------------------------------
# grids and scalar coefficients
# ----------------------------------------------------------------------------------------------


def time_grid(T: int, t_start: float = 1.0) -> Tensor:
    """Uniform diffusion-time grid ``t_i = t_start (1 - i / T)``, i = 0..T: (T + 1,) float64 from
    ``t_start`` (1: pure noise) to 0."""
    if int(T) < 1:
        raise ValueError(f"need at least one sampling step, got T={T}")
    if not 0.0 < t_start <= 1.0:
        raise ValueError(f"t_start must be in (0, 1], got {t_start}")
    return torch.linspace(t_start, 0.0, int(T) + 1, dtype=torch.float64)


def gamma_grid(
    schedule_fn: Callable[[Tensor], Any], T: int, *, device: torch.device | None = None, t_start: float = 1.0
) -> Tensor:
    """Noise grid ``gammas[i] = gamma(t_i)`` on :func:`time_grid`; (T + 1,) float64 on the CPU.

    ``schedule_fn`` maps a (T + 1,) float64 time tensor to gamma; a tuple result (e.g.
    ``NoiseSchedule.forward`` returning ``(gamma, gamma')``) contributes its first element.
    ``t`` is placed on ``device``, by default the device of ``schedule_fn``'s parameters when it
    is an ``nn.Module`` with any, else the CPU.
    """
    t = time_grid(T, t_start)
    if device is None and isinstance(schedule_fn, torch.nn.Module):
        p = next(iter(schedule_fn.parameters()), None)
        device = p.device if p is not None else None
    if device is not None:
        t = t.to(device)
    with torch.no_grad():
        g = schedule_fn(t)
    if isinstance(g, (tuple, list)):
        g = g[0]
    g = torch.as_tensor(g).detach().to("cpu", torch.float64).reshape(-1)
    _check_gammas(g)
    return g


def _check_gammas(gammas: Tensor) -> list[float]:
    """Validates a noise grid and returns it as Python floats (float64)."""
    if not isinstance(gammas, Tensor):
        gammas = torch.as_tensor(gammas, dtype=torch.float64)
    if gammas.ndim != 1 or gammas.numel() < 2:
        raise ValueError(f"gammas must be 1-D with T + 1 >= 2 entries, got shape {tuple(gammas.shape)}")
    g = gammas.detach().to("cpu", torch.float64)
    if not torch.isfinite(g).all():
        raise ValueError("gammas must be finite")
    if not (g[1:] < g[:-1]).all():
        raise ValueError("gammas must be strictly decreasing (from gamma(1) to gamma(0))")
    return g.tolist()


def _sigmoid(x: float) -> float:
    """Numerically stable logistic function on a Python float."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _alpha_sigma(gamma: float) -> tuple[float, float]:
    """``alpha = sqrt(sigmoid(-gamma))``, ``sigma = sqrt(sigmoid(gamma))`` in float64."""
    return math.sqrt(_sigmoid(-gamma)), math.sqrt(_sigmoid(gamma))


# ----------------------------------------------------------------------------------------------
# single-step updates (pure functions of float64 tensors and Python-float noise levels)
# ----------------------------------------------------------------------------------------------


def ddpm_step(z: Tensor, e_hat: Tensor, gamma_t: float, gamma_s: float, eps: Tensor) -> Tensor:
    """Ancestral step eq. (plaid-ancestral), ``s < t``:

    ``z_s = (1 - c)(alpha_s / alpha_t) z_t + c alpha_s e_hat + sqrt(c (1 - alpha_s^2)) eps``,
    ``c = 1 - exp(gamma_s - gamma_t)``. z, e_hat, eps: (B, L, d_e).
    """
    c = -math.expm1(gamma_s - gamma_t)  # per-step SNR gap, in (0, 1)
    a_t, _ = _alpha_sigma(gamma_t)
    a_s, _ = _alpha_sigma(gamma_s)
    one_minus_a2_s = _sigmoid(gamma_s)  # 1 - alpha_s^2 = sigma_s^2, without cancellation
    return (1.0 - c) * (a_s / a_t) * z + (c * a_s) * e_hat + math.sqrt(c * one_minus_a2_s) * eps


def ddim_step(z: Tensor, e_hat: Tensor, gamma_t: float, gamma_s: float) -> Tensor:
    """DDIM eq. (plaid-ddim): ``z_s = alpha_s e_hat + sigma_s eps_hat``,
    ``eps_hat = (z_t - alpha_t e_hat) / sigma_t``. z, e_hat: (B, L, d_e)."""
    a_t, s_t = _alpha_sigma(gamma_t)
    a_s, s_s = _alpha_sigma(gamma_s)
    eps_hat = (z - a_t * e_hat) / s_t  # (B, L, d_e)
    return a_s * e_hat + s_s * eps_hat


def exp_integrator_step(z: Tensor, D: Tensor, gamma_t: float, gamma_s: float) -> Tensor:
    """DPM-Solver++ data-prediction step eq. (dpmpp-update):
    ``z_s = (sigma_s / sigma_t) z_t - alpha_s (exp(-h) - 1) D`` with
    ``h = lambda_s - lambda_t = (gamma_t - gamma_s) / 2``. With ``D = e_hat`` it equals DDIM."""
    _, s_t = _alpha_sigma(gamma_t)
    a_s, s_s = _alpha_sigma(gamma_s)
    h = 0.5 * (gamma_t - gamma_s)
    return (s_s / s_t) * z - (a_s * math.expm1(-h)) * D


def dpmpp_2m_extrapolate(e_prev: Tensor, e_prev2: Tensor, h_prev: float, h: float) -> Tensor:
    """Multistep term eq. (dpmpp-extrap): ``D = (1 + 1/(2r)) e_prev - 1/(2r) e_prev2``,
    ``r = h_prev / h`` (``e_prev`` from the current evaluation, ``e_prev2`` from the last one)."""
    r = h_prev / h
    w = 1.0 / (2.0 * r)
    return (1.0 + w) * e_prev - w * e_prev2


def heun_step(
    z_bar: Tensor,
    e_hat: Tensor,
    st_t: float,
    st_s: float,
    e_hat_pred: Tensor | None = None,
    z_bar_pred: Tensor | None = None,
) -> Tensor:
    """Heun in the VE form ``d z_bar / d sigma_tilde = (z_bar - e_hat) / sigma_tilde``
    (eqs. heun-ve-pred / heun-ve-corr), ``z_bar = z / alpha``, ``sigma_tilde = exp(gamma / 2)``.

    Without ``e_hat_pred`` returns the Euler predictor ``z_bar'_s``; with ``e_hat_pred`` (the
    denoiser at ``(z_bar'_s, sigma_tilde_s)``) and ``z_bar_pred = z_bar'_s`` returns the
    corrected ``z_bar_s``. All tensors (B, L, d_e).
    """
    d = (z_bar - e_hat) / st_t  # eps_hat(z_bar_t, sigma_tilde_t)
    if e_hat_pred is None:
        return z_bar + (st_s - st_t) * d
    if z_bar_pred is None:
        z_bar_pred = z_bar + (st_s - st_t) * d
    d_pred = (z_bar_pred - e_hat_pred) / st_s  # eps_hat(z_bar'_s, sigma_tilde_s)
    return z_bar + 0.5 * (st_s - st_t) * (d + d_pred)


# ----------------------------------------------------------------------------------------------
# inpainting / infilling (replacement scheme)
# ----------------------------------------------------------------------------------------------


@dataclass
class Inpaint:
    """Replacement-based conditioning on known tokens.

    After each update to noise level ``gamma_s`` (and once at ``gammas[0]`` before the first
    evaluation) the latents at known positions are overwritten with fresh forward samples
    ``alpha_s e + sigma_s eps`` of the true embeddings; the final tokens at known positions are
    forced to the known tokens.

    known_tokens: (B, L) or (L,) long (values at unknown positions are ignored);
    known_mask: (B, L) or (L,) bool, True where the token is known; E: (V, d_e).
    """

    known_tokens: Tensor
    known_mask: Tensor
    E: Tensor

    def __post_init__(self) -> None:
        if self.known_tokens.shape[-1] != self.known_mask.shape[-1]:
            raise ValueError("known_tokens and known_mask must share the sequence length")
        if self.E.ndim != 2:
            raise ValueError("E must be (V, d_e)")
        self.known_mask = self.known_mask.bool()
        self.known_tokens = self.known_tokens.long()

    def _expanded(self, B: int, L: int, device: torch.device) -> tuple[Tensor, Tensor]:
        mask = self.known_mask.to(device).expand(B, L)  # (B, L)
        tok = self.known_tokens.to(device).expand(B, L).clamp(0, self.E.shape[0] - 1)  # (B, L)
        return tok, mask

    def replace(self, z: Tensor, gamma: float, generator: Gen | None = None) -> Tensor:
        """Returns z (B, L, d_e) with known positions set to ``alpha e + sigma eps`` at ``gamma`` (per-row
        streams: only those of rows with a known position draw, as each request would alone)."""
        B, L, _ = z.shape
        tok, mask = self._expanded(B, L, z.device)
        a, s = _alpha_sigma(gamma)
        e = self.E.to(z.device, z.dtype)[tok]  # (B, L, d_e)
        gen = device_generator(generator, z.device)
        if isinstance(gen, RowGenerators):
            gen = gen.only(mask.any(-1))
        eps = randn(tuple(z.shape), gen, z.device, z.dtype)
        return torch.where(mask[..., None], a * e + s * eps, z)

    def force_tokens(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) with known positions set to the known tokens."""
        B, L = tokens.shape
        tok, mask = self._expanded(B, L, tokens.device)
        return torch.where(mask, tok, tokens)


def prefix_inpaint(prompt_ids: Tensor, L: int, E: Tensor) -> Inpaint:
    """Conditions on a prompt prefix: ``prompt_ids`` (B, P) known at positions 0..P-1 of L."""
    if prompt_ids.ndim == 1:
        prompt_ids = prompt_ids[None]
    B, P = prompt_ids.shape
    if P > L:
        raise ValueError(f"prompt length {P} exceeds sequence length {L}")
    tokens = torch.zeros(B, L, dtype=torch.long, device=prompt_ids.device)
    tokens[:, :P] = prompt_ids
    mask = torch.zeros(B, L, dtype=torch.bool, device=prompt_ids.device)
    mask[:, :P] = True
    return Inpaint(tokens, mask, E)


def parse_infill_spans(spec: str, L: int) -> Tensor:
    """Known-position mask (L,) bool from spans to fill, e.g. ``"3:10,20:25"``.

    Each ``start:end`` is a half-open span ``[start, end)`` to be generated (either end may be
    omitted as in Python slices: ``":5"``, ``"30:"``); every other position is known.
    """
    mask = torch.ones(L, dtype=torch.bool)
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            raise ValueError(f"bad infill span {part!r}: expected 'start:end'")
        a, b = (x.strip() for x in part.split(":", 1))
        start = int(a) if a else 0
        end = int(b) if b else L
        if not 0 <= start < end <= L:
            raise ValueError(f"bad infill span {part!r} for length {L}")
        mask[start:end] = False
    return mask


def infill_inpaint(reference_ids: Tensor, spec: str, E: Tensor) -> Inpaint:
    """Infilling: ``reference_ids`` (B, L) known except on the spans of ``spec``."""
    if reference_ids.ndim == 1:
        reference_ids = reference_ids[None]
    mask = parse_infill_spans(spec, reference_ids.shape[-1]).to(reference_ids.device)
    return Inpaint(reference_ids, mask.expand_as(reference_ids), E)


# ----------------------------------------------------------------------------------------------
# shared sampling machinery
# ----------------------------------------------------------------------------------------------


class _Run:
    """Bookkeeping shared by the samplers: denoiser calls (NFE, self-conditioning, dtypes),
    noise, inpainting replacement, callbacks and the final readout."""

    def __init__(
        self,
        denoiser: Denoiser,
        z: Tensor,
        gammas: Tensor,
        generator: Gen | None,
        callback: Callback | None,
        self_cond: bool | None,
        inpaint: Inpaint | None,
        disable_progress: bool,
        name: str,
    ):
        if z.ndim != 3:
            raise ValueError(f"z must be (B, L, d_e), got shape {tuple(z.shape)}")
        self.denoiser = denoiser
        self.g = _check_gammas(gammas)
        self.T = len(self.g) - 1
        self.in_dtype = z.dtype
        self.device = z.device
        self.B = z.shape[0]
        self.generator = device_generator(generator, z.device)  # noise drawn where z lives
        self.callback = callback
        self.inpaint = inpaint
        self.sc = bool(denoiser.self_conditioning) if self_cond is None else bool(self_cond)
        self.e_sc: Tensor | None = None
        self.nfe = 0
        self.name = name
        self.disable_progress = disable_progress

    def start(self, z: Tensor) -> Tensor:
        """Working float64 latent at gammas[0] (known positions replaced when inpainting)."""
        z = z.detach().to(torch.float64)
        return self.replace(z, self.g[0])

    def steps(self) -> Iterable[int]:
        """The step indices 0 .. T - 1 (a progress bar unless ``disable_progress``)."""
        bar: Iterable[int] = tqdm(range(self.T), disable=self.disable_progress, desc=self.name, leave=False)
        return bar

    def evaluate(self, z: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
        """One denoiser call at (z (B, L, d_e) float64, gamma); returns (logits, e_hat float64)."""
        gam = torch.full((self.B,), gamma, dtype=torch.float64, device=self.device)  # (B,)
        out = self.denoiser(z.to(self.in_dtype), gam, self.e_sc if self.sc else None)
        logits, e_hat = out
        self.nfe += 1
        if self.sc:
            self.e_sc = e_hat  # fed back at the next evaluation
        return logits, e_hat.to(torch.float64)

    def randn(self, like: Tensor) -> Tensor:
        return randn(tuple(like.shape), self.generator, like.device, like.dtype)

    def replace(self, z: Tensor, gamma: float) -> Tensor:
        if self.inpaint is None:
            return z
        return self.inpaint.replace(z, gamma, self.generator)

    def report(self, i: int, z: Tensor, logits: Tensor, e_hat: Tensor) -> None:
        if self.callback is not None:
            self.callback(
                StepInfo(
                    i=i,
                    T=self.T,
                    gamma=self.g[i],
                    gamma_next=self.g[i + 1],
                    z=z,
                    e_hat=e_hat,
                    logits=logits,
                    nfe=self.nfe,
                )
            )

    def finish(self, z: Tensor) -> SampleResult:
        logits, _ = self.evaluate(z, self.g[-1])
        tokens = logits.argmax(-1)  # (B, L)
        if self.inpaint is not None:
            tokens = self.inpaint.force_tokens(tokens)
        return SampleResult(tokens=tokens, z0=z.to(self.in_dtype), nfe=self.nfe, logits=logits)


# ----------------------------------------------------------------------------------------------
# samplers
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def sample_ddpm(
    denoiser: Denoiser,
    z: Tensor,
    gammas: Tensor,
    *,
    generator: Gen | None = None,
    callback: Callback | None = None,
    self_cond: bool | None = None,
    inpaint: Inpaint | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Stochastic ancestral sampler, eq. (plaid-ancestral) (the paper's default). NFE = T + 1."""
    run = _Run(denoiser, z, gammas, generator, callback, self_cond, inpaint, disable_progress, "ddpm")
    g = run.g
    z = run.start(z)  # (B, L, d_e) float64
    for i in run.steps():
        logits, e_hat = run.evaluate(z, g[i])
        z = ddpm_step(z, e_hat, g[i], g[i + 1], run.randn(z))
        z = run.replace(z, g[i + 1])
        run.report(i, z, logits, e_hat)
    return run.finish(z)


@torch.no_grad()
def sample_ddim(
    denoiser: Denoiser,
    z: Tensor,
    gammas: Tensor,
    *,
    generator: Gen | None = None,
    callback: Callback | None = None,
    self_cond: bool | None = None,
    inpaint: Inpaint | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Deterministic DDIM, eq. (plaid-ddim). NFE = T + 1."""
    run = _Run(denoiser, z, gammas, generator, callback, self_cond, inpaint, disable_progress, "ddim")
    g = run.g
    z = run.start(z)
    for i in run.steps():
        logits, e_hat = run.evaluate(z, g[i])
        z = ddim_step(z, e_hat, g[i], g[i + 1])
        z = run.replace(z, g[i + 1])
        run.report(i, z, logits, e_hat)
    return run.finish(z)


@torch.no_grad()
def sample_dpmpp_2m(
    denoiser: Denoiser,
    z: Tensor,
    gammas: Tensor,
    *,
    generator: Gen | None = None,
    callback: Callback | None = None,
    self_cond: bool | None = None,
    inpaint: Inpaint | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """DPM-Solver++(2M), eqs. (dpmpp-extrap) and (dpmpp-update) in ``lambda = -gamma / 2``;
    the first step uses ``D_1 = e_hat`` (the DDIM update). NFE = T + 1."""
    run = _Run(denoiser, z, gammas, generator, callback, self_cond, inpaint, disable_progress, "dpmpp2m")
    g = run.g
    z = run.start(z)
    e_old: Tensor | None = None
    h_old = 0.0
    for i in run.steps():
        logits, e_hat = run.evaluate(z, g[i])
        h = 0.5 * (g[i] - g[i + 1])  # lambda_{i+1} - lambda_i > 0
        D = e_hat if e_old is None else dpmpp_2m_extrapolate(e_hat, e_old, h_old, h)
        z = exp_integrator_step(z, D, g[i], g[i + 1])
        z = run.replace(z, g[i + 1])
        run.report(i, z, logits, e_hat)
        e_old, h_old = e_hat, h
    return run.finish(z)


@torch.no_grad()
def sample_heun(
    denoiser: Denoiser,
    z: Tensor,
    gammas: Tensor,
    *,
    generator: Gen | None = None,
    callback: Callback | None = None,
    self_cond: bool | None = None,
    inpaint: Inpaint | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Heun (EDM) predictor-corrector on the VE form of the PFODE (eqs. heun-ve-pred/-corr),
    ``z_bar = z / alpha``, ``sigma_tilde = exp(gamma / 2)``, ``z = alpha z_bar``. The corrector is
    skipped on the last step: NFE = 2(T - 1) + 1 + 1 (readout) = 2T.

    When inpainting, known positions are also replaced in the predictor latent before the
    corrector evaluation.
    """
    run = _Run(denoiser, z, gammas, generator, callback, self_cond, inpaint, disable_progress, "heun")
    g = run.g
    z = run.start(z)
    for i in run.steps():
        (a_t, _), (a_s, _) = _alpha_sigma(g[i]), _alpha_sigma(g[i + 1])
        st_t, st_s = math.exp(0.5 * g[i]), math.exp(0.5 * g[i + 1])
        logits, e_hat = run.evaluate(z, g[i])
        z_bar = z / a_t  # (B, L, d_e)
        z_bar_pred = heun_step(z_bar, e_hat, st_t, st_s)  # Euler predictor
        if i == run.T - 1:
            z_bar_new = z_bar_pred
        else:
            z_pred = run.replace(a_s * z_bar_pred, g[i + 1])
            z_bar_pred = z_pred / a_s
            _, e_hat_pred = run.evaluate(z_pred, g[i + 1])
            z_bar_new = heun_step(z_bar, e_hat, st_t, st_s, e_hat_pred, z_bar_pred)
        z = run.replace(a_s * z_bar_new, g[i + 1])
        run.report(i, z, logits, e_hat)
    return run.finish(z)


@torch.no_grad()
def sample_consistency(
    denoiser: Denoiser,
    z: Tensor,
    gammas: Tensor,
    *,
    generator: Gen | None = None,
    callback: Callback | None = None,
    self_cond: bool | None = None,
    inpaint: Inpaint | None = None,
    disable_progress: bool = True,
) -> SampleResult:
    """Multistep consistency sampling (Song et al. 2023, Alg. 1) for a consistency-distilled student
    (``replaid distill --method consistency``): at ``gammas[i]`` the network predicts the clean
    embedding ``e_hat``; before the next level it is noised afresh, ``z = alpha_{i+1} e_hat +
    sigma_{i+1} eps``. The tokens are the argmax of the last prediction (at ``gammas[T - 1]``), so
    NFE = T (1 step: one network call). Works on any continuous run (then it is plain multistep
    x0-prediction sampling)."""
    run = _Run(denoiser, z, gammas, generator, callback, self_cond, inpaint, disable_progress, "consistency")
    g = run.g
    z = run.start(z)
    logits = torch.empty(0)
    for i in run.steps():
        logits, e_hat = run.evaluate(z, g[i])
        if i < run.T - 1:
            a_s, s_s = _alpha_sigma(g[i + 1])
            z = a_s * e_hat + s_s * run.randn(z)  # (B, L, d_e), fresh noise at the next level
            z = run.replace(z, g[i + 1])
        run.report(i, z, logits, e_hat)
    tokens = logits.argmax(-1)  # (B, L)
    if run.inpaint is not None:
        tokens = run.inpaint.force_tokens(tokens)
    return SampleResult(tokens=tokens, z0=z.to(run.in_dtype), nfe=run.nfe, logits=logits)


# ----------------------------------------------------------------------------------------------
# denoiser wrappers
# ----------------------------------------------------------------------------------------------


class _Tempered:
    """A denoiser -> denoiser wrapper with a positive temperature ``tau`` (tau = 1 is the identity);
    it offers the :class:`~replaid.diffusion.denoiser.Denoiser` interface of the one it wraps."""

    allows_zero = False  # LogitTemperature takes tau = 0 too: its greedy limit

    def __init__(self, denoiser: Denoiser, tau: float):
        if not (math.isfinite(tau) and (tau > 0 or (tau == 0 and self.allows_zero))):
            raise ValueError(f"temperature must be a finite number {'>=' if self.allows_zero else '>'} 0, got {tau}")
        self.inner, self.tau = denoiser, float(tau)

    @property
    def self_conditioning(self) -> bool:
        return self.inner.self_conditioning

    def embedding_matrix(self) -> Tensor:
        return self.inner.embedding_matrix()


class LogitTemperature(_Tempered):
    """Logit temperature (CANDI style, appendix "temperature"): ``logits / tau`` and
    ``e_hat = softmax(logits / tau) @ E``. The argmax readout is unchanged; tau = 1 is the identity;
    tau = 0 is the greedy limit, ``e_hat = E[argmax logits]`` (logits left as they are)."""

    allows_zero = True

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        out = self.inner(z, gamma, e_sc)
        if self.tau == 1.0:
            return out
        E = self.inner.embedding_matrix().to(out.logits.device, torch.float32)  # (V, d_e)
        if self.tau == 0.0:
            return DenoiserOutput(out.logits, E[out.logits.argmax(-1)].to(out.e_hat.dtype))  # (B, L, d_e)
        logits = out.logits / self.tau  # (B, L, V)
        e_hat = torch.softmax(logits.float(), dim=-1) @ E  # (B, L, d_e)
        return DenoiserOutput(logits, e_hat.to(out.e_hat.dtype))


class ScoreTemperature(_Tempered):
    """Plaid's score temperature: ``eps_hat = (z - alpha e_hat) / sigma``, ``eps_hat /= tau``,
    ``e_hat = (z - sigma eps_hat) / alpha``; logits untouched. tau = 1 is the identity."""

    def __call__(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None = None) -> DenoiserOutput:
        out = self.inner(z, gamma, e_sc)
        if self.tau == 1.0:
            return out
        alpha, sigma = alpha_sigma(gamma.double())
        alpha, sigma = alpha.view(-1, 1, 1), sigma.view(-1, 1, 1)  # (B, 1, 1)
        z64 = z.double()
        eps_hat = (z64 - alpha * out.e_hat.double()) / sigma  # (B, L, d_e)
        eps_hat = eps_hat / self.tau
        e_hat = (z64 - sigma * eps_hat) / alpha
        return DenoiserOutput(out.logits, e_hat.to(out.e_hat.dtype))


# ----------------------------------------------------------------------------------------------
# trajectories
# ----------------------------------------------------------------------------------------------


class TrajectoryRecorder:
    """Callback storing ``(i, argmax tokens (B, L) on the CPU)`` every ``every`` steps (and at
    the last step) in ``records``, and ``(i, decode(tokens))`` in ``texts`` when ``decode`` is
    given. The tokens are the denoiser's argmax prediction at ``gammas[i]``."""

    def __init__(self, every: int = 1, decode: Callable[[Tensor], Any] | None = None):
        if int(every) < 1:
            raise ValueError("every must be >= 1")
        self.every = int(every)
        self.decode = decode
        self.records: list[tuple[int, Tensor]] = []
        self.texts: list[tuple[int, Any]] = []

    def __call__(self, info: StepInfo) -> None:
        i, T = info["i"], info["T"]
        if i % self.every != 0 and (T is None or i != T - 1):
            return
        tokens = info["logits"].argmax(-1).cpu()
        self.records.append((i, tokens))
        if self.decode is not None:
            self.texts.append((i, self.decode(tokens)))


def trajectory_recorder(every: int = 1, decode: Callable[[Tensor], Any] | None = None) -> TrajectoryRecorder:
    """A callback recording the emerging argmax tokens every ``every`` steps (see above)."""
    return TrajectoryRecorder(every, decode)
