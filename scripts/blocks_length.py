"""Text at length from block-diffusion runs (issue 39 §4 "Text at length"; docs/results/blocks/length/).

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python scripts/blocks_length.py \\
        --model "RePlaid-B16=RUN_A" --model "MDLM-B16=RUN_B" --judge-run runs/judge-ar \\
        --source ../shared/data/linux-docs --lengths 64,256,512 --num 128 --seed 0 \\
        --samples runs/length --out docs/results/blocks/length/length.json
    .venv/bin/python scripts/blocks_length.py --plot docs/results/blocks/length/length.json   # the PNG only

Each ``LABEL=RUN[@T]`` writes ``--num`` unconditional samples of the longest length with the run's default
sampler (``--steps`` per block, logit temperature ``T``, default 1), exactly as ``replaid sample RUN
--max-tokens N --ignore-eos --num NUM --batch-size B --steps S --seed SEED --json`` does (the same
:func:`~replaid.sampling.generate.generate` request; past ``data.seq_len`` the KV cache slides, keeping
the last ``seq_len - b`` committed rows). Every shorter length is the prefix of those samples: blocks are
drawn in order from one seeded generator, so a sample of 64 tokens *is* the first 64 tokens of the
sample of 512 at the same seed and batch size (``--check-prefix`` draws one batch at the shortest length
and asserts it). The samples are written as ``replaid sample --json`` rows to ``--samples`` (one file per
model and length), so ``replaid quality FILE --judge-run ...`` can re-score any of them.

Scored at each length, for the samples and for held-out text of the same length (``--num`` windows of
the valid split's token stream, documents joined by end-of-text as training packs them, evenly spaced;
each shorter window is the prefix of the longest, as for the samples):

* GenPPL under the AR judge run (:func:`~replaid.eval.quality.gen_ppl_ar_run`: the text re-encoded with
  the judge's tokenizer, cut into chunks of the judge's ``data.seq_len`` tokens, each chunk scored alone
  from the judge's BOS); and per 64-token segment of the longest samples (GenPPL along the sample);
* the mean per-sample unigram entropy of the ids and the share of repeated 4-grams of ids
  (:func:`~replaid.eval.quality.repetition_rate`), each with a 95% t-interval over samples and its gap
  to the held-out text's (Welch interval);
* MAUVE of each text's last ``--mauve-tokens`` tokens (default 64, the whole text at 1x; at 4x and 8x the
  text written last, past the training context) against the same positions of a second, disjoint set of
  held-out windows (all-MiniLM-L6-v2 features, at most ``--feature-tokens`` word pieces), for
  ``--mauve-seeds`` k-means seeds (mean, min, max); the held-out windows against the second set give the
  ceiling at this sample count. (Features of whole 512-token texts cost ~20x more on this CPU.)

``--ar-samples``: the judge's own samples at its ``data.seq_len`` (1x only), scored the same way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of ``xs``."""
    from scipy import stats

    m, s = statistics.fmean(xs), statistics.stdev(xs)
    h = float(stats.t.ppf(0.975, len(xs) - 1)) * s / math.sqrt(len(xs))
    return m, m - h, m + h


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% Welch interval."""
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    h = float(stats.t.ppf(0.975, df)) * se
    return d, d - h, d + h


def summary(xs: list[float]) -> dict[str, float]:
    m, lo, hi = t_interval(xs)
    return {"mean": m, "lo": lo, "hi": hi}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], help="LABEL=RUN[@T] (T: logit temperature)")
    p.add_argument("--judge-run", help="an AR run on the same corpus and tokenizer")
    p.add_argument("--source", help="the corpus (data.source) of the held-out windows")
    p.add_argument("--lengths", default="64,256,512")
    p.add_argument("--num", type=int, default=128)
    p.add_argument("--steps", type=int, default=64, help="sampling steps per block")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mauve-tokens", type=int, default=64, help="MAUVE sees each text's last N tokens")
    p.add_argument("--feature-tokens", type=int, default=512, help="MAUVE encoder truncation (word pieces)")
    p.add_argument("--mauve-seeds", type=int, default=5)
    p.add_argument("--check-prefix", action="store_true", help="assert the shortest length is the prefix")
    p.add_argument("--ar-samples", action="store_true", help="also the judge's own samples (1x only)")
    p.add_argument("--examples", type=int, default=3)
    p.add_argument("--samples", default=None, help="folder for the samples (replaid sample --json rows)")
    p.add_argument("--out", help="the JSON written")
    p.add_argument("--plot", default=None, metavar="JSON", help="only draw the PNG beside JSON")
    a = p.parse_args(argv)
    if a.plot:
        plot(Path(a.plot))
        return
    if not (a.model and a.judge_run and a.source and a.out):
        p.error("--model, --judge-run, --source and --out are required (or --plot JSON)")

    import torch

    from replaid.eval.quality import (
        gen_ppl_ar_run,
        mauve_score,
        repetition_rate,
        sentence_features,
        unigram_entropy,
    )
    from replaid.sampling.generate import generate
    from replaid.sampling.request import SampleRequest
    from replaid.store.loading import load_run

    torch.set_num_threads(1)
    lengths = sorted(int(x) for x in a.lengths.split(","))
    longest = lengths[-1]
    judge = load_run(a.judge_run, device="cpu")
    judge_L = int(judge.cfg.data.seq_len)
    samples_dir = Path(a.samples) if a.samples else None
    if samples_dir:
        samples_dir.mkdir(parents=True, exist_ok=True)

    def request(num: int, max_tokens: int | None, temperature: float) -> SampleRequest:
        req = SampleRequest(
            num=num,
            batch_size=min(a.batch_size, num),
            steps=a.steps,
            seed=a.seed,
            max_tokens=max_tokens,
            ignore_eos=max_tokens is not None,
            temperature=temperature,
        )
        req.progress = False
        return req

    # ---------------------------------------------------------------- held-out windows
    judge.cfg.data.source = a.source
    arr, _ = judge.data.array("valid")
    need = 2 * a.num  # set A (scored like samples) and set B (MAUVE's reference), interleaved, disjoint
    spacing = (len(arr) - longest) // need
    if spacing < longest:
        raise SystemExit(f"the valid split ({len(arr)} tokens) is too short for {need} windows of {longest}")
    starts = [i * spacing for i in range(need)]
    held_a = [arr[s : s + longest].tolist() for s in starts[0::2]]
    held_b = [arr[s : s + longest].tolist() for s in starts[1::2]]
    tok = judge.tokenizer

    feats_cache: dict[tuple[str, int], Any] = {}

    def features(key: str, n: int, ids: list[list[int]]):
        if (key, n) not in feats_cache:
            tails = [tok.decode(x[max(0, n - a.mauve_tokens) : n]) for x in ids]
            feats_cache[key, n] = sentence_features(tails, max_length=a.feature_tokens)
        return feats_cache[key, n]

    from transformers import AutoTokenizer

    from replaid.eval.quality import default_encoder_path

    enc = AutoTokenizer.from_pretrained(default_encoder_path(), local_files_only=True)

    def truncated_share(texts: list[str]) -> float:
        return statistics.fmean(float(len(enc(t)["input_ids"]) > a.feature_tokens) for t in texts)

    def score(key: str, ids: list[list[int]], n: int) -> dict[str, Any]:
        cut = [x[:n] for x in ids]
        texts = [tok.decode(x) for x in cut]
        g = gen_ppl_ar_run(texts, judge)
        ent = unigram_entropy(cut)["per_sample"]
        rep = repetition_rate(cut, 4)["per_sample"]
        mv = [
            mauve_score(features(key, n, ids), features("held-out B", n, held_b), seed=s)
            for s in range(1, a.mauve_seeds + 1)
        ]
        out: dict[str, Any] = {
            "tokens": n,
            "gen_ppl": g["gen_ppl"],
            "judge_nats_per_token": g["nats_per_token"],
            "judge_tokens": g["tokens"],
            "judge_nats_per_sample": summary(g["per_sample"]),
            "entropy": summary(ent),
            "repetition_4gram": summary(rep),
            "mauve": {"mean": statistics.fmean(mv), "min": min(mv), "max": max(mv), "seeds": mv},
            "mauve_truncated_share": truncated_share([tok.decode(x[max(0, n - a.mauve_tokens) :]) for x in cut]),
            "per_sample": {"judge_nats": g["per_sample"], "entropy": ent, "repetition_4gram": rep},
        }
        if n == longest and n > judge_L:  # GenPPL along the sample: each judge-context segment alone
            segs = []
            for s in range(0, n, judge_L):
                gs = gen_ppl_ar_run([tok.decode(x[s : s + judge_L]) for x in ids], judge)
                segs.append({"start": s, "gen_ppl": gs["gen_ppl"], "judge_nats_per_token": gs["nats_per_token"]})
            out["segments"] = segs
        return out

    def gaps(row: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k in ("judge_nats", "entropy", "repetition_4gram"):
            d, lo, hi = welch(row["per_sample"][k], ref["per_sample"][k])
            out[k] = {"diff": d, "lo": lo, "hi": hi}
        out["gen_ppl_ratio"] = row["gen_ppl"] / ref["gen_ppl"]
        return out

    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "host": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}".strip(),
        "judge_run": a.judge_run,
        "judge_seq_len": judge_L,
        "source": a.source,
        "lengths": lengths,
        "num": a.num,
        "steps_per_block": a.steps,
        "batch_size": a.batch_size,
        "seed": a.seed,
        "feature_tokens": a.feature_tokens,
        "mauve_tokens": a.mauve_tokens,
        "held_out_windows": {"tokens_in_split": int(len(arr)), "spacing": spacing, "sets": 2},
        "rows": {},
    }

    t0 = time.process_time()
    ref = {n: score("held-out A", held_a, n) for n in lengths}
    for n in lengths:
        ref[n]["examples"] = [tok.decode(x[:n]) for x in held_a[: a.examples]]
    result["held_out"] = {str(n): ref[n] for n in lengths}
    result["held_out_cpu_s"] = time.process_time() - t0
    print(f"held-out scored ({result['held_out_cpu_s']:.0f} CPU-s)", flush=True)

    for spec in a.model:
        label, rest = spec.split("=", 1)
        path, _, temp = rest.partition("@")
        T = float(temp) if temp else 1.0
        run = load_run(path, use_ema=True, device="cpu")
        t0 = time.process_time()
        rows = generate(run, request(a.num, longest, T))
        cpu = time.process_time() - t0
        ids = [r["ids"] for r in rows]
        assert all(len(x) == longest for x in ids), "a sample is shorter than --lengths' longest"
        if a.check_prefix:
            short = generate(run, request(min(a.batch_size, a.num), lengths[0], T))
            assert [r["ids"] for r in short] == [x[: lengths[0]] for x in ids[: len(short)]], "prefix differs"
        vocab = run.tokenizer.vocab_size
        entry: dict[str, Any] = {
            "run": path,
            "method": run.cfg.method,
            "step": run.step,
            "block": run.method.block_size(),
            "seq_len": int(run.cfg.data.seq_len),
            "sampler": rows[0]["sampler"],
            "temperature": T,
            "nfe_per_sample": rows[0]["nfe"],
            "sampling_cpu_s": cpu,
            "prefix_checked": a.check_prefix,
            "lengths": {},
        }
        for n in lengths:
            s = score(label, ids, n)
            s["examples"] = [tok.decode(x[:n]) for x in ids[: a.examples]]
            s["gap_to_held_out"] = gaps(s, ref[n])
            entry["lengths"][str(n)] = s
            if samples_dir:
                with open(samples_dir / f"{label}_{n}.jsonl", "w") as f:
                    for x in ids:
                        f.write(json.dumps({"ids": x[:n], "text": tok.decode(x[:n]), "vocab_size": vocab}) + "\n")
            print(
                f"{label} {n}: GenPPL {s['gen_ppl']:.1f}  H {s['entropy']['mean']:.3f}  rep4 "
                f"{s['repetition_4gram']['mean']:.4f}  MAUVE {s['mauve']['mean']:.3f}",
                flush=True,
            )
        entry["scoring_cpu_s"] = time.process_time() - t0 - cpu
        result["rows"][label] = entry

    if a.ar_samples:
        t0 = time.process_time()
        rows = generate(judge, request(a.num, None, 1.0))
        ids = [r["ids"] for r in rows]
        n = min(len(x) for x in ids)
        s = score("AR judge", ids, n)
        s["examples"] = [tok.decode(x) for x in ids[: a.examples]]
        s["gap_to_held_out"] = gaps(s, ref[n]) if n in ref else None
        result["ar_judge_samples"] = {"tokens": n, "cpu_s": time.process_time() - t0, **s}
        print(f"AR judge {n}: GenPPL {s['gen_ppl']:.1f}  H {s['entropy']['mean']:.3f}", flush=True)

    for rows_ in [result["held_out"], *(r["lengths"] for r in result["rows"].values())]:
        for v in rows_.values():
            v["mauve"]["seeds"] = [round(x, 6) for x in v["mauve"]["seeds"]]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if len(lengths) > 1:
        plot(out)


def plot(path: Path) -> None:
    """length.png beside ``path``: GenPPL, entropy, repetition and MAUVE against length, and GenPPL along
    the longest samples, per model and for held-out text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads(path.read_text())
    lengths = r["lengths"]
    series = {"held-out text": r["held_out"], **{k: v["lengths"] for k, v in r["rows"].items()}}
    style = {"held-out text": ("k", "o", "--")}
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, k in enumerate(r["rows"]):
        style[k] = (colors[i % len(colors)], "s", "-")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = [
        ("GenPPL under the AR judge", lambda d: (d["gen_ppl"], None, None), True),
        (
            "unigram entropy of the ids (nats)",
            lambda d: (d["entropy"]["mean"], d["entropy"]["lo"], d["entropy"]["hi"]),
            False,
        ),
        (
            "share of repeated 4-grams",
            lambda d: (d["repetition_4gram"]["mean"], d["repetition_4gram"]["lo"], d["repetition_4gram"]["hi"]),
            False,
        ),
        (
            "MAUVE of each text's last 64 tokens",
            lambda d: (d["mauve"]["mean"], d["mauve"]["min"], d["mauve"]["max"]),
            False,
        ),
    ]
    for ax, (title, get, logy) in zip(axes.flat[:4], panels, strict=True):
        for k, rows in series.items():
            c, m, ls = style[k]
            ys = [get(rows[str(n)]) for n in lengths]
            mean = [y[0] for y in ys]
            ax.plot(lengths, mean, color=c, marker=m, ls=ls, label=k)
            if ys[0][1] is not None:
                ax.fill_between(lengths, [y[1] for y in ys], [y[2] for y in ys], color=c, alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n}\n({n // lengths[0]}x)" for n in lengths])
        if logy:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=12)
        ax.set_xlabel("tokens (x seq_len)")
        ax.grid(alpha=0.3)
    ar = r.get("ar_judge_samples")
    if ar:  # the judge's own samples, at its data.seq_len only
        for ax, (_, get, _) in zip(axes.flat[:4], panels, strict=True):
            ax.plot(
                [ar["tokens"]],
                [get(ar)[0]],
                color="tab:green",
                marker="^",
                ls="",
                ms=9,
                label="AR judge's own samples (1x)",
            )
    ax = axes.flat[4]
    longest = str(lengths[-1])
    for k, rows in series.items():
        segs = rows[longest].get("segments")
        if segs:
            c, m, ls = style[k]
            ax.plot([s["start"] for s in segs], [s["gen_ppl"] for s in segs], color=c, marker=m, ls=ls, label=k)
    ax.set_yscale("log")
    ax.set_title(f"GenPPL of each {r['judge_seq_len']}-token segment of the {longest}-token texts", fontsize=12)
    ax.set_xlabel("segment start (token)")
    ax.grid(alpha=0.3)
    axes.flat[5].axis("off")
    h, lab = axes.flat[0].get_legend_handles_labels()
    axes.flat[5].legend(h, lab, loc="upper center", fontsize=13, frameon=False)
    axes.flat[5].text(
        0.5,
        0.02,
        f"{r['num']} samples per model, one seed per model;\nbands: 95% t-intervals over samples\n"
        f"(MAUVE: the range over {len(r['held_out'][str(lengths[0])]['mauve']['seeds'])} k-means seeds;\n"
        f"it sees each text's last {r.get('mauve_tokens', 64)} tokens)",
        ha="center",
        fontsize=11,
        transform=axes.flat[5].transAxes,
    )
    fig.suptitle("Text at 1x, 4x and 8x seq_len (linux-docs, BPE 2048, seq_len 64, blocks of 16)", fontsize=14)
    fig.tight_layout()
    fig.savefig(path.with_name("length.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
