"""Speed and quality on the same runs (issue 52 §1): every configuration's text and its speed, both through
the served path (``Completion`` over the one block loop: what ``replaid sample`` and ``/v1/completions`` run).

    .venv/bin/python scripts/serve_frontier.py --judge-run runs/ar --match AR \\
        --config "AR=runs/ar" --config "RePlaid-B4=runs/rb4:64" --config "RePlaid-B4-PD1=runs/rb4-pd1:1" \\
        --config "MDLM-B4=runs/mb4:64" --teacher RePlaid-B4-PD1=RePlaid-B4 \\
        --lengths 1 4 --seeds 0 1 2 --num 32 --batches 1 16 --out docs/results/blocks/frontier

Each ``--config LABEL=RUN[:STEPS]`` (steps per block; an AR run has none) is scored at each length k x
``seq_len`` (``--lengths``) and sampling seed: ``--num`` completions from an empty prompt (the end of text
ignored), GenPPL under the AR ``--judge-run`` with the mean per-sample unigram entropy beside it, the
repeated 4-grams, and MAUVE against held-out windows (``--mauve``); once at temperature 1 and once at the
temperature whose entropy matches ``--match``'s at temperature 1 (bisection on seed 0 at 1x, ``--match-iters``
steps). Speed: tokens/s (rows x tokens / seconds), time to the first token and the peak memory of one
completion request of B rows for each B of ``--batches``, at 1x. ``--teacher STUDENT=TEACHER`` names the
goal's pairs: a student at least 2x AR's tokens/s at batch 1 with GenPPL at matched entropy within 1.5x of
its teacher's. Writes ``frontier.json``, ``frontier.md`` and ``frontier.png`` (tokens/s at batch 1 against
GenPPL at matched entropy, every configuration a point with its interval over seeds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, NoReturn


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2."""
    sys.stderr.write(f"replaid: error: {message}\n")
    raise SystemExit(2)


def parse_config(spec: str) -> tuple[str, str, int | None]:
    """``LABEL=RUN[:STEPS]``."""
    label, sep, rest = spec.partition("=")
    path, _, steps = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not sep or not label or not path or (steps and not steps.isdigit()):
        fail(f"--config {spec!r}: expected LABEL=RUN[:STEPS] (e.g. B4=runs/rb4:64)")
    return label, path, int(steps) if steps else None


def complete(run: Any, steps: int | None, num: int, length: int, seed: int, temperature: float) -> tuple[list, dict]:
    """``num`` completions of ``length`` tokens from an empty prompt in one batch, through ``Completion``:
    their ids and texts, and the request's seconds and time to its first token."""
    from replaid.sampling.request import SampleRequest
    from replaid.sampling.stream import Completion

    kw = {"steps": steps} if steps else {}
    req = SampleRequest(
        max_tokens=length, num=num, batch_size=num, seed=seed, temperature=temperature, ignore_eos=True,
        progress=False, **kw,
    )  # fmt: skip
    comp = Completion(run, req)
    t0 = time.perf_counter()
    first = None
    for deltas in comp:
        if first is None and any(d.text for d in deltas):
            first = time.perf_counter() - t0
    secs = time.perf_counter() - t0
    ids = [s.kept_ids() for s in comp.samples]
    # a request whose text stays empty until its end (every token decoding to nothing) gives its first at the end
    return [(x, run.tokenizer.decode(x)) for x in ids], {"seconds": secs, "ttft_s": secs if first is None else first}


def score(samples: list, judge: Any, ref_feat: Any) -> dict[str, float]:
    from replaid.eval.quality import gen_ppl_ar_run, mauve_score, repetition_rate, sentence_features, unigram_entropy

    texts, ids = [t for _, t in samples], [x for x, _ in samples]
    m = {
        "gen_ppl": gen_ppl_ar_run(texts, judge)["gen_ppl"],
        "entropy": unigram_entropy(ids)["entropy"],
        "rep4": repetition_rate(ids, 4)["repetition"],
    }
    if ref_feat is not None:
        m["mauve"] = mauve_score(sentence_features(texts), ref_feat)
    return m


