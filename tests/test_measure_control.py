"""scripts/measure_control.py (issue 26) end to end at debug size: the attribute measurement with a
labelled corpus (the corpus of origin in the real one): the latent classifier trained by ``replaid
classifier train``, the independent judge and its held-out accuracy, guidance across scales, best of k
at counted cost, and the figure; the 95% t-interval against scipy in float64; with a judge whose verdicts
are known, each row's judge fraction and interval."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from replaid.cli import main

pytest.importorskip("sklearn", reason="the measurement's judge needs scikit-learn")

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("measure_control", REPO / "scripts" / "measure_control.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _corpus(root: Path) -> Path:
    """Two 'corpora' whose windows a character-n-gram judge tells apart."""
    a = "def f(x):\n    return x + 1\n\nimport os\nprint(os.path.join('a', 'b'))\n"
    b = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nAy me!\n\n"
    root.mkdir()
    for split, n in (("train", 12), ("valid", 2), ("test", 4)):
        lines = [{"text": (a if i % 2 else b) * 12, "label": "python" if i % 2 else "shakespeare"} for i in range(n)]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    return root


def test_attribute_measurement_runs_end_to_end(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2", "train.num_threads=1"]
    assert main(argv + ["eval.max_batches=1"]) == 0
    corpus = _corpus(tmp_path / "mix")
    out = tmp_path / "out"
    args = [str(run), "--corpus", str(corpus), "--only", "attribute", "--out", str(out), "--seeds", "2"]
    args += ["--num", "2", "--steps", "2", "--attr-scales", "0", "2", "--reject-k", "1", "2", "--clf-steps", "2"]
    _script().main(args)
    at = json.loads((out / "results.json").read_text())["attribute"]
    assert (run / "classifiers" / "label" / "classifier.json").is_file()  # replaid classifier train wrote it
    assert at["targets"] == ["python", "shakespeare"] and 0.0 <= at["judge_accuracy"] <= 1.0
    assert set(at["judge_accuracy_per_label"]) == {"python", "shakespeare"} and at["judge_split"] == "test"
    assert set(at["latent_classifier_test_recall_t0"]) == {"python", "shakespeare"}
    assert at["judge_accuracy"] >= 0.9  # the two toy corpora are easy to tell apart on clean windows
    g, r = at["guided"], at["rejection"]
    assert [(x["target"], x["scale"]) for x in g] == [(t, w) for t in at["targets"] for w in (0.0, 2.0)]
    assert [(x["target"], x["k"]) for x in r] == [(t, k) for t in at["targets"] for k in (1, 2)]
    for x in g + r:
        assert 0.0 <= x["judge"] <= 1.0 and x["genppl"] > 0 and x["entropy"] > 0 and x["seconds"] > 0
    nfe = g[0]["nfe"]
    assert nfe == 3 and g[0]["backward"] == 0 and g[1]["backward"] == nfe  # T + 1 calls; w > 0 adds backwards
    assert [x["nfe"] for x in r[:2]] == [nfe, 2 * nfe]  # best of k costs k unguided samples
    assert (out / "attribute.png").stat().st_size > 10_000
    # a second run reuses the classifier (no retraining) and keeps the other sections' results
    _script().main(args + ["--plot-only"])
    assert json.loads((out / "results.json").read_text())["attribute"] == at


def test_chunked_training_data_balances_documents(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text(
        json.dumps({"text": "a" * 2500, "label": "x"}) + "\n" + json.dumps({"text": "b" * 900, "label": "y"})
    )
    rows = [json.loads(x) for x in _script().chunked(src, tmp_path / "c.jsonl", 1000).read_text().splitlines()]
    assert [(len(r["text"]), r["label"]) for r in rows] == [(1000, "x"), (1000, "x"), (500, "x"), (900, "y")]


def t_half(xs) -> float:
    """95% Student-t half-width of the mean of ``xs``, in float64 (scipy's t quantile)."""
    a = np.asarray(xs, dtype=np.float64)
    return float(stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))


def test_interval_is_the_95_t_interval_over_seeds():
    """``ci``: the mean and ``t(0.975, n - 1) sd / sqrt(n)`` of the page ("95% t-intervals over seeds")."""
    ci = _script().ci
    rng = np.random.default_rng(0)
    for n in range(2, 11):
        xs = rng.normal(0.4, 0.2, size=n)
        mean, half = ci(list(xs))
        assert mean == pytest.approx(float(xs.mean()), abs=1e-12)
        assert half == pytest.approx(t_half(xs), rel=1e-9), n
    assert ci([0.5, 0.5, 0.5]) == (0.5, 0.0) and math.isnan(ci([0.3])[1])


