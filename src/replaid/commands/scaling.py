"""``replaid scaling plan|run|fit``: the paper's IsoFLOP study (sec. 4.3-4.4) as three commands."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from replaid.commands import (
    POSITIVE,
    SEED,
    Distinct,
    add_command,
    add_run_options,
    check_out,
    float_in,
    int_in,
    run_manifest_command,
)
from replaid.schema import dumps as strict_dumps

EXAMPLE = """examples:
  replaid scaling plan --methods ar mdlm replaid --budgets 6e18 1e19 3e19 6e19 1e20 --sizes paper --out SWEEP
  replaid scaling plan --methods ar mdlm replaid --sizes tiny --out runs/iso data.source=../shared/data/linux-docs
  replaid scaling run runs/iso --executor local --max-parallel 2
  replaid scaling run SWEEP --executor slurm --gpus-per-job 8 --slurm slurm_partition=gpu --max-parallel 16
  replaid scaling fit runs/iso --reference ar --out runs/iso/fit --json"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(sub, "scaling", "IsoFLOP scaling study: plan runs, run them, fit the scaling laws.", EXAMPLE)
    ss = s.add_subparsers(dest="scaling_cmd", required=True, help="plan | run | fit (each has --help)")

    _plan_parser(ss)
    _run_parser(ss)
    _fit_parser(ss)
    _overtrain_parser(ss)


