"""What progressive distillation of a block model costs in sample quality (issue 39 §2; docs/results/blocks/distill.md).

    PYTHONPATH=src .venv/bin/python scripts/blocks_distill_quality.py --judge-run runs/ar \\
        --model "teacher=runs/bd16:64,4,2" --model "PD-4=runs/bd16-pd4:4" --model "PD-2=runs/bd16-pd2:2" \\
        --num 128 --seed 0 --out docs/results/blocks/distill.json

Each ``LABEL=RUN:STEPS[,STEPS]`` writes ``--num`` unconditional samples of ``data.seq_len`` tokens block by
block (:func:`replaid.sampling.loop.sample_any_length`, DDIM, ``STEPS`` per block, the KV cache); every
model draws its blocks' starting noise from the same seeded generator, so sample *i* of two models is a
pair. Scored: GenPPL under an AR judge run (same corpus), the mean per-sample unigram entropy of the ids,
the repetition rate (share of a sample's 4-grams of ids that repeat an earlier 4-gram of the sample), and
the same three for ``--num`` held-out windows. ``--pair A B`` (``LABEL:STEPS`` each): the per-sample
difference of judge nats/token, mean and 95% t-interval over the pairs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
from pathlib import Path


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    from scipy import stats

    m, s = statistics.fmean(xs), statistics.stdev(xs)
    h = float(stats.t.ppf(0.975, len(xs) - 1)) * s / math.sqrt(len(xs))
    return m, m - h, m + h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="LABEL=RUN:STEPS[,STEPS] (DDIM steps per block)")
    p.add_argument("--judge-run", required=True, help="an AR run on the same corpus")
    p.add_argument("--num", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import torch

    from replaid.eval.quality import gen_ppl_ar_run, reference_windows, repetition_rate, unigram_entropy
    from replaid.sampling.loop import sample_any_length
    from replaid.store.loading import load_run

    torch.set_num_threads(1)
    judge = load_run(a.judge_run, device="cpu")

    def score(texts: list[str], ids: list[list[int]]) -> dict:
        g = gen_ppl_ar_run(texts, judge)
        return {
            "gen_ppl": g["gen_ppl"],
            "judge_nats_per_token": g["nats_per_token"],
            "entropy": unigram_entropy(ids)["entropy"],
            "repetition_4gram": repetition_rate(ids, 4)["repetition"],
            "per_sample_judge_nats": g["per_sample"],
        }

    rows, first_run = {}, None
    for spec in a.model:
        label, rest = spec.split("=", 1)
        path, steps = rest.rsplit(":", 1)
        run = load_run(path, use_ema=True, train_data=False, device="cpu")
        first_run = first_run or run
        b, L = run.method.stream_block() or int(run.cfg.data.seq_len), int(run.cfg.data.seq_len)
        for T in (int(s) for s in steps.split(",")):
            res = sample_any_length(
                run.method,
                run.model,
                torch.zeros(a.num, 0, dtype=torch.long),
                L,
                sampler="ddim",
                steps=T,
                generator=torch.Generator().manual_seed(a.seed),
            )
            ids = res.tokens.tolist()
            texts = [run.tokenizer.decode(x) for x in ids]
            rows[f"{label}:{T}"] = {
                "model": label,
                "run": path,
                "steps_per_block": T,
                "nfe_per_block": res.nfe / (L // b),  # T + 1 denoiser calls and a commit (but the last block)
                "block": b,
                **score(texts, ids),
                "examples": texts[:3],
            }
            r = rows[f"{label}:{T}"]
            print(
                f"{label}:{T}  GenPPL {r['gen_ppl']:.1f}  entropy {r['entropy']:.3f}  rep4 {r['repetition_4gram']:.4f}"
            )
    assert first_run is not None
    ref_texts, ref_ids = reference_windows(first_run, "valid", a.num)
    ref = score(ref_texts, ref_ids)
    print(f"held-out  GenPPL {ref['gen_ppl']:.1f}  entropy {ref['entropy']:.3f}  rep4 {ref['repetition_4gram']:.4f}")
    pairs = []
    for A, B in a.pair:
        d = [x - y for x, y in zip(rows[A]["per_sample_judge_nats"], rows[B]["per_sample_judge_nats"], strict=True)]
        m, lo, hi = t_interval(d)
        pairs.append({"a": A, "b": B, "mean": m, "lo": lo, "hi": hi, "n": len(d)})
        print(f"{A} - {B}: judge nats/token {m:+.4f} [{lo:+.4f}, {hi:+.4f}]  (GenPPL x{math.exp(m):.3f})")
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "host": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}".strip(),
        "judge_run": a.judge_run,
        "num": a.num,
        "seed": a.seed,
        "rows": rows,
        "held_out": ref,
        "pairs": pairs,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
