"""The dry run (``--dry-run``): the plan printed with every command resolved where it is, without a
GPU: a script exists and its parser takes the arguments, a child function takes its spec, a pytest
selection collects tests, a ``replaid`` command line parses (:func:`replaid.cli.parse`); and the
set-up's pieces (pip, the project, the carried wheels).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .base import BENCH, REPO
from .children import CHILDREN, torch_features
from .plan import FULL_SPLIT, Cmd, Ctx, Step


def resolve_cmd(cmd: Cmd, py: str) -> tuple[bool, str]:
    """Whether ``cmd`` would start as written: its script exists and parses these arguments, its child
    function takes this spec, its pytest selection collects tests."""
    if cmd.kind == "script":
        path = REPO / cmd.args[0]
        if not path.is_file():
            return False, f"{cmd.args[0]}: no such script"
        try:
            sys.path.insert(0, str(BENCH))
            spec = importlib.util.spec_from_file_location(f"_dry_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            parser = mod.build_parser()
        except Exception as e:
            return False, f"{cmd.args[0]}: does not import ({e.__class__.__name__}: {e})"
        return _parses(parser.parse_args, cmd.args[1:], cmd.args[0])
    if cmd.kind == "child":
        name, spec = cmd.args[2], json.loads(cmd.args[4])
        fn = CHILDREN.get(name)
        if fn is None:
            return False, f"--child {name}: no such child"
        try:
            inspect.signature(fn).bind(**spec)
        except TypeError as e:
            return False, f"--child {name}: {e}"
        return True, f"child {name}({', '.join(spec)})"
    if cmd.kind == "pytest":
        args = list(cmd.args)
        if "--junitxml" in args:
            i = args.index("--junitxml")
            del args[i : i + 2]
        files = [a for a in args if a.startswith("tests/")]
        miss = [f for f in files if not (REPO / f).is_file()]
        if miss:
            return False, f"no such test file {', '.join(miss)}"
        dev = args.index("--device")
        args[dev + 1] = "cpu"  # collected here without CUDA
        p = subprocess.run(
            [py, *args, "--collect-only", "-q"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        per_file = re.findall(r"^(tests/\S+\.py): (\d+)$", p.stdout, re.M)  # -qq: one line per file
        m = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", p.stdout)
        n = sum(int(k) for _, k in per_file) if per_file else int(m.group(1)) if m else 0
        empty = sorted(set(files) - {f for f, k in per_file if int(k)}) if per_file else []
        if p.returncode != 0 or n == 0 or empty:
            why = f"no test selected in {', '.join(empty)}" if empty else (p.stdout + p.stderr).strip()[-400:]
            return False, f"pytest --collect-only exit {p.returncode}: {why}"
        return True, f"{n} tests collect ({', '.join(f'{f} {k}' for f, k in per_file) or f'{len(files)} files'})"
    if cmd.kind == "cli":
        from replaid.cli import parse

        return _parses(parse, cmd.args[2:], "replaid")
    return False, f"unknown command kind {cmd.kind}"


def _parses(parse: Callable, args: list, name: str) -> tuple[bool, str]:
    """Whether ``parse(args)`` takes ``args`` (an argparse parse that exits on bad input)."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return False, f"{name} rejects its arguments: {err.getvalue().strip().splitlines()[-1:]}"
    return True, f"{name} parses"


def resolve_setup(py: str) -> tuple[bool, list]:
    """The set-up's pieces (scripts/gpu_check.sh): pip for ``py``, a buildable project, the wheels."""
    lines, ok = [], True
    p = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True)
    good = p.returncode == 0 and (REPO / "pyproject.toml").is_file() and (REPO / "src" / "replaid").is_dir()
    ok &= good
    lines.append(
        f"  {'ok ' if good else 'BAD'} python -m pip install --no-index --no-deps --no-build-isolation "
        f"--target /tmp/replaid-site .whl/*.whl ."
    )
    lines.append(
        f"      -> {'pip ' + p.stdout.split()[1] if p.returncode == 0 else 'no pip for ' + py}; "
        f"pyproject.toml {'present' if (REPO / 'pyproject.toml').is_file() else 'MISSING'}"
    )
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    need = os.environ.get("GPU_CHECK_WHEELS", "").split()
    if wheels:
        mb = sum(w.stat().st_size for w in wheels) / 2**20
        lines.append(f"      -> {len(wheels)} wheel(s) in .whl ({mb:.1f} MiB): {' '.join(w.name for w in wheels)}")
    else:
        lines.append(
            "      -> no wheels in .whl: the MDLM reference will lack "
            f"{' '.join(need) or 'its packages'} (bash scripts/gpu_check.sh --fetch-wheels)"
        )
    return ok, lines


def dry_run(a, steps: list[Step]) -> int:
    """Print the plan (each step, its commands, estimated time) and resolve every command."""
    out = Path(a.out or os.environ.get("OUT") or "runs/gpu_check")
    ctx = Ctx(quick=a.quick, device="cuda", peak_tflops=None, mdlm_ref=Path(a.mdlm_ref).resolve(), out=out)
    total, bad = 0, 0
    print(f"plan: {'quick' if a.quick else 'full'} GPU check, {len(steps)} steps (estimates on one H100)", flush=True)
    ok, lines = resolve_setup(a.python)
    bad += not ok
    print("\n[setup] set-up without a network: carried wheels, then the project with --no-deps (~30 s)")
    print("\n".join(lines), flush=True)
    for s in steps:
        est = s.est[0 if a.quick else 1]
        total += est
        print(f"\n[{s.name}] {s.title} (~{est} s)", flush=True)
        for cmd in s.commands(ctx):
            ok, why = resolve_cmd(cmd, a.python)
            bad += not ok
            print(f"  {'ok ' if ok else 'BAD'} {cmd.text()}\n      -> {why}", flush=True)
        if s.name == "mdlm_ref":
            sys.path.insert(0, str(BENCH))
            from gpu_check_mdlm import missing_files

            miss = missing_files(ctx.mdlm_ref)
            state = (
                "present"
                if not miss
                else (
                    f"absent (the step will be skipped: {', '.join(miss)} missing; "
                    "bash scripts/gpu_check.sh --fetch-mdlm SNAPSHOT)"
                )
            )
            print(f"      reference: {state}", flush=True)
    feats = torch_features()
    print(
        f"\ntorch {__import__('torch').__version__} here: "
        + ", ".join(f"{f['api']} (>= {f['since']})" + ("" if f["present"] else " MISSING") for f in feats)
    )
    print(
        f"\nestimated total: {total} s ({total / 60:.1f} min) + set-up; "
        + (
            "quick mode ends inside one 10-minute call (steps that no longer fit are skipped and named)"
            if a.quick
            else "a full check in 10-minute calls: " + " | ".join(f"--steps {x}" for x in FULL_SPLIT)
        )
    )
    n = sum(len(s.commands(ctx)) for s in steps)
    print(
        f"resolved: {n + 1 - bad}/{n + 1} commands (set-up included)"
        + ("; dry run: every step resolved" if not bad else f"; {bad} do not resolve (BAD above)"),
        flush=True,
    )
    return 0 if not bad else 1
