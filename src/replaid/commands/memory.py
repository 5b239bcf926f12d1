"""``replaid memory``: estimated peak memory per rank of a training step, and the largest batch per GPU."""

from __future__ import annotations

import argparse
import re

from replaid.commands import POSITIVE, add_command, int_in

EXAMPLE = "example: replaid memory --preset owt-0.1b --per-device-batch 32 --gpu-memory 80GB"
GPUS = {"H100 80GB": 80e9, "H200 141GB": 141e9}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub, "memory", "Estimate the peak memory per rank of a training step (replaid.training.memory).", EXAMPLE
    )
    p.add_argument("--preset", default="owt-0.1b", help="named preset whose model and batch are estimated")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for train")
    p.add_argument("--per-device-batch", type=POSITIVE, default=32, help="sequences per device per micro-step")
    p.add_argument("--gpu-memory", default="80GB", help="memory per device, e.g. 80GB, 141GB")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="bf16 autocast (GPU default) or fp32")
    p.add_argument("--vocab", type=int_in(2), default=None, help="default: the preset tokenizer's vocabulary")
    p.add_argument(
        "--presets",
        nargs="*",
        default=None,
        help="also tabulate the largest per-device batch on an H100 and an H200 for these presets "
        "(no names: owt-0.1b and the isoflop presets)",
    )
    p.set_defaults(func=run)


def parse_bytes(s: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(GB|GiB|MB|MiB)?\s*", s, re.I)
    if not m:
        raise ValueError(f"--gpu-memory {s!r} is not a size; write e.g. 80GB or 141GB")
    unit = (m.group(2) or "GB").lower()
    return float(m.group(1)) * {"gb": 1e9, "gib": 2**30, "mb": 1e6, "mib": 2**20}[unit]


def run(args: argparse.Namespace) -> int:
    from replaid.presets import PRESETS, resolve
    from replaid.training.memory import estimate, largest_batch, preset_vocab

    if args.per_device_batch < 1:
        raise ValueError("--per-device-batch must be >= 1")
    budget = parse_bytes(args.gpu_memory)
    cfg = resolve(args.preset, None, args.overrides)
    V = args.vocab or preset_vocab(cfg)
    bf16 = args.precision == "bf16"
    print(
        f"{args.preset} ({cfg.method}), V = {V}, L = {cfg.data.seq_len}, per-device batch {args.per_device_batch}, "
        f"{args.precision}, activation checkpointing {'on' if cfg.model.activation_checkpointing else 'off'}"
    )
    print(f"{'':32s} {'fused head':>12s} {'plain head':>12s} {'+ act. ckpt':>12s}   GB")
    ests = [
        estimate(cfg, V, args.per_device_batch, bf16, fused_head=True),
        estimate(cfg, V, args.per_device_batch, bf16, fused_head=False),
        estimate(cfg, V, args.per_device_batch, bf16, act_ckpt=True),
    ]
    for k in ests[0].parts:
        print(f"{k:32s} " + " ".join(f"{e.parts[k] / 1e9:12.3f}" for e in ests))
    print(f"{'peak':32s} " + " ".join(f"{e.peak / 1e9:12.3f}" for e in ests))
    fits = ests[0].peak <= budget
    print(
        f"fits {args.gpu_memory}: {'yes' if fits else 'no'}; largest per-device batch: "
        f"{largest_batch(cfg, V, budget, bf16)} ({largest_batch(cfg, V, budget, bf16, act_ckpt=True)} with "
        f"activation checkpointing)"
    )
    if args.presets is not None:
        names = args.presets or ["owt-0.1b"] + [n for n in PRESETS if n.startswith("isoflop")]
        print(f"\nlargest per-device batch ({args.precision}, fused head; with activation checkpointing in brackets)")
        print(f"{'preset':16s} {'L':>6s} {'V':>6s} " + " ".join(f"{g:>18s}" for g in GPUS))
        for n in names:
            c = resolve(n, None, args.overrides)
            v = preset_vocab(c)
            cells = [
                f"{largest_batch(c, v, b, bf16)} ({largest_batch(c, v, b, bf16, act_ckpt=True)})" for b in GPUS.values()
            ]
            print(f"{n:16s} {c.data.seq_len:6d} {v:6d} " + " ".join(f"{x:>18s}" for x in cells))
    return 0
