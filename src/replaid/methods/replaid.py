"""RePlaid as a method: Algorithm 1 (training loss) and the NELBO bound; its samplers are
:mod:`replaid.sampling.continuous`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from replaid import dist
from replaid.config import ConfigError, RunConfig, check
from replaid.diffusion.nelbo import (
    diffusion_loss,
    forward_noise,
    low_discrepancy,
    masked_mean,
    nelbo_per_sequence,
    prior_kl,
)
from replaid.diffusion.rng import device_generator, host_uniform
from replaid.methods.base import Kind, Method
from replaid.model.replaid import RePlaid, denoise


@dataclass
class DiffusionOptions:
    """RePlaid's (and Plaid's) options, the config section ``diffusion``: the learned noise schedule's
    start, self-conditioning and the adaptive split of Algorithm 1."""

    gamma_0: float = -3.0  # initial endpoint gamma(0) (learnable)
    gamma_1: float = 6.0  # initial endpoint gamma(1) (learnable)
    schedule: str = "learned"  # learned (monotone MLP shape) | linear (fixed shape, endpoints learned)
    schedule_hidden: int = 1024  # monotone-MLP width
    learn_endpoints: bool = True
    sc_rate: float = 0.25  # fraction of training rows with a self-conditioning first pass
    split_ema: float = 0.997  # EMA decay of the recon/diffusion loss moments (adaptive B_r)
    ce_weight: float = 0.0  # paper sec. 5.1: + w * CE(t); gradient reaches only E and the denoiser
    prior_ramp_steps: int = 0  # Plaid: output-prior scale ramps 0 -> 1 over these training steps (0 = off)

    def validate(self) -> None:
        check(self.gamma_0 < self.gamma_1, "diffusion.gamma_0", "must be smaller than diffusion.gamma_1")
        check(self.schedule in ("learned", "linear"), "diffusion.schedule", "must be learned or linear")
        check(0.0 <= self.sc_rate <= 1.0, "diffusion.sc_rate", "must be in [0, 1]")
        check(0.0 < self.split_ema < 1.0, "diffusion.split_ema", "must be in (0, 1)")
        check(self.schedule_hidden > 0, "diffusion.schedule_hidden", "must be positive")
        check(self.ce_weight >= 0, "diffusion.ce_weight", "must be >= 0")
        check(self.prior_ramp_steps >= 0, "diffusion.prior_ramp_steps", "must be >= 0")


# the model keys of the continuous networks (RePlaid's and Plaid's) beyond the shared backbone
CONTINUOUS_MODEL_KEYS: tuple[str, ...] = (
    "self_conditioning",
    "output_prior",
    "embeddings",
    "embeddings_path",
    "up_projection",
    "head_chunk_rows",
)


@dataclass
class SplitState:
    """Bias-corrected EMAs of the mean and mean-square of per-row recon / diffusion losses.

    ``B_r = clip(round(B s_r / (s_r + s_d)), 1, B - 1)`` (Neyman allocation, Algorithm 1 line 2).
    The EMAs live on the device (``stats`` = [m_r, s_r, m_d, s_d], float64) and are updated every
    step without a host sync; ``B_r`` follows the standard deviations copied to the host by
    :meth:`refresh` (the trainer calls it on logging steps, so ``B_r`` lags by < ``log_every``
    steps, which the 0.997 decay, a ~330-step window, makes immaterial).
    """

    decay: float = 0.997
    stats: Optional[Tensor] = None  # (4,) float64: EMAs of recon, recon^2, diffusion, diffusion^2
    n: int = 0  # number of updates (bias correction)
    host_std: tuple[float, float] = (0.0, 0.0)  # (s_r, s_d) as of the last refresh

    def recon_rows(self, B: int) -> int:
        sr, sd = self.host_std
        if not math.isfinite(sr + sd) or sr + sd <= 0:  # no statistics yet, or overflowed ones
            return max(1, min(B - 1, B // 8))
        return int(min(B - 1, max(1, round(B * sr / (sr + sd)))))

    def update(self, recon: Tensor, diff: Tensor) -> None:
        """recon, diff: this rank's per-row losses of this step (any length >= 1). Their means are
        averaged over ranks in one all-reduce of 4 scalars (equal row counts on every rank)."""
        r, d = recon.detach().double(), diff.detach().double()
        means = dist.all_reduce_sum(torch.stack([r.mean(), (r * r).mean(), d.mean(), (d * d).mean()]))
        means = means / dist.world_size()
        self.stats = (1 - self.decay) * means if self.stats is None else torch.lerp(self.stats, means, 1 - self.decay)
        self.n += 1

    def refresh(self) -> None:
        """Copy the standard deviations to the host (one sync)."""
        if self.stats is None or self.n == 0:
            return
        m_r, s_r, m_d, s_d = (self.stats / (1.0 - self.decay**self.n)).tolist()
        self.host_std = (math.sqrt(max(s_r - m_r**2, 0.0)), math.sqrt(max(s_d - m_d**2, 0.0)))

    def state_dict(self) -> dict:
        st = [0.0] * 4 if self.stats is None else self.stats.tolist()
        return {
            "decay": self.decay,
            "m_r": st[0],
            "s_r": st[1],
            "m_d": st[2],
            "s_d": st[3],
            "n": self.n,
            "host_std": list(self.host_std),
        }

    def load_state_dict(self, d: dict) -> None:
        self.decay, self.n = d["decay"], int(d["n"])
        self.stats = torch.tensor([d["m_r"], d["s_r"], d["m_d"], d["s_d"]], dtype=torch.float64)
        if "host_std" in d:
            self.host_std = tuple(d["host_std"])
        else:  # checkpoints written before the device-side split
            self.refresh()


def sc_rows(B: int, rate: float, generator: Optional[torch.Generator], device) -> Tensor:
    """Indices of exactly ceil(rate * B) self-conditioning rows, chosen at random on ``device``
    (Algorithm 1 line 3); a fixed count, so the rows are selected without a host sync."""
    k = math.ceil(rate * B) if rate > 0 else 0
    return torch.randperm(B, generator=generator, device=device)[:k]


# replaid.sampling.continuous; the default first
CONTINUOUS_SAMPLERS = ("ddpm", "ddim", "dpmpp2m", "heun", "consistency")


def continuous_eval_bound(
    cfg: RunConfig, model, tokens: Tensor, generator: Optional[torch.Generator], mask: Optional[Tensor] = None
) -> dict[str, Tensor]:
    """The continuous-time VDM NELBO (``nelbo_per_sequence``) of a continuous model, self-conditioning
    as at evaluation (``eval.self_conditioning``: a first pass feeds the second)."""
    ecfg = cfg.eval
    sc = model.self_conditioning and ecfg.self_conditioning
    return nelbo_per_sequence(
        model, model.schedule, tokens, ecfg.t_samples, mask, generator, predict=lambda z, g: denoise(model, z, g, sc)
    )


def continuous_conditional_nll(
    cfg: RunConfig, model, tokens: Tensor, target: Tensor, generator: Optional[torch.Generator]
) -> Tensor:
    """The target positions' share of the VDM NELBO (eq. 4), summed over them (B,) float64: every
    position is noised at the row's time (the context as the inpainting samplers see it), only the
    target's reconstruction, diffusion and prior terms count. An upper bound on ``-log p(target |
    context)`` of the conditional model ``E_eps[p(target | context noised with eps)]``: for a fixed
    context noise the target's reverse process is a valid model whose NELBO is these terms, and
    ``E[NELBO_eps] >= E[-log p_eps] >= -log E[p_eps]`` (Jensen); each time's terms depend only on
    that time's marginal, so drawing the context noise afresh per time changes no expectation."""
    n = target.double().sum(1)
    return continuous_eval_bound(cfg, model, tokens, generator, target.to(tokens.device))["nelbo"] * n.to(tokens.device)


