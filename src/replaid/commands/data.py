"""``replaid data``: describe a data source as seen through a tokenizer."""

from __future__ import annotations

import argparse

from replaid.commands import add_command, emit, int_in

EXAMPLE = (
    "example: replaid data --source ../shared/data/wiki-sample --tokenizer gpt2 "
    "--tokenizer-path ../shared/tokenizers/gpt2 --json"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = add_command(sub, "data", "Describe a data source as seen through a tokenizer.", EXAMPLE)
    d.add_argument(
        "--source", default="stdlib", help="stdlib, a .jsonl/.txt file or folder, or hf:NAME (see README, Data)"
    )
    d.add_argument(
        "--tokenizer",
        default="bpe",
        help="bpe (trained on the source), gpt2, llama2, bert-base-cased, bert-base-uncased",
    )
    d.add_argument("--tokenizer-path", default="", help="local tokenizer files (empty: download or train)")
    d.add_argument("--split", default="train", choices=["train", "valid", "test"], help="split described")
    d.add_argument("--vocab-size", type=int_in(2), default=2048, help="for --tokenizer bpe")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.data import describe

    info = describe(args.source, args.tokenizer, args.tokenizer_path, split=args.split, vocab_size=args.vocab_size)
    emit(info, args.json)
    return 0
