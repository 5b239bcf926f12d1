"""How runs leave the unigram plateau, side by side, from their logged training rows (issue 34 §1).

For each run of the chosen grid cells, the logged quantities over the first ``--until`` steps: the
training bound's distance below the unigram NLL of the same tokens (with the plateau margin), the
schedule endpoints gamma_0 and gamma_1, the reconstruction and diffusion terms, the embedding's mean
raw row norm and mean pairwise cosine, each optimiser group's gradient norm, and the adaptive split
B_r. One panel per quantity, one colour per cell, one line style per seed. Writes ``compare.png`` and
``compare.json`` (per run: its plateau exit and every quantity at the ``--at`` steps).

    python scripts/plateau_compare.py runs/rerun [runs/plateau] --cells replaid plaid --until 1000 --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from replaid.eval.seeds import PLATEAU_NATS, plateau_exit
from replaid.scaling.grid import read_grid

BASE = ["below_unigram", "gamma_0", "gamma_1", "recon", "diffusion", "emb_norm", "emb_cosine", "B_r"]
STYLES = ["-", "--", ":", "-."]


def run_rows(run: Path, until: int) -> list[dict]:
    rows: dict[int, dict] = {}
    f = run / "metrics.jsonl"
    for line in f.read_text(errors="replace").splitlines() if f.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and isinstance(r.get("step"), int) and "loss" in r and r["step"] <= until:
            bound = r.get("nelbo", r["loss"])
            if isinstance(r.get("unigram"), (int, float)):
                r["below_unigram"] = r["unigram"] - bound
            rows[r["step"]] = r
    return [rows[s] for s in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "grid",
        type=Path,
        nargs="+",
        help="grid folders (replaid grid plan/run); a run id in a later grid replaces an earlier one's when it has logged rows",
    )
    p.add_argument("--cells", nargs="+", required=True, help="cells to compare")
    p.add_argument("--until", type=int, default=1000, help="last step shown (default 1000)")
    p.add_argument("--at", type=int, nargs="+", default=[100, 250, 500, 1000], help="steps tabulated in the JSON")
    p.add_argument("--out", type=Path, required=True, help="folder for compare.png and compare.json")
    args = p.parse_args(argv)
    if args.until < 1:
        print(f"replaid: error: --until {args.until}: must be >= 1", file=sys.stderr)
        return 2
    data: dict = {}
    known: set[str] = set()
    for grid in args.grid:
        _, entries = read_grid(grid)
        known |= {e.cell for e in entries}
        for e in entries:
            if e.cell in args.cells:
                rows = run_rows(grid / e.run_dir, args.until)
                if rows or e.id not in data:
                    data[e.id] = (e, rows)
    unknown = sorted(set(args.cells) - known)
    if unknown:
        print(
            f"replaid: error: --cells {' '.join(unknown)}: no such cell in {' '.join(map(str, args.grid))}",
            file=sys.stderr,
        )
        return 2
    groups = sorted({k for _, rows in data.values() for r in rows for k in r if k.startswith("grad_norm/")})
    keys = [k for k in BASE + groups if any(k in r for _, rows in data.values() for r in rows)]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncol = 4
    nrow = math.ceil(len(keys) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    colours = {c: f"C{i}" for i, c in enumerate(args.cells)}
    summary: dict = {"until": args.until, "plateau_nats": PLATEAU_NATS, "runs": {}}
    for rid, (e, rows) in data.items():
        steps = [r["step"] for r in rows]
        have = [r for r in rows if "below_unigram" in r]
        exit_step = (
            plateau_exit([r["step"] for r in have], [-r["below_unigram"] for r in have], [0.0] * len(have))
            if have
            else None
        )
        summary["runs"][rid] = {
            "cell": e.cell,
            "seed": e.seed,
            "plateau_exit": exit_step,
            "at": {str(s): {k: r.get(k) for k in keys} for s in args.at for r in rows if r["step"] == s},
        }
        for ax, k in zip(axes.flat, keys, strict=False):
            xs = [s for s, r in zip(steps, rows, strict=True) if isinstance(r.get(k), (int, float))]
            ys = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            ax.plot(xs, ys, color=colours[e.cell], ls=STYLES[e.seed % len(STYLES)], lw=1.1, label=f"{e.cell} s{e.seed}")
    for ax, k in zip(axes.flat, keys, strict=False):
        ax.set_title(k + (" (unigram - bound)" if k == "below_unigram" else ""), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        if k == "below_unigram":
            ax.axhline(PLATEAU_NATS, color="black", lw=0.8, ls="--")
        if k.startswith("grad_norm"):
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"{', '.join(g.name for g in args.grid)}: the first {args.until} steps of {', '.join(args.cells)} (line style = seed)",
        fontsize=10,
    )
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "compare.png", dpi=100)
    plt.close(fig)
    (args.out / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    for rid, s in summary["runs"].items():
        print(f"{rid:24s} plateau exit {s['plateau_exit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
