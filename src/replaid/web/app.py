"""The playground server (FastAPI): static page, run metadata, and generation as server-sent events.

Safety (``replaid serve`` binds 127.0.0.1 by default):

* only the runs given at start are served, by id; a request names a run id, a file index or a
  field value, never a path (figures are listed once at start-up and served by their index);
* every request is validated with bounds on steps, length and samples (``Limits``), a bad one gets
  HTTP 400 with a one-line ``error``;
* a request body over ``Limits.max_body`` bytes gets HTTP 413 before it is read: at once when its
  Content-Length says so, as soon as the limit is passed when it comes in chunks (under ``/v1/``, with
  OpenAI's error object);
* each run has one worker thread: its generations run one at a time in arrival order, at most
  ``Limits.max_queue`` wait (more get HTTP 429); a page that goes away cancels its job at the next
  step; a block run's ``/v1/completions`` requests instead join one running batch at block boundaries
  (:mod:`replaid.web.batcher`: at most ``Limits.max_batch`` samples running, ``max_queue`` waiting beyond);
* an exception inside a generation becomes an ``error`` event (one line) and the server keeps going.

``GET /metrics`` is Prometheus' text format and ``/v1/completions`` writes an access log
(:mod:`replaid.web.observe`).

Endpoints: ``GET /api/runs`` (the runs, their samplers and classifiers, the limits), ``GET
/api/runs/{id}`` (+ ``curves.png``, ``figures/{k}``), ``POST /api/generate`` (a sample, prompt or infill,
with optional guidance) and ``POST /api/edit`` (SDEdit, as ``replaid edit``), each a
:class:`~replaid.sampling.request.SampleRequest` in JSON (:func:`replaid.web.engine.parse`); both answer
a stream of server-sent events (``queued``, ``running``, ``start``, ``step`` ..., ``done`` or ``error``)
or, for a bad request, HTTP 400 with the one-line message the CLI gives, naming the request's fields. ``POST /v1/completions`` (and ``GET /v1/models``) is OpenAI's text-completion API over the same
runs and queues (:mod:`replaid.web.completions`), the way to a block-diffusion run. Classifiers for guidance: those under each run folder and those given with ``replaid serve
--classifier DIR`` that were trained on the run (matching embedding fingerprint), named by an id.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replaid import schema
from replaid.schema import dumps as strict_dumps
from replaid.web.batcher import Batcher
from replaid.web.completions import add_completions, error_body
from replaid.web.engine import Limits, classifier_meta, generate_stream, guides_for, parse, prepare, samplers_for
from replaid.web.jobs import Emit, Slot, admit, busy, one_line, read_json, submit
from replaid.web.observe import Observer

if TYPE_CHECKING:
    from replaid.store.loading import Run

PLOT_DIRS_SKIP = {"checkpoints", "tb", "tokenizer"}
MAX_FIGURES = 200
SKIP_CURVES = {"time", "tokens_per_s"}


def run_ids(paths: list[str]) -> list[str]:
    """Short unique ids from the run folders' names (``demo``, ``demo-2``, ...)."""
    ids: list[str] = []
    for p in paths:
        base = Path(p).resolve().name or "run"
        name, k = base, 2
        while name in ids:
            name, k = f"{base}-{k}", k + 1
        ids.append(name)
    return ids


