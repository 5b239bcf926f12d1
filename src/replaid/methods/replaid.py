"""RePlaid as a method: Algorithm 1 (training loss) and the NELBO bound; its samplers are
:mod:`replaid.sampling.continuous`.

Block diffusion (BD3-LM; ``diffusion.block_size`` = b, 0 or ``seq_len`` = the whole-sequence model, the
same code path): the sequence is cut into K = L / b blocks and the bound is ``sum_k NELBO(x^k | x^{<k})``,
each block's VDM bound (eq. 4: reconstruction + diffusion + prior) given the clean blocks before it.
Training runs the noisy latents and the clean copy side by side (2L rows) under the block-diffusion
mask (:meth:`~replaid.model.replaid.RePlaid.block_features`; the clean rows enter as ``alpha_0 e`` at
``gamma_0``, noise-free). Algorithm 1 carries over by keeping its units rows:

* the adaptive split stays per row: the B_r reconstruction rows are at t = 0 in every block, and each
  diffusion row's K blocks take the times ``t_bk = (t_b + k / K) mod 1`` from the row's one global
  low-discrepancy time ``t_b`` (the trainer's ``t_diff``, unchanged): each block's time is uniform,
  a row's blocks are spread evenly over [0, 1); B_r follows the per-row recon / diffusion losses
  (a row's is the sum of its blocks' shares), and the schedule's variance hook weights every block
  of a row by the row's diffusion loss (the gradient of E[L_row^2]);
* ``sc_rate`` stays a fraction of rows: a self-conditioned row is so in every block, its first pass
  (the same vectorised pass, no gradient) estimating every noisy block from its own noisy block and
  the clean blocks before it, each block's estimate fed back to the same block (the clean rows take
  no self-conditioning input, so the sampler's KV cache of clean blocks stays exact);
* the prior term does not depend on the network: per block it is the whole-sequence term, summed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import torch
from torch import Tensor

from replaid import dist
from replaid.config import ConfigError, RunConfig, check
from replaid.diffusion.denoiser import prior_logits
from replaid.diffusion.nelbo import (
    block_nelbo_per_sequence,
    diffusion_loss,
    diffusion_terms,
    forward_noise,
    low_discrepancy,
    masked_mean,
    nelbo_per_sequence,
    prior_kl,
)
from replaid.diffusion.rng import device_generator, host_uniform
from replaid.methods.base import Kind, Method, Metrics, Probe
from replaid.model.replaid import BlockContext, RePlaid, denoise
from replaid.regions import AGGREGATION, SELF_CONDITIONING, region

if TYPE_CHECKING:
    from replaid.model.langflow import LangFlowDenoiser

# The networks of the continuous methods (RePlaid and Plaid's; LangFlow's): denoisers with a ``schedule``
ContinuousNet: TypeAlias = "RePlaid | LangFlowDenoiser"
# Algorithm 1's core: (loss, recon (B_r,), diffusion (B - B_r,), prior (B,))
LossParts: TypeAlias = tuple[Tensor, Tensor, Tensor, Tensor]


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
    block_size: int = 0  # BD3-LM's blocks: 0 = the whole sequence (the whole-sequence model); else divides seq_len
    # a block-size curriculum: the first curriculum_steps optimiser steps train the block
    # bound with blocks of curriculum_block tokens (clean context, BD3-LM's pass), then the whole sequence;
    # the model, its bound and its samplers stay the whole sequence's (block_size 0)
    curriculum_steps: int = 0
    curriculum_block: int = 4

    def validate(self) -> None:
        check(self.gamma_0 < self.gamma_1, "diffusion.gamma_0", "must be smaller than diffusion.gamma_1")
        check(self.schedule in ("learned", "linear"), "diffusion.schedule", "must be learned or linear")
        check(0.0 <= self.sc_rate <= 1.0, "diffusion.sc_rate", "must be in [0, 1]")
        check(0.0 < self.split_ema < 1.0, "diffusion.split_ema", "must be in (0, 1)")
        check(self.schedule_hidden > 0, "diffusion.schedule_hidden", "must be positive")
        check(self.ce_weight >= 0, "diffusion.ce_weight", "must be >= 0")
        check(self.prior_ramp_steps >= 0, "diffusion.prior_ramp_steps", "must be >= 0")
        check(self.block_size >= 0, "diffusion.block_size", "must be >= 0 (0: the whole sequence)")
        check(self.curriculum_steps >= 0, "diffusion.curriculum_steps", "must be >= 0 (0: no curriculum)")
        check(self.curriculum_block >= 1, "diffusion.curriculum_block", "must be >= 1")


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
    stats: Tensor | None = None  # (4,) float64: EMAs of recon, recon^2, diffusion, diffusion^2
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

    def state_dict(self) -> dict[str, Any]:
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

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict):
            raise ValueError(f'field "method_state.split" is {type(d).__name__}, not a JSON object')
        for k in ("decay", "n", "m_r", "s_r", "m_d", "s_d"):  # D31: a missing one was KeyError: 'n'
            v = d.get(k)
            if v is None:
                raise ValueError(f'field "method_state.split.{k}" is missing')
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f'field "method_state.split.{k}" is {v!r}, not a finite number')
        if not 0 <= d["decay"] < 1 or d["n"] < 0 or d["n"] != int(d["n"]):
            raise ValueError('field "method_state.split" holds a decay outside [0, 1) or a negative or fractional n')
        hs = d.get("host_std")
        if hs is not None and not (
            isinstance(hs, list)
            and len(hs) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in hs)
        ):
            raise ValueError('field "method_state.split.host_std" is not a list of two finite numbers')
        self.decay, self.n = d["decay"], int(d["n"])
        self.stats = torch.tensor([d["m_r"], d["s_r"], d["m_d"], d["s_d"]], dtype=torch.float64)
        if "host_std" in d:
            self.host_std = tuple(d["host_std"])
        else:  # checkpoints written before the device-side split
            self.refresh()


def sc_rows(B: int, rate: float, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Indices of exactly ceil(rate * B) self-conditioning rows, chosen at random on ``device``
    (Algorithm 1 line 3); a fixed count, so the rows are selected without a host sync."""
    k = math.ceil(rate * B) if rate > 0 else 0
    return torch.randperm(B, generator=generator, device=device)[:k]


