"""scripts/demo_report.py (issue 37 §5): the held-out passage, unigram samples of the same tokens, the
NELBO's pieces and one PNG that the demo prints beside its samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from replaid.cli import main
from replaid.presets import get_preset

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


def test_measure_places_the_samples_between_unigram_and_held_out(run, tmp_path, capsys):
    judge = tmp_path / "judge"
    assert (
        main(["train", "--preset", "debug", "--method", "ar", "--out", str(judge), "--no-progress", "train.steps=10"])
        == 0
    )
    m = demo_report.measure(run, judge, num=4, steps=4, temperatures=(1.0, 0.5), seed=0, common_judge_run=judge)
    assert list(m["rows"]) == ["held-out", "unigram", "samples tau=1", "samples tau=0.5"]
    L = m["seq_len"]
    for name, r in m["rows"].items():
        assert r["gen_ppl"] == pytest.approx(np.exp(r["gen_nats_per_token"])) and r["gen_ppl"] > 1, name
        assert r["judge_tokens"] > 0 and r["chars"] > 0 and r["entropy"] > 0 and len(r["examples"]) == 3, name
        bits = r["gen_nats_per_token"] * r["judge_tokens"] / r["chars"] / np.log(2)
        assert r["gen_bits_per_char"] == pytest.approx(bits), name
        assert r["common_judge"]["gen_bits_per_char"] == pytest.approx(bits), name  # the same judge twice
    assert m["rows"]["unigram"]["gap_closed"] == pytest.approx(0.0, abs=1e-12)
    assert m["rows"]["held-out"]["gap_closed"] == pytest.approx(1.0)
    per_char = demo_report.gap_closed_per_char(m)
    assert per_char["unigram"] == pytest.approx(0.0, abs=1e-12) and per_char["held-out"] == pytest.approx(1.0)
    u, h, s = (m["rows"][k]["gen_bits_per_char"] for k in ("unigram", "held-out", "samples tau=1"))
    assert per_char["samples tau=1"] == pytest.approx((u - s) / (u - h))
    assert m["num"] == 4 and m["steps"] == 4 and L == 32
    demo_report.print_measure(m)
    out = capsys.readouterr().out
    assert "gap closed" in out and all(name in out for name in m["rows"]) and f"bits/char under {judge}" in out
    saved = tmp_path / "m.json"
    saved.write_text(json.dumps(m))
    assert demo_report.main([str(run), "--no-report", "--measured", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"measured once, offline ({saved})" in out and "samples tau=0.5" in out


def test_a_missing_measurement_is_one_line_and_status_2(run, tmp_path, capsys):
    missing = tmp_path / "none.json"
    assert demo_report.main([str(run), "--measured", str(missing)]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("replaid: error: ") and cap.err.count("\n") == 1 and str(missing) in cap.err
    assert cap.out == ""  # refused before any work


def test_the_demo_prints_the_committed_measurement_of_its_preset():
    sh = (REPO / "scripts" / "demo.sh").read_text()
    saved = REPO / "docs" / "results" / "demo" / "first-run" / "measure.json"
    assert "--preset first-run" in sh and f"--measured {saved.relative_to(REPO)}" in sh
    m = json.loads(saved.read_text())
    assert m["config"]["steps"] == get_preset("first-run").train.steps  # measured on the preset as shipped
    assert m["config"]["bpe_vocab_size"] == get_preset("first-run").data.bpe_vocab_size


def test_the_demo_runs_the_report():
    assert 'scripts/demo_report.py "$OUT"' in (REPO / "scripts" / "demo.sh").read_text()
