"""``replaid diagnose``: per-timestep diffusion loss, CE, error rate and the closed-form gamma*."""
from __future__ import annotations

import json
from pathlib import Path

from replaid.commands import add_command, emit

EXAMPLE = "example: replaid diagnose runs/demo --out runs/demo/diagnose --split valid --batches 4 --grid 33"


def register(sub) -> None:
    p = add_command(sub, "diagnose", "Per-timestep loss / CE / error curves and the optimal schedule gamma*.", EXAMPLE,
                    description="Per-timestep loss / CE / error curves and the closed-form optimal "
                                   "schedule gamma* (CSV, PNG plots and a JSON summary).")
    p.add_argument("run", help="run directory or checkpoint directory")
    p.add_argument("--out", required=True, help="folder for curves.csv, gamma_curves.csv, *.png, diagnose.json")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="split evaluated")
    p.add_argument("--batches", type=int, default=4, help="evaluation batches averaged")
    p.add_argument("--batch-size", type=int, default=None, help="evaluation batch size (default: the run's eval.batch_size)")
    p.add_argument("--grid", type=int, default=33, help="points of the t grid in (0, 1)")
    p.add_argument("--no-self-cond", action="store_true", help="predict without self-conditioning")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights, not the EMA")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise draws")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from replaid.eval.diagnostics import diagnose, plot_diagnostics, write_csv
    from replaid.loading import load_run

    if args.batches < 1 or args.grid < 2:
        raise ValueError("--batches must be >= 1 and --grid >= 2")
    r = load_run(args.run, use_ema=not args.no_ema)
    if not hasattr(r.model, "schedule"):
        raise ValueError("diagnose needs a diffusion run with a noise schedule")
    bs = args.batch_size or r.cfg.eval.batch_size
    batches = [b["tokens"] for b in r.data.eval_batches(args.split, bs, args.batches)]
    if not batches:
        raise ValueError(f"the {args.split} split produced no batches")
    sc = bool(getattr(r.model, "self_conditioning", False)) and not args.no_self_cond
    res = diagnose(r.model, batches, grid=args.grid, self_cond=sc, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "curves.csv", res["t"])
    write_csv(out / "gamma_curves.csv", res["gamma"])
    plots = plot_diagnostics(res, out)
    summary = dict(res["summary"], split=args.split, checkpoint=str(r.ckpt), step=r.step,
                   weights="ema" if r.ema_loaded else "raw", files=["curves.csv", "gamma_curves.csv"]
                   + [Path(p).name for p in plots])
    (out / "diagnose.json").write_text(json.dumps(summary, indent=2))
    emit(summary, args.json)
    return 0
