"""A scaling fit written out: ``fit.json``, ``report.md`` and the plots (``replaid scaling fit``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from replaid.scaling import plots
from replaid.scaling.fit import crossover_text, fit_points, fmt, fmt_ci, fmt_loo, fmt_n_opt, read_sources
from replaid.schema import dumps as strict_dumps


def fit_source(
    source: str | Path | Sequence[str | Path],
    reference: str = "ar",
    n_boot: int = 1000,
    seed: int = 0,
    crossover: Sequence[str] | None = None,
    out: Path | None = None,
    slice_params: float | None = None,
) -> dict[str, Any]:
    """Read one or several sources (sweep folders, CSVs), fit, and write ``fit.json``, ``report.md``
    and the PNG plots into ``out``."""
    if n_boot < 0:
        raise ValueError("--bootstrap must be >= 0")
    rows, notes = read_sources(source)
    res = fit_points(
        rows,
        reference,
        n_boot,
        seed,
        # two method names (the CLI's --crossover takes nargs=2); tuple() of a Sequence types as tuple[str, ...]
        cast("tuple[str, str]", tuple(crossover)) if crossover else None,
        n_boot_parametric=min(n_boot, 100),
    )
    res["warnings"] += notes
    source = source if isinstance(source, (str, Path)) else " + ".join(map(str, source))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fit.json").write_text(strict_dumps(res, indent=1))
        res["plots"] = plots.plot_all(res, out, slice_params)
        (out / "report.md").write_text(report_markdown(res, str(source)))
        (out / "fit.json").write_text(strict_dumps(res, indent=1))
    return res


def report_markdown(res: dict[str, Any], source: str) -> str:
    ref = res["reference"]
    L = [
        f"# Scaling-law fit of `{source}`",
        "",
        f"Reference: **{ref}**. Budgets: {', '.join(f'{b:.3g}' for b in res['budgets'])} FLOPs. Natural logs. "
        f"Intervals: 95% bootstrap ({res['n_boot']} replicates); its noise per method:",
        "",
    ]
    L += [f"- {m}: {mo['noise']}" for m, mo in res["methods"].items()] + [""]
    if res["warnings"]:
        L += ["## Warnings", ""] + [f"- {w}" for w in res["warnings"]] + [""]
    L += [
        "## Power laws and multipliers",
        "",
        f"| method | alpha (L*) | alpha' (N*) | compute multiplier vs {ref} (median; range over budgets) | "
        f"leave one budget out | N* ratio vs {ref} | leave one budget out |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, mo in res["methods"].items():
        cm = (
            f"{fmt(mo['compute_multiplier'])} {fmt_ci(mo['compute_multiplier_ci'])}; "
            f"{fmt(mo['compute_multiplier_range'][0])}-{fmt(mo['compute_multiplier_range'][1])}"
            if "compute_multiplier" in mo
            else "n/a"
        )
        pr = f"{fmt(mo['param_ratio'])} {fmt_ci(mo['param_ratio_ci'])}" if "param_ratio" in mo else "n/a"
        loo = mo.get("leave_one_budget_out")
        L.append(
            f"| {m} | {fmt(mo['alpha'])} {fmt_ci(mo['alpha_ci'])} | {fmt(mo['alpha_prime'])} "
            f"{fmt_ci(mo['alpha_prime_ci'])} | {cm} | {fmt_loo(loo, 'compute_multiplier')} | {pr} | "
            f"{fmt_loo(loo, 'param_ratio')} |"
        )
    L += _loo_section(res)
    L += [
        "",
        "## IsoFLOP minima",
        "",
        "A minimum enters the laws when it is bracketed and past the unigram level. An *edge minimum* "
        "(the best run is the smallest or largest size) bounds N* only: the bound is shown, and the "
        "quadratic's vertex, which the laws use when it is bracketed, in parentheses.",
        "",
        "| method | C | sizes | seeds | N* | L* (nats/token) | bracketed | edge minimum | past unigram | in the laws "
        "| noise |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    yn: Callable[[object], str] = lambda x: "yes" if x else "**no**"
    for m, mo in res["methods"].items():
        for q in mo["budgets"]:
            past = not q.get("at_unigram_level", False)
            k = q.get("seeds", [1, 1])
            L.append(
                f"| {m} | {q['budget']:.3g} | {q['sizes']} | {k[0] if k[0] == k[1] else f'{k[0]}-{k[1]}'} | "
                f"{fmt_n_opt(q)} | {fmt(q['loss_opt'], 4)} {fmt_ci(q['loss_opt_ci'], 4)} | {yn(q['bracketed'])} | "
                f"{'**' + q['edge_minimum'] + '**' if q.get('edge_minimum') else 'no'} | {yn(past)} | "
                f"{yn(q['bracketed'] and past)} | {q.get('noise', '')} |"
            )
    L += _parametric_section(res)
    L += _crossover_section(res)
    L += [
        "",
        "## Every run",
        "",
        "| method | C | size | seed | N | tokens | loss (nats/token) | unigram |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(res["points"], key=lambda r: (r["budget"], list(res["methods"]).index(r["method"]), r["params"])):
        se = f" +- {r['stderr']:.4f}" if r.get("stderr") else ""
        L.append(
            f"| {r['method']} | {r['budget']:.3g} | {r.get('size', '')} | {r.get('seed', 0)} | {r['params']:,.0f} | "
            f"{fmt(r.get('tokens'))} | {r['loss']:.4f}{se} | {fmt(r.get('unigram'), 4)} |"
        )
    if res.get("plots"):
        L += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in res["plots"]]
    return "\n".join(L) + "\n"


def _parametric_section(res: dict[str, Any]) -> list[str]:
    """Markdown: each method's L(N, D) fit, a degenerate one marked."""
    L: list[str] = []
    L += [
        "",
        "## Parametric L(N, D) = E + A / N^a + B / D^b",
        "",
        "A fit with a parameter that its box decides (on a bound, in the best fit or in one as good) is "
        "**degenerate**: its numbers are the box's, and nothing is concluded from it.",
        "",
        "| method | E | A | a | B | b | degenerate |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, mo in res["methods"].items():
        p = mo.get("parametric")
        if p:
            deg = f"**yes**: {'; '.join(p['at_bound'])}" if p.get("degenerate") else "no"
            L.append(
                f"| {m} | {fmt(p['E'])} {fmt_ci(p['E_ci'])} | {fmt(p['A'])} | {fmt(p['a'])} {fmt_ci(p['a_ci'])} | "
                f"{fmt(p['B'])} | {fmt(p['b'])} {fmt_ci(p['b_ci'])} | {deg} |"
            )
    return L


def _crossover_section(res: dict[str, Any]) -> list[str]:
    """Markdown: the over-training crossover's verdict and line (none when it was not fitted)."""
    L: list[str] = []
    cx = res.get("crossover")
    if not cx:
        return L
    a, b = cx["methods"]
    L += ["", f"## Over-training crossover ({a} vs {b})", "", f"**Verdict**: {crossover_text(cx)}.", ""]
    if "mult_a_median" in cx:
        L.append(
            f"At equal size N and equal training compute, {a} at **{cx['mult_a_median']:.3g}x** its own "
            f"compute-optimal compute {fmt_ci(cx['mult_a_ci'])} matches {b} at **{cx['mult_b_median']:.3g}x** "
            f"{fmt_ci(cx['mult_b_ci'])} (medians over N; bootstrap replicates with a crossing: "
            f"{cx.get('boot_found')})."
        )
    if cx.get("verdict") != "not determined":
        L += ["", "| N | C_x | x optimal " + a + " | x optimal " + b + " |", "|---|---|---|---|"]
    for e in cx["line"] if cx.get("verdict") != "not determined" else []:
        L.append(f"| {e['params']:.3g} | {fmt(e.get('flops'))} | {fmt(e.get('mult_a'))} | {fmt(e.get('mult_b'))} |")
    return L


def _loo_section(res: dict[str, Any]) -> list[str]:
    """Markdown: each method's N* ratio and compute multiplier with each budget left out in turn."""
    ref = res["reference"]
    edges = {  # edge minima whose vertex enters the laws
        (m, q["budget"])
        for m, mo in res["methods"].items()
        for q in mo["budgets"]
        if q.get("edge_minimum") and q["bracketed"] and not q.get("at_unigram_level")
    }
    L = ["", "### Leave one budget out"]
    for m, mo in res["methods"].items():
        loo = mo.get("leave_one_budget_out")
        if not loo:
            continue
        if not loo["computed"]:
            L += ["", f"- {m}: {loo['reason']}."]
            continue
        L += [
            "",
            f"{m} vs {ref} (all budgets: N* ratio {fmt(mo['param_ratio'])}, multiplier {fmt(mo['compute_multiplier'])}):",
            "",
            "| budget left out | N* ratio | compute multiplier | note |",
            "|---|---|---|---|",
        ]
        for d in loo["drops"]:
            note = ", ".join(f"edge minimum of {x} (in its laws)" for x in (m, ref) if (x, d["dropped"]) in edges)
            L.append(f"| {d['dropped']:.3g} | {fmt(d['param_ratio'])} | {fmt(d['compute_multiplier'])} | {note} |")
    return L + [""]
