"""One module per ``replaid`` sub-command, each with ``register(subparsers)`` and ``run(args) -> int``.

``replaid.cli`` builds the parser from ``COMMANDS``; the helpers here give every command the same
help layout and output format.
"""
from __future__ import annotations

import argparse
import json

# Sub-command modules in the order ``replaid --help`` lists them.
COMMANDS = ("train", "eval", "sample", "data", "presets", "likelihood", "diagnose", "quality", "sweep", "export", "zeroshot")


def add_command(sub, name: str, help_: str, example: str, description: str | None = None):
    """A sub-command parser with the project's help layout (description, then an example)."""
    return sub.add_parser(name, help=help_, description=description or help_, epilog=example,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def emit(obj: dict, as_json: bool) -> None:
    """One JSON object, or one ``key value`` line per entry."""
    if as_json:
        print(json.dumps(obj))
    else:
        for k, v in obj.items():
            print(f"{k:28s} {v}")
