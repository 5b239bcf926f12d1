"""``replaid grid plan|run|report``: multi-seed grids of runs and what their seeds allow."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from replaid.commands import (
    POSITIVE,
    SEED,
    Distinct,
    add_command,
    add_run_options,
    check_out,
    float_in,
    run_manifest_command,
)
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.eval.grid import GridSpec

EXAMPLE = """examples:
  replaid grid plan study.yaml --out runs/study                       # cells and seeds from a spec file
  replaid grid plan --base demo --cell ref --cell nosc model.self_conditioning=false --seeds 3 \\
      --reference ref --out runs/sc data.source=../shared/data/tinyshakespeare train.num_threads=1
  replaid grid plan --base debug --vary diffusion.schedule=learned,linear --seeds 0 1 2 --out runs/sched
  replaid grid run runs/study --max-parallel 2
  replaid grid report runs/study --reference ref
  replaid grid trend runs/study --steps 800 1600 3200 6400 --reference mdlm --out docs/results/trend"""

SPEC_HELP = """A spec (YAML or JSON): base (a preset or a config file), overrides (every run), seeds (a count or
a list), cells (name -> overrides) and/or vary (key -> values, their product), reference (a cell).
Each (cell, seed) is one run runs/<cell>__s<seed> trained with base + overrides + cell + train.seed.
The thread count changes the numbers: put train.num_threads in the overrides to pin it."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(
        sub,
        "grid",
        "Multi-seed grids: plan runs, run them, report means, intervals, paired differences.",
        EXAMPLE,
        description="Multi-seed grids. " + SPEC_HELP,
    )
    ss = s.add_subparsers(dest="grid_cmd", required=True, help="plan | run | report | trend (each has --help)")

    p = add_command(
        ss,
        "plan",
        "Resolve every (cell, seed) run of a grid and write its manifest.",
        "example: replaid grid plan study.yaml --out runs/study",
        description=SPEC_HELP,
    )
    p.add_argument("spec", nargs="?", help="a grid spec file (YAML/JSON); absent: built from the flags below")
    p.add_argument("--out", required=True, help="grid folder (spec.json, manifest.json, configs/, runs/)")
    p.add_argument("--base", help="preset or config file (absent: the spec's, else demo)")
    p.add_argument(
        "--cell",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME [KEY=VALUE ...]",
        help="one cell: its name and overrides (repeat for more cells)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a key and its values; several --vary give their product (repeatable)",
    )
    p.add_argument(
        "--seeds",
        nargs="+",
        type=SEED,
        action=Distinct,
        metavar="N",
        help="one number: that many seeds from 0; several: those seeds (absent: the spec's, else 3)",
    )
    p.add_argument("--reference", help="the cell paired differences are taken against")
    p.add_argument("--force", action="store_true", help="re-plan an existing grid folder (its runs are kept)")
    p.add_argument("--json", action="store_true", help="print the planned runs as JSON")
    p.add_argument("overrides", nargs="*", help="section.key=value applied to every run (after the spec's)")
    p.set_defaults(func=run_plan)

    r = add_command(
        ss,
        "run",
        "Run every unfinished run of a grid (skip done, resume interrupted).",
        "example: replaid grid run runs/study --max-parallel 2",
    )
    r.add_argument("grid", help="grid folder made by 'replaid grid plan'")
    add_run_options(r)
    r.add_argument("--only", nargs="+", help="run only these cells")
    r.add_argument(
        "--seeds",
        nargs="+",
        type=SEED,
        action=Distinct,
        metavar="N",
        help="run only these seeds' runs, as plan's --seeds: one number, that many from 0; several, those",
    )
    r.set_defaults(func=run_run)

    t = add_command(
        ss,
        "report",
        "Per-cell means and t-intervals over seeds, paired differences, plateau flags.",
        "example: replaid grid report runs/study --reference ref",
    )
    t.add_argument("grid", help="grid folder")
    _report_options(t, "paired differences are", "report", "the report's heading")
    t.set_defaults(func=run_report)

    tr = add_command(
        ss,
        "trend",
        "The grid read at several step counts: bounds and paired gaps against training FLOPs.",
        "example: replaid grid trend runs/study --steps 800 1600 3200 6400 --reference mdlm --out trend/",
        description="Reads the evaluations each run logged along the way (train.eval_every with "
        "eval.split=test and a constant learning rate: one run per seed gives the whole curve) and "
        "reports each step count as 'grid report' does, with FLOPs and passes over the train split, "
        "and each cell's gap to the reference as a trend in log FLOPs (shrinks / grows / flips).",
    )
    tr.add_argument("grid", help="grid folder")
    tr.add_argument(
        "--steps",
        nargs="+",
        type=POSITIVE,
        action=Distinct,
        required=True,
        help="step counts to read (logged evaluations)",
    )
    tr.add_argument(
        "--train-tokens",
        type=POSITIVE,
        default=None,
        help="tokens in the train split, for the passes column of a grid whose run folders carry no "
        "tokenizer (a committed grid); absent: counted from each cell's run folder",
    )
    _report_options(tr, "gaps are", "trend", "the page's heading")
    tr.set_defaults(func=run_trend)


