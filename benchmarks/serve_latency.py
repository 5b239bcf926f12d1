"""Latency of ``replaid serve``: time to the first streamed step, total time of a generation, and
what 5 simultaneous requests on one run do.

Starts ``replaid serve RUN`` as a subprocess on a free local port, talks to it over HTTP (httpx,
streaming server-sent events), and prints one JSON object. Times are wall-clock from sending the
request; ``server_cpu_s`` is the server process's CPU time (user + system) over the same span.

    python benchmarks/serve_latency.py runs/demo --steps 64 --repeats 3 --concurrent 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    out = {"status": None, "ahead": None, "first_step_s": None, "total_s": None, "nfe": None, "steps_seen": 0}
    with httpx.Client(timeout=600) as c, c.stream("POST", url, json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["error"] = json.loads(r.read())["error"]
            out["total_s"] = time.perf_counter() - t0
            return out
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            ev = json.loads(line[5:])
            if ev["type"] == "queued":
                out["ahead"] = ev["ahead"]
            elif ev["type"] == "step":
                out["steps_seen"] += 1
                if out["first_step_s"] is None:
                    out["first_step_s"] = time.perf_counter() - t0
            elif ev["type"] in ("done", "error"):
                out["total_s"] = time.perf_counter() - t0
                out["nfe"] = ev.get("nfe")
                if ev["type"] == "error":
                    out["error"] = ev["message"]
                break
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--sampler", default="ddpm")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrent", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-queue", type=int, default=8)
    a = p.parse_args()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "replaid",
        "serve",
        a.run,
        "--port",
        str(port),
        "--threads",
        str(a.threads),
        "--max-queue",
        str(a.max_queue),
    ]
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while True:
            if srv.poll() is not None:
                print(srv.stderr.read(), file=sys.stderr)
                return 1
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        startup = time.time() - t0
        base = f"http://127.0.0.1:{port}"
        rid = httpx.get(f"{base}/api/runs").json()["runs"][0]["id"]
        body = {"run": rid, "sampler": a.sampler, "steps": a.steps, "seed": 0}
        url = f"{base}/api/generate"
        one(url, dict(body, steps=4))  # warm-up
        single = []
        for k in range(a.repeats):
            c0 = cpu_seconds(srv.pid)
            r = one(url, dict(body, seed=k))
            r["server_cpu_s"] = round(cpu_seconds(srv.pid) - c0, 3)
            single.append(r)
        rss0 = rss_mb(srv.pid)
        results = [None] * a.concurrent
        c0 = cpu_seconds(srv.pid)
        t0 = time.perf_counter()

        def go(k):
            results[k] = one(url, dict(body, seed=100 + k))

        ts = [threading.Thread(target=go, args=(k,)) for k in range(a.concurrent)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        out = {
            "run": a.run,
            "sampler": a.sampler,
            "steps": a.steps,
            "threads": a.threads,
            "startup_s": round(startup, 2),
            "single": single,
            "concurrent": sorted(results, key=lambda r: (r["ahead"] is None, r["ahead"] or 0)),
            "concurrent_wall_s": round(wall, 3),
            "concurrent_server_cpu_s": round(cpu_seconds(srv.pid) - c0, 3),
            "rss_mb_before_after": [round(rss0, 1), round(rss_mb(srv.pid), 1)],
            "still_serving": httpx.get(f"{base}/api/runs").status_code == 200,
        }
        print(json.dumps(out, indent=1))
        return 0
    finally:
        srv.terminate()
        srv.wait(10)


if __name__ == "__main__":
    sys.exit(main())
