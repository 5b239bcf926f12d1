"""One block loop (issue 51 §3): ``replaid sample``, ``generate``, ``/v1/completions`` (its
scheduler) and the block benchmark all write a block run's text through ``BlockBatch.step`` (a spy counts
the calls from each entry point)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from replaid.cli import main
from replaid.sampling import batching
from replaid.store.loading import load_run

L, BLOCK = 16, 4
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_blocks.py"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A debug-size MDLM with blocks of 4 tokens (2 training steps: seconds)."""
    out = tmp_path_factory.mktemp("loop") / "bd3"
    sets = ["method=mdlm", f"mdlm.block_size={BLOCK}", f"data.seq_len={L}", "train.steps=2", "eval.max_batches=1"]
    assert main(["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.num_threads=1", *sets]) == 0
    return out


@pytest.fixture
def spy(monkeypatch):
    """The rows of every ``BlockBatch.step`` call."""
    calls: list[int] = []
    step = batching.BlockBatch.step

    def counted(self, *a, **kw):
        calls.append(self.rows)
        return step(self, *a, **kw)

    monkeypatch.setattr(batching.BlockBatch, "step", counted)
    return calls


def test_the_cli_writes_through_the_one_loop(run_dir, spy, capsys):
    argv = ["sample", str(run_dir), "--max-tokens", str(3 * L), "--ignore-eos", "--steps", "2", "--num", "1", "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    assert len(spy) == 3 * L // BLOCK and set(spy) == {1}  # every block, one row


def test_generate_writes_through_the_one_loop(run_dir, spy):
    """``generate`` (what the quality evaluation and the sweep call) on a block run: its length, both
    samples in one batch."""
    from replaid.sampling.generate import generate
    from replaid.sampling.request import SampleRequest

    run = load_run(run_dir, device="cpu")
    rows = generate(run, SampleRequest(num=2, batch_size=2, steps=2, seed=0, progress=False))
    assert len(rows) == 2 and len(spy) == L // BLOCK and set(spy) == {2}


def test_v1_completions_write_through_the_one_loop(run_dir, spy):
    from fastapi.testclient import TestClient

    from replaid.web.app import create_app
    from replaid.web.engine import Limits

    run = load_run(run_dir, device="cpu")
    client = TestClient(create_app([str(run_dir)], Limits(raw=True), runs=[run]))
    body = {"model": "bd3", "prompt": "", "max_tokens": 2 * L, "steps": 2, "ignore_eos": True}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 2 * L
    assert len(spy) == 2 * L // BLOCK


def test_the_block_benchmark_times_the_one_loop(spy):
    spec = importlib.util.spec_from_file_location("bench_blocks", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    spec_ = {"method": "mdlm", "preset": "debug", "b": BLOCK}
    method, model, seq_len, _ = bench.build(spec_, "blocks", torch.device("cpu"))
    prompt = torch.zeros(1, 0, dtype=torch.long)
    out = bench.gen_blocks(method, model, prompt, 2 * seq_len, 2, seq_len - BLOCK, None, torch.device("cpu"))
    assert out["seconds"] > 0 and len(spy) == 2 * seq_len // BLOCK
