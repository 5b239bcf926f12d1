"""The plateau's batch arm at batch 512 on a lent GPU (issue 48 §2): plan, run, summarise, keep the logs.

The grid is docs/results/plateau/arms-b512.yaml (MDLM, the default RePlaid and the recipe,
``model.embeddings=cooc``, 3 seeds, 600 steps at batch 512). The run is resumable: a second call with the same
--out goes on from each run's checkpoint. ``--keep DIR`` copies the plan and each run's logs there (the folder
that comes back from the device); ``scripts/plateau_batch.py`` reads it as a grid beside the batch-32 and
batch-128 grids. The summary (last JSON line) gives, per run, its last step, whether it finished, its plateau
exit in steps and in tokens (None: still on the plateau) and its final test bound; per cell, the exits by seed.

    python benchmarks/plateau_b512.py --data .gl/linux-docs --out /tmp/b512 --keep $OUT/plateau_b512 --device cuda
    python benchmarks/plateau_b512.py --summarise docs/results/plateau/b512       # the kept logs only
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import device_grid
from device_grid import exit_step

from replaid.config import read_run_config
from replaid.scaling.grid import metrics_rows

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "results" / "plateau" / "arms-b512.yaml"


def summarise(grid: Path) -> dict[str, Any]:
    """Each run of ``grid/runs/<cell>__s<seed>`` and each cell's exits by seed (module docstring)."""
    runs: dict[str, dict[str, Any]] = {}
    for d in sorted((grid / "runs").glob("*__s*")) if (grid / "runs").is_dir() else []:
        if not (d / "metrics.jsonl").is_file():
            continue
        cfg = read_run_config(d / "config.json")
        tokens = cfg.train.batch_size * cfg.data.seq_len
        ex = exit_step(d)
        last = max((int(r["step"]) for r in metrics_rows(d)), default=0)
        final = json.loads((d / "final_eval.json").read_text()) if (d / "final_eval.json").is_file() else {}
        runs[d.name] = {
            "batch": cfg.train.batch_size,
            "last_step": last,
            "finished": bool(final),
            "exit_step": ex,
            "exit_tokens": None if ex is None else ex * tokens,
            "bound": (final.get("eval") or {}).get("nelbo_nats_per_token"),
        }
    cells: dict[str, dict[str, int | None]] = {}
    for name, r in runs.items():
        cell, seed = name.rsplit("__s", 1)
        cells.setdefault(cell, {})[seed] = r["exit_step"]
    return {"grid": str(grid), "runs": runs, "cells": cells, "finished": all(r["finished"] for r in runs.values())}


def build_parser():
    return device_grid.parser(__doc__ or "", max_parallel=9)


def main(argv: list[str] | None = None) -> int:
    return device_grid.run(build_parser().parse_args(argv), SPEC, summarise)


if __name__ == "__main__":
    raise SystemExit(main())
