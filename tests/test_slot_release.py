"""Issue 49: a served run's place is freed before the last byte of its answer is sent. With
``--max-queue 0 --max-batch 1`` a client that sends its next request only after it has read the previous
answer must never be refused with 429 (on the old code, 30-47% of such requests were): a live server on
loopback, 20 sequential requests per endpoint and run, each a 200."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from replaid.cli import main
from replaid.store.loading import load_run

pytest.importorskip("fastapi", reason="the 'web' extra (FastAPI, uvicorn) is not installed")
httpx = pytest.importorskip("httpx", reason="the 'web' extra (httpx, the client of these tests) is not installed")

L = 16


@contextlib.contextmanager
def serving(app):
    """``app`` under uvicorn on a free loopback port, in a thread (as tests/test_openai_api.py)."""
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
def server(tmp_path_factory):
    from replaid.web.app import create_app
    from replaid.web.engine import Limits

    root = tmp_path_factory.mktemp("slot-runs")
    for name, block in (("bd3", 4), ("plain", 0)):
        sets = ["method=mdlm", f"mdlm.block_size={block}", f"data.seq_len={L}", "train.steps=2", "eval.max_batches=1"]
        argv = ["train", "--preset", "debug", "--out", str(root / name), "--no-progress", "train.num_threads=1"]
        assert main([*argv, *sets]) == 0
    loaded = [load_run(root / "bd3"), load_run(root / "plain")]
    app = create_app([str(root / "bd3"), str(root / "plain")], Limits(max_queue=0, max_batch=1), runs=loaded)
    with serving(app) as port:
        yield port


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": "bd3", "max_tokens": 4, "steps": 2}),
        ("/v1/completions", {"model": "bd3", "max_tokens": 4, "steps": 2, "stream": True}),
        ("/v1/completions", {"model": "plain", "max_tokens": 4, "steps": 2}),
        ("/v1/completions", {"model": "plain", "max_tokens": 4, "steps": 2, "stream": True}),
        ("/api/generate", {"run": "plain", "steps": 2, "length": 8}),
    ],
)
def test_a_request_sent_after_the_previous_answer_was_read_is_never_a_429(server, path, body):
    statuses = []
    with httpx.Client(timeout=60) as c:
        for _ in range(20):
            r = c.post(f"http://127.0.0.1:{server}{path}", json=body)
            r.read()  # the whole answer (a stream to its end) before the next request
            statuses.append(r.status_code)
    assert statuses == [200] * 20, statuses
