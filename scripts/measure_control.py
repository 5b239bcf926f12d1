"""Measures the three controls of issue 26 on a trained RePlaid run (docs/results/control/).

    python scripts/measure_control.py RUN --out docs/results/control [--seeds 3 --num 16 --steps 32]
    python scripts/measure_control.py /work/runs-ctl/mix-replaid --corpus /work/data-mix --only attribute \
        --out docs/results/control/attribute   # the corpus-of-origin label (4-corpus mixture run)

* lexical constraints: ``--require`` word sets of 1-3 words, success rate (all words present), GenPPL and
  unigram entropy against the guidance scale (scale 0 = the unguided base rate);
* editing: SDEdit of held-out windows against strength: token edit distance to the source, GenPPL, and how
  many tokens outside ``--token-span`` changed (must be 0);
* attribute control (``--corpus`` lines ``{"text", "label"}``; /work/data-mix: label = corpus of origin,
  shakespeare | python | linux | wiki): (a) the latent classifier, trained by ``replaid classifier train
  RUN --data CORPUS/train.jsonl --out CLF`` (reused when CLF holds one for this run); (b) an independent
  judge, scikit-learn TF-IDF (character 1-3-grams) + logistic regression trained on decoded clean
  ``seq_len``-token windows of the training split, its accuracy reported on the ``--judge-split`` windows,
  never used for guidance or ranking; (c) for each ``--targets`` label and ``--attr-scales`` w: the
  fraction of samples the judge calls the target, GenPPL and unigram entropy, 95% t-intervals over
  ``--seeds`` sampling seeds; (d) the baseline: best of k unguided samples ranked by the same latent
  classifier's ``log p(label | z_0)`` at the cleanest level (``z_0 = alpha_0 e(x) + sigma_0 eps``, 8 noise
  draws averaged). Cost: one NFE = one denoiser forward pass; a guided call (w > 0) adds one backward pass
  through the denoiser and the classifier; best of k costs k x the unguided NFE; the measured wall seconds
  per sample are recorded for both (compare there, or at NFE with a backward counted ~2 forwards);
  (e) ``attribute.png``: judge fraction against GenPPL, entropy and seconds per sample, guidance by w and
  best-of-k by k.

GenPPL here is under an add-0.1 smoothed *bigram* model of the corpus's training split in the run's
tokenizer (no AR judge run exists at this size); intervals are over sampling seeds (t, 95%).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from replaid.diffusion.denoiser import alpha_sigma
from replaid.eval.seeds import t_interval
from replaid.sampling.generate import generate
from replaid.sampling.request import SampleRequest
from replaid.store.loading import load_run


def ci(xs) -> tuple[float, float]:
    """Mean and 95% Student-t half-width ``t(0.975, n - 1) sd / sqrt(n)`` over seeds (NaN for one seed)."""
    iv = t_interval(xs)
    return iv.mean, (iv.hi - iv.mean if iv.n >= 2 else float("nan"))


class Bigram:
    """Add-k bigram LM over token ids: GenPPL = exp(mean NLL of every token after the first)."""

    def __init__(self, docs: list[list[int]], V: int, k: float = 0.1):
        c = np.zeros((V, V), dtype=np.float64)
        for d in docs:
            a = np.asarray(d)
            np.add.at(c, (a[:-1], a[1:]), 1.0)
        self.logp = np.log((c + k) / (c + k).sum(1, keepdims=True))

    def ppl(self, samples: list[list[int]]) -> float:
        nll = [-self.logp[a, b] for s in samples for a, b in zip(s[:-1], s[1:], strict=False)]
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


def labelled_windows(tok, path: Path, L: int) -> tuple[list[list[int]], list[str]]:
    """Non-overlapping L-token windows of every document of a ``{"text", "label"}`` JSONL file, each with
    its document's label (the corpus of origin in /work/data-mix)."""
    ws, ys = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if "label" not in d:
            raise SystemExit(f"{path} line {n}: no 'label'; the attribute measurement needs labelled lines")
        ids = tok.encode(d["text"])
        for o in range(0, len(ids) - L + 1, L):
            ws.append(ids[o : o + L])
            ys.append(str(d["label"]))
    return ws, ys


def chunked(src: Path, dst: Path, n: int) -> Path:
    """``src``'s documents cut into ``n``-character pieces (a last piece under n/2 dropped), labels kept:
    ``replaid classifier train`` draws a document, then a window, so equal-length pieces make each label
    as frequent in its batches as in the corpus's windows (long-document corpora are otherwise rare)."""
    with dst.open("w") as f:
        for line in src.read_text().splitlines():
            if not line.strip():
                continue
            d = json.loads(line)
            for o in range(0, len(d["text"]), n):
                piece = d["text"][o : o + n]
                if len(piece) >= n // 2:
                    f.write(json.dumps({"text": piece, "label": d["label"]}) + "\n")
    return dst


