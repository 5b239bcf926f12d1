"""Duo: uniform-state discrete diffusion (UDLM NELBO) with the Gaussian-to-discrete curriculum.

Forward process ``q(z_t | x) = Cat(alpha_t onehot(x) + (1 - alpha_t)/V)`` with the reference
log-linear schedule (s-sahoo/duo ``LogLinear``, eps = 1e-3): ``alpha_t = 1 - (1 - eps) t``,
``alpha'_t = -(1 - eps)``, ``t`` in ``[eps, 1]`` (``t = eps + (1 - eps) s``, ``s`` low-discrepancy;
in training the trainer slices ``s`` from the global batch). So ``alpha`` stays in
``[eps, 1 - eps(1 - eps)]``: the stretch ``t -> 0``, where the estimator's second moment blows up
(terms ~ 1/t with probability ~ t), is not integrated, exactly as the reference.

Continuous-time NELBO per position (the limit of the discrete-step KLs; derived here, it is the
closed form of UDLM): with ``N = V``, ``xb = N alpha onehot(x) + 1 - alpha``,
``xt = N alpha x_theta + 1 - alpha`` and ``i = z_t``,

    -alpha' / (N alpha) * [ N/xt_i - N/xb_i + sum_j (xb_j / xb_i) log(xb_j xt_i / (xt_j xb_i)) ]

(each bracket is >= 0 and vanishes when ``x_theta = onehot(x)``). At a uniform prediction the
integral over all of ``[0, 1]`` equals ``log V`` exactly.

Curriculum (Duo's ``nll`` in ``algo.py``): it is active from step 0 until ``curriculum_end``
(inclusive, as the reference's ``global_step > curriculum_end`` test), then the true NELBO
above. While active, ``gamma = gamma_min + t (gamma_max - gamma_min)`` with the same ``t`` in
``[eps, 1]``, ``w = a onehot(x) + s eps`` in R^V (variance preserving, ``a^2 = sigmoid(-gamma)``),
the network sees the soft weights ``softmax(w / tau)`` over its embedding rows, with
``log10 tau`` = ``tau_log10_start`` before ``curriculum_start``, then linear to ``tau_log10_end``
at ``curriculum_end``; the loss is the UDLM NELBO integrand at ``z_t = argmax(w)`` with the
diffusion transformation operator ``alpha = T(gamma) = (V p(gamma) - 1)/(V - 1)``,
``p(gamma) = int phi(u - exp(-gamma/2)) Phi(u)^(V-1) du``, tabulated once per V in float64, and
``alpha' = (gamma_max - gamma_min) dT/dgamma`` (exact derivative; the reference takes a forward
difference of step 1e-3). Window and ranges: ``duo.*`` (fractions of ``train.steps``);
the published OWT run (``scripts/train_owt_duo.sh``: tau = 1e-3 throughout, gamma in
[-3.55, -1.85], curriculum over the first 500k of 1M steps) is the ``owt-0.1b-duo`` preset.
The network is conditioned on ``1 - alpha_t`` in both phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from replaid.config import RunConfig, check
from replaid.diffusion.nelbo import masked_mean, stratified_time_average
from replaid.diffusion.rng import device_generator
from replaid.methods.base import Kind, Method, Metrics
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT

EPS = 1e-3

# ------------------------------------------------------------------ the diffusion transformation operator

_Y = np.linspace(-10.0, 10.0, 4001)  # u - mu, Simpson grid (phi(10) ~ 8e-23)
_TABLE_GAMMA = np.linspace(-10.0, 10.0, 4001)


def _simpson(f: np.ndarray, h: float) -> np.ndarray:
    """Composite Simpson over the last axis (odd number of points)."""
    out: np.ndarray = h / 3 * (f[..., 0] + f[..., -1] + 4 * f[..., 1:-1:2].sum(-1) + 2 * f[..., 2:-1:2].sum(-1))
    return out  # f's shape without its last axis


def duo_p(gamma: np.ndarray, V: int) -> tuple[np.ndarray, np.ndarray]:
    """``p(gamma)`` = P(argmax of ``mu e_x + eps`` is x), ``mu = exp(-gamma/2)``, and ``dp/dgamma``.
    Simpson on a grid of ``u - mu`` in float64, ``log Phi`` through scipy's ``log_ndtr``."""
    from scipy.special import log_ndtr

    g = np.asarray(gamma, dtype=np.float64)
    mu = np.exp(-g / 2)[..., None]
    y = _Y
    phi_y = np.exp(-0.5 * y**2) / math.sqrt(2 * math.pi)
    lphi = log_ndtr(y + mu)  # log Phi(u)
    p = _simpson(phi_y * np.exp((V - 1) * lphi), y[1] - y[0])
    phi_u = np.exp(-0.5 * (y + mu) ** 2) / math.sqrt(2 * math.pi)
    dp_dmu = _simpson(phi_y * (V - 1) * phi_u * np.exp((V - 2) * lphi), y[1] - y[0])
    return p, dp_dmu * (-mu[..., 0] / 2)


