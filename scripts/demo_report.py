"""What the demo printed beside its samples (issue 37 §5): evidence a newcomer can judge by eye.

For a trained RePlaid run folder it prints

* a held-out passage: the first sequence of the evaluation split, as the model sees it (decoded tokens);
* samples of the unigram model of the same tokens (the train split's add-one unigram, the reference of
  the unigram perplexity), as many as the demo's samples and just as long: text with the right words
  in no order, which the model's samples should beat;
* the NELBO's pieces from RUN/final_eval.json (reconstruction, diffusion, prior; nats/token);

and writes one PNG, RUN/demo.png: the training curve against the unigram loss of the same batches, the
learned schedule gamma(t) against the closed-form gamma*(t) of the trained denoiser, and the one-shot
decoding CE over t (both from :func:`replaid.eval.diagnostics.diagnose` on one evaluation batch).

    python scripts/demo_report.py runs/demo [--num 3] [--seed 0] [--grid 9]

With ``--judge-run AR_RUN`` (an AR run on the same corpus and tokenizer: ``replaid train --preset PRESET
--method ar``) it also measures what the eye judges, with :func:`measure`: the judge's GenPPL and the
unigram entropy (over the run's token ids) of ``--measure-num`` held-out windows of the run's length, of
as many of the run's samples at each ``--temperatures`` (the demo's sampler and steps), and of as many
unigram samples. Samples that learned something sit between the unigram row and the held-out row.

    python scripts/demo_report.py runs/demo --judge-run runs/demo-ar --measure-num 128 --out m.json

``--measured M.json`` prints such a saved measurement too (the demo prints the one committed for its preset),
but only for a run of what was measured (preset, corpus, tokenizer, length, batch, steps, seed: issue 54);
for any other run it says whose table it is and how to measure this one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def unigram_samples(data, num: int, length: int, seed: int) -> list[list[int]]:
    """``num`` sequences of ``length`` tokens drawn i.i.d. from the run's unigram model (train split)."""
    import numpy as np

    p = np.exp(data.unigram_logp())
    rng = np.random.default_rng(seed)
    return [rng.choice(len(p), size=length, p=p / p.sum()).tolist() for _ in range(num)]


def _scored(judge, texts: list[str], ids: list[list[int]]) -> dict:
    """The judge's GenPPL of ``texts`` (also per character) and the mean unigram entropy of ``ids``."""
    from replaid.eval.quality import unigram_entropy

    g = judge.score(texts)
    chars = sum(len(t) for t in texts)
    return {
        "gen_ppl": g["gen_ppl"],
        "gen_nats_per_token": g["nats_per_token"],
        "judge_tokens": g["tokens"],
        "gen_bits_per_char": g["nats_per_token"] * g["tokens"] / chars / math.log(2),
        "chars": chars,
        "entropy": unigram_entropy(ids)["entropy"],
    }


def measure(
    run_dir: Path,
    judge_run: Path,
    num: int = 128,
    sampler: str = "ddpm",
    steps: int = 64,
    temperatures: tuple[float, ...] = (1.0,),
    seed: int = 0,
    common_judge_run: Path | None = None,
) -> dict:
    """GenPPL (under the AR run ``judge_run``) and unigram entropy of ``num`` held-out windows of the
    run's ``data.seq_len`` tokens (evenly spaced over the evaluation split), ``num`` samples of the run
    at each temperature (``sampler``, ``steps``, ``seed``) and ``num`` unigram samples as long; each row
    keeps three example texts. ``gap_closed``: how far the samples' judge NLL has moved from the unigram
    samples' towards the held-out text's (0: unigram, 1: held-out). ``common_judge_run``: another AR run
    that also scores every row (``common_judge``: its GenPPL and bits per character), so that runs with
    different tokenizers can be compared under one judge."""
    import time

    from replaid.eval.quality import make_judge, reference_windows
    from replaid.sampling.generate import generate
    from replaid.sampling.request import SampleRequest
    from replaid.store.loading import load_run

    run = load_run(str(run_dir), device="cpu")
    judge = make_judge(judge_run=str(judge_run))
    common = make_judge(judge_run=str(common_judge_run)) if common_judge_run is not None else None
    assert judge is not None

    def scored(texts: list[str], ids: list[list[int]]) -> dict:
        r = _scored(judge, texts, ids)
        if common is not None:
            c = _scored(common, texts, ids)
            r["common_judge"] = {
                k: c[k] for k in ("gen_ppl", "gen_nats_per_token", "judge_tokens", "gen_bits_per_char")
            }
        return r

    split = json.loads((run_dir / "final_eval.json").read_text())["eval"]["split"]
    L = run.cfg.data.seq_len
    rows: dict[str, dict] = {}
    texts, ids = reference_windows(run, split, num)
    rows["held-out"] = {**scored(texts, ids), "examples": texts[:3]}
    uni = unigram_samples(run.data, num, L, seed)
    texts = [run.tokenizer.decode(u) for u in uni]
    rows["unigram"] = {**scored(texts, uni), "examples": texts[:3]}
    for tau in temperatures:
        req = SampleRequest(sampler=sampler, steps=steps, num=num, temperature=tau, seed=seed, progress=False)
        t0 = time.time()
        got = generate(run, req)
        secs = time.time() - t0
        texts = [r["text"] for r in got]
        rows[f"samples tau={tau:g}"] = {
            **scored(texts, [r["ids"] for r in got]),
            "seconds": secs,
            "examples": texts[:3],
        }
    lo, hi = rows["unigram"]["gen_nats_per_token"], rows["held-out"]["gen_nats_per_token"]
    for r in rows.values():
        r["gap_closed"] = (lo - r["gen_nats_per_token"]) / (lo - hi)
    final = json.loads((run_dir / "final_eval.json").read_text())["eval"]
    chars = sum(len(run.tokenizer.decode(b["tokens"].reshape(-1).tolist())) for b in run.data.eval_batches(split, 64))
    d = run.cfg.data
    return {
        "run": str(run_dir),
        "judge_run": str(judge_run),
        "common_judge_run": None if common_judge_run is None else str(common_judge_run),
        "config": {
            "preset": run.cfg.preset,
            "method": run.cfg.method,
            "source": d.source,
            "tokenizer": d.tokenizer,
            "bpe_vocab_size": d.bpe_vocab_size,
            "seq_len": L,
            "batch_size": run.cfg.train.batch_size,
            "steps": run.cfg.train.steps,
            "train_seed": run.cfg.train.seed,
            "judge_steps": load_run_config(judge_run)["train"]["steps"],
        },
        "nelbo": {
            **{k: final[k] for k in ("nelbo_nats_per_token", "nelbo_ppl", "unigram_nats_per_token", "unigram_ppl")},
            **{k: final[k] for k in ("recon", "diffusion", "prior", "tokens")},
            "chars": chars,
            "nelbo_bits_per_char": final["nelbo_nats_per_token"] * final["tokens"] / chars / math.log(2),
            "unigram_bits_per_char": final["unigram_nats_per_token"] * final["tokens"] / chars / math.log(2),
        },
        "step": run.step,
        "split": split,
        "num": num,
        "seq_len": L,
        "sampler": sampler,
        "steps": steps,
        "seed": seed,
        "rows": rows,
    }


