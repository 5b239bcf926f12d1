"""A load run of ``replaid serve``'s ``POST /v1/completions`` (issue 39 §4, "The service"): N concurrent
streaming clients, then an excess wave beyond the run's queue, with time to first chunk, latency,
tokens/s and the server's memory.

What it does, in order:

1. starts ``replaid serve RUN`` as a subprocess on a free loopback port (``--max-batch``, ``--max-queue``,
   ``--threads``, ``--device`` passed on; ``--max-tokens`` set to the clients' ``max_tokens``), its stderr
   to ``OUT/server.log``, and waits for ``GET /v1/models``;
2. reads the server's settings (``GET /api/runs``: its limits, the run's method, block size, seq_len) and
   the server process's resident memory (RSS, psutil or /proc) when ready;
3. one warm-up request (a short streamed completion; ``--no-warmup`` skips it), then the RSS "before";
4. the main wave: ``--clients`` threads released together, each a streamed completion through the
   official ``openai`` client (``max_retries=0``) with ``max_tokens`` M, its own seed (``--seed`` + k)
   and ``ignore_eos`` (each asks for exactly M tokens; ``--eos`` lets a sample stop at end of text);
5. once every main client has its answer's headers (200: admitted, or 429: refused), the excess wave:
   ``--excess`` more requests at once; with the defaults (``--max-batch`` clients, ``--max-queue`` 0: on a
   block run the main wave is one running batch, continuous batching, and fills the server's capacity; a
   run without blocks runs one at a time, so there give ``--max-queue`` clients - 1) each should get HTTP 429
   with OpenAI's error body;
   an excess request that gets in (a place freed up) is streamed and counted like the others;
6. after the last client: the RSS "after" (and the peak, sampled every ``--sample-every`` s over the
   run), the server's CPU seconds over the load, and whether it still answers.

Per client: the HTTP status, the time to the response's headers, to the first chunk (TTFC: the first
committed block) and to the last (total), the chunks and the completion tokens (exact when the sample
ends at ``max_tokens``, ``finish_reason`` "length"; with ``--eos`` a sample that stopped early is counted
by the run's tokenizer from its text, marked ``tokens_exact: false``). All times are wall-clock seconds
from the moment that request was sent. Summary: p50/p95 TTFC and total latency over the main wave's
completed streams (linear interpolation between order statistics, numpy's default), aggregate tokens/s
(the main wave's completion tokens over the wall time from its release to its last stream's end), the
per-stream rate after the first chunk, the counts of 200 / 429 / other per wave, and how fast the
refusals came.

Writes ``OUT/load_serve.json`` (``meta``: date, hardware, torch, the command, the server's command and
settings; ``clients``: the records; ``summary``; ``problems``) and ``OUT/load_serve.md``, prints progress as
it goes. Exit status 0, 1 when a check failed (``problems``) or the server died, 2 on bad input (one line
``replaid: error: ...``).

    python benchmarks/load_serve.py runs/mdlm-b16 --clients 16 --max-tokens 128 --excess 4 --out load/mdlm
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARMUP_SEED = 2**31 - 1


class UsageError(Exception):
    """Bad input: one ``replaid: error:`` line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override,unused-ignore]
        raise UsageError(message)


