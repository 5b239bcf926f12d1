"""``POST /v1/completions`` (issue 39 §3) with the official ``openai`` client against a live server on
loopback (uvicorn in a thread): a tiny MDLM with blocks, and a plain MDLM (no blocks) beside it. Non-streamed
and streamed (one chunk per committed block, then [DONE]); ``stop``, ``max_tokens``, ``n``; the answers are
those of :class:`~replaid.sampling.stream.Completion` (``replaid sample``) for the same seed; bad requests get
HTTP 400 in OpenAI's error format; the queue's 429 and a dropped stream's cancellation; a request that
comes while another streams joins its batch (continuous batching) and still gets its own seed's answer."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
from collections import deque

import pytest

from replaid.cli import main
from replaid.sampling.request import SampleRequest
from replaid.sampling.stream import Completion
from replaid.store.loading import load_run

openai = pytest.importorskip("openai", reason="the 'web' extra (openai, the client of these tests) is not installed")
pytest.importorskip("fastapi", reason="the 'web' extra (FastAPI, uvicorn) is not installed")

L, BLOCK = 16, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``bd3`` (blocks of 4), ``plain`` (MDLM without blocks) and ``ar``, data.seq_len 16, 3 training steps each."""
    root = tmp_path_factory.mktemp("openai-runs")
    out = {}
    for name, method in (("bd3", [f"mdlm.block_size={BLOCK}"]), ("plain", ["mdlm.block_size=0"]), ("ar", [])):
        sets = [f"method={name if name == 'ar' else 'mdlm'}", *method, f"data.seq_len={L}", "train.steps=3"]
        sets.append("eval.max_batches=1")
        argv = ["train", "--preset", "debug", "--out", str(root / name), "--no-progress", "train.num_threads=1"]
        assert main([*argv, *sets]) == 0
        out[name] = load_run(root / name)
    return root, out


@contextlib.contextmanager
def serving(app):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    t0 = time.time()
    while not server.started and time.time() - t0 < 20:
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        th.join(10)


@pytest.fixture(scope="module")
def server(runs):
    from replaid.web.app import create_app
    from replaid.web.engine import Limits

    root, loaded = runs
    app = create_app(
        [str(root / "bd3"), str(root / "plain"), str(root / "ar")],
        # raw: the answers are compared with Completion's decoded text (the escapes: tests/test_issue54.py)
        Limits(max_samples=3, max_queue=1, max_tokens=32 * L, raw=True),
        runs=[loaded["bd3"], loaded["plain"], loaded["ar"]],
        access_log=io.StringIO(),
    )
    with serving(app) as port:
        yield app, port


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[1]}/v1", api_key="none", max_retries=0, timeout=60)


def reference(run, **kw) -> Completion:
    """What ``replaid sample`` writes for the same request (steps 4, seed 7, the end-of-text ignored)."""
    comp = Completion(
        run, SampleRequest(**{"steps": 4, "seed": 7, "num": 1, "progress": False, "ignore_eos": True, **kw})
    )
    list(comp)
    return comp


EXTRA = {"steps": 4, "ignore_eos": True}  # our two fields beside OpenAI's (extra_body)


def test_models_and_a_completion_past_the_training_length(client, runs):
    assert sorted(m.id for m in client.models.list()) == ["ar", "bd3", "plain"]
    n = 8 * L
    r = client.completions.create(model="bd3", prompt="def", max_tokens=n, seed=7, extra_body=EXTRA)
    ref = reference(runs[1]["bd3"], prompt="def", max_tokens=n)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].text == ref.samples[0].text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == n and r.usage.prompt_tokens == len(ref.prompt)