def load_run_config(run_dir: Path) -> dict:
    """A run folder's config.json."""
    return json.loads((Path(run_dir) / "config.json").read_text())


def gap_closed_per_char(m: dict) -> dict[str, float]:
    """Each row's ``gap_closed`` in bits per character instead of nats per judge token: texts that the
    judge's tokenizer cuts into more, shorter tokens (odd fragments do) are not rewarded for it."""
    lo, hi = m["rows"]["unigram"]["gen_bits_per_char"], m["rows"]["held-out"]["gen_bits_per_char"]
    return {name: (lo - r["gen_bits_per_char"]) / (lo - hi) for name, r in m["rows"].items()}


def differences(run_cfg: dict, m: dict) -> list[str]:
    """How the run of ``run_cfg`` (its config.json) differs from the one the measurement ``m`` was made
    on, as ``name RUN (measured: M)``; empty when the measurement is this run's preset's own."""
    c, d, t = m["config"], run_cfg.get("data", {}), run_cfg.get("train", {})
    pairs = [
        ("method", run_cfg.get("method"), c.get("method", "replaid")),
        ("preset", run_cfg.get("preset"), c.get("preset", "first-run")),  # measurements before issue 54: first-run
        ("data.source", d.get("source"), c["source"]),
        ("data.tokenizer", d.get("tokenizer"), c["tokenizer"]),
        ("data.bpe_vocab_size", d.get("bpe_vocab_size"), c["bpe_vocab_size"]),
        ("data.seq_len", d.get("seq_len"), c["seq_len"]),
        ("train.batch_size", t.get("batch_size"), c["batch_size"]),
        ("train.steps", t.get("steps"), c["steps"]),
        ("train.seed", t.get("seed"), c["train_seed"]),
    ]
    return [f"{name} {got} (measured: {want})" for name, got, want in pairs if got != want]


def print_measure(m: dict) -> None:
    print(
        f"== the judge ({m['judge_run']}) on {m['num']} texts of {m['seq_len']} tokens each: samples should sit "
        f"between the unigram row (gap closed 0) and the held-out row (1)"
    )
    common = m.get("common_judge_run")
    extra = f"  bits/char under {common}" if common else ""
    per_char = gap_closed_per_char(m)
    print(
        f"{'':18s} {'GenPPL':>8s} {'bits/char':>9s} {'entropy':>7s} {'gap closed: per token':>21s} {'per char':>8s}{extra}"
    )
    for name, r in m["rows"].items():
        more = f"  {r['common_judge']['gen_bits_per_char']:.3f}" if common else ""
        print(
            f"{name:18s} {r['gen_ppl']:8.2f} {r['gen_bits_per_char']:9.3f} {r['entropy']:7.3f} "
            f"{r['gap_closed']:21.2f} {per_char[name]:8.2f}{more}"
        )


