"""``POST /v1/completions`` and ``GET /v1/models``: an OpenAI-compatible text-completion endpoint.

A request is OpenAI's (``model``: a served run's id, ``prompt``: a string, ``max_tokens`` (16), ``stop``: a
string or a list of at most 4, ``seed`` (absent: a random one), ``n``, ``stream``, ``temperature``), plus
every other option of :class:`~replaid.sampling.request.SampleRequest` but :data:`NOT_ON_V1`, under its own
name: ``steps`` (sampling steps, a block run's per block; default: a distilled student's own steps, which
it is served with, with its own sampler (DDIM, or consistency sampling), else 64; AR reads none),
``sampler``, ``score_temperature``, ``self_cond`` and ``ignore_eos`` (as vLLM's), each with its one
declared range.
It becomes a :class:`~replaid.sampling.request.SampleRequest` (``max_tokens``, ``stop``, ``num`` = ``n``),
checked by the server's bounds and :meth:`SampleRequest.check`, and is written by
:class:`~replaid.sampling.stream.Completion`:

* a block-diffusion run writes block by block up to ``replaid serve --max-tokens`` tokens (default 8 x its
  ``data.seq_len``, past it with a sliding window); ``stream: true`` sends one ``text_completion`` chunk per
  committed block (a choice per unfinished sample), then ``data: [DONE]``;
* an AR run is served the same way with blocks of one token (its KV cache, the window keeping the last
  ``data.seq_len - 1`` tokens): any length, one chunk per token, requests joining at every token;
* any other run writes its ``data.seq_len`` tokens at once, so ``max_tokens`` is at most that less the
  prompt's tokens (else HTTP 400 saying so); a stream is then one chunk;
* ``temperature`` (0 to 2; 0 greedy) is the request's logit temperature: MDLM's (and Duo's, AR's) tempered
  probabilities; for RePlaid/Plaid the temperature of the denoiser's logits (``replaid sample
  --temperature``), its score temperature staying 1.

OpenAI's other fields are accepted at their defaults only (``top_p`` 1, ``echo`` false, ``logprobs``,
``suffix``, ``logit_bias`` absent, the penalties 0, ``best_of`` 1, ``user`` any; a number never as a bool, a
bool never as a number); anything else is HTTP 400, as is a body that cannot be read as JSON (not JSON, nested
too deeply, a number of more than 4300 digits). Errors (413 over ``replaid serve --max-body``, 404 and 405
for what is not served under ``/v1/`` too) are OpenAI's
``{"error": {"message", "type": "invalid_request_error", "param", "code": null}}``; the run's queue keeps the playground's bound, 429 and cancellation of a client that goes away.

Continuous batching (a block-diffusion or AR run; :mod:`replaid.web.batcher`): the run's scheduler thread writes
one running batch block by block, and a request that arrives while others run joins it at the next block
boundary (up to ``replaid serve --max-batch`` samples, default 16; requests whose sampler, steps or
temperatures differ from the batch's wait until it has emptied). Each committed block goes to its own client
at once; a request leaves the batch when it has finished, or at the next boundary once its client has gone.
Each request draws its noise from its own generator seeded with its ``seed``, so its answer is the one it
gets alone, whatever shares its batch. At most ``--max-queue`` requests wait beyond the batch; one more gets
HTTP 429. Any other run (one pass of its length) runs its requests one at a time on the run's worker (:mod:`replaid.web.jobs`:
at most ``--max-queue`` waiting, 429 beyond, a client that goes away cancels its generation at the next step).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
import typing
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from replaid.config import TEMPERATURE_RANGE
from replaid.sampling.display import visible
from replaid.sampling.errors import RequestError
from replaid.sampling.request import SampleRequest, field_types, knobs
from replaid.sampling.stream import Completion
from replaid.schema import dumps as strict_dumps
from replaid.web.batcher import done_event
from replaid.web.engine import Cancelled, Limits
from replaid.web.jobs import Emit, Slot, Work, admit, busy, read_json, submit
from replaid.web.observe import Observer, Record

if TYPE_CHECKING:
    from replaid.sampling.contract import StepInfo
    from replaid.store.loading import Run

DEFAULTS = {  # OpenAI fields accepted at these values only
    "top_p": (1, 1.0, None),
    "echo": (False, None),
    "logprobs": (None, 0),
    "suffix": (None, ""),
    "logit_bias": (None,),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "best_of": (1, None),
    "stream_options": (None,),
}
OPENAI_TEMPERATURE_MAX = 2.0  # OpenAI's API: temperature in [0, 2]; within the request's own declared range
DEFAULT_STEPS = 64  # ``steps`` when a request names none and the run is no distilled student
SERVED = "GET /v1/models and POST /v1/completions"  # the OpenAI endpoints (a 404/405 under /v1/ names them)
NAMES = {"num": "n"}  # the request's fields that OpenAI names otherwise
# SampleRequest's knobs (its declared options: sampling/request.py) that this endpoint does not take, and why;
# every other knob is a field here under its OpenAI name, read with its one declared type and range
NOT_ON_V1 = {
    "batch_size": "the server batches requests itself (n is the number of samples)",
    "length": "a completion's size is max_tokens",
    "allow_longer": "a completion's size is max_tokens",
    "trajectory": "a completion sends its text, not the sampler's frames (the playground's /api/generate does)",
    "context": "infilling is the playground's (/api/generate)",
    "infill": "infilling is the playground's (/api/generate)",
    "infill_chars": "infilling is the playground's (/api/generate)",
    "require": "guidance is the playground's (/api/generate)",
    "guide": "guidance is the playground's (/api/generate), which names each run's classifiers",
    "guidance_scale": "guidance is the playground's (/api/generate)",
}
OWN = ("model", "stream", "user")  # OpenAI's fields that are no option of the request


def v1_knobs() -> tuple[str, ...]:
    """The :class:`SampleRequest` fields this endpoint takes (read from the declarations at each call)."""
    return tuple(k for k in knobs() if k not in NOT_ON_V1)


def v1_fields() -> set[str]:
    """Every field a request body may hold (besides OpenAI's fields taken at their defaults only)."""
    return {*OWN, *(NAMES.get(k, k) for k in v1_knobs())}


class ApiError(ValueError):
    """A bad request: HTTP ``status`` with OpenAI's error object naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.param, self.kind), status_code=self.status)


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _at_default(v: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether ``v`` is one of ``allowed``, a bool only as a bool (``true`` is no ``best_of`` 1, ``0`` no
    ``echo`` false), as ``stream`` and ``ignore_eos`` take only true or false."""
    return any(v == d and isinstance(v, bool) == isinstance(d, bool) for d in allowed)


def _json_value(name: str, v: Any, typ: Any) -> Any:
    """``v`` as a value of the declared type ``typ`` of a :class:`SampleRequest` field (OpenAI's name ``name``),
    JSON's types taken strictly: a number is never a bool nor a bool a number, a string list (``stop``) may be
    one string; else an :class:`ApiError` naming the field."""
    args = typing.get_args(typ)
    base = next((a for a in args if a is not type(None)), typ) if args and type(None) in args else typ
    if v is None and type(None) in args:
        return None
    if base is int:
        ok, what = _is_int(v), "an integer"
    elif base is float:
        ok, what = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
        v = float(v) if ok else v
    elif base is bool:
        ok, what = isinstance(v, bool), "true or false"
    elif base is str:
        ok, what = isinstance(v, str), "a string"
    elif typing.get_origin(base) is tuple:
        v = [v] if isinstance(v, str) else v
        ok, what = isinstance(v, list) and all(isinstance(x, str) for x in v), "a string or a list of strings"
        v = tuple(v) if ok else v
    else:  # a knob of a type this endpoint cannot read from JSON: a declaration to extend here
        raise ApiError(f"{name}: a field of type {typ} is not read by this endpoint", name)
    if not ok:
        raise ApiError(f"{name} must be {what}, got {strict_dumps(v)}", name)
    return v


def request_of(body: Any, slots: dict[str, Slot]) -> tuple[Slot, SampleRequest, bool]:
    """The run, the :class:`SampleRequest` and ``stream`` of an OpenAI completion body: every knob of the
    request but :data:`NOT_ON_V1` under its OpenAI name (types only; the values are checked by :func:`check`
    against their one declared range), with OpenAI's defaults and its own temperature range [0, 2]."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    for k in sorted(body):
        if k in DEFAULTS:
            if not _at_default(body[k], DEFAULTS[k]):
                raise ApiError(f"{k} is not supported by this server (leave it out)", k)
        elif k not in v1_fields():
            raise ApiError(f"unknown field {k!r}; this server reads {', '.join(sorted(v1_fields()))}", k)
    model = body.get("model")
    if not isinstance(model, str) or model not in slots:  # (a list or an object is no model id either)
        shown = repr(model) if isinstance(model, str) else strict_dumps(model)
        what = "no model" if model is None else f"unknown model {shown[:80]}"
        raise ApiError(f"{what}; this server serves {', '.join(slots)} (give one as model)", "model")
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError("prompt must be a string (one prompt per request; n asks for several samples)", "prompt")
    run: Run = slots[model].run
    defaults = {  # OpenAI's (and, for steps and the sampler, a distilled student's own)
        "sampler": run.default_sampler,  # a distilled student's own (None: the method's first)
        "steps": run.default_steps or DEFAULT_STEPS,
        "max_tokens": 16,
        "num": 1,
        "seed": secrets.randbelow(2**63),
    }
    hints = field_types(SampleRequest)
    kw: dict[str, Any] = {}
    for k in v1_knobs():  # absent or null: OpenAI's default above, else the request's own
        name = NAMES.get(k, k)
        if k == "prompt":
            kw[k] = prompt or None
        elif body.get(name) is not None:
            kw[k] = _json_value(name, body[name], hints[k])
        elif k in defaults:
            kw[k] = defaults[k]
    temperature = kw.get("temperature", SampleRequest.temperature)
    if not 0 <= temperature <= OPENAI_TEMPERATURE_MAX:
        raise ApiError(
            f"temperature must be between 0 and {OPENAI_TEMPERATURE_MAX:g} (OpenAI's range for /v1/completions; "
            f"replaid sample and the playground take 0 or [{TEMPERATURE_RANGE[0]:g}, {TEMPERATURE_RANGE[1]:g}]), "
            f"got {temperature}",
            "temperature",
        )
    req = SampleRequest(**kw, batch_size=kw.get("num", 1), progress=False)
    stream = body.get("stream")
    return slots[model], req, False if stream is None else bool(_json_value("stream", stream, bool))


def check(s: Slot, req: SampleRequest, limits: Limits) -> None:
    """The server's bounds and :meth:`SampleRequest.check` (the CLI's messages, fields in OpenAI's names)."""
    run: Run = s.run
    L = run.cfg.data.seq_len
    if not 1 <= req.num <= limits.max_samples:
        raise ApiError(f"n must be between 1 and {limits.max_samples}, got {req.num}", "n")
    bounds = limits.request_limits()
    bounds = type(bounds)(**{**bounds.__dict__, "max_tokens": limits.max_tokens or None})
    try:
        bounds.check(req, L)
        req.check(run.method, run.tokenizer, L)
    except ValueError as e:

        def name(f: str) -> str:
            return NAMES.get(f, f)

        msg = (e.render(name) if isinstance(e, RequestError) else str(e)).strip().splitlines()[0]
        first = (
            name(e.fields[0])
            if isinstance(e, RequestError) and e.fields and msg.startswith(name(e.fields[0]))
            else None
        )
        param = first if first is not None and first in {NAMES.get(k, k) for k in v1_knobs()} else None
        param = "prompt" if param is None and msg.startswith("the prompt") else param
        raise ApiError(msg, param) from None


def _chunk(cid: str, created: int, model: str, choices: list[dict[str, Any]]) -> str:
    obj = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices}
    return f"data: {strict_dumps(obj, separators=(',', ':'))}\n\n"