# replaid.sampling.continuous; the default first
CONTINUOUS_SAMPLERS = ("ddpm", "ddim", "dpmpp2m", "heun", "consistency")


def continuous_eval_bound(
    cfg: RunConfig,
    model: ContinuousNet,
    tokens: Tensor,
    generator: torch.Generator | None,
    mask: Tensor | None = None,
    block: int = 0,
) -> dict[str, Tensor]:
    """The continuous-time VDM NELBO (``nelbo_per_sequence``) of a continuous model, self-conditioning
    as at evaluation (``eval.self_conditioning``: a first pass feeds the second). ``block`` (0: none):
    a block-diffusion model's bound, the sum over blocks of :func:`continuous_block_bound`."""
    if 0 < block < tokens.shape[1]:
        return {k: v.sum(1) for k, v in continuous_block_bound(cfg, model, tokens, block, generator, mask).items()}
    ecfg = cfg.eval
    sc = model.self_conditioning and ecfg.self_conditioning
    return nelbo_per_sequence(
        model, model.schedule, tokens, ecfg.t_samples, mask, generator, predict=lambda z, g: denoise(model, z, g, sc)
    )


@torch.no_grad()
def continuous_block_bound(
    cfg: RunConfig,
    model: ContinuousNet,
    tokens: Tensor,
    block: int,
    generator: torch.Generator | None,
    mask: Tensor | None = None,
) -> dict[str, Tensor]:
    """Each block's share (B, L / block) of a block-diffusion model's per-token NELBO, ``NELBO(x^k |
    x^{<k})`` (:func:`~replaid.diffusion.nelbo.block_nelbo_per_sequence`), self-conditioning per block
    as at evaluation: the vectorised pass over [z_t, x_0], twice with self-conditioning."""
    ecfg = cfg.eval
    sc = model.self_conditioning and ecfg.self_conditioning
    E = model.embedding_matrix()  # (V, d_e)
    ctx = BlockContext(E[tokens.to(E.device)], block)
    return block_nelbo_per_sequence(
        model,
        model.schedule,
        tokens,
        block,
        lambda z, g: denoise(model, z, g, sc, ctx),
        ecfg.t_samples,
        mask,
        generator,
    )


