"""What ``replaid serve`` tells its operator about ``/v1/completions``: an access log and metrics.

* The access log: one JSON line per request, whatever its end (:meth:`Observer.finish`): ``time`` (UTC, ISO
  8601), ``id`` (the completion's ``cmpl-...``, or the one a refused request would have had), ``model``,
  ``status`` (200; 400, 413 a bad request; 429 refused as busy; 499 the client went away; 500 the
  generation failed), ``ended`` (the samples' finish reasons, ``client gone``, ``busy``, ``bad request``,
  ``error``), ``prompt_tokens``, ``completion_tokens``, ``n``, ``stream``, ``ttft_s`` (time to the first
  committed text, streamed or not; null when none came) and ``latency_s``; ``message`` for an error.
* ``GET /metrics`` in Prometheus' text format, from ``prometheus-client`` (one registry per app):
  ``replaid_requests_total{model,status}``, ``replaid_prompt_tokens_total`` and
  ``replaid_completion_tokens_total{model}``, the histograms ``replaid_time_to_first_token_seconds`` and
  ``replaid_request_latency_seconds{model}``, and, read at each scrape, ``replaid_queue_depth{model}``
  (requests waiting), ``replaid_running_rows{model}`` (samples being written) and
  ``replaid_tokens_per_second{model}`` (completion tokens finished over the last :data:`RATE_WINDOW` s).

A 429 carries ``Retry-After`` (:meth:`Observer.retry_after`): the median latency of the run's last requests,
in whole seconds within [1, 60] (1 before any has finished): about when a place frees.
"""

from __future__ import annotations

import math
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from replaid.schema import dumps as strict_dumps

RATE_WINDOW = 10.0  # seconds of finished requests behind replaid_tokens_per_second
RECENT = 32  # finished requests per run behind Retry-After
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250)
Load = Callable[[], dict[str, tuple[int, int]]]  # run id -> (rows running, requests waiting)


@dataclass
class Record:
    """One request as the server saw it (module docstring)."""

    id: str
    model: str
    stream: bool = False
    n: int = 1
    t0: float = field(default_factory=time.perf_counter)
    first: float | None = None  # perf_counter at the first committed text
    done: bool = False

    def started(self) -> None:
        """The first committed text is out (the first streamed chunk, or the first block written)."""
        if self.first is None:
            self.first = time.perf_counter()


class _Live(Collector):
    """The gauges read at each scrape: queue depth, running rows, recent tokens per second."""

    def __init__(self, observer: Observer):
        self.observer = observer

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queue = GaugeMetricFamily("replaid_queue_depth", "requests waiting for a place", labels=["model"])
        rows = GaugeMetricFamily("replaid_running_rows", "samples being written", labels=["model"])
        rate = GaugeMetricFamily(
            "replaid_tokens_per_second", f"completion tokens finished over the last {RATE_WINDOW:g} s", labels=["model"]
        )
        for model, (running, waiting) in self.observer.load().items():
            queue.add_metric([model], waiting)
            rows.add_metric([model], running)
            rate.add_metric([model], self.observer.tokens_per_second(model))
        yield from (queue, rows, rate)


class Observer:
    """The access log and the metrics of one app (module docstring). ``log``: where the JSON lines go
    (None: nowhere); ``load``: the runs' running rows and waiting requests, read at each scrape."""

    def __init__(self, log: TextIO | None, load: Load):
        self.log, self.load = log, load
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("replaid_requests", "completion requests by end", ["model", "status"], registry=r)
        self.prompt_tokens = Counter(
            "replaid_prompt_tokens", "prompt tokens of answered requests", ["model"], registry=r
        )
        self.completion_tokens = Counter(
            "replaid_completion_tokens", "completion tokens written", ["model"], registry=r
        )
        self.ttft = Histogram(
            "replaid_time_to_first_token_seconds",
            "arrival to the first committed text",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "replaid_request_latency_seconds", "arrival to the end", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        r.register(_Live(self))
        self.lock = threading.Lock()
        self.finished: dict[str, deque[tuple[float, int]]] = {}  # model -> (end time, completion tokens)
        self.recent: dict[str, deque[float]] = {}  # model -> latencies of its last requests

    def finish(
        self,
        rec: Record,
        status: int,
        ended: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        message: str | None = None,
    ) -> None:
        """Count and log a request once, at its end (a second call is ignored)."""
        with self.lock:
            if rec.done:
                return
            rec.done = True
            now = time.perf_counter()
            latency = now - rec.t0
            self.requests.labels(rec.model, str(status)).inc()
            if status == 200 or completion_tokens:
                self.prompt_tokens.labels(rec.model).inc(prompt_tokens)
                self.completion_tokens.labels(rec.model).inc(completion_tokens)
                self.finished.setdefault(rec.model, deque()).append((now, completion_tokens))
            if status == 200:
                self.latency.labels(rec.model).observe(latency)
                self.recent.setdefault(rec.model, deque(maxlen=RECENT)).append(latency)
            ttft = None if rec.first is None else rec.first - rec.t0
            if ttft is not None:
                self.ttft.labels(rec.model).observe(ttft)
        line: dict[str, Any] = {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "id": rec.id,
            "model": rec.model,
            "status": status,
            "ended": ended,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "n": rec.n,
            "stream": rec.stream,
            "ttft_s": None if ttft is None else round(ttft, 4),
            "latency_s": round(latency, 4),
        }
        if message is not None:
            line["message"] = message
        if self.log is not None:
            try:
                self.log.write(strict_dumps(line, separators=(",", ":")) + "\n")
                self.log.flush()
            except (OSError, ValueError) as e:  # a closed or full log never fails a request
                print(f"replaid serve: access log: {e}", file=sys.stderr)

    def tokens_per_second(self, model: str) -> float:
        """Completion tokens of the requests that finished over the last :data:`RATE_WINDOW` seconds, per second."""
        with self.lock:
            q = self.finished.get(model, deque())
            cut = time.perf_counter() - RATE_WINDOW
            while q and q[0][0] < cut:
                q.popleft()
            return sum(n for _, n in q) / RATE_WINDOW

    def retry_after(self, model: str) -> int:
        """Whole seconds a refused client should wait (module docstring)."""
        with self.lock:
            recent = list(self.recent.get(model, ()))
        return 1 if not recent else min(60, max(1, math.ceil(statistics.median(recent))))

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (``GET /metrics``)."""
        return generate_latest(self.registry)