def log(msg: str) -> None:
    print(f"[load_serve {datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- the server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process (psutil if installed, else /proc), None when it is gone."""
    try:
        import psutil

        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None
    except ImportError:
        pass
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        import psutil

        try:
            t = psutil.Process(pid).cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return None
    except ImportError:
        pass
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class RssMonitor:
    """Samples a process's RSS every ``every`` seconds in a thread: the peak over its life."""

    def __init__(self, pid: int, every: float):
        self.pid, self.every, self.peak, self.samples = pid, every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            r = rss_bytes(self.pid)
            if r is not None:
                self.peak, self.samples = max(self.peak, r), self.samples + 1
            self._stop.wait(self.every)

    def __enter__(self) -> RssMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def server_command(a: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "replaid", "serve", a.run, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--device", a.device, "--threads", str(a.threads), "--max-queue", str(a.max_queue)]
    cmd += ["--max-batch", str(a.max_batch), "--access-log", str(Path(a.out) / "access.jsonl")]
    return cmd + ["--max-tokens", str(a.max_tokens), "--max-steps", str(max(1024, a.steps))]


def server_side(path: Path, skip: int = 0) -> dict[str, Any]:
    """The server's own figures from its access log (one JSON line per request, ``replaid serve --access-log``),
    its first ``skip`` lines (the warm-up) left out: requests by status, time to first token and latency
    p50/p95 of the answered ones, completion tokens."""
    rows = [json.loads(x) for x in path.read_text().splitlines()[skip:] if x.strip()] if path.is_file() else []
    ok = [r for r in rows if r["status"] == 200]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    lat = [r["latency_s"] for r in ok]
    by: dict[str, int] = {}
    for r in rows:
        by[str(r["status"])] = by.get(str(r["status"]), 0) + 1
    return {
        "requests": len(rows),
        "by_status": by,
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p95_s": _r(percentile(ttft, 95)),
        "latency_p50_s": _r(percentile(lat, 50)),
        "latency_p95_s": _r(percentile(lat, 95)),
        "completion_tokens": sum(r["completion_tokens"] for r in ok),
    }


def wait_ready(srv: subprocess.Popen, base: str, timeout: float, log_path: Path) -> float:
    """Seconds until ``GET /v1/models`` answers; RuntimeError (with the server's last lines) if it dies."""
    import httpx

    t0 = time.perf_counter()
    while True:
        if srv.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"the server exited with status {srv.returncode}: " + " | ".join(tail))
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"the server did not answer within --startup-timeout {timeout:g} s (see {log_path})")
        time.sleep(0.2)


# ---------------------------------------------------------------- clients


def status_of(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status or None, outcome) of a failed request: ``rate_limited`` (429), ``http_error`` (another
    status), ``stream_error`` (an error event inside a 200 stream), ``connection_error``, ``timeout``."""
    import openai

    if isinstance(e, openai.APIStatusError):
        return e.status_code, "rate_limited" if e.status_code == 429 else "http_error"
    if isinstance(e, openai.APITimeoutError):
        return None, "timeout"
    if isinstance(e, openai.APIConnectionError):
        return None, "connection_error"
    return None, "stream_error"


def error_fields(e: BaseException) -> dict[str, Any]:
    """OpenAI's error object of a failed request (``type``, ``message``, ``param``, ``code``), as sent, and
    the answer's ``Retry-After`` header (None: not sent)."""
    body = getattr(e, "body", None)
    response = getattr(e, "response", None)
    if isinstance(body, dict):
        return {
            "retry_after": None if response is None else response.headers.get("retry-after"),
            "error_type": body.get("type"),
            "error_message": body.get("message"),
            "error_param": body.get("param"),
            "error_code": body.get("code"),
            "error_keys": sorted(body),
        }
    return {"error_type": type(e).__name__, "error_message": str(e).splitlines()[0] if str(e) else ""}


def one_client(client: Any, model: str, wave: str, k: int, body: dict, counter: Any, admitted: Any) -> dict:
    """One streamed completion; its record (module docstring). ``admitted`` is called once the request's
    headers (or its refusal) are in; ``counter(text)`` counts a stopped sample's tokens."""
    rec: dict[str, Any] = {"wave": wave, "k": k, "seed": body["seed"], "status": None, "outcome": None}
    rec.update(headers_s=None, ttfc_s=None, total_s=None, chunks=0, tokens=0, tokens_exact=True, finish_reason=None)
    extra = {key: v for key, v in body.items() if key not in ("seed", "max_tokens", "prompt", "temperature")}
    t0 = time.perf_counter()
    rec["sent_pc"] = t0
    text: list[str] = []
    try:
        try:
            stream = client.completions.create(
                model=model,
                prompt=body["prompt"],
                max_tokens=body["max_tokens"],
                seed=body["seed"],
                temperature=body["temperature"],
                stream=True,
                extra_body=extra,
            )
        finally:
            rec["headers_s"] = time.perf_counter() - t0
            admitted()
        rec["status"] = 200
        for chunk in stream:
            now = time.perf_counter() - t0
            if rec["ttfc_s"] is None:
                rec["ttfc_s"] = now
            rec["chunks"] += 1
            for c in chunk.choices:
                text.append(c.text)
                rec["finish_reason"] = c.finish_reason or rec["finish_reason"]
        rec["total_s"] = time.perf_counter() - t0
        if rec["finish_reason"] is None:
            rec["outcome"] = "stream_error"
            rec["error_message"] = "the stream ended without a finish_reason"
        else:
            rec["outcome"] = "ok"
            if rec["finish_reason"] == "length":
                rec["tokens"] = body["max_tokens"]
            else:
                rec["tokens"], rec["tokens_exact"] = counter("".join(text)), False
    except Exception as e:
        if rec["status"] == 200:  # it failed inside the stream
            rec["outcome"] = "stream_error"
        else:
            rec["status"], rec["outcome"] = status_of(e)
        rec["total_s"] = time.perf_counter() - t0
        rec.update(error_fields(e))
    rec["text_chars"] = sum(map(len, text))
    return {key: round(v, 4) if isinstance(v, float) else v for key, v in rec.items()}


