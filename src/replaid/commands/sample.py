"""``replaid sample``: generate text from a trained run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from replaid.commands import NONNEGATIVE, POSITIVE, SEED, STEPS, add_command, float_in
from replaid.config import GUIDANCE_SCALE_MAX, SCORE_TEMPERATURE_RANGE, TEMPERATURE_RANGE
from replaid.sampling.names import SAMPLER_NAMES

if TYPE_CHECKING:
    from replaid.sampling.request import SampleRequest

EXAMPLE = (
    "example: replaid sample runs/demo --sampler ddpm --steps 64 --num 4 --length 64 --seed 0\n"
    "         replaid sample runs/demo --require ' king' --guidance-scale 2\n"
    "         replaid sample runs/demo --guide clf/question:yes --guidance-scale 3\n"
    "         replaid sample runs/demo --context 'Return the [MASK:6] of the list.' --show-positions\n"
    "         replaid sample runs/demo --context 'Return the value of the list.' --infill-chars 11:16\n"
    "         replaid sample runs/bd3 --prompt 'def main' --max-tokens 512 --stop '\\n\\n' --num 1   (a block run)"
)


def register(sub) -> None:
    s = add_command(sub, "sample", "Generate text from a trained run.", EXAMPLE)
    s.add_argument("run", help="run directory or checkpoint directory")
    s.add_argument(
        "--sampler",
        default=None,
        choices=SAMPLER_NAMES,
        help="sampler (default: the method's first: ddpm for RePlaid/Plaid, ancestral for AR, MDLM and "
        "Duo, which refuse the continuous ones)",
    )
    s.add_argument("--steps", type=STEPS, default=64, help="T, number of sampling steps")
    s.add_argument("--num", type=POSITIVE, default=4, help="number of samples")
    s.add_argument(
        "--length",
        type=POSITIVE,
        default=None,
        help="sequence length (default: the run's data.seq_len; with --context, the context's)",
    )
    s.add_argument("--allow-longer", action="store_true", help="allow --length beyond the run's trained length")
    s.add_argument(
        "--temperature",
        type=float_in(*TEMPERATURE_RANGE, or_zero=True),
        default=1.0,
        help=f"logit temperature: 0 (greedy, the argmax of every draw) or in [{TEMPERATURE_RANGE[0]:g}, "
        f"{TEMPERATURE_RANGE[1]:g}] (below it the draws are greedy to float32 precision: give 0)",
    )
    s.add_argument(
        "--score-temperature",
        type=float_in(*SCORE_TEMPERATURE_RANGE),
        default=1.0,
        help=f"Plaid's score temperature, in [{SCORE_TEMPERATURE_RANGE[0]:g}, {SCORE_TEMPERATURE_RANGE[1]:g}]",
    )
    s.add_argument("--prompt", default=None, help="text fixed at the start of every sample (default: none)")
    s.add_argument(
        "--context",
        default=None,
        help="infilling: text whose tokens are kept; mark what to fill with [MASK:N] (N tokens) in it, "
        "or with --infill-chars / --infill",
    )
    s.add_argument(
        "--infill-chars",
        default=None,
        metavar="A:B[,C:D]",
        help="character spans of --context to fill (each by as many tokens as it holds)",
    )
    s.add_argument(
        "--infill",
        default=None,
        metavar="A:B[,C:D]",
        help="token-position spans of --context to fill (see --show-positions)",
    )
    s.add_argument(
        "--show-positions",
        action="store_true",
        help="print the context's token positions (stderr) and mark filled spans [[like this]]",
    )
    s.add_argument(
        "--max-tokens",
        type=POSITIVE,
        default=None,
        metavar="N",
        help="a completion: at most N tokens after the prompt, cut at the end-of-text token and --stop. A "
        "block-diffusion run (mdlm.block_size) writes block by block, past its data.seq_len with a sliding "
        "window (up to 64 x data.seq_len with the prompt), and streams the text as each block is committed "
        "when a batch holds one sample (--num 1 or --batch-size 1); any other run writes its --length at once "
        "(N at most that less the prompt). Default on a block run: data.seq_len less the prompt",
    )
    s.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="S",
        help="a completion ends before the first S in its text (repeatable; see --max-tokens)",
    )
    s.add_argument(
        "--ignore-eos", action="store_true", help="a completion goes on past the end-of-text token (see --max-tokens)"
    )
    s.add_argument("--batch-size", type=POSITIVE, default=16, help="samples generated at once")
    s.add_argument("--seed", type=SEED, default=0, help="seed of the sampling noise")
    s.add_argument("--no-self-cond", action="store_true", help="disable self-conditioning while sampling")
    s.add_argument("--trajectory", type=NONNEGATIVE, default=0, help="record the argmax text every k steps")
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, seconds, vocab_size")
    add_guidance_args(s)
    s.set_defaults(func=run)


def add_guidance_args(s) -> None:
    """``--require``, ``--guide`` and ``--guidance-scale`` (``replaid sample`` and ``replaid edit``)."""
    s.add_argument(
        "--require",
        action="append",
        default=None,
        metavar="WORD[@P|@A:B]",
        help="token guidance towards samples containing WORD (its own tokens; mind GPT-2's leading space, "
        "' king'), anywhere, starting at token P, or starting in [A, B); repeat for several words",
    )
    s.add_argument(
        "--guide",
        default=None,
        metavar="CLF:LABEL",
        help="classifier guidance towards LABEL with the classifier saved in folder CLF (replaid classifier train)",
    )
    s.add_argument(
        "--guidance-scale",
        type=float_in(0, GUIDANCE_SCALE_MAX),
        default=1.0,
        help="w: adds w * grad log p(y | z_t) to the score (0: unguided, 1: the exact conditional; at most "
        f"{GUIDANCE_SCALE_MAX:g}: beyond it the guidance term alone decides every token)",
    )


def request_of(args) -> SampleRequest:
    """The :class:`~replaid.sampling.request.SampleRequest` of ``replaid sample``'s options."""
    from replaid.sampling.request import SampleRequest

    return SampleRequest(
        sampler=args.sampler,
        steps=args.steps,
        num=args.num,
        batch_size=args.batch_size,
        length=args.length,
        allow_longer=args.allow_longer,
        temperature=args.temperature,
        score_temperature=args.score_temperature,
        seed=args.seed,
        prompt=args.prompt,
        context=args.context,
        infill=args.infill,
        infill_chars=args.infill_chars,
        self_cond=not args.no_self_cond,
        trajectory=args.trajectory,
        require=tuple(args.require or ()),
        guide=args.guide,
        guidance_scale=args.guidance_scale,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop or ()),
        ignore_eos=args.ignore_eos,
    )


