"""``replaid sample``: generate text from a trained run."""
from __future__ import annotations

import json

from replaid.commands import add_command

EXAMPLE = ("example: replaid sample runs/demo --sampler ddpm --steps 64 --num 4 --length 64 --seed 0\n"
           "         replaid sample runs/demo --context 'Return the [MASK:6] of the list.' --show-positions\n"
           "         replaid sample runs/demo --context 'Return the value of the list.' --infill-chars 11:16")


def register(sub) -> None:
    s = add_command(sub, "sample", "Generate text from a trained run.", EXAMPLE)
    s.add_argument("run", help="run directory or checkpoint directory")
    s.add_argument("--sampler", default=None, choices=["ddpm", "ddim", "dpmpp2m", "heun"],
                   help="diffusion sampler of RePlaid/Plaid runs (default: ddpm); AR, MDLM and Duo runs have "
                        "their own ancestral sampler and refuse this option")
    s.add_argument("--steps", type=int, default=64, help="T, number of sampling steps")
    s.add_argument("--num", type=int, default=4, help="number of samples")
    s.add_argument("--length", type=int, default=None,
                   help="sequence length (default: the run's data.seq_len; with --context, the context's)")
    s.add_argument("--allow-longer", action="store_true", help="allow --length beyond the run's trained length")
    s.add_argument("--temperature", type=float, default=1.0, help="logit temperature")
    s.add_argument("--score-temperature", type=float, default=1.0, help="Plaid's score temperature")
    s.add_argument("--prompt", default=None, help="text fixed at the start of every sample (default: none)")
    s.add_argument("--context", default=None,
                   help="infilling: text whose tokens are kept; mark what to fill with [MASK:N] (N tokens) in it, "
                        "or with --infill-chars / --infill")
    s.add_argument("--infill-chars", default=None, metavar="A:B[,C:D]",
                   help="character spans of --context to fill (each by as many tokens as it holds)")
    s.add_argument("--infill", default=None, metavar="A:B[,C:D]",
                   help="token-position spans of --context to fill (see --show-positions)")
    s.add_argument("--show-positions", action="store_true",
                   help="print the context's token positions (stderr) and mark filled spans [[like this]]")
    s.add_argument("--batch-size", type=int, default=16, help="samples generated at once")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling noise")
    s.add_argument("--no-self-cond", action="store_true", help="disable self-conditioning while sampling")
    s.add_argument("--trajectory", type=int, default=0, help="record the argmax text every k steps")
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, seconds")
    s.set_defaults(func=run)


def run(args) -> int:
    import sys

    from replaid.config import SampleConfig
    from replaid.eval.generate import check_sample_args, generate
    from replaid.loading import load_run

    run_ = load_run(args.run, use_ema=True, train_data=False)
    plan = check_sample_args(run_, args)
    L = len(plan.ids) if plan is not None else run_.cfg.data.seq_len if args.length is None else args.length
    SampleConfig(args.steps, args.num, L, args.batch_size, args.temperature, args.score_temperature,
                 args.trajectory).validate(run_.cfg.data.seq_len, args.allow_longer)
    if args.show_positions:
        if plan is None:
            raise ValueError("--show-positions shows an infilling request's positions: give --context")
        print(plan.describe(run_.tokenizer), file=sys.stderr)
    rows = generate(run_, args)
    for r in rows:
        text = r["marked"] if args.show_positions and "marked" in r else r["text"]
        print(json.dumps(r) if args.json else text + "\n" + "-" * 40)
    return 0