class Wave:
    """One thread per request, released together when the wave is made; :meth:`headers_in` waits until
    every request has its answer's headers (or its refusal), :meth:`join` until every one has ended.
    ``on_done(record)`` is called as each ends."""

    def __init__(self, client: Any, model: str, name: str, bodies: list[dict], counter: Any, on_done: Any):
        self.records: list[dict | None] = [None] * len(bodies)
        self._heads = threading.Semaphore(0)
        gate = threading.Barrier(len(bodies) + 1)

        def go(k: int) -> None:
            gate.wait()
            r = one_client(client, model, name, k, bodies[k], counter, self._heads.release)
            self.records[k] = r
            on_done(r)

        self._threads = [threading.Thread(target=go, args=(k,), daemon=True) for k in range(len(bodies))]
        for t in self._threads:
            t.start()
        gate.wait()
        self.t0 = time.perf_counter()

    def headers_in(self) -> None:
        for _ in self._threads:
            self._heads.acquire()

    def join(self) -> list[dict]:
        for t in self._threads:
            t.join()
        return [r for r in self.records if r is not None]


# ---------------------------------------------------------------- summary and checks


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bucket(status: int | None) -> str:
    return "200" if status == 200 else "429" if status == 429 else "other"


def _r(x: float | None, n: int = 3) -> float | None:
    return None if x is None else round(x, n)


def summarize(records: list[dict], main_wall_s: float | None) -> dict:
    """The summary of the records (module docstring)."""
    out: dict[str, Any] = {"requests": len(records), "counts": {}}
    for w in ("main", "excess", "all"):
        rs = [r for r in records if w == "all" or r["wave"] == w]
        c = {"200": 0, "429": 0, "other": 0}
        for r in rs:
            c[bucket(r["status"])] += 1
        out["counts"][w] = {**c, "total": len(rs), "completed": sum(r["outcome"] == "ok" for r in rs)}
    ok = [r for r in records if r["wave"] == "main" and r["outcome"] == "ok"]
    ttfc = [r["ttfc_s"] for r in ok]
    total = [r["total_s"] for r in ok]
    tokens = sum(r["tokens"] for r in ok)
    rates = [r["tokens"] / (r["total_s"] - r["ttfc_s"]) for r in ok if r["total_s"] > r["ttfc_s"]]
    out.update(
        ttfc_p50_s=_r(percentile(ttfc, 50)),
        ttfc_p95_s=_r(percentile(ttfc, 95)),
        ttfc_min_s=_r(min(ttfc, default=None)),
        ttfc_max_s=_r(max(ttfc, default=None)),
        total_p50_s=_r(percentile(total, 50)),
        total_p95_s=_r(percentile(total, 95)),
        total_max_s=_r(max(total, default=None)),
        main_wall_s=_r(main_wall_s),
        completion_tokens=tokens,
        tokens_exact=all(r["tokens_exact"] for r in ok),
        tokens_per_s=_r(tokens / main_wall_s, 2) if main_wall_s and tokens else None,
        stream_tokens_per_s_p50=_r(percentile(rates, 50), 2),
    )
    refused = [r for r in records if r["wave"] == "excess" and r["status"] == 429]
    out["excess_429_s_p50"] = _r(percentile([r["total_s"] for r in refused], 50), 4)
    out["excess_429_s_max"] = _r(max((r["total_s"] for r in refused), default=None), 4)
    out["excess_429_body"] = (
        {k: refused[0].get(f"error_{k}") for k in ("type", "message", "param", "code")} if refused else None
    )
    out["excess_429_retry_after"] = refused[0].get("retry_after") if refused else None
    return out