def _work(s: Slot, req: SampleRequest) -> Work:
    """A run without blocks: the request alone on the run's worker, cancelled at the next step once its
    client has gone."""

    def work(emit: Emit, cancelled: Callable[[], bool]) -> None:
        def step(_info: StepInfo) -> None:  # every sampler step: stop once the client has gone
            if cancelled():
                raise Cancelled()

        comp = Completion(s.run, req, callback=step)
        for deltas in comp:
            emit({"type": "block", "choices": [d.__dict__ for d in deltas]})
        emit(done_event(comp))

    return work


def add_completions(app: FastAPI, slots: dict[str, Slot], limits: Limits, observer: Observer) -> None:
    """Registers ``GET /v1/models`` and ``POST /v1/completions`` (module docstring) on ``app``, each request's
    end told to ``observer`` (the access log and the metrics, :mod:`replaid.web.observe`)."""

    @app.exception_handler(StarletteHTTPException)
    async def v1_errors(request: Request, exc: StarletteHTTPException) -> Response:
        """A path under ``/v1/`` that is not served, or not with this method (404, 405): OpenAI's error
        object saying what is; FastAPI's own answer elsewhere (the playground's)."""
        if not request.url.path.startswith("/v1/"):
            return await http_exception_handler(request, exc)
        msg = f"{request.method} {request.url.path}: {exc.detail}; this server serves {SERVED}"
        return JSONResponse(error_body(msg), status_code=exc.status_code, headers=exc.headers)

    @app.get("/v1/models", response_model=None)  # the return annotation is for mypy, not a response model
    def models() -> dict[str, Any]:
        data = [{"id": k, "object": "model", "created": 0, "owned_by": "replaid"} for k in slots]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", response_model=None)  # the return annotation is for mypy, not a response model
    async def completions(request: Request) -> Response | dict[str, Any]:
        rec = Record(f"cmpl-{uuid.uuid4().hex}", "")
        try:
            body = read_json(await request.body())
        except ValueError as e:
            return _refused(observer, rec, ApiError(str(e)))
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            rec.model = body["model"][:80]
        try:
            s, req, stream = request_of(body, slots)
            check(s, req, limits)
        except ApiError as e:
            return _refused(observer, rec, e)
        rec.stream, rec.n = stream, req.num
        if s.batcher is not None:  # a block run: the request joins the running batch at a block boundary
            if not s.batcher.admit(req.num):
                return _refused(observer, rec, ApiError(s.batcher.busy(), None, 429, "rate_limit_error"))
            queue, gone = s.batcher.submit(req)
        else:
            if admit(s, limits.max_queue) is None:
                return _refused(observer, rec, ApiError(busy(s, limits.max_queue), None, 429, "rate_limit_error"))
            queue, gone = submit(s, _work(s, req))
        pending = Pending(queue, gone, rec, s.id, limits, observer)
        return _streamed(pending) if stream else await _whole(request, pending)