def matched_temperature(run: Any, steps: int | None, num: int, L: int, target: float, iters: int) -> float:
    """The temperature in [0.25, 2] whose samples' entropy (seed 0, 1x) is ``target``, by bisection
    (entropy rises with the temperature)."""
    from replaid.eval.quality import unigram_entropy

    lo, hi = 0.25, 2.0
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        e = unigram_entropy([x for x, _ in complete(run, steps, num, L, 0, mid)[0]])["entropy"]
        lo, hi = (mid, hi) if e < target else (lo, mid)
    return round((lo * hi) ** 0.5, 4)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True, help="LABEL=RUN[:STEPS] (steps per block)")
    p.add_argument("--judge-run", required=True, help="an AR run on the same corpus (the GenPPL judge)")
    p.add_argument("--match", default=None, help="the LABEL whose entropy at temperature 1 the others match")
    p.add_argument("--match-iters", type=int, default=6)
    p.add_argument("--teacher", action="append", default=[], help="STUDENT=TEACHER (labels): the goal's pairs")
    p.add_argument("--lengths", type=int, nargs="+", default=[1, 4])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num", type=int, default=32)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--mauve", action="store_true")
    p.add_argument("--split", default="test")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    configs = [parse_config(c) for c in a.config]
    labels = [c[0] for c in configs]
    for name in [a.match] * bool(a.match) + [x for t in a.teacher for x in t.split("=", 1)]:
        if name not in labels:
            fail(f"{name!r} is not a --config label ({', '.join(labels)}): name one of them")

    import torch

    torch.set_num_threads(a.threads)
    from replaid.eval.quality import reference_windows, sentence_features
    from replaid.eval.seeds import t_interval
    from replaid.store.loading import load_run
    from replaid.training.memory import LiveHeap

    judge = load_run(a.judge_run, device="cpu")
    runs = {label: (load_run(path, device="cpu"), steps) for label, path, steps in configs}
    L = int(judge.cfg.data.seq_len)
    ref_feat = None
    if a.mauve:
        ref_feat = sentence_features(reference_windows(judge, a.split, a.num)[0])
    target = None
    if a.match:
        run, steps = runs[a.match]
        target = score(complete(run, steps, a.num, L, 0, 1.0)[0], judge, None)["entropy"]
    rows = []
    for label, (run, steps) in runs.items():
        temps = {"t1": 1.0}
        if target is not None:
            temps["matched"] = (
                1.0 if label == a.match else matched_temperature(run, steps, a.num, L, target, a.match_iters)
            )
        row: dict[str, Any] = {
            "label": label,
            "steps": steps,
            "method": run.cfg.method,
            "block": run.method.stream_block(),
            "temperature": temps["t1"],
        }
        for tname, tau in temps.items():
            for k in a.lengths:
                per_seed = [score(complete(run, steps, a.num, k * L, s, tau)[0], judge, ref_feat) for s in a.seeds]
                row[f"{tname}_{k}x"] = {m: t_interval([x[m] for x in per_seed]).as_dict() for m in per_seed[0]}
        row["matched_temperature"] = temps.get("matched")
        for B in a.batches:
            # the first request: its peak memory, and it warms the caches. On the CPU the request's own tensors
            # at their most at once (the live heap: exact and load-independent; the weights made before it are
            # not counted), where a shared process's RSS high-water mark would not rise for reused memory.
            with LiveHeap() as heap:
                complete(run, steps, B, L, 0, 1.0)
            peak = heap.peak
            timed = [complete(run, steps, B, L, s, 1.0)[1] for s in a.seeds]
            tps = [B * L / t["seconds"] for t in timed]
            row[f"batch{B}"] = {
                "tokens_per_s": t_interval(tps).as_dict(),
                "ttft_s": t_interval([t["ttft_s"] for t in timed]).as_dict(),
                "peak_bytes": peak,
            }
        rows.append(row)
        print(f"{label}: {json.dumps({k: v for k, v in row.items() if k.startswith('batch')})}", flush=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, {a.threads} thread(s)",
        "judge": a.judge_run, "match": a.match, "target_entropy": target, "seq_len": L, "num": a.num,
        "seeds": a.seeds, "lengths": a.lengths, "batches": a.batches,
    }  # fmt: skip
    out = {"meta": meta, "rows": rows, "verdicts": verdicts(rows, a)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "frontier.json").write_text(json.dumps(out, indent=1))
    (a.out / "frontier.md").write_text(markdown(out))
    plot(rows, a, a.out / "frontier.png")
    print(f"wrote {a.out}/frontier.json, frontier.md, frontier.png")
    return 0


def quality(row: dict, key: str = "gen_ppl") -> dict | None:
    """GenPPL at matched entropy at 1x (at temperature 1 without --match)."""
    q = row.get("matched_1x") or row.get("t1_1x")
    return None if q is None else q[key]