def report(run_dir: Path, num: int = 3, seed: int = 0, grid: int = 9) -> dict:
    """Print the report; return its parts (``passage``, ``unigram``, ``pieces``, ``png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from replaid.eval.diagnostics import diagnose
    from replaid.hub import from_pretrained

    run = from_pretrained(run_dir, device="cpu")
    cfg, tok = run.cfg, run.tokenizer
    final = json.loads((run_dir / "final_eval.json").read_text())["eval"]
    split = final["split"]
    batch = run.data.eval_batches(split, min(cfg.eval.batch_size, 8), 1)[0]["tokens"]
    passage = tok.decode(batch[0].tolist())
    uni = [tok.decode(ids) for ids in unigram_samples(run.data, num, cfg.data.seq_len, seed)]
    pieces = {k: final[k] for k in ("recon", "diffusion", "prior")}

    print(f"== a held-out passage ({split} split, {cfg.data.seq_len} tokens)")
    print(repr(passage))
    print(f"== samples of the unigram model of the same tokens ({num}, {cfg.data.seq_len} tokens each, seed {seed})")
    for text in uni:
        print(repr(text))
    print(
        f"== the NELBO's pieces (nats/token, {split}): reconstruction {pieces['recon']:.3f} + diffusion "
        f"{pieces['diffusion']:.3f} + prior {pieces['prior']:.4f} = {final['nelbo_nats_per_token']:.3f}; "
        f"unigram {final['unigram_nats_per_token']:.3f}"
    )

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r and "unigram" in r]
    diag = diagnose(run.model, [batch], grid=grid, seed=seed)["t"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    a.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="NELBO (training batches)")
    a.plot([r["step"] for r in rows], [r["unigram"] for r in rows], "--", label="unigram (same tokens)")
    a.set(xlabel="step", ylabel="nats / token", title="training")
    a.legend()
    b.plot(diag["t"], diag["gamma"], label="learned gamma(t)")
    b.plot(diag["t"], diag["gamma_star"], "--", label="gamma*(t) of the trained denoiser")
    b.set(xlabel="t", ylabel="gamma = -log SNR", title="noise schedule")
    b.legend()
    c.plot(diag["t"], diag["ce"], marker=".")
    c.set(xlabel="t", ylabel="CE (nats / token)", title=f"one-shot decoding CE over t ({split}, 1 batch)")
    fig.suptitle(f"{run_dir} at step {run.step}")
    fig.tight_layout()
    png = run_dir / "demo.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"== training curve, learned schedule against gamma*, CE over t: {png}")
    return {"passage": passage, "unigram": uni, "pieces": pieces, "png": png, "batch": batch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a trained RePlaid run folder (with final_eval.json)")
    ap.add_argument("--num", type=int, default=3, help="unigram samples (default: 3, the demo's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grid", type=int, default=9, help="points of the t grid of the diagnostics (default: 9)")
    ap.add_argument("--judge-run", type=Path, default=None, help="an AR run on the same corpus and tokenizer")
    ap.add_argument("--measure-num", type=int, default=128, help="texts per row of the measurement (default: 128)")
    ap.add_argument("--sampler", default="ddpm", help="sampler of the measured samples (default: ddpm, the demo's)")
    ap.add_argument("--steps", type=int, default=64, help="its steps (default: 64, the demo's)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="logit temperatures (default: 1)")
    ap.add_argument("--common-judge-run", type=Path, default=None, help="a second AR judge that scores every row")
    ap.add_argument("--out", type=Path, default=None, help="write the measurement here (JSON)")
    ap.add_argument("--no-report", action="store_true", help="only the measurement")
    ap.add_argument("--measured", type=Path, default=None, help="also print a saved measurement (--out's JSON)")
    args = ap.parse_args(argv)
    if args.measured is not None and not args.measured.is_file():
        print(
            f"replaid: error: no saved measurement at {args.measured} (--measured); give the JSON that "
            f"--out wrote, or leave --measured out",
            file=sys.stderr,
        )
        return 2
    if not args.no_report:
        report(args.run, args.num, args.seed, args.grid)
    if args.measured is not None:
        m = json.loads(args.measured.read_text())
        c = m["config"]
        other = differences(load_run_config(args.run), m)
        if other:
            print(
                f"== the committed judge table ({args.measured}) belongs to the preset's own run, not this one: "
                f"{'; '.join(other)}. Measure this run with --judge-run AR_RUN "
                f"(an AR run: replaid train --preset {c.get('preset', 'first-run')} --method ar)"
            )
        else:
            print(
                f"== measured once, offline ({args.measured}): a {c['source']} run of this preset, seed "
                f"{c['train_seed']}, {c['steps']} steps, {m['sampler']} T={m['steps']}; its judge an AR run of the "
                f"same size, {c['judge_steps']} steps"
            )
            print_measure(m)
    if args.judge_run is not None:
        m = measure(
            args.run,
            args.judge_run,
            args.measure_num,
            args.sampler,
            args.steps,
            tuple(args.temperatures),
            args.seed,
            args.common_judge_run,
        )
        print_measure(m)
        if args.out is not None:
            args.out.write_text(json.dumps(m, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