@lru_cache(maxsize=8)
def _table(V: int) -> tuple[np.ndarray, np.ndarray]:
    p, dp = duo_p(_TABLE_GAMMA, V)
    return (V * p - 1) / (V - 1), V * dp / (V - 1)


@lru_cache(maxsize=8)
def _device_table(V: int, device: torch.device) -> Tensor:
    """``_table(V)`` as one (2, n) float64 tensor on ``device`` (one copy per (V, device), not per step)."""
    return torch.from_numpy(np.stack(_table(V))).to(device)


def duo_alpha(gamma: Tensor, V: int) -> tuple[Tensor, Tensor]:
    """``(alpha(gamma), d alpha / d gamma)`` of the operator, float64, from the cached table
    (linear interpolation on its uniform grid, as ``np.interp``; gamma clipped to [-10, 10]).
    Computed on ``gamma``'s device: no host read in the training step."""
    tab = _device_table(V, gamma.device)  # (2, n)
    n = tab.shape[1]
    lo, hi = float(_TABLE_GAMMA[0]), float(_TABLE_GAMMA[-1])
    pos = (gamma.detach().double().clamp(lo, hi) - lo) * ((n - 1) / (hi - lo))  # fractional grid index
    i0 = pos.floor().clamp(max=n - 2).long()
    frac = pos - i0
    a0, a1 = tab[:, i0], tab[:, i0 + 1]  # (2, *gamma.shape)
    out = a0 + frac * (a1 - a0)
    return out[0], out[1]


# ------------------------------------------------------------------ the UDLM NELBO integrand


def udlm_integrand(logits: Tensor, x: Tensor, z: Tensor, alpha: Tensor, dalpha: Tensor) -> Tensor:
    """Per position (B, L) float64: ``-alpha'/(N alpha) [ ... ]`` (module docstring).
    logits (B, L, V); x, z (B, L) clean and noisy ids; alpha, dalpha (B,) float64.

    Memory: the only V-sized tensors are at the logits' precision (at least float32; float64 logits
    give float64 throughout); the sum over V accumulates in float64 and the per-position terms
    (at ``z`` and ``x``) are recomputed in float64 from the gathered log-probabilities."""
    V = logits.shape[-1]
    a = alpha.double().view(-1, 1)
    da = dalpha.double().view(-1, 1)
    wide = torch.promote_types(logits.dtype, torch.float32)
    lsm = torch.log_softmax(logits.to(wide), -1)  # (B, L, V)
    a3 = a.unsqueeze(-1).to(wide)
    # log xt_j = log(N a x_theta_j + 1 - a), stably; summed over j in float64
    log_xt = torch.logaddexp(torch.log(V * a3) + lsm, torch.log1p(-a3).expand_as(lsm))
    sum_log_xt = log_xt.sum(-1, dtype=torch.float64)
    del log_xt

    def log_xt_at(ids: Tensor) -> Tensor:
        l_ = lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1).double()
        return torch.logaddexp(torch.log(V * a) + l_, torch.log1p(-a).expand_as(l_))

    log_xt_i, log_xt_x = log_xt_at(z), log_xt_at(x)
    xb_i = V * a * (z == x).double() + (1 - a)
    S = torch.xlogy(V * a + 1 - a, V * a + 1 - a) + (V - 1) * torch.xlogy(1 - a, 1 - a)  # sum_j xb log xb
    T = (1 - a) * sum_log_xt + V * a * log_xt_x  # sum_j xb_j log xt_j
    bracket = V * torch.exp(-log_xt_i) - V / xb_i + (S - T) / xb_i + (V / xb_i) * (log_xt_i - torch.log(xb_i))
    return (-da / (V * a)) * bracket


