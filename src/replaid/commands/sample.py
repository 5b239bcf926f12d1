"""``replaid sample``: generate text from a trained run."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from replaid.commands import add_command, float_in, int_in
from replaid.sampling import request  # torch-free: its fields make the flags
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.sampling.request import Knob, SampleRequest
    from replaid.store.loading import Run

EXAMPLE = (
    "example: replaid sample runs/demo --sampler ddpm --steps 64 --num 4 --length 64 --seed 0\n"
    "         replaid sample runs/demo --require ' king' --guidance-scale 2\n"
    "         replaid sample runs/demo --guide clf/question:yes --guidance-scale 3\n"
    "         replaid sample runs/demo --context 'Return the [MASK:6] of the list.' --show-positions\n"
    "         replaid sample runs/demo --context 'Return the value of the list.' --infill-chars 11:16\n"
    "         replaid sample runs/bd3 --prompt 'def main' --max-tokens 512 --stop '\\n\\n' --num 1   (a block run)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(sub, "sample", "Generate text from a trained run.", EXAMPLE)
    s.add_argument("run", help="run directory or checkpoint directory")
    add_request_args(s)
    s.add_argument(
        "--show-positions",
        action="store_true",
        help="print the context's token positions (stderr) and mark filled spans [[like this]]",
    )
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, seconds, vocab_size")
    s.add_argument(
        "--raw",
        action="store_true",
        help="print the decoded text as it is (default: control characters and U+FFFD as \\x13, \\ufffd)",
    )
    s.set_defaults(func=run)


GUIDANCE = ("require", "guide", "guidance_scale")  # the guidance fields (replaid sample and replaid edit)


def _knobs(names: Collection[str] | None) -> Iterator[tuple[str, Any, Any, Knob]]:
    """(name, type without None, default, :class:`Knob`) of each field of the request that is a flag (of
    ``names``, if given), in the request's order."""
    cls = request.SampleRequest
    types = request.field_types(cls)
    for f in dataclasses.fields(cls):
        k = f.metadata.get(request.KNOB)
        if k is not None and (names is None or f.name in names):
            typ, args = types[f.name], typing.get_args(types[f.name])
            if type(None) in args and len(args) == 2:  # T | None: a T (None is the flag's absence)
                typ = next(a for a in args if a is not type(None))
            yield f.name, typ, f.default, k


def _dest(name: str, typ: Any, default: Any) -> str:
    """Where a field's flag is kept in the parsed options: the field's name; a bool that defaults to True
    (flag ``--no-NAME``), ``no_NAME``."""
    return ("no_" if typ is bool and default else "") + name


def add_request_args(s: argparse.ArgumentParser, names: Collection[str] | None = None) -> None:
    """A flag of each :class:`~replaid.sampling.request.SampleRequest` field declared with
    :func:`~replaid.sampling.request.knob` (of ``names``, if given), built from the field alone: name,
    type, default and :class:`~replaid.sampling.request.Knob` (its help, range, choices, metavar). A new
    such field is a flag of ``replaid sample`` with no change here."""
    for name, typ, default, k in _knobs(names):
        kw: dict[str, Any] = {"help": k.help}
        if k.metavar is not None:
            kw["metavar"] = k.metavar
        if typ is bool:
            kw["action"] = "store_true"  # sets it (default False) or, as --no-NAME, clears it (default True)
        elif typing.get_origin(typ) is tuple and typing.get_args(typ) == (str, ...):
            kw.update(action="append", default=None)  # repeatable: SampleRequest gets a tuple
        elif typ in (int, float, str):
            kw.update(default=default, choices=k.choices)
            if typ is int:
                lo, hi = k.lo, k.hi
                assert isinstance(lo, int | None) and isinstance(hi, int | None), f"{name}: a whole-number range"
                kw["type"] = int_in(lo, hi)
            elif typ is float:
                kw["type"] = float_in(k.lo, k.hi, or_zero=k.or_zero)
        else:
            raise TypeError(f"SampleRequest.{name}: a flag of type {typ} is not supported; see Knob")
        s.add_argument("--" + _dest(name, typ, default).replace("_", "-"), **kw)


def request_values(args: argparse.Namespace, names: Collection[str] | None = None) -> dict[str, Any]:
    """The request's fields (those of ``names``, if given) as :func:`add_request_args`'s flags set them."""
    out: dict[str, Any] = {}
    for name, typ, default, _ in _knobs(names):
        value = getattr(args, _dest(name, typ, default))
        if typ is bool and default:
            value = not value  # --no-NAME
        elif typing.get_origin(typ) is tuple:
            value = tuple(value or ())
        out[name] = value
    return out


def add_guidance_args(s: argparse.ArgumentParser) -> None:
    """``--require``, ``--guide`` and ``--guidance-scale`` (``replaid sample`` and ``replaid edit``)."""
    add_request_args(s, GUIDANCE)


def request_of(args: argparse.Namespace) -> SampleRequest:
    """The :class:`~replaid.sampling.request.SampleRequest` of ``replaid sample``'s options."""
    return request.SampleRequest(**request_values(args))


def run(args: argparse.Namespace) -> int:
    import sys

    from replaid.sampling.display import visible
    from replaid.sampling.generate import generate
    from replaid.store.loading import load_run

    run_ = load_run(args.run, use_ema=True, train_data=False)
    req = request_of(args)  # validated once, by generate (SampleRequest.check), as the playground's requests are
    if args.show_positions:
        plan = req.check(run_.method, run_.tokenizer, run_.cfg.data.seq_len)
        if plan is None:
            raise ValueError("--show-positions shows an infilling request's positions: give --context")
        print(plan.describe(run_.tokenizer), file=sys.stderr)
    vocab = run_.tokenizer.vocab_size  # in each JSON row: 'replaid quality' checks the ids against it
    if not args.json and (run_.method.block_size() or req.completion) and min(req.num, req.batch_size) == 1:
        return stream(run_, req, args.raw)
    rows = generate(run_, req)
    for r in rows:
        text = r["marked"] if args.show_positions and "marked" in r else r["text"]
        print(strict_dumps({**r, "vocab_size": vocab}) if args.json else visible(text, args.raw) + "\n" + "-" * 40)
    return 0


def stream(run_: Run, req: SampleRequest, raw: bool = False) -> int:
    """A completion, one sample per batch: each sample's prompt, then its text as each block is committed."""
    import sys

    from replaid.sampling.display import visible
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
                sys.stdout.write(visible(d.text, raw))
                sys.stdout.flush()
    print("\n" + "-" * 40)
    return 0
