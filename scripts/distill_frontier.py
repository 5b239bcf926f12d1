"""The few-step frontier (issue 24): GenPPL, unigram entropy, MAUVE and wall time per sample of a
teacher's samplers at each NFE, of distilled students at theirs, and of an MDLM baseline, with Student-t
intervals over sampling seeds.

    .venv/bin/python scripts/distill_frontier.py --teacher runs/demo --judge-run runs/demo-ar \\
        --student "PD-8=runs/demo-pd8:ddim:8" --student "PD-4=runs/demo-pd4:ddim:4" \\
        --student "CD=runs/demo-cd:consistency:1,2,4,8" --mdlm runs/demo-mdlm \\
        --seeds 0 1 2 --num 32 --out docs/results/distillation

Writes ``frontier.json``, ``frontier.md`` (the table) and two plots: ``frontier_genppl_entropy.png``
(GenPPL against entropy: the generative frontier, since low-entropy text games GenPPL alone) and
``frontier_nfe.png`` (GenPPL and MAUVE against NFE). Each (model, sampler, steps) draws ``--num`` samples
per seed with ``generate`` (the seed is the request's); GenPPL under the AR judge run, the mean
per-sample unigram entropy over the sample ids, MAUVE (``--mauve``) against ``--num`` held-out windows
of the teacher's ``--split``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import time
from pathlib import Path

TEACHER_SAMPLERS = ("ddpm", "ddim", "dpmpp2m", "heun")
NFES = (1, 2, 4, 8, 16, 32, 64, 128)


def steps_for(sampler: str, nfe: int) -> int | None:
    """The step count whose NFE is ``nfe`` (T + 1, Heun 2T, consistency T); None where none is."""
    if sampler == "heun":
        return nfe // 2 if nfe % 2 == 0 and nfe >= 2 else None
    if sampler == "consistency":
        return nfe
    return nfe - 1 if nfe >= 2 else None


def parse_student(spec: str) -> tuple[str, str, str, list[int]]:
    """``LABEL=PATH:SAMPLER:STEPS[,STEPS]``."""
    try:
        label, rest = spec.split("=", 1)
        path, sampler, steps = rest.rsplit(":", 2)
        return label, path, sampler, [int(s) for s in steps.split(",")]
    except ValueError:
        raise SystemExit(f"replaid: error: --student {spec!r}: expected LABEL=PATH:SAMPLER:STEPS[,STEPS]") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher")
    p.add_argument("--judge-run", help="AR run trained on the same corpus (the GenPPL judge)")
    p.add_argument(
        "--from-json",
        default=None,
        help="re-render the table, the --pair comparisons and the plots from a frontier.json (no sampling)",
    )
    p.add_argument("--student", action="append", default=[], help="LABEL=PATH:SAMPLER:STEPS[,STEPS]")
    p.add_argument("--mdlm", default=None, help="MDLM baseline run (scored at --mdlm-steps)")
    p.add_argument("--mdlm-steps", type=int, nargs="+", default=[4, 8, 64])
    p.add_argument("--teacher-samplers", nargs="+", default=list(TEACHER_SAMPLERS))
    p.add_argument("--nfes", type=int, nargs="+", default=list(NFES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num", type=int, default=32, help="samples per seed and configuration")
    p.add_argument("--mauve", action="store_true", help="also MAUVE against held-out windows (slow on a CPU)")
    p.add_argument("--split", default="valid")
    p.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="paired comparison A - B, each MODEL:SAMPLER:STEPS (e.g. PD-4:ddim:4 teacher:heun:4): per-sample "
        "differences of judge nats/token and entropy at the same seed and index (the same starting noise)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.from_json:
        d = json.loads(Path(a.from_json).read_text())
        write_outputs(d["meta"], d["rows"], a.pair, Path(a.out))
        return
    if not (a.teacher and a.judge_run):
        raise SystemExit("replaid: error: --teacher and --judge-run are required (or --from-json FRONTIER_JSON)")

    import torch

    torch.set_num_threads(a.threads)
    from replaid.eval.quality import gen_ppl_ar_run, mauve_score, reference_windows, sentence_features, unigram_entropy
    from replaid.eval.seeds import t_interval
    from replaid.store.loading import load_run

    judge = load_run(a.judge_run, device="cpu")
    teacher = load_run(a.teacher, device="cpu")
    configs: list[tuple[str, object, str, int]] = []  # (label, run, sampler, steps)
    for s in a.teacher_samplers:
        for n in a.nfes:
            T = steps_for(s, n)
            if T:
                configs.append(("teacher", teacher, s, T))
    for spec in a.student:
        label, path, sampler, steps = parse_student(spec)
        run = load_run(path, device="cpu")
        configs += [(label, run, sampler, T) for T in steps]
    if a.mdlm:
        mdlm = load_run(a.mdlm, device="cpu")
        configs += [("MDLM", mdlm, "ancestral", T) for T in a.mdlm_steps]
    scored = {f"{label}:{sampler}:{T}" for label, _, sampler, T in configs}
    for key in (k for pair in a.pair for k in pair):
        if key not in scored:
            raise SystemExit(
                f"replaid: error: --pair {key!r} is not among the scored configurations ({', '.join(sorted(scored))})"
            )
    ref_feat = None
    ref_texts, _ = reference_windows(teacher, a.split, a.num * len(a.seeds))
    reference = {  # the held-out text itself, for scale: its entropy and GenPPL under the judge
        "windows": len(ref_texts),
        "entropy": unigram_entropy([teacher.tokenizer.encode(t) for t in ref_texts])["entropy"],
        "gen_ppl": gen_ppl_ar_run(ref_texts, judge)["gen_ppl"],
    }
    if a.mauve:
        ref_feat = sentence_features(ref_texts[: a.num])

    rows = []
    for label, run, sampler, T in configs:
        per_seed, samples = [], []
        for seed in a.seeds:
            t0 = time.time()
            out = draw(run, sampler, T, seed, a.num)
            secs = (time.time() - t0) / a.num
            texts = [r["text"] for r in out]
            g, e = gen_ppl_ar_run(texts, judge), unigram_entropy([r["ids"] for r in out])
            m = {"gen_ppl": g["gen_ppl"], "entropy": e["entropy"], "seconds_per_sample": secs}
            samples.append(
                {"nll": [round(v, 5) for v in g["per_sample"]], "entropy": [round(v, 5) for v in e["per_sample"]]}
            )
            if ref_feat is not None:
                m["mauve"] = mauve_score(sentence_features(texts), ref_feat)
            per_seed.append(m)
        row = {"model": label, "sampler": sampler, "steps": T, "nfe": int(out[0]["nfe"]), "example": texts[0]}
        for k in per_seed[0]:
            row[k] = t_interval([m[k] for m in per_seed]).as_dict()
        row["per_sample"] = samples  # per seed: each sample's judge nats/token and unigram entropy
        rows.append(row)
        print(
            f"{label:10s} {sampler:12s} T={T:<4d} NFE={row['nfe']:<4d} GenPPL {row['gen_ppl']['mean']:8.1f} "
            f"entropy {row['entropy']['mean']:.3f}",
            flush=True,
        )
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, {a.threads} thread(s)",
        "teacher": str(teacher.ckpt),
        "judge": str(judge.ckpt),
        "seeds": a.seeds,
        "num": a.num,
        "split": a.split,
        "reference": reference,
    }
    write_outputs(meta, rows, a.pair, Path(a.out))


def draw(run, sampler: str, T: int, seed: int, num: int) -> list:
    """``num`` samples of ``run`` (one batch) at ``seed``: sample i of every model, sampler and step count
    starts from the same noise, which the paired comparisons (:func:`paired`) rest on."""
    from replaid.sampling.generate import generate
    from replaid.sampling.request import SampleRequest

    return generate(run, SampleRequest(sampler=sampler, steps=T, num=num, batch_size=num, seed=seed, progress=False))


def write_outputs(meta: dict, rows: list[dict], pair_keys: list, out_dir: Path) -> None:
    """``frontier.json`` (rows with their per-sample values, the pairs), ``frontier.md``, the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = [paired(rows, A, B) for A, B in pair_keys]
    (out_dir / "frontier.json").write_text(json.dumps({"meta": meta, "rows": rows, "pairs": pairs}, indent=2))
    ref = meta.get("reference")
    note = (
        f"\n\nHeld-out text ({ref['windows']} windows of the split): unigram entropy {ref['entropy']:.3f}, "
        f"GenPPL under the judge {ref['gen_ppl']:.1f}.\n"
        if ref
        else ""
    )
    (out_dir / "frontier.md").write_text(table(rows) + note + (pair_table(pairs) if pairs else ""))
    plot(rows, out_dir, ref)