def uniform_corrupt(x: Tensor, alpha: Tensor, V: int, generator: torch.Generator | None) -> Tensor:
    """Sample ``z ~ alpha onehot(x) + (1 - alpha)/V`` per position. alpha: (B,)."""
    B, L = x.shape
    gen = device_generator(generator, x.device)
    keep = torch.rand(B, L, generator=gen, dtype=torch.float64, device=x.device) < alpha.view(-1, 1)
    rnd = torch.randint(0, V, (B, L), generator=gen, device=x.device)
    return torch.where(keep, x, rnd)


@dataclass
class DuoOptions:
    """``method=duo``, the config section ``duo``: the Gaussian curriculum (s-sahoo/duo
    configs/algo/duo.yaml; fractions of train.steps): active from step 0 to curriculum_end (0 = off),
    log10 tau ramps from start to end over [start, end]."""

    curriculum_start: float = 0.1
    curriculum_end: float = 0.2
    gamma_min: float = -3.5
    gamma_max: float = -1.75
    tau_log10_start: float = -1.0
    tau_log10_end: float = -2.0

    def validate(self) -> None:
        check(
            0 <= self.curriculum_start <= self.curriculum_end <= 1,
            "duo.curriculum_start",
            "need 0 <= curriculum_start <= curriculum_end <= 1",
        )
        check(self.gamma_min < self.gamma_max, "duo.gamma_min", "must be < duo.gamma_max")


