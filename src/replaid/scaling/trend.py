"""A grid read at several step counts: the gap between methods against training compute.

A grid whose runs evaluate the test split along the way (``train.eval_every``, constant learning rate,
``eval.split=test``) gives, for each (cell, seed), its bound at every evaluated step: the whole curve at
the cost of its longest point. At each step count ``s`` :func:`trend` builds the grid report of the
bounds logged at ``s`` (:func:`replaid.eval.grid.report`: per-cell t-intervals over seeds, paired
differences against the reference), with the training FLOPs and the passes over the train split at
``s``. The gap of a cell against the reference is then read as a trend in ``log10 FLOPs``:

    g_{c,k}(s) = x_{c,k}(s) - x_{ref,k}(s)            (seed k, paired)
    slope_k    = OLS slope of g_{c,k} on log10 FLOPs(s) over the step counts
    the gap *shrinks* when the t-interval over seeds of slope_k lies wholly on the side that moves the
    gap towards 0 (from the sign of the mean gap at the first step), *grows* when on the other side,
    else *not determined*; it *flips* when the paired interval at the first step and the one at the
    last step both exclude 0 with opposite signs. Where every seed's gap changes sign, the crossing
    (:func:`crossing`, log10 FLOPs of the last sign change, interpolated) gets a t-interval over seeds.

No trend is fitted through fewer than 3 step counts or 2 seeds, and none is given a verdict with fewer than 3 seeds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from replaid.config import ConfigError, read_run_config
from replaid.eval.grid import _f, report, run_value
from replaid.eval.seeds import t_interval
from replaid.fileio import atomic_write_text
from replaid.scaling.grid import REPLAN, GridEntry, metrics_rows, read_grid, training_rows
from replaid.schema import dumps as strict_dumps


def eval_rows(run: Path) -> dict[int, dict[str, Any]]:
    """``{step: evaluation}`` of a run's logged evaluations (``eval/...`` rows of ``metrics.jsonl``,
    prefix stripped; the final evaluation is logged there too). A repeated step keeps the last row."""
    out: dict[int, dict[str, Any]] = {}
    for r in metrics_rows(run):
        ev = {k[5:]: v for k, v in r.items() if k.startswith("eval/")}
        if "nelbo_nats_per_token" in ev or "nll_nats_per_token" in ev:
            out[r["step"]] = ev
    return out


def rows_at(folder: Path, entries: list[GridEntry], step: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The grid-report rows of the bounds logged at ``step`` (finished or not), and the ids without one."""
    rows, missing = [], []
    for e in entries:
        ev = eval_rows(Path(folder) / e.run_dir).get(step)
        if ev is None:
            missing.append(e.id)
            continue
        value, kind, uni = run_value(ev)
        rows.append({"cell": e.cell, "seed": e.seed, "value": value, "kind": kind, "unigram": uni, "id": e.id})
    return rows, missing


def gap_trend(log_flops: list[float], gaps: dict[int, list[float]], confidence: float = 0.95) -> dict[str, Any]:
    """The trend of one cell's paired gap (module docstring). ``gaps``: seed -> gap at each of the
    ``log_flops`` (same order); seeds missing a point are left out."""
    x = np.asarray(log_flops, dtype=np.float64)
    seeds = sorted(k for k, g in gaps.items() if len(g) == len(x) and all(math.isfinite(v) for v in g))
    out: dict[str, Any] = {"points": len(x), "seeds": seeds}
    if len(x) < 3 or len(seeds) < 2:
        out["verdict"] = "not fitted (fewer than 3 step counts or 2 seeds)"
        return out
    xc = x - x.mean()
    slopes = [float(np.dot(xc, np.asarray(gaps[k], dtype=np.float64)) / np.dot(xc, xc)) for k in seeds]
    iv = t_interval(slopes, confidence)
    first = t_interval([gaps[k][0] for k in seeds], confidence)
    last = t_interval([gaps[k][-1] for k in seeds], confidence)
    towards_zero = -1.0 if first.mean > 0 else 1.0  # the slope's sign that brings the gap nearer 0
    if len(seeds) < 3:  # the project's rule: a difference between trained runs takes its interval from 3+ seeds
        verdict = f"not determined ({len(seeds)} seeds; a verdict takes 3)"
    elif iv.contains_zero:
        verdict = "not determined"
    else:
        verdict = "shrinks" if (iv.mean > 0) == (towards_zero > 0) else "grows"
    flips = not first.contains_zero and not last.contains_zero and (first.mean > 0) != (last.mean > 0)
    cross = [crossing(x.tolist(), gaps[k]) for k in seeds]
    if all(c is not None for c in cross):
        civ = t_interval([float(c) for c in cross if c is not None], confidence)
        out.update(crossing_log10_flops=[float(c) for c in cross if c is not None], crossing_mean=civ.mean)
        out.update(crossing_lo=civ.lo, crossing_hi=civ.hi)
    else:
        out["crossing"] = f"{sum(c is None for c in cross)} of {len(seeds)} seeds do not cross 0 in the range run"
    out.update(
        slopes=slopes,
        slope_mean=iv.mean,
        slope_lo=iv.lo,
        slope_hi=iv.hi,
        verdict=verdict + (", flips sign" if flips else ""),
        flips=flips,
    )
    return out


