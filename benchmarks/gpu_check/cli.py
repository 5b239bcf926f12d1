"""The command line of the GPU check (``python benchmarks/gpu_check.py ...``, what
``scripts/gpu_check.sh`` runs): a run, a subset of its steps, the dry run, a merge, one child.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .base import REPO, UsageError
from .children import CHILDREN
from .dryrun import dry_run
from .plan import STEP_NAMES, select_steps
from .record import merge, record
from .report import render
from .runner import run_plan, write_outputs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=sys.modules[__package__].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="the subset that fits one 10-minute call")
    p.add_argument("--out", default=None, help="folder for gpu_check.json/.md (default: $OUT, else runs/gpu_check)")
    p.add_argument("--steps", default=None, help=f"comma-separated subset of {','.join(STEP_NAMES)}")
    p.add_argument("--dry-run", action="store_true", help="print the plan and resolve every command; run nothing")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for all steps; steps that no longer fit are skipped (quick: 570 - set-up)",
    )
    p.add_argument("--device", default="cuda", help="device of the steps (cuda; cpu only to try the driver)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="shrink every model and length (hidden 64, L = 64): tries the driver itself on a CPU",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for the steps' processes")
    p.add_argument("--mdlm-ref", default=str(REPO / ".carry" / "mdlm"), help="copy of kuleshov-group/mdlm")
    p.add_argument("--setup-json", default=None, help="the wrapper's set-up record (time, nvidia-smi, wheels)")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="merge gpu_check.json files of several calls into --out (and render the table)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="with --merge: also put the table into docs/benchmarks.md between the gpu_check markers",
    )
    p.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)  # the wrapper's early check
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="{}", help=argparse.SUPPRESS)
    return p


def main(argv: list | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.child:
            sys.path.insert(0, str(REPO / "src"))
            if a.child not in CHILDREN:
                raise UsageError(f"--child {a.child}: no such child; one of {', '.join(CHILDREN)}")
            print(json.dumps(CHILDREN[a.child](**json.loads(a.spec)), default=str), flush=True)
            return 0
        out = Path(a.out or os.environ.get("OUT") or REPO / "runs" / "gpu_check")
        if a.merge:
            doc = merge(a.merge)
            write_outputs(doc, out)
            print(f"merged {len(a.merge)} file(s) into {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
            if a.record:
                record(render(doc), REPO / "docs" / "benchmarks.md")
                print("recorded the table in docs/benchmarks.md")
            return 0
        if a.record:
            raise UsageError("--record goes with --merge JSON... (it records merged results)")
        steps = select_steps(a.steps, a.quick)
        if a.budget is not None and a.budget <= 0:
            raise UsageError(f"--budget {a.budget:g}: give a positive number of seconds")
        if a.check_args:
            return 0
        if a.dry_run:
            return dry_run(a, steps)
        return run_plan(a, steps, out)
    except UsageError as e:
        print(f"replaid: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
