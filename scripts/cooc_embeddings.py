"""Write a run config's data-initialised embeddings (issue 48 §3): the top-d_e PPMI directions of the
token co-occurrences of its train split (:mod:`replaid.data.cooc`), for ``model.embeddings=init-file``.

    python scripts/cooc_embeddings.py GRID/configs/replaid__s0.json --out runs/cooc-linux.safetensors
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from replaid.config import ConfigError, read_run_config
from replaid.data.cooc import cooc_embeddings
from replaid.data.pipeline import DataPipeline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", type=Path, help="a run config (config.json) naming the corpus and tokenizer")
    p.add_argument("--out", type=Path, required=True, help="the .safetensors file to write (key 'embedding')")
    p.add_argument("--window", type=int, default=2, help="co-occurrence window, tokens either side (default 2)")
    p.add_argument("--max-tokens", type=int, default=0, help="count only the train split's first N tokens (0: all)")
    args = p.parse_args(argv)
    if args.out.exists() or args.out.suffix != ".safetensors" or args.window < 1:
        print(f"replaid: error: --out {args.out}: must be a new .safetensors file, --window >= 1", file=sys.stderr)
        return 2
    try:
        cfg = read_run_config(args.config)
    except (ConfigError, OSError) as e:
        print(f"replaid: error: {args.config}: {e}", file=sys.stderr)
        return 2
    data = DataPipeline(cfg, train=False)
    tokens, _ = data.array("train")
    if args.max_tokens > 0:
        tokens = tokens[: args.max_tokens]
    w = cooc_embeddings(tokens, data.vocab_size, cfg.model.d_e, args.window, cfg.train.seed)
    save_file({"embedding": torch.from_numpy(w)}, str(args.out))
    print(f"wrote {args.out}: ({data.vocab_size}, {cfg.model.d_e}) unit rows from {len(tokens)} train tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
