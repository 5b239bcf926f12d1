"""Sample-quality sweeps: GenPPL / entropy / MAUVE against sampling steps and temperature.

For one trained run and one judge, :func:`quality_sweep` draws ``num`` samples for every
(sampler, steps) pair at temperature 1 and for every logit temperature with one (sampler, steps),
and scores each set with the same instruments as ``replaid quality``:

* GenPPL under the judge (a Hugging Face causal LM or a replaid AR run, :class:`~replaid.quality.Judge`);
* mean per-sample unigram entropy over the *sample ids* (the run's tokenizer);
* MAUVE against ``num`` held-out windows of the run's ``seq_len`` tokens (:func:`~replaid.quality.reference_windows`).

A ``data`` row scores a second, disjoint set of held-out windows the same way: the GenPPL the judge
gives real text, its entropy, and the MAUVE of real text against the references (the ceiling at
this sample size). :func:`plot_sweep` draws GenPPL and MAUVE against steps (one line per sampler)
and the temperature sweep as a GenPPL-entropy frontier.
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaid.eval.quality import Judge, mauve_score, reference_windows, sentence_features, unigram_entropy
from replaid.sampling.generate import generate
from replaid.sampling.request import SampleRequest
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.store.loading import Run


@dataclass
class SweepPoint:
    kind: str  # "steps" | "temperature" | "data"
    sampler: str
    steps: int
    temperature: float
    gen_ppl: float = float("nan")
    entropy: float = float("nan")
    mauve: float = float("nan")
    nfe: int = 0
    seconds_per_sample: float = 0.0
    example: str = field(default="", repr=False)


def quality_sweep(
    run: Run,
    judge: Judge,
    *,
    samplers: list[str],
    steps: list[int],
    temperatures: list[float],
    temp_sampler: str,
    temp_steps: int,
    num: int,
    split: str = "valid",
    seed: int = 0,
    batch_size: int = 16,
    encoder: str | None = None,
    out: Path | None = None,
    progress: bool = True,
) -> list[SweepPoint]:
    """Score every configuration (module docstring); samples go to ``out/samples/*.jsonl``."""
    from tqdm.auto import tqdm

    method = run.method
    foreign = [s for s in [*samplers, temp_sampler] if s not in method.samplers]
    if foreign:  # AR/MDLM/Duo have their own sampler: refused, never silently swapped
        raise ValueError(
            f"sampler {foreign[0]} is not one of this {method.name} run's ({', '.join(method.samplers)}); "
            f"pass --samplers {method.samplers[0]} or leave --samplers out"
        )
    L = run.cfg.data.seq_len
    if method.kind.left_to_right and any(T != L for T in [*steps, temp_steps]):
        raise ValueError(
            f"an AR run generates one token per step: --steps/--temp-steps must be {L} (its data.seq_len); "
            f"leave them out"
        )
    ref_texts, _ = reference_windows(run, split, num)
    ref_feat = sentence_features(ref_texts, encoder)
    configs = [("steps", s, T, 1.0) for s in samplers for T in steps]
    configs += [("temperature", temp_sampler, temp_steps, tau) for tau in temperatures]

    def score(texts: list[str], ids: list[list[int]]) -> tuple[float, float, float]:
        """(GenPPL, mean unigram entropy, MAUVE against the references)"""
        return (
            judge.score(texts)["gen_ppl"],
            unigram_entropy(ids)["entropy"],
            mauve_score(sentence_features(texts, encoder), ref_feat),
        )

    data_texts, data_ids = reference_windows(run, split, num, offset=1)
    points = [SweepPoint("data", "data", 0, 1.0, *score(data_texts, data_ids), example=data_texts[0])]
    done: dict[tuple[str, int, float], SweepPoint] = {}  # (sampler, steps, temperature) -> scored
    bar = tqdm(configs, desc="sweep", disable=not progress)
    for kind, sampler, T, tau in bar:
        bar.set_postfix(sampler=sampler, steps=T, temperature=tau)
        if (sampler, T, tau) in done:  # same seed, same samples: reuse the scores
            points.append(replace(done[(sampler, T, tau)], kind=kind))
            continue
        req = SampleRequest(
            sampler=sampler, steps=T, num=num, temperature=tau, batch_size=batch_size, seed=seed, progress=False
        )  # the sweep shows its own bar
        t0 = time.time()
        rows = generate(run, req)
        secs = (time.time() - t0) / num
        texts = [r["text"] for r in rows]
        if out is not None:
            d = Path(out) / "samples"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{sampler}-T{T}-tau{tau:g}.jsonl").write_text("".join(strict_dumps(r) + "\n" for r in rows))
        pt = SweepPoint(
            kind, sampler, T, tau, *score(texts, [r["ids"] for r in rows]), int(rows[0]["nfe"]), secs, texts[0]
        )
        done[(sampler, T, tau)] = pt
        points.append(pt)
    return points


def write_sweep(points: list[SweepPoint], out: Path, meta: dict[str, Any]) -> None:
    """``sweep.json`` (meta + points), ``sweep.csv`` and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(p) for p in points]
    (out / "sweep.json").write_text(strict_dumps({"meta": meta, "points": rows}, indent=2))
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "example"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot_sweep(points, out, meta.get("title", ""))


def plot_sweep(points: list[SweepPoint], out: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = next((p for p in points if p.kind == "data"), None)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    by_sampler: dict[str, list[SweepPoint]] = {}
    for p in points:
        if p.kind == "steps":
            by_sampler.setdefault(p.sampler, []).append(p)
    for name, ps in by_sampler.items():
        ps = sorted(ps, key=lambda p: p.steps)
        axes[0].plot([p.steps for p in ps], [p.gen_ppl for p in ps], "o-", label=name)
        axes[1].plot([p.steps for p in ps], [p.mauve for p in ps], "o-", label=name)
    for ax, key, lab in ((axes[0], "gen_ppl", "GenPPL"), (axes[1], "mauve", "MAUVE")):
        if data is not None:
            ax.axhline(getattr(data, key), color="k", ls="--", lw=1, label="held-out data")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sampling steps T (temperature 1)")
        ax.set_ylabel(lab)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    temps = sorted((p for p in points if p.kind == "temperature"), key=lambda p: p.temperature)
    ax = axes[2]
    if temps:
        ax.plot(
            [p.entropy for p in temps],
            [p.gen_ppl for p in temps],
            "o-",
            label=f"{temps[0].sampler}, T={temps[0].steps}, temperature sweep",
        )
        for p in temps:
            ax.annotate(
                f"{p.temperature:g}", (p.entropy, p.gen_ppl), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    for name, ps in by_sampler.items():
        ax.scatter([p.entropy for p in ps], [p.gen_ppl for p in ps], s=12, alpha=0.6, label=f"{name} (steps sweep)")
    if data is not None:
        ax.scatter([data.entropy], [data.gen_ppl], marker="*", s=120, color="k", label="held-out data")
    ax.set_yscale("log")
    ax.set_xlabel("mean unigram entropy (nats)")
    ax.set_ylabel("GenPPL")
    ax.set_title("GenPPL-entropy frontier")
    ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=120)
    plt.close(fig)


def markdown_table(points: list[SweepPoint]) -> str:
    lines = [
        "| kind | sampler | steps | temperature | NFE | GenPPL | entropy | MAUVE | s/sample |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.kind} | {p.sampler} | {p.steps or '-'} | {p.temperature:g} | {p.nfe or '-'} | "
            f"{p.gen_ppl:.1f} | {p.entropy:.3f} | {p.mauve:.3f} | {p.seconds_per_sample:.3f} |"
        )
    return "\n".join(lines)
