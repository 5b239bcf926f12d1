"""A grid spec planned and run on a lent device within a deadline, resumed by the next call (issues 48 §2, 53 §3).

``plan_and_run`` plans the spec into ``out`` when it holds no plan yet, then runs the grid until it ends or the
deadline passes; at the deadline every run is stopped with SIGTERM, saves at its last checkpoint, and the next
call with the same ``out`` goes on from there. ``keep_logs`` copies a grid's plan and each run's logs (no
checkpoints) to a folder that comes back from the device; ``scripts/plateau_batch.py`` and ``replaid grid
report`` read that copy as they read the grid.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replaid.eval.seeds import plateau_exit
from replaid.scaling.grid import training_rows

# --tiny: the debug size on the embedded corpus, a few steps (to try a device step on a CPU)
TINY = [
    "data.source=stdlib",
    "data.bpe_vocab_size=300",
    "data.seq_len=32",
    "train.steps=6",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=3",
    "train.save_every=3",
    "eval.max_batches=1",
    "eval.t_samples=1",
    "model.hidden=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.cond_dim=16",
]
LOGS = ("metrics.jsonl", "config.json", "final_eval.json")


def plan_and_run(
    spec: Path, out: Path, *, device: str, data: str | None, max_parallel: int, deadline: float, tiny: bool
) -> bool:
    """Plan ``spec`` into ``out`` (when new) and run it; True when the grid ended before ``deadline`` seconds
    (0: no deadline)."""
    py = [sys.executable, "-m", "replaid"]
    t0 = time.time()
    if not (out / "manifest.json").is_file():
        extra = [f"train.device={device}"] + ([f"data.source={data}"] if data else []) + (TINY if tiny else [])
        base = ["--base", "debug"] if tiny else []
        subprocess.run(
            [*py, "grid", "plan", str(spec), *extra, *base, "--out", str(out)], check=True, stdout=sys.stderr
        )
    cmd = [*py, "grid", "run", str(out), "--max-parallel", str(max_parallel), "--no-progress"]
    cmd += ["--python", "inprocess"] if tiny else []  # seconds per run: no interpreter start each
    proc = subprocess.Popen(cmd, stdout=sys.stderr, start_new_session=True)  # its own group: the runs with it
    try:
        proc.wait(timeout=deadline - (time.time() - t0) if deadline else None)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # each run saves at its last checkpoint; the next call resumes
        proc.wait(timeout=120)
        print(f"deadline reached after {time.time() - t0:.0f} s: call again to resume", file=sys.stderr)
        return False


def keep_logs(grid: Path, dest: Path) -> Path:
    """Copy the grid's plan (spec, manifest, configs) and each run's logs, not its checkpoints, into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("spec.json", "manifest.json"):
        if (grid / name).is_file():
            shutil.copy2(grid / name, dest / name)
    if (grid / "configs").is_dir():
        shutil.copytree(grid / "configs", dest / "configs", dirs_exist_ok=True)
    for run in sorted((grid / "runs").glob("*")) if (grid / "runs").is_dir() else []:
        for name in LOGS:
            if (run / name).is_file():
                (dest / "runs" / run.name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / name, dest / "runs" / run.name / name)
    return dest


def exit_step(run: Path) -> int | None:
    """The plateau exit read from the training rows against the unigram NLL each row logs of its own tokens
    (:func:`replaid.eval.seeds.plateau_exit`); None without such rows or before the exit."""
    rows = training_rows(run)
    steps = sorted(rows)
    if not steps or any(rows[s][1] is None for s in steps):
        return None
    return plateau_exit(steps, [rows[s][0] for s in steps], [float(rows[s][1] or 0.0) for s in steps])


def parser(doc: str, max_parallel: int) -> argparse.ArgumentParser:
    """The options every device grid script takes; a script adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the grid folder (planned here when new; resumed when not)")
    ap.add_argument("--keep", type=Path, default=None, help="copy the plan and the runs' logs here (no checkpoints)")
    ap.add_argument("--data", default=None, help="the linux-docs folder on this machine (data.source)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-parallel", type=int, default=max_parallel, help="runs at once (default: the whole grid)")
    ap.add_argument("--deadline", type=float, default=0, help="stop running after this many seconds (0: none)")
    ap.add_argument("--tiny", action="store_true", help="the debug size, a few steps (to try it on a CPU)")
    ap.add_argument("--summarise", type=Path, default=None, help="only summarise this grid folder (or kept logs)")
    return ap


def run(a: argparse.Namespace, spec: Path, summarise: Callable[[Path], dict[str, Any]]) -> int:
    """Summarise ``--summarise``, or plan and run ``spec`` into ``--out``, keep its logs, summarise: one JSON line."""
    if a.summarise is not None:
        print(json.dumps(summarise(a.summarise)))
        return 0
    if a.out is None:
        print("replaid: error: --out is required unless --summarise is given; name the grid folder", file=sys.stderr)
        return 2
    t0 = time.time()
    plan_and_run(
        spec, a.out, device=a.device, data=a.data, max_parallel=a.max_parallel, deadline=a.deadline, tiny=a.tiny
    )
    s = summarise(a.out)
    if a.keep is not None:
        s["kept"] = str(keep_logs(a.out, a.keep))
    s["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(s))
    return 0
