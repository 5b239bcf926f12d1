"""Compare two grid reports cell by cell and ordering by ordering (``replaid grid report``'s report.json).

Used for issue 33's re-run after the data-order fix: the same protocol, before and after. For every cell
in both reports: each one's seed mean, sd and 95% t-interval, and the change of the mean; for every
ordering in both: the paired difference and verdict before and after, and whether the verdict moved.
Writes ``compare.json`` (every figure the page quotes) and prints a Markdown table.

    python scripts/compare_grids.py docs/results/ablations/grid/report.json \\
        docs/results/ablations/rerun/report.json --out docs/results/ablations/rerun/compare.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    try:
        rep = json.loads(Path(path).read_text())
        return {"cells": {c["cell"]: c for c in rep["cells"]}, "orderings": {o["claim"]: o for o in rep["orderings"]}}
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        print(
            f"replaid: error: {path} is not a grid report.json ({e}); pass the report.json of 'replaid grid report'",
            file=sys.stderr,
        )
        sys.exit(2)


def cell_row(c: dict) -> dict:
    return {k: c[k] for k in ("values", "mean", "sd", "lo", "hi", "n", "below_unigram", "on_plateau")}


def compare(before: dict, after: dict) -> dict:
    cells = {}
    for name in after["cells"]:
        if name in before["cells"]:
            b, a = cell_row(before["cells"][name]), cell_row(after["cells"][name])
            cells[name] = {"before": b, "after": a, "mean_change": a["mean"] - b["mean"], "sd_ratio": a["sd"] / b["sd"]}
    orderings = {}
    for claim, a in after["orderings"].items():
        if claim in before["orderings"]:
            b = before["orderings"][claim]
            keep = ("diffs", "diff_mean", "diff_sd", "diff_lo", "diff_hi", "verdict")
            orderings[claim] = {
                "before": {k: b[k] for k in keep},
                "after": {k: a[k] for k in keep},
                "verdict_moved": a["verdict"] != b["verdict"],
            }
    holm(orderings)
    return {"cells": cells, "orderings": orderings}


def holm(orderings: dict) -> None:
    """Adds to each ordering's ``after`` the two-sided paired t-test p-value of its differences and the
    Holm-adjusted p-value over the orderings compared (family-wise error); ``after["holm_verdict"]`` keeps
    the verdict where the adjusted p is below 0.05, else "not determined"."""
    from scipy import stats

    ps = {}
    for claim, o in orderings.items():
        d = o["after"]["diffs"]
        ps[claim] = float(stats.ttest_1samp(d, 0.0).pvalue) if len(d) >= 2 else 1.0
    m, running = len(ps), 0.0
    for i, (claim, p) in enumerate(sorted(ps.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (m - i) * p))
        a = orderings[claim]["after"]
        a.update(p=p, p_holm=running, holm_verdict=a["verdict"] if running < 0.05 else "not determined")


def markdown(cmp: dict) -> str:
    lines = [
        "| cell | before: mean [95% t] (sd) | after: mean [95% t] (sd) | change of mean | sd after / before |",
        "|---|---|---|---|---|",
    ]
    for name, c in cmp["cells"].items():
        b, a = c["before"], c["after"]
        lines.append(
            f"| {name} | {b['mean']:.3f} [{b['lo']:.3f}, {b['hi']:.3f}] ({b['sd']:.3f}) | "
            f"{a['mean']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}] ({a['sd']:.3f}) | {c['mean_change']:+.3f} | "
            f"{c['sd_ratio']:.2f} |"
        )
    lines += [
        "",
        "| ordering | before: difference [95% t] | verdict | after: difference [95% t] | verdict | moved | after: Holm p | family-wise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim, o in cmp["orderings"].items():
        b, a = o["before"], o["after"]
        lines.append(
            f"| {claim} | {b['diff_mean']:+.3f} [{b['diff_lo']:+.3f}, {b['diff_hi']:+.3f}] | {b['verdict']} | "
            f"{a['diff_mean']:+.3f} [{a['diff_lo']:+.3f}, {a['diff_hi']:+.3f}] | {a['verdict']} | "
            f"{'yes' if o['verdict_moved'] else 'no'} | {a['p_holm']:.3g} | {a['holm_verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path, help="report.json of the first grid")
    p.add_argument("after", type=Path, help="report.json of the second grid")
    p.add_argument("--out", type=Path, help="write compare.json here")
    args = p.parse_args(argv)
    cmp = compare(load(args.before), load(args.after))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(cmp, indent=1) + "\n")
    print(markdown(cmp), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
