"""PNG plots of a scaling fit (``replaid.scaling.fit.fit_points`` output): IsoFLOP curves with their minima,
the likelihood and parameter scaling laws (with the crossover's green line), the over-training slice."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from replaid.scaling.fit import parametric_loss

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLORS = {
    "ar": "tab:gray",
    "mdlm": "tab:blue",
    "duo": "tab:orange",
    "replaid": "tab:red",
    "replaid-nosc": "tab:pink",
    "plaid": "tab:purple",
}
GREEN = (80 / 255, 150 / 255, 63 / 255)


def _color(m: str, i: int) -> str:
    return COLORS.get(m, f"C{i}")


def _plain_log_labels(ax: Axes) -> None:
    """Log axes labelled with plain numbers on y (losses span < 1 decade) and no minor x labels."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    for f in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        sf = ScalarFormatter()
        sf.set_scientific(False)
        f(sf)


def _in_laws(q: dict[str, Any]) -> bool:
    """Whether a budget's minimum entered the power laws (bracketed, past the unigram level)."""
    return bool(q["bracketed"] and not q.get("at_unigram_level", False))


def plot_isoflop(res: dict[str, Any], path: Path) -> None:
    plt = _plt()
    methods = list(res["methods"])
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.6), squeeze=False)
    cmap = plt.get_cmap("turbo")
    budgets = res["budgets"]
    span = max(1e-9, math.log(budgets[-1] / budgets[0]))
    for ax, m in zip(axes[0], methods, strict=False):
        pts = [p for p in res["points"] if p["method"] == m]
        for b in budgets:
            col = cmap(0.05 + 0.9 * math.log(b / budgets[0]) / span)
            rs = [p for p in pts if p["budget"] == b]
            if not rs:
                continue
            ns = sorted({p["params"] for p in rs})  # the line: each size's mean log-loss over its seeds
            ys = [math.exp(np.mean([math.log(p["loss"]) for p in rs if p["params"] == n])) for n in ns]
            ax.plot(ns, ys, "o-", color=col, lw=0.5, ms=5, label=f"C={b:.2g}")
            if len(rs) > len(ns):  # seed replicates: every seed as a small dot
                ax.plot([p["params"] for p in rs], [p["loss"] for p in rs], ".", color=col, ms=3)
            sel = [{"params": n} for n in ns]
            q = next((q for q in res["methods"][m]["budgets"] if q["budget"] == b), None)
            if q and q.get("edge_minimum"):  # ring: the best run is at an edge, N* is only bounded
                i = int(np.argmin(ys))
                ax.plot([ns[i]], [ys[i]], "o", ms=11, mfc="none", mew=1.5, color=col)
            if q and q["bracketed"]:  # the fitted parabola where it has a minimum among the sizes
                lo, hi = math.log(sel[0]["params"]), math.log(sel[-1]["params"])
                x = np.linspace(lo - 0.3, hi + 0.3, 100)
                ax.plot(np.exp(x), np.exp(np.polyval(q["quad"], x)), ":", color=col)
                if q["n_opt"] and q["loss_opt"]:  # grey: a minimum the laws leave out
                    ax.plot([q["n_opt"]], [q["loss_opt"]], "x", ms=9, mew=2, color="k" if _in_laws(q) else "0.6")
        uni = [p["unigram"] for p in pts if p.get("unigram")]
        if uni:
            ax.axhline(float(np.median(uni)), ls="--", lw=0.8, color="0.5", label="unigram")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_labels(ax)
        ax.set_title(m)
        ax.set_xlabel("non-embedding parameters N")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("validation loss (nats/token, bound)")
    seen: dict[str, Artist] = {}
    for ax in axes[0]:  # one legend for all panels: every budget of any method
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    order = sorted(seen, key=lambda lab: (lab == "unigram", float(lab[2:]) if lab.startswith("C=") else 0.0))
    fig.legend([seen[k] for k in order], order, loc="center right", fontsize=7)
    fig.suptitle(
        "IsoFLOP curves (dotted: quadratic in log-log where bracketed; x: minimum, grey: left out of the laws;\n"
        "ring: edge minimum, the best run is the smallest or largest size, so N* is only bounded)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.0 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _law_plot(
    res: dict[str, Any], path: Path, key: str, law: tuple[str, str], ylabel: str, title: str, green: bool = False
) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    c = np.array(res["budgets"])
    cg = np.exp(np.linspace(math.log(c.min()) - 0.3, math.log(c.max()) + 0.3, 50))
    for i, (m, mo) in enumerate(res["methods"].items()):
        col = _color(m, i)
        out = [q for q in mo["budgets"] if q[key] and q["bracketed"] and not _in_laws(q)]  # not extrapolated
        if out:
            ax.plot([q["budget"] for q in out], [q[key] for q in out], "x", color=col, alpha=0.35)
        qs = [q for q in mo["budgets"] if q[key] and _in_laws(q)]
        if qs:
            ci = np.array([q[key + "_ci"] for q in qs], dtype=float)
            y = np.array([q[key] for q in qs])
            yerr = np.abs(np.stack([y - ci[:, 0], ci[:, 1] - y])) if np.isfinite(ci).all() else None
            ax.errorbar([q["budget"] for q in qs], y, yerr=yerr, fmt="x", color=col, capsize=3)
        a, b = mo[law[0]], mo[law[1]]
        if a is not None and b is not None:
            lab = f"{m}: {law[0].replace('_prime', chr(39))} = {a:.3f}"
            if "compute_multiplier" in mo and m != res["reference"] and key == "loss_opt":
                lab += f", {mo['compute_multiplier']:.2g}x {res['reference']}"
            if "param_ratio" in mo and m != res["reference"] and key == "n_opt":
                lab += f", N* x{mo['param_ratio']:.2g}"
            ax.plot(cg, np.exp(a * np.log(cg) + b), "--", color=col, lw=0.8)  # extrapolated
            if qs:  # solid over the budgets the law was fitted to
                cf = np.exp(
                    np.linspace(math.log(min(q["budget"] for q in qs)), math.log(max(q["budget"] for q in qs)), 20)
                )
                ax.plot(cf, np.exp(a * np.log(cf) + b), "-", color=col, label=lab)
    if green and res.get("crossover"):
        line = [e for e in res["crossover"]["line"] if "flops" in e]
        if line:
            a_, b_ = res["crossover"]["methods"]
            ax.plot(
                [e["flops"] for e in line],
                [e["params"] for e in line],
                "-",
                color=GREEN,
                lw=2,
                label=f"{a_} = {b_} (equal N, equal C)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    if key == "loss_opt":
        _plain_log_labels(ax)
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_overtraining(res: dict[str, Any], path: Path, n: float | None = None) -> float | None:
    """Loss of the crossover pair at one N as training compute grows (slices of the IsoFLOP plots)."""
    cx = res.get("crossover")
    if not cx:
        return None
    plt = _plt()
    a, b = cx["methods"]
    ns = [e["params"] for e in cx["line"]]
    n = n or float(np.exp(np.mean(np.log(ns))))
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    lo, hi = math.inf, 0.0
    for m in (a, b):
        mo = res["methods"][m]
        copt = math.exp((math.log(n) - mo["beta_prime"]) / mo["alpha_prime"])
        lo, hi = min(lo, copt / 10), max(hi, copt * 30)
    cg = np.exp(np.linspace(math.log(lo), math.log(hi), 200))
    for i, m in enumerate((a, b)):
        mo = res["methods"][m]
        col = _color(m, i)
        ax.plot(cg, parametric_loss(mo["parametric"], n, cg / (mo["kappa"] * n)), "-", color=col, label=f"{m} L(N, C)")
        copt = math.exp((math.log(n) - mo["beta_prime"]) / mo["alpha_prime"])
        ax.axvline(copt, color=col, ls=":", lw=1, label=f"{m} compute-optimal at this N")
        near = [p for p in res["points"] if p["method"] == m and abs(math.log(p["params"] / n)) < 0.15]
        if near:
            ax.plot([p["flops"] for p in near], [p["loss"] for p in near], "o", color=col, ms=4)
    e = min(cx["line"], key=lambda e: abs(math.log(e["params"] / n)))
    if "flops" in e and abs(math.log(e["params"] / n)) < 1e-6:
        ax.axvline(e["flops"], color=GREEN, lw=2, label="crossover")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_labels(ax)
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel("validation loss (fitted L(N, D))")
    title = f"over-training at N = {n:.3g}"
    if cx.get("verdict") == "not determined":  # the curves are drawn, but they support no finding
        title += "\ncrossover not determined: an L(N, D) fit is degenerate"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return n


def plot_all(res: dict[str, Any], out: Path, slice_params: float | None = None) -> list[str]:
    out = Path(out)
    paths = [out / "isoflop.png", out / "likelihood_law.png", out / "param_law.png"]
    plot_isoflop(res, paths[0])
    _law_plot(res, paths[1], "loss_opt", ("alpha", "beta"), "compute-optimal loss L*", "Likelihood scaling law")
    _law_plot(
        res,
        paths[2],
        "n_opt",
        ("alpha_prime", "beta_prime"),
        "compute-optimal size N*",
        "Parameter scaling law",
        green=True,
    )
    if res.get("crossover"):
        # slice at a crossover N so the green line shows
        if slice_params is None:
            line = [e for e in res["crossover"]["line"] if "flops" in e]
            if line:
                slice_params = line[len(line) // 2]["params"]
        if plot_overtraining(res, out / "overtraining.png", slice_params) is not None:
            paths.append(out / "overtraining.png")
    return [str(p) for p in paths]