def find_figures(run_dir: Path) -> list[Path]:
    """PNG plots under a run folder (evaluation and analysis outputs), checkpoints excluded."""
    out = []
    for p in sorted(run_dir.rglob("*.png")):
        rel = p.relative_to(run_dir)
        if rel.parts and rel.parts[0] in PLOT_DIRS_SKIP:
            continue
        out.append(p)
    return out[:MAX_FIGURES]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl rows (:data:`replaid.schema.METRICS_ROW`); a stray line is skipped."""
    return list(schema.jsonl_rows(run_dir / "metrics.jsonl", schema.METRICS_ROW))


def curves_png(rows: list[dict[str, Any]], title: str) -> bytes:
    """Training curves from metrics.jsonl rows: numeric series with two or more points against
    ``step``, loss-like keys first, at most six panels, log scale when they span > 20x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        step = r.get("step")
        if not isinstance(step, (int, float)):
            continue
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                series.setdefault(k, []).append((step, float(v)))
    series = {k: v for k, v in series.items() if len(v) >= 2 and k not in SKIP_CURVES}
    first = [k for k in series if any(w in k for w in ("loss", "nelbo", "ppl", "nll", "diffusion", "recon"))]
    keys = (first + [k for k in series if k not in first])[:6]
    ncol = min(3, max(1, len(keys)))
    nrow = max(1, -(-len(keys) // ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.8 * ncol, 2.7 * nrow), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_axis_off()
    for ax, k in zip(axes.flat, keys, strict=False):
        xs, ys = zip(*series[k], strict=True)
        ax.plot(xs, ys, lw=1.2)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        if min(ys) > 0 and max(ys) / min(ys) > 20:
            ax.set_yscale("log")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    if not keys:
        axes[0][0].text(0.5, 0.5, "no metrics.jsonl yet", ha="center", va="center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def check_limits(limits: Limits, slots: dict[str, Slot]) -> None:
    """At start-up, not per request: a --max-length beyond a served run's trained length (data.seq_len;
    the model has no other positional limit: rotary positions) is refused in one line."""
    for s in slots.values():
        n = s.run.cfg.data.seq_len
        if limits.max_length > n:
            raise ValueError(
                f"--max-length {limits.max_length} is beyond the trained length of run {s.id} ({s.path}: "
                f"data.seq_len={n}); pass --max-length {n} or less (0: each run's own data.seq_len)"
            )


def create_app(
    run_paths: list[str],
    limits: Limits | None = None,
    device: str = "auto",
    runs: list[Run] | None = None,
    classifiers: list[str] | None = None,
    access_log: TextIO | None = None,
) -> FastAPI:
    """The FastAPI app over ``run_paths`` (loaded now, EMA weights). ``runs`` may pass already
    loaded :class:`replaid.store.loading.Run` objects (tests). ``classifiers``: latent classifier
    folders (``replaid classifier train``) offered for guidance, each on the runs it was trained on
    (besides those found under the run folders); one that fits none of the runs is refused.
    ``access_log``: where ``/v1/completions``' JSON lines go (:mod:`replaid.web.observe`; None: nowhere).
    The routes come from three routers: the runs' metadata, the playground's generations, and OpenAI's
    API (:func:`replaid.web.completions.add_completions`)."""
    limits = limits or Limits()
    slots = load_slots(run_paths, limits, device, runs, classifiers)
    app = FastAPI(title="replaid playground", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_body=limits.max_body)
    static = resources.files("replaid.web") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.state.slots = slots
    app.state.limits = limits

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(str(static / "index.html"), media_type="text/html")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    app.include_router(runs_router(slots, limits))
    app.include_router(playground_router(slots, limits))
    observer = app.state.observer = Observer(access_log, lambda: {k: load(s) for k, s in slots.items()})
    add_completions(app, slots, limits, observer)

    @app.get("/metrics")
    def metrics() -> Response:
        """Prometheus' text format (:mod:`replaid.web.observe`)."""
        return Response(observer.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


def load_slots(
    run_paths: list[str], limits: Limits, device: str, runs: list[Run] | None, classifiers: list[str] | None
) -> dict[str, Slot]:
    """One :class:`~replaid.web.jobs.Slot` per served run (its worker, figures, guides and, for a run that
    writes any length, its batcher), by id; a classifier that fits none of the runs is refused."""
    from replaid.store.loading import load_run, run_dir_of

    extra = [Path(c) for c in classifiers or []]
    for c in extra:
        classifier_meta(c)  # one line when it is not a classifier folder
    slots: dict[str, Slot] = {}
    for k, (rid, p) in enumerate(zip(run_ids(run_paths), run_paths, strict=True)):
        run = runs[k] if runs is not None else load_run(p, use_ema=True, train_data=False, device=device)
        rdir = run_dir_of(Path(run.ckpt))
        guides = guides_for(run, Path(rdir), extra) if run.method.kind.continuous else {}
        slots[rid] = Slot(
            rid,
            Path(rdir),
            run,
            ThreadPoolExecutor(1, thread_name_prefix=f"gen-{rid}"),
            find_figures(Path(rdir)),
            guides,
            Batcher(rid, run, limits.max_batch, limits.max_queue) if run.method.stream_block() else None,
        )
    check_limits(limits, slots)
    used = {g.path for s in slots.values() for g in s.guides.values()}
    for c in extra:
        if c.resolve() not in used:
            raise ValueError(
                f"--classifier {c}: trained on none of the served runs ({classifier_meta(c).get('run')}); "
                "serve its run, or train one for these with 'replaid classifier train'"
            )
    return slots


def _err(msg: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status)


def runs_router(slots: dict[str, Slot], limits: Limits) -> APIRouter:
    """``GET /api/runs`` and a run's metadata, training curves and figures."""
    router = APIRouter()

    @router.get("/api/runs", response_model=None)  # the return annotation is for mypy, not a response model
    def list_runs() -> dict[str, Any]:
        out = []
        for s in slots.values():
            cfg = s.run.cfg
            out.append(
                {
                    "id": s.id,
                    "method": cfg.method,
                    "preset": cfg.preset,
                    "step": s.run.step,
                    "seq_len": cfg.data.seq_len,
                    "samplers": samplers_for(s.run),
                    "continuous": s.run.method.kind.continuous,
                    "block_size": s.run.method.block_size(),  # > 0: served at /v1/completions only
                    "stream_block": s.run.method.stream_block(),  # > 0: /v1/completions batches (AR: 1)
                    "params": sum(p.numel() for p in s.run.model.parameters()),
                    "classifiers": [{"id": g.id, "labels": g.labels} for g in s.guides.values()],
                }
            )
        return {"runs": out, "limits": asdict(limits)}

    @router.get("/api/runs/{rid}", response_model=None)  # the return annotation is for mypy, not a response model
    def run_info(rid: str) -> JSONResponse | dict[str, Any]:
        s = slots.get(rid)
        if s is None:
            return _err(f"unknown run {rid!r}; this server serves {', '.join(slots)}", 404)
        rows = read_metrics(s.path)
        last = {}
        for r in rows:
            last.update({k: v for k, v in r.items() if isinstance(v, (int, float, str)) and k != "time"})
        return {
            "id": s.id,
            "config": s.run.cfg.to_dict(),
            "step": s.run.step,
            "ema": s.run.ema_loaded,
            "metrics_rows": len(rows),
            "last_metrics": last,
            "figures": [{"index": k, "name": str(f.relative_to(s.path))} for k, f in enumerate(s.figures)],
        }

    @router.get("/api/runs/{rid}/curves.png")
    def run_curves(rid: str) -> Response:
        s = slots.get(rid)
        if s is None:
            return _err(f"unknown run {rid!r}", 404)
        return Response(
            curves_png(read_metrics(s.path), f"{s.id}: training curves (metrics.jsonl)"), media_type="image/png"
        )

    @router.get("/api/runs/{rid}/figures/{k}")
    def run_figure(rid: str, k: int) -> Response:
        s = slots.get(rid)
        if s is None or not 0 <= k < len(s.figures):
            return _err("no such figure", 404)
        return FileResponse(str(s.figures[k]), media_type="image/png")

    return router


def playground_router(slots: dict[str, Slot], limits: Limits) -> APIRouter:
    """``POST /api/generate`` and ``POST /api/edit``: a validated request (400 with one line), queued on its
    run's worker (429 past ``max_queue``), answered as server-sent events."""
    router = APIRouter()

    @router.post("/api/generate")
    async def generate(request: Request) -> Response:
        return await _stream(request, edit=False)

    @router.post("/api/edit")
    async def edit(request: Request) -> Response:
        return await _stream(request, edit=True)

    async def _stream(request: Request, edit: bool) -> Response:
        try:
            body = read_json(await request.body())
        except ValueError as e:
            return _err(str(e))
        try:
            req = parse(body, edit)
        except (ValueError, TypeError) as e:
            return _err(one_line(e))
        s = slots.get(req.run)
        if s is None:
            return _err(f"unknown run {req.run!r}; this server serves {', '.join(slots)}")
        try:
            prepare(req, s.run, limits, s.guides)
        except ValueError as e:
            return _err(one_line(e))
        ahead = admit(s, limits.max_queue)
        if ahead is None:
            return _err(busy(s, limits.max_queue), 429)

        def work(emit: Emit, cancelled: Callable[[], bool]) -> None:
            emit({"type": "running"})
            generate_stream(s.run, req, emit, cancelled, limits, s.guides)

        queue, gone = submit(s, work)

        async def events() -> AsyncIterator[str]:
            try:
                yield _sse({"type": "queued", "ahead": ahead})
                while True:
                    ev = await queue.get()
                    yield _sse(ev)
                    if ev["type"] in ("done", "error"):
                        break
            finally:
                gone.set()

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    return router


class BodyLimit:
    """ASGI middleware: a request body of more than ``max_body`` bytes is answered with HTTP 413 and the
    server's one-line error JSON, never read in full. A Content-Length over the limit is refused before
    any of the body is read; a body without one (chunked) is read up to the limit, then refused. A body
    within the limit is read here (at most ``max_body`` bytes held) and handed on whole; the messages
    after it (a client that goes away) pass through, so a dropped page still cancels its generation."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return await self._refuse(scope, send, f"is {int(declared)} bytes")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away before its body was complete
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return await self._refuse(scope, send, f"passed {size} bytes")
            if not msg.get("more_body", False):
                break
        body, handed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, what: str) -> None:
        """HTTP 413: the playground's one-line error, or OpenAI's error object under ``/v1/``."""
        msg = (
            f"the request body {what}, over the limit of {self.max_body} bytes (replaid serve --max-body); "
            "send a smaller request"
        )
        openai = str(scope.get("path", "")).startswith("/v1/")
        data = strict_dumps(error_body(msg) if openai else {"error": msg}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


def load(s: Slot) -> tuple[int, int]:
    """A run's (rows being written, requests waiting): its batcher's, or its worker's (one at a time)."""
    if s.batcher is not None:
        return s.batcher.load()
    with s.lock:
        return min(s.pending, 1), max(s.pending - 1, 0)


def _sse(ev: dict[str, Any]) -> str:
    return f"event: {ev['type']}\ndata: {strict_dumps(ev, separators=(',', ':'))}\n\n"
