"""``replaid`` command line: train, eval, sample, data, presets.

Every bad input ends in one line ``replaid: error: ...`` naming the problem and the fix, exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXAMPLES = {
    "train": "example: replaid train --preset demo --out runs/demo train.steps=200 data.source=../shared/data/wiki-sample",
    "eval": "example: replaid eval runs/demo --split valid --json",
    "sample": "example: replaid sample runs/demo --sampler ddpm --steps 64 --num 4 --length 64 --seed 0",
    "data": "example: replaid data --source ../shared/data/wiki-sample --tokenizer gpt2 "
            "--tokenizer-path ../shared/tokenizers/gpt2 --json",
    "presets": "example: replaid presets",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replaid", description="RePlaid: likelihood-based continuous diffusion LMs.",
                                epilog="run 'replaid COMMAND --help' for each command's options and an example")
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name, help_):
        return add_command(sub, name, help_, EXAMPLES[name])

    t = add("train", "Train a model (RePlaid by default) and evaluate it at the end.")
    t.add_argument("--preset", default="demo", help="named preset (see 'replaid presets'); default demo")
    t.add_argument("--config", help="YAML file of overrides, nested like the config (model:, train:, ...)")
    t.add_argument("--out", help="run directory (config, tokenizer, checkpoints, metrics)")
    t.add_argument("--method", help="method to train (default: the preset's, replaid)")
    t.add_argument("--resume", action="store_true", help="continue exactly from the run's latest checkpoint")
    t.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.steps=100")

    e = add("eval", "Evaluate a run's per-token NELBO (or NLL) bound and perplexity.")
    e.add_argument("run", help="run directory or checkpoint directory")
    e.add_argument("--split", default=None, choices=["train", "valid", "test"])
    e.add_argument("--max-batches", type=int, default=None, help="0 = the whole split")
    e.add_argument("--t-samples", type=int, default=None, help="diffusion times per sequence")
    e.add_argument("--no-ema", action="store_true", help="evaluate the raw weights, not the EMA")
    e.add_argument("--json", action="store_true", help="print one JSON object")

    s = add("sample", "Generate text from a trained run.")
    s.add_argument("run", help="run directory or checkpoint directory")
    s.add_argument("--sampler", default="ddpm", choices=["ddpm", "ddim", "dpmpp2m", "heun"])
    s.add_argument("--steps", type=int, default=64, help="T, number of sampling steps")
    s.add_argument("--num", type=int, default=4)
    s.add_argument("--length", type=int, default=None, help="sequence length (default: the run's)")
    s.add_argument("--temperature", type=float, default=1.0, help="logit temperature")
    s.add_argument("--score-temperature", type=float, default=1.0, help="Plaid's score temperature")
    s.add_argument("--prompt", default=None, help="text fixed at the start of every sample")
    s.add_argument("--infill", default=None, help="START:END[,START:END] spans to fill; needs --context")
    s.add_argument("--context", default=None, help="text whose tokens are kept outside the --infill spans")
    s.add_argument("--batch-size", type=int, default=16)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-self-cond", action="store_true", help="disable self-conditioning while sampling")
    s.add_argument("--trajectory", type=int, default=0, help="record the argmax text every k steps")
    s.add_argument("--json", action="store_true", help="JSONL: ids, text, sampler, steps, nfe, seconds")

    d = add("data", "Describe a data source as seen through a tokenizer.")
    d.add_argument("--source", default="stdlib")
    d.add_argument("--tokenizer", default="bpe")
    d.add_argument("--tokenizer-path", default="")
    d.add_argument("--split", default="train", choices=["train", "valid", "test"])
    d.add_argument("--vocab-size", type=int, default=2048, help="for --tokenizer bpe")
    d.add_argument("--json", action="store_true")

    add("presets", "List the named presets.")
    for mod in _plugins():
        mod.register(sub)
    return p


def add_command(sub, name: str, help_: str, example: str, description: str | None = None):
    """A sub-command parser with the project's help layout (description, then an example)."""
    return sub.add_parser(name, help=help_, description=description or help_, epilog=example,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


# Commands living in their own modules: each has ``register(subparsers)`` adding a parser whose
# ``func`` default is the command's ``run(args) -> int``.
PLUGIN_MODULES = ("replaid.commands.likelihood", "replaid.commands.diagnose", "replaid.commands.quality",
                  "replaid.commands.sweep")


def _plugins():
    import importlib

    mods = []
    for name in PLUGIN_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return mods


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .data import DataError

    args = _parser().parse_args(argv)
    try:
        if hasattr(args, "func"):
            return args.func(args)
        return {"train": cmd_train, "eval": cmd_eval, "sample": cmd_sample, "data": cmd_data,
                "presets": cmd_presets}[args.cmd](args)
    except (ConfigError, DataError, CheckpointError, FileNotFoundError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        print(f"replaid: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("replaid: interrupted", file=sys.stderr)
        return 130


def cmd_presets(args) -> int:
    from .presets import PRESETS

    for name, fn in PRESETS.items():
        print(f"{name:16s} {(fn.__doc__ or '').strip().splitlines()[0]}")
    return 0


def cmd_train(args) -> int:
    from .config import ConfigError, resolve
    from .train import train

    overrides = list(args.overrides)
    if args.method:
        overrides.append(f"method={args.method}")
    if args.resume and args.out:
        cfg_file = Path(args.out) / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"--resume: {args.out} has no config.json; start a run there without --resume first")
        from .config import RunConfig, parse_overrides, set_key

        cfg = RunConfig.from_dict(json.loads(cfg_file.read_text()))
        for k, v in parse_overrides(overrides):
            if k != "train.steps":
                raise ConfigError(f"--resume accepts only train.steps=N as an override, got {k}")
            set_key(cfg, k, v)
        cfg.validate()
    else:
        cfg = resolve(args.preset, args.config, overrides)
    if args.show_config:
        print(cfg.to_json())
        return 0
    if not args.out:
        raise ConfigError("train needs --out DIR (where the run's checkpoints and metrics go)")
    from . import dist

    t0 = time.time()
    try:
        res = train(cfg, Path(args.out), resume=args.resume, progress=not args.no_progress)
    finally:
        main_rank = dist.is_main()
        dist.cleanup()
    res["wall_seconds"] = time.time() - t0
    if main_rank:
        print(json.dumps({k: res[k] for k in ("step", "wall_seconds", "eval") if k in res}, indent=2))
    return 0


def cmd_eval(args) -> int:
    from .evaluate import evaluate_model
    from .loading import load_run

    run = load_run(args.run, use_ema=not args.no_ema)
    cfg = run.cfg
    if args.t_samples is not None:
        cfg.eval.t_samples = args.t_samples
    res = evaluate_model(run.model, run.method, run.data, cfg, args.split, None,
                         max_batches=args.max_batches, progress=not args.json)
    res.update(checkpoint=str(run.ckpt), step=run.step, method=cfg.method, ema=run.ema_loaded,
               weights="ema" if run.ema_loaded else "raw")
    emit(res, args.json)
    return 0


def cmd_sample(args) -> int:
    from .generate import generate
    from .loading import load_run

    run = load_run(args.run, use_ema=True, train_data=False)
    rows = generate(run, args)
    for r in rows:
        print(json.dumps(r) if args.json else r["text"] + "\n" + "-" * 40)
    return 0


def cmd_data(args) -> int:
    from .data import describe

    info = describe(args.source, args.tokenizer, args.tokenizer_path, split=args.split, vocab_size=args.vocab_size)
    emit(info, args.json)
    return 0


def emit(obj: dict, as_json: bool) -> None:
    """One JSON object, or one ``key value`` line per entry."""
    if as_json:
        print(json.dumps(obj))
    else:
        for k, v in obj.items():
            print(f"{k:28s} {v}")


if __name__ == "__main__":
    sys.exit(main())
