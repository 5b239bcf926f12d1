"""SIGKILL trials of debug-size training runs: kill at random moments (and at chosen filesystem steps
of the final save), then check that every run loads, lost at most one checkpoint interval, and
resumes to a result bit-identical to an uninterrupted reference run.

    /work/tools/heavy -n 1 python scripts/kill_trials.py --trials 50 --out /tmp/kill   # ~15 min on 2 busy cores

Bit-exactness: after the resume finishes, every tensor of the final checkpoint (weights, EMA,
optimizer moments, RNG state) is compared with ``torch.equal`` against the reference's, the
metrics rows (timing fields aside) must equal the reference's row for row (so no duplicated or
missing step), and ``final_eval.json`` (timing aside) must be equal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from replaid.store import checkpoint as ck
from replaid.store.loading import load_run

TIMING = {"time", "tokens_per_s", "eval/seconds", "seconds"}

# a trainer that SIGKILLs itself at the k-th call of a filesystem step (among those `when` accepts)
KILLER = """
import os, shutil, signal, sys
from replaid.store import checkpoint as ck
from replaid import fileio
from replaid.cli import main
owner = {{"os": os, "shutil": shutil, "ck": ck, "fileio": fileio}}["{owner}"]
real, seen = getattr(owner, "{name}"), [0]
def dying(*a, **kw):
    if {when}:
        seen[0] += 1
        if seen[0] == {k}:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **kw)
