"""``replaid zeroshot``: zero-shot perplexities on the MDLM-lineage suite (one table for several runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replaid.commands import NONNEGATIVE, POSITIVE, add_command, check_out, require_finite
from replaid.schema import dumps as strict_dumps

EXAMPLE = """example: replaid zeroshot runs/ar runs/mdlm runs/replaid --datasets wikitext2 ptb --out runs/zeroshot
datasets: wikitext2 wikitext103 ptb lambada lm1b ag_news pubmed arxiv (local files in --data-dir, else the Hub)"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from replaid.data.zeroshot import SETS

    e = add_command(
        sub, "zeroshot", "Zero-shot perplexity (MDLM-lineage protocol): NELBO bounds, exact NLL for AR.", EXAMPLE
    )
    e.add_argument("runs", nargs="+", help="run directories, exported folders or Hub ids")
    e.add_argument(
        "--datasets",
        nargs="+",
        default=["wikitext2", "ptb"],
        choices=list(SETS),
        help="zero-shot sets to score, each with its protocol split (replaid/data/zeroshot.py)",
    )
    e.add_argument("--split", default=None, help="override each set's protocol split (validation/test)")
    e.add_argument("--data-dir", default="../shared/data/zeroshot", help="local NAME/SPLIT.txt|jsonl files")
    e.add_argument("--batch-size", type=POSITIVE, default=8, help="wrapped rows per forward pass")
    e.add_argument("--max-rows", type=NONNEGATIVE, default=0, help="score only the first N wrapped rows (0 = all)")
    e.add_argument(
        "--t-samples", type=POSITIVE, default=None, help="diffusion times per row (default: the run's eval.t_samples)"
    )
    e.add_argument("--no-ema", action="store_true", help="score the raw weights, not the EMA")
    e.add_argument("--out", default=None, help="folder for zeroshot.json and zeroshot.md")
    e.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.eval.zeroshot import markdown_table, zeroshot_run
    from replaid.store.loading import load_run

    check_out(args.out, protected=tuple(args.runs), names=("zeroshot.json", "zeroshot.md"))
    results: dict[str, dict[str, Any]] = {}
    for path in args.runs:
        r = load_run(path, use_ema=not args.no_ema)
        res = zeroshot_run(
            r, args.datasets, args.data_dir, args.split, args.batch_size, args.max_rows, args.t_samples, progress=True
        )
        require_finite(res, path)
        label = path if path not in results else f"{path} ({len(results)})"
        results[label] = {
            "method": r.cfg.method,
            "checkpoint": str(r.ckpt),
            "step": r.step,
            "weights": "ema" if r.ema_loaded else "raw",
            "datasets": res,
        }
    table = markdown_table(results, args.datasets)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "zeroshot.json").write_text(strict_dumps(results, indent=2) + "\n")
        (out / "zeroshot.md").write_text(table)
    print(strict_dumps(results) if args.json else table, end="" if not args.json else "\n")
    return 0
