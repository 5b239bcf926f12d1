"""MDLM: masked (absorbing-state) diffusion with the SUBS parameterisation.

* [MASK] is the extra input id ``V``; the network outputs V logits (the mask logit is -inf, i.e.
  absent), and unmasked positions copy their input (they contribute zero loss).
* The reference log-linear schedule (kuleshov-group/mdlm ``LogLinearNoise``, eps = 1e-3):
  ``alpha_t = 1 - (1 - eps) t`` for ``t`` in ``[eps, 1]``, i.e. each token is masked with
  probability ``(1 - eps) t`` (never all, never none). The NELBO weight is unchanged,
  ``-alpha'_t / (1 - alpha_t) = (1 - eps) / ((1 - eps) t) = 1 / t``, and the integral over
  ``[0, eps]`` is dropped (the rest is averaged over ``U[eps, 1]``), as MDLM's ``_sample_t``.
* ``t = eps + (1 - eps) s`` with low-discrepancy ``s_i = (i + u) / n``: in training the trainer
  builds ``s`` for the *global* batch (one ``u`` per step) and hands each rank / accumulation step
  its slice (``t_diff``), as RePlaid's diffusion rows; called alone, ``u`` is drawn here.
* Continuous-time NELBO per token: ``E_t[(alpha'_t / (1 - alpha_t)) (1/L) sum_{l masked} log p(x_l | z_t)]``
  ``= E_t[(1/t) (1/L) sum_{l masked} CE_l]``.
* Training: the low-variance objective by default (weight ``1/t`` replaced by 1, i.e.
  ``(1/L) sum_{masked} CE``); ``low_variance=False`` trains on the NELBO itself. Evaluation always
  uses the NELBO.
* The network keeps its AdaLN modulation; without time conditioning (the default, as MDLM) its
  condition is the constant of ``t = 0`` (:class:`~replaid.model.tokens.TokenDiT`).
* Ancestral sampler (:func:`replaid.sampling.discrete.sample_mdlm`) in float64 (exponential race). By default the network is *not*
  time-conditioned (the number of masks reveals t), so a step that unmasks nothing leaves the
  network input unchanged and its output is reused exactly; with ``time_conditioning=True`` every
  step calls the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from replaid.config import ConfigError, RunConfig
from replaid.diffusion.nelbo import stratified_time_average
from replaid.diffusion.rng import device_generator
from replaid.methods.base import Kind, Method, Metrics, Probe
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT
from replaid.regions import AGGREGATION, region

EPS = 1e-3


def antithetic_times(n: int, generator: torch.Generator, eps: float = EPS) -> Tensor:
    """``t_i = eps + (1 - eps)(i + u)/n`` (n,) float64, one ``u`` for all rows."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return eps + (1 - eps) * ((torch.arange(n, dtype=torch.float64) + u) / n)


def mask_probability(t: Tensor, eps: float = EPS) -> Tensor:
    """``1 - alpha_t = (1 - eps) t`` of the reference log-linear schedule."""
    return (1 - eps) * t


@dataclass
class MDLMOptions:
    """``method=mdlm``: the config section ``mdlm``."""

    low_variance: bool = True  # train on plain masked CE (weight 1); evaluation always uses the NELBO
    time_conditioning: bool = False  # MDLM needs no time input (the mask count carries it)
    block_size: int = 0  # BD3-LM's blocks: 0 = the whole sequence (plain MDLM); else divides seq_len