def check(report: dict) -> list[str]:
    """What must hold of a report; each breach one line (``problems``). The counts are recomputed here from
    the records, not read from the summary."""
    problems: list[str] = []
    recs, summ, meta = report["clients"], report["summary"], report["meta"]
    for w, n in (("main", meta["clients"]), ("excess", meta["excess"])):
        rs = [r for r in recs if r["wave"] == w]
        if len(rs) != n:
            problems.append(f"{w} wave: {len(rs)} records for {n} requests")
        c = summ["counts"][w]
        n200 = sum(r["status"] == 200 for r in rs)
        n429 = sum(r["status"] == 429 for r in rs)
        if (c["200"], c["429"], c["other"]) != (n200, n429, len(rs) - n200 - n429):
            problems.append(f"{w} wave: counts {c} do not match the records ({n200} x 200, {n429} x 429)")
        if c["200"] + c["429"] + c["other"] != c["total"] or c["total"] != n:
            problems.append(f"{w} wave: counts {c} do not add up to its {n} requests")
    for r in recs:
        who = f"{r['wave']} client {r['k']} (status {r['status']})"
        if r["status"] == 200 and r["outcome"] == "ok":
            if not r["chunks"] or r["ttfc_s"] is None or r["finish_reason"] is None or r["tokens"] <= 0:
                problems.append(f"{who}: a completed 200 without chunks, a first chunk, a finish reason or tokens")
            elif not 0 < r["headers_s"] <= r["ttfc_s"] <= r["total_s"]:
                problems.append(
                    f"{who}: times out of order (headers {r['headers_s']}, first chunk "
                    f"{r['ttfc_s']}, total {r['total_s']})"
                )
            elif r["finish_reason"] == "length" and r["tokens"] != meta["max_tokens"]:
                problems.append(f"{who}: finish_reason length with {r['tokens']} tokens, not {meta['max_tokens']}")
        elif r["status"] == 200:
            if r["outcome"] != "stream_error":
                problems.append(f"{who}: outcome {r['outcome']} for a 200")
        elif r["chunks"] or r["ttfc_s"] is not None:
            problems.append(f"{who}: chunks received on a refused request")
        if r["status"] == 429 and (r.get("error_type") != "rate_limit_error" or r.get("error_keys") != KEYS):
            problems.append(f"{who}: not OpenAI's rate-limit error body ({r.get('error_type')}, {r.get('error_keys')})")
        if r["status"] == 200 and r.get("error_type") == "rate_limit_error":
            problems.append(f"{who}: a rate-limit error counted as 200")
    ok = summ["counts"]["main"]["completed"]
    if ok and (summ["tokens_per_s"] is None or summ["tokens_per_s"] <= 0):
        problems.append(f"tokens_per_s is {summ['tokens_per_s']} with {ok} completed streams")
    for a, b in (("ttfc_p50_s", "ttfc_p95_s"), ("total_p50_s", "total_p95_s"), ("ttfc_p50_s", "total_p50_s")):
        if summ[a] is not None and summ[b] is not None and summ[a] > summ[b]:
            problems.append(f"{a} {summ[a]} > {b} {summ[b]}")
    if not ok:
        problems.append("no stream of the main wave completed")
    return problems


KEYS = ["code", "message", "param", "type"]


# ---------------------------------------------------------------- hardware, report


def hardware() -> dict:
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    avail: int | None
    try:
        avail = len(os.sched_getaffinity(0))
    except AttributeError:
        avail = os.cpu_count()
    mem = None
    try:
        import psutil

        mem = int(psutil.virtual_memory().total)
    except ImportError:
        pass
    return {"cpu": model, "cpu_count": os.cpu_count(), "cpus_available": avail, "memory_bytes": mem}


def version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
        return p.stdout.strip() or None
    except OSError:
        return None


def mib(b: int | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)


