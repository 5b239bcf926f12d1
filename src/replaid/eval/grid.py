"""Multi-seed grids: a base config, the cells that vary it, N seeds per cell; and what they allow.

A grid spec (YAML or JSON, or built from ``replaid grid plan`` flags)::

    base: demo                      # a preset name, or a config file (.json/.yaml) of a run
    overrides: [data.source=../shared/data/wiki-sample, eval.split=test]   # every run
    seeds: [0, 1, 2]                # train.seed of each run (same seed: same init and data order)
    reference: replaid              # cell the paired differences are taken against (optional)
    orderings: [replaid < replaid-nosc]   # claims to check, e.g. a paper's (optional): "A < B" = A's
                                    # bound is lower; each is reported holds / reversed / not determined
    paper: {replaid: "PPL 22.1"}    # a figure to show beside each cell, e.g. the paper's (optional)
    cells:                          # name -> overrides of that cell (explicit cells) ...
      replaid: []
      replaid-nosc: [model.self_conditioning=false]
    vary:                           # ... and/or the Cartesian product of key -> values
      diffusion.schedule: [learned, linear]

Each (cell, seed) is one run ``runs/<cell>__s<seed>`` with the config ``base + overrides + cell +
train.seed=<seed>`` (``vary`` cells are named ``key=value,key=value``). The report (:func:`report`)
takes each finished run's final evaluation (the exact NLL for AR, the NELBO bound otherwise, in
nats/token on ``eval.split``) and summarises every cell with :mod:`replaid.eval.seeds`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaid.config import ConfigError, RunConfig, parse_overrides
from replaid.eval.seeds import PLATEAU_NATS, CellSummary, paired_difference, t_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CELL_NAME = re.compile(r"^[A-Za-z0-9._=,+-]+$")


@dataclass
class GridSpec:
    base: str = "demo"
    overrides: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    cells: dict[str, list[str]] = field(default_factory=dict)
    vary: dict[str, list[Any]] = field(default_factory=dict)
    reference: str | None = None
    orderings: list[str] = field(default_factory=list)
    paper: dict[str, str] = field(default_factory=dict)

    def cell_overrides(self) -> dict[str, list[str]]:
        """Every cell's own overrides: the explicit cells, then the ``vary`` product (one cell, named
        ``base``, when neither is given)."""
        out = {k: list(v) for k, v in self.cells.items()}
        if self.vary:
            keys = list(self.vary)
            for combo in itertools.product(*(self.vary[k] for k in keys)):
                ov = [f"{k}={_fmt_value(v)}" for k, v in zip(keys, combo, strict=True)]
                name = ",".join(ov)
                if name in out:
                    raise ConfigError(f"grid cell '{name}' is given twice (cells and vary); name it once")
                out[name] = ov
        return out or {"base": []}

    def validate(self) -> GridSpec:
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds)
        ):
            raise ConfigError(f"grid seeds must be distinct integers >= 0, got {self.seeds}")
        for name, ov in self.cell_overrides().items():
            if not CELL_NAME.match(name) or "__" in name:
                raise ConfigError(
                    f"grid cell name '{name}' may hold letters, digits and . _ = , + - (no '__'); rename it"
                )
            parse_overrides(ov)  # form check; keys are checked when the configs resolve
        if self.reference is not None and self.reference not in self.cell_overrides():
            raise ConfigError(
                f"grid reference '{self.reference}' is not a cell; choose one of {', '.join(self.cell_overrides())}"
            )
        for claim in self.orderings:
            for c in parse_ordering(claim):
                if c not in self.cell_overrides():
                    raise ConfigError(
                        f"grid ordering '{claim}' names '{c}', which is not a cell; "
                        f"choose among {', '.join(self.cell_overrides())}"
                    )
        for c in self.paper:
            if c not in self.cell_overrides():
                raise ConfigError(f"grid 'paper' names '{c}', which is not a cell; name a cell of the grid")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "overrides": self.overrides,
            "seeds": self.seeds,
            "cells": self.cells,
            "vary": self.vary,
            "reference": self.reference,
            "orderings": self.orderings,
            "paper": self.paper,
        }


def parse_ordering(claim: str) -> tuple[str, str]:
    """``"A < B"`` (A's bound is the lower) -> ``(A, B)``; ``"A > B"`` -> ``(B, A)``."""
    for op, flip in (("<", False), (">", True)):
        parts = [x.strip() for x in str(claim).split(op)]
        if len(parts) == 2 and all(parts) and not any(o in p for p in parts for o in "<>"):
            return (parts[1], parts[0]) if flip else (parts[0], parts[1])
    raise ConfigError(f"grid ordering '{claim}' must read 'A < B' (A's bound is lower) or 'A > B', with two cells")


def _fmt_value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def spec_from_dict(d: Any, where: str = "grid spec") -> GridSpec:
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping with base/overrides/seeds/cells/vary/reference")
    known = {"base", "overrides", "seeds", "cells", "vary", "reference", "orderings", "paper"}
    bad = sorted(set(d) - known)
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(bad)}; use {', '.join(sorted(known))}")
    cells = d.get("cells") or {}
    vary = d.get("vary") or {}
    if not isinstance(cells, dict) or any(not isinstance(v, list) for v in cells.values()):
        raise ConfigError(f"{where}: 'cells' maps each cell name to a list of key=value overrides")
    if not isinstance(vary, dict) or any(not isinstance(v, list) or not v for v in vary.values()):
        raise ConfigError(f"{where}: 'vary' maps config keys to non-empty lists of values")
    ov = d.get("overrides") or []
    if not isinstance(ov, list):
        raise ConfigError(f"{where}: 'overrides' is a list of key=value strings")
    seeds = d.get("seeds", [0, 1, 2])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = list(range(seeds))
    if not isinstance(seeds, list):
        raise ConfigError(f"{where}: 'seeds' is a count or a list of integers")
    if d.get("reference") is not None and not isinstance(d["reference"], str):
        raise ConfigError(f"{where}: 'reference' is one cell name, got {d['reference']!r}")
    orderings, paper = d.get("orderings") or [], d.get("paper") or {}
    if not isinstance(orderings, list):
        raise ConfigError(f"{where}: 'orderings' is a list of 'A < B' claims")
    if not isinstance(paper, dict):
        raise ConfigError(f"{where}: 'paper' maps cell names to the figure shown beside them")
    spec = GridSpec(
        str(d.get("base", "demo")),
        [str(x) for x in ov],
        seeds,
        {str(k): [str(x) for x in v] for k, v in cells.items()},
        {str(k): v for k, v in vary.items()},
        d.get("reference"),
        [str(x) for x in orderings],
        {str(k): str(v) for k, v in paper.items()},
    )
    try:
        return spec.validate()
    except ConfigError as e:  # name the file the spec came from (GR1)
        raise ConfigError(f"{where}: {e}") from None