class MDLMMethod(Method[TokenDiT]):
    name = "mdlm"
    kind = Kind.MASKED
    description = "MDLM (masked discrete diffusion; NELBO bound)"
    samplers = ("ancestral",)
    global_times = True  # the trainer passes t_diff, sliced from the global batch
    options = MDLMOptions
    model_keys = TOKEN_MODEL_KEYS

    def __init__(
        self, cfg: RunConfig, low_variance: bool | None = None, time_conditioning: bool | None = None, eps: float = EPS
    ):
        """Options default to the config's (:class:`MDLMOptions`)."""
        super().__init__(cfg)
        opts: MDLMOptions = cfg.options
        self.low_variance = opts.low_variance if low_variance is None else low_variance
        self.time_conditioning = opts.time_conditioning if time_conditioning is None else time_conditioning
        self.eps = eps
        L = cfg.data.seq_len
        self.block = opts.block_size or L  # tokens per block; == L: plain MDLM
        self.blocks = self.block < L

    @classmethod
    def check_config(cls, cfg: RunConfig, world_size: int = 1) -> None:
        """``mdlm.block_size``: 0 or a divisor of ``data.seq_len``; blocks run without time conditioning."""
        opts: MDLMOptions = cfg.options
        b, L = opts.block_size, cfg.data.seq_len
        if b < 0 or (b and L % b):
            raise ConfigError(f"mdlm.block_size={b} must be 0 (the whole sequence) or divide data.seq_len={L}")
        if 0 < b < L and opts.time_conditioning:
            raise ConfigError(
                f"mdlm.block_size={b} runs without time conditioning (BD3-LM's default): drop mdlm.time_conditioning"
            )

    @classmethod
    def training_block_size(cls, cfg: RunConfig) -> int:
        """``mdlm.block_size`` when it splits the sequence (training reads ``[x_t, x_0]``), else 0."""
        opts: MDLMOptions = cfg.options
        return opts.block_size if 0 < opts.block_size < cfg.data.seq_len else 0

    def block_size(self) -> int:
        """``mdlm.block_size`` when it splits the sequence (BD3-LM: sampled block by block), else 0."""
        return self.block if self.blocks else 0

    def block_times(self, B: int, L: int, generator: torch.Generator) -> Tensor:
        """Per-token times (B, L) float64, one per (row, block), stratified over all B x L/block of them
        (BD3-LM's ``_sample_t``: ``(u_k / n + k / n) mod 1``), mapped to ``[eps, 1]``."""
        n_blocks = L // self.block
        n = B * n_blocks
        u = torch.rand(B, n_blocks, generator=generator, dtype=torch.float64)
        s = (u / n + torch.arange(n, dtype=torch.float64).view(B, n_blocks) / n) % 1
        return (self.eps + (1 - self.eps) * s).repeat_interleave(self.block, dim=1)

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(
            self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=self.time_conditioning, causal=False
        )

    # ------------------------------------------------------------------ the per-row loss
    def masked_ce(
        self,
        model: TokenDiT,
        tokens: Tensor,
        t: Tensor,
        generator: torch.Generator | None,
        mask: Tensor | None = None,
        clean: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`masked_terms` summed per row: ``(S, n)``, S = (1/n) sum of the masked CE (per-row t: the
        NELBO estimate is ``S / t``), or of ``CE / t`` (per-token t: the NELBO itself)."""
        ce, n = self.masked_terms(model, tokens, t, generator, mask, clean)
        if t.dim() == 2:
            ce = ce / t.to(ce.device)
        with region(AGGREGATION):
            return ce.sum(1) / n, n

    def masked_terms(
        self,
        model: TokenDiT,
        tokens: Tensor,
        t: Tensor,
        generator: torch.Generator | None,
        mask: Tensor | None = None,
        clean: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Draw z_t ~ q(z_t | x) at times t, per row (B,) or per token (B, L) float64 (blocks), and return
        ``(ce, n)``: the CE (B, L) float64 at the masked (valid) positions, 0 elsewhere (SUBS), and the
        number n (B,) of valid positions per row. ``clean`` (B, L) bool: positions never masked (a
        conditional's context). With blocks (``mdlm.block_size``) block k is predicted from the clean
        blocks before it and its own noisy block (:meth:`TokenDiT.forward_blocks`)."""
        dev = tokens.device
        B, L = tokens.shape
        V = model.n_out
        u = torch.rand(B, L, generator=device_generator(generator, dev), dtype=torch.float64, device=dev)
        p = mask_probability(t, self.eps).to(dev)
        is_masked = u < (p.view(-1, 1) if p.dim() == 1 else p)
        if clean is not None:
            is_masked = is_masked & ~clean.bool()
        z = torch.where(is_masked, torch.full_like(tokens, V), tokens)
        if self.blocks:
            feats = model.block_features(z, tokens, self.block)  # (B, L, hidden)
        else:
            feats = model.features(z, t.to(dev).float() if model.time_conditioning else None)
        ce = model.token_nll(feats, tokens)  # (B, L) float32 (float64 in a reference): no full float32 logits
        keep = is_masked if mask is None else (is_masked & mask.bool())
        with region(AGGREGATION):  # float64
            ce = torch.where(keep, ce.double(), torch.zeros((), dtype=torch.float64, device=dev))  # SUBS carry-over
            n = (
                torch.full((B,), float(L), dtype=torch.float64, device=dev)
                if mask is None
                else mask.double().sum(1).clamp_min(1)
            )
        return ce, n

    def train_loss(
        self,
        model: TokenDiT,
        tokens: Tensor,
        generator: torch.Generator,
        mask: Tensor | None = None,
        t_diff: Tensor | None = None,
        n_recon: int | None = None,
    ) -> tuple[Tensor, Metrics]:
        """t_diff: (B,) low-discrepancy values in [0, 1), this micro-batch's slice of the global batch
        (the trainer's); mapped to ``t = eps + (1 - eps) t_diff``. Drawn here when None."""
        if self.blocks:  # a time per (row, block), BD3-LM's; each token's NELBO weight is its block's 1/t
            t_tok = self.block_times(tokens.shape[0], tokens.shape[1], generator).to(tokens.device)
            ce, n = self.masked_terms(model, tokens, t_tok, generator, mask)
            nelbo = (ce / t_tok).sum(1) / n
            loss_rows = ce.sum(1) / n if self.low_variance else nelbo
            return loss_rows.mean(), {"loss": loss_rows.detach(), "nelbo": nelbo.detach()}
        if t_diff is None:
            t = antithetic_times(tokens.shape[0], generator, self.eps)
        else:
            t = self.eps + (1 - self.eps) * t_diff.double()
        t = t.to(tokens.device)
        s, _ = self.masked_ce(model, tokens, t, generator, mask)
        with region(AGGREGATION):  # float64
            nelbo = s / t
            loss_rows = s if self.low_variance else nelbo
            loss = loss_rows.mean()
        return loss, {"loss": loss_rows.detach(), "nelbo": nelbo.detach()}

    @torch.no_grad()
    def eval_bound(
        self, model: TokenDiT, tokens: Tensor, generator: torch.Generator | None, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """NELBO with ``eval.t_samples`` stratified times per sequence (``t_k = eps + (1-eps)(k + u_b)/K``)."""

        def weighted_ce(t: Tensor) -> Tensor:
            return self.masked_ce(model, tokens, t, generator, mask)[0] / t

        total = stratified_time_average(
            weighted_ce, tokens.shape[0], self.cfg.eval.t_samples, generator, self.eps, 1.0, tokens.device
        )
        return {"nelbo": total}

    @torch.no_grad()
    def conditional_nll(
        self, model: TokenDiT, tokens: Tensor, target: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """The NELBO of the target given the rest held clean (only the target is ever masked):
        ``E_t[(1/t) sum_{l in target, masked} CE_l]``, ``eval.t_samples`` stratified times per row. An
        upper bound on ``-log p(target | context)`` of the any-order model (its reverse process with the
        context clamped), summed over the target positions."""

        def weighted_ce(t: Tensor) -> Tensor:
            s, n = self.masked_ce(model, tokens, t, generator, target, clean=~target.bool())
            return s * n / t  # s: the mean over the n target positions

        return stratified_time_average(
            weighted_ce, tokens.shape[0], self.cfg.eval.t_samples, generator, self.eps, 1.0, tokens.device
        )

    @torch.no_grad()
    def greedy_logits(self, model: TokenDiT, tokens: Tensor, target: Tensor, seed: int) -> Tensor:
        """Every target token masked (t = 1), the context clean: one step of unmasking."""
        z = torch.where(target, torch.full_like(tokens, model.n_out), tokens)
        t = torch.ones(tokens.shape[0], device=tokens.device)
        logits: Tensor = model(z, t if model.time_conditioning else None)
        return logits

    def probe(self, model: TokenDiT, tokens: Tensor, t: float, generator: torch.Generator) -> Probe:
        """The predictions at the masked positions of tokens (B, L) masked at time t (the whole sequence)."""
        dev = tokens.device
        B, L = tokens.shape
        tt = torch.full((B,), t, dtype=torch.float64, device=dev)
        masked = (
            torch.rand(B, L, generator=generator, dtype=torch.float64).to(dev) < mask_probability(tt, self.eps)[:, None]
        )
        z = torch.where(masked, torch.full_like(tokens, model.n_out), tokens)
        logits = model(z, tt.float() if model.time_conditioning else None).float()  # (B, L, V)
        return Probe(logits, masked)

    def embedding_rows(self, model: TokenDiT) -> Tensor:
        return model.rows(model.n_out)
