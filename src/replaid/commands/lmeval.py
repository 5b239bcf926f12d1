"""``replaid lmeval``: EleutherAI's lm-evaluation-harness on a run (``lm_eval.simple_evaluate``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from replaid.commands import NONNEGATIVE, POSITIVE, SEED, STEPS, add_command, check_out, float_in
from replaid.schema import dumps as strict_dumps

EXAMPLE = """example: replaid lmeval runs/demo --tasks replaid_wikitext2 replaid_lambada replaid_cloze \\
    --include-path docs/lmeval/tasks --limit 20 --mc-samples 8 --out runs/demo/lmeval
the same through the harness's own CLI: lm_eval --model replaid --model_args run=runs/demo,mc_samples=8 \\
    --tasks replaid_wikitext2 --include_path docs/lmeval/tasks
what each number is (exact, bound): replaid/hub/lmeval.py; the local tasks: docs/lmeval/README.md"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = add_command(
        sub,
        "lmeval",
        "lm-evaluation-harness tasks on a run (loglikelihood, rolling perplexity from the bound, generation).",
        EXAMPLE,
    )
    e.add_argument("run", help="run directory, exported folder or Hub id")
    e.add_argument("--tasks", nargs="+", required=True, help="harness task or group names")
    e.add_argument("--include-path", default=None, help="folder of extra task YAMLs (e.g. docs/lmeval/tasks)")
    e.add_argument(
        "--limit", type=float_in(1e-6, 1e9), default=None, help="documents per task (a fraction if < 1), in [1e-6, 1e9]"
    )
    e.add_argument("--num-fewshot", type=NONNEGATIVE, default=None, help="few-shot examples (default: the task's)")
    e.add_argument("--mc-samples", type=POSITIVE, default=4, help="diffusion times per scored row (ignored by AR)")
    e.add_argument("--likelihood", choices=["nelbo", "ode"], default="nelbo", help="rolling windows' bound")
    e.add_argument("--K", type=POSITIVE, default=1, help="ODE/IWAE importance samples (--likelihood ode)")
    e.add_argument(
        "--rolling-context",
        type=NONNEGATIVE,
        default=0,
        help="tokens of context of each later rolling window (0: disjoint)",
    )
    e.add_argument("--gen-steps", type=STEPS, default=64, help="sampler steps of generate_until")
    e.add_argument("--batch-size", type=POSITIVE, default=8, help="rows per forward pass")
    e.add_argument("--seed", type=SEED, default=0, help="Monte Carlo and sampling seed")
    e.add_argument("--no-ema", action="store_true", help="score the raw weights, not the EMA")
    e.add_argument("--device", default="auto", help="cpu | cuda | auto")
    e.add_argument("--out", default=None, help="new folder for results.json and results.md")
    e.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    e.set_defaults(func=run)


def _harness() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ValueError(
            "replaid lmeval needs the lm-evaluation-harness: pip install 'replaid[lmeval]' (or bash scripts/setup.sh)"
        ) from None


def run(args: argparse.Namespace) -> int:
    _harness()
    check_out(args.out, protected=(args.run,), names=("results.json", "results.md"))
    if args.include_path and not Path(args.include_path).is_dir():
        raise ValueError(f"--include-path {args.include_path} is not a folder of task YAMLs")
    if args.limit is not None and args.limit <= 0:
        raise ValueError(f"--limit {args.limit:g} must be > 0")
    import logging

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    from replaid.hub.lmeval import ReplaidLM

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    tm = TaskManager(include_path=args.include_path) if args.include_path else TaskManager()
    known = set(tm.all_tasks)
    missing = [t for t in args.tasks if t not in known]
    if missing:
        raise ValueError(
            f"unknown task(s) {', '.join(missing)}; pass --include-path DIR for local task YAMLs "
            f"(docs/lmeval/tasks) or check the name with 'lm_eval ls tasks'"
        )
    lm = ReplaidLM(
        run=args.run,
        mc_samples=args.mc_samples,
        seed=args.seed,
        rolling_context=args.rolling_context,
        likelihood=args.likelihood,
        K=args.K,
        gen_steps=args.gen_steps,
        ema=not args.no_ema,
        device=args.device,
        batch_size=args.batch_size,
    )
    try:
        res = simple_evaluate(
            model=lm,
            tasks=args.tasks,
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            task_manager=tm,
            random_seed=args.seed,
            numpy_random_seed=args.seed,
            torch_random_seed=args.seed,
            fewshot_random_seed=args.seed,
            log_samples=False,
        )
    except (ConnectionError, TimeoutError) as e:
        raise ValueError(
            f"a task's data could not be downloaded ({e.__class__.__name__}); offline, use the local tasks "
            f"(--include-path docs/lmeval/tasks)"
        ) from None
    table = make_table(res)
    out = {"run": args.run, "replaid": lm.describe(), "results": res["results"], "n-samples": res.get("n-samples")}
    out["versions"] = res.get("versions")
    out["lm_eval_version"] = _version()
    if args.out:
        d = Path(args.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "results.json").write_text(strict_dumps(out, indent=2, default=str) + "\n")
        (d / "results.md").write_text(table + "\n" + strict_dumps(out["replaid"], indent=2) + "\n")
    print(strict_dumps(out, default=str) if args.json else table + strict_dumps(out["replaid"], indent=2))
    return 0


def _version() -> str:
    from importlib.metadata import version

    return version("lm-eval")