def load_spec(path: str | Path) -> GridSpec:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"grid spec {p} does not exist; write a YAML/JSON spec (see 'replaid grid plan --help')")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"grid spec {p} is not UTF-8 text; save it as UTF-8") from None
    if p.suffix == ".json":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"grid spec {p} line {e.lineno}: not valid JSON ({e.msg}); fix its syntax") from None
    else:
        import yaml

        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"grid spec {p} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None
    return spec_from_dict(d, f"grid spec {p}")


@dataclass
class GridRun:
    id: str  # <cell>__s<seed>
    cell: str
    seed: int
    overrides: list[str]  # the run's overrides after the base (spec overrides, cell, seed)
    run_dir: str  # relative to the grid folder
    config: str  # relative path of its resolved config JSON


def resolve_base(base: str, overrides: list[str]) -> RunConfig:
    """The base config: a preset, or the config file of a run (JSON) or a YAML of sections, then overrides."""
    from replaid.presets import PRESETS, resolve

    if base in PRESETS:
        return resolve(base, None, overrides)
    p = Path(base)
    if p.is_file() and p.suffix == ".json":
        from replaid.config import set_key

        try:
            cfg = RunConfig.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except json.JSONDecodeError as e:
            raise ConfigError(f"grid base {p} line {e.lineno}: not valid JSON ({e.msg})") from None
        except (ConfigError, UnicodeDecodeError) as e:
            raise ConfigError(f"grid base {p} is not a run config ({e}); fix it or name a preset") from None
        for k, v in parse_overrides(overrides):
            set_key(cfg, k, v)
        return cfg.validate()
    if p.is_file():
        return resolve(None, str(p), overrides)
    raise ConfigError(f"grid base '{base}' is neither a preset nor a config file; see 'replaid presets'")


