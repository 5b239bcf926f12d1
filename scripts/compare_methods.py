"""One table comparing every method on the same backbone, data, tokenizer and token budget.

    .venv/bin/python scripts/compare_methods.py --steps 800 --out runs/compare

Trains AR, MDLM (low variance), Duo, Plaid, RePlaid and RePlaid without self-conditioning with the
`demo` model size on one corpus from ../shared/data (tinyshakespeare by default) with one BPE
tokenizer, evaluates each on the test split (exact NLL for AR, NELBO for the diffusion models),
and writes docs/results/methods.md (+ .json and a PNG of the training curves).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = [
    ("AR", "ar", []),
    ("MDLM (low var.)", "mdlm", []),
    ("Duo", "duo", []),
    ("Plaid (s.c.)", "plaid", []),
    ("RePlaid (no s.c.)", "replaid", ["model.self_conditioning=false"]),
    ("RePlaid (s.c.)", "replaid", []),
]
PAPER_OWT_1M = {
    "AR": 17.5,
    "MDLM (low var.)": 23.1,
    "Duo": 25.2,
    "Plaid (s.c.)": 24.4,
    "RePlaid (no s.c.)": 23.6,
    "RePlaid (s.c.)": 22.1,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="../shared/data/tinyshakespeare")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--only", nargs="*", help="subset of method labels")
    p.add_argument("--preset", default="demo", help="model size preset (demo; debug for a smoke test)")
    p.add_argument("--results", default=str(ROOT / "docs" / "results"), help="folder for methods.md/.json/.png")
    p.add_argument("--rewrite", action="store_true", help="only rewrite the table from docs/results/methods.json")
    p.add_argument(
        "--quality",
        type=int,
        default=128,
        metavar="N",
        help="samples per method scored by GenPPL (judge: the comparison's AR run), entropy and MAUVE "
        "against N test windows (0 = skip)",
    )
    p.add_argument("--quality-steps", type=int, default=64, help="sampling steps of the diffusion methods")
    p.add_argument("--threads", type=int, default=0, help="train.num_threads of every run (0 = replaid's default)")
    a = p.parse_args()
    from replaid.eval.evaluate import evaluate
    from replaid.presets import resolve
    from replaid.training.train import train

    common = [
        f"data.source={a.corpus}",
        "data.tokenizer=bpe",
        "data.bpe_vocab_size=2048",
        "data.seq_len=64",
        f"train.steps={a.steps}",
        "train.batch_size=32",
        "train.log_every=25",
        "eval.split=test",
        "eval.max_batches=0",
        "eval.t_samples=8",
        "optim.warmup_steps=100",
        "optim.ema=0.99",
    ]
    threads = [f"train.num_threads={a.threads}"] if a.threads else []  # speed only: not in the recorded overrides
    if a.rewrite:
        results = json.loads((Path(a.results) / "methods.json").read_text())
        if a.quality and "AR" in results and not all("quality" in r for r in results.values()):
            quality(results, a)
        write(results, a, common)
        return
    results = {}
    for label, method, extra in METHODS:
        if a.only and label not in a.only:
            continue
        cfg = resolve(a.preset, None, [f"method={method}", *common, *extra, *threads])
        run = Path(a.out) / label.replace(" ", "_").replace("(", "").replace(")", "").replace(".", "")
        t0 = time.time()
        res = train(cfg, run, evaluate=evaluate, progress=False, overwrite=True)  # re-running retrains
        ev = res["eval"]
        key = "nll" if "nll_nats_per_token" in ev else "nelbo"
        results[label] = {
            "method": method,
            "overrides": extra,
            "nats_per_token": ev[f"{key}_nats_per_token"],
            "ppl": ev[f"{key}_ppl"],
            "bound": "exact NLL" if key == "nll" else "NELBO",
            "stderr_nats": ev["stderr_nats"],
            "unigram_ppl": ev["unigram_ppl"],
            "tokens": ev["tokens"],
            "train_seconds": time.time() - t0,
            "run": str(run),
            "train_tokens": a.steps * 32 * 64,
        }
        print(
            f"{label:20s} {results[label]['bound']:9s} PPL {ev[f'{key}_ppl']:8.2f} ({time.time() - t0:.0f} s)",
            flush=True,
        )
    if a.quality and "AR" in results:
        quality(results, a)
    write(results, a, common)


def quality(results: dict, a) -> None:
    """GenPPL (judge: the AR run of this comparison, trained on the same data), unigram entropy and
    MAUVE of ``a.quality`` samples per method (DDPM ancestral for the continuous methods, each
    method's own sampler otherwise), all against the same held-out test windows."""
    from replaid.eval.quality import make_judge
    from replaid.sampling.sweep import quality_sweep
    from replaid.training.loading import load_run

    judge = make_judge(judge_run=results["AR"]["run"])
    for label, r in results.items():
        pts = quality_sweep(
            load_run(r["run"]),
            judge,
            samplers=["ddpm"],
            steps=[a.quality_steps],
            temperatures=[],
            temp_sampler="ddpm",
            temp_steps=a.quality_steps,
            num=a.quality,
            split="test",
            progress=False,
        )
        data, pt = pts[0], pts[1]
        r["quality"] = {
            "gen_ppl": pt.gen_ppl,
            "entropy": pt.entropy,
            "mauve": pt.mauve,
            "nfe": pt.nfe,
            "sampler": pt.sampler,
            "steps": pt.steps,
            "num": a.quality,
            "example": pt.example,
            "data_gen_ppl": data.gen_ppl,
            "data_entropy": data.entropy,
            "data_mauve": data.mauve,
        }
        print(f"{label:20s} GenPPL {pt.gen_ppl:8.1f} entropy {pt.entropy:.3f} MAUVE {pt.mauve:.3f}", flush=True)


def write(results: dict, a, common: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "methods.json").write_text(json.dumps(results, indent=2))
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in results.items():
        rows = [json.loads(x) for x in (Path(r["run"]) / "metrics.jsonl").read_text().splitlines()]
        rows = [x for x in rows if "loss" in x]
        key = "nelbo" if rows and "nelbo" in rows[0] else "loss"  # low-variance MDLM logs its true NELBO too
        ax.plot([x["step"] for x in rows], [x[key] for x in rows], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training bound (nats/token)")
    ax.set_title("Training batches: NELBO (AR: NLL), same data and token budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "methods_training.png", dpi=120)
    ordered = sorted(results.items(), key=lambda kv: kv[1]["ppl"])
    from replaid.presets import get_preset

    extra_args = f" --preset {a.preset}" if a.preset != "demo" else ""
    if a.only:
        extra_args += " --only " + " ".join(f'"{x}"' for x in a.only)
    res_dir = Path(a.results).resolve()
    if res_dir != ROOT / "docs" / "results" and res_dir.is_relative_to(ROOT):
        extra_args += f" --results {res_dir.relative_to(ROOT)}"

    m = get_preset(a.preset).model
    size = f"hidden {m.hidden}, {m.n_layers} layers, {m.n_heads} heads"
    lines = [
        "# Method comparison on one backbone",
        "",
        f"Date {datetime.date.today().isoformat()}; hardware: {platform.processor() or platform.machine()}, "
        f"2 CPU cores, no GPU.",
        "",
        f"Command: `.venv/bin/python scripts/compare_methods.py --steps {a.steps} --out {a.out} --quality {a.quality}"
        f"{extra_args}` "
        f"(corpus `{Path(a.corpus).name}` from `../shared/data`, test split; one BPE tokenizer of 2,048 "
        f"tokens trained on its train split; the `{a.preset}` model size ({size}); L = 64; "
        f"batch 32; {a.steps} steps = {a.steps * 32 * 64:,} training tokens for every method).",
        "",
        "| method | bound | test PPL | nats/token (± s.e.) | train s | paper OWT 1M PPL |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in ordered:
        lines.append(
            f"| {label} | {r['bound']} | {r['ppl']:.2f} | {r['nats_per_token']:.3f} ± "
            f"{r['stderr_nats']:.3f} | {r['train_seconds']:.0f} | {PAPER_OWT_1M[label]} |"
        )
    uni = next(iter(results.values()))["unigram_ppl"] if results else float("nan")
    lines += [
        "",
        f"Unigram perplexity of the same test split (add-one, fitted on train): {uni:.2f}. Train "
        "seconds are wall-clock on the same 2-core machine; other jobs shared it during some runs, so "
        "compare speed with `benchmarks/` instead.",
        "",
        "![training curves](methods_training.png)",
        "",
        f"Overrides common to all runs: `{' '.join(common)}`.",
        "",
    ]
    q = {k: r["quality"] for k, r in results.items() if "quality" in r}
    if q:
        d = next(iter(q.values()))
        lines += [
            "## Sample quality",
            "",
            f"{d['num']} samples of 64 tokens per method (continuous methods: DDPM "
            f"ancestral, T = {d['steps']}; MDLM/Duo: their ancestral samplers, T = {d['steps']}; AR: ancestral, "
            f"temperature 1). GenPPL judge: the AR run above (so AR's own row is scored by itself and is "
            f"optimistic); entropy over sample ids; MAUVE (all-MiniLM-L6-v2 features) against {d['num']} "
            f"test windows. Held-out text scores GenPPL {d['data_gen_ppl']:.1f}, entropy "
            f"{d['data_entropy']:.3f}, MAUVE {d['data_mauve']:.3f}.",
            "",
            "| method | NFE | GenPPL | entropy | MAUVE |",
            "|---|---|---|---|---|",
        ]
        for label, r in sorted(q.items(), key=lambda kv: kv[1]["gen_ppl"]):
            lines.append(f"| {label} | {r['nfe']} | {r['gen_ppl']:.1f} | {r['entropy']:.3f} | {r['mauve']:.3f} |")
        lines.append("")
    md = out / "methods.md"
    old = md.read_text() if md.is_file() else ""
    keep = old[old.index("## Discussion") :] if "## Discussion" in old else ""  # hand-written, kept on re-runs
    md.write_text("\n".join(lines) + ("\n" + keep if keep else ""))
    print(md.read_text())


if __name__ == "__main__":
    sys.exit(main())
