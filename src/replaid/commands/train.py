"""``replaid train``: train a model (RePlaid by default) and evaluate it at the end."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from replaid.commands import add_command, add_gpu_memory_option, int_in
from replaid.config import ConfigError, RunConfig
from replaid.registry import method_names
from replaid.schema import dumps as strict_dumps

EXAMPLE = (
    "example: replaid train --preset demo --out runs/demo train.steps=200 data.source=../shared/data/wiki-sample\n"
    "block diffusion (text of any length, written block by block; replaid sample --max-tokens, replaid serve):\n"
    "  diffusion.block_size=B  RePlaid/Plaid in blocks of B tokens (0: the whole sequence), e.g.\n"
    "         replaid train --preset demo --out runs/bd-replaid diffusion.block_size=4\n"
    "  mdlm.block_size=B       MDLM in blocks of B tokens (BD3-LM), e.g.\n"
    "         replaid train --preset demo --out runs/bd3 method=mdlm mdlm.block_size=4\n"
    "every key and its value: replaid train --show-config (docs/guides/commands.md)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = add_command(sub, "train", "Train a model (RePlaid by default) and evaluate it at the end.", EXAMPLE)
    t.add_argument("--preset", default="demo", help="named preset (see 'replaid presets')")
    t.add_argument(
        "--config",
        help="YAML file of overrides, nested like the config (model:, train:, ...); "
        "applied after the preset, before the key=value overrides",
    )
    t.add_argument("--out", help="run directory (config, tokenizer, checkpoints, metrics)")
    try:  # the registered names (plug-ins too), read from package metadata: no method is imported
        names: tuple[str, ...] | None = method_names()
    except ConfigError:  # a name registered twice: config validation names the clash in one line
        names = None
    t.add_argument("--method", choices=names, help="method to train (default: the preset's, replaid)")
    t.add_argument("--resume", action="store_true", help="continue exactly from the run's latest checkpoint")
    t.add_argument("--overwrite", action="store_true", help="replace the run already in --out (deletes it)")
    t.add_argument(
        "--resume-weights-only",
        action="store_true",
        help="with --resume: accept a checkpoint without optimizer/RNG state (fresh optimizer)",
    )
    t.add_argument(
        "--accept-changed-data",
        action="store_true",
        help="with --resume: go on although the corpus changed since the checkpoint (a row of "
        "metrics.jsonl records the step and the old and new fingerprints)",
    )
    t.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument(
        "--nodes",
        type=int_in(0, 4096),
        default=0,
        help="submit the run to SLURM over N nodes (one torchrun per node, c10d rendezvous on the first)",
    )
    t.add_argument("--gpus-per-node", type=int_in(0, 1024), default=0, help="with --nodes: GPUs (ranks) per node")
    t.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="OPTION",
        help="with --nodes: an extra #SBATCH option, e.g. --slurm --partition=gpu",
    )
    add_gpu_memory_option(t, "with --nodes")
    t.add_argument(
        "--dry-run",
        action="store_true",
        help="with --nodes: print the sbatch script and node 0's command, submit nothing",
    )
    t.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.steps=100")
    t.set_defaults(func=run)


def submit(args: argparse.Namespace, cfg: RunConfig) -> int:
    """``--nodes N --gpus-per-node G``: the sbatch script of the run (``scaling/launch.py``), printed
    with ``--dry-run``, else written next to ``--out`` (``OUT.sbatch``) and handed to ``sbatch``."""
    import shlex
    import shutil
    import subprocess
    import sys

    from replaid.config import ConfigError
    from replaid.scaling import launch

    if args.nodes < 1 or args.gpus_per_node < 1:
        raise ConfigError(f"--nodes {args.nodes} --gpus-per-node {args.gpus_per_node}: both must be >= 1")
    if not args.out:
        raise ConfigError("train --nodes needs --out DIR (on a file system every node sees)")
    if args.resume or args.overwrite:
        raise ConfigError(
            "train --nodes submits a new run; its requeued jobs resume by themselves (no --resume/--overwrite)"
        )
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # the job would find out/config.json and resume that run, dropping this command's overrides
        raise ConfigError(
            f"--out {args.out} already holds a run or other files; train --nodes submits a new run: choose a "
            f"new folder (a run already there resumes with 'replaid train --out {args.out} --resume')"
        )
    from replaid.training.layout import check_layout

    world = args.nodes * args.gpus_per_node  # the layout the job will run, refused now rather than on the nodes
    where = f"--nodes {args.nodes} --gpus-per-node {args.gpus_per_node}"
    check_layout(cfg, world, args.gpus_per_node, where, gpu_gb=args.gpu_memory_gb)
    rest = ["--preset", args.preset] + (["--config", args.config] if args.config else [])
    rest += (["--method", args.method] if args.method else []) + ["--no-progress", *args.overrides]
    script = launch.sbatch_script(
        args.out, rest, args.nodes, args.gpus_per_node, extra=args.slurm, python=sys.executable
    )
    if args.dry_run:
        node0 = launch.torchrun_argv(args.gpus_per_node, args.nodes, {"MASTER_ADDR": "HEAD_NODE", "SLURM_NODEID": "0"})
        print(script)
        print(f"# node 0 runs: {shlex.join([*node0, 'train', '--out', args.out, *rest])}")
        return 0
    if not shutil.which("sbatch"):
        raise ConfigError("train --nodes needs SLURM's sbatch on PATH (run it on a login node), or pass --dry-run")
    path = Path(str(Path(args.out)).rstrip("/") + ".sbatch")
    path.write_text(script)
    r = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ConfigError(f"sbatch {path} failed: {(r.stderr or r.stdout).strip()[:200]}")
    print(r.stdout.strip())
    return 0


def run(args: argparse.Namespace) -> int:
    from replaid import dist
    from replaid.config import ConfigError, parse_overrides, read_run_config, set_key
    from replaid.eval.evaluate import evaluate
    from replaid.presets import resolve
    from replaid.store import runfolder
    from replaid.training.train import train

    overrides = list(args.overrides)
    if args.method:
        overrides.append(f"method={args.method}")
    if args.resume_weights_only and not args.resume:
        raise ConfigError("--resume-weights-only modifies --resume; pass both")
    if args.accept_changed_data and not args.resume:
        raise ConfigError("--accept-changed-data modifies --resume (a run whose corpus changed); pass both")
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite deletes it; pass one of them")
    if args.resume and args.out:
        cfg_file = Path(args.out) / "config.json"
        if not cfg_file.is_file():
            runfolder.check_free(Path(args.out))  # a trainer starting there has not written it yet
            raise ConfigError(f"--resume: {args.out} has no config.json; start a run there without --resume first")
        cfg = read_run_config(cfg_file)
        for k, v in parse_overrides(overrides):
            if k != "train.steps":
                raise ConfigError(f"--resume accepts only train.steps=N as an override, got {k}")
            set_key(cfg, k, v)
        cfg.validate()
        _check_resume_steps(Path(args.out), cfg.train.steps)
    else:
        cfg = resolve(args.preset, args.config, overrides)
    if args.show_config:
        print(cfg.to_json())
        return 0
    if args.nodes or args.gpus_per_node or args.dry_run or args.slurm or args.gpu_memory_gb:
        if not args.nodes:
            raise ConfigError(
                "--gpus-per-node, --slurm, --gpu-memory-gb and --dry-run go with --nodes N (a SLURM submission)"
            )
        return submit(args, cfg)
    if not args.out:
        raise ConfigError("train needs --out DIR (where the run's checkpoints and metrics go)")
    t0 = time.time()
    try:
        res = train(
            cfg,
            Path(args.out),
            evaluate=evaluate,
            resume=args.resume,
            progress=not args.no_progress,
            overwrite=args.overwrite,
            weights_only=args.resume_weights_only,
            accept_changed_data=args.accept_changed_data,
        )
    finally:
        main_rank = dist.is_main()
        dist.cleanup()
    res["wall_seconds"] = time.time() - t0
    if main_rank:
        print(strict_dumps({k: res[k] for k in ("step", "wall_seconds", "eval") if k in res}, indent=2))
    return 0


def _check_resume_steps(run_dir: Path, steps: int) -> None:
    """Refuse ``--resume train.steps=N`` below the step the run has reached (it would do nothing)."""
    from replaid.config import ConfigError
    from replaid.store import checkpoint as ck

    ckpt = ck.latest_checkpoint(run_dir)
    at = ck.load_state(ckpt)["step"] if ckpt is not None else 0
    if isinstance(at, int) and at > steps:
        raise ConfigError(
            f"--resume: {run_dir} is at step {at}, beyond train.steps={steps}; pass train.steps={at} or more "
            f"to train on, or evaluate it with 'replaid eval {run_dir}'"
        )