def markdown(report: dict) -> str:
    m, s, srv = report["meta"], report["summary"], report["server"]
    hw = m["hardware"]
    run = srv.get("run") or {}

    def f(x: Any, unit: str = "") -> str:
        return "-" if x is None else f"{x:g}{unit}" if isinstance(x, (int, float)) else str(x)

    c = s["counts"]
    rows = [
        ("clients (main wave) x max_tokens", f"{m['clients']} x {m['max_tokens']} (steps per block {m['steps']})"),
        ("main wave: 200 / 429 / other", f"{c['main']['200']} / {c['main']['429']} / {c['main']['other']}"),
        ("time to first chunk p50 / p95", f"{f(s['ttfc_p50_s'], ' s')} / {f(s['ttfc_p95_s'], ' s')}"),
        ("total latency p50 / p95", f"{f(s['total_p50_s'], ' s')} / {f(s['total_p95_s'], ' s')}"),
        (
            "aggregate tokens/s",
            f"{f(s['tokens_per_s'])} ({s['completion_tokens']} tokens in {f(s['main_wall_s'], ' s')})",
        ),
        ("one stream's tokens/s after its first chunk, p50", f(s["stream_tokens_per_s_p50"])),
        ("excess wave: 200 / 429 / other", f"{c['excess']['200']} / {c['excess']['429']} / {c['excess']['other']}"),
        ("excess: time to its 429, p50 / max", f"{f(s['excess_429_s_p50'], ' s')} / {f(s['excess_429_s_max'], ' s')}"),
        (
            "server RSS ready / before / peak / after",
            " / ".join(f(mib(srv[k]), " MiB") for k in ("rss_ready", "rss_before", "rss_peak", "rss_after")),
        ),
        ("server CPU seconds over the load", f(srv["cpu_s_load"])),
    ]
    log_ = report.get("server_log")
    if log_:  # the server's own access log beside the clients' figures
        rows += [
            ("server's log: requests by status", ", ".join(f"{k}: {v}" for k, v in sorted(log_["by_status"].items()))),
            (
                "server's log: time to first token p50 / p95",
                f"{f(log_['ttft_p50_s'], ' s')} / {f(log_['ttft_p95_s'], ' s')}",
            ),
            ("server's log: latency p50 / p95", f"{f(log_['latency_p50_s'], ' s')} / {f(log_['latency_p95_s'], ' s')}"),
        ]
    body = s.get("excess_429_body")
    lines = [
        f"# Load run of replaid serve: {m['clients']} streaming clients — {m['date']}",
        "",
        f"Run `{m['run']}` ({run.get('method')}, block size {run.get('block_size')}, seq_len {run.get('seq_len')}, "
        f"step {run.get('step')}). Hardware: {hw['cpu']}, {hw['cpus_available']} of {hw['cpu_count']} CPUs; "
        f"load average {m['loadavg_before']} before. torch {m['torch']}, replaid {m['git']}.",
        "",
        f"Command: `{m['command']}`",
        "",
        f"Server: `{' '.join(srv['command'])}`; limits {json.dumps(srv.get('limits'))}.",
        "",
        "| measure | value |",
        "|---|---|",
        *[f"| {a} | {b} |" for a, b in rows],
        "",
    ]
    if body:
        ra = s.get("excess_429_retry_after")
        lines += [
            f"The excess gets HTTP 429 with `{json.dumps({'error': body})}`"
            + (f", Retry-After: {ra}." if ra else ", no Retry-After header."),
            "",
        ]
    lines += [
        "| wave | k | status | headers s | first chunk s | total s | chunks | tokens | finish |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["clients"]:
        lines.append(
            f"| {r['wave']} | {r['k']} | {r['status']} | {f(r['headers_s'])} | {f(r['ttfc_s'])} | {f(r['total_s'])} "
            f"| {r['chunks']} | {r['tokens']} | {r['finish_reason'] or r.get('error_type') or r['outcome']} |"
        )
    if report["problems"]:
        lines += ["", "Problems:", *[f"- {p}" for p in report["problems"]]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run folder (replaid train --out DIR) to serve")
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients of the main wave")
    p.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request")
    p.add_argument("--steps", type=int, default=64, help="sampling steps per block (the server's default: 64)")
    p.add_argument("--excess", type=int, default=4, help="requests sent once the main wave is in (0: none)")
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="the server's --max-queue: requests waiting beyond the running batch (default 0: the main wave "
        "is one batch and fills the server)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="the server's --max-batch: samples of a block run written together (default: clients)",
    )
    p.add_argument("--prompt", default="", help="the prompt of every request (default: none)")
    p.add_argument("--seed", type=int, default=0, help="client k asks seed SEED + k (the excess: after the main)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eos", action="store_true", help="let samples stop at end of text (default: ignore_eos)")
    p.add_argument("--threads", type=int, default=0, help="the server's torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="the server's --device")
    p.add_argument("--no-warmup", action="store_true", help="no warm-up request before the load")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for the server")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a client waits for its stream")
    p.add_argument("--sample-every", type=float, default=0.05, help="seconds between RSS samples (the peak)")
    p.add_argument(
        "--out", default="load_serve", help="folder for load_serve.json, load_serve.md, server.log, access.jsonl"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line at the end")
    a = p.parse_args(argv)
    run = Path(a.run)
    if not (run / "config.json").is_file():
        raise UsageError(f"{a.run}: no config.json there; give a run folder (replaid train --out DIR)")
    for name, lo in (("clients", 1), ("max_tokens", 1), ("steps", 1), ("excess", 0), ("threads", 0)):
        if getattr(a, name) < lo:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(a, name)}")
    if a.max_queue is None:
        a.max_queue = 0
    if a.max_batch is None:
        a.max_batch = a.clients
    if a.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, got {a.max_queue}")
    if a.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {a.max_batch}")
    if not 0 <= a.temperature <= 2:
        raise UsageError(f"--temperature must be between 0 and 2, got {a.temperature:g}")
    for name in ("startup_timeout", "timeout", "sample_every"):
        if not getattr(a, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name):g}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        raise UsageError(f"--out {a.out} is a file; give a folder")
    return a


