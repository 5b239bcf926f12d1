"""``replaid sample``: generate text from a trained run."""
from __future__ import annotations

import json

from replaid.commands import add_command

EXAMPLE = "example: replaid sample runs/demo --sampler ddpm --steps 64 --num 4 --length 64 --seed 0"


def register(sub) -> None:
    s = add_command(sub, "sample", "Generate text from a trained run.", EXAMPLE)
    s.add_argument("run", help="run directory or checkpoint directory")
    s.add_argument("--sampler", default="ddpm", choices=["ddpm", "ddim", "dpmpp2m", "heun"],
                   help="diffusion sampler (RePlaid/Plaid runs; AR, MDLM and Duo use their own)")
    s.add_argument("--steps", type=int, default=64, help="T, number of sampling steps")
    s.add_argument("--num", type=int, default=4, help="number of samples")
    s.add_argument("--length", type=int, default=None, help="sequence length (default: the run's)")
    s.add_argument("--allow-longer", action="store_true", help="allow --length beyond the run's trained length")
    s.add_argument("--temperature", type=float, default=1.0, help="logit temperature")
    s.add_argument("--score-temperature", type=float, default=1.0, help="Plaid's score temperature")
    s.add_argument("--prompt", default=None, help="text fixed at the start of every sample (default: none)")
    s.add_argument("--infill", default=None, help="START:END[,START:END] spans to fill; needs --context")
    s.add_argument("--context", default=None, help="text whose tokens are kept outside the --infill spans")
    s.add_argument("--batch-size", type=int, default=16, help="samples generated at once")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling noise")
    s.add_argument("--no-self-cond", action="store_true", help="disable self-conditioning while sampling")
    s.add_argument("--trajectory", type=int, default=0, help="record the argmax text every k steps")
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, seconds")
    s.set_defaults(func=run)


def run(args) -> int:
    from replaid.config import SampleConfig
    from replaid.eval.generate import generate
    from replaid.loading import load_run

    run_ = load_run(args.run, use_ema=True, train_data=False)
    L = run_.cfg.data.seq_len if args.length is None else args.length
    SampleConfig(args.steps, args.num, L, args.batch_size, args.temperature, args.score_temperature,
                 args.trajectory).validate(run_.cfg.data.seq_len, args.allow_longer)
    rows = generate(run_, args)
    for r in rows:
        print(json.dumps(r) if args.json else r["text"] + "\n" + "-" * 40)
    return 0
