"""Metrics to JSONL and TensorBoard, and a tqdm progress bar."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from replaid import dist
from replaid.fileio import atomic_write_text


def truncate_metrics(path: Path, step: int, keep: Callable[[dict], bool] = lambda row: True) -> None:
    """Rewrite ``path`` (atomically) without rows after ``step``, rows ``keep`` rejects, and a torn
    last line a kill may have left."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step and keep(row):
            kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))


class MetricsLogger:
    """Appends ``{"step": ..., **metrics}`` lines to RUN/metrics.jsonl and scalars to RUN/tb/."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_step: Optional[int] = None,
        keep: Callable[[dict], bool] = lambda row: True,
    ):
        """``resume_step``: a resumed run first drops the rows after that step (and those ``keep``
        rejects), so redone steps are not logged twice; TensorBoard purges them likewise."""
        self.enabled = enabled
        self.file = None
        self.tb = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            truncate_metrics(run_dir / "metrics.jsonl", resume_step, keep)
        self.file = open(run_dir / "metrics.jsonl", "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = None if resume_step is None else resume_step + 1
                self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge)
            except ImportError:  # tensorboard not installed: JSONL only
                self.tb = None

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {
            "step": step,
            "time": time.time(),
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float, str))},
        }
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)

    def write(self, message: str) -> None:
        """A line on stderr that does not break the progress bar (main rank only)."""
        if self.enabled:
            tqdm.write(message, file=sys.stderr)

    def progress(self, total: int, initial: int = 0, disable: bool = False):
        return tqdm(
            total=total,
            initial=initial,
            disable=disable or not self.enabled,
            desc="train",
            dynamic_ncols=True,
            file=sys.stderr,
            mininterval=1.0,
        )

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


class DeviceMeans:
    """Running sums of metric means kept on the device between logging steps.

    ``add`` costs no host sync; ``reduce`` averages every tensor metric over the steps added and
    over ranks with one all-reduce of a few scalars, then copies them to the host once. Non-tensor
    metrics (ints, floats) keep their last value."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.host: dict[str, object] = {}
        self.n = 0

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            if torch.is_tensor(v):
                v = v.detach().double().mean()
                self.sums[k] = self.sums[k] + v if k in self.sums else v
            else:
                self.host[k] = v
        self.n += 1

    def reduce(self) -> dict:
        out, keys = dict(self.host), sorted(self.sums)
        if keys:
            vec = dist.all_reduce_sum(torch.stack([self.sums[k] for k in keys])) / (max(self.n, 1) * dist.world_size())
            out.update(zip(keys, vec.tolist()))
        self.sums, self.host, self.n = {}, {}, 0
        return out
