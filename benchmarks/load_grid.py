"""The load page's grid (issue 52 §3): ``benchmarks/load_serve.py`` over several runs and client counts, one
table: time to first token p50/p95 and latency p50/p95 (the clients' and the server's access log's), aggregate
tokens/s, 429s and the server's peak memory, per run and number of streaming clients.

Every load uses ``replaid serve``'s own defaults for the batch and the queue (``--max-batch 16 --max-queue 32``,
what an operator gets), so at 64 clients some are refused; each request asks for ``--max-tokens`` tokens
(``ignore_eos``) at ``--steps`` per block (a block run; AR reads none). The runs are given (``--runs``), or
trained here first (``--train``: AR, MDLM with blocks of 4 and RePlaid with blocks of 4 at ``--preset`` for
``--train-steps`` steps on ``--device``: the speed of the served path, not of trained models).

    python benchmarks/load_grid.py --runs runs/ar runs/bd3 runs/bd-pd2 --clients 1 4 16 32 64 --out load/cpu
    python benchmarks/load_grid.py --train --device cuda --out /tmp/load --json     (scripts/gpu_check.sh's step)

Writes ``OUT/load_grid.json`` and ``OUT/load_grid.md`` (each load's own folder under ``OUT/``); ``--json``
prints the table's rows as one JSON line at the end. Exit status 0, 1 when a load failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOAD = REPO / "benchmarks" / "load_serve.py"
TRAINED = {  # name -> overrides of the runs --train makes
    "ar": ["method=ar"],
    "mdlm-b4": ["method=mdlm", "mdlm.block_size=4"],
    "replaid-b4": ["diffusion.block_size=4"],
}


def train(out: Path, preset: str, steps: int, device: str) -> list[Path]:
    """The three runs of :data:`TRAINED`, trained for ``steps`` steps (one process each)."""
    runs = []
    for name, sets in TRAINED.items():
        run = out / "runs" / name
        if not (run / "final_eval.json").is_file():
            argv = [sys.executable, "-m", "replaid", "train", "--preset", preset, "--out", str(run), "--no-progress"]
            argv += [*sets, f"train.steps={steps}", f"train.device={device}", "eval.max_batches=1"]
            r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
            if r.returncode != 0:
                raise RuntimeError(f"training {name} failed: {r.stderr.strip().splitlines()[-1:]}")
        runs.append(run)
    return runs


def one_load(run: Path, clients: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``load_serve.py`` at ``clients`` streaming clients on ``run`` with the server's default limits; its row."""
    argv = [sys.executable, str(LOAD), str(run), "--clients", str(clients), "--max-tokens", str(a.max_tokens)]
    argv += ["--steps", str(a.steps), "--excess", "0", "--max-batch", "16", "--max-queue", "32"]
    argv += ["--device", a.device, "--threads", str(a.threads), "--out", str(out), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if not lines:
        return {"run": run.name, "clients": clients, "error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
    d = json.loads(lines[-1])
    s, srv, log = d["summary"], d["server"], d["server_log"]
    c = s["counts"]["main"]
    return {
        "run": run.name,
        "method": srv["run"]["method"],
        "block": srv["run"]["block_size"] or (1 if srv["run"]["method"] == "ar" else 0),
        "clients": clients,
        "ttft_p50_s": s["ttfc_p50_s"],
        "ttft_p95_s": s["ttfc_p95_s"],
        "latency_p50_s": s["total_p50_s"],
        "latency_p95_s": s["total_p95_s"],
        "tokens_per_s": s["tokens_per_s"],
        "ok": c["200"],
        "refused_429": c["429"],
        "other": c["other"],
        "rss_peak_mib": None if srv.get("rss_peak") is None else round(srv["rss_peak"] / 2**20, 1),
        "log_ttft_p50_s": log["ttft_p50_s"],
        "log_ttft_p95_s": log["ttft_p95_s"],
        "log_latency_p95_s": log["latency_p95_s"],
        "problems": d["problems"],
    }


def markdown(doc: dict[str, Any]) -> str:
    head = ["run", "method", "b", "clients", "TTFT p50 / p95 s", "latency p50 / p95 s", "tokens/s", "200 / 429",
            "peak RSS MiB", "server log: TTFT p50 / p95, latency p95 s"]  # fmt: skip
    lines = [
        f"# Load grid ({doc['meta']['date']}, {doc['meta']['device']})",
        "",
        f"`{doc['meta']['command']}`; {doc['meta']['max_tokens']} tokens a request at {doc['meta']['steps']} steps "
        "per block, replaid serve's default limits (--max-batch 16 --max-queue 32).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['run']} | | | {r['clients']} | failed: {r['error']} |" + " |" * (len(head) - 5))
            continue
        lines.append(
            f"| {r['run']} | {r['method']} | {r['block']} | {r['clients']} | {r['ttft_p50_s']} / {r['ttft_p95_s']} | "
            f"{r['latency_p50_s']} / {r['latency_p95_s']} | {r['tokens_per_s']} | {r['ok']} / {r['refused_429']} | "
            f"{r['rss_peak_mib']} | {r['log_ttft_p50_s']} / {r['log_ttft_p95_s']}, {r['log_latency_p95_s']} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", nargs="*", default=[], help="run folders to load (with --train: trained here first)")
    p.add_argument("--train", action="store_true", help="train AR, MDLM and RePlaid with blocks of 4 first")
    p.add_argument("--preset", default="demo", help="--train: the preset of the runs")
    p.add_argument("--train-steps", type=int, default=200, help="--train: optimiser steps of each run")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="sampling steps per block of a block run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="the server's torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=Path("load_grid"))
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line at the end")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    bad = [f"--{k.replace('_', '-')}" for k in ("train_steps", "max_tokens", "steps") if getattr(a, k) < 1]
    bad += ["--clients"] if any(c < 1 for c in a.clients) else []
    if bad or not (a.runs or a.train):
        why = f"{', '.join(bad)} must be >= 1" if bad else "give --runs RUN ... or --train"
        print(f"replaid: error: {why}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        runs = [Path(r) for r in a.runs] + (train(a.out, a.preset, a.train_steps, a.device) if a.train else [])
    except RuntimeError as e:
        print(f"replaid: error: {e}", file=sys.stderr)
        return 1
    rows = []
    for run in runs:
        for n in a.clients:
            row = one_load(run, n, a, a.out / f"{run.name}-c{n}")
            print(f"{run.name} x {n} clients: {row.get('error') or row['tokens_per_s']} tokens/s", file=sys.stderr)
            rows.append(row)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": a.device,
        "command": "python benchmarks/load_grid.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "max_tokens": a.max_tokens,
        "steps": a.steps,
    }
    ok = all("error" not in r for r in rows)
    doc = {"meta": meta, "rows": rows, "ok": ok}
    (a.out / "load_grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out / "load_grid.md").write_text(markdown(doc))
    if a.json:
        print(json.dumps(doc))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
