"""The methods table: every method on one backbone, data, tokenizer and token budget, with seeds.

    .venv/bin/python scripts/compare_methods.py --out runs/compare --seeds 3 --threads 1 --max-parallel 2

A thin preset of ``replaid grid``: it writes the grid spec of six cells (AR, MDLM (low var.), Duo,
Plaid, RePlaid (no s.c.), RePlaid (s.c.)) at the ``demo`` model size on one corpus from
../shared/data (tinyshakespeare, BPE 2,048, L = 64, batch 32), plans and runs it with the grid's
runner (finished runs are skipped, interrupted ones resumed), and writes docs/results/methods.md
(+ methods.json, methods_report.png: every seed, the means and their t-intervals; the paired
differences against RePlaid (s.c.); the paper's orderings as holds / reversed / not determined).

The cells and overrides are those of the ablation grid (docs/results/ablations/grid.yaml), so
``--out`` may point at that grid's folder: its method cells are then reported, not retrained.
``--threads`` is part of every run's config: the thread count changes the floating-point sums and so
the figures; the command line printed in methods.md reproduces them exactly on the same machine type.
``--quality N`` adds GenPPL (judge: the grid's AR run of seed 0), entropy and MAUVE of N samples of
each cell's seed-0 run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# cell -> (label, cell overrides); the same cells as docs/results/ablations/grid.yaml
CELLS = {
    "ar": ("AR", ["method=ar"]),
    "mdlm": ("MDLM (low var.)", ["method=mdlm"]),
    "duo": ("Duo", ["method=duo"]),
    "plaid": ("Plaid (s.c.)", ["method=plaid"]),
    "replaid-nosc": ("RePlaid (no s.c.)", ["method=replaid", "model.self_conditioning=false"]),
    "replaid": ("RePlaid (s.c.)", ["method=replaid"]),
}
PAPER_OWT_1M = {"ar": "17.5", "mdlm": "23.1", "duo": "25.2", "plaid": "24.4", "replaid-nosc": "23.6", "replaid": "22.1"}
ORDERINGS = [  # the paper's OWT 1M ordering (Table 2), pairwise
    "ar < replaid",
    "replaid < mdlm",
    "mdlm < replaid-nosc",
    "replaid < plaid",
    "replaid-nosc < duo",
    "replaid < duo",
    "replaid < replaid-nosc",
]


def common_overrides(corpus: str, steps: int, threads: int) -> list[str]:
    return [
        f"data.source={corpus}",
        "data.tokenizer=bpe",
        "data.bpe_vocab_size=2048",
        "data.seq_len=64",
        f"train.steps={steps}",
        "train.batch_size=32",
        "train.log_every=50",
        "eval.split=test",
        "eval.max_batches=0",
        "eval.t_samples=8",
        "optim.warmup_steps=100",
        "optim.ema=0.99",
        f"train.num_threads={threads}",
    ]


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's machine type."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def replaid(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "replaid", *args], check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="../shared/data/tinyshakespeare")
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (train.seed 0..N-1)")
    p.add_argument("--threads", type=int, default=1, help="train.num_threads of every run (changes the figures)")
    p.add_argument("--preset", default="demo", help="model size preset (demo; debug for a smoke test)")
    p.add_argument("--out", default="runs/compare", help="the grid folder (an existing grid's method cells are reused)")
    p.add_argument("--max-parallel", type=int, default=1, help="runs at once")
    p.add_argument("--report-only", action="store_true", help="report the finished runs; train nothing")
    p.add_argument("--results", default=str(ROOT / "docs" / "results"), help="folder for methods.md/.json/.png")
    p.add_argument("--quality", type=int, default=0, metavar="N", help="samples per cell scored (seed 0; 0 = skip)")
    p.add_argument("--quality-steps", type=int, default=64, help="sampling steps of the diffusion methods")
    a = p.parse_args()

    from replaid.eval.grid import GridSpec, report, report_markdown
    from replaid.scaling.grid import collect, read_grid, write_grid

    folder = Path(a.out)
    spec = GridSpec(
        a.preset,
        common_overrides(a.corpus, a.steps, a.threads),
        list(range(a.seeds)),
        {c: ov for c, (_, ov) in CELLS.items()},
        reference="replaid",
    )
    if not (folder / "manifest.json").is_file():
        write_grid(spec.validate(), folder)
    stored, entries = read_grid(folder)
    for c, (_, ov) in CELLS.items():
        if stored.base != spec.base or stored.overrides != spec.overrides or stored.cell_overrides().get(c) != ov:
            print(f"replaid: error: grid {folder} was planned with another protocol for cell '{c}'; pick a new --out")
            return 2
    if not a.report_only:
        replaid("grid", "run", str(folder), "--only", *CELLS, "--max-parallel", str(a.max_parallel), "--no-progress")
    entries = [e for e in entries if e.cell in CELLS and e.seed in spec.seeds]
    rows, missing = collect(folder, entries)
    rep = report(rows, "replaid", 0.95, list(CELLS), ORDERINGS, PAPER_OWT_1M)
    rep["unfinished"] = missing
    if a.quality:
        quality(rep, folder, a)
    write(rep, folder, spec, a, report_markdown)
    return 0


def quality(rep: dict, folder: Path, a) -> None:
    """GenPPL (judge: the grid's AR run of seed 0), unigram entropy and MAUVE of ``a.quality`` samples
    of each cell's seed-0 run (DDPM ancestral for the continuous methods, each method's own sampler
    otherwise), all against the same held-out test windows."""
    from replaid.eval.quality import make_judge
    from replaid.sampling.sweep import quality_sweep
    from replaid.store.loading import load_run

    judge = make_judge(judge_run=str(folder / "runs" / "ar__s0"))
    for c in rep["cells"]:
        pts = quality_sweep(
            load_run(str(folder / "runs" / f"{c['cell']}__s0")),
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
        c["quality"] = {
            "gen_ppl": pt.gen_ppl,
            "entropy": pt.entropy,
            "mauve": pt.mauve,
            "nfe": pt.nfe,
            "num": a.quality,
            "steps": pt.steps,
            "data_gen_ppl": data.gen_ppl,
            "data_entropy": data.entropy,
            "data_mauve": data.mauve,
        }


def write(rep: dict, folder: Path, spec, a, report_markdown) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from replaid.eval.grid import plot_report

    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "methods.json").write_text(json.dumps(rep, indent=1))
    plot_report(rep, out / "methods_report.png", "methods: test bound per seed")
    fig, ax = plt.subplots(figsize=(7, 4))  # training curves, every seed
    for i, c in enumerate(rep["cells"]):
        for s in c["seeds"]:
            lines = (folder / "runs" / f"{c['cell']}__s{s}" / "metrics.jsonl").read_text().splitlines()
            rows = [x for x in map(json.loads, lines) if "loss" in x]
            key = "nelbo" if rows and "nelbo" in rows[0] else "loss"  # low-variance MDLM logs its NELBO too
            label = CELLS[c["cell"]][0] if s == c["seeds"][0] else None
            ax.plot([x["step"] for x in rows], [x[key] for x in rows], color=f"C{i}", lw=0.8, alpha=0.8, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training bound (nats/token)")
    ax.set_title("Training batches: NELBO (AR: NLL), every seed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "methods_training.png", dpi=120)
    plt.close(fig)

    cmd = (
        f".venv/bin/python scripts/compare_methods.py --out {a.out} --steps {a.steps} --seeds {a.seeds} "
        f"--threads {a.threads} --max-parallel {a.max_parallel}"
        + (f" --preset {a.preset}" if a.preset != "demo" else "")
        + (f" --quality {a.quality}" if a.quality else "")
    )
    labels = ", ".join(f"`{c}` = {lab}" for c, (lab, _) in CELLS.items())
    head = [
        f"Date {datetime.date.today().isoformat()}; hardware: {cpu_name()}, {os.cpu_count()} CPU cores, no GPU; "
        f"torch {__import__('torch').__version__}; {a.threads} thread(s) per run. The figures vary with the CPU "
        "type, the thread count and the torch build (their floating-point sums); on another machine expect "
        "them to move like another seed.",
        "",
        f"Cells: {labels}. Corpus `{Path(a.corpus).name}` (test split), BPE 2,048 trained on its train "
        f"split, `{a.preset}` model size, L = 64, batch 32, {a.steps} steps = {a.steps * 32 * 64:,} training "
        f"tokens for every run; overrides of every run: `{' '.join(spec.overrides)}`. The paper column is "
        "OWT, L = 1024, 1M steps, PPL (Table 2).",
        "",
    ]
    md = report_markdown(rep, "Method comparison on one backbone", cmd).split("\n")
    md = md[:2] + head + md[2:]
    if rep.get("unfinished"):
        md += [f"Not finished (left out): {', '.join(rep['unfinished'])}.", ""]
    md += ["![every seed](methods_report.png)", "", "![training curves](methods_training.png)", ""]
    q = [c for c in rep["cells"] if "quality" in c]
    if q:
        d = q[0]["quality"]
        md += [
            "## Sample quality (seed 0 of each cell)",
            "",
            f"{d['num']} samples of 64 tokens (continuous methods: DDPM ancestral, T = {d['steps']}; MDLM/Duo: "
            f"their ancestral samplers; AR: ancestral, temperature 1). GenPPL judge: the AR run of seed 0 (so "
            f"AR's own row is optimistic). Held-out text: GenPPL {d['data_gen_ppl']:.1f}, entropy "
            f"{d['data_entropy']:.3f}, MAUVE {d['data_mauve']:.3f}.",
            "",
            "| cell | NFE | GenPPL | entropy | MAUVE |",
            "|---|---|---|---|---|",
        ]
        for c in sorted(q, key=lambda c: c["quality"]["gen_ppl"]):
            r = c["quality"]
            md.append(f"| {c['cell']} | {r['nfe']} | {r['gen_ppl']:.1f} | {r['entropy']:.3f} | {r['mauve']:.3f} |")
        md.append("")
    path = out / "methods.md"
    old = path.read_text() if path.is_file() else ""
    keep = old[old.index("## Discussion") :] if "## Discussion" in old else ""  # hand-written, kept on re-runs
    begin, end = "<!-- claims:begin -->", "<!-- claims:end -->"  # the opening paragraph (issue 34 §4), kept too
    if begin in old and end in old:
        md[1:1] = ["", old[old.index(begin) : old.index(end) + len(end)]]
    path.write_text("\n".join(md) + ("\n" + keep if keep else ""))
    print(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