def schedule_summary(cfg: RunConfig, model) -> dict:
    """The noise schedule's endpoints (of the weights evaluated) and the evaluation's time samples."""
    with torch.no_grad():
        g0, g1 = (float(g) for g in model.schedule.endpoints())  # floats (LangFlow) or tensors (RePlaid)
    return {"gamma_0": g0, "gamma_1": g1, "t_samples": cfg.eval.t_samples}


class RePlaidMethod(Method[RePlaid]):
    """RePlaid (and the original Plaid's diffusion math): VDM NELBO with the adaptive split."""

    name = "replaid"
    kind = Kind.CONTINUOUS
    description = "RePlaid (continuous diffusion on learned embeddings; NELBO bound)"
    samplers = CONTINUOUS_SAMPLERS
    global_times = True  # the diffusion rows' times come from the global batch
    options = DiffusionOptions
    section = "diffusion"
    model_keys: ClassVar[tuple[str, ...]] = (
        *CONTINUOUS_MODEL_KEYS,
        "in_z_std",
        "adaln_features",
        "time_input",
        "readout_mult",
    )

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.opts: DiffusionOptions = cfg.options
        self.split = SplitState(decay=self.opts.split_ema)
        self.core = self.loss_core  # compiled by compile()
        self.step = 0  # optimiser steps taken (for the output-prior ramp)

    def prior_scale(self) -> float:
        """Plaid's ``bias_scale``: the output prior logits ramp linearly 0 -> 1 over
        ``diffusion.prior_ramp_steps`` training steps (1 when off, and always at evaluation)."""
        n = self.opts.prior_ramp_steps
        return 1.0 if n <= 0 else min(1.0, self.step / n)

    def build_model(self, vocab_size: int) -> RePlaid:
        return RePlaid(self.cfg.model, self.opts, vocab_size)

    # ------------------------------------------------------------------ training (Algorithm 1)
    def train_loss(
        self,
        model: RePlaid,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Optional[Tensor] = None,
        t_diff: Optional[Tensor] = None,
        n_recon: Optional[int] = None,
    ) -> tuple[Tensor, dict]:
        """One micro-batch of Algorithm 1. tokens: (B, L). ``t_diff``: the low-discrepancy times of
        the diffusion rows (B - B_r,), sliced from the global batch by the caller; drawn here if None.
        Returns the scalar loss (float64) and per-row losses / metrics (device tensors: nothing
        here waits for the device)."""
        dcfg = self.opts
        dev = tokens.device
        B = tokens.shape[0]
        B_r = self.split.recon_rows(B) if n_recon is None else n_recon
        ps = self.prior_scale()
        n_d = B - B_r
        if t_diff is None:
            t_diff = low_discrepancy(n_d, u=host_uniform(generator), device=dev)
        gen = device_generator(generator, dev)
        sc_idx = sc_rows(B, dcfg.sc_rate if model.self_conditioning else 0.0, gen, dev)  # (k,)
        sc = torch.zeros(B, dtype=torch.bool, device=dev).index_fill_(0, sc_idx, True)  # (B,)
        eps = torch.randn(B, tokens.shape[1], model.d_e, generator=gen, device=dev)  # (B, L, d_e)

        # timesteps: recon rows t = 0, diffusion rows low-discrepancy; the schedule and its hook stay
        # eager (outside a compiled core): the hook's weight is written in place once L_diff is known
        t = torch.cat([torch.zeros(B_r, dtype=torch.float64, device=dev), t_diff.to(dev, torch.float64)])
        is_recon = torch.arange(B, device=dev) < B_r
        hook_w = torch.zeros(B, dtype=torch.float64, device=dev)  # filled with L_diff below
        gamma, dgamma = model.schedule(t, var_hook_weight=hook_w, detach_shape=is_recon | sc)
        loss, recon, diff, prior = self.core(model, tokens, gamma, dgamma, sc, sc_idx, eps, B_r, ps, mask)
        hook_w[B_r:] = diff.detach()  # variance-minimisation hook weight (paper code figure)
        metrics = {
            "recon": recon.detach(),
            "diffusion": diff.detach(),
            "prior": prior.detach(),
            "B_r": B_r,
            "gamma_0": model.schedule.gamma_0.detach(),
            "gamma_1": model.schedule.gamma_1.detach(),
        }
        if dcfg.prior_ramp_steps > 0:
            metrics["prior_scale"] = ps
        if dcfg.ce_weight > 0:
            ce = self._ce_term(model, tokens, t_diff, gen, mask, B_r, ps)
            loss = loss + dcfg.ce_weight * ce
            metrics["ce"] = ce.detach()
        return loss, metrics

    def loss_core(
        self,
        model: RePlaid,
        tokens: Tensor,
        gamma: Tensor,
        dgamma: Tensor,
        sc: Tensor,
        sc_idx: Tensor,
        eps: Tensor,
        B_r: int,
        ps: float,
        mask: Optional[Tensor],
    ):
        """Algorithm 1 from the drawn noise and the schedule's (gamma, gamma') (B,) float64 on: no
        generator, hook or host sync, so ``train.compile`` compiles it whole (:meth:`compile`).
        Returns (loss, recon (B_r,), diffusion (B - B_r,), prior (B,))."""
        E = model.embedding()  # (V, d_e) unit rows
        # self-conditioned rows train only the denoiser: detach gamma, gamma' and e there
        gamma = torch.where(sc, gamma.detach(), gamma)
        dgamma = torch.where(sc, dgamma.detach(), dgamma)
        e = E[tokens]  # (B, L, d_e)
        e = torch.where(sc.view(-1, 1, 1), e.detach(), e)
        z = forward_noise(e, gamma, eps)  # (B, L, d_e)
        e_sc = None
        if sc_idx.numel():  # a fixed count: no sync
            with torch.no_grad():
                first = model.train_outputs(z[sc_idx], gamma[sc_idx], None, tokens[sc_idx], sc[sc_idx], ps)[1]
            e_sc = torch.zeros_like(z).index_copy(0, sc_idx, first)
        nll, e_hat = model.train_outputs(z, gamma, e_sc, tokens, ~sc, ps)  # (B, L), (B, L, d_e)
        recon = masked_mean(nll[:B_r], None if mask is None else mask[:B_r])  # (B_r,)
        diff = diffusion_loss(
            e_hat[B_r:], e[B_r:], gamma[B_r:], dgamma[B_r:], None if mask is None else mask[B_r:]
        )  # (n_d,)
        _, g1 = model.schedule.endpoints()
        prior = prior_kl(e, g1, mask)  # (B,)
        return recon.mean() + diff.mean() + prior.mean(), recon, diff, prior

    def compile(self, model: RePlaid) -> None:
        """``train.compile``: compile :meth:`loss_core` (the whole loss but the noise draws and the
        schedule with its variance hook)."""
        self.core = torch.compile(self.loss_core)

    def recon_rows(self, batch: int) -> int:
        """B_r of Algorithm 1 line 2 (the adaptive split, as of the last :meth:`refresh`)."""
        return self.split.recon_rows(batch)

    @classmethod
    def check_config(cls, cfg: RunConfig, world_size: int = 1) -> None:
        """Algorithm 1 needs a reconstruction row and a diffusion row in every micro-batch."""
        micro = cfg.train.batch_size // (cfg.train.grad_accum * world_size)
        if micro < 2:
            raise ConfigError(
                f"invalid config value train.batch_size: method={cls.name} needs micro-batches of at "
                f"least 2 rows (one reconstruction row, one diffusion row), but batch_size "
                f"{cfg.train.batch_size} / (grad_accum {cfg.train.grad_accum} x {world_size} ranks) "
                f"gives {micro}; raise train.batch_size or lower train.grad_accum"
            )

    def _ce_term(
        self,
        model: RePlaid,
        tokens: Tensor,
        t_diff: Tensor,
        gen: Optional[torch.Generator],
        mask: Optional[Tensor],
        B_r: int,
        prior_scale: float = 1.0,
    ) -> Tensor:
        """Paper sec. 5.1: ``E_t[-(1/L) sum_l log x_hat(z_t)]`` on the diffusion rows, with the schedule
        detached so the gradient reaches only the embeddings and the denoiser. ``gen``: on the device."""
        dev = tokens.device
        tok = tokens[B_r:]
        with torch.no_grad():
            gamma, _ = model.schedule(t_diff.to(dev))
        e = model.embedding()[tok]
        eps = torch.randn(e.shape, generator=gen, device=dev)
        keep = torch.ones(tok.shape[0], dtype=torch.bool, device=dev)
        nll, _ = model.train_outputs(forward_noise(e, gamma, eps), gamma, None, tok, keep, prior_scale)
        return masked_mean(nll, None if mask is None else mask[B_r:]).mean()

    def after_step(self, metrics: dict) -> None:
        self.split.update(metrics["recon"], metrics["diffusion"])
        self.step += 1

    def refresh(self) -> None:
        """On logging steps: bring the split's statistics to the host (sets the next B_r)."""
        self.split.refresh()

    # ------------------------------------------------------------------ evaluation bound
    @torch.no_grad()
    def eval_bound(
        self, model: RePlaid, tokens: Tensor, generator: Optional[torch.Generator], mask: Optional[Tensor] = None
    ) -> dict[str, Tensor]:
        return continuous_eval_bound(self.cfg, model, tokens, generator, mask)

    def conditional_nll(
        self, model: RePlaid, tokens: Tensor, target: Tensor, generator: Optional[torch.Generator]
    ) -> Tensor:
        return continuous_conditional_nll(self.cfg, model, tokens, target, generator)

    def eval_summary(self, model: RePlaid) -> dict:
        return schedule_summary(self.cfg, model)

    def divergence_hint(self, model: RePlaid) -> str:
        ends = [round(float(g.detach()), 3) for g in model.schedule.endpoints()]
        d = self.opts
        return f"noise-schedule endpoints (gamma_0, gamma_1 now {ends}, started at {d.gamma_0:g}, {d.gamma_1:g})"

    def embedding_rows(self, model: RePlaid) -> Tensor:
        return model.embedding_matrix()

    def state_dict(self) -> dict:
        return {"split": self.split.state_dict(), "step": self.step}

    def load_state_dict(self, d: dict) -> None:
        self.split.load_state_dict(d["split"])
        self.step = int(d.get("step", 0))