def latent_classifier(run, args, corpus: Path):
    """(a) The latent classifier, trained by ``replaid classifier train RUN --data CORPUS/train.jsonl --out
    CLF`` (the CLI itself) unless CLF already holds one for this run; returns (folder, classifier, its metrics)."""
    from replaid.cli import main as cli
    from replaid.store.loading import run_dir_of
    from replaid.training.classifier import load_classifier

    name = "label" if not args.clf_chunk_chars else f"label-chunk{args.clf_chunk_chars}"
    clf_dir = Path(args.classifier) if args.classifier else Path(run_dir_of(Path(run.ckpt))) / "classifiers" / name
    if not (clf_dir / "classifier.json").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            data = corpus / "train.jsonl"
            if args.clf_chunk_chars:
                data = chunked(data, Path(tmp) / "train-chunked.jsonl", args.clf_chunk_chars)
            argv = ["classifier", "train", args.run, "--data", str(data), "--out", str(clf_dir)]
            argv += ["--steps", str(args.clf_steps)]
            print("training the latent classifier: replaid " + " ".join(argv), flush=True)
            if cli(argv) != 0:
                raise SystemExit("replaid classifier train failed")
    clf = load_classifier(clf_dir, run)  # refuses a classifier of another run
    return clf_dir, clf, json.loads((clf_dir / "classifier.json").read_text()).get("metrics", {})


def clean_scores(run, clf, ids: list[list[int]], draws: int = 8) -> np.ndarray:
    """(N, C) ``log p(label | z_0)`` of the latent classifier on samples, at the cleanest level gamma(0):
    ``z_0 = alpha_0 e(x) + sigma_0 eps`` (what it was trained on there), averaged over ``draws`` noises
    (fixed generator). This is the "x0-ish" score best-of-k ranks by."""
    E = run.model.embedding_matrix().detach().float()
    with torch.no_grad():
        g = run.model.schedule(torch.zeros(1, dtype=torch.float64))
        g0 = (g[0] if isinstance(g, (tuple, list)) else g).double().reshape(1)
        a, sg = (float(v) for v in alpha_sigma(g0))
        gen = torch.Generator().manual_seed(0)
        out = []
        for i in range(0, len(ids), 64):
            x = torch.tensor(ids[i : i + 64])
            e = E[x.to(E.device)]
            lp = 0.0
            for _ in range(draws):
                eps = torch.randn(e.shape, generator=gen).to(E.device)
                lp = lp + torch.log_softmax(clf(a * e + sg * eps, g0.expand(len(x))).float(), -1)
            out.append((lp / draws).cpu().numpy())
    return np.concatenate(out)