def _plan_parser(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replaid scaling plan``."""
    p = add_command(
        ss,
        "plan",
        "Resolve every (method, budget, size) run; print the table, write a manifest.",
        "example: replaid scaling plan --methods ar mdlm replaid --sizes paper --mfu 0.4",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        action=Distinct,
        default=["ar", "mdlm", "replaid"],
        help="any of ar mdlm duo replaid replaid-nosc plaid",
    )
    p.add_argument(
        "--budgets",
        nargs="+",
        type=float_in(1, 1e26),
        action=Distinct,
        help="compute budgets C in FLOPs, each in [1, 1e26] and given once (absent: the paper's five, or 1e11 3e11 "
        "6e11 for tiny)",
    )
    p.add_argument(
        "--sizes", default="paper", help="paper | tiny | comma-separated size labels (e.g. 116M,140M or 32x1,48x2)"
    )
    p.add_argument(
        "--per-budget",
        type=int_in(-1),
        default=-1,
        help="sizes per budget around the predicted optimum (0 = all; -1: 9 for paper, 4 for tiny)",
    )
    p.add_argument(
        "--stride",
        type=int_in(-1),
        default=-1,
        help="take every STRIDE-th size of the table for a wider bracket (-1: 2 for paper, 1 for tiny)",
    )
    p.add_argument(
        "--tokens-per-param",
        nargs="+",
        default=[],
        metavar="X|METHOD=X",
        help="centre of each budget's sizes: the N with D = X N and C = 6 N D; METHOD=X for one method "
        "(e.g. 40 mdlm=200). Absent: 100 for paper, between Chinchilla's 20 and the ~300 of the "
        "paper's 231M MDLM at 1e20; 40 for tiny, where a first AR budget put the optimum below 20 "
        "tokens/parameter",
    )
    p.add_argument(
        "--max-tokens",
        default="0",
        help="leave out sizes whose run would read more tokens than this, so that no run repeats data: "
        "a number, or 'corpus' for the train split's tokens (tokenises it once into the cache; "
        "the table then shows passes per run); 0: no limit",
    )
    p.add_argument("--protocol", choices=["paper", "tiny"], help="training protocol (absent: that of --sizes)")
    p.add_argument("--out", help="sweep folder (manifest.json/.csv, configs/, runs/)")
    p.add_argument("--force", action="store_true", help="re-plan an existing sweep folder (its runs are kept)")
    p.add_argument(
        "--mfu",
        type=float_in(1e-3, 1),
        default=0.4,
        help="model FLOPs utilisation for the GPU-hour estimate",
    )
    p.add_argument(
        "--gpu-tflops",
        type=float_in(1e-3, 1e6),
        default=989.0,
        help="peak bf16 dense TFLOP/s of one GPU for the estimate (989: H100 SXM), in [1e-3, 1e6]",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
    p.add_argument("overrides", nargs="*", help="section.key=value applied to every run, e.g. data.source=...")
    p.set_defaults(func=run_plan)


def _run_parser(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replaid scaling run``."""
    r = add_command(
        ss,
        "run",
        "Run every unfinished entry of a sweep (skip done, resume interrupted).",
        "example: replaid scaling run runs/iso --max-parallel 2 --prefix '/work/tools/heavy -n 1'",
    )
    r.add_argument("sweep", help="sweep folder made by 'replaid scaling plan'")
    add_run_options(r)
    r.add_argument("--only", nargs="+", help="run only these methods (variant labels)")
    r.set_defaults(func=run_run)


def _fit_parser(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replaid scaling fit``."""
    f = add_command(
        ss,
        "fit",
        "Fit IsoFLOP minima, power laws, compute multipliers, L(N, D) and the crossover.",
        "example: replaid scaling fit runs/iso --reference ar --out runs/iso/fit --json",
    )
    f.add_argument(
        "source",
        nargs="+",
        help="sweep folder(s) or CSV(s) with columns method,flops,params,loss"
        "[,tokens,budget,stderr,unigram], fitted as one study",
    )
    f.add_argument("--reference", default="ar", help="the method the compute multipliers compare to")
    f.add_argument("--out", help="folder for fit.json, report.md and the PNG plots (absent: SOURCE/fit)")
    f.add_argument("--bootstrap", type=POSITIVE, default=1000, help="bootstrap resamples for the intervals")
    f.add_argument("--seed", type=SEED, default=0, help="bootstrap seed")
    f.add_argument(
        "--crossover",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="the two methods of the over-training crossover (absent: replaid mdlm when both ran)",
    )
    f.add_argument(
        "--slice-params",
        type=float_in(1, 1e15),
        help="N of the over-training slice plot, in [1, 1e15] (absent: a crossover N in the middle)",
    )
    f.add_argument("--json", action="store_true", help="print every fitted number as one JSON object")
    f.set_defaults(func=run_fit)


def _overtrain_parser(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replaid scaling overtrain``."""
    o = add_command(
        ss,
        "overtrain",
        "The over-training crossover of two methods at one size, measured over seeds (no fit).",
        "example: replaid scaling overtrain runs/ot-* --optimum mdlm=5e11 replaid=2e12 --corpus corpus --out ot/",
        description="Each method trained at multiples of its own compute-optimal budget (C*, from an "
        "IsoFLOP study), several train.seed each: the bound against FLOPs per method, the difference "
        "at each budget paired by seed (the other method's curve interpolated in log FLOPs), and where "
        "the curves cross, with the over-training factors there (the paper's statistic).",
    )
    o.add_argument("source", nargs="+", help="sweep folder(s) or CSV(s), as for 'scaling fit'")
    o.add_argument(
        "--optimum",
        nargs=2,
        required=True,
        metavar="METHOD=C",
        help="each method's compute-optimal budget at this size, e.g. mdlm=5e11 replaid=2e12; the first "
        "method is A in the differences A - B",
    )
    o.add_argument("--corpus-tokens", type=POSITIVE, help="tokens of one pass over the train split (passes column)")
    o.add_argument("--confidence", type=float_in(0.5, 0.999), default=0.95, help="of the t-intervals")
    o.add_argument("--out", required=True, help="folder for overtrain.json/.md/.png and runs.csv")
    o.add_argument("--title", default="The over-training crossover", help="the page's heading")
    o.set_defaults(func=run_overtrain)


def _table(rows: list[list[object]], head: list[str]) -> str:
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line: Callable[[Sequence[object]], str] = lambda r: "  ".join(str(x).rjust(n) for x, n in zip(r, w, strict=True))
    return "\n".join([line(head), line(["-" * n for n in w])] + [line(r) for r in rows])


def run_plan(args: argparse.Namespace) -> int:
    from replaid.config import ConfigError
    from replaid.scaling import plan as sc

    table = "tiny" if args.sizes == "tiny" else "paper"
    budgets = args.budgets or (sc.TINY_BUDGETS if table == "tiny" else sc.PAPER_BUDGETS)
    per_budget = args.per_budget if args.per_budget >= 0 else (4 if table == "tiny" else 9)
    stride = args.stride if args.stride >= 1 else (1 if table == "tiny" else 2)
    if args.mfu <= 0 or args.mfu > 1:
        raise ConfigError("--mfu must be in (0, 1]")
    tpp = {"*": 40.0 if table == "tiny" else 100.0}
    for item in args.tokens_per_param:
        key, _, val = item.rpartition("=")
        try:
            tpp[key or "*"] = float(val)
        except ValueError:
            raise ConfigError(f"--tokens-per-param: '{item}' is not a number or METHOD=number") from None
        if not (math.isfinite(tpp[key or "*"]) and 0 < tpp[key or "*"] <= 1e9):  # K10: nan/inf once planned 500
            raise ConfigError(
                f"--tokens-per-param: '{item}' must be a finite number of tokens per parameter in (0, 1e9], "
                f"e.g. 20 or mdlm=100"
            )
    plan_args = (args.methods, budgets, args.sizes)
    plan_kw = dict(stride=stride, protocol=args.protocol, overrides=args.overrides, tokens_per_param=tpp)
    corpus = None
    if args.max_tokens == "corpus":
        one = sc.make_plan(args.methods[:1], budgets[:1], args.sizes, per_budget=1, **plan_kw)  # runs share data
        corpus = sc.corpus_tokens(one.entries[0]._cfg)  # type: ignore[attr-defined]  # make_plan attaches it
        max_tokens = float(corpus)
        print(f"corpus: {corpus:,} train tokens in whole sequences (--max-tokens)", file=sys.stderr)
    else:
        try:
            max_tokens = float(args.max_tokens)
        except ValueError:
            raise ConfigError(f"--max-tokens {args.max_tokens!r}: give a number of tokens or 'corpus'") from None
    check_out(args.out, writes=PLAN_FILES)
    plan = sc.make_plan(*plan_args, per_budget=per_budget, max_tokens=max_tokens, **plan_kw)
    if args.out:
        man = sc.write_plan(plan, Path(args.out), force=args.force)
        print(
            f"wrote {man} ({len(plan.entries)} runs, {plan.total_flops:.3g} FLOPs) and "
            f"{Path(args.out) / 'manifest.csv'}",
            file=sys.stderr,
        )
    gpu_s: Callable[[float], float] = lambda fl: fl / (args.mfu * args.gpu_tflops * 1e12)
    if args.json:
        print(
            strict_dumps(
                {
                    "protocol": plan.protocol,
                    "total_flops": plan.total_flops,
                    "gpu_hours": gpu_s(plan.total_flops) / 3600,
                    "mfu": args.mfu,
                    "gpu_tflops": args.gpu_tflops,
                    "runs": [{k: v for k, v in e.__dict__.items() if not k.startswith("_")} for e in plan.entries],
                }
            )
        )
        return 0
    rows = [
        [
            e.method,
            f"{e.budget:.3g}",
            e.size,
            f"{e.params / 1e6:.3f}M",
            e.steps,
            f"{e.tokens:.3g}",
            f"{e.tokens / e.params:.1f}",
        ]
        + ([f"{e.tokens / corpus:.3f}"] if corpus else [])
        + [f"{gpu_s(e.flops) / 3600:.2f}"]
        for e in plan.entries
    ]
    print(
        _table(
            rows,
            ["method", "C", "size", "N (non-emb)", "steps", "tokens", "D/N"]
            + (["passes"] if corpus else [])
            + ["GPU-h"],
        )
    )
    print()
    by: dict[str, float] = {}
    for e in plan.entries:
        by.setdefault(e.method, 0.0)
        by[e.method] += e.flops
    for m, fl in by.items():
        print(f"{m:14s} {fl:.3g} FLOPs  {gpu_s(fl) / 3600:,.0f} GPU-hours")
    print(
        f"{'total':14s} {plan.total_flops:.3g} FLOPs  {gpu_s(plan.total_flops) / 3600:,.0f} GPU-hours "
        f"at MFU {args.mfu:.0%} of {args.gpu_tflops:g} TFLOP/s per GPU ({len(plan.entries)} runs, protocol "
        f"{plan.protocol})"
    )
    return 0


def run_run(args: argparse.Namespace) -> int:
    from replaid.config import ConfigError
    from replaid.scaling import plan as sc

    sweep = Path(args.sweep)
    entries = sc.read_manifest(sweep)
    if args.only:
        entries = [e for e in entries if e.method in args.only]
        if not entries:
            raise ConfigError(f"--only {' '.join(args.only)} matches no run of {sweep}")
    return run_manifest_command(args, sweep, entries, "scaling")


def run_fit(args: argparse.Namespace) -> int:
    from replaid.scaling import fit as sf
    from replaid.scaling import report

    first = Path(args.source[0])
    out = Path(args.out) if args.out else (first / "fit" if first.is_dir() else first.parent / "fit")
    check_out(str(out), inputs=args.source, writes=FIT_FILES)
    res = report.fit_source(
        args.source,
        reference=args.reference,
        n_boot=args.bootstrap,
        seed=args.seed,
        crossover=args.crossover,
        out=out,
        slice_params=args.slice_params,
    )
    for w in res.get("warnings", []):
        print(f"replaid: warning: {w}", file=sys.stderr)
    if args.json:
        print(strict_dumps(res))
    else:
        print(sf.summary_text(res))
        print(f"wrote {out / 'fit.json'}, {out / 'report.md'} and plots", file=sys.stderr)
    return 0


PLAN_FILES = ("manifest.json", "manifest.csv")
OVERTRAIN_FILES = ("overtrain.json", "overtrain.md", "overtrain.png", "runs.csv")
FIT_FILES = ("fit.json", "report.md")


def run_overtrain(args: argparse.Namespace) -> int:
    import csv

    from replaid.fileio import atomic_write_text
    from replaid.scaling import overtrain as ot
    from replaid.scaling.fit import read_sources

    optimum: dict[str, float] = {}
    for item in args.optimum:
        name, _, value = item.partition("=")
        try:
            optimum[name] = float(value)
        except ValueError:
            raise ValueError(f"--optimum {item}: give METHOD=FLOPS, e.g. mdlm=5e11") from None
        if not (name and math.isfinite(optimum[name]) and optimum[name] > 0):
            raise ValueError(f"--optimum {item}: give a method and a positive budget, e.g. mdlm=5e11")
    if len(optimum) != 2:
        raise ValueError(f"--optimum names {', '.join(args.optimum)}: give two different methods")
    a, b = list(optimum)
    check_out(args.out, inputs=args.source, writes=OVERTRAIN_FILES)
    rows, _ = read_sources(args.source)
    res = ot.overtrain(rows, optimum, a, b, args.corpus_tokens, args.confidence)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "overtrain.json", strict_dumps(res, indent=1))
    atomic_write_text(out / "overtrain.md", ot.markdown(res, args.title) + "\n![loss against FLOPs](overtrain.png)\n")
    ot.plot(res, out / "overtrain.png", args.title)
    keys = ["id", "method", "seed", "size", "params", "flops", "tokens", "loss", "stderr", "unigram"]
    with open(out / "runs.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in sorted(rows, key=lambda r: (r["method"], r["flops"], r.get("seed", 0))):
            if r["method"] in optimum:
                w.writerow(r)
    print((out / "overtrain.md").read_text())
    return 0