def _refused(observer: Observer, rec: Record, e: ApiError) -> JSONResponse:
    """A request answered with an error before it ran: logged, and a 429 told when to come back."""
    ended = "busy" if e.status == 429 else "bad request"
    observer.finish(rec, e.status, ended, message=str(e))
    res = e.response()
    if e.status == 429:
        res.headers["Retry-After"] = str(observer.retry_after(rec.model))
    return res


def _answered(observer: Observer, rec: Record, ev: dict[str, Any]) -> None:
    reasons = sorted({str(f) for _, f in ev["texts"]})
    observer.finish(rec, 200, ",".join(reasons), ev["prompt_tokens"], ev["completion_tokens"])


@dataclass
class Pending:
    """A request on its way: its events, the flag to set when its client goes, its access-log record, the run
    it asked (``model``), and the server's limits and observer."""

    queue: asyncio.Queue[dict[str, Any]]
    gone: threading.Event
    rec: Record
    model: str
    limits: Limits
    observer: Observer


def _streamed(p: Pending) -> StreamingResponse:
    """The completion as OpenAI's stream: a chunk per committed block, then ``[DONE]`` (or an error chunk)."""
    created = int(time.time())
    queue, gone, rec, limits, observer = p.queue, p.gone, p.rec, p.limits, p.observer

    async def events() -> AsyncIterator[str]:
        try:
            while True:
                ev = await queue.get()
                if ev["type"] == "block":
                    choices = [
                        {
                            "text": visible(c["text"], limits.raw),
                            "index": c["index"],
                            "logprobs": None,
                            "finish_reason": c["finish_reason"],
                        }
                        for c in ev["choices"]
                    ]
                    rec.started()
                    yield _chunk(rec.id, created, p.model, choices)
                elif ev["type"] == "error":  # logged before the last bytes: a client that has them finds the line
                    observer.finish(rec, 500, "error", message=ev["message"])
                    yield f"data: {strict_dumps(error_body(ev['message'], None, 'server_error'))}\n\n"
                    break
                else:
                    _answered(observer, rec, ev)
                    yield "data: [DONE]\n\n"
                    break
        finally:
            gone.set()
            observer.finish(rec, 499, "client gone")  # (nothing when it ended above)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def _whole(request: Request, p: Pending) -> Response | dict[str, Any]:
    """The completion as one JSON answer once it is done; a client gone while waiting ends it (499)."""
    created = int(time.time())
    queue, gone, rec, limits, observer = p.queue, p.gone, p.rec, p.limits, p.observer
    try:
        while True:
            try:
                ev = await asyncio.wait_for(queue.get(), 0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    observer.finish(rec, 499, "client gone")
                    return JSONResponse(error_body("the client went away"), status_code=499)
                continue
            if ev["type"] == "block":
                rec.started()
            elif ev["type"] == "done":
                break
            elif ev["type"] == "error":
                observer.finish(rec, 500, "error", message=ev["message"])
                return JSONResponse(error_body(ev["message"], None, "server_error"), status_code=500)
    finally:
        gone.set()
    choices = [
        {"text": visible(t, limits.raw), "index": k, "logprobs": None, "finish_reason": f}
        for k, (t, f) in enumerate(ev["texts"])
    ]
    P, C = ev["prompt_tokens"], ev["completion_tokens"]
    _answered(observer, rec, ev)
    return {
        "id": rec.id,
        "object": "text_completion",
        "created": created,
        "model": p.model,
        "choices": choices,
        "usage": {"prompt_tokens": P, "completion_tokens": C, "total_tokens": P + C},
    }
