"""Measures the three controls of issue 26 on a trained RePlaid run (docs/results/control/).

    python scripts/measure_control.py RUN --out docs/results/control [--seeds 3 --num 32 --steps 32]

* lexical constraints: ``--require`` word sets of 1-3 words, success rate (all words present), GenPPL and
  unigram entropy against the guidance scale (scale 0 = the unguided base rate);
* editing: SDEdit of held-out windows against strength: token edit distance to the source, GenPPL, and how
  many tokens outside ``--token-span`` changed (must be 0);
* attribute control: label = "question" (the 64-token window contains '?') vs "plain", a latent classifier
  trained with ``replaid classifier train``'s code, an independent judge (scikit-learn TF-IDF + logistic
  regression on clean text), judge accuracy vs scale, and rejection sampling (best of k unguided samples by
  the latent classifier at the last level) as the baseline.

GenPPL here is under an add-0.1 smoothed *bigram* model of the corpus's training split in the run's
tokenizer (no AR judge run exists at this size); intervals are over sampling seeds (t, 95%).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from replaid.sampling.generate import generate
from replaid.sampling.request import SampleRequest
from replaid.training.classifier import ClassifierTrainConfig, save_classifier, train_classifier
from replaid.training.loading import load_run

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57}


def ci(xs) -> tuple[float, float]:
    """Mean and 95% t half-width over seeds."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 2:
        return float(a.mean()), float("nan")
    return float(a.mean()), float(T95.get(len(a) - 1, 2.0) * a.std(ddof=1) / math.sqrt(len(a)))


class Bigram:
    """Add-k bigram LM over token ids: GenPPL = exp(mean NLL of every token after the first)."""

    def __init__(self, docs: list[list[int]], V: int, k: float = 0.1):
        c = np.zeros((V, V), dtype=np.float64)
        for d in docs:
            a = np.asarray(d)
            np.add.at(c, (a[:-1], a[1:]), 1.0)
        self.logp = np.log((c + k) / (c + k).sum(1, keepdims=True))

    def ppl(self, samples: list[list[int]]) -> float:
        nll = [-self.logp[a, b] for s in samples for a, b in zip(s[:-1], s[1:])]
        return float(math.exp(np.mean(nll)))


def entropy(samples: list[list[int]]) -> float:
    out = []
    for s in samples:
        _, n = np.unique(s, return_counts=True)
        p = n / n.sum()
        out.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(out))