setattr(owner, "{name}", dying)
sys.exit(main(sys.argv[1:]))
"""

# (label, owner, function, which matching call dies given the number of saves n, condition)
TARGETS = [
    ("final save: writing a tensor file", "ck", "save_file", lambda n, r: 4 * (n - 1) + r.randint(1, 4), "True"),
    ("final save: writing state.json", "ck", "_write_json", lambda n, r: n, "str(a[0]).endswith('state.json')"),
    ("final save: after fsync, before rename", "os", "rename", lambda n, r: n, "'checkpoints' in str(a[1])"),
    (
        "final save: between rename and LATEST update",
        "ck",
        "fsync_dir",
        lambda n, r: n,
        "str(a[0]).endswith('checkpoints')",
    ),
    ("final save: replacing LATEST", "os", "replace", lambda n, r: n, "str(a[1]).endswith('LATEST')"),
    (
        "final save: pruning the oldest checkpoint",
        "shutil",
        "rmtree",
        lambda n, r: n - 2,
        "'checkpoints/step_' in str(a[0])",
    ),
    (
        "after the final save: writing final_eval.json",
        "os",
        "replace",
        lambda n, r: 1,
        "str(a[1]).endswith('final_eval.json')",
    ),
]


def train_cmd(out: Path, a, extra=()) -> list[str]:
    return [
        "train",
        "--preset",
        "debug",
        "--no-progress",
        "--out",
        str(out),
        f"train.steps={a.steps}",
        f"train.save_every={a.save_every}",
        "train.log_every=1",
        "eval.max_batches=1",
        "train.num_threads=1",
        *extra,
    ]


def rows(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(x).items() if k not in TIMING}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]


def last_logged_step(run: Path) -> int:
    steps = []
    for x in (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []:
        with contextlib.suppress(ValueError):  # a line torn by the kill
            steps.append(json.loads(x)["step"])
    return max(steps, default=0)


def tensors(run: Path) -> dict:
    c = ck.find_checkpoint(run)
    return {
        f"{n}/{k}": v for n in ("model", "ema", "optimizer", "rng") for k, v in (ck.load_tensors(c, n) or {}).items()
    }


def final_eval(run: Path) -> dict:
    return {k: v for k, v in json.loads((run / "final_eval.json").read_text())["eval"].items() if k not in TIMING}


def launch(argv: list[str], script: str | None = None) -> subprocess.Popen:
    code = ["-c", script] if script else ["-m", "replaid"]
    return subprocess.Popen(
        [sys.executable, *code, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def kill_at(p: subprocess.Popen, seconds: float) -> bool:
    """SIGKILL ``p`` after ``seconds`` unless it finished first; True when it was killed."""
    try:
        p.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait()
        return True


def check(run: Path, ref: Path, a, log: dict) -> dict:
    """After a kill: loadable? steps lost? then resume to the end and compare with the reference."""
    ckpt = ck.latest_checkpoint(run)
    log["ckpt_step"] = ck.load_state(ckpt)["step"] if ckpt is not None else None
    if ckpt is not None:
        load_run(run, device="cpu")  # config + tokenizer + weights load
    log["loadable"] = True
    log["last_logged"] = last_logged_step(run)
    log["lost_steps"] = log["last_logged"] - (log["ckpt_step"] or 0)
    argv = ["train", "--out", str(run), "--resume", "--no-progress"]
    if (run / "config.json").exists():
        if log.get("kill_resume"):  # a second kill, during the resumed run
            killed = kill_at(launch(argv), log["kill_resume"])
            log["resume_killed"] = killed
        r = subprocess.run([sys.executable, "-m", "replaid", *argv], capture_output=True, text=True)
    else:  # killed before the run existed: start it again
        r = subprocess.run([sys.executable, "-m", "replaid", *train_cmd(run, a)], capture_output=True, text=True)
    log["resume_rc"] = r.returncode
    if r.returncode != 0:
        log["resume_error"] = r.stderr.strip().splitlines()[-1:]
        return log
    a_t, b_t = tensors(run), tensors(ref)
    log["tensors_equal"] = a_t.keys() == b_t.keys() and all(torch.equal(a_t[k], b_t[k]) for k in a_t)
    log["metrics_equal"] = rows(run) == rows(ref)
    log["final_eval_equal"] = final_eval(run) == final_eval(ref)
    log["bit_exact"] = log["tensors_equal"] and log["metrics_equal"] and log["final_eval_equal"]
    return log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50, help="random-moment kills")
    p.add_argument("--targeted", type=int, default=2, help="kills per filesystem step of the final save")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/kill-trials")
    p.add_argument("--window", type=float, default=0, help="random kills fall in [0.2 s, window] (0 = one run's time)")
    p.add_argument(
        "--kill-resume-frac", type=float, default=1 / 3, help="share of random trials whose resume is killed too"
    )
    p.add_argument("--max-minutes", type=float, default=0, help="start no trial after this long (0 = no limit)")
    a = p.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.environ.setdefault("REPLAID_CACHE_DIR", str(out / "cache"))
    rng = random.Random(a.seed)
    ref = out / "reference"
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "replaid", *train_cmd(ref, a)], check=True, capture_output=True)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "replaid", *train_cmd(out / "timed", a)], check=True, capture_output=True)
    T = time.time() - t0
    print(f"reference run: {a.steps} steps, save every {a.save_every}, {T:.1f} s wall per run", flush=True)
    n_saves = a.steps // a.save_every
    plan = [("random", None) for _ in range(a.trials)] + [("targeted", t) for t in TARGETS for _ in range(a.targeted)]
    rng.shuffle(plan)  # interleaved, so a run stopped early still covers every kind
    logs = []
    for i, (kind, target) in enumerate(plan):
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            print(f"stopping after {i} trials: --max-minutes {a.max_minutes} reached", flush=True)
            break
        run = out / f"trial{i:03d}"
        log = {"trial": i, "kind": kind}
        if kind == "random":
            window = a.window or T
            log["kill_after_s"] = round(rng.uniform(0.2, window), 2)
            if rng.random() < a.kill_resume_frac:
                log["kill_resume"] = round(rng.uniform(0.2, window), 2)
            log["killed"] = kill_at(launch(train_cmd(run, a)), log["kill_after_s"])
        else:
            label, owner, name, call, when = target
            k = call(n_saves, rng)
            log.update(moment=label, call=k)
            script = KILLER.format(owner=owner, name=name, k=k, when=when)
            pr = launch(train_cmd(run, a), script)
            pr.wait()
            log["killed"] = pr.returncode == -signal.SIGKILL
        try:
            check(run, ref, a, log)
        except Exception as e:  # any failure to load is a failed trial, recorded
            log["loadable"] = False
            log["error"] = f"{e.__class__.__name__}: {e}"
        logs.append(log)
        print(json.dumps(log), flush=True)
        shutil.rmtree(run, ignore_errors=True)
        summary = summarise(logs, a, t0)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "trials.jsonl").write_text("".join(json.dumps(x) + "\n" for x in logs))
    print(json.dumps(summary, indent=2))


def summarise(logs: list[dict], a, t0: float) -> dict:
    killed = [x for x in logs if x.get("killed")]
    summary = {
        "trials": len(logs),
        "killed": len(killed),
        "killed_during_final_save_or_after": sum(1 for x in killed if (x.get("last_logged") or 0) >= a.steps),
        "killed_before_first_checkpoint": sum(1 for x in killed if x.get("ckpt_step") is None),
        "resume_killed_too": sum(1 for x in logs if x.get("resume_killed")),
        "loadable": sum(1 for x in logs if x.get("loadable")),
        "max_lost_steps": max((x.get("lost_steps", 0) for x in logs), default=0),
        "save_every": a.save_every,
        "bit_exact": sum(1 for x in logs if x.get("bit_exact")),
        "failures": [
            x for x in logs if not (x.get("loadable") and x.get("bit_exact") and x.get("lost_steps", 0) <= a.save_every)
        ],
        "by_moment": {
            m: sum(1 for x in logs if x.get("moment") == m and x.get("bit_exact"))
            for m in dict.fromkeys(x["moment"] for x in logs if "moment" in x)
        },
        "seconds": round(time.time() - t0),
    }
    return summary


if __name__ == "__main__":
    main()
