"""``replaid presets``: list the named presets."""

from __future__ import annotations

import argparse

from replaid.commands import add_command

EXAMPLE = "example: replaid presets"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(sub, "presets", "List the named presets.", EXAMPLE).set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.presets import PRESETS

    for name, fn in PRESETS.items():
        doc = " ".join(line.strip() for line in (fn.__doc__ or "").strip().splitlines())
        print(f"{name:16s} {doc}")
    return 0
