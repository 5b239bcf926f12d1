"""One module per ``replaid`` sub-command, each with ``register(subparsers)`` and ``run(args) -> int``.

``replaid.cli`` builds the parser from ``COMMANDS``; the helpers here give every command the same
help layout and output format.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaid.config import MAX_STEPS, range_problem
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.scaling.runner import ManifestEntry
    from replaid.store.loading import Run

# Sub-command modules in the order ``replaid --help`` lists them.
COMMANDS = (
    "train",
    "eval",
    "sample",
    "edit",
    "classifier",
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
    "lmeval",
    "scaling",
    "grid",
    "serve",
    "memory",
    "plan_cluster",
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The project's help layout: description and example kept as written, every default shown.

    Options whose default is ``None``/``False`` say in their help what happens when they are absent, so
    ``(default: None)`` is not printed for them (nor an empty default).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_: str,
    example: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A sub-command parser with the project's help layout (description, then an example)."""
    return sub.add_parser(
        name, help=help_, description=description or help_, epilog=example, formatter_class=HelpFormatter
    )


def run_title(run: Run) -> str:
    """How plots name the run they show: its folder, method, step and weights (EMA or raw)."""
    from pathlib import Path

    ck = Path(run.ckpt)
    name = ck.parent.parent.name if ck.parent.name == "checkpoints" else ck.name
    return f"{name} ({run.cfg.method}, step {run.step}, {'EMA' if run.ema_loaded else 'raw'} weights)"


def emit(obj: dict[str, Any], as_json: bool) -> None:
    """One JSON object, or one ``key value`` line per entry."""
    if as_json:
        print(strict_dumps(obj))
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


def add_run_options(r: argparse.ArgumentParser) -> None:
    """The options of a manifest run (``replaid scaling run``, ``replaid grid run``)."""
    r.add_argument(
        "--executor",
        default="local",
        choices=["local", "slurm", "submitit-local", "debug"],
        help="local subprocesses, SLURM job arrays (submitit), or submitit's local/debug executors",
    )
    r.add_argument("--max-parallel", type=POSITIVE, default=1, help="runs at once (local) / array parallelism (slurm)")
    r.add_argument("--prefix", default="", help="command put before every run, e.g. 'nice -n 5'")
    r.add_argument(
        "--python",
        help="how to run each training (absent: this interpreter -m replaid train in a subprocess; "
        "'inprocess': the training function in this process)",
    )
    r.add_argument("--gpus-per-job", type=NONNEGATIVE, default=0, help="slurm: GPUs per job, run under torchrun")
    r.add_argument(
        "--nodes-per-job",
        type=POSITIVE,
        default=1,
        help="slurm: nodes per job (with --gpus-per-job G per node): one torchrun per node, c10d rendezvous",
    )
    add_gpu_memory_option(r, "slurm with --gpus-per-job")
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


def add_gpu_memory_option(p: argparse.ArgumentParser, when: str) -> None:
    """``--gpu-memory-gb``: the stated GPU that :func:`~replaid.training.layout.check_layout` checks a step against."""
    p.add_argument(
        "--gpu-memory-gb",
        type=float_in(0, 1e6),
        default=0.0,
        metavar="GB",
        help=f"{when}: the memory of one GPU; a step that the memory model (replaid memory) puts above it is "
        "refused before anything is written or submitted (0: not stated, not checked)",
    )


def run_manifest_command(args: argparse.Namespace, folder: Path, entries: Sequence[ManifestEntry], what: str) -> int:
    """Bring every entry of a manifest to completion with the executor of ``args`` (the one place
    that runs a manifest: ``replaid scaling run`` and ``replaid grid run``). 0 when all finished."""
    import sys

    from replaid.config import parse_overrides
    from replaid.scaling import runner
    from replaid.training.train import PREEMPTED_EXIT

    if args.status:
        print(runner.progress_line(folder, entries))
        return 0
    if args.gpu_memory_gb and not (args.executor == "slurm" and args.gpus_per_job):
        raise ValueError(
            "--gpu-memory-gb states the GPUs of a SLURM job: it goes with --executor slurm --gpus-per-job G"
        )
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
    if args.executor == "local":
        res = runner.run_local(folder, entries, args.max_parallel, args.python, args.prefix, not args.no_progress, log)
    else:
        extra: dict[str, Any] = {}
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
            nodes_per_job=args.nodes_per_job,
            gpu_memory_gb=args.gpu_memory_gb,
        )
    log(runner.progress_line(folder, entries))
    if any(r["returncode"] == PREEMPTED_EXIT for r in res):
        log(
            f"{what} run: preempted; the stopped runs saved a checkpoint: rerun 'replaid {what} run {folder}' to resume"
        )
        return PREEMPTED_EXIT
    failed = [r for r in res if r["state"] != "done"]
    if failed:
        log(
            f"{what} run: {len(failed)} run(s) did not finish: {', '.join(r['id'] for r in failed[:5])}; "
            f"rerun 'replaid {what} run {folder}' to resume them"
        )
        return 1
    return 0


# --- validation at the edge: argparse types (one-line errors through ``replaid.cli``) ---------------


