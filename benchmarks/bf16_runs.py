"""RePlaid in bf16 autocast against fp32 over a whole training run (issue 53 §3): plan, run, summarise.

The grid is docs/results/trend/bf16.yaml (3 seeds per precision, 4,000 steps at the trend grid's demo
configuration, where one seed diverged under bf16 on an H200). The run is resumable: a second call with the
same --out goes on from each run's checkpoint, so the grid fits in several 10-minute device calls.

The summary (last JSON line) says, per run, how far it got, its largest gradient norm (all groups and the
schedule's endpoints, before clipping), the first step with a non-finite loss or gradient and its evaluated
bound at every evaluation; and, at the last evaluation every run reached, whether each bf16 run's bound lies
inside the fp32 runs' 95% seed interval and the seed-paired bf16 - fp32 difference with its t-interval.

    python benchmarks/bf16_runs.py --data .gl/linux-docs --out /tmp/bf16-runs --device cuda --deadline 540
    python benchmarks/bf16_runs.py --summarise docs/results/trend/bf16          # committed logs only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from replaid.eval.seeds import paired_difference, plateau_exit, t_interval
from replaid.scaling.grid import metrics_rows, training_rows

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "results" / "trend" / "bf16.yaml"
# --tiny: the debug size on the embedded corpus, a few steps (to try the step on a CPU)
TINY = [
    "base=debug",
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


def exit_step(run: Path) -> int | None:
    """The plateau exit read from the training rows against the unigram NLL each row logs of its own tokens
    (:func:`replaid.eval.seeds.plateau_exit`); None without such rows or before the exit."""
    rows = training_rows(run)
    steps = sorted(rows)
    if not steps or any(rows[s][1] is None for s in steps):
        return None
    return plateau_exit(steps, [rows[s][0] for s in steps], [float(rows[s][1] or 0.0) for s in steps])


def run_summary(run: Path) -> dict[str, Any]:
    """One run's course: last step, largest gradient norms (the endpoints' with its step), first non-finite
    step, the plateau exit (the training rows 0.3 nats below their tokens' unigram NLL), bounds by eval step."""
    last, g_max, g_end, g_end_at, first_bad = 0, 0.0, 0.0, None, None
    bounds: dict[int, float] = {}
    for r in metrics_rows(run):
        step = int(r["step"])
        last = max(last, step)
        if "eval/nelbo_nats_per_token" in r:
            bounds[step] = float(r["eval/nelbo_nats_per_token"])
        g = r.get("grad_norm")
        if isinstance(g, (int, float)):
            if not math.isfinite(g) or r.get("skipped"):
                first_bad = step if first_bad is None else first_bad
            else:
                g_max = max(g_max, float(g))
        ge = r.get("grad_norm/endpoints")
        if isinstance(ge, (int, float)) and math.isfinite(ge) and ge > g_end:
            g_end, g_end_at = float(ge), step
    done = (run / "final_eval.json").is_file()
    return {
        "last_step": last,
        "finished": done,
        "max_grad_norm": g_max,
        "max_grad_norm_endpoints": g_end,
        "max_grad_norm_endpoints_step": g_end_at,
        "plateau_exit_step": exit_step(run),
        "first_nonfinite_step": first_bad,
        "bounds": {str(s): bounds[s] for s in sorted(bounds)},
    }


def summarise(
    grid: Path, reference: str = "fp32", cell: str = "bf16", reference_grid: Path | None = None
) -> dict[str, Any]:
    """The grid's runs (``runs/<cell>__s<seed>``) and the bf16-against-fp32 comparison (module docstring).
    ``reference_grid``: read the ``reference`` cell's runs from this grid instead (fp32 runs made elsewhere)."""
    runs: dict[str, dict[str, Any]] = {}
    for g, keep in ((grid, None), (reference_grid, reference)):
        for d in sorted((g / "runs").glob("*__s*")) if g is not None else []:
            if (d / "metrics.jsonl").is_file() and (keep is None or d.name.rsplit("__s", 1)[0] == keep):
                runs[d.name] = run_summary(d)

    def by_seed(name: str) -> dict[int, dict[str, Any]]:
        return {int(k.rsplit("__s", 1)[1]): v for k, v in runs.items() if k.rsplit("__s", 1)[0] == name}

    ref, got = by_seed(reference), by_seed(cell)
    steps = [set(map(int, r["bounds"])) for r in [*ref.values(), *got.values()]]
    common = sorted(set.intersection(*steps)) if steps else []
    out: dict[str, Any] = {
        "grid": str(grid),
        "runs": runs,
        "diverged": [k for k, v in runs.items() if v["first_nonfinite_step"] is not None],
    }
    if not common:
        out.update(ok=False, error="no evaluation step that every run reached")
        return out
    at = common[-1]
    rv = {s: r["bounds"][str(at)] for s, r in ref.items()}
    cv = {s: r["bounds"][str(at)] for s, r in got.items()}
    band = t_interval(list(rv.values()))
    inside = {str(s): bool(band.lo <= v <= band.hi) for s, v in cv.items()}
    pair = paired_difference(cell, cv, reference, rv)
    out.update(
        step=at,
        reference_interval=band.as_dict(),
        cell_interval=t_interval(list(cv.values())).as_dict(),
        inside_reference_interval=inside,
        paired=pair.as_dict(),
        ok=not out["diverged"] and all(inside.values()),
    )
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the grid folder (planned here when new; resumed when not)")
    ap.add_argument("--data", default=None, help="the linux-docs folder on this machine (data.source)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-parallel", type=int, default=6, help="runs at once (6: the whole grid on one GPU)")
    ap.add_argument("--deadline", type=float, default=0, help="stop running after this many seconds (0: none)")
    ap.add_argument("--tiny", action="store_true", help="the debug size, a few steps (to try it on a CPU)")
    ap.add_argument("--summarise", type=Path, default=None, help="only summarise this grid folder")
    ap.add_argument("--reference-grid", type=Path, default=None, help="--summarise: the fp32 runs' grid folder")
    ap.add_argument("--reference-cell", default="fp32", help="--summarise: the fp32 runs' cell name")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.summarise is not None:
        print(json.dumps(summarise(a.summarise, a.reference_cell, reference_grid=a.reference_grid)))
        return 0
    if a.out is None:
        print("replaid: error: --out is required unless --summarise is given; name the grid folder", file=sys.stderr)
        return 2
    py = [sys.executable, "-m", "replaid"]
    t0 = time.time()
    if not (a.out / "manifest.json").is_file():
        extra = [f"train.device={a.device}"] + ([f"data.source={a.data}"] if a.data else [])
        tiny = [o for o in TINY if not o.startswith("base=")] if a.tiny else []
        base = ["--base", "debug"] if a.tiny else []
        subprocess.run(
            [*py, "grid", "plan", str(SPEC), *extra, *tiny, *base, "--out", str(a.out)], check=True, stdout=sys.stderr
        )
    cmd = [*py, "grid", "run", str(a.out), "--max-parallel", str(a.max_parallel), "--no-progress"]
    cmd += ["--python", "inprocess"] if a.tiny else []  # seconds per run: no interpreter start each
    timeout = a.deadline - (time.time() - t0) if a.deadline else None
    proc = subprocess.Popen(cmd, stdout=sys.stderr, start_new_session=True)  # its own group: the runs with it
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # each run saves at its last checkpoint; the next call resumes
        proc.wait(timeout=120)
        print(f"deadline reached after {time.time() - t0:.0f} s: call again to resume", file=sys.stderr)
    s = summarise(a.out)
    s["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
