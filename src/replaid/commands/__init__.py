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
    "distill",
    "export",
    "convert",
    "zeroshot",
    "scaling",
    "grid",
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


def add_run_options(r) -> None:
    """The options of a manifest run (``replaid scaling run``, ``replaid grid run``)."""
    r.add_argument(
        "--executor",
        default="local",
        choices=["local", "slurm", "submitit-local", "debug"],
        help="local subprocesses, SLURM job arrays (submitit), or submitit's local/debug executors",
    )
    r.add_argument("--max-parallel", type=int, default=1, help="runs at once (local) / array parallelism (slurm)")
    r.add_argument("--prefix", default="", help="command put before every run, e.g. 'nice -n 5'")
    r.add_argument(
        "--python",
        help="how to run each training (absent: this interpreter -m replaid train in a subprocess; "
        "'inprocess': the training function in this process)",
    )
    r.add_argument("--gpus-per-job", type=int, default=0, help="slurm: GPUs per job, run under torchrun")
    r.add_argument(
        "--slurm",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra submitit parameters, e.g. slurm_partition=gpu timeout_min=600",
    )
    r.add_argument("--no-wait", action="store_true", help="slurm: submit and return")
    r.add_argument("--status", action="store_true", help="print the progress and exit")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_manifest_command(args, folder, entries, what: str) -> int:
    """Bring every entry of a manifest to completion with the executor of ``args`` (the one place
    that runs a manifest: ``replaid scaling run`` and ``replaid grid run``). 0 when all finished."""
    import sys

    from replaid.config import ConfigError, parse_overrides
    from replaid.scaling import runner

    if args.max_parallel < 1 and args.executor == "local":
        raise ConfigError(f"--max-parallel {args.max_parallel}: must be >= 1 (runs at once)")
    if args.status:
        print(runner.progress_line(folder, entries))
        return 0
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.executor == "local":
        res = runner.run_local(folder, entries, args.max_parallel, args.python, args.prefix, not args.no_progress, log)
    else:
        extra = {}
        for k, v in parse_overrides(args.slurm):
            try:
                extra[k] = json.loads(v)
            except json.JSONDecodeError:
                extra[k] = v
        res = runner.run_submitit(
            folder,
            entries,
            args.executor,
            args.max_parallel,
            args.python,
            args.prefix,
            args.gpus_per_job,
            extra,
            wait=not args.no_wait,
            log=log,
        )
    log(runner.progress_line(folder, entries))
    failed = [r for r in res if r["state"] != "done"]
    if failed:
        log(
            f"{what} run: {len(failed)} run(s) did not finish: {', '.join(r['id'] for r in failed[:5])}; "
            f"rerun 'replaid {what} run {folder}' to resume them"
        )
        return 1
    return 0
