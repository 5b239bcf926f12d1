"""``replaid diagnose``: per-timestep diffusion loss, CE, error rate and the closed-form gamma*."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from replaid.commands import POSITIVE, SEED, add_command, check_out, emit, int_in, run_labels, run_title
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.methods.replaid import ContinuousNet
    from replaid.store.loading import Run

EXAMPLE = (
    "example: replaid diagnose runs/demo --out runs/demo/diagnose --split valid --batches 4 --grid 33\n"
    "         replaid diagnose runs/learned runs/frozen --labels learned frozen --out runs/ce-overlay"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "diagnose",
        "Per-timestep loss / CE / error curves and the optimal schedule gamma*.",
        EXAMPLE,
        description="Per-timestep loss / CE / error curves and the closed-form optimal "
        "schedule gamma* (CSV, PNG plots and a JSON summary). With several runs, "
        "each goes to OUT/<label>/ and ce_overlay.png overlays their CE(t), t and CE "
        "each normalised to [0, 1], with the R^2 of a straight-line fit.",
    )
    p.add_argument("runs", nargs="+", metavar="run", help="run or checkpoint directories")
    p.add_argument("--labels", nargs="+", help="one label per run (default: the run folder names)")
    p.add_argument(
        "--out", required=True, help="folder for curves.csv, gamma_curves.csv, *.png, diagnose.json, ce_overlay.png/csv"
    )
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="split evaluated")
    p.add_argument("--batches", type=POSITIVE, default=4, help="evaluation batches averaged")
    p.add_argument(
        "--batch-size", type=POSITIVE, default=None, help="evaluation batch size (default: the run's eval.batch_size)"
    )
    p.add_argument("--grid", type=int_in(2, 10_000), default=33, help="points of the t grid in (0, 1)")
    p.add_argument("--no-self-cond", action="store_true", help="predict without self-conditioning")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights, not the EMA")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the noise draws")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.eval.diagnostics import ce_overlay, plot_ce_overlay
    from replaid.store.loading import load_run

    check_out(args.out, protected=tuple(args.runs), names=("diagnose.json",))
    labels = run_labels(args.runs, args.labels)
    runs = [load_run(p, use_ema=not args.no_ema) for p in args.runs]  # all inputs checked before writing
    for p, r in zip(args.runs, runs, strict=True):
        if not r.method.kind.continuous:
            raise ValueError(f"{p}: diagnose needs a diffusion run with a noise schedule (RePlaid/Plaid)")
    out = Path(args.out)
    summaries, curves = {}, []
    for label, r in zip(labels, runs, strict=True):
        sub = out if len(runs) == 1 else out / label
        summaries[label], res = _diagnose_one(r, args, sub)
        curves.append((label, res["t"]["t"], res["t"]["ce"]))
    items = ce_overlay(curves)
    plot_ce_overlay(items, out / "ce_overlay.png")
    with open(out / "ce_overlay.csv", "w") as f:
        f.write("label,t_norm,ce_norm\n")
        for it in items:
            f.writelines(f"{it['label']},{a:.6g},{b:.6g}\n" for a, b in zip(it["t"], it["ce"], strict=True))
    if len(runs) == 1:
        emit(summaries[labels[0]], args.json)
        return 0
    overlay = {it["label"]: {"ce_linear_r2": it["r2"], "ce_min": it["ce_min"], "ce_max": it["ce_max"]} for it in items}
    (out / "diagnose.json").write_text(strict_dumps({"runs": summaries, "ce_overlay": overlay}, indent=2))
    emit(overlay, args.json)
    return 0


def _diagnose_one(r: Run, args: argparse.Namespace, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from tqdm.auto import tqdm

    from replaid.eval.diagnostics import diagnose, diagnose_predictions, plot_diagnostics, write_csv

    bs = args.batch_size or r.cfg.eval.batch_size
    batches = [b["tokens"] for b in r.data.eval_batches(args.split, bs, args.batches)]
    if not batches:
        raise ValueError(f"the {args.split} split produced no batches")
    # a bool attribute of the denoiser; nn.Module.__getattr__ types attributes as Tensor | Module
    sc = cast(bool, r.model.self_conditioning) and not args.no_self_cond
    with tqdm(total=len(batches) * diagnose_predictions(args.grid), desc="diagnose", unit="pred") as bar:  # stderr
        # run() refused every run but a continuous one (its method's kind), so the model is a ContinuousNet
        res = diagnose(
            cast("ContinuousNet", r.model), batches, grid=args.grid, self_cond=sc, seed=args.seed, advance=bar.update
        )
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "curves.csv", res["t"])
    write_csv(out / "gamma_curves.csv", res["gamma"])
    plots = plot_diagnostics(res, out, title=f"{run_title(r)}, {args.split}, {res['summary']['tokens']} tokens")
    summary = dict(
        res["summary"],
        split=args.split,
        checkpoint=str(r.ckpt),
        step=r.step,
        weights="ema" if r.ema_loaded else "raw",
        files=["curves.csv", "gamma_curves.csv"] + [Path(p).name for p in plots],
    )
    (out / "diagnose.json").write_text(strict_dumps(summary, indent=2))
    return summary, res
