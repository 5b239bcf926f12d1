"""Issue 39 §4, likelihood against block size: what ``replaid grid trend`` (equal steps) leaves out.

For each joined grid (``scripts/join_grids.py``; one per method, cells ``<method>-b<B>``):

* every run's plateau exit from its logged training rows (:func:`replaid.scaling.grid.plateau_exit_of`)
  and the last step it logged;
* the test bound at matched training compute: each block cell's evaluations against the reference
  cell's curve interpolated in log FLOPs, paired by seed (:func:`replaid.scaling.overtrain.compare`).
  A block run reads ``[x_t, x_0]`` and costs about twice the FLOPs of a step at B = seq_len
  (:func:`replaid.training.flops.train_flops_per_token`), so equal steps are not equal compute;
* one PNG: the test bound against training FLOPs, one panel per method, seeds thin, means thick.

    python scripts/blocks_bsize.py docs/results/blocks/bsize/replaid docs/results/blocks/bsize/mdlm \\
        --out docs/results/blocks/bsize
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from replaid.eval.seeds import PLATEAU_NATS, t_interval
from replaid.scaling.grid import metrics_rows, plateau_exit_of, read_grid
from replaid.scaling.overtrain import compare

EVAL_KEY = "eval/nelbo_nats_per_token"


def eval_curve(run: Path) -> list[tuple[int, float]]:
    """(step, test bound) of each logged evaluation, in step order (a re-logged step keeps the last)."""
    out = {int(r["step"]): float(r[EVAL_KEY]) for r in metrics_rows(run) if isinstance(r.get(EVAL_KEY), float)}
    return sorted(out.items())


def study(folder: Path) -> dict:
    spec, entries = read_grid(folder)
    rows, runs = [], []
    for e in entries:
        per_step = e.flops / e.steps
        curve = eval_curve(folder / e.run_dir)
        exit_step, last, against = plateau_exit_of(folder / e.run_dir)
        runs.append(
            {
                "id": e.id,
                "cell": e.cell,
                "seed": e.seed,
                "flops_per_step": per_step,
                "plateau_exit": exit_step,
                "last_logged_step": last,
                "plateau_read_against": against,
                "evals": [{"step": s, "flops": s * per_step, "bound": b} for s, b in curve],
            }
        )
        rows += [{"method": e.cell, "seed": e.seed, "flops": s * per_step, "loss": b} for s, b in curve]
    ref = spec.reference
    names = list(spec.cells)
    matched = {f"{a} - {b}": compare(rows, a, b) for i, a in enumerate(names) for b in names[i + 1 :]}
    cells = {}
    for c in spec.cells:
        mine = [r for r in runs if r["cell"] == c]
        exits = [r["plateau_exit"] for r in mine]
        cells[c] = {
            "flops_per_step": mine[0]["flops_per_step"],
            "flops_ratio_to_reference": mine[0]["flops_per_step"]
            / next(r["flops_per_step"] for r in runs if r["cell"] == ref),
            "plateau_exits": exits,
            "left_plateau": sum(x is not None for x in exits),
            "last_eval_step": min(r["evals"][-1]["step"] for r in mine),
        }
    for c in spec.cells:  # the plateau exit in training FLOPs, paired by seed against the reference's
        if c == ref:
            continue
        exit_f = {
            r["seed"]: r["plateau_exit"] * r["flops_per_step"] for r in runs if r["cell"] == c if r["plateau_exit"]
        }
        ref_f = {
            r["seed"]: r["plateau_exit"] * r["flops_per_step"] for r in runs if r["cell"] == ref if r["plateau_exit"]
        }
        seeds = sorted(set(exit_f) & set(ref_f))
        per_ref_step = cells[ref]["flops_per_step"]
        diffs = [(exit_f[s] - ref_f[s]) / per_ref_step for s in seeds]  # in the reference's steps
        cells[c]["exit_in_reference_steps"] = [exit_f[s] / per_ref_step for s in seeds]
        cells[c]["exit_minus_reference_in_reference_steps"] = {
            "diffs": diffs,
            **(t_interval(diffs).as_dict() if len(diffs) > 1 else {}),
        }
    return {"grid": str(folder), "reference": ref, "cells": cells, "runs": runs, "matched_compute": matched}


def plot(studies: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(studies), figsize=(6.2 * len(studies), 4.4), squeeze=False)
    for ax, st in zip(axes[0], studies, strict=True):
        for i, cell in enumerate(st["cells"]):
            colour = f"C{i}"
            mine = [r for r in st["runs"] if r["cell"] == cell]
            for r in mine:
                ax.plot(
                    [p["flops"] for p in r["evals"]], [p["bound"] for p in r["evals"]], color=colour, lw=0.7, alpha=0.5
                )
            n = min(len(r["evals"]) for r in mine)
            xs = [mine[0]["evals"][k]["flops"] for k in range(n)]
            ys = [float(np.mean([r["evals"][k]["bound"] for r in mine])) for k in range(n)]
            label = f"{cell} (plateau exit at steps {', '.join(map(str, st['cells'][cell]['plateau_exits']))})"
            ax.plot(xs, ys, color=colour, lw=2.2, marker="o", ms=3, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (block runs read [x_t, x_0]: about 2x per step)")
        ax.set_ylabel("test NELBO (nats/token)")
        ax.set_title(f"{Path(st['grid']).name}: bound against compute, 3 seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Likelihood against block size (issue 39 §4): linux-docs, L = 64, fp32", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="+", type=Path, help="joined grid folders (scripts/join_grids.py)")
    ap.add_argument("--out", type=Path, required=True, help="folder for bsize.json and bsize.png")
    a = ap.parse_args(argv)
    for g in a.grids:
        if not (g / "manifest.json").is_file():
            print(f"replaid: error: {g} holds no grid (manifest.json); pass a joined grid folder", file=sys.stderr)
            sys.exit(2)
    studies = [study(g) for g in a.grids]
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"plateau_nats": PLATEAU_NATS, "studies": studies}
    (a.out / "bsize.json").write_text(json.dumps(res, indent=1, allow_nan=False))
    plot(studies, a.out / "bsize.png")
    for st in studies:
        print(f"\n## {st['grid']} (reference {st['reference']})")
        for c, v in st["cells"].items():
            print(
                f"{c}: {v['flops_ratio_to_reference']:.3f}x FLOPs/step, plateau exits {v['plateau_exits']}, "
                f"evals to {v['last_eval_step']}"
            )
        for c, v in st["cells"].items():
            if "exit_in_reference_steps" in v:
                e = v["exit_minus_reference_in_reference_steps"]
                print(
                    f"  {c} exit in reference steps {v['exit_in_reference_steps']}: {e.get('mean')} [{e.get('lo')}, {e.get('hi')}]"
                )
        for c, pts in st["matched_compute"].items():
            for p in pts:
                print(
                    f"  {c} at {p['flops']:.3g} FLOPs: {p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] {p['verdict']}"
                )


if __name__ == "__main__":
    main()