def plan(spec: GridSpec) -> list[tuple[GridRun, RunConfig]]:
    """Every (cell, seed) run with its resolved, validated config (cell-major, then seed)."""
    spec.validate()
    out = []
    for cell, cov in spec.cell_overrides().items():
        for s in spec.seeds:
            ov = [*spec.overrides, *cov, f"train.seed={s}"]
            try:
                cfg = resolve_base(spec.base, ov)
            except ConfigError as e:
                raise ConfigError(f"grid cell '{cell}': {e}") from None
            rid = f"{cell}__s{s}"
            out.append((GridRun(rid, cell, s, ov, f"runs/{rid}", f"configs/{rid}.json"), cfg))
    return out


# ------------------------------------------------------------------ the report


def run_value(final_eval: dict[str, Any]) -> tuple[float, str, float | None]:
    """(bound in nats/token, its kind, unigram NLL of the same tokens) from a run's final evaluation."""
    ev = final_eval.get("eval", final_eval)
    if "nll_nats_per_token" in ev:
        return float(ev["nll_nats_per_token"]), "exact NLL", ev.get("unigram_nats_per_token")
    return float(ev["nelbo_nats_per_token"]), "NELBO", ev.get("unigram_nats_per_token")


def report(
    rows: list[dict[str, Any]],
    reference: str | None = None,
    confidence: float = 0.95,
    cell_order: list[str] | None = None,
    orderings: list[str] | None = None,
    paper: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``rows``: one per finished run, ``{cell, seed, value, kind, unigram, split, config?}``.
    Returns the JSON-able report: one entry per cell (``config``, ``seeds``, ``values``, ``mean``,
    ``sd``, interval, distance below unigram, plateau flag, paired difference against ``reference``),
    and each claim of ``orderings`` ("A < B") as the paired difference A - B over shared seeds: it
    *holds* when the interval lies below 0, is *reversed* when above, else *not determined*."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not math.isfinite(r["value"]):
            raise ValueError(
                f"grid run {r['cell']} seed {r['seed']} has a non-finite bound ({r['value']}); "
                f"look at its run folder before reporting"
            )
        by_cell.setdefault(r["cell"], []).append(r)
    order = [c for c in (cell_order or []) if c in by_cell] + sorted(c for c in by_cell if c not in (cell_order or []))
    if reference is not None and reference not in by_cell:
        raise ConfigError(f"reference cell '{reference}' has no finished run; choose one of {', '.join(order)}")
    summaries = {}
    for c in order:
        rs = sorted(by_cell[c], key=lambda r: r["seed"])
        summaries[c] = CellSummary(
            c,
            {r["seed"]: r["value"] for r in rs},
            {r["seed"]: float(r["unigram"]) for r in rs if r.get("unigram") is not None},
            confidence,
        )
    cells = []
    for c in order:
        s, rs = summaries[c], by_cell[c]
        iv, bu = s.interval, s.below_unigram
        entry: dict[str, Any] = {
            "cell": c,
            "config": rs[0].get("config", {}),
            "kind": rs[0]["kind"],
            "split": rs[0].get("split"),
            "seeds": sorted(s.values),
            "values": [s.values[k] for k in sorted(s.values)],
            "mean": iv.mean,
            "sd": iv.sd,
            "lo": iv.lo,
            "hi": iv.hi,
            "n": iv.n,
            "ppl": math.exp(iv.mean) if math.isfinite(iv.mean) and iv.mean < 700 else None,
            "unigram_mean": (sum(s.unigram.values()) / len(s.unigram)) if s.unigram else None,
            "below_unigram": bu.mean if bu else None,
            "below_unigram_lo": bu.lo if bu else None,
            "below_unigram_hi": bu.hi if bu else None,
            "on_plateau": s.on_plateau,
            "paper": (paper or {}).get(c),
            **exit_summary(sorted(rs, key=lambda r: r["seed"]), confidence),
        }
        if reference is not None and c != reference:
            entry["paired"] = paired_difference(
                c, s.values, reference, summaries[reference].values, confidence
            ).as_dict()
        cells.append(entry)
    checks = []
    for claim in orderings or []:
        a, b = parse_ordering(claim)
        if a not in summaries or b not in summaries:
            checks.append({"claim": claim, "lower": a, "higher": b, "verdict": "no runs", "seeds": []})
            continue
        p = paired_difference(a, summaries[a].values, b, summaries[b].values, confidence)
        verdict = {"lower": "holds", "higher": "reversed"}.get(p.verdict, "not determined")
        if any(summaries[c].on_plateau for c in (a, b)):
            verdict += " (a cell is on the plateau)"
        checks.append({"claim": claim, "lower": a, "higher": b, **p.as_dict(), "verdict": verdict})
    return {
        "reference": reference,
        "confidence": confidence,
        "plateau_nats": PLATEAU_NATS,
        "cells": cells,
        "orderings": checks,
    }


def exit_summary(rows: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """A cell's plateau-exit steps (:func:`replaid.eval.seeds.plateau_exit`, one per seed, None where a
    seed has not left the plateau) and their t-interval, given only when every seed has left (a mean over
    the seeds that left would hide the others). Empty when the rows carry no exit (older callers)."""
    if not any("plateau_exit" in r for r in rows):
        return {}
    exits = [r.get("plateau_exit") for r in rows]
    left = [int(x) for x in exits if x is not None]
    iv = t_interval(left, confidence) if left and len(left) == len(exits) else None
    return {
        "plateau_exits": exits,
        "plateau_not_left": len(exits) - len(left),
        "plateau_exit_mean": iv.mean if iv else None,
        "plateau_exit_lo": iv.lo if iv and iv.n >= 2 else None,
        "plateau_exit_hi": iv.hi if iv and iv.n >= 2 else None,
    }


def _exit_cell(c: dict[str, Any]) -> str:
    if "plateau_exits" not in c:
        return "n/a"
    per = " ".join("-" if x is None else str(x) for x in c["plateau_exits"])
    if c["plateau_not_left"]:
        return f"{per} ({c['plateau_not_left']} not left)"
    if c["plateau_exit_lo"] is None:
        return per
    return f"{per}: {c['plateau_exit_mean']:.0f} [{c['plateau_exit_lo']:.0f}, {c['plateau_exit_hi']:.0f}]"


def report_markdown(rep: dict[str, Any], title: str = "Grid report", command: str | None = None) -> str:
    conf = int(round(100 * rep["confidence"]))
    ref = rep["reference"]
    L = [f"# {title}", ""]
    if command:
        L += ["```bash", command, "```", ""]
    L += [
        f"Bound: nats/token on the evaluation split (exact NLL for AR, NELBO otherwise). Intervals: {conf}% "
        f"Student-t over seeds (training noise, not the evaluation's standard error). Below unigram: the "
        f"unigram NLL of the same tokens minus the bound; a cell less than {rep['plateau_nats']} nats below is "
        f"**on the plateau** and is not interpreted. Plateau exit: per seed, the first logged training step "
        f"from which the training bound stays at least {rep['plateau_nats']} nats below the unigram NLL of "
        f"the same training tokens ('-': not left), with its interval when every seed has left.",
        "",
    ]
    has_paper = any(c.get("paper") for c in rep["cells"])
    has_exit = any("plateau_exits" in c for c in rep["cells"])
    head = (
        "| cell |"
        + (" paper |" if has_paper else "")
        + " seeds | per-seed | mean (PPL) | sd | interval | below unigram |"
        + (" plateau exit (step) |" if has_exit else "")
    )
    sep = "|---|" + ("---|" if has_paper else "") + "---|---|---|---|---|---|" + ("---|" if has_exit else "")
    if ref:
        head += f" minus `{ref}` (paired) | verdict |"
        sep += "---|---|"
    L += [head, sep]
    for c in rep["cells"]:
        vals = " ".join(f"{v:.3f}" for v in c["values"])
        bu = (
            "n/a"
            if c["below_unigram"] is None
            else f"{c['below_unigram']:.3f}" + (" **plateau**" if c["on_plateau"] else "")
        )
        ppl = f" ({c['ppl']:.1f})" if c["ppl"] else ""
        row = (
            f"| {c['cell']} |"
            + (f" {c.get('paper') or ''} |" if has_paper else "")
            + f" {c['n']} | {vals} | {c['mean']:.3f}{ppl} | {_f(c['sd'])} | "
            f"[{_f(c['lo'])}, {_f(c['hi'])}] | {bu} |" + (f" {_exit_cell(c)} |" if has_exit else "")
        )
        if ref:
            if "paired" in c:
                p = c["paired"]
                row += f" {p['diff_mean']:+.3f} [{_f(p['diff_lo'], '+.3f')}, {_f(p['diff_hi'], '+.3f')}] | {p['verdict']} |"
            else:
                row += " (reference) | |"
        L.append(row)
    if rep.get("orderings"):
        L += [
            "",
            f"Orderings (A < B: A's bound is lower). A - B paired over shared seeds, {conf}% t-interval: "
            f"*holds* when it lies below 0, *reversed* when above, else *not determined*.",
            "",
            "| claim | seeds | A - B | interval | verdict |",
            "|---|---|---|---|---|",
        ]
        for o in rep["orderings"]:
            if o["verdict"] == "no runs":
                L.append(f"| {o['claim']} | 0 | | | no runs |")
                continue
            L.append(
                f"| {o['claim']} | {len(o['seeds'])} | {o['diff_mean']:+.3f} | "
                f"[{_f(o['diff_lo'], '+.3f')}, {_f(o['diff_hi'], '+.3f')}] | {o['verdict']} |"
            )
    return "\n".join(L) + "\n"


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def plot_report(rep: dict[str, Any], path: Path, title: str = "") -> Path:
    """Every seed as a point, the mean with its interval, the unigram level; paired differences beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = rep["cells"]
    paired = [c for c in cells if "paired" in c]
    exits = [c for c in cells if "plateau_exits" in c]
    ncols = 1 + bool(paired) + bool(exits)
    fig, axes = plt.subplots(
        1, ncols, figsize=(max(6.0, 0.75 * len(cells) + 3) * (1 + 0.6 * (ncols - 1)), 4.2), squeeze=False
    )
    ax = axes[0][0]
    for i, c in enumerate(cells):
        n = len(c["values"])
        xs = [i + 0.12 * (j - (n - 1) / 2) / max(1, n - 1) * 2 for j in range(n)]
        ax.scatter(xs, c["values"], s=14, color="tab:blue", alpha=0.7, zorder=3, label="one seed" if i == 0 else None)
        if c["n"] >= 2:
            ax.errorbar(
                [i + 0.3],
                [c["mean"]],
                yerr=[[c["mean"] - c["lo"]], [c["hi"] - c["mean"]]],
                fmt="o",
                color="black",
                capsize=3,
                zorder=4,
                label=f"mean, {int(100 * rep['confidence'])}% t-interval" if i == 0 else None,
            )
        if c["unigram_mean"] is not None:
            ax.hlines(
                c["unigram_mean"],
                i - 0.35,
                i + 0.4,
                colors="tab:red",
                linestyles="dashed",
                label="unigram (same tokens)" if i == 0 else None,
            )
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c["cell"] for c in cells], rotation=35, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_ylabel("test bound (nats/token)")
    ax.set_title(title or "per-seed bounds", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    if paired:
        ax2 = axes[0][1]
        for i, c in enumerate(paired):
            p = c["paired"]
            ax2.scatter([i] * len(p["diffs"]), p["diffs"], s=14, color="tab:blue", alpha=0.7, zorder=3)
            if math.isfinite(p["diff_lo"]):
                ax2.errorbar(
                    [i + 0.2],
                    [p["diff_mean"]],
                    yerr=[[p["diff_mean"] - p["diff_lo"]], [p["diff_hi"] - p["diff_mean"]]],
                    fmt="o",
                    capsize=3,
                    zorder=4,
                    color="black" if p["verdict"] != "not determined" else "grey",
                )
        ax2.axhline(0, color="black", lw=0.8)
        ax2.set_xlim(-0.6, len(paired) - 0.4)
        ax2.set_xticks(range(len(paired)))
        ax2.set_xticklabels([c["cell"] for c in paired], rotation=35, ha="right", fontsize=8)
        ax2.set_ylabel(f"minus {rep['reference']} (nats/token, same seed)")
        ax2.set_title("paired differences (grey: not determined)")
        ax2.grid(alpha=0.3, axis="y")
    if exits:
        _plot_exits(axes[0][ncols - 1], exits, rep)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_exits(ax: Axes, cells: list[dict[str, Any]], rep: dict[str, Any]) -> None:
    """Plateau-exit steps per seed (a cross at the top: not left), mean and interval when all left."""
    last = max((x for c in cells for x in c["plateau_exits"] if x is not None), default=1)
    for i, c in enumerate(cells):
        xs = c["plateau_exits"]
        ax.scatter(
            [i] * sum(x is not None for x in xs), [x for x in xs if x is not None], s=14, color="tab:blue", zorder=3
        )
        if c["plateau_not_left"]:
            ax.scatter([i] * c["plateau_not_left"], [last * 1.08] * c["plateau_not_left"], marker="x", color="tab:red")
        if c.get("plateau_exit_lo") is not None:
            m = c["plateau_exit_mean"]
            ax.errorbar(
                [i + 0.2],
                [m],
                yerr=[[m - c["plateau_exit_lo"]], [c["plateau_exit_hi"] - m]],
                fmt="o",
                color="black",
                capsize=3,
                zorder=4,
            )
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c["cell"] for c in cells], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("plateau exit (training step)")
    ax.set_title(
        f"first step staying {rep['plateau_nats']} nats below unigram (x: not left)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="y")


def plot_curves(curves: dict[str, dict[int, tuple[list[int], list[float]]]], path: Path, title: str = "") -> Path:
    """Training curves of a grid: ``curves[cell][seed] = (steps, values)``; one colour per cell, a
    thin line per seed and a thick line for the mean over the seeds logged at each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (cell, by_seed) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        at: dict[int, list[float]] = {}
        for steps, vals in by_seed.values():
            ax.plot(steps, vals, color=colour, lw=0.6, alpha=0.35)
            for st, v in zip(steps, vals, strict=True):
                at.setdefault(st, []).append(v)
        xs = sorted(at)
        ax.plot(xs, [sum(at[x]) / len(at[x]) for x in xs], color=colour, lw=1.8, label=f"{cell} ({len(by_seed)})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token; NELBO, AR: NLL)")
    ax.set_title(title or "training curves: mean over seeds (thick), each seed (thin)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# the plateau signatures a grid report draws (replaid.training.signatures), with the schedule's gamma_0
SIGNATURE_PANELS = (
    ("kl_unigram/t0.5", "KL(p_theta || unigram) at t = 0.5"),
    ("attn_entropy/last", "attention entropy, last layer (nats)"),
    ("pos_cosine/last", "cosine between positions, last layer"),
    ("emb_rank", "embedding effective rank"),
    ("emb_min_dist", "embedding min pairwise distance"),
    ("prior_share/t0.5", "output prior's share of logit variance, t = 0.5"),
    ("sc_cosine", "cos(self-conditioning input, clean e), t = 0.5"),
    ("gamma_0", "gamma_0"),
)


def plot_signatures(
    series: dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]],
    exits: dict[str, dict[int, int | None]],
    path: Path,
    title: str = "",
) -> Path:
    """One panel per logged signature (:data:`SIGNATURE_PANELS`): ``series[key][cell][seed] = (steps,
    values)``; one colour per cell, one line style per seed, and each run's plateau exit
    (``exits[cell][seed]``) as a dotted vertical line of its colour and style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, label) for k, label in SIGNATURE_PANELS if series.get(k)]
    cols = 2
    rows = max(1, (len(panels) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.8 * rows), squeeze=False)
    cells = sorted({c for by_cell in series.values() for c in by_cell})
    styles = ["-", "--", ":", "-."]
    for ax, (key, label) in zip(axes.flat, panels, strict=False):
        for i, cell in enumerate(cells):
            for j, (seed, (steps, vals)) in enumerate(sorted(series[key].get(cell, {}).items())):
                ax.plot(steps, vals, color=f"C{i % 10}", ls=styles[j % 4], lw=0.9, label=f"{cell} s{seed}")
                ex = exits.get(cell, {}).get(seed)
                if ex is not None:
                    ax.axvline(ex, color=f"C{i % 10}", ls=":", lw=0.8, alpha=0.6)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if panels:
        axes.flat[0].legend(fontsize=6, ncol=2)
    fig.suptitle(title or "plateau signatures (dotted verticals: each run's plateau exit)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