def levenshtein(a: list[int], b: list[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def windows(tok, path: Path, L: int) -> list[list[int]]:
    out = []
    for line in path.read_text().splitlines():
        ids = tok.encode(json.loads(line)["text"])
        out += [ids[o : o + L] for o in range(0, len(ids) - L, L)]
    return out


def lexical(run, bigram, args) -> list[dict]:
    sets = [(" king",), (" king", " love"), (" king", " love", " death")]
    rows = []
    for words in sets:
        for w in args.scales:
            per_seed = []
            for seed in range(args.seeds):
                req = SampleRequest(
                    steps=args.steps, num=args.num, batch_size=args.num, seed=seed, progress=False,
                    require=words, guidance_scale=w,
                )  # fmt: skip
                t0 = time.time()
                out = generate(run, req)
                ids = [r["ids"] for r in out]
                per_seed.append(
                    dict(
                        success=float(np.mean([all(r["required"]) for r in out])),
                        genppl=bigram.ppl(ids),
                        entropy=entropy(ids),
                        seconds=time.time() - t0,
                    )
                )
            row = {"words": list(words), "scale": w}
            for k in ("success", "genppl", "entropy", "seconds"):
                row[k], row[k + "_ci"] = ci([p[k] for p in per_seed])
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def editing(run, bigram, sources, args) -> list[dict]:
    tok = run.tokenizer
    span = (16, 48)
    rows = []
    for s in args.strengths:
        per_seed = []
        for seed in range(args.seeds):
            dist, outside, ids_all = [], 0, []
            for src in sources:
                text = tok.decode(src)
                req = SampleRequest(
                    steps=args.steps, num=1, seed=seed, progress=False, edit=text, strength=s,
                    edit_span=f"{span[0]}:{span[1]}",
                )  # fmt: skip
                enc = req.edit_plan(tok).ids.tolist()
                r = generate(run, req)[0]
                outside += sum(r["ids"][i] != enc[i] for i in range(len(enc)) if not span[0] <= i < span[1])
                dist.append(levenshtein(r["ids"], enc))
                ids_all.append(r["ids"])
            per_seed.append(
                dict(edit_distance=float(np.mean(dist)), genppl=bigram.ppl(ids_all), outside_changed=outside)
            )
        row = {"strength": s}
        for k in ("edit_distance", "genppl"):
            row[k], row[k + "_ci"] = ci([p[k] for p in per_seed])
        row["outside_changed"] = int(sum(p["outside_changed"] for p in per_seed))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def attribute(run, bigram, train_w, valid_w, args, out: Path) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    tok = run.tokenizer
    texts = [tok.decode(w) for w in train_w]
    labels = ["question" if "?" in t else "plain" for t in texts]
    clf, metrics = train_classifier(
        run, texts, labels, ClassifierTrainConfig(steps=args.clf_steps, seed=0), log=lambda m: print(m, flush=True)
    )
    save_classifier(clf, out / "classifier", run, ClassifierTrainConfig(steps=args.clf_steps), metrics)
    print("latent classifier", json.dumps(metrics), flush=True)
    vt = [tok.decode(w) for w in valid_w]
    vy = ["question" if "?" in t else "plain" for t in vt]
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 3), min_df=2)
    judge = LogisticRegression(max_iter=2000, C=4.0).fit(vec.fit_transform(texts), labels)
    judge_acc = float((judge.predict(vec.transform(vt)) == np.asarray(vy)).mean())
    print("judge held-out accuracy", judge_acc, flush=True)
    target = "question"
    guide = f"{out / 'classifier'}:{target}"
    rows = []
    for w in args.scales:
        per_seed = []
        for seed in range(args.seeds):
            req = SampleRequest(
                steps=args.steps, num=args.num, batch_size=args.num, seed=seed, progress=False, guide=guide,
                guidance_scale=w,
            )  # fmt: skip
            t0 = time.time()
            res = generate(run, req)
            texts_g = [r["text"] for r in res]
            per_seed.append(
                dict(
                    judge=float((judge.predict(vec.transform(texts_g)) == target).mean()),
                    has_q=float(np.mean(["?" in t for t in texts_g])),
                    genppl=bigram.ppl([r["ids"] for r in res]),
                    entropy=entropy([r["ids"] for r in res]),
                    seconds=time.time() - t0,
                )
            )
        row = {"scale": w, "nfe": args.steps + 1}
        for k in ("judge", "has_q", "genppl", "entropy", "seconds"):
            row[k], row[k + "_ci"] = ci([p[k] for p in per_seed])
        rows.append(row)
        print(json.dumps(row), flush=True)
    # rejection sampling: best of k unguided samples, chosen by the same latent classifier read at the
    # cleanest level on the samples' own embeddings (alpha ~ 1), k unguided runs = k (T + 1) NFE
    E = run.model.embedding_matrix().detach().float()
    g0 = run.model.schedule(torch.zeros(1, dtype=torch.float64))
    g0 = (g0[0] if isinstance(g0, (tuple, list)) else g0).double().reshape(1)
    rej = []
    K = max(args.reject_k)
    for k in args.reject_k:
        per_seed = []
        for seed in range(args.seeds):
            pool = generate(
                run, SampleRequest(steps=args.steps, num=args.num * K, batch_size=args.num, seed=1000 + seed,
                                   progress=False)
            )  # fmt: skip
            chosen = []
            for i in range(args.num):
                cand = pool[i * K : i * K + k]
                x = torch.tensor([c["ids"] for c in cand])
                with torch.no_grad():
                    lp = torch.log_softmax(clf(E[x], g0.expand(len(cand))), -1)[:, clf.label_index(target)]
                chosen.append(cand[int(lp.argmax())])
            tx = [c["text"] for c in chosen]
            per_seed.append(
                dict(
                    judge=float((judge.predict(vec.transform(tx)) == target).mean()),
                    has_q=float(np.mean(["?" in t for t in tx])),
                    genppl=bigram.ppl([c["ids"] for c in chosen]),
                    entropy=entropy([c["ids"] for c in chosen]),
                )
            )
        row = {"k": k, "nfe": k * (args.steps + 1)}
        for key in ("judge", "has_q", "genppl", "entropy"):
            row[key], row[key + "_ci"] = ci([p[key] for p in per_seed])
        rej.append(row)
        print(json.dumps(row), flush=True)
    base = float(np.mean(["?" in t for t in vt]))
    return {
        "guided": rows,
        "rejection": rej,
        "latent_classifier": metrics,
        "judge_valid_accuracy": judge_acc,
        "valid_rate": base,
    }


