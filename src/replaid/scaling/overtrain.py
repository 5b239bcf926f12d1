"""The over-training crossover, measured (the paper's over-training figure).

Two methods at one model size, each trained at multiples of its own compute-optimal budget C*_m (1x,
3x, 10x, ... as far as the corpus allows), several seeds per budget. The paper's statistic is the point
where the two loss-against-FLOPs curves cross: there the over-training factors f_A = C_x / C*_A and
f_B = C_x / C*_B give equal losses (the paper: RePlaid at 3.1x matches MDLM at 6.9x, at 66M parameters).

Method B is compared with A at A's budgets inside B's range of FLOPs. Each seed's curve of B is
interpolated linearly in log FLOPs, and the difference A - B is paired by seed (the same ``train.seed``:
the same data order) with a Student-t interval. The crossover is where the mean difference changes
sign, interpolated in log FLOPs; without a sign change it is "not reached" in the range compared, and
the verdict of the last comparable budget says which side the curves are on there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from replaid.eval.seeds import PLATEAU_NATS, t_interval


def _curve(rows: list[dict[str, Any]], method: str) -> dict[int, list[tuple[float, float]]]:
    """seed -> [(FLOPs, loss)] sorted by FLOPs."""
    out: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if r["method"] == method:
            out.setdefault(int(r.get("seed", 0)), []).append((float(r["flops"]), float(r["loss"])))
    return {s: sorted(v) for s, v in out.items()}


def interp_log(points: list[tuple[float, float]], flops: float) -> float | None:
    """The loss at ``flops`` on the piecewise-linear curve in log FLOPs through ``points``; None outside."""
    xs = [math.log(f) for f, _ in points]
    x = math.log(flops)
    if not points or x < xs[0] - 1e-12 or x > xs[-1] + 1e-12:
        return None
    return float(np.interp(x, xs, [loss for _, loss in points]))


def budgets(
    rows: list[dict[str, Any]], method: str, optimum: float, corpus_tokens: float | None, confidence: float
) -> list[dict[str, Any]]:
    """Per budget of ``method``: FLOPs (mean over seeds), factor = FLOPs / C*, passes, the seeds' losses,
    their mean and t-interval."""
    by: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        if r["method"] == method:
            by.setdefault(round(math.log10(float(r["flops"])), 3), []).append(r)
    out: list[dict[str, Any]] = []
    for _, rs in sorted(by.items()):
        flops = float(np.mean([r["flops"] for r in rs]))
        losses = [float(r["loss"]) for r in rs]
        iv = t_interval(losses, confidence)
        tokens = float(np.mean([r["tokens"] for r in rs])) if all("tokens" in r for r in rs) else None
        out.append(
            {
                "flops": flops,
                "factor": flops / optimum,
                "tokens": tokens,
                "passes": tokens / corpus_tokens if tokens and corpus_tokens else None,
                "seeds": [int(r.get("seed", 0)) for r in rs],
                "losses": losses,
                **iv.as_dict(),
                "unigram": float(np.mean([r["unigram"] for r in rs])) if all("unigram" in r for r in rs) else None,
            }
        )
        p = out[-1]
        p["below_unigram"] = None if p["unigram"] is None else p["unigram"] - p["mean"]
        p["on_plateau"] = p["below_unigram"] is not None and p["below_unigram"] < PLATEAU_NATS
    return out


def compare(rows: list[dict[str, Any]], a: str, b: str, confidence: float = 0.95) -> list[dict[str, Any]]:
    """A - B at each budget of A inside B's FLOPs range: B's seed curve interpolated in log FLOPs, the
    difference paired by seed; a t-interval and a verdict (lower / higher / not determined)."""
    ca, cb = _curve(rows, a), _curve(rows, b)
    seeds = sorted(set(ca) & set(cb))
    out = []
    for flops in sorted({f for s in seeds for f, _ in ca[s]}):
        diffs = []
        for s in seeds:
            la = next((loss for f, loss in ca[s] if math.isclose(f, flops, rel_tol=1e-6)), None)
            lb = interp_log(cb[s], flops)
            if la is not None and lb is not None:
                diffs.append(la - lb)
        if len(diffs) < 2:
            continue
        iv = t_interval(diffs, confidence)
        verdict = "lower" if iv.hi < 0 else "higher" if iv.lo > 0 else "not determined"
        out.append({"flops": flops, "diffs": diffs, **iv.as_dict(), "verdict": verdict})
    return out


def dominance(rows: list[dict[str, Any]], a: str, b: str, confidence: float = 0.95) -> list[dict[str, Any]]:
    """At each budget of A, A - B against B's largest budget at no more FLOPs, paired by seed: where A's
    bound is higher with at least B's compute, A is above B's curve there too, as long as B's bound
    does not rise with compute (model-free: no interpolation, no extrapolation past B's budgets)."""
    ca, cb = _curve(rows, a), _curve(rows, b)
    seeds = sorted(set(ca) & set(cb))
    out = []
    for flops in sorted({f for s in seeds for f, _ in ca[s]}):
        below = sorted({f for s in seeds for f, _ in cb[s] if f <= flops * (1 + 1e-6)})
        if not below:
            continue
        fb = below[-1]
        diffs = []
        for s in seeds:
            la = next((loss for f, loss in ca[s] if math.isclose(f, flops, rel_tol=1e-6)), None)
            lb = next((loss for f, loss in cb[s] if math.isclose(f, fb, rel_tol=1e-6)), None)
            if la is not None and lb is not None:
                diffs.append(la - lb)
        if len(diffs) < 2:
            continue
        iv = t_interval(diffs, confidence)
        verdict = f"{a} above {b}" if iv.lo > 0 else "not determined"
        out.append({"flops": flops, "b_flops": fb, "diffs": diffs, **iv.as_dict(), "verdict": verdict})
    return out


def crossing(points: list[dict[str, Any]]) -> float | None:
    """FLOPs where the mean difference changes sign (the last change, log-linear between the two
    budgets around it); None without one."""
    at = None
    for p, q in zip(points, points[1:], strict=False):
        if (p["mean"] > 0) != (q["mean"] > 0):
            w = p["mean"] / (p["mean"] - q["mean"])
            at = math.exp(math.log(p["flops"]) + w * (math.log(q["flops"]) - math.log(p["flops"])))
    return at


def overtrain(
    rows: list[dict[str, Any]],
    optimum: dict[str, float],
    a: str,
    b: str,
    corpus_tokens: float | None = None,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The study: each method's budgets, A - B compared both ways, the crossover and its factors."""
    for m in (a, b):
        if m not in optimum:
            raise ValueError(f"no compute-optimal budget given for {m}: pass --optimum {m}=C")
        if not any(r["method"] == m for r in rows):
            raise ValueError(f"no finished run of {m} in the sources")
    per = {m: budgets(rows, m, optimum[m], corpus_tokens, confidence) for m in (a, b)}
    ab = compare(rows, a, b, confidence)
    ba = compare(rows, b, a, confidence)
    flip = {"lower": "higher", "higher": "lower"}  # B - A's verdicts read as A - B's
    swapped = [
        {**p, "mean": -p["mean"], "lo": -p["hi"], "hi": -p["lo"], "verdict": flip.get(p["verdict"], p["verdict"])}
        for p in ba
    ]
    merged = sorted(ab + swapped, key=lambda p: p["flops"])
    x = crossing(merged)
    dom = dominance(rows, a, b, confidence)
    lo = max(min(p["flops"] for p in per[a]), min(p["flops"] for p in per[b]))
    hi = min(max(p["flops"] for p in per[a]), max(p["flops"] for p in per[b]))
    if x is not None:
        verdict = (
            f"{a} crosses {b} at {x:.3g} FLOPs: {a} at {x / optimum[a]:.2g}x its optimum matches {b} at "
            f"{x / optimum[b]:.2g}x its own"
        )
    elif merged:
        last = merged[-1]
        side = "below" if last["mean"] < 0 else "above"
        verdict = (
            f"not reached in {lo:.3g}-{hi:.3g} FLOPs: {a} stays {side} {b} "
            f"(at {last['flops']:.3g}: {last['mean']:+.3f} [{last['lo']:+.3f}, {last['hi']:+.3f}], {last['verdict']})"
        )
    elif lo > hi:
        verdict = "not determined: the two methods' FLOPs ranges do not overlap"
    else:  # the ranges overlap, but no budget has two seeds that both methods ran (a paired difference)
        verdict = (
            f"not determined: the FLOPs ranges overlap at {lo:.3g}-{hi:.3g}, but no budget there has at least 2 "
            f"seeds run by both {a} and {b} (a paired difference needs 2 or more); run more seeds (train.seed)"
        )
    above = [p for p in dom if p["verdict"] != "not determined"]
    if x is None and above:
        p = above[-1]
        verdict += (
            f"; and {a} at {p['flops']:.3g} FLOPs is above {b} at {p['b_flops']:.3g} "
            f"({p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}]), with more compute"
        )
    # the project's rule: a budget on the unigram plateau is not read as a trained model's
    used = {a: {q["flops"] for q in merged} | {q["flops"] for q in above}}
    used[b] = {q["flops"] for q in merged} | {q["b_flops"] for q in above}
    for m in (a, b):
        near = [q for q in per[m] if any(math.isclose(q["flops"], f, rel_tol=1e-6) for f in used[m])]
        flat = [q for q in near if q["on_plateau"]]
        if near and len(flat) == len(near):
            gaps = ", ".join(f"{q['below_unigram']:.3f}" for q in flat)
            verdict = (
                f"not determined: {m} is on the unigram plateau at every budget compared (below the unigram bound "
                f"by {gaps} nats, less than {PLATEAU_NATS}), so the curves are not those of trained models; "
                f"as measured, {verdict}"
            )
            break
        if flat:
            where = ", ".join(f"{q['flops']:.3g}" for q in flat)
            verdict += f"; {m} is on the unigram plateau at {where} FLOPs"
    return {
        "a": a,
        "b": b,
        "optimum": optimum,
        "corpus_tokens": corpus_tokens,
        "confidence": confidence,
        "budgets": per,
        "a_minus_b_at_a": ab,
        "b_minus_a_at_b": ba,
        "overlap": [lo, hi] if lo <= hi else None,
        "a_at_more_compute": dom,
        "crossing_flops": x,
        "factors": None if x is None else {a: x / optimum[a], b: x / optimum[b]},
        "verdict": verdict,
    }


def markdown(res: dict[str, Any], title: str) -> str:
    a, b = res["a"], res["b"]
    lines = [f"# {title}", "", f"Verdict: **{res['verdict']}**.", ""]
    lines += [
        "| method | FLOPs | factor | passes | seeds | bound [interval] | below unigram |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in (a, b):
        for p in res["budgets"][m]:
            passes = "n/a" if p["passes"] is None else f"{p['passes']:.2f}"
            below = "n/a" if p["below_unigram"] is None else f"{p['below_unigram']:.3f}"
            below += " **plateau**" if p["on_plateau"] else ""
            lines.append(
                f"| {m} | {p['flops']:.3g} | {p['factor']:.2f}x | {passes} | {p['n']} | "
                f"{p['mean']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}] | {below} |"
            )
    lines += [
        "",
        f"Paired by seed, the other method's curve interpolated in log FLOPs ({res['confidence']:.0%} t):",
        "",
    ]
    lines += ["| at | FLOPs | difference | interval | verdict |", "|---|---|---|---|---|"]
    for name, key in ((f"{a} − {b}", "a_minus_b_at_a"), (f"{b} − {a}", "b_minus_a_at_b")):
        for p in res[key]:
            lines.append(
                f"| {name} | {p['flops']:.3g} | {p['mean']:+.3f} | [{p['lo']:+.3f}, {p['hi']:+.3f}] | {p['verdict']} |"
            )
    if res["a_at_more_compute"]:
        lines += ["", f"{a} against {b}'s largest budget at no more FLOPs (model-free), paired by seed:", ""]
        lines += [f"| {a} FLOPs | {b} FLOPs | {a} − {b} | interval | verdict |", "|---|---|---|---|---|"]
        for p in res["a_at_more_compute"]:
            lines.append(
                f"| {p['flops']:.3g} | {p['b_flops']:.3g} | {p['mean']:+.3f} | [{p['lo']:+.3f}, {p['hi']:+.3f}] | "
                f"{p['verdict']} |"
            )
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: str | Path, title: str) -> str | Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, m in enumerate((res["a"], res["b"])):
        color = f"C{i}"
        ps = res["budgets"][m]
        for p in ps:
            ax.scatter([p["flops"]] * len(p["losses"]), p["losses"], s=14, color=color, alpha=0.6)
            ax.annotate(
                f"{p['factor']:.1f}x",
                (p["flops"], p["hi"] if math.isfinite(p["hi"]) else max(p["losses"])),
                textcoords="offset points",
                xytext=(0, 5),
                ha="center",
                fontsize=7,
                color=color,
            )
        ax.plot(
            [p["flops"] for p in ps],
            [p["mean"] for p in ps],
            color=color,
            marker="o",
            label=f"{m} (C* = {res['optimum'][m]:.2g})",
        )
        ax.fill_between([p["flops"] for p in ps], [p["lo"] for p in ps], [p["hi"] for p in ps], color=color, alpha=0.15)
    uni = [p["unigram"] for m in (res["a"], res["b"]) for p in res["budgets"][m] if p["unigram"] is not None]
    if uni:
        ax.axhline(float(np.mean(uni)), color="grey", ls="--", lw=1, label="unigram")
    if res["crossing_flops"]:
        ax.axvline(res["crossing_flops"], color="k", lw=1, ls=":", label="crossover")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation bound (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
