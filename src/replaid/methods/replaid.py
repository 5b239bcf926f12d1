"""RePlaid as a method: Algorithm 1 (training loss), the NELBO bound, and a sampler."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from replaid.config import RunConfig
from replaid.model.replaid import RePlaid, denoise
from replaid.diffusion.nelbo import diffusion_loss, forward_noise, nelbo_per_sequence, prior_kl, recon_nll


@dataclass
class SplitState:
    """Bias-corrected EMAs of the mean and mean-square of per-row recon / diffusion losses.

    ``B_r = clip(round(B s_r / (s_r + s_d)), 1, B - 1)`` (Neyman allocation, Algorithm 1 line 2).
    Stored as plain floats so they can be all-reduced and checkpointed as JSON.
    """

    decay: float = 0.997
    m_r: float = 0.0
    s_r: float = 0.0  # EMA of recon loss, of its square
    m_d: float = 0.0
    s_d: float = 0.0
    n: int = 0  # number of updates (bias correction)

    def std(self) -> tuple[float, float]:
        c = 1.0 - self.decay ** self.n
        var_r = self.s_r / c - (self.m_r / c) ** 2
        var_d = self.s_d / c - (self.m_d / c) ** 2
        return math.sqrt(max(var_r, 0.0)), math.sqrt(max(var_d, 0.0))

    def recon_rows(self, B: int) -> int:
        if self.n == 0:
            return max(1, min(B - 1, B // 8))
        sr, sd = self.std()
        if not math.isfinite(sr + sd) or sr + sd <= 0:  # no statistics yet, or overflowed ones
            return max(1, min(B - 1, B // 8))
        return int(min(B - 1, max(1, round(B * sr / (sr + sd)))))

    def update(self, recon: Tensor, diff: Tensor) -> None:
        """recon, diff: per-row losses of this step (any length >= 1)."""
        d = self.decay
        self.m_r = d * self.m_r + (1 - d) * float(recon.mean())
        self.s_r = d * self.s_r + (1 - d) * float((recon.double() ** 2).mean())
        self.m_d = d * self.m_d + (1 - d) * float(diff.mean())
        self.s_d = d * self.s_d + (1 - d) * float((diff.double() ** 2).mean())
        self.n += 1

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, d: dict) -> None:
        self.__dict__.update(d)


def sc_row_mask(B: int, rate: float, generator: torch.Generator) -> Tensor:
    """Exactly ceil(rate * B) self-conditioning rows, chosen at random (Algorithm 1 line 3)."""
    k = math.ceil(rate * B) if rate > 0 else 0
    m = torch.zeros(B, dtype=torch.bool)
    if k:
        m[torch.randperm(B, generator=generator)[:k]] = True
    return m


class RePlaidMethod:
    """RePlaid (and the original Plaid's diffusion math): VDM NELBO with the adaptive split."""

    name = "replaid"

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.split = SplitState(decay=cfg.diffusion.split_ema)
        self.step = 0  # optimiser steps taken (for the output-prior ramp)

    def prior_scale(self) -> float:
        """Plaid's ``bias_scale``: the output prior logits ramp linearly 0 -> 1 over
        ``diffusion.prior_ramp_steps`` training steps (1 when off, and always at evaluation)."""
        n = self.cfg.diffusion.prior_ramp_steps
        return 1.0 if n <= 0 else min(1.0, self.step / n)

    def build_model(self, vocab_size: int) -> RePlaid:
        return RePlaid(self.cfg.model, self.cfg.diffusion, vocab_size)

    # ------------------------------------------------------------------ training (Algorithm 1)
    def train_loss(self, model: RePlaid, tokens: Tensor, generator: torch.Generator,
                   t_diff: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                   n_recon: Optional[int] = None) -> tuple[Tensor, dict]:
        """One micro-batch of Algorithm 1. tokens: (B, L). ``t_diff``: the low-discrepancy times of
        the diffusion rows (B - B_r,), sliced from the global batch by the caller; drawn here if None.
        Returns the scalar loss (float64) and per-row losses / metrics."""
        dcfg = self.cfg.diffusion
        dev = tokens.device
        B = tokens.shape[0]
        B_r = self.split.recon_rows(B) if n_recon is None else n_recon
        ps = self.prior_scale()
        n_d = B - B_r
        E = model.embedding()  # (V, d_e) unit rows
        sc = sc_row_mask(B, dcfg.sc_rate if model.self_conditioning else 0.0, generator).to(dev)  # (B,)

        # timesteps: recon rows t = 0, diffusion rows low-discrepancy
        if t_diff is None:
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            t_diff = (torch.arange(n_d, dtype=torch.float64) + u) / n_d
        t = torch.cat([torch.zeros(B_r, dtype=torch.float64), t_diff.cpu().double()]).to(dev)
        is_recon = torch.arange(B, device=dev) < B_r
        hook_w = torch.zeros(B, dtype=torch.float64, device=dev)  # filled with L_diff below
        gamma, dgamma = model.schedule(t, var_hook_weight=hook_w, detach_shape=is_recon | sc)
        # self-conditioned rows train only the denoiser: detach gamma, gamma' and e there
        gamma = torch.where(sc, gamma.detach(), gamma)
        dgamma = torch.where(sc, dgamma.detach(), dgamma)
        e = E[tokens]  # (B, L, d_e)
        e = torch.where(sc.view(-1, 1, 1), e.detach(), e)

        eps = torch.randn(e.shape, generator=generator).to(dev)
        z = forward_noise(e, gamma, eps)  # (B, L, d_e)
        e_sc = None
        if bool(sc.any()):
            with torch.no_grad():
                first = model(z[sc], gamma[sc], None, prior_scale=ps)
            e_sc = torch.zeros_like(z)
            e_sc[sc] = first.e_hat
        out = model(z, gamma, e_sc, detach_E_rows=sc, logits_rows=B_r, prior_scale=ps)  # logits: recon rows

        recon = recon_nll(out.logits[:B_r], tokens[:B_r], None if mask is None else mask[:B_r])  # (B_r,)
        diff = diffusion_loss(out.e_hat[B_r:], e[B_r:], gamma[B_r:], dgamma[B_r:],
                              None if mask is None else mask[B_r:])  # (n_d,)
        _, g1 = model.schedule.endpoints()
        prior = prior_kl(e, g1, mask)  # (B,)
        loss = recon.mean() + diff.mean() + prior.mean()
        hook_w[B_r:] = diff.detach()  # variance-minimisation hook weight (paper code figure)
        metrics = {"recon": recon.detach(), "diffusion": diff.detach(), "prior": prior.detach(),
                   "B_r": B_r, "gamma_0": model.schedule.gamma_0.item(), "gamma_1": model.schedule.gamma_1.item()}
        if dcfg.prior_ramp_steps > 0:
            metrics["prior_scale"] = ps
        if dcfg.ce_weight > 0:
            ce = self._ce_term(model, tokens, t_diff, generator, mask, B_r, ps)
            loss = loss + dcfg.ce_weight * ce
            metrics["ce"] = ce.detach()
        return loss, metrics

    def _ce_term(self, model: RePlaid, tokens: Tensor, t_diff: Tensor, generator: torch.Generator,
                 mask: Optional[Tensor], B_r: int, prior_scale: float = 1.0) -> Tensor:
        """Paper sec. 5.1: ``E_t[-(1/L) sum_l log x_hat(z_t)]`` on the diffusion rows, with the schedule
        detached so the gradient reaches only the embeddings and the denoiser."""
        dev = tokens.device
        tok = tokens[B_r:]
        with torch.no_grad():
            gamma, _ = model.schedule(t_diff.to(dev))
        e = model.embedding()[tok]
        eps = torch.randn(e.shape, generator=generator).to(dev)
        out = model(forward_noise(e, gamma, eps), gamma, None, prior_scale=prior_scale)
        return recon_nll(out.logits, tok, None if mask is None else mask[B_r:]).mean()

    def after_step(self, metrics: dict) -> None:
        self.split.update(metrics["recon"], metrics["diffusion"])
        self.step += 1

    # ------------------------------------------------------------------ evaluation bound
    @torch.no_grad()
    def eval_bound(self, model: RePlaid, tokens: Tensor, generator: torch.Generator,
                   mask: Optional[Tensor] = None) -> dict[str, Tensor]:
        ecfg = self.cfg.eval
        sc = model.self_conditioning and ecfg.self_conditioning
        return nelbo_per_sequence(model, model.schedule, tokens, ecfg.t_samples, mask, generator,
                                  predict=lambda z, g: denoise(model, z, g, sc))

    def state_dict(self) -> dict:
        return {"split": self.split.state_dict(), "step": self.step}

    def load_state_dict(self, d: dict) -> None:
        self.split.load_state_dict(d["split"])
        self.step = int(d.get("step", 0))
