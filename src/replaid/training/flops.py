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

Training = 3 x forward (forward + backward). Self-conditioning at rate p adds a no-grad forward
on p of the rows: a factor ``1 + p / 3`` (8.3% at p = 0.25, the paper's figure).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlopCount:
    non_embedding: float  # per token, forward
    embedding: float  # per token, forward (head + embedding-side products)

    @property
    def forward(self) -> float:
        return self.non_embedding + self.embedding


def forward_flops_per_token(hidden: int, n_layers: int, seq_len: int, vocab_size: int, mlp_ratio: int = 4,
                            d_e: int | None = None) -> FlopCount:
    """Forward FLOPs per token; ``d_e`` given for continuous (embedding-space) models."""
    blocks = 2 * n_layers * (4 + 2 * mlp_ratio) * hidden**2
    attn = 4 * n_layers * seq_len * hidden
    head = 2 * hidden * vocab_size
    emb = head + (4 * vocab_size * d_e + 2 * d_e * hidden if d_e else 0)
    return FlopCount(non_embedding=blocks + attn, embedding=emb)


def train_flops_per_token(cfg, vocab_size: int, include_embedding: bool = True) -> float:
    """Training FLOPs per token for a :class:`~replaid.config.RunConfig` (3 x forward, + s.c. pass)."""
    m = cfg.model
    continuous = cfg.method in ("replaid", "plaid")
    d_e = (vocab_size if m.embeddings == "one-hot" else m.d_e) if continuous else None
    f = forward_flops_per_token(m.hidden, m.n_layers, cfg.data.seq_len, vocab_size, m.mlp_ratio, d_e)
    per = f.forward if include_embedding else f.non_embedding
    sc = cfg.diffusion.sc_rate if (continuous and m.self_conditioning) else 0.0
    return 3 * per * (1 + sc / 3)


def self_conditioning_overhead(rate: float = 0.25) -> float:
    """Fractional extra training compute of self-conditioning at ``rate`` (0.0833 at 0.25)."""
    return rate / 3
