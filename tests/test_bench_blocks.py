"""benchmarks/bench_blocks.py (issue 39 §4): its quick sweep at debug size has every configuration, with
tokens/s and memory > 0 and the NFE matched as it states; planted bugs are caught by its checks."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_blocks.py"


@pytest.fixture(scope="module")
def bb():
    spec = importlib.util.spec_from_file_location("bench_blocks", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("bench_blocks", None)


@pytest.fixture(scope="module")
def quick(bb, tmp_path_factory):
    """The quick sweep in this process: (the module, its JSON)."""
    out = tmp_path_factory.mktemp("bb")
    torch.set_num_threads(1)
    assert bb.main(["--quick", "--in-process", "--out", str(out)]) == 0
    assert (out / "bench_blocks.md").read_text().count("\n| ") >= 2
    return json.loads((out / "bench_blocks.json").read_text())


def test_quick_sweep_rows(bb, quick):
    meta, rows = quick["meta"], quick["rows"]
    assert quick["problems"] == [] and bb.check_rows(rows, meta) == []
    L, P = meta["seq_len"], meta["prompt"]
    want = bb.expected_keys(meta)  # AR + (blocks, full) per method, b, T; for each batch and length
    assert sorted(map(str, (bb.row_key(r) for r in rows))) == sorted(map(str, want))
    assert len(want) == len(meta["batches"]) * len(meta["lengths"]) * (1 + 2 * 2 * 2 * len(meta["steps"]))
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["peak_mem_bytes"] >= 0 and r["tokens"] == r["length_x"] * L - P
        assert r["window"] == (None if r["length_x"] == 1 or r["family"] == "full" else L - (r["block"] or 1))
    for r in (r for r in rows if r["family"] == "full"):  # T_full = T x seq_len / b: T / b steps per position
        b, T = r["matched_block"], r["matched_steps"]
        assert r["steps"] == T * L // b and r["steps_per_position"] == T / b
        blk = next(x for x in rows if bb.row_key(x) == ("blocks", r["method"], b, T, r["batch"], r["length_x"]))
        assert blk["steps_per_position"] == r["steps_per_position"]
    assert "T_full = T x seq_len / b" in meta["nfe_matching"] and meta["mem_kind"]


def test_isolated_configuration_has_memory(bb, quick):
    """One configuration in its fresh subprocess (the default): memory > 0, the same NFE as in process."""
    meta = quick["meta"]
    a = bb.argparse.Namespace(
        preset="debug", run=None, device="cpu", vocab=None, prompt=meta["prompt"], threads=1, no_autocast=False,
        sampler=None, batches=[2], lengths=[2], methods=["replaid"], block_sizes=[4], steps=meta["steps"], seq_len=meta["seq_len"],
    )  # fmt: skip
    spec = next(s for s in bb.plan(a) if s["family"] == "blocks")
    (row,) = bb.measure([spec], in_process=False)
    assert "error" not in row, row
    assert row["peak_mem_bytes"] > 0 and row["tokens_per_s"] > 0
    same = next(r for r in quick["rows"] if bb.row_key(r) == bb.row_key(row))
    assert row["nfe"] == same["nfe"]


def test_planted_bugs_are_caught(bb, quick, tmp_path, monkeypatch):
    meta, rows = quick["meta"], quick["rows"]
    assert any("missing" in m for m in bb.check_rows(rows[1:], meta))  # a configuration dropped
    slow = [dict(r, tokens_per_s=0.0) if i == 3 else r for i, r in enumerate(rows)]
    assert any("tokens_per_s" in m for m in bb.check_rows(slow, meta))
    # a wrong NFE matching: half the steps the stated rule asks for
    monkeypatch.setattr(bb, "matched_full_steps", lambda T, b, L: T * L // b // 2)
    args = ["--quick", "--in-process", "--batches", "1", "--lengths", "1", "--methods", "replaid", "--block-sizes", "4"]
    assert bb.main([*args, "--out", str(tmp_path)]) == 1
    problems = json.loads((tmp_path / "bench_blocks.json").read_text())["problems"]
    assert any("NFE not matched" in m for m in problems), problems


def test_ar_loop_draws_sample_ar_tokens(bb):
    """The benchmark times AR on the one block loop, which draws sample_ar's tokens with its calls when nothing is cut."""
    from replaid.sampling.discrete import sample_ar

    method, model, L, V = bb.build({"preset": "debug", "method": "ar"}, "ar", torch.device("cpu"))
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(3))
    x = torch.cat([prompt, torch.zeros(2, L - 5, dtype=torch.long)], dim=1)
    ref = sample_ar(model, x, torch.arange(5, L + 1), generator=torch.Generator().manual_seed(0))
    ours = bb.gen_ar(method, model, prompt, L - 5, None, [4], torch.device("cpu"))
    assert torch.equal(ours["tokens_out"], ref.tokens[:, 5:]) and ours["nfe"] == ref.nfe


def test_mdlm_step_parts_times_the_network_the_softmax_and_the_draw(tmp_path):
    """benchmarks/mdlm_step_parts.py: the three parts of an MDLM block step, each timed (> 0 ms), with the
    shapes it was asked for recorded."""
    spec = importlib.util.spec_from_file_location("mdlm_step_parts", SCRIPT.parent / "mdlm_step_parts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()
    try:
        out = tmp_path / "parts.json"
        assert mod.main(["--batch", "2", "--block", "4", "--threads", "1", "--repeats", "2", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    rec = json.loads(out.read_text())
    assert set(rec["median_ms"]) == {"network", "softmax", "draw"} and min(rec["median_ms"].values()) > 0
    assert (rec["meta"]["batch"], rec["meta"]["block"], rec["meta"]["cache_rows"]) == (2, 4, 12)


def test_cpu_peak_below_its_base_reads_zero_not_negative(bb, monkeypatch):
    """The CPU high-water mark can end a few pages below the RSS read at the start (the kernel updates it
    lazily): the peak a piece of work adds is then 0, never negative (the quick sweep refuses negatives)."""
    mem = bb.PeakMemory(torch.device("cpu"))
    mem.kind, mem.base = "cpu rss high-water mark delta (VmHWM reset)", 10 * 2**20
    monkeypatch.setattr(bb.PeakMemory, "_status", staticmethod(lambda key: 10 * 2**20 - 204800))
    assert mem.stop() == 0
    monkeypatch.setattr(bb.PeakMemory, "_status", staticmethod(lambda key: 12 * 2**20))
    assert mem.stop() == 2 * 2**20