def continuous_conditional_nll(
    cfg: RunConfig,
    model: ContinuousNet,
    tokens: Tensor,
    target: Tensor,
    generator: torch.Generator | None,
    block: int = 0,
) -> Tensor:
    """The target positions' share of the VDM NELBO (eq. 4), summed over them (B,) float64: every
    position is noised at the row's time (the context as the inpainting samplers see it), only the
    target's reconstruction, diffusion and prior terms count. An upper bound on ``-log p(target |
    context)`` of the conditional model ``E_eps[p(target | context noised with eps)]``: for a fixed
    context noise the target's reverse process is a valid model whose NELBO is these terms, and
    ``E[NELBO_eps] >= E[-log p_eps] >= -log E[p_eps]`` (Jensen); each time's terms depend only on
    that time's marginal, so drawing the context noise afresh per time changes no expectation.
    With ``block`` (a block-diffusion model) the terms are the block bound's: a target block sees the
    clean blocks before it (context and earlier target), the context after it not at all."""
    n = target.double().sum(1)
    bound = continuous_eval_bound(cfg, model, tokens, generator, target.to(tokens.device), block)
    return bound["nelbo"] * n.to(tokens.device)


def schedule_summary(cfg: RunConfig, model: ContinuousNet) -> dict[str, float]:
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
        L = cfg.data.seq_len
        self.block = self.opts.block_size or L  # tokens per block; == L: the whole-sequence model
        self.blocks = self.block < L
        self.core = self.block_loss_core if self.blocks else self.loss_core  # compiled by compile()
        self.block_core = self.block_loss_core  # the curriculum's (compiled by compile())
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
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, Metrics]:
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
        block = self.train_block()
        if block < tokens.shape[1]:  # a time per (row, block), the hook and detaching per row (module docstring)
            t = self.block_times(t, is_recon, tokens.shape[1] // block)  # (B, K)
            gamma, dgamma = model.schedule(t, var_hook_weight=hook_w[:, None], detach_shape=(is_recon | sc)[:, None])
            core = self.core if self.blocks else self.block_core
        else:
            gamma, dgamma = model.schedule(t, var_hook_weight=hook_w, detach_shape=is_recon | sc)
            core = self.core
        loss, recon, diff, prior = core(model, tokens, gamma, dgamma, sc, sc_idx, eps, B_r, ps, mask, block)
        hook_w[B_r:] = diff.detach()  # variance-minimisation hook weight (paper code figure)
        metrics: Metrics = {
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
        mask: Tensor | None,
        block: int = 0,
    ) -> LossParts:
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
            with torch.no_grad(), region(SELF_CONDITIONING):
                first = model.train_outputs(z[sc_idx], gamma[sc_idx], None, tokens[sc_idx], sc[sc_idx], ps)[1]
            e_sc = torch.zeros_like(z).index_copy(0, sc_idx, first)
        nll, e_hat = model.train_outputs(z, gamma, e_sc, tokens, ~sc, ps)  # (B, L), (B, L, d_e)
        recon = masked_mean(nll[:B_r], None if mask is None else mask[:B_r])  # (B_r,)
        diff = diffusion_loss(
            e_hat[B_r:], e[B_r:], gamma[B_r:], dgamma[B_r:], None if mask is None else mask[B_r:]
        )  # (n_d,)
        _, g1 = model.schedule.endpoints()
        prior = prior_kl(e, g1, mask)  # (B,)
        with region(AGGREGATION):  # float64
            return recon.mean() + diff.mean() + prior.mean(), recon, diff, prior

    @staticmethod
    def block_times(t: Tensor, is_recon: Tensor, K: int) -> Tensor:
        """Per-(row, block) times (B, K) float64 from the rows' times t (B,): ``(t_b + k / K) mod 1`` on
        diffusion rows (each block uniform on [0, 1), a row's blocks evenly spread), 0 on recon rows."""
        shift = torch.arange(K, dtype=torch.float64, device=t.device) / K  # (K,)
        tk = torch.remainder(t[:, None] + shift, 1.0)  # (B, K)
        return torch.where(is_recon[:, None], torch.zeros((), dtype=torch.float64, device=t.device), tk)

    def block_loss_core(
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
        mask: Tensor | None,
        block: int = 0,
    ) -> LossParts:
        """:meth:`loss_core` with blocks (module docstring): gamma, gamma' (B, K) per (row, block); each
        block's recon / diffusion term given the clean blocks before it, from one vectorised pass over
        [z_t, x_0] (two on self-conditioned rows). Returns (loss, recon (B_r,), diffusion (B - B_r,),
        prior (B,)), per-row sums of the blocks' shares. ``block``: tokens per block (0: ``diffusion.block_size``)."""
        block = block or self.block
        E = model.embedding()  # (V, d_e) unit rows
        gamma = torch.where(sc[:, None], gamma.detach(), gamma)  # (B, K)
        dgamma = torch.where(sc[:, None], dgamma.detach(), dgamma)
        g_tok = gamma.repeat_interleave(block, dim=1)  # (B, L): each token at its block's level
        dg_tok = dgamma.repeat_interleave(block, dim=1)
        e = E[tokens]  # (B, L, d_e)
        e = torch.where(sc.view(-1, 1, 1), e.detach(), e)
        z = forward_noise(e, g_tok, eps)  # (B, L, d_e)
        ctx = BlockContext(e, block)  # the clean copy: block k sees the clean blocks before it
        e_sc = None
        if sc_idx.numel():  # a fixed count: no sync
            with (
                torch.no_grad(),
                region(SELF_CONDITIONING),
            ):  # every noisy block's first estimate, from its own block and clean prefix
                sub = BlockContext(e[sc_idx], block)
                first = model.train_outputs(z[sc_idx], g_tok[sc_idx], None, tokens[sc_idx], sc[sc_idx], ps, sub)[1]
            e_sc = torch.zeros_like(z).index_copy(0, sc_idx, first)  # block k's estimate at block k's rows
        nll, e_hat = model.train_outputs(z, g_tok, e_sc, tokens, ~sc, ps, ctx)  # (B, L), (B, L, d_e)
        recon = masked_mean(nll[:B_r], None if mask is None else mask[:B_r])  # (B_r,)
        terms = diffusion_terms(e_hat[B_r:], e[B_r:], g_tok[B_r:], dg_tok[B_r:])  # (n_d, L)
        diff = masked_mean(terms, None if mask is None else mask[B_r:])  # (n_d,)
        _, g1 = model.schedule.endpoints()
        prior = prior_kl(e, g1, mask)  # (B,)
        with region(AGGREGATION):  # float64
            return recon.mean() + diff.mean() + prior.mean(), recon, diff, prior

    def compile(self, model: RePlaid) -> None:
        """``train.compile``: compile :meth:`loss_core` (:meth:`block_loss_core` with blocks: the whole loss
        but the noise draws and the schedule with its variance hook)."""
        self.core = torch.compile(self.block_loss_core if self.blocks else self.loss_core)
        if self.opts.curriculum_steps and not self.blocks:
            self.block_core = torch.compile(self.block_loss_core)

    def train_block(self) -> int:
        """Tokens per block of this training step: ``diffusion.block_size`` (the sequence length without
        blocks), or the curriculum's ``curriculum_block`` during its first ``curriculum_steps`` steps."""
        if not self.blocks and self.step < self.opts.curriculum_steps:
            return min(self.opts.curriculum_block, self.cfg.data.seq_len)
        return self.block

    def recon_rows(self, batch: int) -> int:
        """B_r of Algorithm 1 line 2 (the adaptive split, as of the last :meth:`refresh`)."""
        return self.split.recon_rows(batch)

    @classmethod
    def check_config(cls, cfg: RunConfig, world_size: int = 1) -> None:
        """Algorithm 1 needs a reconstruction row and a diffusion row in every micro-batch;
        ``diffusion.block_size`` is 0 or a divisor of ``data.seq_len``."""
        opts: DiffusionOptions = cfg.options
        b, L = opts.block_size, cfg.data.seq_len
        if b < 0 or (b and L % b):
            raise ConfigError(f"diffusion.block_size={b} must be 0 (the whole sequence) or divide data.seq_len={L}")
        if opts.curriculum_steps and (0 < b < L or L % opts.curriculum_block or opts.ce_weight > 0):
            raise ConfigError(
                f"diffusion.curriculum_steps={opts.curriculum_steps} needs a whole-sequence run (diffusion.block_size=0, "
                f"here {b}), diffusion.curriculum_block dividing data.seq_len={L} (here {opts.curriculum_block}) "
                f"and diffusion.ce_weight=0 (here {opts.ce_weight:g}); change one of them or set diffusion.curriculum_steps=0"
            )
        if 0 < b < L and opts.ce_weight > 0:
            raise ConfigError(
                f"diffusion.ce_weight is not built for blocks (diffusion.block_size={b}): set diffusion.ce_weight=0"
            )
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
        gen: torch.Generator | None,
        mask: Tensor | None,
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

    def after_step(self, metrics: Metrics) -> None:
        recon, diff = metrics["recon"], metrics["diffusion"]
        assert isinstance(recon, Tensor) and isinstance(diff, Tensor)  # train_loss's per-row losses
        self.split.update(recon, diff)
        self.step += 1

    def refresh(self) -> None:
        """On logging steps: bring the split's statistics to the host (sets the next B_r)."""
        self.split.refresh()

    @classmethod
    def training_block_size(cls, cfg: RunConfig) -> int:
        """``diffusion.block_size`` when it splits the sequence (training reads ``[x_t, x_0]``), else 0."""
        opts: DiffusionOptions = cfg.options
        return opts.block_size if 0 < opts.block_size < cfg.data.seq_len else 0

    def block_size(self) -> int:
        """``diffusion.block_size`` when it splits the sequence (sampled block by block), else 0."""
        return self.block if self.blocks else 0

    # ------------------------------------------------------------------ evaluation bound
    @torch.no_grad()
    def eval_bound(
        self, model: RePlaid, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The VDM NELBO; with blocks, the sum over blocks of each block's bound given the earlier ones."""
        return continuous_eval_bound(self.cfg, model, tokens, generator, mask, self.block if self.blocks else 0)

    @torch.no_grad()
    def block_bound(
        self, model: RePlaid, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Each block's share (B, K) of :meth:`eval_bound` (whose terms are these summed over blocks)."""
        return continuous_block_bound(self.cfg, model, tokens, self.block, generator, mask)

    def conditional_nll(
        self, model: RePlaid, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        block = self.block if self.blocks else 0
        return continuous_conditional_nll(self.cfg, model, tokens, target, generator, block)

    def eval_summary(self, model: RePlaid) -> dict[str, float]:
        return schedule_summary(self.cfg, model)

    def divergence_hint(self, model: RePlaid) -> str:
        ends = [round(float(g.detach()), 3) for g in model.schedule.endpoints()]
        d = self.opts
        return f"noise-schedule endpoints (gamma_0, gamma_1 now {ends}, started at {d.gamma_0:g}, {d.gamma_1:g})"

    def embedding_rows(self, model: RePlaid) -> Tensor:
        return model.embedding_matrix()

    @torch.no_grad()
    def probe(self, model: RePlaid, tokens: Tensor, t: float, generator: torch.Generator) -> Probe:
        """The evaluation-time prediction (self-conditioning on every row) of tokens (B, L) at time t, the
        whole sequence at one level (a block run's probe too); the head and the output prior apart."""
        dev = tokens.device
        gamma, _ = model.schedule(torch.full((tokens.shape[0],), t, dtype=torch.float64, device=dev))  # (B,)
        E = model.embedding()  # (V, d_e)
        e = E[tokens]  # (B, L, d_e)
        z = forward_noise(e, gamma, torch.randn(e.shape, generator=generator).to(dev))
        e_sc, sc_input = None, None
        if model.self_conditioning:
            e_sc = model(z, gamma, None).e_hat  # (B, L, d_e)
            h0, _ = model.input_states(z, gamma, None)
            fed = model.in_sc(e_sc.float() * math.sqrt(model.d_e))
            sc_input = float(fed.norm() / h0.norm().clamp_min(1e-30))
        feats, _ = model.hidden_states(z, gamma, e_sc)
        head = model.head_logits(feats)  # (B, L, V)
        prior = (
            prior_logits(z, gamma, E, row_norms=not model.cfg.normalize_embeddings) if model.cfg.output_prior else None
        )
        logits = head if prior is None else head + prior
        keep = torch.ones(tokens.shape, dtype=torch.bool, device=dev)
        return Probe(logits, keep, prior, e_sc, e, sc_input)

    def state_dict(self) -> dict[str, Any]:
        return {"split": self.split.state_dict(), "step": self.step}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if "split" not in d:
            raise ValueError('field "method_state.split" is missing')
        self.split.load_state_dict(d["split"])
        self.step = int(d.get("step", 0))
