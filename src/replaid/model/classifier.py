"""A small classifier of noisy latents ``p(label | z_t, gamma)`` for classifier guidance
(:mod:`replaid.sampling.guidance`): per-position features of ``z_t`` and ``gamma``, two local
convolutions, mean and max pooling over positions, a linear read-out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class LatentClassifierConfig:
    d_e: int  # latent width (the run's embedding width)
    n_labels: int
    hidden: int = 128
    kernel: int = 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LatentClassifier(nn.Module):
    """``logits = f(z_t, gamma)``: z (B, L, d_e), gamma (B,) -> (B, n_labels)."""

    def __init__(self, cfg: LatentClassifierConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.inp = nn.Linear(cfg.d_e, h)
        self.time = nn.Sequential(nn.Linear(2, h), nn.GELU(), nn.Linear(h, h))
        self.conv1 = nn.Conv1d(h, h, cfg.kernel, padding=cfg.kernel // 2)
        self.conv2 = nn.Conv1d(h, h, cfg.kernel, padding=cfg.kernel // 2)
        self.out = nn.Linear(2 * h, cfg.n_labels)

    def forward(self, z: Tensor, gamma: Tensor) -> Tensor:
        g = gamma.float().view(-1, 1)  # (B, 1)
        a2 = torch.sigmoid(-g)  # alpha^2
        feats = torch.cat([g / 10.0, a2], dim=-1)  # (B, 2)
        # undo the signal scale so the input is e-like at every level: z / (alpha + 0.03)
        x = self.inp(z.float() / (a2.sqrt() + 0.03).view(-1, 1, 1)) + self.time(feats)[:, None]  # (B, L, h)
        x = torch.nn.functional.gelu(x).transpose(1, 2)  # (B, h, L)
        x = x + torch.nn.functional.gelu(self.conv1(x))
        x = x + torch.nn.functional.gelu(self.conv2(x))
        pooled = torch.cat([x.mean(-1), x.amax(-1)], dim=-1)  # (B, 2h)
        out_: Tensor = self.out(pooled)  # (B, n_labels)
        return out_