def run(args) -> int:
    import sys

    from replaid.sampling.generate import generate
    from replaid.training.loading import load_run

    run_ = load_run(args.run, use_ema=True, train_data=False)
    req = request_of(args)  # validated once, by generate (SampleRequest.check), as the playground's requests are
    if args.show_positions:
        plan = req.check(run_.method, run_.tokenizer, run_.cfg.data.seq_len)
        if plan is None:
            raise ValueError("--show-positions shows an infilling request's positions: give --context")
        print(plan.describe(run_.tokenizer), file=sys.stderr)
    vocab = run_.tokenizer.vocab_size  # in each JSON row: 'replaid quality' checks the ids against it
    if not args.json and (run_.method.block_size() or req.completion) and min(req.num, req.batch_size) == 1:
        return stream(run_, req)
    rows = generate(run_, req)
    for r in rows:
        text = r["marked"] if args.show_positions and "marked" in r else r["text"]
        print(json.dumps({**r, "vocab_size": vocab}) if args.json else text + "\n" + "-" * 40)
    return 0


def stream(run_, req: SampleRequest) -> int:
    """A completion, one sample per batch: each sample's prompt, then its text as each block is committed."""
    import sys

    from replaid.sampling.stream import Completion

    req.progress = False  # the text itself shows the progress
    comp = Completion(run_, req)
    shown = -1
    for deltas in comp:
        for d in deltas:
            if d.index != shown:  # a new sample starts
                if shown >= 0:
                    print("\n" + "-" * 40)
                sys.stdout.write(req.prompt or "")
                shown = d.index
            if d.text:
                sys.stdout.write(d.text)
                sys.stdout.flush()
    print("\n" + "-" * 40)
    return 0