def plots(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for words in {tuple(r["words"]) for r in res["lexical"]}:
        rs = [r for r in res["lexical"] if tuple(r["words"]) == words]
        lab = "+".join(w.strip() for w in words)
        ax[0].errorbar([r["scale"] for r in rs], [r["success"] for r in rs], [r["success_ci"] for r in rs],
                       marker="o", capsize=3, label=lab)  # fmt: skip
        ax[1].errorbar([r["scale"] for r in rs], [r["genppl"] for r in rs], [r["genppl_ci"] for r in rs],
                       marker="o", capsize=3, label=lab)  # fmt: skip
        ax[2].errorbar([r["scale"] for r in rs], [r["entropy"] for r in rs], [r["entropy_ci"] for r in rs],
                       marker="o", capsize=3, label=lab)  # fmt: skip
    for a, t in zip(ax, ("success rate (all words present)", "GenPPL (bigram judge)", "unigram entropy (nats)")):
        a.set_xlabel("guidance scale w (0 = unguided base rate)")
        a.set_title(t)
        a.set_xscale("symlog", linthresh=1)
        a.legend()
    fig.suptitle("Token guidance (--require), 95% t-intervals over sampling seeds")
    fig.tight_layout()
    fig.savefig(out / "lexical.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(10, 4.2))
    rs = res["editing"]
    s = [r["strength"] for r in rs]
    ax[0].errorbar(s, [r["edit_distance"] for r in rs], [r["edit_distance_ci"] for r in rs], marker="o", capsize=3)
    ax[0].set_title("token edit distance to the source (span 16:48)")
    ax[1].errorbar(s, [r["genppl"] for r in rs], [r["genppl_ci"] for r in rs], marker="o", capsize=3)
    ax[1].set_title("GenPPL (bigram judge)")
    for a in ax:
        a.set_xlabel("strength s")
    fig.suptitle(f"SDEdit; tokens changed outside the span: {sum(r['outside_changed'] for r in rs)}")
    fig.tight_layout()
    fig.savefig(out / "editing.png", dpi=110)
    plt.close(fig)

    at = res["attribute"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    g, r = at["guided"], at["rejection"]
    for key, a, t in (("judge", ax[0], "judge: fraction 'question'"), ("genppl", ax[1], "GenPPL (bigram)"),
                      ("entropy", ax[2], "unigram entropy (nats)")):  # fmt: skip
        a.errorbar([x["nfe"] for x in g], [x[key] for x in g], [x[key + "_ci"] for x in g], marker="o", capsize=3,
                   label="classifier guidance (w = " + ", ".join(str(x["scale"]) for x in g) + ")")  # fmt: skip
        a.errorbar([x["nfe"] for x in r], [x[key] for x in r], [x[key + "_ci"] for x in r], marker="s", capsize=3,
                   label="rejection: best of k unguided")  # fmt: skip
        a.set_xscale("log")
        a.set_xlabel("network evaluations per sample (guided: + a backward pass each)")
        a.set_title(t)
        a.legend(fontsize=8)
    fig.suptitle("Attribute control (label: window contains '?'), 95% t-intervals over sampling seeds")
    fig.tight_layout()
    fig.savefig(out / "attribute.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.errorbar([x["genppl"] for x in g], [x["judge"] for x in g], [x["judge_ci"] for x in g],
                [x["genppl_ci"] for x in g], marker="o", capsize=3, label="guidance, by w")  # fmt: skip
    for x in g:
        ax.annotate(f"w={x['scale']}", (x["genppl"], x["judge"]), fontsize=8)
    ax.errorbar([x["genppl"] for x in r], [x["judge"] for x in r], [x["judge_ci"] for x in r],
                [x["genppl_ci"] for x in r], marker="s", capsize=3, label="rejection, by k")  # fmt: skip
    for x in r:
        ax.annotate(f"k={x['k']}", (x["genppl"], x["judge"]), fontsize=8)
    ax.set_xlabel("GenPPL (bigram judge)")
    ax.set_ylabel("judge: fraction 'question'")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "attribute_tradeoff.png", dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--out", default="docs/results/control")
    p.add_argument("--corpus", default="../shared/data/tinyshakespeare")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--num", type=int, default=32)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--scales", type=float, nargs="+", default=[0.0, 1.0, 3.0, 10.0, 30.0])
    p.add_argument("--strengths", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    p.add_argument("--edit-sources", type=int, default=8)
    p.add_argument("--clf-steps", type=int, default=400)
    p.add_argument("--reject-k", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--only", nargs="+", default=["lexical", "editing", "attribute"])
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resf = out / "results.json"
    res = json.loads(resf.read_text()) if resf.is_file() else {}
    if not args.plot_only:
        run = load_run(args.run, use_ema=True, train_data=False, device="cpu")
        L = run.cfg.data.seq_len
        corpus = Path(args.corpus)
        train_w = windows(run.tokenizer, corpus / "train.jsonl", L)
        valid_w = windows(run.tokenizer, corpus / "valid.jsonl", L)
        bigram = Bigram(train_w, run.model.embedding_matrix().shape[0])
        res["setup"] = dict(vars(args), run_step=run.step, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        if "lexical" in args.only:
            res["lexical"] = lexical(run, bigram, args)
        if "editing" in args.only:
            res["editing"] = editing(run, bigram, valid_w[: args.edit_sources], args)
        if "attribute" in args.only:
            res["attribute"] = attribute(run, bigram, train_w, valid_w, args, out)
        resf.write_text(json.dumps(res, indent=1) + "\n")
    plots(res, out)


if __name__ == "__main__":
    main()
