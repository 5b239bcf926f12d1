"""``replaid plan-cluster``: per-GPU memory, bytes moved, step time and wall time of a run on N nodes x G
GPUs (the scaling model of ``replaid.scaling.cluster``)."""

from __future__ import annotations

import argparse
import sys

from replaid.commands import POSITIVE, add_command, float_in, int_in

EXAMPLE = "example: replaid plan-cluster --preset owt-0.1b isoflop-413m --nodes 1 2 16 --budget 1e20 --mfu 0.4"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "plan-cluster",
        "Predict per-GPU memory, bytes moved per step, step time and wall time to a FLOP budget on N x G GPUs.",
        EXAMPLE,
    )
    p.add_argument("--preset", nargs="+", default=["owt-0.1b"], help="presets (model, sequence length, batch)")
    p.add_argument("--nodes", type=POSITIVE, nargs="+", default=[1, 2, 16], help="node counts, one row each")
    p.add_argument("--gpus-per-node", type=POSITIVE, default=8, help="GPUs per node")
    p.add_argument("--global-batch", type=POSITIVE, default=0, help="sequences per step (0: the preset's)")
    p.add_argument(
        "--micro-batch", type=int_in(0, 1 << 20), default=0, help="per-GPU micro-batch (0: the largest that fits)"
    )
    p.add_argument("--parallel", choices=["ddp", "fsdp", "hsdp"], default="hsdp", help="data parallelism")
    p.add_argument("--budget", type=float_in(1, 1e28), default=1e20, help="training FLOPs of the run")
    p.add_argument("--mfu", type=float_in(1e-3, 1), default=0.4, help="model FLOPs utilisation assumed for the compute")
    p.add_argument(
        "--peak-tflops",
        type=float_in(1e-3, 1e6),
        default=989.0,
        help="peak dense bf16 TFLOP/s per GPU (H100 SXM)",
    )
    p.add_argument(
        "--nvlink-gbps",
        type=float_in(1e-3, 1e6),
        default=450.0,
        help="GB/s per GPU within a node, one direction",
    )
    p.add_argument("--ib-gbps", type=float_in(1e-3, 1e6), default=50.0, help="GB/s per GPU across nodes (400 Gb/s NDR)")
    p.add_argument("--gpu-memory-gb", type=float_in(1e-3, 1e6), default=80.0, help="memory per GPU, GB")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.config import ConfigError
    from replaid.presets import resolve
    from replaid.scaling.cluster import Hardware, plan
    from replaid.training.memory import preset_vocab

    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu} must lie in (0, 1]")
    for k in ("budget", "peak_tflops", "nvlink_gbps", "ib_gbps", "gpu_memory_gb"):
        if not getattr(args, k) > 0:
            raise ConfigError(f"--{k.replace('_', '-')} must be positive")
    hw = Hardware(
        args.peak_tflops * 1e12, args.mfu, args.nvlink_gbps * 1e9, args.ib_gbps * 1e9, args.gpu_memory_gb * 1e9
    )
    print(
        f"{args.parallel}, {args.gpus_per_node} GPUs per node, {args.budget:.3g} FLOPs, MFU {args.mfu:g}, peak "
        f"{args.peak_tflops:g} TFLOP/s, NVLink {args.nvlink_gbps:g} GB/s, IB {args.ib_gbps:g} GB/s per GPU; "
        f"step time = compute + communication (no overlap)"
    )
    head = ("preset", "nodes", "GPUs", "micro x acc", "mem GB", "fits", "NVLink GB", "IB GB", "compute s", "comm s", "step s", "steps", "wall h")  # fmt: skip
    over: list[str] = []  # the plans that need more memory per GPU than the stated GPU has
    print(" ".join(f"{h:>12s}" if i else f"{h:14s}" for i, h in enumerate(head)))
    for name in args.preset:
        cfg = resolve(name, None, [f"train.batch_size={args.global_batch}"] if args.global_batch else [])
        V = preset_vocab(cfg)
        for n in args.nodes:
            r = plan(cfg, V, n, args.gpus_per_node, args.budget, args.parallel, hw, args.micro_batch)
            cells = [
                f"{n}",
                f"{n * r.gpus}",
                f"{r.micro} x {r.accum}",
                f"{r.memory / 1e9:.1f}",
                "yes" if r.fits else "NO",
                f"{r.intra / 1e9:.3f}",
                f"{r.inter / 1e9:.3f}",
                f"{r.compute_s:.4f}",
                f"{r.comm_s:.4f}",
                f"{r.step_s:.4f}",
                f"{r.steps:.3g}",
                f"{r.wall_h:.2f}",
            ]
            print(f"{name:14s} " + " ".join(f"{c:>12s}" for c in cells))
            if not r.fits:
                over.append(f"{name} on {n} node(s): {r.memory / 1e9:.3g} GB")
    if over:  # a plan over the stated GPU's memory says so, row by row
        print(
            f"replaid: warning: {len(over)} plan(s) do not fit the stated {args.gpu_memory_gb:g} GB per GPU even at the "
            f"smallest micro-batch ({'; '.join(over[:3])}{'; ...' if len(over) > 3 else ''}): more GPUs, "
            f"--parallel fsdp, model.activation_checkpointing=true or a larger --gpu-memory-gb",
            file=sys.stderr,
        )
    return 0
