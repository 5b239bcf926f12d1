"""``replaid convert``: an official MDLM / Duo / LangFlow checkpoint as a replaid folder (see ``replaid/hub/peers.py``)."""

from __future__ import annotations

import argparse

from replaid.commands import add_command, check_out

EXAMPLE = """example: replaid convert mdlm kuleshov-group/mdlm-owt --out peers/mdlm-owt \\
           --set data.tokenizer_path=../shared/tokenizers/gpt2 data.source=../shared/data/wiki-sample
then:    replaid eval peers/mdlm-owt   |   replaid sample peers/mdlm-owt   |   replaid zeroshot peers/mdlm-owt"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = add_command(
        sub,
        "convert",
        "Convert an official MDLM, Duo or LangFlow checkpoint (Hub layout, safetensors) to a replaid folder.",
        EXAMPLE,
    )
    e.add_argument("peer", choices=["mdlm", "duo", "langflow"], help="which peer's layout src is in")
    e.add_argument("src", help="the peer's folder (config.json + model.safetensors) or Hub id")
    e.add_argument("--out", required=True, help="new folder to write")
    e.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="config overrides for the converted run: data.tokenizer_path=..., data.source=..., eval.* ...",
    )
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.hub.peers import convert

    check_out(args.out, empty=True)
    out = convert(args.peer, args.src, args.out, args.overrides)
    print(f"converted {args.peer} {args.src} -> {out}")
    return 0
