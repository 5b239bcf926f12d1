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
steps). The temperature is the logit temperature for the token methods; a continuous method's is Plaid's score
temperature (``score_temperature``, in [0.25, 4]), as the logit temperature (the paper's, appendix
"temperature") leaves its block sampler's entropy where it is (RePlaid-B4 at 64 steps per block: 3.302 nats at
1, 3.311 at 1.97; AR's is 3.889); a search that ends within 2% of its range's edge is flagged as pinned. Speed: tokens/s (rows x tokens / seconds), time to the first token and the peak memory of one
completion request of B rows for each B of ``--batches``, at 1x. ``--teacher STUDENT=TEACHER`` names the
goal's pairs: a student at least 2x AR's tokens/s at batch 1 with GenPPL at matched entropy within 1.5x of
its teacher's. Writes ``frontier.json``, ``frontier.md`` and ``frontier.png`` (tokens/s at batch 1 against
GenPPL at matched entropy, every configuration a point with its interval over seeds; and at the largest batch).

Each configuration's two parts land as they finish in ``OUT/rows/LABEL.json`` (with every seed's figures),
its samples in ``OUT/samples/LABEL.jsonl.gz`` (one JSON object per completion: temperature, length, seed,
text and ids), so that a stopped call resumes and ``--parts quality`` can run beside other work while
``--parts speed`` waits for a quiet machine (the 1/5/15-minute load averages are kept with each timing).
A part is computed again when what it was computed from changes (run, steps, judge, seeds, ...).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
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


