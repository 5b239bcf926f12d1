"""FLOP accounting in one place (benchmarks, MFU, scaling-law tools).

Counts multiply-adds as 2 FLOPs. Per token and per forward pass of a DiT with width d, n layers,
MLP ratio r, sequence length L and output vocabulary V:

    blocks      2 n (4 + 2 r) d^2           (qkv + out projections, MLP)
    attention   4 n L d                     (QK^T and AV; halved for causal attention is NOT applied:
                                             SDPA kernels do the full product unless masked-out blocks
                                             are skipped, so we count what MDLM/Chinchilla-style counts use)
    head        2 d V                       (output logits; RePlaid adds 2 V d_e for the prior logits
                                             and 2 V d_e for e_hat = x_hat E)
    input       2 d_e d                     (RePlaid's z projection; token embeddings are lookups;
                                             the self-conditioning projection, another 2 d_e d, and the
                                             per-sequence AdaLN/time MLPs are negligible and not counted)

Block diffusion (BD3-LM's vectorised training, ``[x_t, x_0]``: 2L rows under one mask, the head on the
L noisy rows only) doubles the blocks and input terms and quadruples attention (2L rows attend 2L keys:
a dense masked SDPA computes every product); the head is unchanged. Sampling a block run costs less.

Training = 3 x forward (forward + backward). Self-conditioning at rate p adds a no-grad forward
on p of the rows: a factor ``1 + p / 3`` (8.3% at p = 0.25, the paper's figure).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaid.config import RunConfig
from replaid.methods import METHODS
from replaid.presets import get_preset


@dataclass
class FlopCount:
    non_embedding: float  # per token, forward
    embedding: float  # per token, forward (head + embedding-side products)

    @property
    def forward(self) -> float:
        return self.non_embedding + self.embedding


def forward_flops_per_token(
    hidden: int, n_layers: int, seq_len: int, vocab_size: int, mlp_ratio: int = 4, d_e: int | None = None
) -> FlopCount:
    """Forward FLOPs per token; ``d_e`` given for continuous (embedding-space) models."""
    blocks = 2 * n_layers * (4 + 2 * mlp_ratio) * hidden**2
    attn = 4 * n_layers * seq_len * hidden
    head = 2 * hidden * vocab_size
    emb = head + (4 * vocab_size * d_e + 2 * d_e * hidden if d_e else 0)
    return FlopCount(non_embedding=blocks + attn, embedding=emb)


def train_flops_per_token(cfg: RunConfig, vocab_size: int, include_embedding: bool = True) -> float:
    """Training FLOPs per token for a :class:`~replaid.config.RunConfig` (3 x forward, + s.c. pass)."""
    m = cfg.model
    continuous = METHODS[cfg.method].kind.continuous
    d_e = (vocab_size if m.embeddings == "one-hot" else m.d_e) if continuous else None
    f = forward_flops_per_token(m.hidden, m.n_layers, cfg.data.seq_len, vocab_size, m.mlp_ratio, d_e)
    if METHODS[cfg.method].training_block_size(cfg):  # [x_t, x_0]: 2L rows attending 2L keys (module docstring)
        attn = 4 * m.n_layers * cfg.data.seq_len * m.hidden
        f = FlopCount(
            non_embedding=2 * (f.non_embedding - attn) + 4 * attn,
            embedding=f.embedding + (2 * d_e * m.hidden if d_e else 0),
        )
    per = f.forward if include_embedding else f.non_embedding
    sc = cfg.diffusion.sc_rate if (continuous and m.self_conditioning) else 0.0
    return 3 * per * (1 + sc / 3)


def self_conditioning_overhead(rate: float = 0.25) -> float:
    """Fractional extra training compute of self-conditioning at ``rate`` (0.0833 at 0.25)."""
    return rate / 3


# ------------------------------------------------------------------ parameter counts (the scaling-law N)

LLAMA2_VOCAB = 32_000  # the IsoFLOP study's tokenizer; MDLM/AR add one input id ([MASK] / BOS)
REF_COND_DIM, REF_FREQ = 128, 256  # MDLM/Duo DiT: cond_dim, TimestepEmbedder frequency features


def reference_dit_params(
    hidden: int, n_layers: int, n_out: int, cond_dim: int = REF_COND_DIM, n_freq: int = REF_FREQ, mlp_ratio: int = 4
) -> int:
    """Non-embedding parameters of the reference DiT (kuleshov-group/mdlm and s-sahoo/duo
    ``models/dit.py`` with AdaLN, as MDLM, Duo and the scaling-law AR use it), counted from its
    structure: the time MLP ``Linear(n_freq, c) + Linear(c, c)``; per block two weight-only
    LayerNorms, bias-free qkv and out projections, the MLP with biases, ``adaLN Linear(c, 6d)``;
    the final weight-only LayerNorm, ``adaLN Linear(c, 2d)`` and the head ``Linear(d, n_out)``.
    Only the input embedding is left out. About 117.0M at d = 768, 12 layers, n_out = 32,001."""
    d, c = hidden, cond_dim
    time_mlp = n_freq * c + c + c * c + c
    block = 2 * d + 4 * d * d + 2 * mlp_ratio * d * d + mlp_ratio * d + d + c * 6 * d + 6 * d
    final = d + c * 2 * d + 2 * d + d * n_out + n_out
    return time_mlp + n_layers * block + final


def reference_plaid_params(
    hidden: int, n_layers: int, vocab_size: int, d_e: int = 16, mlp_ratio: int = 4, schedule_hidden: int = 1024
) -> int:
    """Non-embedding parameters of igul222/plaid's ``DiffusionModel`` (+ its ``NoiseSchedule`` and
    ``GammaBounds``), from its structure: input, self-conditioning (``d_e -> d``) and gamma
    (``64 -> d``) projections, bias-free; per block two RMSNorm scales, qkv, out and the bias-free
    MLP; the weight-only output LayerNorm and the ``MuReadout`` head ``Linear(d, V)``; the schedule
    MLP ``3 x 1024`` and two endpoints. The ``V x d_e`` embedding matrix is left out."""
    d = hidden
    block = 2 * d + 4 * d * d + 2 * mlp_ratio * d * d
    return 2 * d_e * d + 64 * d + n_layers * block + d + d * vocab_size + vocab_size + 3 * schedule_hidden + 2


def param_counts(
    method: str, hidden: int, n_layers: int, n_heads: int, vocab_size: int = LLAMA2_VOCAB, cfg: RunConfig | None = None
) -> dict[str, int]:
    """Our model's parameter counts for ``method`` at one size, built on the meta device (no memory):
    ``{"non_embedding": N, "embedding": the token-embedding matrix, "total"}``. ``N`` is the
    scaling-law axis: everything but the input token embedding (the output head counts), the
    convention of the paper's IsoFLOP table. ``cfg`` (a RunConfig) supplies the other options
    (default: the ``isoflop`` preset's)."""
    cfg = cfg or get_preset("isoflop-14m")
    cfg.model.hidden, cfg.model.n_layers, cfg.model.n_heads, cfg.method = hidden, n_layers, n_heads, method
    with torch.device("meta"):
        model = METHODS[method](cfg).build_model(vocab_size)
    total = sum(p.numel() for p in model.parameters())
    n = model.non_embedding_params()
    return {"non_embedding": n, "embedding": total - n, "total": total}
