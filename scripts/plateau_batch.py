"""Issue 48 §2, the batch arm: is the unigram plateau a number of optimiser steps, a number of tokens, or
neither? Per cell and batch size, each seed's exit (:func:`replaid.eval.seeds.plateau_exit` on the logged
training rows) in steps and in tokens; per cell the exponent ``a`` of ``exit_steps ~ batch^a`` between two
batch sizes, paired by seed, with its 95% t-interval: ``a = 0`` is a fixed number of steps, ``a = -1`` a
fixed number of tokens. A run still on the plateau at its last step gives a lower bound, not an exit, and
leaves its seed out of the exponent. Writes ``batch.json``, ``batch.md`` and ``exits.png``.

    python scripts/plateau_batch.py runs/plateau-screen runs/plateau-b128 \
        --cells mdlm:mdlm,mdlm replaid:replaid,replaid data-init:cooc-init,cooc --out docs/results/plateau/batch
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from replaid.config import read_run_config
from replaid.eval.seeds import plateau_exit, t_interval
from replaid.scaling.grid import read_grid, training_rows
from replaid.schema import dumps as strict_dumps

PAPER_TOKENS_PER_STEP = 256 * 2048  # the paper's batch: 256 sequences of 2,048 tokens


def exits(grid: Path, cell: str) -> tuple[int, int, dict[int, dict[str, Any]]]:
    """(batch, L, {seed: {exit_step, exit_tokens, last_step, censored}}) of a grid's finished runs of ``cell``."""
    batch = L = 0
    out: dict[int, dict[str, Any]] = {}
    for e in read_grid(grid)[1]:
        run = grid / e.run_dir
        if e.cell != cell or not (run / "final_eval.json").is_file():
            continue
        cfg = read_run_config(grid / e.config)
        batch, L = cfg.train.batch_size, cfg.data.seq_len
        rows = training_rows(run)
        steps = [s for s in sorted(rows) if rows[s][1] is not None]
        ex = plateau_exit(steps, [rows[s][0] for s in steps], [float(rows[s][1]) for s in steps])  # type: ignore[arg-type]
        step = ex if ex is not None else steps[-1]
        out[e.seed] = {"exit_step": step, "exit_tokens": step * batch * L, "censored": ex is None}
    return batch, L, out


def exponent(small: dict[int, dict[str, Any]], large: dict[int, dict[str, Any]], ratio: float) -> dict[str, Any]:
    """``a`` per seed (both exits seen) and its t-interval; a verdict on steps (0) and tokens (-1)."""
    per = {
        s: math.log(large[s]["exit_step"] / small[s]["exit_step"]) / math.log(ratio)
        for s in sorted(set(small) & set(large))
        if not small[s]["censored"] and not large[s]["censored"]
    }
    out: dict[str, Any] = {"per_seed": per, "n": len(per)}
    if len(per) < 2:
        out["verdict"] = f"not determined: {len(per)} seed(s) left the plateau at both batch sizes (2 or more needed)"
        return out
    iv = t_interval(list(per.values()))
    out.update(mean=iv.mean, lo=iv.lo, hi=iv.hi)
    steps, tokens = iv.lo <= 0 <= iv.hi, iv.lo <= -1 <= iv.hi
    out["verdict"] = (
        "not determined: the interval holds both a fixed number of steps (0) and of tokens (-1)"
        if steps and tokens
        else "a fixed number of steps (0 in the interval, -1 not)"
        if steps
        else "a fixed number of tokens (-1 in the interval, 0 not)"
        if tokens
        else "neither: the interval excludes both 0 (steps) and -1 (tokens)"
    )
    return out


