"""scripts/demo_report.py (issue 37 §5): the held-out passage, unigram samples of the same tokens, the
NELBO's pieces and one PNG that the demo prints beside its samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from replaid.cli import main

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("demo_report", REPO / "scripts" / "demo_report.py")
demo_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_report)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    assert main(["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.steps=10"]) == 0
    return out


def test_report_prints_the_passage_unigram_samples_pieces_and_png(run, capsys):
    from replaid.hub import from_pretrained

    got = demo_report.report(run, num=2, seed=0, grid=5)
    out = capsys.readouterr().out
    r = from_pretrained(run, device="cpu")
    final = json.loads((run / "final_eval.json").read_text())["eval"]
    first = r.data.dataset(final["split"]).get_batch([0])["tokens"][0].tolist()  # the split's first sequence
    assert got["passage"] == r.tokenizer.decode(first) and repr(got["passage"]) in out
    assert len(got["unigram"]) == 2 and all(repr(u) in out for u in got["unigram"])
    assert sum(got["pieces"].values()) == pytest.approx(final["nelbo_nats_per_token"], rel=1e-9)
    assert f"{final['nelbo_nats_per_token']:.3f}" in out and str(got["png"]) in out
    assert got["png"] == run / "demo.png" and got["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unigram_samples_follow_the_runs_unigram_model(run):
    from replaid.hub import from_pretrained

    data = from_pretrained(run, device="cpu").data
    p = np.exp(data.unigram_logp())
    seqs = demo_report.unigram_samples(data, 200, 32, seed=1)
    assert len(seqs) == 200 and all(len(s) == 32 for s in seqs)
    freq = np.bincount(np.concatenate(seqs), minlength=len(p)) / (200 * 32)
    top = np.argsort(p)[-20:]  # the frequent tokens: sampled at their unigram rate (6400 draws)
    assert np.abs(freq[top] - p[top]).max() < 0.02, (freq[top], p[top])
    assert demo_report.unigram_samples(data, 3, 8, seed=1) == demo_report.unigram_samples(data, 3, 8, seed=1)


def test_the_demo_runs_the_report():
    assert 'scripts/demo_report.py "$OUT"' in (REPO / "scripts" / "demo.sh").read_text()
