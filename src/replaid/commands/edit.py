"""``replaid edit``: SDEdit -- noise a text to time s and run the reverse process from there."""

from __future__ import annotations

import argparse

from replaid.commands import POSITIVE, SEED, STEPS, add_command, float_in
from replaid.commands.sample import GUIDANCE, add_guidance_args, request_values
from replaid.sampling.names import SAMPLER_NAMES
from replaid.schema import dumps as strict_dumps

EXAMPLE = (
    "example: replaid edit runs/demo --text 'To be, or not to be, that is the question.' --strength 0.5\n"
    "         replaid edit runs/demo --text 'To be, or not to be, that is the question.' --strength 0.8 --span 10:25"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(
        sub,
        "edit",
        "Edit a text with a continuous run (SDEdit): re-noise it to time s, then denoise.",
        EXAMPLE,
        description="Edit a text (SDEdit): embed it, noise it to the level of time s (--strength) and run the "
        "reverse process from there. s = 0 returns the text unchanged; s = 1 is a fresh sample (keeping the "
        "text outside --span). With --span/--token-span only those spans are re-noised; the rest is kept.",
    )
    s.add_argument("run", help="run directory or checkpoint directory (RePlaid or Plaid)")
    s.add_argument("--text", required=True, help="the text to edit")
    s.add_argument("--strength", type=float_in(0, 1), default=0.5, help="s in [0, 1]: how far to re-noise")
    s.add_argument("--span", default=None, metavar="A:B[,C:D]", help="character spans to edit (default: all)")
    s.add_argument("--token-span", default=None, metavar="A:B[,C:D]", help="token-position spans to edit")
    s.add_argument("--sampler", default=None, choices=SAMPLER_NAMES, help="continuous sampler (default: ddpm)")
    s.add_argument("--steps", type=STEPS, default=64, help="T for a full run; an edit takes ceil(s T) steps")
    s.add_argument("--num", type=POSITIVE, default=1, help="number of edits")
    s.add_argument("--batch-size", type=POSITIVE, default=16, help="edits generated at once")
    s.add_argument("--seed", type=SEED, default=0, help="seed of the sampling noise")
    s.add_argument("--allow-longer", action="store_true", help="allow a text longer than the run's trained length")
    s.add_argument("--no-self-cond", action="store_true", help="disable self-conditioning while sampling")
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, strength")
    s.add_argument(
        "--raw",
        action="store_true",
        help="print the decoded text as it is (default: control characters and U+FFFD as \\x13, \\ufffd)",
    )
    add_guidance_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.sampling.display import visible
    from replaid.sampling.generate import generate
    from replaid.sampling.request import SampleRequest
    from replaid.store.loading import load_run

    req = SampleRequest(
        sampler=args.sampler,
        steps=args.steps,
        num=args.num,
        batch_size=args.batch_size,
        allow_longer=args.allow_longer,
        seed=args.seed,
        self_cond=not args.no_self_cond,
        edit=args.text,
        strength=args.strength,
        edit_chars=args.span,
        edit_span=args.token_span,
        progress=False,
        **request_values(args, GUIDANCE),
    )
    run_ = load_run(args.run, use_ema=True, train_data=False)
    for r in generate(run_, req):
        print(strict_dumps(r) if args.json else visible(r["text"], args.raw) + "\n" + "-" * 40)
    return 0
