"""The RePlaid denoiser (paper sections 2 and 3.1).

    x      = z_t / sqrt(alpha^2 / d_e + sigma^2)                 unit variance per coordinate
    h_0    = W_z x + W_sc (sqrt(d_e) e_sc) + W_t feat(gamma)      the three input projections
    h      = DiT(h_0; AdaLN-Zero driven by MLP(feat(gamma)))
    logits = head(h) + (alpha / sigma^2) z_t E^T                  output prior logits, float32
    x_hat  = softmax(logits);  e_hat = x_hat E                    categorical reparameterisation

``E`` holds unit-norm rows, renormalised on every forward from the raw learnable matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from replaid.config import ModelConfig
from replaid.diffusion.denoiser import DenoiserOutput, alpha_sigma, per_position, prior_logits
from replaid.diffusion.schedule import NoiseSchedule
from replaid.model.blocks import block_diffusion_mask, pair_positions
from replaid.model.dit import Backbone, DiTTimestepFeatures, FinalLayer, TimeEmbedding, per_token
from replaid.model.head import chunk_rows, plain_head, prior_softmax_head
from replaid.regions import HEAD, INPUT_PROJECTIONS, PRIOR, REPARAM, region

N_TIME_FEATURES = 64


@dataclass(frozen=True)
class BlockContext:
    """Block diffusion's training input beside the noisy rows: the clean copy ``e`` (B, L,
    d_e) of the same sequence and the block size (:meth:`RePlaid.block_features`)."""

    e: Tensor
    block: int


class TokenEmbedding(nn.Module):
    """V x d_e embedding with rows renormalised to unit length on every forward (``normalize=False``:
    the raw rows, MDLM's convention, for the exchange ablation; they still start at unit length)."""

    def __init__(self, vocab_size: int, d_e: int, mode: str = "learned", path: str = "", normalize: bool = True):
        super().__init__()
        self.normalize = normalize
        if mode == "one-hot":
            w = torch.eye(vocab_size, d_e)
        elif mode in ("file", "init-file"):  # file: frozen; init-file: learned from there
            w = load_embedding_file(path, vocab_size, d_e)
        else:
            w = torch.randn(vocab_size, d_e)
        w = w / (w.norm(dim=-1, keepdim=True) + 1e-8)
        self.weight = nn.Parameter(w, requires_grad=mode in ("learned", "init-file", "cooc"))

    def forward(self) -> Tensor:  # (V, d_e) float32, unit rows (raw rows when not normalize)
        w = self.weight.float()
        return w / (w.norm(dim=-1, keepdim=True) + 1e-8) if self.normalize else w


EMBEDDING_FORMATS = ".safetensors (key 'embedding'), .npy or a .pt holding one tensor"


def load_embedding_file(path: str, vocab_size: int, d_e: int) -> Tensor:
    """Read a (V, d_e) matrix from .safetensors (key ``embedding``), .npy or .pt (one tensor).

    Nothing else is read: a .npy is loaded without pickle and a .pt weights-only, so no object in the
    file is ever constructed. A file that holds anything other than one finite float matrix of the
    model's shape is a one-line :class:`ValueError` naming the file and the formats accepted.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"embedding file {p} does not exist; set model.embeddings_path to a (V, d_e) matrix")

    def refuse(why: str) -> ValueError:
        return ValueError(
            f"model.embeddings_path: {p} is not a (V, d_e) matrix: accepted are {EMBEDDING_FORMATS} ({why})"
        )

    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            t = load_file(str(p))
            if not t:
                raise refuse("it holds no tensor")
            w = t.get("embedding", next(iter(t.values())))
        elif p.suffix == ".npy":
            import numpy as np

            w = torch.from_numpy(np.load(p, allow_pickle=False))
        else:
            w = torch.load(p, weights_only=True, map_location="cpu")
    except OSError:  # unreadable (permissions, a folder): the CLI names the file
        raise
    except Exception as e:
        if str(e).startswith("model.embeddings_path:"):
            raise
        if p.suffix in (".safetensors", ".npy"):
            raise refuse(f"not a readable {p.suffix} file") from None
        raise refuse("a pickled object other than a tensor, or a damaged file; it was not loaded") from None
    if not isinstance(w, Tensor):
        raise refuse(f"it holds a {type(w).__name__}, not a tensor")
    if not (w.is_floating_point() or w.dtype in (torch.int32, torch.int64)):
        raise refuse(f"its dtype is {w.dtype}")
    if tuple(w.shape) != (vocab_size, d_e):
        raise ValueError(
            f"embedding file {p} has shape {tuple(w.shape)}, expected ({vocab_size}, {d_e}); "
            f"set model.d_e to match or use another file"
        )
    w = w.float()
    if not bool(torch.isfinite(w).all()):
        raise refuse("it holds NaN/Inf")
    return w


PAPER_WIDTH = 768  # the width of the paper's 0.1B model


def input_init_std(cfg: ModelConfig, d_e: int) -> float:
    """Init std of RePlaid's input projection ``W_z`` (``model.in_z_std``; docs/results/ablations/plaid-gap.md).

    Plaid initialises it as PyTorch does, std ``1/sqrt(3 d_e)``: ``h_0`` then has per-unit std ~0.58 at
    any width, while the DiT blocks (init std 0.02, AdaLN-Zero gates) add branches whose scale grows
    with the width (~0.3 at hidden 768, ~0.05 at 128). ``0`` (auto) keeps the paper's ratio of the two
    at every width, Plaid's std times ``min(1, hidden / 768)``: exactly Plaid's from the 0.1B width up.
    ``-1``: ``1/sqrt(d_e)`` (unit-variance ``h_0``), this project's init before 2026-11-24.
    """
    if cfg.in_z_std > 0:
        return cfg.in_z_std
    if cfg.in_z_std == -1:
        return 1.0 / math.sqrt(d_e)
    return min(1.0, cfg.hidden / PAPER_WIDTH) / math.sqrt(3 * d_e)


class ScheduleOptions(Protocol):
    """What the network reads of its method's options (``replaid.methods.replaid.DiffusionOptions``):
    the noise schedule's start."""

    gamma_0: float
    gamma_1: float
    schedule: str
    schedule_hidden: int
    learn_endpoints: bool


class RePlaid(nn.Module):
    """RePlaid: VDM denoiser with learned embeddings, schedule, prior logits and self-conditioning."""

    def __init__(self, cfg: ModelConfig, dcfg: ScheduleOptions, vocab_size: int):
        super().__init__()
        d_e = vocab_size if cfg.embeddings == "one-hot" else cfg.d_e
        self.vocab_size, self.d_e, self.cfg = vocab_size, d_e, cfg
        self.self_conditioning = cfg.self_conditioning
        self.embedding = TokenEmbedding(vocab_size, d_e, cfg.embeddings, cfg.embeddings_path, cfg.normalize_embeddings)
        self.schedule = NoiseSchedule(
            dcfg.gamma_0, dcfg.gamma_1, dcfg.schedule, dcfg.schedule_hidden, dcfg.learn_endpoints
        )
        self.time_features = TimeEmbedding(N_TIME_FEATURES)
        # the three input projections (bias-free); self-cond and time start at zero
        # model.up_projection=false (exchange ablation, d_e == hidden): z enters the backbone as it is
        self.in_z: nn.Linear | nn.Identity = (
            nn.Linear(d_e, cfg.hidden, bias=False) if cfg.up_projection else nn.Identity()
        )
        self.in_sc = nn.Linear(d_e, cfg.hidden, bias=False)
        self.in_t = nn.Linear(N_TIME_FEATURES, cfg.hidden, bias=False)
        if isinstance(self.in_z, nn.Linear):  # model.up_projection
            nn.init.normal_(self.in_z.weight, std=input_init_std(cfg, d_e))
        nn.init.zeros_(self.in_sc.weight)
        nn.init.zeros_(self.in_t.weight)
        n_cond_in = N_TIME_FEATURES
        if cfg.adaln_features == "dit":  # smooth features of gamma for the AdaLN condition
            self.adaln_time = DiTTimestepFeatures(256, of_t=False)
            n_cond_in = 256
        self.cond = nn.Sequential(
            nn.Linear(n_cond_in, cfg.cond_dim), nn.SiLU(), nn.Linear(cfg.cond_dim, cfg.cond_dim), nn.SiLU()
        )
        self.backbone = Backbone(
            cfg.hidden,
            cfg.n_layers,
            cfg.n_heads,
            cfg.cond_dim,
            cfg.mlp_ratio,
            cfg.dropout,
            causal=False,
            activation_checkpointing=cfg.activation_checkpointing,
        )
        self.final = FinalLayer(cfg.hidden, vocab_size, cfg.cond_dim)

    # ---- denoiser interface -------------------------------------------------------------
    def embedding_matrix(self) -> Tensor:
        out_: Tensor = self.embedding()
        return out_

    def input_states(self, z: Tensor, gamma: Tensor, e_sc: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``h_0`` (B, L, hidden) and the AdaLN condition (module docstring). z: (B, L, d_e); gamma: (B,)
        float64, or per token (B, L) (block diffusion: every block at its own level), and then the
        condition is per token too, (B, L, cond_dim) instead of (B, cond_dim)."""
        alpha, sigma = alpha_sigma(gamma.double())
        scale = per_position(torch.rsqrt(alpha**2 / self.d_e + sigma**2).float())  # (B, 1, 1) or (B, L, 1)
        feat = self.time_features(gamma)  # (B, 64) or (B, L, 64)
        with torch.autocast(device_type=z.device.type, enabled=False), region(INPUT_PROJECTIONS):  # float32
            h = self.in_z(z.float() * scale)  # (B, L, hidden)
            if self.cfg.time_input:
                h = h + per_token(self.in_t(feat))
            if e_sc is not None:
                h = h + self.in_sc(e_sc.float() * math.sqrt(self.d_e))
        if self.cfg.adaln_features == "dit":
            c = self.cond(self.adaln_time(gamma))  # (B, cond_dim)
        elif self.cfg.adaln_features == "none":
            c = self.cond(torch.zeros_like(feat))  # time enters through in_t only (as Plaid)
        else:
            c = self.cond(feat)
        return h, c

    def readout(self, h: Tensor, c: Tensor | None) -> Tensor:
        """The head's input features of the backbone's output h (B, L, hidden)."""
        f = self.final.features(h, c)
        return f * self.cfg.readout_mult if self.cfg.readout_mult != 1.0 else f

    def hidden_states(
        self, z: Tensor, gamma: Tensor, e_sc: Tensor | None, context: BlockContext | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Backbone features before the head. z: (B, L, d_e); gamma: (B,) float64, or (B, L) with a
        ``context`` (block diffusion: :meth:`block_features`)."""
        if context is not None:
            return self.block_features(z, gamma, e_sc, context)
        h, c = self.input_states(z, gamma, e_sc)
        return self.readout(self.backbone(h, c), c), c

    # ---- block diffusion (BD3-LM) -------------------------------------------------
    def clean_states(self, e: Tensor) -> tuple[Tensor, Tensor | None]:
        """The clean rows' ``h_0`` (B, n, hidden) and per-token condition: a clean block enters as its
        t = 0 latent without noise, ``z = alpha_0 e`` at ``gamma_0 = gamma(0)`` (the schedule's endpoint,
        detached: the context does not train the schedule), with no self-conditioning input. e: (B, n, d_e)."""
        B, n, _ = e.shape
        g0 = self.schedule.endpoints()[0].detach().expand(B, n)  # (B, n) float64
        alpha, _ = alpha_sigma(g0)
        z = (alpha[..., None] * e.double()).to(e.dtype)  # (B, n, d_e)
        return self.input_states(z, g0, None)

    def block_features(
        self, z: Tensor, gamma: Tensor, e_sc: Tensor | None, context: BlockContext
    ) -> tuple[Tensor, Tensor | None]:
        """BD3-LM's vectorised pass: the noisy rows z (B, L, d_e) at per-token gamma (B, L) and the clean
        copy ``context.e`` (B, L, d_e) as one (B, 2L) input under
        :func:`~replaid.model.blocks.block_diffusion_mask`; returns the noisy half's features (B, L,
        hidden), block k's given the clean blocks before it and its own noisy block, and its condition."""
        L = z.shape[1]
        h_n, c_n = self.input_states(z, gamma, e_sc)  # (B, L, hidden), (B, L, cond) or None
        h_c, c_c = self.clean_states(context.e)
        h = torch.cat([h_n, h_c], dim=1)  # (B, 2L, hidden)
        c = None if c_n is None or c_c is None else torch.cat([c_n, c_c], dim=1)
        pos, mask = pair_positions(L, h.device), block_diffusion_mask(L, context.block, h.device)
        h = self.backbone(h, c, positions=pos, mask=mask)
        return self.readout(h[:, :L], c_n), c_n

    def head_logits(self, feats: Tensor) -> Tensor:
        """The logit head, bf16 under autocast (precision table), returned as float32 (B, L, V)."""
        with region(HEAD):
            out_: Tensor = self.final.linear(feats).float()
        return out_

    def forward(
        self,
        z: Tensor,
        gamma: Tensor,
        e_sc: Tensor | None = None,
        prior_scale: float = 1.0,
        context: BlockContext | None = None,
    ) -> DenoiserOutput:
        """(z_t, gamma, e_sc) -> (logits, e_hat) for sampling and evaluation (plain autograd).

        prior_scale: multiplies the output prior logits (Plaid's ``bias_scale`` ramp; 1 = RePlaid).
        context: block diffusion's clean copy and block size (gamma then per token (B, L)).
        """
        feats, _ = self.hidden_states(z, gamma, e_sc, context)  # (B, L, hidden)
        return self.output(feats, z, gamma, self.embedding(), prior_scale)

    def train_outputs(
        self,
        z: Tensor,
        gamma: Tensor,
        e_sc: Tensor | None,
        tokens: Tensor,
        e_keep: Tensor,
        prior_scale: float = 1.0,
        context: BlockContext | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Training outputs of every row through the fused head (:mod:`replaid.model.head`):
        the per-position reconstruction CE ``-log x_hat[tokens]`` (B, L) float32 and ``e_hat``
        (B, L, d_e) float32, holding one (B*L, V) float32 buffer and with no row indexing.

        e_keep: (B,) bool, rows whose output prior logits and reparameterisation train ``E``
            (False on self-conditioned rows, which use ``E.detach()``).
        context: block diffusion (:meth:`block_features`); gamma is then per token (B, L).
        """
        B, L, d_e = z.shape
        feats, _ = self.hidden_states(z, gamma, e_sc, context)  # (B, L, hidden)
        E = self.embedding()  # (V, d_e)
        zs = None
        if self.cfg.output_prior:
            with region(PRIOR):
                alpha, sigma = alpha_sigma(gamma.double())
                zs = (z.float() * per_position((prior_scale * alpha / sigma**2).float())).reshape(B * L, d_e)
        lin = self.final.linear
        args = (
            feats.reshape(B * L, -1),
            lin.weight,
            lin.bias,
            zs,
            E,
            e_keep[:, None].expand(B, L).reshape(B * L),
            tokens.reshape(B * L),
        )
        mm = self.head_dtype(z.device)  # bf16 under autocast
        with torch.autocast(z.device.type, enabled=False):
            if torch.compiler.is_compiling():  # the compiler fuses the plain expression itself
                e_hat, nll = plain_head(*args, mm_dtype=mm)
            else:
                e_hat, nll = prior_softmax_head(*args, chunk_rows(self.vocab_size, self.cfg.head_chunk_rows), mm)
        return nll.view(B, L), e_hat.view(B, L, d_e)

    def head_dtype(self, device: torch.device) -> torch.dtype:
        """The logit head's matmul dtype: bf16 under autocast (precision table), else float32."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return torch.float32

    def output(self, feats: Tensor, z: Tensor, gamma: Tensor, E: Tensor, prior_scale: float = 1.0) -> DenoiserOutput:
        """(logits, e_hat) of the head's features (B, L, hidden): the head, the output prior logits at
        z (B, L, d_e) and gamma (B,) or (B, L), the categorical reparameterisation."""
        logits = self.head_logits(feats)  # (b, L, V): the head in bf16 under autocast
        with torch.autocast(device_type=z.device.type, enabled=False):
            if self.cfg.output_prior:
                with region(PRIOR):
                    prior = prior_logits(z, gamma, E, row_norms=not self.cfg.normalize_embeddings)  # float32
                    logits = logits + (prior if prior_scale == 1.0 else prior_scale * prior)
            with region(REPARAM):
                e_hat = torch.softmax(logits, dim=-1) @ E.float()  # (b, L, d_e) float32
        return DenoiserOutput(logits, e_hat)

    # ---- parameter groups (paper optimiser tables) ----------------------------------------
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        groups: dict[str, list[nn.Parameter]] = {
            "embedding": [self.embedding.weight],
            "schedule_mlp": list(self.schedule.shape.parameters()),
            "endpoints": [self.schedule.gamma_0, self.schedule.gamma_1],
            "projections": [*self.in_z.parameters(), *self.in_sc.parameters(), *self.in_t.parameters()],  # bias-free
        }
        taken = {id(p) for ps in groups.values() for p in ps}
        groups["backbone"] = [p for p in self.parameters() if id(p) not in taken]
        return {k: [p for p in v if p.requires_grad] for k, v in groups.items()}

    def non_embedding_params(self) -> int:
        """All parameters but the token-embedding matrix (the IsoFLOP table's convention:
        transformer blocks + output head, e.g. 116M for hidden 768 x 12 layers with V = 32,001)."""
        return sum(p.numel() for p in self.parameters()) - self.embedding.weight.numel()


def denoise(
    model: Any, z: Tensor, gamma: Tensor, self_cond: bool | None = None, context: BlockContext | None = None
) -> DenoiserOutput:
    """Evaluation-time prediction: with self-conditioning, a first pass with no s.c. input
    whose ``e_hat`` feeds the second pass (on for every row). With a block ``context`` both are the
    vectorised block pass, so each block's first estimate feeds the same block's second pass."""
    sc = model.self_conditioning if self_cond is None else self_cond
    if context is None:
        if not sc:
            out_: DenoiserOutput = model(z, gamma, None)
            return out_
        first = model(z, gamma, None)
        out_ = model(z, gamma, first.e_hat)
        return out_
    if not sc:
        out_ = model(z, gamma, None, context=context)
        return out_
    first = model(z, gamma, None, context=context)
    out_ = model(z, gamma, first.e_hat, context=context)
    return out_
