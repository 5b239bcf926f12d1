"""Issue 48's tables from a grid's logged training rows: per run its plateau exit (step and tokens), its
bound and distance below unigram at each budget, and its offset above the same seed's reference run
(MDLM) at equal compute with the compute multiplier (:mod:`replaid.eval.plateau`); per cell the paired
differences against the default cell, with 95% t-intervals over seeds. Writes ``study.json``,
``study.md``, ``below_unigram.png`` and ``bound_flops.png``.

    python scripts/plateau_study.py runs/plateau-screen --reference replaid --against mdlm \
        --budgets 300 600 1200 2400 --out docs/results/plateau/screen
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from replaid.config import read_run_config, set_key
from replaid.eval.plateau import Curve, offset_against
from replaid.eval.seeds import PLATEAU_NATS, plateau_exit, t_interval
from replaid.scaling.grid import read_grid, training_rows
from replaid.scaling.plan import planned_vocab_size
from replaid.training.flops import train_flops_per_token


def step_flops(cfg_path: Path) -> tuple[float, float, int, int]:
    """(FLOPs per step, FLOPs per step of the curriculum's block steps, curriculum steps, tokens per step)."""
    cfg = read_run_config(cfg_path)
    V = planned_vocab_size(cfg)
    tokens = cfg.train.batch_size * cfg.data.seq_len
    per = train_flops_per_token(cfg, V) * tokens
    n = int(getattr(cfg.options, "curriculum_steps", 0) or 0) if cfg.method in ("replaid", "plaid") else 0
    if not n:
        return per, per, 0, tokens
    set_key(cfg, "diffusion.block_size", cfg.options.curriculum_block)
    set_key(cfg, "diffusion.curriculum_steps", 0)
    return per, train_flops_per_token(cfg, V) * tokens, n, tokens


def curve_of(run: Path, cfg_path: Path) -> tuple[Curve, int]:
    rows = training_rows(run)
    steps = [s for s in sorted(rows) if rows[s][1] is not None]
    per, per_block, n, tokens = step_flops(cfg_path)
    flops = [per * s + (per_block - per) * min(s, n) for s in steps]
    uni = [float(rows[s][1]) for s in steps]  # type: ignore[arg-type]
    return Curve(steps, [rows[s][0] for s in steps], uni, flops), tokens


def interval(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return {"n": len(xs), "mean": xs[0] if xs else None, "lo": None, "hi": None}
    iv = t_interval(xs)
    return {"n": iv.n, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi}


def geometric(ms: list[float | None]) -> dict[str, Any] | None:
    """exp of the t-interval of log m over seeds; None unless every seed has a multiplier (n >= 2)."""
    if len(ms) < 2 or any(m is None or not m > 0 for m in ms):
        return None
    iv = t_interval([math.log(m) for m in ms if m is not None])
    return {"n": iv.n, "mean": math.exp(iv.mean), "lo": math.exp(iv.lo), "hi": math.exp(iv.hi)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "grid", type=Path, nargs="+", help="grid folders; a (cell, seed) run comes from the first grid that has it"
    )
    p.add_argument("--reference", default="replaid", help="the default cell the others are paired against")
    p.add_argument("--against", default="mdlm", help="the method whose curve the offset is read against")
    p.add_argument("--budgets", type=int, nargs="+", default=[300, 600, 1200, 2400])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    curves: dict[tuple[str, int], Curve] = {}
    found = [(g, e) for g in args.grid for e in read_grid(g)[1]]
    for g, e in found:
        run = g / e.run_dir
        if (e.cell, e.seed) in curves or not (run / "metrics.jsonl").is_file():
            continue
        c, tokens = curve_of(run, g / e.config)
        if not c.steps:
            continue
        curves[(e.cell, e.seed)] = c
        ex = plateau_exit(list(c.steps), list(c.bound), list(c.unigram))
        fe = run / "final_eval.json"
        runs.setdefault(e.cell, {})[e.seed] = {
            "seed": e.seed,
            "last_step": c.steps[-1],
            "finished": fe.is_file(),
            "exit_step": ex,
            "exit_tokens": None if ex is None else ex * tokens,
            "exit_flops": None if ex is None else c.flops_at(ex),
            "below_unigram": {b: c.below_unigram_at(b) for b in args.budgets if b <= c.steps[-1]},
            "bound": {b: c.bound_at(b) for b in args.budgets if b <= c.steps[-1]},
            "eval_nelbo": json.loads(fe.read_text())["eval"].get("nelbo_nats_per_token") if fe.is_file() else None,
        }
    for (cell, seed), c in curves.items():  # offsets against the same seed's reference-method run
        ref = curves.get((args.against, seed))
        r = runs[cell][seed]
        r["offset"], r["multiplier"] = {}, {}
        if ref is None or cell == args.against:
            continue
        ref_exit = runs[args.against][seed]["exit_step"]
        for b in args.budgets:
            if b > c.steps[-1] or r["exit_step"] is None or r["exit_step"] > b or ref_exit is None:
                continue
            o = offset_against(c, ref, b)
            r["offset"][b] = o.offset if math.isfinite(o.ref_bound) else None
            r["multiplier"][b] = o.multiplier
    cells: dict[str, Any] = {}
    ref_runs = runs.get(args.reference, {})
    for cell, by_seed in runs.items():
        seeds = sorted(by_seed)
        exits = [by_seed[s]["exit_step"] for s in seeds]
        summary: dict[str, Any] = {
            "seeds": seeds,
            "exit_steps": exits,
            "exits_left": sum(x is not None for x in exits),
            "exit": interval([x for x in exits if x is not None]) if all(x is not None for x in exits) else None,
            "below_unigram": {b: interval([by_seed[s]["below_unigram"].get(b) for s in seeds]) for b in args.budgets},
            "offset": {b: interval([by_seed[s]["offset"].get(b) for s in seeds]) for b in args.budgets},
            "multiplier": {b: [by_seed[s]["multiplier"].get(b) for s in seeds] for b in args.budgets},
            # the geometric mean of the multipliers with the t-interval of their logs (every seed reached)
            "multiplier_interval": {
                b: geometric([by_seed[s]["multiplier"].get(b) for s in seeds]) for b in args.budgets
            },
        }
        if cell != args.reference and ref_runs:
            paired = [s for s in seeds if s in ref_runs]
            diff_b = {
                b: interval(
                    [by_seed[s]["bound"].get(b, math.nan) - ref_runs[s]["bound"].get(b, math.nan) for s in paired]
                )
                for b in args.budgets
            }
            # exit differences: a reference run still on the plateau contributes an upper bound (it left after
            # its last step at the earliest), kept apart from the exact differences
            exact, at_most = [], []
            for s in paired:
                a, r = by_seed[s]["exit_step"], ref_runs[s]["exit_step"]
                if a is not None and r is not None:
                    exact.append(a - r)
                elif a is not None:
                    at_most.append(a - ref_runs[s]["last_step"])
            summary["paired"] = {
                "seeds": paired,
                "bound_diff": diff_b,
                "exit_diff": interval(exact) if len(exact) == len(paired) else None,
                "exit_diff_exact": exact,
                "exit_diff_at_most": at_most,
            }
        cells[cell] = summary
    args.out.mkdir(parents=True, exist_ok=True)
    out = {
        "grids": [str(g) for g in args.grid],
        "reference": args.reference,
        "against": args.against,
        "budgets": args.budgets,
        "plateau_nats": PLATEAU_NATS,
        "cells": cells,
        "runs": runs,
    }
    (args.out / "study.json").write_text(json.dumps(out, indent=1, allow_nan=False, default=str).replace("NaN", "null"))
    plot(curves, runs, args)
    print(f"wrote {args.out}/study.json, below_unigram.png, bound_flops.png ({len(curves)} runs)")
    return 0


def plot(curves: dict[tuple[str, int], Curve], runs: dict[str, Any], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({c for c, _ in curves}, key=lambda c: (c != args.reference, c != args.against, c))
    colour = {c: f"C{i % 10}" for i, c in enumerate(cells)}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(9, 5))
    for (cell, seed), c in sorted(curves.items()):
        ys = [c.below_unigram_at(int(s), 150) for s in c.steps]
        ax.plot(c.steps, ys, color=colour[cell], ls=styles[seed % 4], lw=1.0, label=f"{cell} s{seed}")
    ax.axhline(PLATEAU_NATS, color="k", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("nats/token below the unigram bound (training rows, 150-step mean)")
    ax.set_title("Leaving the unigram plateau (dotted: the 0.3-nat exit margin)")
    ax.legend(fontsize=6, ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "below_unigram.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 5))
    for (cell, seed), c in sorted(curves.items()):
        xs, ys = c.smoothed(150)
        ax.plot(xs, ys, color=colour[cell], ls=styles[seed % 4], lw=1.0, label=f"{cell} s{seed}")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("bound (nats/token, training rows, 150-step mean)")
    ax.set_title("Bound against compute")
    ax.legend(fontsize=6, ncol=3)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(args.out / "bound_flops.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
