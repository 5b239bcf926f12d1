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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def unigram_samples(data, num: int, length: int, seed: int) -> list[list[int]]:
    """``num`` sequences of ``length`` tokens drawn i.i.d. from the run's unigram model (train split)."""
    import numpy as np

    p = np.exp(data.unigram_logp())
    rng = np.random.default_rng(seed)
    return [rng.choice(len(p), size=length, p=p / p.sum()).tolist() for _ in range(num)]


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
    args = ap.parse_args(argv)
    report(args.run, args.num, args.seed, args.grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
