"""Metrics to JSONL, TensorBoard and/or Weights & Biases, and a tqdm progress bar.

``train.logger`` picks the trackers beside RUN/metrics.jsonl (always written): ``tensorboard`` (the
default, RUN/tb/), ``wandb`` (RUN/wandb/: the ``wandb`` extra, imported only then), both
(``tensorboard+wandb``) or ``none``. Both trackers get the same scalars at the same steps (the numeric
fields of each metrics.jsonl row; no other plots are logged); W&B also gets the run folder's config
(``config.json``) as the run's config. ``WANDB_MODE=offline`` keeps a W&B run on disk under
RUN/wandb/ (``wandb sync`` uploads it later); a resumed run continues the same W&B run (its id is kept
in RUN/wandb/run-id)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from replaid import dist
from replaid.config import ConfigError
from replaid.fileio import atomic_write_text
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    import wandb


def truncate_metrics(path: Path, step: int, keep: Callable[[dict[str, Any]], bool] = lambda row: True) -> None:
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
        resume_step: int | None = None,
        keep: Callable[[dict[str, Any]], bool] = lambda row: True,
        wandb: dict[str, Any] | None = None,
    ):
        """``resume_step``: a resumed run first drops the rows after that step (and those ``keep``
        rejects), so redone steps are not logged twice; TensorBoard purges them likewise (W&B keeps the
        steps it had: it ignores a step lower than its last). ``wandb``: log to a W&B run too, with
        these :func:`start_wandb` arguments (``project``, ``config``)."""
        self.enabled = enabled
        self.file = None
        self.tb = None
        self.wb = None
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
        if wandb is not None:
            self.wb = start_wandb(run_dir, resume=resume_step is not None, **wandb)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {
            "step": step,
            "time": time.time(),
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float, str))},
        }
        assert self.file is not None  # opened in __init__ when enabled
        self.file.write(strict_dumps(row) + "\n")
        self.file.flush()
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wb is not None:
            self.wb.log(scalars, step=step)

    def write(self, message: str) -> None:
        """A line on stderr that does not break the progress bar (main rank only)."""
        if self.enabled:
            tqdm.write(message, file=sys.stderr)

    def progress(self, total: int, initial: int = 0, disable: bool = False) -> tqdm:
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
        if self.wb is not None:
            self.wb.finish()
            self.wb = None


def trackers(logger: str) -> tuple[str, ...]:
    """The trackers ``train.logger`` names (``tensorboard``, ``wandb``, ``tensorboard+wandb``, ``none``)."""
    return () if logger == "none" else tuple(logger.split("+"))


def require_wandb() -> None:
    """Import ``wandb`` now, or fail in one line naming the extra (called before a run folder is touched)."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(
            "train.logger=wandb needs the wandb package: pip install 'replaid[wandb]' "
            "(or train.logger=tensorboard, the default)"
        ) from None


def start_wandb(run_dir: Path, project: str, config: dict[str, Any], resume: bool = False) -> wandb.Run:
    """A W&B run named after ``run_dir``, its files under RUN/wandb/, ``config`` as its config. A resumed
    training continues the W&B run whose id RUN/wandb/run-id keeps; a new one starts a new W&B run.
    ``WANDB_MODE=offline`` (or ``wandb offline``) writes it to disk only."""
    import wandb

    folder = run_dir / "wandb"
    folder.mkdir(parents=True, exist_ok=True)
    id_file = folder / "run-id"
    run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
    if not run_id:
        run_id = uuid.uuid4().hex[:12]  # W&B ids: lower-case letters and digits
        atomic_write_text(id_file, run_id + "\n")
    return wandb.init(
        project=project,
        dir=str(run_dir),
        name=run_dir.resolve().name,
        id=run_id,
        resume="allow",
        config=config,
        settings=wandb.Settings(console="off"),  # the progress bar stays on the terminal, not in the run
    )


class DeviceMeans:
    """Running sums of metric means kept on the device between logging steps.

    ``add`` costs no host sync; ``reduce`` averages every tensor metric over the steps added and
    over ranks with one all-reduce of a few scalars, then copies them to the host once. Non-tensor
    metrics (ints, floats) keep their last value."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.host: dict[str, object] = {}
        self.n = 0

    def add(self, metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            if torch.is_tensor(v):
                v = v.detach().double().mean()
                self.sums[k] = self.sums[k] + v if k in self.sums else v
            else:
                self.host[k] = v
        self.n += 1

    def reduce(self) -> dict[str, Any]:
        out, keys = dict(self.host), sorted(self.sums)
        if keys:
            vec = dist.all_reduce_sum(torch.stack([self.sums[k] for k in keys])) / (max(self.n, 1) * dist.world_size())
            out.update(zip(keys, vec.tolist(), strict=True))
        self.sums, self.host, self.n = {}, {}, 0
        return out