def _report_options(p: argparse.ArgumentParser, taken: str, name: str, title: str) -> None:
    """--reference, --confidence, --out, --title, --json of 'grid report' and 'grid trend'."""
    p.add_argument("--reference", help=f"the cell {taken} taken against (absent: the spec's)")
    p.add_argument(
        "--confidence",
        type=float_in(0.5, 1, hi_open=True),
        default=0.95,
        help="confidence of the t-intervals, in [0.5, 1)",
    )
    p.add_argument("--out", help=f"folder for {name}.json/.md/.png (absent: the grid folder)")
    p.add_argument("--title", help=title)
    p.add_argument("--json", action="store_true", help=f"print {name}.json")


def _spec(args: argparse.Namespace) -> GridSpec:
    from replaid.config import ConfigError
    from replaid.eval.grid import GridSpec, load_spec

    if args.spec and "=" in args.spec and not Path(args.spec).exists():  # an override, not a spec file
        args.overrides, args.spec = [args.spec, *args.overrides], None
    spec = load_spec(args.spec) if args.spec else GridSpec()
    if args.base:
        spec.base = args.base
    for c in args.cell:
        if c[0] in spec.cells:
            raise ConfigError(f"--cell {c[0]}: a cell of that name is given twice; name each cell once")
        spec.cells[c[0]] = list(c[1:])
    for v in args.vary:
        if "=" not in v or not v.split("=", 1)[1]:
            raise ConfigError(f"--vary {v!r}: give KEY=V1,V2,... (e.g. diffusion.schedule=learned,linear)")
        k, vals = v.split("=", 1)
        spec.vary[k] = vals.split(",")
    if args.seeds:
        spec.seeds = _seed_list(args.seeds)
    if args.reference:
        spec.reference = args.reference
    spec.overrides = [*spec.overrides, *args.overrides]
    return spec.validate()


def run_plan(args: argparse.Namespace) -> int:
    from replaid.scaling.grid import write_grid

    spec = _spec(args)
    base = [spec.base] if spec.base and Path(spec.base).is_file() else []
    check_out(args.out, inputs=[*([args.spec] if args.spec else []), *base], writes=("spec.json", "manifest.json"))
    entries = write_grid(spec, Path(args.out), force=args.force)
    if args.json:
        print(strict_dumps([e.__dict__ for e in entries], indent=1))
        return 0
    cells = list(dict.fromkeys(e.cell for e in entries))
    print(
        f"grid {args.out}: {len(cells)} cells x {len(spec.seeds)} seeds = {len(entries)} runs, "
        f"{sum(e.flops for e in entries):.3g} training FLOPs; base {spec.base}"
    )
    for c in cells:
        ov = next(e.overrides for e in entries if e.cell == c)[len(spec.overrides) : -1]
        print(f"  {c:32s} {' '.join(ov) or '(base)'}")
    print(f"next: replaid grid run {args.out} --max-parallel 2")
    return 0


def _seed_list(seeds: list[int]) -> list[int]:
    """``--seeds``: one number is a count from 0, several are the seeds themselves."""
    from replaid.config import ConfigError

    if len(seeds) > 1:
        return list(seeds)
    if seeds[0] < 1:
        raise ConfigError(f"--seeds {seeds[0]}: a count must be >= 1 (or give two or more seeds)")
    return list(range(seeds[0]))


def run_run(args: argparse.Namespace) -> int:
    from replaid.config import ConfigError
    from replaid.scaling.grid import read_grid

    folder = Path(args.grid)
    _, entries = read_grid(folder)
    if args.only:
        entries = [e for e in entries if e.cell in args.only]
        if not entries:
            raise ConfigError(f"--only {' '.join(args.only)} matches no cell of {folder}")
    if args.seeds:
        seeds = _seed_list(args.seeds)
        entries = [e for e in entries if e.seed in seeds]
        if not entries:
            raise ConfigError(f"--seeds {' '.join(map(str, args.seeds))}: no run of {folder} has seed {seeds}")
    return run_manifest_command(args, folder, entries, "grid")


def _grid_inputs(grid: str) -> list[str]:
    """The files of a grid that its report and trend read (an ``--out`` never replaces them)."""
    return [str(Path(grid) / n) for n in ("spec.json", "manifest.json")]


def run_report(args: argparse.Namespace) -> int:
    from replaid.config import ConfigError
    from replaid.scaling.grid import write_report

    if not 0 < args.confidence < 1:
        raise ConfigError(f"--confidence {args.confidence}: must be in (0, 1), e.g. 0.95")
    cmd = "replaid " + shlex.join(sys.argv[1:]) if sys.argv and "grid" in sys.argv else None
    check_out(args.out, inputs=_grid_inputs(args.grid), writes=("report.json", "report.md", "report.png", "curves.png"))
    rep = write_report(Path(args.grid), args.reference, args.confidence, args.out, args.title, cmd)
    out = Path(args.out or args.grid)
    if args.json:
        print(strict_dumps(rep))
    else:
        print((out / "report.md").read_text())
    return 0


def run_trend(args: argparse.Namespace) -> int:
    from replaid.scaling.trend import write_trend

    check_out(args.out, inputs=_grid_inputs(args.grid), writes=("trend.json", "trend.md", "trend.png"))
    tr = write_trend(
        Path(args.grid),
        args.steps,
        args.reference,
        args.confidence,
        args.out,
        args.title,
        train_tokens=args.train_tokens,
    )
    out = Path(args.out or args.grid)
    if args.json:
        print(strict_dumps(tr))
    else:
        print((out / "trend.md").read_text())
    return 0