def token_counter(run: str) -> Any:
    """Counts a text's tokens with the run's tokenizer (only needed with --eos)."""
    from replaid.data.tokenizers import load_tokenizer_file

    tok = load_tokenizer_file(Path(run) / "tokenizer" / "tokenizer.json")
    return lambda text: len(tok.encode(text)) if text else 0


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(argv)
        try:
            import httpx
            import openai
        except ImportError as e:
            raise UsageError(
                f"this benchmark needs the openai client ({e.name} is missing): pip install openai"
            ) from None
    except UsageError as e:
        print(f"replaid: error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = server_command(a, port)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "hardware": hardware(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": version("torch"),
        "openai": version("openai"),
        "git": git_commit(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "command": "python benchmarks/load_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "run": a.run,
        "clients": a.clients,
        "excess": a.excess,
        "max_tokens": a.max_tokens,
        "steps": a.steps,
        "prompt": a.prompt,
        "seed": a.seed,
        "temperature": a.temperature,
        "ignore_eos": not a.eos,
        "warmup": not a.no_warmup,
        "percentiles": "linear interpolation between order statistics (numpy's default)",
        "times": "wall-clock seconds from the moment each request was sent",
    }
    log(f"starting: {' '.join(cmd)}  (log: {out / 'server.log'})")
    log_file = open(out / "server.log", "w")
    env = dict(os.environ)  # the server of this checkout, whatever replaid is installed
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO / "src"), env.get("PYTHONPATH")) if x)
    srv = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    server: dict[str, Any] = {"command": cmd, "pid": srv.pid}
    try:
        try:
            server["startup_s"] = round(wait_ready(srv, base, a.startup_timeout, out / "server.log"), 2)
        except RuntimeError as e:
            print(f"replaid: error: {e}", file=sys.stderr)
            return 1
        info = httpx.get(f"{base}/api/runs", timeout=10).json()
        run_info = info["runs"][0]
        model = run_info["id"]
        server["limits"] = info["limits"]
        server["run"] = {
            k: run_info.get(k)
            for k in ("id", "method", "preset", "step", "seq_len", "block_size", "params", "samplers")
        }
        # a block run (and AR, blocks of one token) batches its requests (continuous batching)
        lim, blocks = info["limits"], bool(run_info.get("stream_block", run_info.get("block_size")))
        running = lim["max_batch"] if blocks else 1
        server["capacity"] = running + lim["max_queue"]
        server["rss_ready"] = rss_bytes(srv.pid)
        log(
            f"ready in {server['startup_s']} s: {model} ({run_info['method']}, block size {run_info['block_size']}, "
            f"seq_len {run_info['seq_len']}); RSS {mib(server['rss_ready'])} MiB; capacity {server['capacity']} "
            f"({running} running{' together' if blocks else ''} + --max-queue {a.max_queue} waiting)"
        )
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=a.timeout)
        counter = token_counter(a.run) if a.eos else (lambda text: 0)
        body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": a.temperature, "steps": a.steps}
        body["ignore_eos"] = not a.eos
        if not a.no_warmup:
            w = one_client(client, model, "warmup", 0, {**body, "seed": WARMUP_SEED}, counter, lambda: None)
            if w["status"] != 200 or w["outcome"] != "ok":
                msg = w.get("error_message") or w["outcome"]
                if w["status"] == 400:
                    print(f"replaid: error: the server refused the request: {msg}", file=sys.stderr)
                    return 2
                print(f"replaid: error: the warm-up request failed ({w['status']}): {msg}", file=sys.stderr)
                return 1
            w.pop("sent_pc")
            server["warmup"] = w
            log(f"warm-up: first chunk {w['ttfc_s']} s, done {w['total_s']} s ({w['tokens']} tokens)")
            time.sleep(0.5)  # the worker frees its place just after the stream's last event
        server["rss_before"] = rss_bytes(srv.pid)
        cpu0 = cpu_seconds(srv.pid)
        done = [0]
        lock = threading.Lock()

        def on_done(r: dict) -> None:
            with lock:
                done[0] += 1
                n = done[0]
            what = (
                f"first chunk {r['ttfc_s']} s, done {r['total_s']} s, {r['tokens']} tokens in {r['chunks']} chunks"
                if r["outcome"] == "ok"
                else f"{r['outcome']} in {r['total_s']} s: {r.get('error_message')}"
            )
            log(f"  [{n}/{a.clients + a.excess}] {r['wave']} client {r['k']}: {r['status']}, {what}")

        log(f"main wave: {a.clients} streaming clients x max_tokens {a.max_tokens} (steps {a.steps} per block)")
        bodies = [{**body, "seed": a.seed + k} for k in range(a.clients)]
        with RssMonitor(srv.pid, a.sample_every) as mon:
            main = Wave(client, model, "main", bodies, counter, on_done)
            main.headers_in()
            log(f"main wave in: every client has its headers after {time.perf_counter() - main.t0:.3f} s")
            excess = None
            if a.excess:
                log(f"excess wave: {a.excess} more requests")
                ex = [{**body, "seed": a.seed + a.clients + j} for j in range(a.excess)]
                excess = Wave(client, model, "excess", ex, counter, on_done)
            records = main.join() + (excess.join() if excess else [])
            for r in records:  # send times from the main wave's release
                r["sent_s"] = round(r.pop("sent_pc") - main.t0, 4)
            ends = [r["sent_s"] + r["total_s"] for r in records if r["wave"] == "main" and r["outcome"] == "ok"]
            main_wall = max(ends, default=None)
            time.sleep(0.5)  # the last place is freed just after the last stream's end
        server["cpu_s_load"] = _r(None if cpu0 is None else (cpu_seconds(srv.pid) or cpu0) - cpu0, 2)
        server["rss_after"] = rss_bytes(srv.pid)
        server["rss_peak"] = max(mon.peak, server["rss_after"] or 0, server["rss_before"] or 0) or None
        server["rss_samples"] = mon.samples
        server["still_serving"] = httpx.get(f"{base}/v1/models", timeout=10).status_code == 200
        meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        report: dict[str, Any] = {
            "meta": meta,
            "server": server,
            "clients": records,
            "summary": summarize(records, main_wall),
        }
        report["server_log"] = server_side(out / "access.jsonl", 0 if a.no_warmup else 1)
        report["problems"] = check(report)
        if not server["still_serving"]:
            report["problems"].append("the server no longer answers GET /v1/models after the load")
        (out / "load_serve.json").write_text(json.dumps(report, indent=1))
        (out / "load_serve.md").write_text(markdown(report))
        s = report["summary"]
        log(
            f"TTFC p50/p95 {s['ttfc_p50_s']}/{s['ttfc_p95_s']} s; total p50/p95 {s['total_p50_s']}/{s['total_p95_s']} "
            f"s; {s['tokens_per_s']} tokens/s; main {s['counts']['main']}; excess {s['counts']['excess']}; RSS "
            f"{mib(server['rss_before'])} -> {mib(server['rss_after'])} MiB (peak {mib(server['rss_peak'])})"
        )
        log(f"wrote {out / 'load_serve.json'} and {out / 'load_serve.md'}")
        for msg in report["problems"]:
            print("problem:", msg, flush=True)
        if a.json:  # the last line: what scripts/gpu_check.sh reads
            keep = {k: v for k, v in server.items() if k != "rss_samples"}
            row = {"meta": meta, "server": keep, "summary": s, "server_log": report["server_log"]}
            print(json.dumps({**row, "problems": report["problems"]}), flush=True)
        return 1 if report["problems"] else 0
    finally:
        srv.terminate()
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait(5)
        log_file.close()


if __name__ == "__main__":
    sys.exit(main())
