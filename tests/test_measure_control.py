"""scripts/measure_control.py (issue 26) end to end at debug size: the attribute measurement with a
labelled corpus (the corpus of origin in the real one): the latent classifier trained by ``replaid
classifier train``, the independent judge and its held-out accuracy, guidance across scales, best of k
at counted cost, and the figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

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