def verdicts(rows: list[dict], a: argparse.Namespace) -> dict[str, Any]:
    """Where a diffusion configuration is both faster than AR at batch 1 and within 1.5x of AR's GenPPL at
    matched entropy; the fastest at the largest batch; the goal's student-teacher pairs."""
    by = {r["label"]: r for r in rows}
    ar = [r for r in rows if r["method"] == "ar"]
    out: dict[str, Any] = {"faster_and_close": [], "goal": []}
    b1, bmax = f"batch{min(a.batches)}", f"batch{max(a.batches)}"
    if ar:
        A = ar[0]
        for r in rows:
            if r is A:
                continue
            fast = r[b1]["tokens_per_s"]["mean"] > A[b1]["tokens_per_s"]["mean"]
            close = quality(r)["mean"] <= 1.5 * quality(A)["mean"]
            if fast and close:
                out["faster_and_close"].append(r["label"])
        for pair in a.teacher:
            s, t = pair.split("=", 1)
            speed = by[s][b1]["tokens_per_s"]["mean"] / A[b1]["tokens_per_s"]["mean"]
            ratio = quality(by[s])["mean"] / quality(by[t])["mean"]
            out["goal"].append({"student": s, "teacher": t, "speed_vs_ar": speed, "genppl_vs_teacher": ratio,
                                "met": speed >= 2 and ratio <= 1.5})  # fmt: skip
    out["fastest_at_largest_batch"] = max(rows, key=lambda r: r[bmax]["tokens_per_s"]["mean"])["label"]
    return out


def _iv(d: dict | None, nd: int = 1) -> str:
    if not d or d.get("mean") is None:
        return "-"
    if d.get("n", 0) < 2 or d.get("lo") is None:
        return f"{d['mean']:.{nd}f}"
    return f"{d['mean']:.{nd}f} [{d['lo']:.{nd}f}, {d['hi']:.{nd}f}]"


def markdown(out: dict) -> str:
    meta, rows = out["meta"], out["rows"]
    lines = [
        f"{meta['date']}, {meta['host']}; judge {meta['judge']}; {meta['num']} samples per seed, seeds {meta['seeds']}.",
        "",
    ]
    lines += ["| config | steps/block | temp. (matched) | length | GenPPL (t=1) | entropy (t=1) | GenPPL (matched) | entropy (matched) | rep. 4-grams | MAUVE |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for k in meta["lengths"]:
            t1, mt = r.get(f"t1_{k}x", {}), r.get(f"matched_{k}x") or {}
            lines.append(
                f"| {r['label']} | {r['steps'] or '-'} | {r['matched_temperature'] or '-'} | {k}x | {_iv(t1.get('gen_ppl'))} | "
                f"{_iv(t1.get('entropy'), 3)} | {_iv(mt.get('gen_ppl'))} | {_iv(mt.get('entropy'), 3)} | "
                f"{_iv((mt or t1).get('rep4'), 4)} | {_iv((mt or t1).get('mauve'), 3)} |"
            )
    lines += [
        "",
        "| config | batch | tokens/s | time to first token (s) | the request's peak tensors (MiB) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for B in meta["batches"]:
            s = r[f"batch{B}"]
            lines.append(
                f"| {r['label']} | {B} | {_iv(s['tokens_per_s'])} | {_iv(s['ttft_s'], 3)} | {s['peak_bytes'] / 2**20:.1f} |"
            )
    v = out["verdicts"]
    lines += ["", f"Faster than AR at batch {min(meta['batches'])} and within 1.5x of its GenPPL at matched entropy: "
              f"{', '.join(v['faster_and_close']) or 'none'}. Fastest at batch {max(meta['batches'])}: {v['fastest_at_largest_batch']}."]  # fmt: skip
    for g in v["goal"]:
        lines.append(f"Goal, {g['student']} (teacher {g['teacher']}): {g['speed_vs_ar']:.2f}x AR's tokens/s, GenPPL "
                     f"{g['genppl_vs_teacher']:.2f}x its teacher's: {'met' if g['met'] else 'not met'}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], a: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b1 = f"batch{min(a.batches)}"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(rows):
        q, s = quality(r), r[b1]["tokens_per_s"]
        xerr = None if q.get("lo") is None else [[q["mean"] - q["lo"]], [q["hi"] - q["mean"]]]
        yerr = None if s.get("lo") is None else [[s["mean"] - s["lo"]], [s["hi"] - s["mean"]]]
        ax.errorbar(q["mean"], s["mean"], xerr=xerr, yerr=yerr, fmt="s" if r["method"] == "ar" else "o",
                    color=f"C{i % 10}", capsize=2, label=f"{r['label']} ({r['steps'] or 'KV cache'})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GenPPL under the AR judge at matched entropy (1x seq_len)")
    ax.set_ylabel(f"tokens/s at batch {min(a.batches)} (served path)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
