"""``replaid eval``: a run's per-token NELBO (or exact NLL for AR) and perplexity."""

from __future__ import annotations

import argparse

from replaid.commands import NONNEGATIVE, POSITIVE, add_command, emit, require_finite

EXAMPLE = "example: replaid eval runs/demo --split valid --json"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = add_command(sub, "eval", "Evaluate a run's per-token NELBO (or NLL) bound and perplexity.", EXAMPLE)
    e.add_argument("run", help="run directory or checkpoint directory")
    e.add_argument(
        "--split",
        default=None,
        choices=["train", "valid", "test"],
        help="split evaluated (default: the run's eval.split)",
    )
    e.add_argument(
        "--max-batches",
        type=NONNEGATIVE,
        default=None,
        help="batches evaluated, 0 = the whole split (default: the run's eval.max_batches)",
    )
    e.add_argument(
        "--t-samples",
        type=POSITIVE,
        default=None,
        help="diffusion times per sequence (default: the run's eval.t_samples)",
    )
    e.add_argument(
        "--batch-size",
        type=POSITIVE,
        default=None,
        help="sequences per evaluation batch (default: the run's eval.batch_size)",
    )
    e.add_argument("--no-ema", action="store_true", help="evaluate the raw weights, not the EMA")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.config import apply_cli
    from replaid.eval.evaluate import evaluate_model
    from replaid.store.loading import load_run
    from replaid.training.memory import check_fits, eval_estimate

    run_ = load_run(args.run, use_ema=not args.no_ema)
    cfg = run_.cfg
    apply_cli(
        cfg,
        {
            "--t-samples": ("eval.t_samples", args.t_samples),
            "--max-batches": ("eval.max_batches", args.max_batches),
            "--batch-size": ("eval.batch_size", args.batch_size),
        },
    )
    V = int(run_.method.embedding_rows(run_.model).shape[0])
    n_params = sum(p.numel() for p in run_.model.parameters())
    L, split = cfg.data.seq_len, args.split or cfg.eval.split
    rows = min(cfg.eval.batch_size, len(run_.data.dataset(split)))  # a batch holds at most the whole split
    check_fits(
        f"evaluating the {split} split in batches of {L}-token sequences",
        lambda rows: eval_estimate(cfg, V, n_params, rows, L),
        rows,
        "--batch-size",
        next(run_.model.parameters()).device,
    )  # before the first batch is made
    res = evaluate_model(
        run_.model, run_.method, run_.data, cfg, args.split, None, max_batches=cfg.eval.max_batches, progress=True
    )  # bar on stderr
    require_finite(res, str(run_.ckpt))
    res.update(
        checkpoint=str(run_.ckpt),
        step=run_.step,
        method=cfg.method,
        ema=run_.ema_loaded,
        weights="ema" if run_.ema_loaded else "raw",
    )
    emit(res, args.json)
    return 0
