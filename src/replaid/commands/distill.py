"""``replaid distill``: few-step students of a RePlaid run (progressive or consistency distillation)."""

from __future__ import annotations

import argparse

from replaid.commands import NONNEGATIVE, POSITIVE, SEED, add_command, float_in, int_in
from replaid.config import LR_MAX
from replaid.schema import dumps as strict_dumps

EXAMPLE = """example: replaid distill runs/demo --out runs/demo-pd8 --from-steps 64 --to-steps 8 --steps-per-round 200
         replaid distill runs/demo --out runs/demo-cd --method consistency --cd-steps 400
then:    replaid sample runs/demo-pd8 --sampler ddim --steps 8     (progressive student: DDIM at its steps)
         replaid sample runs/demo-cd --sampler consistency --steps 4  (consistency student: 1, 2, 4, 8 NFE)
         replaid sample runs/demo-pd8/checkpoints/step_0000400 --sampler ddim --steps 16   (every round's
         student is kept: checkpoints/step_{r x steps-per-round} samples at from-steps / 2^r)
         replaid eval runs/demo-pd8   |   replaid export runs/demo-pd8 --out exports/demo-pd8"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from replaid.distill.config import METHODS, DistillConfig

    d = DistillConfig()
    p = add_command(
        sub,
        "distill",
        "Distil a RePlaid run's probability-flow ODE into a few-step student (a new run folder).",
        EXAMPLE,
    )
    p.add_argument("teacher", help="teacher: a RePlaid run directory, checkpoint directory or Hub id")
    p.add_argument("--out", required=True, help="the student's run folder")
    p.add_argument("--method", choices=METHODS, default=d.method, help="progressive (Salimans & Ho) or consistency")
    p.add_argument(
        "--from-steps", type=POSITIVE, default=d.from_steps, help="progressive: teacher DDIM steps of round 1"
    )
    p.add_argument(
        "--to-steps", type=POSITIVE, default=d.to_steps, help="progressive: student steps after the last round"
    )
    p.add_argument(
        "--steps-per-round",
        type=POSITIVE,
        default=d.steps_per_round,
        help="progressive: optimiser steps per halving (each halving's student is kept as a checkpoint)",
    )
    p.add_argument(
        "--teacher-solver",
        choices=("ddim", "heun"),
        default=d.teacher_solver,
        help="progressive: the solver of the first round's two teacher steps (later rounds: the previous "
        "student's DDIM steps)",
    )
    p.add_argument("--cd-steps", type=POSITIVE, default=d.cd_steps, help="consistency: optimiser steps")
    p.add_argument("--cd-levels", type=POSITIVE, default=d.cd_levels, help="consistency: levels N of the time grid")
    p.add_argument("--cd-solver", choices=("heun", "ddim"), default=d.cd_solver, help="consistency: teacher ODE step")
    p.add_argument(
        "--cd-ema",
        type=float_in(0, 1, hi_open=True),
        default=d.cd_ema,
        help="consistency: EMA decay of the target network",
    )
    p.add_argument(
        "--lr", type=float_in(1e-10, LR_MAX), default=d.lr, help=f"learning rate (AdamW), in [1e-10, {LR_MAX:g}]"
    )
    p.add_argument("--batch-size", type=NONNEGATIVE, default=d.batch_size, help="rows per step (0: the teacher's)")
    p.add_argument("--seed", type=SEED, default=d.seed, help="seed of the data order and noise")
    p.add_argument("--save-every", type=POSITIVE, default=d.save_every, help="checkpoint every N steps")
    p.add_argument(
        "--num-threads", type=int_in(0, 1024), default=d.num_threads, help="torch CPU threads (0: torch's default)"
    )
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda")
    p.add_argument("--resume", action="store_true", help="continue the distillation in --out")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument(
        "--stop-after", type=POSITIVE, default=None, help="stop after N more steps (checkpointed; --resume goes on)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.distill.loop import DistillConfig, distill

    dcfg = DistillConfig(
        method=args.method,
        from_steps=args.from_steps,
        to_steps=args.to_steps,
        steps_per_round=args.steps_per_round,
        teacher_solver=args.teacher_solver,
        cd_steps=args.cd_steps,
        cd_levels=args.cd_levels,
        cd_solver=args.cd_solver,
        cd_ema=args.cd_ema,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        save_every=args.save_every,
        num_threads=args.num_threads,
        device=args.device,
    )
    out = distill(
        args.teacher,
        args.out,
        dcfg,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        stop_after=args.stop_after,
    )
    print(strict_dumps(out))
    K = out["student_steps"]
    sampler = "consistency" if args.method == "consistency" else "ddim"
    print(f"student: {args.out}  (sample it: replaid sample {args.out} --sampler {sampler} --steps {K})")
    return 0
