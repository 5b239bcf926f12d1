"""Metrics to JSONL and TensorBoard, and a tqdm progress bar."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm


class MetricsLogger:
    """Appends ``{"step": ..., **metrics}`` lines to RUN/metrics.jsonl and scalars to RUN/tb/."""

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.file = None
        self.tb = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(run_dir / "metrics.jsonl", "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # tensorboard not installed: JSONL only
                self.tb = None

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(),
               **{k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)

    def progress(self, total: int, initial: int = 0, disable: bool = False):
        return tqdm(total=total, initial=initial, disable=disable or not self.enabled, desc="train",
                    dynamic_ncols=True, file=sys.stderr, mininterval=1.0)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
