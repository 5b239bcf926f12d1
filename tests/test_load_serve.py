"""benchmarks/load_serve.py (issue 39 §4, the service) at tiny scale: 3 streaming clients against a live
``replaid serve`` whose running batch holds exactly them (continuous batching, none waiting), then an excess
of 2. Its JSON has every field, its counts add up to the requests sent, every client got its ``max_tokens``,
the clients ran together, the excess got OpenAI's 429; a planted bug (a 429 counted as a 200, in the script's
own status classification) is caught by its checks; bad input is one ``replaid: error:`` line and exit
status 2."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from replaid.cli import main as replaid_main

openai = pytest.importorskip("openai", reason="the 'web' extra (openai, the benchmark's client) is not installed")
pytest.importorskip("fastapi", reason="the 'web' extra (FastAPI, uvicorn) is not installed")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "load_serve.py"
CLIENTS, EXCESS, MAX_TOKENS = 3, 2, 128


@pytest.fixture(scope="module")
def ls():
    spec = importlib.util.spec_from_file_location("load_serve", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("load_serve", None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """MDLM with blocks of 4, data.seq_len 16, 3 training steps (as tests/test_openai_api.py's)."""
    out = tmp_path_factory.mktemp("load-run") / "bd3"
    sets = ["method=mdlm", "mdlm.block_size=4", "data.seq_len=16", "train.steps=3", "eval.max_batches=1"]
    argv = ["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.num_threads=1"]
    assert replaid_main([*argv, *sets]) == 0
    return out


@pytest.fixture(scope="module")
def report(ls, run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("load-out")
    args = [str(run_dir), "--clients", str(CLIENTS), "--excess", str(EXCESS), "--max-tokens", str(MAX_TOKENS)]
    rc = ls.main([*args, "--steps", "32", "--threads", "1", "--out", str(out)])  # ~0.5 s a client: 32 blocks
    rep = json.loads((out / "load_serve.json").read_text())
    assert rc == 0, rep["problems"]
    assert "| main wave: 200 / 429 / other | 3 / 0 / 0 |" in (out / "load_serve.md").read_text()
    return rep


@pytest.mark.slow
def test_the_json_has_every_field_and_the_counts_add_up(ls, report):
    meta, server, summ, recs = report["meta"], report["server"], report["summary"], report["clients"]
    assert report["problems"] == [] and ls.check(report) == []
    assert {"date", "hardware", "torch", "command", "clients", "excess", "max_tokens", "steps"} <= set(meta)
    assert meta["hardware"]["cpu"] and meta["hardware"]["cpu_count"] >= 1 and meta["torch"]
    assert server["limits"]["max_queue"] == 0 and server["limits"]["max_batch"] == CLIENTS
    assert server["capacity"] == CLIENTS  # one running batch of every main client, none waiting
    assert server["run"]["block_size"] == 4 and server["run"]["method"] == "mdlm" and server["still_serving"]
    for k in ("rss_ready", "rss_before", "rss_after", "rss_peak"):
        assert server[k] > 0
    assert server["rss_peak"] >= max(server["rss_before"], server["rss_after"])
    # every request sent has one record, and the counts are the records'
    assert len(recs) == CLIENTS + EXCESS == summ["requests"]
    c = summ["counts"]
    assert c["main"] == {"200": CLIENTS, "429": 0, "other": 0, "total": CLIENTS, "completed": CLIENTS}
    assert c["excess"] == {"200": 0, "429": EXCESS, "other": 0, "total": EXCESS, "completed": 0}
    assert c["all"]["200"] + c["all"]["429"] + c["all"]["other"] == CLIENTS + EXCESS == c["all"]["total"]
    main = [r for r in recs if r["wave"] == "main"]
    assert sorted(r["seed"] for r in main) == [0, 1, 2]  # distinct seeds
    for r in main:
        assert r["status"] == 200 and r["finish_reason"] == "length" and r["tokens"] == MAX_TOKENS
        assert r["chunks"] == MAX_TOKENS // 4 and 0 < r["headers_s"] <= r["ttfc_s"] <= r["total_s"]
    for r in (r for r in recs if r["wave"] == "excess"):
        assert r["status"] == 429 and r["error_type"] == "rate_limit_error" and r["error_keys"] == ls.KEYS
        assert r["chunks"] == 0 and r["ttfc_s"] is None and "busy" in r["error_message"]
    # continuous batching: the clients run together, every first chunk comes before any client's end
    assert max(r["ttfc_s"] for r in main) < min(r["total_s"] for r in main)
    assert summ["ttfc_p50_s"] <= summ["ttfc_p95_s"] <= summ["ttfc_max_s"]
    assert summ["total_p50_s"] <= summ["total_p95_s"] <= summ["total_max_s"]
    assert summ["completion_tokens"] == CLIENTS * MAX_TOKENS and summ["tokens_exact"]
    assert summ["tokens_per_s"] == pytest.approx(CLIENTS * MAX_TOKENS / summ["main_wall_s"], rel=1e-2)
    assert summ["excess_429_body"]["type"] == "rate_limit_error" and summ["excess_429_s_max"] < summ["ttfc_max_s"]
    assert 1 <= int(summ["excess_429_retry_after"]) <= 60
    # the server's own access log beside the clients' figures: the same requests, the same ends
    log = report["server_log"]
    assert log["requests"] == CLIENTS + EXCESS and log["by_status"] == {"200": CLIENTS, "429": EXCESS}
    assert log["completion_tokens"] == CLIENTS * MAX_TOKENS
    assert 0 < log["ttft_p50_s"] <= log["ttft_p95_s"] <= summ["ttfc_max_s"] + 0.5
    assert log["latency_p95_s"] <= summ["total_max_s"] + 0.5


class Refuses:
    """A stand-in for the openai client whose request gets the server's 429 (as the excess does)."""

    def __init__(self, status: int = 429):
        import httpx

        err = {"message": "run 'bd3' is busy", "type": "rate_limit_error", "param": None, "code": None}
        resp = httpx.Response(status, json={"error": err}, request=httpx.Request("POST", "http://127.0.0.1/v1"))
        self.exc = openai.RateLimitError("busy", response=resp, body=err)
        self.completions = self

    def create(self, **_):
        raise self.exc


@pytest.mark.slow
def test_a_429_counted_as_a_200_is_caught(ls, report, monkeypatch):
    """The script's checks, on the records its own client code writes: right, then with a planted bug in
    its status classification (every HTTP error a 200), then with tampered counts."""
    body = {"prompt": "", "max_tokens": MAX_TOKENS, "temperature": 1.0, "steps": 32, "seed": 9}

    def records():
        r = ls.one_client(Refuses(), "bd3", "excess", 0, body, lambda t: 0, lambda: None)
        r.pop("sent_pc")
        r["sent_s"] = 0.0
        return r

    def rebuilt(excess):
        recs = [r for r in report["clients"] if r["wave"] == "main"] + excess
        rep = {**report, "clients": recs, "meta": {**report["meta"], "excess": len(excess)}}
        return {**rep, "summary": ls.summarize(recs, report["summary"]["main_wall_s"])}

    good = rebuilt([records(), records()])
    assert ls.check(good) == [] and good["summary"]["counts"]["excess"]["429"] == 2

    monkeypatch.setattr(ls, "status_of", lambda e: (200, "ok"))  # the plant: a refusal is a 200
    bad = rebuilt([records(), records()])
    assert bad["summary"]["counts"]["excess"]["200"] == 2  # the plant took
    problems = ls.check(bad)
    assert any("rate-limit error counted as 200" in p for p in problems), problems
    monkeypatch.undo()

    tampered = json.loads(json.dumps(report))  # the summary's counts moved, the records as they were
    tampered["summary"]["counts"]["excess"].update({"200": EXCESS, "429": 0})
    assert any("do not match the records" in p for p in ls.check(tampered))
    short = json.loads(json.dumps(report))  # a record lost
    short["clients"] = short["clients"][1:]
    assert any("records for" in p for p in ls.check(short))


@pytest.mark.parametrize(
    "args,message",
    [
        (["/nonexistent/run"], "no config.json there"),
        (["RUN", "--clients", "0"], "--clients must be >= 1"),
        (["RUN", "--excess", "-1"], "--excess must be >= 0"),
        (["RUN", "--max-queue", "-1"], "--max-queue must be >= 0"),
        (["RUN", "--max-batch", "0"], "--max-batch must be >= 1"),
        (["RUN", "--temperature", "3"], "--temperature must be between 0 and 2"),
        (["RUN", "--max-tokens", "x"], "invalid int value"),
        (["RUN", "--nope"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_status_2(ls, tmp_path, capsys, args, message):
    (tmp_path / "config.json").write_text("{}")  # a run folder, as far as the arguments go
    assert ls.main([str(tmp_path) if a == "RUN" else a for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replaid: error: ") and message in err[0]
