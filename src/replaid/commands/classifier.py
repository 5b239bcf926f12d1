"""``replaid classifier train``: a latent classifier for ``replaid sample --guide CLF:LABEL``."""

from __future__ import annotations

import argparse
import sys

from replaid.commands import POSITIVE, SEED, add_command, check_out, float_in
from replaid.config import LR_MAX
from replaid.schema import dumps as strict_dumps

EXAMPLE = (
    "example: replaid classifier train runs/demo --data labelled.jsonl --out clf/question --steps 400\n"
    "         replaid sample runs/demo --guide clf/question:yes --guidance-scale 3"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(sub, "classifier", "Latent classifiers for classifier guidance.", EXAMPLE)
    cs = s.add_subparsers(dest="classifier_cmd", required=True, help="train (has --help)")
    t = add_command(
        cs,
        "train",
        "Train p(label | z_t, gamma) on noisy latents of a run (its embeddings and schedule frozen).",
        EXAMPLE,
    )
    t.add_argument("run", help="run directory or checkpoint directory (RePlaid or Plaid)")
    t.add_argument("--data", required=True, help='JSONL file of {"text": ..., "label": ...} lines')
    t.add_argument("--out", required=True, help="folder for classifier.safetensors + classifier.json")
    t.add_argument("--steps", type=POSITIVE, default=400, help="optimiser steps")
    t.add_argument("--batch-size", type=POSITIVE, default=32, help="windows per step")
    t.add_argument(
        "--lr",
        type=float_in(1e-10, LR_MAX),
        default=2e-3,
        help=f"peak learning rate (cosine decay), in [1e-10, {LR_MAX:g}]",
    )
    t.add_argument("--hidden", type=POSITIVE, default=128, help="classifier width")
    t.add_argument("--seed", type=SEED, default=0, help="seed of the windows, times and noise")
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.store.loading import load_run
    from replaid.training.classifier import ClassifierTrainConfig, read_labelled, save_classifier, train_classifier

    for k in ("steps", "batch_size", "hidden"):
        if getattr(args, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} {getattr(args, k)}: must be >= 1")
    if not args.lr > 0:
        raise ValueError(f"--lr {args.lr}: must be > 0")
    check_out(args.out, protected=(args.run,), names=("classifier.safetensors", "classifier.json"))
    texts, labels = read_labelled(args.data)
    run_ = load_run(args.run, use_ema=True, train_data=False)
    if run_.method.kind.value != "continuous":
        raise ValueError(
            f"a latent classifier needs a continuous run (RePlaid/Plaid); this is a '{run_.method.name}' run"
        )
    cfg = ClassifierTrainConfig(
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, hidden=args.hidden, seed=args.seed
    )
    clf, metrics = train_classifier(run_, texts, labels, cfg, log=lambda m: print(m, file=sys.stderr))
    save_classifier(clf, args.out, run_, cfg, metrics)
    print(strict_dumps({"out": args.out, "labels": clf.labels, **metrics}))
    return 0
