"""Issue 48's tables from a grid's logged training rows: per run its plateau exit (step and tokens), its
bound and distance below unigram at each budget, and its offset above the same seed's reference run
(MDLM) at equal compute with the compute multiplier (:mod:`replaid.eval.plateau`); per cell the paired
differences against the default cell, with 95% t-intervals over seeds. Writes ``study.json``,
``study.md``, ``below_unigram.png`` and ``bound_flops.png``.

    python scripts/plateau_study.py runs/plateau-screen --reference replaid --against mdlm \
        --budgets 300 600 1200 2400 --out docs/results/plateau/screen

``--cells`` keeps the named cells only (one arm of a grid of arms, paired against its own reference).
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
    per, per_block, n, tokens = step_flops(cfg_path)
    # a curriculum's rows up to its switch are the block bound (clean context), not the run's bound: left out
    steps = [s for s in sorted(rows) if rows[s][1] is not None and s > n]
    flops = [per * s + (per_block - per) * min(s, n) for s in steps]
    uni = [float(rows[s][1]) for s in steps]  # type: ignore[arg-type]
    return Curve(steps, [rows[s][0] for s in steps], uni, flops), tokens


SIGNATURES = ("kl_unigram/t0.5", "attn_entropy/first", "attn_entropy/last", "pos_cosine/last", "gamma_0", "sc_cosine")


def signatures_at(run: Path, steps: list[int]) -> dict[int, dict[str, float]]:
    """The logged plateau signatures of a run at the given steps (first and deepest layer of the
    per-layer ones); {} for a run logged without them."""
    from replaid.scaling.grid import metrics_rows

    out: dict[int, dict[str, float]] = {}
    for r in metrics_rows(run):
        if r["step"] not in steps or "loss" not in r:
            continue
        layers = sorted(int(k.split("/")[1]) for k in r if k.startswith("attn_entropy/"))
        row = {k: r[k] for k in ("kl_unigram/t0.5", "gamma_0", "sc_cosine") if isinstance(r.get(k), (int, float))}
        if layers:
            row["attn_entropy/first"] = r[f"attn_entropy/{layers[0]}"]
            row["attn_entropy/last"] = r[f"attn_entropy/{layers[-1]}"]
            row["pos_cosine/last"] = r[f"pos_cosine/{layers[-1]}"]
        if "kl_unigram/t0.5" in row:
            out[r["step"]] = row
    return out


def interval(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return {"n": len(xs), "mean": xs[0] if xs else None, "lo": None, "hi": None}
    iv = t_interval(xs)
    return {"n": iv.n, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi}


def finite(x: Any) -> Any:
    """``x`` with every non-finite float as None and int keys as strings (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


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
    p.add_argument("--partial", action="store_true", help="include runs still training (default: finished runs only)")
    p.add_argument("--cells", nargs="+", default=None, help="only these cells (default: every cell of the grids)")
    args = p.parse_args(argv)
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    curves: dict[tuple[str, int], Curve] = {}
    found = [(g, e) for g in args.grid for e in read_grid(g)[1]]
    for g, e in found:
        run = g / e.run_dir
        if (e.cell, e.seed) in curves or not (run / "metrics.jsonl").is_file():
            continue
        if args.cells is not None and e.cell not in args.cells:
            continue
        if not args.partial and not (run / "final_eval.json").is_file():
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
            "signatures": signatures_at(run, args.budgets),
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
            "eval_nelbo": interval([by_seed[s]["eval_nelbo"] for s in seeds]),
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
            same = [s for s in paired if by_seed[s]["last_step"] == ref_runs[s]["last_step"]]  # equal lengths only
            ev = [(by_seed[s]["eval_nelbo"], ref_runs[s]["eval_nelbo"]) for s in same]
            summary["paired_eval"] = interval([a - r for a, r in ev if a is not None and r is not None])
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
    (args.out / "study.json").write_text(json.dumps(finite(out), indent=1, allow_nan=False))
    (args.out / "study.md").write_text(markdown(out))
    plot(curves, runs, args)
    print(f"wrote {args.out}/study.json, study.md, below_unigram.png, bound_flops.png ({len(curves)} runs)")
    return 0


def fmt(x: Any, nd: int = 3, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def iv(d: dict[str, Any] | None, nd: int = 3, sign: bool = False) -> str:
    """``mean [lo, hi]`` of an :func:`interval` (``mean (n = 1)`` without an interval)."""
    if not d or d.get("mean") is None:
        return "-"
    if d.get("lo") is None:
        return f"{fmt(d['mean'], nd, sign)} (n = {d['n']})"
    return f"{fmt(d['mean'], nd, sign)} [{fmt(d['lo'], nd, sign)}, {fmt(d['hi'], nd, sign)}]"


def markdown(out: dict[str, Any]) -> str:
    """The study's tables: exits, distance below unigram per budget, paired differences against the
    reference cell, offsets and compute multipliers against the ``against`` method."""
    b = out["budgets"]
    ref, against = out["reference"], out["against"]
    cells = out["cells"]
    lines = [
        f"Grids: {', '.join(out['grids'])}. Intervals: 95% t over seeds, uncorrected. Exit: the first logged step "
        f"from which the training bound stays {out['plateau_nats']} nats below the unigram NLL of its own tokens.",
        "",
        "| cell | seeds | exit steps | nats below unigram at "
        + " / ".join(map(str, b))
        + " steps | final test NELBO |",
        "|---|---|---|---|---|",
    ]
    for c, v in cells.items():
        ex = ", ".join("-" if x is None else str(x) for x in v["exit_steps"])
        below = " / ".join(
            iv(v["below_unigram"][str(x)] if str(x) in v["below_unigram"] else v["below_unigram"].get(x), 2) for x in b
        )
        lines.append(f"| {c} | {len(v['seeds'])} | {ex} | {below} | {iv(v['eval_nelbo'])} |")
    lines += ["", f"Paired against `{ref}` (same seeds): exit-step difference, bound difference at each budget.", ""]
    lines += [
        "| cell | exit difference (steps) | bound difference at "
        + " / ".join(map(str, b))
        + " | final test NELBO difference |",
        "|---|---|---|---|",
    ]
    for c, v in cells.items():
        pd = v.get("paired")
        if not pd:
            continue
        exact = ", ".join(f"{d:+d}" for d in pd["exit_diff_exact"])
        at_most = ", ".join(f"<= {d:+d}" for d in pd["exit_diff_at_most"])
        ed = iv(pd["exit_diff"], 0, True) if pd["exit_diff"] else "; ".join(x for x in (exact, at_most) if x) or "-"
        bd = " / ".join(
            iv(pd["bound_diff"][str(x)] if str(x) in pd["bound_diff"] else pd["bound_diff"].get(x), 3, True) for x in b
        )
        lines.append(f"| {c} | {ed} | {bd} | {iv(v.get('paired_eval'), 3, True)} |")
    lines += [
        "",
        f"Against `{against}` (same seed) at equal compute, once both have left the plateau: offset (nats/token above its curve) and compute multiplier (per seed; geometric mean [interval] when every seed has one).",
        "",
    ]
    lines += ["| cell | budget | offset | multipliers | multiplier |", "|---|---|---|---|---|"]
    for c, v in cells.items():
        if c == against:
            continue
        for x in b:
            key = str(x) if str(x) in v["offset"] else x
            ms = v["multiplier"].get(key, [])
            if not any(m is not None for m in ms):
                continue
            mi = v["multiplier_interval"].get(key)
            lines.append(
                f"| {c} | {x} | {iv(v['offset'][key], 3, True)} | {', '.join(fmt(m, 2) for m in ms)} | {iv(mi, 2)} |"
            )
    return "\n".join(lines) + "\n"


def plot(curves: dict[tuple[str, int], Curve], runs: dict[str, Any], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({c for c, _ in curves}, key=lambda c: (c != args.reference, c != args.against, c))
    colour = {c: f"C{i % 10}" for i, c in enumerate(cells)}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(9, 5))
    labelled: set[str] = set()
    for (cell, seed), c in sorted(curves.items()):
        ys = [c.below_unigram_at(int(s), 150) for s in c.steps]
        label = None if cell in labelled else cell  # one legend entry per cell; the seeds are its line styles
        labelled.add(cell)
        ax.plot(c.steps, ys, color=colour[cell], ls=styles[seed % 4], lw=1.0, label=label)
    ax.axhline(PLATEAU_NATS, color="k", lw=0.8, ls=":")
    ax.set_ylim(bottom=-1.0)  # a run's first steps (far above the unigram) would squash the plateau's scale
    ax.set_xlabel("step")
    ax.set_ylabel("nats/token below the unigram bound (training rows, 150-step mean)")
    ax.set_title(
        "Leaving the unigram plateau (dotted: the 0.3-nat exit margin; seeds 0/1/2 solid/dashed/dotted;\n"
        "clipped below -1)",
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "below_unigram.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 5))
    labelled = set()
    top = 0.0
    for (cell, seed), c in sorted(curves.items()):
        xs, ys = c.smoothed(150)
        label = None if cell in labelled else cell
        labelled.add(cell)
        ax.plot(xs, ys, color=colour[cell], ls=styles[seed % 4], lw=1.0, label=label)
        top = max([top, *(y for s, y in zip(c.steps, ys, strict=False) if s >= 300)])
    ax.set_ylim(top=top + 0.3)  # from 300 steps on: the first steps' bounds would squash the rest
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("bound (nats/token, training rows, 150-step mean)")
    ax.set_title(
        "Bound against compute (seeds 0/1/2 solid/dashed/dotted; the first 300 steps clipped above)", fontsize=10
    )
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(args.out / "bound_flops.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