def int_in(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an exact whole number (no ``1e9``, no ``2.0``) in ``[lo, hi]``."""

    def parse(s: str) -> int:
        t = s.strip()
        try:
            v = int(t, 10)
        except ValueError:
            digits = t.removeprefix("-").removeprefix("+")
            if digits.isascii() and digits.isdigit():  # past Python's limit of 4300 digits: past any bound too
                bound = lo if t.startswith("-") else hi
                most = f"must be {'>=' if t.startswith('-') else '<='} {bound}" if bound is not None else "too long"
                raise argparse.ArgumentTypeError(f"{t[:12]}... ({len(digits)} digits): {most}") from None
            raise argparse.ArgumentTypeError(f"{s[:40]!r} is not a whole number; give digits, e.g. 16") from None
        why = range_problem(v, lo, hi)
        if why:
            raise argparse.ArgumentTypeError(f"{v}: {why}")
        return v

    parse.__name__ = "int"
    return parse


FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: a number that reaches a tensor stays below it


def float_in(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    or_zero: bool = False,
) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[lo, hi]`` (``lo_open``/``hi_open``: that end excluded;
    ``or_zero``: 0 is taken too, as the option's documented special value, e.g. greedy decoding). The
    range is kept on the parser as ``.range`` (lo, hi, lo_open, hi_open, or_zero) for the generated
    tests: every float option declares a finite upper end that float32 represents."""

    def parse(s: str) -> float:
        import math

        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s[:40]!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{s[:40]}: must be a finite number")
        why = range_problem(v, lo, hi, lo_open=lo_open, hi_open=hi_open, or_zero=or_zero)
        if why:
            raise argparse.ArgumentTypeError(f"{v:g}: {why}")
        return v

    parse.__name__ = "float"
    parse.range = (lo, hi, lo_open, hi_open, or_zero)  # type: ignore[attr-defined]
    return parse


class Distinct(argparse.Action):
    """``action=Distinct`` for a list option: a value given twice is refused (``--budgets 1e11 1e11``
    would plan the same runs twice under one id and double-count their FLOPs)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        seen: set[object] = set()
        for v in values or []:
            if v in seen:
                raise argparse.ArgumentError(
                    self,
                    f"{v:g} is given twice; give each value once"
                    if isinstance(v, float)
                    else f"{v} is given twice; give each value once",
                )
            seen.add(v)
        setattr(namespace, self.dest, values)


POSITIVE = int_in(1)
NONNEGATIVE = int_in(0)
SEED = int_in(0, 2**63 - 1)
STEPS = int_in(1, MAX_STEPS)  # sampling / solver steps


def check_out(
    out: str | None,
    *,
    protected: tuple[str, ...] = (),
    names: tuple[str, ...] = (),
    empty: bool = False,
    inputs: Sequence[str] = (),
    writes: tuple[str, ...] = (),
) -> None:
    """Check an ``--out`` folder before any work: a folder (or absent, with a writable parent), not a
    run or checkpoint folder of ``protected`` nor inside one, nor inside any run's ``checkpoints/`` or
    ``tokenizer/``, and holding none of ``names`` already (an output is never overwritten); ``empty``:
    any non-empty folder is refused (export, convert write a whole folder); none of the files it
    ``writes`` (and of ``names``) is one of the command's own ``inputs`` (files, or folders whose files it
    reads). The one check of every command that writes results into an ``--out`` folder."""
    import os

    from replaid.store import runfolder

    if not out:
        return
    p = Path(out)
    for src in inputs:  # an output never replaces the file it is computed from
        s = Path(os.path.realpath(src))
        for n in (*writes, *names):
            if Path(os.path.realpath(p / n)) == s:
                raise ValueError(
                    f"--out {out} would replace the input {src} with its {n}; choose another folder "
                    f"(e.g. {Path(out) / 'results'})"
                )
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose a folder path")
    if empty and p.is_dir() and any(p.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; choose a new folder (nothing was written)")
    rp = p.resolve()
    for run in protected:  # results may go in a subfolder of a run, never among its own files
        r = Path(run).resolve()
        own = [r / "checkpoints", r / "tokenizer"] + ([r] if (r / "state.json").is_file() else [])
        if rp == r or any(rp == o or o in rp.parents for o in own):
            raise ValueError(
                f"--out {out} would write among the files of the input {run}; choose another folder "
                f"(e.g. a subfolder such as {Path(run) / 'results'})"
            )
    if (rp / "config.json").is_file() and (rp / "checkpoints").is_dir():
        raise ValueError(f"--out {out} holds a run; choose a new folder for the results")
    inside = runfolder.managed_folder(rp)  # any run's, not only an input's: its trainer prunes them
    if inside:
        raise ValueError(f"--out {out} is {inside}; choose a folder outside it (e.g. RUN/results)")
    taken = [n for n in names if (p / n).exists()]
    if taken:
        raise ValueError(f"--out {out} already holds {', '.join(taken)}; choose a new folder or remove them")
    parent = next((q for q in [p, *p.parents] if q.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--out {out}: cannot write into {parent} (permission); choose a writable folder")


def require_finite(res: dict[str, Any], where: str) -> None:
    """Refuse an evaluation result holding NaN/Inf (an error, never a printed Infinity)."""
    from replaid.training.train import nonfinite_entries

    bad = nonfinite_entries(res)
    if bad:
        raise ValueError(
            f"evaluating {where} gave non-finite results ({', '.join(bad[:3])}): the weights overflow on this "
            f"data; check the checkpoint (a damaged or diverged one) or evaluate an earlier checkpoint"
        )