def test_streamed_one_chunk_per_committed_block_then_done(client, runs, server):
    n = 8 * L
    chunks = list(
        client.completions.create(model="bd3", prompt="", max_tokens=n, seed=7, stream=True, extra_body=EXTRA)
    )
    assert len(chunks) == n // BLOCK  # one per block (the client reads up to [DONE] and stops there)
    assert all(c.object == "text_completion" and len(c.choices) == 1 for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (n // BLOCK - 1) + ["length"]
    ref = reference(runs[1]["bd3"], max_tokens=n)
    assert "".join(c.choices[0].text for c in chunks) == ref.samples[0].text
    import httpx  # the wire itself: data lines, the last one [DONE]

    body = {"model": "bd3", "max_tokens": 8, "seed": 7, "stream": True, **EXTRA}
    with httpx.Client(timeout=30) as h:
        lines = [x for x in h.post(f"http://127.0.0.1:{server[1]}/v1/completions", json=body).text.split("\n") if x]
    assert lines[-1] == "data: [DONE]" and len(lines) == 8 // BLOCK + 1 and all(x.startswith("data: ") for x in lines)


def test_stop_n_and_max_tokens(client, runs):
    n = 8 * L
    text = reference(runs[1]["bd3"], max_tokens=n).samples[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    r = client.completions.create(model="bd3", prompt="", max_tokens=n, seed=7, stop=["zzzq", stop], extra_body=EXTRA)
    assert r.choices[0].text == text[: text.find(stop)] and r.choices[0].finish_reason == "stop"
    s = list(
        client.completions.create(
            model="bd3", prompt="", max_tokens=n, seed=7, stop=stop, stream=True, extra_body=EXTRA
        )
    )
    assert "".join(c.choices[0].text for c in s) == text[: text.find(stop)] and len(s) < n // BLOCK
    r = client.completions.create(model="bd3", prompt="def", max_tokens=10, seed=7, n=3, extra_body=EXTRA)
    ref = reference(runs[1]["bd3"], prompt="def", max_tokens=10, num=3, batch_size=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 30
    assert [c.text for c in r.choices] == [x.text for x in ref.samples]
    assert len({c.text for c in r.choices}) > 1  # n samples, not one repeated
    # a run without blocks writes its seq_len at once: max_tokens up to seq_len less the prompt
    r = client.completions.create(model="plain", prompt="", max_tokens=L, seed=7, temperature=0, extra_body=EXTRA)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == L


@pytest.mark.parametrize(
    "kw,param,message",
    [
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be between 1 and 512"),  # replaid serve --max-tokens
        ({"max_tokens": 513}, "max_tokens", "max_tokens must be between 1 and 512"),
        ({"model": "plain", "max_tokens": L + 1}, "max_tokens", f"ask for at most {L}"),
        ({"n": 4}, "n", "n must be between 1 and 3"),
        ({"temperature": 3}, "temperature", "temperature must be between 0 and 2"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop strings"),
        ({"model": "nope"}, "model", "unknown model 'nope'"),
        ({"top_p": 0.5}, "top_p", "top_p is not supported"),
        ({"prompt": [1, 2, 3]}, "prompt", "prompt must be a string"),
        # past 1e308 (math.isfinite's OverflowError was a 500)
        ({"max_tokens": 10**400}, "max_tokens", "max_tokens must be between 1 and 512"),
        ({"extra_body": {"steps": 10**400}}, "steps", "steps must be between 1 and 1024"),
        ({"model": ["bd3"]}, "model", 'unknown model ["bd3"]'),  # no model id (unhashable: was a 500)
        ({"model": None}, "model", "no model; this server serves bd3, plain"),
        ({"seed": -1}, "seed", "seed -1: must be >= 0"),
        ({"best_of": True}, "best_of", "best_of is not supported"),  # true is no best_of 1
        ({"extra_body": {"echo": 0}}, "echo", "echo is not supported"),
        # a prompt no max_tokens can make room for: shorten it (was "ask for at most -N")
        ({"model": "plain", "prompt": "word " * 20}, "prompt", f"shorten the prompt to fewer than {L} tokens"),
        ({"prompt": "word " * 20 * 64 * L}, "prompt", f"shorten the prompt to fewer than {64 * L} tokens"),
    ],
)
def test_a_bad_request_is_a_400_in_openais_error_format(client, kw, param, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**{"model": "bd3", "prompt": "", "max_tokens": 8, **kw})
    assert e.value.status_code == 400
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] is None
    assert message in err["message"] and "\n" not in err["message"]


@pytest.mark.parametrize(
    "raw,status,param,message",
    [
        (b"{not json", 400, None, "the request body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, 400, None, "nested too deeply"),  # RecursionError: was a 500
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", 400, None, "a number too long"),  # int's digit limit: a 500
        (b'{"model": "bd3", "prompt": "ab\\udcff"}', 400, "prompt", "prompt is not valid Unicode"),  # tokenizer: a 500
        (b'{"prompt": "' + b"x" * (2 << 20) + b'"}', 413, None, "over the limit of 1048576 bytes"),
    ],
    ids=["not-json", "deep", "long-number", "lone-surrogate", "too-big"],
)
def test_a_body_that_cannot_be_read_is_refused_in_openais_error_format(server, raw, status, param, message):
    """Raw bodies the official client never sends: HTTP 400 (413 over --max-body) in OpenAI's error format
    from /v1/completions, never a 500; the playground's /api/generate gives its one-line error for the same
    bytes (a body it cannot read as JSON at all)."""
    import httpx

    with httpx.Client(timeout=30) as c:
        r = c.post(f"http://127.0.0.1:{server[1]}/v1/completions", content=raw)
        assert r.status_code == status, r.text[:300]
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
        assert message in err["message"] and "\n" not in err["message"]
        if param is None:
            r = c.post(f"http://127.0.0.1:{server[1]}/api/generate", content=raw)
            assert r.status_code == status and message in r.json()["error"], r.text[:300]


@pytest.mark.parametrize(
    "method,path,status",
    [("POST", "/v1/chat/completions", 404), ("GET", "/v1/completions", 405), ("GET", "/v1/a%0Ab", 404)],
)
def test_an_endpoint_not_served_under_v1_says_what_is_in_openais_error_format(server, method, path, status):
    """A chat client, a GET of the completions endpoint: 404/405 in OpenAI's error format (one line, the
    endpoints served named), not FastAPI's {"detail": ...}; the playground's own paths keep FastAPI's."""
    import httpx

    with httpx.Client(timeout=30) as c:
        r = c.request(method, f"http://127.0.0.1:{server[1]}{path}", json={} if method == "POST" else None)
        assert r.status_code == status, r.text[:300]
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and "\n" not in err["message"]
        assert "this server serves GET /v1/models and POST /v1/completions" in err["message"]
        assert c.get(f"http://127.0.0.1:{server[1]}/nope").json() == {"detail": "Not Found"}


def test_a_full_queue_is_a_429_and_a_dropped_stream_is_cancelled(client, server, runs):
    import httpx

    from replaid.web.batcher import Job

    app, port = server
    sched = app.state.slots["bd3"].batcher
    with sched.cond:  # the batch full and max_queue=1 request waiting beyond it (no one to wake the scheduler)
        sched.running, sched.waiting = sched.max_batch, deque([Job(SampleRequest(num=1), print, threading.Event())])
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model="bd3", prompt="", max_tokens=8)
        assert e.value.status_code == 429 and "busy" in e.value.body["message"]
        assert e.value.body["type"] == "rate_limit_error"
        assert 1 <= int(e.value.response.headers["retry-after"]) <= 60  # whole seconds: when to come back
        assert access_lines(app)[-1]["status"] == 429 and access_lines(app)[-1]["ended"] == "busy"
    finally:
        with sched.cond:
            sched.running, sched.waiting = 0, deque()
    calls = [0]

    def slow(*_):
        calls[0] += 1
        time.sleep(0.002)

    h = runs[1]["bd3"].model.backbone.register_forward_hook(slow)  # every denoising and commit pass
    try:
        body = {"model": "bd3", "max_tokens": 32 * L, "seed": 7, "stream": True, **EXTRA}  # 128 blocks
        with httpx.Client(timeout=30) as c, c.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    json.loads(line[5:])
                    break
            at_drop = calls[0]
        t0 = time.time()
        while (sched.batch is not None and sched.batch.lanes) and time.time() - t0 < 10:
            time.sleep(0.02)
        assert not sched.batch.lanes and 0 < at_drop and calls[0] - at_drop < 100  # to the end: several hundred more
    finally:
        h.remove()


@pytest.mark.parametrize("rid,block", [("bd3", BLOCK), ("ar", 1)])
def test_a_request_that_comes_while_another_streams_joins_its_batch(client, server, runs, rid, block):
    """Two streamed requests on the block run (AR: blocks of one token): the second is sent once the first
    has its first chunk, and its own first chunk comes before the first has finished (it joined the running
    batch at a block boundary, not after it); each answer is the one it gets alone (its own seed's stream),
    AR's 32 times past its training length, one chunk per token."""
    model = runs[1][rid].model
    h = model.backbone.register_forward_hook(lambda *_: time.sleep(0.002))  # 128 blocks: ~1 s or more
    got: dict[str, list] = {"a": [], "b": []}  # (time, text, finish_reason) per chunk
    first_a = threading.Event()

    def stream(name: str, seed: int, n: int) -> None:
        for c in client.completions.create(
            model=rid, prompt="def", max_tokens=n, seed=seed, stream=True, extra_body=EXTRA
        ):
            got[name].append((time.perf_counter(), c.choices[0].text, c.choices[0].finish_reason))
            first_a.set()

    try:
        a = threading.Thread(target=stream, args=("a", 7, 32 * L))
        a.start()
        assert first_a.wait(30)
        stream("b", 8, 4 * L)  # 16 blocks
        a.join(60)
    finally:
        h.remove()
    assert 1 < len(got["b"]) <= 4 * L // block + 1 < len(got["a"])  # a chunk per block (+ the prompt's in part)
    if block == 1:
        assert len(got["b"]) == 4 * L and len(got["a"]) == 32 * L  # AR: one chunk per token
    assert got["b"][0][0] < got["a"][-1][0]  # b's first chunk before a's end: b joined a's batch
    assert got["b"][-1][0] < got["a"][-1][0]  # and, 8 times shorter, it finished first
    for name, seed, n in (("a", 7, 32 * L), ("b", 8, 4 * L)):
        ref = reference(runs[1][rid], prompt="def", max_tokens=n, seed=seed)
        assert "".join(t for _, t, _ in got[name]) == ref.samples[0].text, name
        assert got[name][-1][2] == "length"


def test_the_playground_sends_a_block_run_to_the_completions_endpoint(server):
    import httpx

    with httpx.Client(timeout=30) as c:
        r = c.post(f"http://127.0.0.1:{server[1]}/api/generate", json={"run": "bd3", "sampler": "ancestral"})
    assert r.status_code == 400 and "/v1/completions" in r.json()["error"]


def access_lines(app) -> list[dict]:
    return [json.loads(x) for x in app.state.observer.log.getvalue().splitlines()]


def test_every_request_is_one_access_log_line_and_counted_in_the_metrics(client, server):
    """The access log: one JSON line per request (answered, streamed, refused as bad) with its id, tokens,
    time to first token, latency, status and why it ended; ``GET /metrics`` read by prometheus_client's own
    parser: the requests by status, the tokens, both histograms and the live gauges of every run."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    app, port = server

    def scrape() -> dict:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }

    before = scrape()
    r = client.completions.create(model="ar", prompt="def", max_tokens=2 * L, seed=3, extra_body=EXTRA)
    line = access_lines(app)[-1]
    assert line["id"] == r.id and line["model"] == "ar" and line["status"] == 200 and line["ended"] == "length"
    assert line["completion_tokens"] == r.usage.completion_tokens == 2 * L
    assert line["prompt_tokens"] == r.usage.prompt_tokens and line["n"] == 1 and line["stream"] is False
    assert 0 < line["ttft_s"] <= line["latency_s"]
    list(client.completions.create(model="bd3", prompt="", max_tokens=8, seed=3, stream=True, extra_body=EXTRA))
    line = access_lines(app)[-1]
    assert line["model"] == "bd3" and line["stream"] is True and line["completion_tokens"] == 8
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="ar", prompt="", max_tokens=8, temperature=5)
    line = access_lines(app)[-1]
    assert line["status"] == 400 and line["ended"] == "bad request" and "temperature" in line["message"]
    assert line["ttft_s"] is None and line["completion_tokens"] == 0

    after = scrape()

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("replaid_requests_total", model="ar", status="200") == 1
    assert grew("replaid_requests_total", model="ar", status="400") == 1
    assert grew("replaid_requests_total", model="bd3", status="200") == 1
    assert grew("replaid_completion_tokens_total", model="ar") == 2 * L
    assert grew("replaid_request_latency_seconds_count", model="ar") == 1
    assert grew("replaid_time_to_first_token_seconds_count", model="bd3") == 1
    for rid in ("ar", "bd3", "plain"):  # the live gauges: idle now
        assert after[("replaid_queue_depth", (("model", rid),))] == 0
        assert after[("replaid_running_rows", (("model", rid),))] == 0
        assert (("replaid_tokens_per_second", (("model", rid),))) in after
    assert after[("replaid_tokens_per_second", (("model", "ar"),))] > 0  # 32 tokens within the last 10 s


@pytest.mark.slow
def test_sigterm_drains_the_running_requests_then_exits(tmp_path):
    """``replaid serve`` in its own process: a stream is running when SIGTERM comes; the server refuses new
    connections, writes the stream to its end ([DONE], the text the request gets alone), logs it, and
    exits 0."""
    import os
    import signal
    import subprocess
    import sys

    import httpx

    # an AR run of 64 tokens written 8 times past its length: 512 passes, a second or more (a drain cut short
    # after 0.1 s, as uvicorn's timeout_graceful_shutdown would, loses the stream's end)
    run = tmp_path / "ar64"
    sets = ["method=ar", "data.seq_len=64", "model.hidden=256", "train.steps=2", "eval.max_batches=1"]
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.num_threads=1", *sets]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "access.jsonl"
    cmd = [sys.executable, "-m", "replaid", "serve", str(run), "--port", str(port), "--raw"]
    proc = subprocess.Popen([*cmd, "--access-log", str(log), "--threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while time.time() - t0 < 60:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"model": "ar64", "prompt": "def", "max_tokens": 8 * 64, "seed": 7, "stream": True, **EXTRA}
        texts, lines = [], []
        with httpx.Client(timeout=60) as c, c.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                lines.append(line)
                if len(lines) == 1:
                    proc.send_signal(signal.SIGTERM)
                    time.sleep(0.5)
                    with pytest.raises(httpx.TransportError):  # the listening socket is closed
                        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                if line != "data: [DONE]":
                    texts.append(json.loads(line[5:])["choices"][0]["text"])
        assert lines[-1] == "data: [DONE]"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    ref = reference(load_run(run, device="cpu"), prompt="def", max_tokens=8 * 64)
    assert "".join(texts) == ref.samples[0].text  # the whole answer, after the signal
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["status"] == 200 and entry["completion_tokens"] == 8 * 64
    assert "drained" in proc.stderr.read()