def complete(
    run: Any, steps: int | None, num: int, length: int, seed: int, temperature: float, knob: str = "temperature"
) -> tuple[list, dict]:
    """``num`` completions of ``length`` tokens from an empty prompt in one batch, through ``Completion``:
    their ids and texts, and the request's seconds and time to its first token."""
    from replaid.sampling.request import SampleRequest
    from replaid.sampling.stream import Completion

    kw = {"steps": steps} if steps else {}
    req = SampleRequest(
        max_tokens=length, num=num, batch_size=num, seed=seed, ignore_eos=True, **{knob: temperature},
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


def match_knob(run: Any) -> tuple[str, float, float]:
    """The temperature a method's entropy is matched by, and its search range."""
    if run.method.kind.continuous:
        return "score_temperature", 0.25, 4.0
    return "temperature", 0.25, 2.0


def matched_temperature(run: Any, steps: int | None, num: int, L: int, target: float, iters: int) -> tuple[float, bool]:
    """The temperature (:func:`match_knob`) whose samples' entropy (seed 0, 1x) is ``target``, by bisection in
    log space (entropy rises with the temperature); and whether the search ended pinned at an edge."""
    from replaid.eval.quality import unigram_entropy

    knob, lo, hi = match_knob(run)
    edges = (lo, hi)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        e = unigram_entropy([x for x, _ in complete(run, steps, num, L, 0, mid, knob)[0]])["entropy"]
        lo, hi = (mid, hi) if e < target else (lo, mid)
    tau = round((lo * hi) ** 0.5, 4)
    return tau, not edges[0] * 1.02 < tau < edges[1] / 1.02


def _cache_key(part: str, run: str, steps: int | None, a: argparse.Namespace, knob: str) -> dict[str, Any]:
    """What a cached part was computed from: a part whose key differs is computed again (``knob``: the matched
    temperature's, named when it is not the logit temperature)."""
    if part == "quality":
        return {**({"match_knob": knob} if knob != "temperature" else {}),"run": run, "steps": steps, "judge": a.judge_run, "match": a.match, "match_iters": a.match_iters,
                "lengths": a.lengths, "seeds": a.seeds, "num": a.num, "mauve": a.mauve, "split": a.split}  # fmt: skip
    return {"run": run, "steps": steps, "batches": a.batches, "seeds": a.seeds, "threads": a.threads}


def _host(threads: int) -> str:
    import torch

    return f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, {threads} thread(s)"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def quality_part(
    run: Any, steps: int | None, judge: Any, ref_feat: Any, target: float | None, a: argparse.Namespace, is_match: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """GenPPL, entropy, repeated 4-grams (and MAUVE at 1x) per length and seed, at temperature 1 and at the
    matched temperature; and every sample, for the JSONL."""
    from replaid.eval.seeds import t_interval

    L = int(judge.cfg.data.seq_len)
    knob = match_knob(run)[0]
    temps = {"t1": 1.0}
    pinned = False
    if target is not None and not is_match:
        temps["matched"], pinned = matched_temperature(run, steps, a.num, L, target, a.match_iters)
    part: dict[str, Any] = {"matched_temperature": 1.0 if is_match else temps.get("matched"), "per_seed": {}}
    part.update(match_knob=knob, match_pinned=pinned)
    samples = []
    for tname, tau in temps.items():
        for k in a.lengths:
            per_seed = []
            for s in a.seeds:
                got = complete(run, steps, a.num, k * L, s, tau, knob)[0]
                per_seed.append(score(got, judge, ref_feat if k == 1 else None))
                samples += [{"temperature": tname, "knob": knob, "tau": tau, "length": k, "seed": s, "index": i, "text": t,
                             "ids": [int(x) for x in ids]} for i, (ids, t) in enumerate(got)]  # fmt: skip
            part[f"{tname}_{k}x"] = {m: t_interval([x[m] for x in per_seed]).as_dict() for m in per_seed[0]}
            part["per_seed"][f"{tname}_{k}x"] = per_seed
            if is_match:  # its own entropy: the matched temperature is 1, the same samples
                part[f"matched_{k}x"], part["per_seed"][f"matched_{k}x"] = part[f"t1_{k}x"], per_seed
    return part, samples


def speed_part(run: Any, steps: int | None, L: int, a: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s, time to the first token and the request's peak tensors for one request of B rows, per B."""
    from replaid.eval.seeds import t_interval
    from replaid.training.memory import LiveHeap

    part: dict[str, Any] = {}
    for B in a.batches:
        # the first request: its peak memory, and it warms the caches. On the CPU the request's own tensors
        # at their most at once (the live heap: exact and load-independent; the weights made before it are
        # not counted), where a shared process's RSS high-water mark would not rise for reused memory.
        with LiveHeap() as heap:
            complete(run, steps, B, L, 0, 1.0)
        timed = [complete(run, steps, B, L, s, 1.0)[1] for s in a.seeds]
        tps = [B * L / t["seconds"] for t in timed]
        part[f"batch{B}"] = {
            "tokens_per_s": t_interval(tps).as_dict(),
            "ttft_s": t_interval([t["ttft_s"] for t in timed]).as_dict(),
            "peak_bytes": heap.peak,
            "per_seed": timed,
        }
    return part


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
    p.add_argument("--mauve", action="store_true", help="MAUVE at 1x against held-out windows of --split")
    p.add_argument("--split", default="test")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--parts",
        nargs="+",
        choices=("quality", "speed"),
        default=["quality", "speed"],
        help="what to compute now (the rest is read from OUT/rows/; speed wants a quiet machine)",
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    configs = [parse_config(c) for c in a.config]
    labels = [c[0] for c in configs]
    if len(set(labels)) < len(labels):
        fail(f"--config labels {labels}: a label is given twice; give each configuration its own")
    for name in [a.match] * bool(a.match) + [x for t in a.teacher for x in t.split("=", 1)]:
        if name not in labels:
            fail(f"{name!r} is not a --config label ({', '.join(labels)}): name one of them")
    if a.match:  # the matched label first: its entropy at temperature 1 is the others' target
        configs.sort(key=lambda c: c[0] != a.match)

    import torch

    torch.set_num_threads(a.threads)
    from replaid.eval.quality import reference_windows, sentence_features
    from replaid.store.loading import load_run

    judge = load_run(a.judge_run, device="cpu")
    L = int(judge.cfg.data.seq_len)
    (a.out / "rows").mkdir(parents=True, exist_ok=True)
    (a.out / "samples").mkdir(exist_ok=True)
    ref_feat = None
    target = None
    runs = {label: load_run(path, device="cpu") for label, path, _ in configs}
    knobs = {label: match_knob(run)[0] for label, run in runs.items()}
    for label, path, steps in configs:
        f = a.out / "rows" / f"{label}.json"
        row = json.loads(f.read_text()) if f.exists() else {}
        run = runs[label]
        for part in ("quality", "speed"):
            key = _cache_key(part, path, steps, a, knobs[label])
            if row.get(part, {}).get("key") == key or part not in a.parts:
                continue
            if part == "quality":
                if a.mauve and ref_feat is None:
                    ref_feat = sentence_features(reference_windows(judge, a.split, a.num)[0])
                got, samples = quality_part(run, steps, judge, ref_feat, target, a, label == a.match)
                with gzip.open(a.out / "samples" / f"{label}.jsonl.gz", "wt", encoding="utf-8") as z:
                    z.writelines(json.dumps(x) + "\n" for x in samples)
            else:
                got = speed_part(run, steps, L, a)
                got["loadavg"] = os.getloadavg()  # a timing taken beside other work is not a figure
            row[part] = {"key": key, "date": _now(), "host": _host(a.threads), **got}
            row.update(label=label, steps=steps, method=run.cfg.method, block=run.method.stream_block())
            f.write_text(json.dumps(row, indent=1))  # each part as it lands: a stopped call resumes
            print(f"{label}: {part} done", flush=True)
        if label == a.match and row.get("quality", {}).get("key") == _cache_key(
            "quality", path, steps, a, knobs[label]
        ):
            target = row["quality"]["per_seed"]["t1_1x"][a.seeds.index(0) if 0 in a.seeds else 0]["entropy"]
    rows = []
    missing = []
    for label, path, steps in configs:
        f = a.out / "rows" / f"{label}.json"
        row = json.loads(f.read_text()) if f.exists() else {}
        for part in ("quality", "speed"):
            if row.get(part, {}).get("key") != _cache_key(part, path, steps, a, knobs[label]):
                missing.append(f"{label} {part}")
        if not missing:
            flat = {k: row[k] for k in ("label", "steps", "method", "block")}
            flat.update({k: v for k, v in row["quality"].items() if k.startswith(("t1_", "matched_"))})
            knob, lo, hi = match_knob(runs[label])
            tau = flat["matched_temperature"] = row["quality"]["matched_temperature"]
            flat["match_knob"] = knob
            flat["match_pinned"] = label != a.match and tau is not None and not lo * 1.02 < tau < hi / 1.02
            flat["temperature"] = 1.0
            flat.update({k: v for k, v in row["speed"].items() if k.startswith("batch")})
            flat["loadavg"] = row["speed"]["loadavg"]
            rows.append(flat)
    if missing:
        print(f"not yet computed: {', '.join(missing)}; rerun with --parts quality speed to finish")
        return 0
    meta = {
        "date": _now(), "host": _host(a.threads), "judge": a.judge_run, "match": a.match, "target_entropy": target,
        "seq_len": L, "num": a.num, "seeds": a.seeds, "lengths": a.lengths, "batches": a.batches,
    }  # fmt: skip
    out = {"meta": meta, "rows": rows, "verdicts": verdicts(rows, a)}
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


def _temp(r: dict) -> str:
    """The matched temperature, its knob when it is the score temperature, and a pinned search."""
    if r.get("matched_temperature") is None:
        return "-"
    knob = " (score)" if r.get("match_knob") == "score_temperature" else ""
    return f"{r['matched_temperature']}{knob}{', pinned' if r.get('match_pinned') else ''}"


def markdown(out: dict) -> str:
    meta, rows = out["meta"], out["rows"]
    lines = [
        f"{meta['date']}, {meta['host']}; judge {meta['judge']}; {meta['num']} samples per seed, seeds {meta['seeds']}.",
        "",
    ]
    lines += ["| config | steps/block | temp. (matched) | length | GenPPL (t=1) | entropy (t=1) | GenPPL (matched) | entropy (matched) | rep. 4-grams (matched) | MAUVE (matched, 1x) |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for k in meta["lengths"]:
            t1, mt = r.get(f"t1_{k}x", {}), r.get(f"matched_{k}x") or {}
            lines.append(
                f"| {r['label']} | {r['steps'] or '-'} | {_temp(r)} | {k}x | {_iv(t1.get('gen_ppl'))} | "
                f"{_iv(t1.get('entropy'), 3)} | {_iv(mt.get('gen_ppl'))} | {_iv(mt.get('entropy'), 3)} | "
                f"{_iv((mt or t1).get('rep4'), 4)} | {_iv((mt or t1).get('mauve'), 3)} |"
            )
    lines += [
        "",
        "| config | batch | tokens/s | time to first token (s) | the request's peak tensors (MiB) | load avg. (1 min) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for B in meta["batches"]:
            s = r[f"batch{B}"]
            lines.append(
                f"| {r['label']} | {B} | {_iv(s['tokens_per_s'])} | {_iv(s['ttft_s'], 3)} | {s['peak_bytes'] / 2**20:.1f} | {r['loadavg'][0]:.2f} |"
            )
    v = out["verdicts"]
    lines += ["", f"Faster than AR at batch {min(meta['batches'])} and within 1.5x of its GenPPL at matched entropy: "
              f"{', '.join(v['faster_and_close']) or 'none'}. Fastest at batch {max(meta['batches'])}: {v['fastest_at_largest_batch']}."]  # fmt: skip
    for g in v["goal"]:
        lines.append(f"Goal, {g['student']} (teacher {g['teacher']}): {g['speed_vs_ar']:.2f}x AR's tokens/s, GenPPL "
                     f"{g['genppl_vs_teacher']:.2f}x its teacher's: {'met' if g['met'] else 'not met'}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], a: argparse.Namespace, path: Path) -> None:
    """Tokens/s against GenPPL at matched entropy, at the smallest and the largest batch: a colour per family
    (the label before its training seed, ``-s<seed>``), a marker per steps per block; dashed, AR's tokens/s and
    1.5x its GenPPL (where 'faster and close' lies: above and to the left of both)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(r["label"].rsplit("-s", 1)[0] for r in rows))
    markers = {None: "s", 1: "*", 2: "D", 4: "^"}
    ar = next((r for r in rows if r["method"] == "ar"), None)
    batches = sorted({min(a.batches), max(a.batches)})
    fig, axes = plt.subplots(1, len(batches), figsize=(6.5 * len(batches), 4.8), squeeze=False)
    for ax, B in zip(axes[0], batches, strict=True):
        for r in rows:
            q, s = quality(r), r[f"batch{B}"]["tokens_per_s"]
            xerr = None if q.get("lo") is None else [[q["mean"] - q["lo"]], [q["hi"] - q["mean"]]]
            yerr = None if s.get("lo") is None else [[s["mean"] - s["lo"]], [s["hi"] - s["mean"]]]
            colour = f"C{families.index(r['label'].rsplit('-s', 1)[0]) % 10}"
            ax.errorbar(q["mean"], s["mean"], xerr=xerr, yerr=yerr, fmt=markers.get(r["steps"], "o"), color=colour,
                        capsize=2, markersize=7, label=f"{r['label']} ({r['steps'] or 'KV cache'})")  # fmt: skip
        if ar is not None:
            ax.axvline(1.5 * quality(ar)["mean"], color="0.4", ls="--", lw=0.8)
            ax.axhline(ar[f"batch{B}"]["tokens_per_s"]["mean"], color="0.4", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("GenPPL under the AR judge at matched entropy (1x seq_len)")
        ax.set_ylabel(f"tokens/s at batch {B} (served path)")
        ax.set_title(f"batch {B}")
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