def crossing(log_flops: list[float], gap: list[float]) -> float | None:
    """Where one seed's gap crosses 0 for the last time: log10 FLOPs by linear interpolation between the
    two step counts around its last sign change (a point exactly at 0 counts as the crossing); None when
    the gap keeps one sign throughout."""
    last = None
    for i in range(len(gap) - 1):
        a, b = gap[i], gap[i + 1]
        if a == 0:
            last = log_flops[i]
        elif (a > 0) != (b > 0) and b != 0:
            last = log_flops[i] + (log_flops[i + 1] - log_flops[i]) * a / (a - b)
    if gap and gap[-1] == 0:
        last = log_flops[-1]
    return last


def trend(
    folder: Path,
    steps: list[int],
    reference: str | None = None,
    confidence: float = 0.95,
    train_tokens: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The grid at each of ``steps``: a report per step, FLOPs and passes per (cell, step), and each
    cell's gap trend against ``reference`` (module docstring). ``train_tokens``: cell -> tokens in its
    train split (for passes); absent: not reported."""
    folder = Path(folder)
    spec, entries = read_grid(folder)
    ref = reference if reference is not None else spec.reference
    steps = sorted(dict.fromkeys(int(s) for s in steps))
    if not steps or steps[0] < 1:
        raise ConfigError(f"--steps {steps}: give the step counts to read, each >= 1")
    longest = {e.cell: e.steps for e in entries}
    beyond = [s for s in steps if s > max(longest.values())]
    if beyond:
        raise ConfigError(f"--steps {beyond}: beyond the grid's runs ({max(longest.values())} steps)")
    cells_order = list(spec.cell_overrides())
    per_step: list[dict[str, Any]] = []
    for s in steps:
        rows, missing = rows_at(folder, entries, s)
        if not rows:
            raise ConfigError(
                f"no run of grid {folder} has an evaluation logged at step {s}; the runs evaluate at "
                f"multiples of train.eval_every (and at their last step)"
            )
        rep = report(rows, ref, confidence, cells_order, spec.orderings)
        flops = {e.cell: e.flops * s / e.steps for e in entries}
        per_cell = {}
        for c in rep["cells"]:
            e = next(x for x in entries if x.cell == c["cell"])
            cfg = read_run_config(folder / e.config, REPLAN)
            tokens = s * cfg.train.batch_size * cfg.data.seq_len  # tokens read by step s
            passes = tokens / train_tokens[c["cell"]] if train_tokens and c["cell"] in train_tokens else None
            per_cell[c["cell"]] = {"flops": flops[c["cell"]], "tokens": tokens, "passes": passes}
        per_step.append({"step": s, "report": rep, "cells": per_cell, "missing": missing})
    gaps = {}
    if ref is not None:
        for cell in cells_order:
            if cell == ref:
                continue
            by_seed: dict[int, list[float]] = {}
            xs = []
            for p in per_step:
                c = next((c for c in p["report"]["cells"] if c["cell"] == cell), None)
                if c is None or "paired" not in c:
                    continue
                xs.append(math.log10(p["cells"][cell]["flops"]))
                for k, d in zip(c["paired"]["seeds"], c["paired"]["diffs"], strict=True):
                    by_seed.setdefault(k, []).append(d)
            gaps[cell] = gap_trend(xs, by_seed, confidence)
    return {"grid": str(folder), "reference": ref, "confidence": confidence, "steps": per_step, "gaps": gaps}


def trend_markdown(tr: dict[str, Any], title: str = "Gap against training compute") -> str:
    conf = int(round(100 * tr["confidence"]))
    ref = tr["reference"]
    L = [
        f"# {title}",
        "",
        f"Bounds: nats/token on the evaluation split at each step count; {conf}% t-intervals over seeds.",
    ]
    L += [
        "",
        "| step | cell | passes | FLOPs | seeds | mean [interval] | below unigram |"
        + (f" minus `{ref}` (paired) | verdict |" if ref else ""),
    ]
    L += ["|---|---|---|---|---|---|---|" + ("---|---|" if ref else "")]
    for p in tr["steps"]:
        for c in p["report"]["cells"]:
            pc = p["cells"][c["cell"]]
            passes = "n/a" if pc["passes"] is None else f"{pc['passes']:.2f}"
            bu = (
                "n/a"
                if c["below_unigram"] is None
                else f"{c['below_unigram']:.3f}" + (" **plateau**" if c["on_plateau"] else "")
            )
            row = (
                f"| {p['step']} | {c['cell']} | {passes} | {pc['flops']:.3g} | {c['n']} | "
                f"{c['mean']:.3f} [{_f(c['lo'])}, {_f(c['hi'])}] | {bu} |"
            )
            if ref:
                q = c.get("paired")
                row += (
                    f" {q['diff_mean']:+.3f} [{_f(q['diff_lo'], '+.3f')}, {_f(q['diff_hi'], '+.3f')}] | {q['verdict']} |"
                    if q
                    else " (reference) | |"
                )
            L.append(row)
    if tr["gaps"]:
        L += [
            "",
            f"Gap trend against `{ref}`: per seed, the OLS slope of the paired gap on log10 FLOPs; {conf}% t over seeds.",
            "",
        ]
        L += ["| cell | step counts | seeds | slope per decade [interval] | verdict |", "|---|---|---|---|---|"]
        for cell, g in tr["gaps"].items():
            sl = (
                f"{g['slope_mean']:+.3f} [{_f(g['slope_lo'], '+.3f')}, {_f(g['slope_hi'], '+.3f')}]"
                if "slope_mean" in g
                else "-"
            )
            L.append(f"| {cell} | {g['points']} | {len(g['seeds'])} | {sl} | {g['verdict']} |")
    return "\n".join(L) + "\n"


def plot_trend(tr: dict[str, Any], path: Path, title: str = "") -> Path:
    """Left: each cell's bound against training FLOPs (every seed a point, the mean a line). Right: each
    cell's paired gap to the reference against FLOPs (every seed a point, mean and interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = tr["reference"]
    fig, axes = plt.subplots(1, 2 if ref else 1, figsize=(12 if ref else 6.5, 4.5), squeeze=False)
    ax = axes[0][0]
    cells = [c["cell"] for c in tr["steps"][-1]["report"]["cells"]]
    for i, cell in enumerate(cells):
        col = f"C{i % 10}"
        xs, ms = [], []
        for p in tr["steps"]:
            c = next((c for c in p["report"]["cells"] if c["cell"] == cell), None)
            if c is None:
                continue
            f = p["cells"][cell]["flops"]
            ax.scatter([f] * len(c["values"]), c["values"], s=10, color=col, alpha=0.5)
            xs.append(f)
            ms.append(c["mean"])
        ax.plot(xs, ms, color=col, lw=1.6, label=cell)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("test bound (nats/token)")
    ax.set_title(title or "bound against training compute", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if ref:
        ax2 = axes[0][1]
        for i, cell in enumerate(cells):
            if cell == ref:
                continue
            col = f"C{i % 10}"
            xs, ms, lo, hi = [], [], [], []
            for p in tr["steps"]:
                c = next((c for c in p["report"]["cells"] if c["cell"] == cell), None)
                if c is None or "paired" not in c:
                    continue
                f = p["cells"][cell]["flops"]
                q = c["paired"]
                ax2.scatter([f] * len(q["diffs"]), q["diffs"], s=10, color=col, alpha=0.5)
                xs.append(f)
                ms.append(q["diff_mean"])
                lo.append(q["diff_lo"])
                hi.append(q["diff_hi"])
            ax2.plot(xs, ms, color=col, lw=1.6, label=f"{cell} - {ref}")
            if all(math.isfinite(v) for v in lo + hi):
                ax2.fill_between(xs, lo, hi, color=col, alpha=0.12)
        ax2.axhline(0, color="black", lw=0.8)
        ax2.set_xscale("log")
        ax2.set_xlabel("training FLOPs")
        ax2.set_ylabel(f"paired gap to {ref} (nats/token)")
        ax2.set_title("gap against compute: seeds as points, mean and t-interval band", fontsize=9)
        ax2.grid(alpha=0.3, which="both")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_trend(
    folder: Path,
    steps: list[int],
    reference: str | None = None,
    confidence: float = 0.95,
    out: Path | None = None,
    title: str | None = None,
    passes: bool = True,
    train_tokens: int | None = None,
) -> dict[str, Any]:
    """``trend.json``, ``trend.md`` and ``trend.png`` (in ``out``, default the grid folder).
    ``train_tokens``: the train split's size for every cell, where the run folders hold no tokenizer
    to count it with."""
    folder = Path(folder)
    tokens: dict[str, int] | None = None
    if train_tokens is not None:
        tokens = {e.cell: train_tokens for e in read_grid(folder)[1]}
    elif passes:
        tokens = train_split_tokens(folder)
    tr = trend(folder, steps, reference, confidence, tokens)
    out = Path(out) if out else folder
    out.mkdir(parents=True, exist_ok=True)
    name = title or f"Gap against training compute: {folder.name}"
    atomic_write_text(out / "trend.json", strict_dumps(tr, indent=1))
    atomic_write_text(out / "trend.md", trend_markdown(tr, name) + "\n![bound and gap against FLOPs](trend.png)\n")
    plot_trend(tr, out / "trend.png", name)
    return tr


def train_split_tokens(folder: Path) -> dict[str, int]:
    """cell -> tokens in its train split (one finished run's data per cell; cells without one are left out)."""
    from replaid.data.pipeline import DataPipeline

    _, entries = read_grid(folder)
    out: dict[str, int] = {}
    for e in entries:
        run = Path(folder) / e.run_dir
        if e.cell in out or not (run / "tokenizer").is_dir() or not training_rows(run):
            continue
        cfg = read_run_config(run / "config.json")
        out[e.cell] = int(len(DataPipeline(cfg, run, train=False).array("train")[0]))
    return out
