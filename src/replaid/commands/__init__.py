"""One module per ``replaid`` sub-command, each with ``register(subparsers)`` and ``run(args) -> int``.

``replaid.cli`` builds the parser from ``COMMANDS``; the helpers here give every command the same
help layout and output format.
"""

from __future__ import annotations

import argparse
import json

# Sub-command modules in the order ``replaid --help`` lists them.
COMMANDS = (
    "train",
    "eval",
    "sample",
    "data",
    "presets",
    "likelihood",
    "diagnose",
    "geometry",
    "quality",
    "sweep",
    "export",
    "convert",
    "zeroshot",
    "scaling",
    "serve",
    "memory",
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The project's help layout: description and example kept as written, every default shown.

    Options whose default is ``None``/``False`` say in their help what happens when they are absent, so
    ``(default: None)`` is not printed for them (nor an empty default).
    """

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def add_command(sub, name: str, help_: str, example: str, description: str | None = None):
    """A sub-command parser with the project's help layout (description, then an example)."""
    return sub.add_parser(
        name, help=help_, description=description or help_, epilog=example, formatter_class=HelpFormatter
    )


def run_title(run) -> str:
    """How plots name the run they show: its folder, method, step and weights (EMA or raw)."""
    from pathlib import Path

    ck = Path(run.ckpt)
    name = ck.parent.parent.name if ck.parent.name == "checkpoints" else ck.name
    return f"{name} ({run.cfg.method}, step {run.step}, {'EMA' if run.ema_loaded else 'raw'} weights)"


def emit(obj: dict, as_json: bool) -> None:
    """One JSON object, or one ``key value`` line per entry."""
    if as_json:
        print(json.dumps(obj))
    else:
        for k, v in obj.items():
            print(f"{k:28s} {v}")


def run_labels(runs: list[str], labels: list[str] | None) -> list[str]:
    """One distinct label per run: ``labels`` as given, or the run folders' names."""
    from pathlib import Path

    if labels and len(labels) != len(runs):
        raise ValueError(f"--labels has {len(labels)} names for {len(runs)} runs; give one per run")
    out = labels or [Path(p).resolve().name for p in runs]
    if len(set(out)) != len(out):
        raise ValueError(f"run labels must differ ({out}); pass --labels")
    return out