def _fmt(iv: dict, digits: int = 1) -> str:
    if iv["n"] < 2:
        return f"{iv['mean']:.{digits}f}"
    return f"{iv['mean']:.{digits}f} [{iv['lo']:.{digits}f}, {iv['hi']:.{digits}f}]"


def _find(rows: list[dict], key: str) -> dict:
    model, sampler, steps = key.rsplit(":", 2)
    for r in rows:
        if (r["model"], r["sampler"], r["steps"]) == (model, sampler, int(steps)):
            return r
    raise SystemExit(f"replaid: error: --pair {key!r}: no such configuration was scored; use MODEL:SAMPLER:STEPS")


def paired(rows: list[dict], a_key: str, b_key: str) -> dict:
    """A - B over samples paired by (seed, index): the same starting latent for the deterministic samplers.
    Mean difference of per-sample judge nats/token (``exp`` of it: the GenPPL ratio) and of entropy, with a
    Student-t interval over the pairs, and the correlation of the pair's nats/token (how much pairing buys)."""
    import numpy as np

    from replaid.eval.seeds import t_interval

    A, B = _find(rows, a_key), _find(rows, b_key)
    out = {"a": a_key, "b": b_key, "nfe_a": A["nfe"], "nfe_b": B["nfe"]}
    for k in ("nll", "entropy"):
        xa = np.concatenate([s[k] for s in A["per_sample"]])
        xb = np.concatenate([s[k] for s in B["per_sample"]])
        if xa.shape != xb.shape:
            raise SystemExit(f"replaid: error: --pair {a_key} {b_key}: different sample counts; score both alike")
        ok = np.isfinite(xa) & np.isfinite(xb)
        out[k] = t_interval((xa[ok] - xb[ok]).tolist()).as_dict()
        if k == "nll":
            out["corr"] = float(np.corrcoef(xa[ok], xb[ok])[0, 1])
    return out