def fit_judge(texts: list[str], labels: list[str]):
    """(b) The judge: TF-IDF (character 1-3-grams, sublinear tf) + logistic regression (C = 4) fitted on
    ``texts``; ``predict(texts)`` gives their labels, ``classes_`` the labels it knows."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 3), min_df=2, sublinear_tf=True)
    return make_pipeline(vec, LogisticRegression(max_iter=2000, C=4.0)).fit(texts, labels)


def attribute(run, bigram, args, out: Path) -> dict:
    """Attribute control with the corpus-of-origin label (module docstring): (a) latent classifier, (b) an
    independent judge, (c) guidance across scales, (d) best-of-k by the latent classifier at equal cost."""
    tok, L = run.tokenizer, run.cfg.data.seq_len
    corpus = Path(args.corpus)
    clf_dir, clf, clf_metrics = latent_classifier(run, args, corpus)
    print("latent classifier", clf_dir, json.dumps(clf_metrics), flush=True)

    # (b) the judge: TF-IDF + logistic regression on decoded clean L-token windows of the training split,
    # accuracy on the held-out split's windows; never used for guidance or ranking
    tr_w, tr_y = labelled_windows(tok, corpus / "train.jsonl", L)
    te_w, te_y = labelled_windows(tok, corpus / f"{args.judge_split}.jsonl", L)
    judge = fit_judge([tok.decode(w) for w in tr_w], tr_y)
    pred = judge.predict([tok.decode(w) for w in te_w])
    te = np.asarray(te_y)
    judge_acc = float((pred == te).mean())
    judge_per = {c: float((pred[te == c] == c).mean()) for c in sorted(set(te_y))}
    # the latent classifier on the same held-out windows at the cleanest level (how well best-of-k can rank)
    lat = np.asarray(clf.labels)[clean_scores(run, clf, te_w).argmax(1)]
    lat_acc = float((lat == te).mean())
    lat_recall = {c: float((lat[te == c] == c).mean()) for c in sorted(set(te_y))}
    print(
        f"judge {args.judge_split} accuracy {judge_acc:.3f} {judge_per}; latent classifier at t=0 {lat_acc:.3f} {lat_recall}"
    )

    def stats(texts: list[str], ids: list[list[int]], target: str, seconds: float) -> dict:
        """The judge's fraction of ``target``, GenPPL, unigram entropy and seconds per sample of a sample set."""
        j = float((judge.predict(texts) == target).mean())
        return dict(judge=j, genppl=bigram.ppl(ids), entropy=entropy(ids), seconds=seconds)

    for target in args.targets:
        if target not in clf.labels or target not in judge.classes_:
            raise SystemExit(f"--targets {target!r}: not a label of the data ({', '.join(clf.labels)})")

    # (c) classifier guidance across scales (w = 0: the unguided sample, the base rate)
    guided: list[dict] = []
    for target in args.targets:
        for w in args.attr_scales:
            per_seed = []
            for seed in range(args.seeds):
                req = SampleRequest(
                    steps=args.steps, num=args.num, batch_size=args.num, seed=seed, progress=False,
                    guide=f"{clf_dir}:{target}", guidance_scale=w,
                )  # fmt: skip
                t0 = time.time()
                res = generate(run, req)
                secs = time.time() - t0
                per_seed.append(stats([r["text"] for r in res], [r["ids"] for r in res], target, secs / len(res)))
            nfe = int(res[0]["nfe"])
            row = {"target": target, "scale": w, "nfe": nfe, "backward": nfe if w > 0 else 0}
            for k in ("judge", "genppl", "entropy", "seconds"):
                row[k], row[k + "_ci"] = ci([p[k] for p in per_seed])
            guided.append(row)
            print(json.dumps(row), flush=True)

    # (d) best of k unguided samples ranked by the same latent classifier's clean score; one pool of
    # num x K unguided samples per seed (seeds 1000+), shared by the targets; k samples cost k x NFE
    K = max(args.reject_k)
    pools = []
    for seed in range(args.seeds):
        t0 = time.time()
        pool = generate(
            run, SampleRequest(steps=args.steps, num=args.num * K, batch_size=args.num, seed=1000 + seed,
                               progress=False)
        )  # fmt: skip
        secs = (time.time() - t0) / len(pool)
        pools.append((pool, clean_scores(run, clf, [r["ids"] for r in pool]), secs))
    rejection: list[dict] = []
    for target in args.targets:
        j = clf.labels.index(target)
        for k in args.reject_k:
            per_seed = []
            for pool, scores, secs in pools:
                chosen = []
                for i in range(args.num):
                    group = range(i * K, i * K + k)
                    chosen.append(pool[max(group, key=lambda n: scores[n, j])])
                per_seed.append(stats([c["text"] for c in chosen], [c["ids"] for c in chosen], target, k * secs))
            row = {"target": target, "k": k, "nfe": k * int(pools[0][0][0]["nfe"]), "backward": 0}
            for key in ("judge", "genppl", "entropy", "seconds"):
                row[key], row[key + "_ci"] = ci([p[key] for p in per_seed])
            rejection.append(row)
            print(json.dumps(row), flush=True)
    base = {c: float(np.mean([y == c for y in te_y])) for c in sorted(set(te_y))}
    return {
        "label": "corpus of origin",
        "targets": list(args.targets),
        "classifier": str(clf_dir),
        "classifier_chunk_chars": args.clf_chunk_chars,
        "latent_classifier": clf_metrics,
        "latent_classifier_test_accuracy_t0": lat_acc,
        "latent_classifier_test_recall_t0": lat_recall,
        "judge": "TF-IDF (character 1-3-grams, sublinear tf) + logistic regression (C = 4) on decoded "
        f"{L}-token windows of the training split",
        "judge_split": args.judge_split,
        "judge_accuracy": judge_acc,
        "judge_accuracy_per_label": judge_per,
        "judge_windows": {"train": len(tr_w), args.judge_split: len(te_w)},
        "label_share_held_out": base,
        "nfe_counting": "one network evaluation (NFE) = one forward pass of the denoiser; a guided call "
        "(w > 0) adds one backward pass through the denoiser and the classifier ('backward'); best of k "
        "costs k x the unguided NFE plus k classifier forwards per draw; 'seconds' is measured wall time "
        "per returned sample (best of k: k x the pool's time per sample)",
        "guided": guided,
        "rejection": rejection,
    }


