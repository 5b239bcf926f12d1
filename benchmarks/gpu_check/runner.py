"""Running the plan: each command in a fresh process (its own process group, killed whole on a
timeout), each step's result (``ok`` / ``fail`` / ``error`` / ``skipped``) written into
``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` as soon as the step ends, and the time budget that
skips the steps that no longer fit.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

from .base import BENCH, REPO, log
from .plan import Cmd, Ctx, Step
from .report import render


def run_cmd(cmd: Cmd, py: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout the whole group is killed (compile workers
    and other grandchildren too, which would otherwise hold the output pipes open)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **cmd.env}
    argv = cmd.argv(py)
    with subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("the command printed no JSON line")


def json_lines(stdout: str) -> list:
    return [json.loads(x) for x in stdout.splitlines() if x.strip().startswith("{")]


def parse_junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [], "skipped_reasons": {}}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    out["failed"].append({"test": name, "message": (el.get("message") or "")[:300]})
            sk = case.find("skipped")
            if sk is not None:
                reason = (sk.get("message") or "")[:120]
                out["skipped_reasons"][reason] = out["skipped_reasons"].get(reason, 0) + 1
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    return out


def execute(step: Step, ctx: Ctx, py: str, deadline: float | None) -> dict:
    """Run a step's commands; the step's result (``status`` ok / fail / error)."""
    if step.name == "mdlm_ref":
        sys.path.insert(0, str(BENCH))
        from gpu_check_mdlm import missing_files

        miss = missing_files(ctx.mdlm_ref)
        if miss:
            return {
                "status": "skipped",
                "reason": f"no MDLM reference at {ctx.mdlm_ref} ({', '.join(miss)} "
                f"missing): run scripts/gpu_check.sh --fetch-mdlm SNAPSHOT here and carry .carry",
            }
    results, errors = [], []
    for cmd in step.commands(ctx):
        left = None if deadline is None else deadline - time.time()
        timeout = cmd.timeout if left is None else max(10.0, min(cmd.timeout, left))
        log(f"  {cmd.text()}")
        t0 = time.time()
        xml = ctx.tmp / "gpu_check_tests.xml"
        if cmd.kind == "pytest":
            xml.unlink(missing_ok=True)
        try:
            p = run_cmd(cmd, py, timeout)
        except subprocess.TimeoutExpired as e:
            errors.append(f"{cmd.label or step.name}: timed out after {timeout:.0f} s")
            results.append(
                {
                    "label": cmd.label,
                    "timed_out": True,
                    "stdout_tail": (e.output or "")[-2000:],
                    "stderr_tail": (e.stderr or "")[-2000:],
                }
            )
            continue
        secs = time.time() - t0
        if cmd.kind == "pytest":
            rec = parse_junit(xml) if xml.is_file() else {}
            rec.update(
                returncode=p.returncode,
                seconds=secs,
                tail=(p.stdout + p.stderr)[-3000:],
                device=cmd.args[cmd.args.index("--device") + 1],
                files=[a for a in cmd.args if a.startswith("tests/")],
            )
            if p.returncode != 0:
                errors.append(
                    f"pytest exit {p.returncode}: {rec.get('failures', '?')} failed, {rec.get('errors', '?')} errors"
                )
            results.append(rec)
            continue
        if p.returncode != 0:
            errors.append(f"{cmd.label or step.name}: exit {p.returncode}: {_last_error(p.stderr)[:240]}")
            results.append({"label": cmd.label, "returncode": p.returncode, "stderr_tail": p.stderr[-3000:]})
            continue
        try:
            data = (
                json_lines(p.stdout)
                if cmd.kind == "script" and "bench_sample.py" in cmd.args[0]
                else last_json(p.stdout)
            )
        except ValueError as e:
            errors.append(f"{cmd.label or step.name}: {e}")
            results.append({"label": cmd.label, "stdout_tail": p.stdout[-2000:]})
            continue
        results.append({"label": cmd.label, "seconds": secs, "data": data})
        if isinstance(data, dict) and data.get("ok") is False:
            errors.append(f"{cmd.label or step.name}: {data.get('error') or 'a check did not pass (see the data)'}")
    out = {"results": results}
    if errors:
        out.update(status="fail", error="; ".join(errors)[:1500])
    else:
        out["status"] = "ok"
    return out


def _last_error(stderr: str) -> str:
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    for x in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|error:)", x.strip()) or x.startswith("replaid: error"):
            return x.strip()[:300]
    return (lines[-1].strip() if lines else "no output")[:300]


def header_info(setup_json: str | None) -> dict:
    """What the wrapper measured (set-up time, nvidia-smi, wheels) and this Python's versions."""
    info: dict = {
        "python": sys.version.split()[0],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:
        info["torch"] = None
    if setup_json:
        p = Path(setup_json)
        if p.is_file():
            try:
                info["setup"] = json.loads(p.read_text())
            except json.JSONDecodeError:
                info["setup"] = {"error": f"{p} is not JSON"}
    return info


def run_plan(a, steps: list[Step], out: Path) -> int:
    ctx = Ctx(quick=a.quick, device=a.device, mdlm_ref=Path(a.mdlm_ref).resolve(), tiny=a.tiny, out=out)
    path = out / "gpu_check.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc.setdefault("runs", []).append(
        {**header_info(a.setup_json), "mode": "quick" if a.quick else "full", "steps": [s.name for s in steps]}
    )
    doc.setdefault("steps", {})
    env = doc["steps"].get("env", {})
    ctx.peak_tflops = _env_data(env).get("matmul_bf16_tflops") if env.get("status") == "ok" else None
    budget = a.budget
    if budget is None and a.quick:
        setup_s = (doc["runs"][-1].get("setup") or {}).get("setup_seconds", 0) or 0
        budget = 570 - float(setup_s)
    deadline = None if budget is None else time.time() + budget
    log(
        f"{'quick' if a.quick else 'full'} check: {len(steps)} steps, out {out}"
        + ("" if budget is None else f", budget {budget:.0f} s")
    )
    failed = False
    for i, step in enumerate(steps):
        est = step.est[0 if a.quick else 1]
        if deadline is not None and time.time() + est > deadline:
            rest = [s.name for s in steps[i:]]
            left = max(0.0, deadline - time.time())
            for s in steps[i:]:
                doc["steps"][s.name] = {
                    "status": "skipped",
                    "reason": f"out of the time budget ({left:.0f} s left, "
                    f"~{s.est[0 if a.quick else 1]} s needed): run --steps {','.join(rest)}",
                }
            log(f"budget: {left:.0f} s left; skipping {', '.join(rest)} (run them with --steps {','.join(rest)})")
            break
        log(f"step {step.name}: {step.title} (~{est} s)")
        t0 = time.time()
        try:
            res = execute(step, ctx, a.python, deadline)
        except Exception as e:  # the driver's own failure is one step's, not the run's
            res = {
                "status": "error",
                "error": f"{e.__class__.__name__}: {e}",
                "traceback": traceback.format_exc()[-2000:],
            }
        res["seconds"] = time.time() - t0
        res["mode"] = "quick" if a.quick else "full"
        doc["steps"][step.name] = res
        if step.name == "env" and res["status"] in ("ok", "fail"):
            ctx.peak_tflops = _env_data(res).get("matmul_bf16_tflops")
        failed |= res["status"] in ("fail", "error")
        log(
            f"step {step.name}: {res['status']} in {res['seconds']:.0f} s"
            + (f" ({res['error'][:300]})" if res.get("error") else "")
        )
        write_outputs(doc, out)
    write_outputs(doc, out)
    log(f"done: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    return 1 if failed else 0


def _env_data(step: dict) -> dict:
    r = step.get("results") or [{}]
    return r[0].get("data") or {}


def write_outputs(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out / "gpu_check.json")
    (out / "gpu_check.md").write_text(render(doc))