def pair_table(pairs: list[dict]) -> str:
    s = "\n\nPaired by starting noise (same seed and index), A - B, 95% t-interval over the samples:\n\n"
    s += "| A | B | NFE | judge nats/token A - B (GenPPL ratio) | entropy A - B | corr. of nats/token |\n"
    s += "|---|---|---|---|---|---|\n"
    for p in pairs:
        n, e = p["nll"], p["entropy"]
        s += (
            f"| {p['a']} | {p['b']} | {p['nfe_a']} vs {p['nfe_b']} | {n['mean']:+.4f} [{n['lo']:+.4f}, {n['hi']:+.4f}] "
        )
        s += f"(x{math.exp(n['mean']):.3f} [{math.exp(n['lo']):.3f}, {math.exp(n['hi']):.3f}]) | "
        s += f"{e['mean']:+.4f} [{e['lo']:+.4f}, {e['hi']:+.4f}] | {p['corr']:.2f} |\n"
    return s


def table(rows: list[dict]) -> str:
    has_mauve = any("mauve" in r for r in rows)
    head = "| model | sampler | steps | NFE | GenPPL (95% CI over seeds) | unigram entropy | "
    head += "MAUVE | " if has_mauve else ""
    head += "s / sample |\n|---|---|---|---|---|---|" + ("---|" if has_mauve else "") + "---|\n"
    body = ""
    for r in sorted(rows, key=lambda r: (r["model"] != "teacher", r["model"], r["sampler"], r["nfe"])):
        body += f"| {r['model']} | {r['sampler']} | {r['steps']} | {r['nfe']} | {_fmt(r['gen_ppl'])} | "
        body += f"{_fmt(r['entropy'], 3)} | " + (f"{_fmt(r['mauve'], 3)} | " if has_mauve else "")
        body += f"{r['seconds_per_sample']['mean']:.3f} |\n"
    return head + body