class DuoMethod(Method[TokenDiT]):
    name = "duo"
    kind = Kind.UNIFORM
    description = "Duo (uniform-state discrete diffusion; NELBO bound)"
    samplers = ("ancestral",)
    global_times = True  # the trainer passes t_diff, sliced from the global batch
    options = DuoOptions
    model_keys = TOKEN_MODEL_KEYS

    def __init__(self, cfg: RunConfig, eps: float = EPS):
        """Curriculum window and ranges from the config's :class:`DuoOptions` (module docstring)."""
        super().__init__(cfg)
        self.eps = eps
        d: DuoOptions = cfg.options
        self.curriculum = (d.curriculum_start, d.curriculum_end)
        self.gamma_range = (d.gamma_min, d.gamma_max)
        self.tau_log10 = (d.tau_log10_start, d.tau_log10_end)
        self.step = 0

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(self.cfg.model, vocab_size, vocab_size, time_conditioning=True, causal=False)

    def times(self, n: int, generator: torch.Generator, t_diff: Tensor | None = None) -> Tensor:
        """``t = eps + (1 - eps) s`` (n,) float64; ``s = (i + u)/n`` unless the trainer's slice is given."""
        if t_diff is None:
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            t_diff = (torch.arange(n, dtype=torch.float64) + u) / n
        return self.eps + (1 - self.eps) * t_diff.double()  # on t_diff's device: no host copy

    def schedule(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``(alpha_t, alpha'_t) = (1 - (1 - eps) t, -(1 - eps))``, float64."""
        return 1 - (1 - self.eps) * t, torch.full_like(t, -(1 - self.eps))

    def curriculum_tau(self) -> float | None:
        """tau at the current step while the curriculum is active (steps ``0 .. end``), else None.
        ``curriculum_end = 0`` turns the curriculum off."""
        total = self.cfg.train.steps
        lo, hi = self.curriculum[0] * total, self.curriculum[1] * total
        if hi <= 0 or self.step > hi:
            return None
        f = 0.0 if self.step < lo else (self.step - lo) / max(hi - lo, 1e-12)
        l0, l1 = self.tau_log10
        return float(10 ** (l0 + (l1 - l0) * min(f, 1.0)))

    def loss_rows(
        self,
        model: TokenDiT,
        tokens: Tensor,
        t: Tensor,
        generator: torch.Generator | None,
        mask: Tensor | None = None,
        clean: Tensor | None = None,
    ) -> Tensor:
        """UDLM NELBO estimate per row at times t (B,) in [eps, 1] (no curriculum). ``clean`` (B, L)
        bool: positions never corrupted (a conditional's context)."""
        V = model.n_out
        alpha, dalpha = (a.to(tokens.device) for a in self.schedule(t.double()))
        z = uniform_corrupt(tokens, alpha, V, generator)
        if clean is not None:
            z = torch.where(clean.bool(), tokens, z)
        logits = model(z, (1 - alpha).float())
        f = udlm_integrand(logits, tokens, z, alpha, dalpha)
        return masked_mean(f, mask)

    def train_loss(
        self,
        model: TokenDiT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, Metrics]:
        B, L = tokens.shape
        V = model.n_out
        dev = tokens.device
        t = self.times(B, generator, t_diff).to(dev)  # (B,) float64 (the trainer's slice is on dev already)
        tau = self.curriculum_tau()
        if tau is None:
            rows = self.loss_rows(model, tokens, t, generator, mask)
            return rows.mean(), {"loss": rows.detach(), "tau": 0.0}
        g0, g1 = self.gamma_range
        gamma = g0 + (g1 - g0) * t
        alpha, dalpha_dg = duo_alpha(gamma, V)
        alpha = alpha.clamp(1e-9, 1 - 1e-9)
        a_g = torch.sigmoid(-gamma).sqrt().to(dev).view(-1, 1, 1)
        s_g = torch.sigmoid(gamma).sqrt().to(dev).view(-1, 1, 1)
        eps = torch.randn(B, L, V, generator=device_generator(generator, dev), device=dev)
        w = s_g.float() * eps  # (B, L, V) float32: a onehot(x) + s eps
        w.scatter_add_(-1, tokens.unsqueeze(-1), a_g.float().expand(B, L, 1).contiguous())
        z = w.argmax(-1)
        soft = torch.softmax(w / tau, -1)
        del w, eps
        alpha = alpha.to(dev)
        logits = model(soft, (1 - alpha).float())
        f = udlm_integrand(logits, tokens, z, alpha, dalpha_dg.to(dev) * (g1 - g0))
        rows = masked_mean(f, mask)
        return rows.mean(), {"loss": rows.detach(), "tau": tau}

    def after_step(self, metrics: Metrics) -> None:
        self.step += 1

    @torch.no_grad()
    def eval_bound(
        self, model: TokenDiT, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """UDLM NELBO, reference log-linear alpha, ``eval.t_samples`` stratified times per sequence in [eps, 1]."""
        total = stratified_time_average(
            lambda t: self.loss_rows(model, tokens, t, generator, mask),
            tokens.shape[0],
            self.cfg.eval.t_samples,
            generator,
            self.eps,
            1.0,
            tokens.device,
        )
        return {"nelbo": total}

    @torch.no_grad()
    def conditional_nll(
        self, model: TokenDiT, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """The UDLM NELBO of the target with the rest held clean (only the target is corrupted),
        summed over the target positions: an upper bound on ``-log p(target | context)`` of the
        reverse process with the context clamped. ``eval.t_samples`` stratified times per row."""
        n = target.double().sum(1).clamp_min(1)
        return stratified_time_average(
            lambda t: self.loss_rows(model, tokens, t, generator, target, clean=~target.bool()) * n,
            tokens.shape[0],
            self.cfg.eval.t_samples,
            generator,
            self.eps,
            1.0,
            tokens.device,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.step = int(d.get("step", 0))

    def greedy_logits(self, model: TokenDiT, tokens: Tensor, target: Tensor, seed: int) -> Tensor:
        """Every target token replaced by uniform noise at t = 1 - eps, the context clean."""
        g = torch.Generator(device=tokens.device).manual_seed(seed)
        noise = torch.randint(0, model.n_out, tokens.shape, generator=g, device=tokens.device)
        z = torch.where(target, noise, tokens)
        logits: Tensor = model(z, torch.full((tokens.shape[0],), 1.0 - self.eps, device=tokens.device))
        return logits

    def embedding_rows(self, model: TokenDiT) -> Tensor:
        return model.rows(model.n_out)
