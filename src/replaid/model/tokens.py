"""A token-embedding DiT for the discrete baselines (AR, MDLM, Duo).

    h_0    = W_emb[x]                      (ids)   or  w @ W_emb   (soft weights over the rows, Duo)
    h_0    = W_up (sqrt(d_e) e_x),  e_x = E[x] / ||E[x]||    with ``model.factored_embedding`` (the
             exchange ablation: RePlaid's d_e-dim unit-norm rows and bias-free up-projection)
    c      = MLP(feat(t))                  t = the noise level, or 0 when not time-conditioned
    h      = DiT(h_0; AdaLN-Zero driven by c)
    logits = head(LN(h))                   bf16 under autocast (precision table), returned float32

The blocks are the shared :class:`~replaid.model.dit.Backbone` (LayerNorm, rotary, GELU(tanh),
biases in the MLP), with causal attention for AR. ``t`` is the discrete noise level in [0, 1]
(``1 - alpha_t`` of the absorbing / uniform-state process) fed through the Plaid sinusoidal
features, or with ``model.time_embedding=dit`` through MDLM/Duo's 256 DiT features of
``sigma = -log(1 - t)`` (converted Duo checkpoints, ``replaid/hub/peers.py``). For causal models
:meth:`TokenDiT.forward_cached` runs the same blocks with a KV cache.

Parameterisation as the references (kuleshov-group/mdlm ``models/dit.py``): every block keeps its
AdaLN modulation even when the model is not time-conditioned (AR, MDLM by default); the
condition is then the constant ``c = MLP(feat(0))``, exactly as MDLM feeds ``sigma = 0``. So the
non-embedding parameter count ``N`` (blocks + AdaLN + time MLP + output head) is the same for AR,
MDLM and Duo at a given size and matches the paper's IsoFLOP table
(:func:`replaid.training.flops.param_counts`).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from replaid.config import ModelConfig
from replaid.model.blocks import block_diffusion_mask, pair_positions
from replaid.model.dit import Backbone, DiTTimestepFeatures, FinalLayer, KVCache, TimeEmbedding, wide
from replaid.model.head import chunk_rows, linear_cross_entropy, plain_cross_entropy
from replaid.regions import HEAD, region

N_TIME_FEATURES = 64
# the ModelConfig keys a TokenDiT reads beyond the shared backbone (config.BACKBONE_KEYS)
TOKEN_MODEL_KEYS = ("factored_embedding", "time_embedding")
N_DIT_FEATURES = 256


class TokenDiT(nn.Module):
    """``n_in`` input ids (the vocabulary plus any extra ids such as [MASK] or BOS) -> ``n_out`` logits."""

    def __init__(
        self,
        cfg: ModelConfig,
        n_in: int,
        n_out: int,
        time_conditioning: bool = False,
        causal: bool = False,
        embed_std: float = 0.02,
    ):
        super().__init__()
        self.cfg, self.n_in, self.n_out = cfg, n_in, n_out
        self.time_conditioning, self.causal = time_conditioning, causal
        self.factored = cfg.factored_embedding
        if self.factored:  # as RePlaid's E and W_z: unit rows scaled by sqrt(d_e), W_up ~ N(0, 1/d_e)
            self.embed = nn.Embedding(n_in, cfg.d_e)
            nn.init.normal_(self.embed.weight)
            self.embed_up = nn.Linear(cfg.d_e, cfg.hidden, bias=False)
            nn.init.normal_(self.embed_up.weight, std=cfg.d_e**-0.5)
        else:
            self.embed = nn.Embedding(n_in, cfg.hidden)
            nn.init.normal_(self.embed.weight, std=embed_std)
        cond_dim = cfg.cond_dim
        dit = cfg.time_embedding == "dit"  # MDLM/Duo's features (converted checkpoints)
        n_feat = N_DIT_FEATURES if dit else N_TIME_FEATURES
        self.time_features = DiTTimestepFeatures(n_feat) if dit else TimeEmbedding(n_feat)
        self.cond = nn.Sequential(
            nn.Linear(n_feat, cfg.cond_dim), nn.SiLU(), nn.Linear(cfg.cond_dim, cfg.cond_dim), nn.SiLU()
        )
        self.backbone = Backbone(
            cfg.hidden,
            cfg.n_layers,
            cfg.n_heads,
            cond_dim,
            cfg.mlp_ratio,
            cfg.dropout,
            causal=causal,
            activation_checkpointing=cfg.activation_checkpointing,
        )
        self.final = FinalLayer(cfg.hidden, n_out, cond_dim)

    # ------------------------------------------------------------------ full forward
    def input_states(self, x: Tensor) -> Tensor:
        """x: (B, L) ids, or (B, L, K) float weights over the first K embedding rows."""
        if x.dtype in (torch.long, torch.int32, torch.int64):
            e = wide(self.embed(x))  # (B, L, hidden) or (B, L, d_e); float64 kept (a reference)
        else:
            e = x.float() @ self.rows(x.shape[-1])
        if not self.factored:
            return e
        if x.dtype in (torch.long, torch.int32, torch.int64):
            e = self._normalize(e)
        out_: Tensor = self.embed_up(e * self.cfg.d_e**0.5)  # (B, L, hidden)
        return out_

    def _normalize(self, w: Tensor) -> Tensor:
        return w / (w.norm(dim=-1, keepdim=True) + 1e-8) if self.cfg.normalize_embeddings else w

    def rows(self, k: int | None = None) -> Tensor:
        """The first ``k`` embedding rows as used by the model (unit length when factored), float32."""
        w = self.embed.weight[:k].float()
        return self._normalize(w) if self.factored else w

    def conditioning(self, t: Tensor | None, B: int, device: torch.device) -> Tensor:
        """(B, cond_dim): ``MLP(feat(t))``, or the constant ``MLP(feat(0))`` without time conditioning."""
        if not self.time_conditioning:
            t = torch.zeros(B, device=device)
        elif t is None:
            raise ValueError("this model is time-conditioned: pass the noise level t (B,)")
        t = t.reshape(-1).expand(B) if t.numel() == 1 else t.reshape(B)
        f = self.time_features(t)  # (B, n) float32
        out_: Tensor = self.cond(f.to(self.cond[0].weight.dtype))  # float64 in a float64 reference model
        return out_

    def head(self, feats: Tensor) -> Tensor:
        """The logit head, bf16 under autocast (the paper's precision table, as RePlaid's), float32 out."""
        with region(HEAD):
            return wide(self.final.linear(feats))

    def token_nll(self, feats: Tensor, target: Tensor) -> Tensor:
        """``-log softmax(head(feats))[target]`` (B, L) float32 (float64 in a float64 reference) through the
        fused chunked cross-entropy (:func:`~replaid.model.head.linear_cross_entropy`: no full float32
        logits); feats (B, L, hidden) from :meth:`features` or :meth:`block_features`, target (B, L)."""
        B, L, H = feats.shape
        lin = self.final.linear
        mm = torch.get_autocast_dtype(feats.device.type) if torch.is_autocast_enabled(feats.device.type) else None
        args = (feats.reshape(B * L, H), lin.weight, lin.bias, target.reshape(B * L))
        if torch.compiler.is_compiling():  # the compiler fuses the plain expression itself
            return plain_cross_entropy(*args, mm_dtype=mm).view(B, L)
        return linear_cross_entropy(*args, chunk_rows(self.n_out, self.cfg.head_chunk_rows), mm).view(B, L)

    def features(self, x: Tensor, t: Tensor | None = None) -> Tensor:
        """The head's input (B, L, hidden) of ids x (B, L) (or soft weights (B, L, K)) at noise level t."""
        h = self.input_states(x)  # (B, L, D)
        c = self.conditioning(t, h.shape[0], h.device)  # (B, cond_dim)
        h = self.backbone(h, c)
        out_: Tensor = self.final.features(h, c)
        return out_

    def forward(self, x: Tensor, t: Tensor | None = None) -> Tensor:
        """Returns float32 logits (B, L, n_out)."""
        return self.head(self.features(x, t))

    def block_features(self, z: Tensor, x0: Tensor, block: int) -> Tensor:
        """Block diffusion (BD3-LM): the noisy ``z`` and clean ``x0`` ids (B, L) run side by side as one
        (B, 2L) input under :func:`~replaid.model.blocks.block_diffusion_mask`; returns the noisy half's
        head input (B, L, hidden): block k's given the clean blocks before it and its own noisy block.
        Unconditioned on time (BD3-LM's default), so one condition serves every block."""
        if self.time_conditioning:
            raise ValueError("block diffusion runs without time conditioning (BD3-LM's default)")
        B, L = z.shape
        h = torch.cat([self.input_states(z), self.input_states(x0)], dim=1)  # (B, 2L, D)
        c = self.conditioning(None, B, h.device)  # (B, cond_dim)
        h = self.backbone(h, c, positions=pair_positions(L, h.device), mask=block_diffusion_mask(L, block, h.device))
        out_: Tensor = self.final.features(h[:, :L], c)
        return out_

    def forward_blocks(self, z: Tensor, x0: Tensor, block: int) -> Tensor:
        """:meth:`block_features`' float32 logits (B, L, n_out)."""
        return self.head(self.block_features(z, x0, block))

    # ------------------------------------------------------------------ KV cache (causal, unconditioned)
    @torch.no_grad()
    def forward_cached(self, ids: Tensor, cache: KVCache, start: int) -> Tensor:
        """Run ``ids`` (B, T) at absolute positions ``start .. start+T-1`` given the keys/values of
        the earlier positions in ``cache`` (:class:`~replaid.model.dit.KVCache`, filled in place; pass
        a new one at the start). Returns float32 logits (B, T, n_out). Exact for causal, unconditioned
        models (eval mode): equal to the matching rows of :meth:`forward` on the whole prefix."""
        if not self.causal or self.time_conditioning:
            raise ValueError("forward_cached needs a causal model without time conditioning")
        if start != cache.next_pos:
            raise ValueError(f"the cache holds positions up to {cache.next_pos}, not {start}")
        x = self.input_states(ids)
        c = self.conditioning(None, ids.shape[0], x.device)  # the constant condition
        x = self.backbone(x, c, cache=cache, commit=True)
        return self.head(self.final.features(x, c))

    # ------------------------------------------------------------------ optimiser groups
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """One group: MDLM/Duo/AR train every weight (embedding included) at the backbone LR; with
        ``model.factored_embedding`` the d_e-dim rows form the ``embedding`` group (optim.lr/wd_embedding)."""
        if not self.factored:
            return {"backbone": [p for p in self.parameters() if p.requires_grad]}
        return {
            "embedding": [cast(nn.Parameter, self.embed.weight)],
            "backbone": [p for p in self.parameters() if p.requires_grad and p is not self.embed.weight],
        }

    def non_embedding_params(self) -> int:
        """All parameters but the input token embedding (the IsoFLOP table's N: the output head counts)."""
        return sum(p.numel() for p in self.parameters()) - self.embed.weight.numel()