PY, SH = "aaaaaaab", "bbbbbbba"  # a sample the judge calls python, one it calls shakespeare
LIKE = {"python": PY, "shakespeare": SH}


def test_guidance_moves_a_known_judge_and_rows_hold_its_t_intervals(tmp_path, monkeypatch):
    """``attribute`` with a judge whose verdict is known (python iff more 'a' than 'b') and samples whose
    verdicts are set by (target, w, seed): each guided row's ``judge`` is the mean over seeds of the fraction
    the judge calls the target, its ``judge_ci`` the float64 t half-width of those fractions; best of k ranks
    by the latent classifier (here: the count of the target's letter)."""
    mc = _script()
    num, seeds, scales = 8, 3, (0.0, 2.0)

    class Tok:
        def encode(self, text):
            return ["abcd".index(c) for c in text]

        def decode(self, ids):
            return "".join("abcd"[i] for i in ids)

    class Judge:
        classes_ = np.array(["python", "shakespeare"])

        def predict(self, texts):
            return np.array(["python" if t.count("a") > t.count("b") else "shakespeare" for t in texts])

    def hits(target: str, w: float, seed: int) -> int:
        """How many of the num samples guidance towards ``target`` at scale w and ``seed`` makes target-like."""
        return min(num, int(2 * w) + seed + (target == "python"))

    tok = Tok()

    def fake_generate(run, req):
        if req.guide:  # guided towards the target: hits(...) target-like samples, the rest the other label's
            target = req.guide.rsplit(":", 1)[1]
            other = SH if target == "python" else PY
            k = hits(target, req.guidance_scale, req.seed)
            texts = [LIKE[target]] * k + [other] * (req.num - k)
        else:  # a best-of-k pool: python-like and shakespeare-like in turn
            texts = [PY if i % 2 == 0 else SH for i in range(req.num)]
        return [{"text": t, "ids": tok.encode(t), "nfe": req.steps + 1} for t in texts]

    def fake_clean_scores(run, clf, ids):  # (N, 2): the latent classifier's score of python, shakespeare
        return np.array([[i.count(0), i.count(1)] for i in ids], dtype=np.float64)

    clf = SimpleNamespace(labels=["python", "shakespeare"])
    monkeypatch.setattr(mc, "generate", fake_generate)
    monkeypatch.setattr(mc, "fit_judge", lambda texts, labels: Judge())
    monkeypatch.setattr(mc, "clean_scores", fake_clean_scores)
    monkeypatch.setattr(mc, "latent_classifier", lambda run, args, corpus: (tmp_path / "clf", clf, {}))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "test"):
        docs = [{"text": PY * 3, "label": "python"}, {"text": SH * 3, "label": "shakespeare"}]
        (corpus / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    run = SimpleNamespace(tokenizer=tok, cfg=SimpleNamespace(data=SimpleNamespace(seq_len=8)))
    args = SimpleNamespace(
        corpus=str(corpus), judge_split="test", targets=["python", "shakespeare"], attr_scales=list(scales),
        seeds=seeds, steps=4, num=num, reject_k=[1, 2], clf_chunk_chars=0,
    )  # fmt: skip
    bigram = mc.Bigram([tok.encode(PY + SH)], 4)
    at = mc.attribute(run, bigram, args, tmp_path)
    assert at["judge_accuracy"] == 1.0 and at["latent_classifier_test_accuracy_t0"] == 1.0
    for row in at["guided"]:
        fracs = [hits(row["target"], row["scale"], s) / num for s in range(seeds)]
        assert row["judge"] == pytest.approx(float(np.mean(fracs)), abs=1e-12), row
        assert row["judge_ci"] == pytest.approx(t_half(fracs), rel=1e-9), row
        assert row["nfe"] == 5 and row["backward"] == (5 if row["scale"] > 0 else 0)
    by = {(r["target"], r["scale"]): r["judge"] for r in at["guided"]}
    assert all(by[t, 2.0] - by[t, 0.0] == pytest.approx(0.5) for t in args.targets)  # guidance moved the judge
    best = {(r["target"], r["k"]): (r["judge"], r["judge_ci"], r["nfe"]) for r in at["rejection"]}
    assert best == {("python", 1): (1.0, 0.0, 5), ("python", 2): (1.0, 0.0, 10), ("shakespeare", 1): (0.0, 0.0, 5),
                    ("shakespeare", 2): (1.0, 0.0, 10)}  # fmt: skip
