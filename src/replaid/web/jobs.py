"""Each served run's queue: one worker thread, at most ``max_queue`` waiting, cancellation by the client.

The playground's ``/api/generate`` and ``/api/edit``, and ``/v1/completions`` on a run without blocks, run
their generations through here (a block run's completions go to its :class:`~replaid.web.batcher.Batcher`:
continuous batching, the same queue bound, 429 and cancellation): :func:`admit` reserves a place or says
the run is busy (HTTP 429), and :func:`submit` runs the work on the run's worker, handing its events to the
event loop through an :class:`asyncio.Queue`; the work sees ``cancelled()`` turn true once the client has
gone (it raises :class:`~replaid.web.engine.Cancelled` at its next step), and a failure becomes one
``error`` event.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from replaid.sampling.errors import RequestError
from replaid.web.engine import Cancelled, Guide

if TYPE_CHECKING:
    from replaid.sampling.request import SampleRequest
    from replaid.store.loading import Run

Emit = Callable[[dict[str, Any]], None]


class Scheduler(Protocol):
    """What the completions endpoint asks of a block run's scheduler (:class:`replaid.web.batcher.Batcher`,
    which builds on this module: a protocol here keeps the import one way)."""

    def admit(self, num: int) -> bool: ...

    def busy(self) -> str: ...

    def load(self) -> tuple[int, int]: ...

    def submit(self, req: SampleRequest) -> tuple[asyncio.Queue[dict[str, Any]], threading.Event]: ...


Work = Callable[[Emit, Callable[[], bool]], None]  # (emit, cancelled) -> None, on the run's worker thread
FINAL = ("done", "error")  # a generation's last event: sent once its place on the run is freed


@dataclass
class Slot:
    """One served run: the loaded model, its single-worker queue and its figures."""

    id: str
    path: Path
    run: Run
    worker: ThreadPoolExecutor
    figures: list[Path] = field(default_factory=list)
    guides: dict[str, Guide] = field(default_factory=dict)  # classifiers for guidance, by id
    batcher: Scheduler | None = None  # a block run's /v1/completions scheduler (continuous batching)
    pending: int = 0  # queued or running generations
    lock: threading.Lock = field(default_factory=threading.Lock)


def read_json(raw: bytes) -> Any:
    """A request body as JSON, or ValueError with one line saying why it cannot be read: not JSON (or not
    UTF-8), nested past the parser's depth, or a number of more digits than Python converts (4300)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the request body is not JSON") from None
    except RecursionError:
        raise ValueError("the request body is nested too deeply to read; send a JSON object of plain values") from None
    except ValueError:  # int("9" * 5000): Python's limit on the digits of an integer
        raise ValueError(
            "the request body holds a number too long to read; send numbers of at most 4300 digits"
        ) from None


def one_line(e: BaseException) -> str:
    """The first line of an error, a request's fields named as the request's (not the CLI's flags)."""
    msg = (e.named() if isinstance(e, RequestError) else str(e)).strip().splitlines()
    return msg[0] if msg else e.__class__.__name__


def admit(s: Slot, max_queue: int) -> int | None:
    """Reserve a place on the run: the generations ahead of it, or None when ``max_queue`` already wait."""
    with s.lock:
        if s.pending >= max_queue + 1:
            return None
        ahead = s.pending
        s.pending += 1
        return ahead


def busy(s: Slot, max_queue: int) -> str:
    """The 429's message."""
    return f"run {s.id!r} is busy: {s.pending - 1} generations are waiting (limit {max_queue}); try again shortly"


def channel() -> tuple[asyncio.Queue[dict[str, Any]], threading.Event, Emit]:
    """A generation's way to its client (called from the event loop): the queue of its events, the event
    set when the client goes, and the ``emit`` that puts an event on the queue from any thread."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def emit(ev: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ev)

    return queue, threading.Event(), emit


def submit(s: Slot, work: Work) -> tuple[asyncio.Queue[dict[str, Any]], threading.Event]:
    """Run ``work`` on the run's worker after an :func:`admit` (called from the event loop). Returns the
    queue of its events (then an ``error`` event if it failed) and the event to set when the client goes.
    The last event (``done`` or ``error``) goes to the queue after the run's place is freed, so a client
    that has read its answer and sends its next request at once is never refused with 429."""
    queue, gone, emit = channel()
    last: list[dict[str, Any]] = []  # the work's final event, held until its place is freed

    def hold(ev: dict[str, Any]) -> None:
        if ev.get("type") in FINAL:
            last[:] = [ev]
        else:
            emit(ev)

    def job() -> None:
        try:
            if not gone.is_set():
                work(hold, gone.is_set)
        except Cancelled:
            pass
        except Exception as e:
            print(f"replaid serve: generation failed on {s.id}: {e!r}", file=sys.stderr)
            last[:] = [{"type": "error", "message": one_line(e)}]
        finally:
            with s.lock:
                s.pending -= 1
            for ev in last:  # after the place is freed: a client that reads the answer may send the next at once
                emit(ev)

    s.worker.submit(job)
    return queue, gone