def _styles(names: list[str]) -> dict[str, dict]:
    """One colour per group (tab20, so 11+ groups stay apart); teacher samplers solid circles, students
    squares, the discrete baseline dashed diamonds."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    out = {}
    for i, n in enumerate(names):
        kind = "teacher" if n.startswith("teacher") else ("MDLM" if n.startswith("MDLM") else "student")
        out[n] = {
            "color": cmap(2 * i % 20 + (2 * i // 20) % 2),
            "marker": {"teacher": "o", "student": "s", "MDLM": "D"}[kind],
            "linestyle": {"teacher": "-", "student": ":", "MDLM": "--"}[kind],
        }
    return out


def plot(rows: list[dict], out: Path, ref: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['model']} {r['sampler']}", []).append(r)
    st = _styles(list(groups))
    ents = [r["entropy"]["mean"] for r in rows]
    main_lo = min(e for e in ents if e > max(ents) - 0.6)  # the zoomed panel: the bulk, not a collapsed sampler
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, zoom in zip(axes, (False, True), strict=False):
        for name, rs in groups.items():
            rs = sorted(rs, key=lambda r: r["nfe"])
            if zoom:
                rs = [r for r in rs if r["entropy"]["mean"] >= main_lo - 0.02]
            if not rs:
                continue
            x = [r["entropy"]["mean"] for r in rs]
            y = [r["gen_ppl"]["mean"] for r in rs]
            err = None
            if all(r["gen_ppl"]["n"] > 1 for r in rs):
                err = [
                    [r["gen_ppl"]["mean"] - r["gen_ppl"]["lo"] for r in rs],
                    [r["gen_ppl"]["hi"] - r["gen_ppl"]["mean"] for r in rs],
                ]
            ax.errorbar(x, y, yerr=err, capsize=2, label=name, markersize=5, **st[name])
            for r in rs:
                ax.annotate(
                    str(r["nfe"]),
                    (r["entropy"]["mean"], r["gen_ppl"]["mean"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                    color=st[name]["color"],
                )
        if ref:
            ax.axvline(ref["entropy"], color="grey", linestyle="--", linewidth=1, label="held-out text's entropy")
        ax.set_xlabel("mean unigram entropy of a sample (nats)")
        ax.set_ylabel("GenPPL under the AR judge")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.set_title("zoomed on the bulk (labels: NFE)" if zoom else "Generative frontier (labels: NFE)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "frontier_genppl_entropy.png", dpi=120)
    plt.close(fig)

    keys = ["gen_ppl", "entropy"] + (["mauve"] if any("mauve" in r for r in rows) else [])
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    for ax, k in zip(axes[0], keys, strict=False):
        for name, rs in groups.items():
            rs = sorted(rs, key=lambda r: r["nfe"])
            ax.plot([r["nfe"] for r in rs], [r[k]["mean"] for r in rs], label=name, markersize=5, **st[name])
        if ref and k in ("gen_ppl", "entropy"):
            ax.axhline(ref[k], color="grey", linestyle="--", linewidth=1, label="held-out text")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("NFE (network calls per sample)")
        ax.set_ylabel(
            {"gen_ppl": "GenPPL under the AR judge", "mauve": "MAUVE", "entropy": "unigram entropy (nats)"}[k]
        )
        if k == "gen_ppl":
            ax.set_yscale("log")
        if k == "entropy":
            ax.set_ylim(max(main_lo - 0.1, 0), None)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "frontier_nfe.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