def paper(ex: dict[str, Any]) -> str:
    """The extrapolated exit (steps) at the paper's batch with the interval the exponent allows, or why not."""
    if "paper_steps" not in ex:
        return "-"
    ps = ex["paper_steps"]
    return f"{ps['mean']:,.0f} [{ps['lo']:,.0f}, {ps['hi']:,.0f}] (an extrapolation over 2 batch sizes)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("grid", type=Path, nargs=2, help="the grid at the smaller batch, then at the larger")
    p.add_argument(
        "--cells", nargs="+", required=True, metavar="LABEL:CELL_A,CELL_B", help="a label and its cell in each grid"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    doc: dict[str, Any] = {"grids": [str(g) for g in args.grid], "cells": {}}
    lines = [
        f"Grids: {args.grid[0]} (smaller batch), {args.grid[1]} (larger). Exit: the first logged step from which the "
        "training bound stays 0.3 nats below the unigram NLL of its own tokens; `>= N`: still on the plateau at its "
        "last step N. The exponent a of exit_steps ~ batch^a, paired by seed: 0 = a fixed number of steps, -1 = a "
        "fixed number of tokens; 95% t-interval over the seeds that left at both.",
        "",
        "| cell | batch | exits (steps) | exits (tokens) | a [interval] | verdict | exit at the paper's 524,288 tokens a step (steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec in args.cells:
        label, _, cells = spec.partition(":")
        a_cell, b_cell = cells.split(",")
        (b1, L1, e1), (b2, L2, e2) = exits(args.grid[0], a_cell), exits(args.grid[1], b_cell)
        if not e1 or not e2:
            print(f"{label}: no finished run in one of the grids; skipped", file=sys.stderr)
            continue
        ex = exponent(e1, e2, b2 / b1)
        if "mean" in ex:  # the exit at the paper's tokens per step, were the exponent to hold that far (it need not)
            base = math.exp(sum(math.log(r["exit_step"]) for r in e1.values()) / len(e1))
            f = PAPER_TOKENS_PER_STEP / (b1 * L1)
            ex["paper_steps"] = {k: base * f ** ex[k] for k in ("mean", "lo", "hi")}
        doc["cells"][label] = {
            "small": {"batch": b1, "L": L1, "runs": e1},
            "large": {"batch": b2, "L": L2, "runs": e2},
            "exponent": ex,
        }
        for k, (b, e) in enumerate(((b1, e1), (b2, e2))):
            fmt = lambda r, key: (">= " if r["censored"] else "") + f"{r[key]:,}"
            a = "" if k == 0 else ("-" if "mean" not in ex else f"{ex['mean']:+.2f} [{ex['lo']:+.2f}, {ex['hi']:+.2f}]")
            lines.append(
                f"| {label if k == 0 else ''} | {b} | {'; '.join(fmt(e[s], 'exit_step') for s in sorted(e))} | "
                f"{'; '.join(fmt(e[s], 'exit_tokens') for s in sorted(e))} | {a} | {ex['verdict'] if k else ''} | "
                f"{paper(ex) if k else ''} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch.json").write_text(strict_dumps(doc, indent=2) + "\n")
    (args.out / "batch.md").write_text("\n".join(lines) + "\n")
    plot(doc, args.out / "exits.png")
    print(f"wrote {args.out}/batch.json, batch.md, exits.png")
    return 0


def plot(doc: dict[str, Any], path: Path) -> None:
    """Exit against batch size, in steps and in tokens (log-log), every seed a point (open: still on the plateau)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k, (label, d) in enumerate(doc["cells"].items()):
        color = f"C{k}"
        for ax, key in zip(axes, ("exit_step", "exit_tokens"), strict=True):
            for side in ("small", "large"):
                b = d[side]["batch"]
                for r in d[side]["runs"].values():
                    ax.scatter([b], [r[key]], color=color, facecolors="none" if r["censored"] else color, zorder=3)
            if any(r["censored"] for s in ("small", "large") for r in d[s]["runs"].values()):
                ax.scatter([], [], color=color, facecolors="none", label=label if key == "exit_step" else None)
                continue  # a lower bound is no exit: no line through it
            means = [
                math.exp(sum(math.log(r[key]) for r in d[s]["runs"].values()) / len(d[s]["runs"]))
                for s in ("small", "large")
            ]
            ax.plot(
                [d["small"]["batch"], d["large"]["batch"]],
                means,
                color=color,
                label=label if key == "exit_step" else None,
            )
    for ax, what in zip(axes, ("exit (optimiser steps)", "exit (tokens)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (sequences per step)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    fig.suptitle(
        "Leaving the unigram plateau against batch size (open markers: still on it at the run's end, a lower bound;\n"
        "lines: the geometric mean of the seeds' exits)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
