"""``replaid serve``: the browser playground over trained runs (``replaid/web``)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TextIO

from replaid.commands import NONNEGATIVE, POSITIVE, STEPS, add_command, int_in

MAX_BODY = 1 << 20  # replaid.web.engine.MAX_BODY (this module loads without the web extra)

EXAMPLE = (
    "example: replaid serve runs/demo runs/demo-mdlm --port 8000   (then open http://127.0.0.1:8000)\n"
    "         replaid serve runs/bd3 --max-tokens 2048   (OpenAI's API: POST http://127.0.0.1:8000/v1/completions)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_command(
        sub,
        "serve",
        "Browser playground: watch generation step by step, infill, compare runs.",
        EXAMPLE,
        description="Serve a local web app over the given runs: Generate (live denoising trajectory, with "
        "token or classifier guidance), Edit (SDEdit, as replaid edit), Compare (two runs or samplers, same "
        "seed), Runs (config, curves, figures). Classifiers for guidance: those under each run folder "
        "(replaid classifier train ... --out RUN/classifiers/NAME) and those given with --classifier. "
        "Binds to 127.0.0.1 unless --host says otherwise; needs the 'web' extra "
        "(pip install -e '.[web]'). POST /v1/completions is OpenAI's text-completion API over the same runs "
        "(model = the run's folder name; streamed block by block for block-diffusion runs).",
    )
    s.add_argument("runs", nargs="+", metavar="RUN", help="run (or checkpoint) directories to serve")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    s.add_argument("--port", type=int_in(0, 65535), default=8000, help="TCP port to listen on")
    s.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    s.add_argument(
        "--raw",
        action="store_true",
        help="send decoded text as it is (default: control characters and U+FFFD as \\x13, \\ufffd)",
    )
    s.add_argument("--threads", type=int_in(0, 1024), default=0, help="torch threads (0: torch's default)")
    s.add_argument("--max-steps", type=STEPS, default=1024, help="largest number of sampling steps per request")
    s.add_argument("--max-samples", type=POSITIVE, default=4, help="largest batch (samples) per request")
    s.add_argument(
        "--max-length", type=NONNEGATIVE, default=0, help="longest sequence per request (0: each run's seq_len)"
    )
    s.add_argument(
        "--max-tokens",
        type=NONNEGATIVE,
        default=0,
        help="largest max_tokens of a POST /v1/completions request (0: 8 x each run's seq_len); a run without "
        "blocks writes at most its seq_len less the prompt",
    )
    s.add_argument(
        "--max-queue",
        type=NONNEGATIVE,
        default=32,
        help="generations that may wait per run (a block or AR run: beyond its running batch; with the default "
        "--max-batch 16 a burst of 48 streaming clients is held without a 429); one more gets HTTP 429 with "
        "Retry-After",
    )
    s.add_argument(
        "--max-batch",
        type=POSITIVE,
        default=16,
        help="a block or AR run's running batch: samples written together; POST /v1/completions requests "
        "that arrive while it runs join it at the next block boundary (AR: the next token)",
    )
    s.add_argument(
        "--access-log",
        default="-",
        metavar="PATH",
        help="one JSON line per POST /v1/completions request (id, tokens, time to first token, latency, status, "
        "why it ended), appended to PATH ('-': stderr, the default; 'off': none). GET /metrics is Prometheus' "
        "format",
    )
    s.add_argument(
        "--drain-timeout",
        type=NONNEGATIVE,
        default=0,
        metavar="S",
        help="on SIGTERM (or Ctrl-C) new connections are refused and running requests finish before the server "
        "exits; after S seconds they are cut (0: wait for them all; a second Ctrl-C cuts at once)",
    )
    s.add_argument(
        "--max-body",
        type=POSITIVE,
        default=MAX_BODY,
        help=f"largest request body in bytes (default {MAX_BODY}); a larger one gets HTTP 413 before it is read",
    )
    s.add_argument(
        "--classifier",
        action="append",
        default=None,
        metavar="DIR",
        help="a latent classifier folder (replaid classifier train --out DIR) to offer for classifier guidance "
        "on the run it was trained on; repeatable (classifiers under a run folder are found without it)",
    )
    s.set_defaults(func=run)


def _check_port(host: str, port: int) -> None:
    """Fails early (before loading runs) with a one-line error when the address cannot be bound."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ValueError(f"--host {host!r} is not an address of this machine") from None
    fam, _, _, _, addr = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port} ({e.strerror}); pass another --port") from None


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from replaid.web.app import create_app
    except ImportError as e:
        raise ValueError(
            f"replaid serve needs FastAPI and uvicorn ({e.name} is missing): pip install -e '.[web]'"
        ) from None
    import torch

    from replaid.web.engine import Limits

    for k in ("max_steps", "max_samples", "max_body", "max_batch"):
        if getattr(args, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1")
    if args.max_queue < 0:
        raise ValueError("--max-queue must be >= 0")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    _check_port(args.host, args.port)
    if args.threads:
        torch.set_num_threads(args.threads)
    limits = Limits(
        args.max_steps,
        args.max_samples,
        args.max_length,
        args.max_queue,
        args.max_body,
        args.max_tokens,
        args.max_batch,
        args.raw,
    )
    log = _access_log(args.access_log)
    app = create_app(args.runs, limits, device=args.device, classifiers=args.classifier, access_log=log)
    names = ", ".join(app.state.slots)
    print(f"replaid serve: {names} on http://{args.host}:{args.port}  (Ctrl-C stops)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"replaid serve: warning: listening on {args.host}; anyone who can reach it can run generations",
            file=sys.stderr,
        )
    drain = args.drain_timeout or None
    got: list[int] = []
    if threading.current_thread() is threading.main_thread():
        # uvicorn drains on SIGTERM/SIGINT, then raises the signal again under the handlers it found: these
        # record it, so that a drained server exits 0 with its last line instead of dying by the signal
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda n, _frame: got.append(n))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=drain)
    why = f" on {signal.Signals(got[0]).name}" if got else ""
    print(f"replaid serve: stopped{why} (running requests drained)", file=sys.stderr)
    if log is not None and log is not sys.stderr:
        log.close()
    return 0


def _access_log(path: str) -> TextIO | None:
    """The access log's stream: stderr (``-``), none (``off``) or PATH opened to append (one line if it cannot
    be: never truncated)."""
    if path == "-":
        return sys.stderr
    if path == "off":
        return None
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as e:
        raise ValueError(
            f"--access-log {path}: cannot append to it ({e.strerror}); pass a writable file, '-' or 'off'"
        ) from None
