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

import math
from pathlib import Path
from typing import Any

import device_grid
from device_grid import exit_step

from replaid.eval.seeds import paired_difference, t_interval
from replaid.scaling.grid import metrics_rows

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "results" / "trend" / "bf16.yaml"


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


def build_parser():
    ap = device_grid.parser(__doc__ or "", max_parallel=6)
    ap.add_argument("--reference-grid", type=Path, default=None, help="--summarise: the fp32 runs' grid folder")
    ap.add_argument("--reference-cell", default="fp32", help="--summarise: the fp32 runs' cell name")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return device_grid.run(a, SPEC, lambda g: summarise(g, a.reference_cell, reference_grid=a.reference_grid))


if __name__ == "__main__":
    raise SystemExit(main())
