"""The settings of one distillation (``replaid distill``'s options), in a module that imports no torch.

:mod:`replaid.distill.loop` runs them; the CLI builds its parser from these defaults and
:data:`METHODS` without importing the loop (or torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from replaid.config import ConfigError

METHODS = ("progressive", "consistency")


@dataclass
class DistillConfig:
    """Settings of one distillation (written to ``STUDENT/distill.json``)."""

    method: str = "progressive"
    from_steps: int = 64  # progressive: the teacher's DDIM steps in round 1 (a power of two)
    to_steps: int = 8  # progressive: the student's steps after the last round
    steps_per_round: int = 200  # progressive: optimiser steps per halving
    teacher_solver: str = "ddim"  # progressive: the first round's teacher steps (ddim: 2 calls, heun: 4)
    cd_steps: int = 400  # consistency: optimiser steps
    cd_levels: int = 32  # consistency: levels N of the uniform time grid the loss pairs
    cd_solver: str = "heun"  # consistency: the teacher's ODE step (heun: 2 calls, ddim: 1)
    cd_ema: float = 0.95  # consistency: EMA decay of the target network
    lr: float = 1e-4
    batch_size: int = 0  # 0: the teacher's train.batch_size
    seed: int = 0
    save_every: int = 100
    num_threads: int = 1
    device: str = "auto"

    def validate(self) -> DistillConfig:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"distill: {what}")

        need(self.method in METHODS, f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        for k in ("from_steps", "to_steps", "steps_per_round", "cd_steps", "cd_levels"):
            need(getattr(self, k) >= 1, f"--{k.replace('_', '-')} must be >= 1, got {getattr(self, k)}")
        po2: Callable[[int], bool] = lambda n: n & (n - 1) == 0
        need(po2(self.from_steps) and po2(self.to_steps), "--from-steps and --to-steps must be powers of two")
        need(self.to_steps < self.from_steps, "--to-steps must be below --from-steps (each round halves them)")
        need(self.cd_solver in ("heun", "ddim"), f"--cd-solver must be heun or ddim, got {self.cd_solver!r}")
        need(
            self.teacher_solver in ("heun", "ddim"),
            f"--teacher-solver must be heun or ddim, got {self.teacher_solver!r}",
        )
        need(0.0 <= self.cd_ema < 1.0, f"--cd-ema must be in [0, 1), got {self.cd_ema}")
        need(self.lr > 0 and math.isfinite(self.lr), f"--lr must be a positive number, got {self.lr}")
        need(self.batch_size == 0 or self.batch_size >= 2, f"--batch-size must be >= 2, got {self.batch_size}")
        need(self.save_every >= 1, f"--save-every must be >= 1, got {self.save_every}")
        return self

    @property
    def rounds(self) -> int:
        return int(math.log2(self.from_steps // self.to_steps))

    @property
    def total_steps(self) -> int:
        return self.rounds * self.steps_per_round if self.method == "progressive" else self.cd_steps

    def student_steps(self, rnd: int) -> int:
        """Progressive: the student's DDIM steps in round ``rnd`` (0-based)."""
        steps: int = self.from_steps // 2 ** (rnd + 1)
        return steps