def plots(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "lexical" in res:
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
        for a, t in zip(
            ax, ("success rate (all words present)", "GenPPL (bigram judge)", "unigram entropy (nats)"), strict=False
        ):
            a.set_xlabel("guidance scale w (0 = unguided base rate)")
            a.set_title(t)
            a.set_xscale("symlog", linthresh=1)
            a.legend()
        fig.suptitle("Token guidance (--require), 95% t-intervals over sampling seeds")
        fig.tight_layout()
        fig.savefig(out / "lexical.png", dpi=110)
        plt.close(fig)

    if "editing" in res:
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

    if "attribute" in res:
        attribute_plot(res["attribute"], out)


def attribute_plot(at: dict, out: Path) -> None:
    """(e) per target: judge accuracy against GenPPL, unigram entropy and seconds per sample, for guidance
    across scales (annotated w) and best-of-k across k (annotated k); 95% t-intervals over seeds."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    targets = at["targets"]
    fig, axes = plt.subplots(len(targets), 3, figsize=(15, 4.2 * len(targets)), squeeze=False)
    for ax_row, target in zip(axes, targets, strict=False):
        g = [x for x in at["guided"] if x["target"] == target]
        r = [x for x in at["rejection"] if x["target"] == target]
        for a, key, name in zip(ax_row, ("genppl", "entropy", "seconds"),
                                ("GenPPL (bigram judge)", "unigram entropy (nats)", "seconds per sample (wall)"), strict=False):  # fmt: skip
            for rows, mark, lab, tag in ((g, "o", "classifier guidance, by w", "scale"),
                                         (r, "s", "best of k unguided, by k", "k")):  # fmt: skip
                a.errorbar([x[key] for x in rows], [x["judge"] for x in rows], [x["judge_ci"] for x in rows],
                           [x[key + "_ci"] for x in rows], marker=mark, capsize=3, label=lab)  # fmt: skip
                for x in rows:
                    a.annotate(f"{'w' if tag == 'scale' else 'k'}={x[tag]:g}", (x[key], x["judge"]), fontsize=7)
            a.set_xlabel(name)
            a.set_ylim(-0.03, 1.03)  # a fraction (the t-intervals of few seeds can reach past it)
            a.set_ylabel(f"judge: fraction '{target}'")
            a.legend(fontsize=8)
        ax_row[2].set_xscale("log", base=2)
        ax_row[2].xaxis.set_major_formatter(ScalarFormatter())
        ax_row[2].xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(
        f"Attribute control, label = corpus of origin (judge {at['judge_split']} accuracy "
        f"{at['judge_accuracy']:.3f}); 95% t-intervals over sampling seeds"
    )
    fig.tight_layout()
    fig.savefig(out / "attribute.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--out", default="docs/results/control")
    p.add_argument("--corpus", default="../shared/data/tinyshakespeare", help="folder of train/valid(/test).jsonl")
    p.add_argument("--seeds", type=int, default=3, help="sampling seeds (the intervals are over them)")
    p.add_argument("--num", type=int, default=16, help="samples per seed and setting")
    p.add_argument("--steps", type=int, default=32, help="sampler steps T (DDPM)")
    p.add_argument("--scales", type=float, nargs="+", default=[0.0, 1.0, 3.0, 10.0, 30.0])
    p.add_argument("--strengths", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    p.add_argument("--edit-sources", type=int, default=8)
    p.add_argument("--clf-steps", type=int, default=400, help="replaid classifier train --steps")
    p.add_argument("--reject-k", type=int, nargs="+", default=[1, 2, 4, 8], help="best of k: the k")
    p.add_argument("--attr-scales", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0, 8.0])
    p.add_argument("--targets", nargs="+", default=["python", "shakespeare"], help="labels to steer towards")
    p.add_argument(
        "--classifier", default=None, help="latent classifier folder (default RUN/classifiers/label; trained if absent)"
    )
    p.add_argument("--judge-split", default="test", help="the corpus split the judge is evaluated on")
    p.add_argument(
        "--clf-chunk-chars",
        type=int,
        default=0,
        help="train the latent classifier on the documents cut into pieces of this many characters (0: as they are)",
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--only", nargs="+", default=["lexical", "editing", "attribute"])
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resf = out / "results.json"
    res = json.loads(resf.read_text()) if resf.is_file() else {}
    if not args.plot_only:
        run = load_run(args.run, use_ema=True, train_data=False, device=args.device)
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
            res["attribute"] = attribute(run, bigram, args, out)
            res["attribute"]["setup"] = res["setup"]
        resf.write_text(json.dumps(res, indent=1) + "\n")
    plots(res, out)


if __name__ == "__main__":
    main()
