"""A small mutation-testing harness for ``src/replaid/diffusion/`` (mutmut's idea, sized for 2 CPU cores).

    python scripts/mutation_harness.py --n 24 --seed 0 --out /tmp/mut.json \
        --before-tests old/tests/test_nelbo.py ... --tests tests/test_nelbo.py::test_new ... --select "not slow"

Enumerates first-order mutants with :mod:`ast` (``+``<->``-``, ``*``<->``/``, ``**``->``*``,
comparison flips, unary minus dropped, numeric constants changed, ``.detach()`` removed,
``True``<->``False``), draws ``--n`` of them at random (seeded), and for each writes the mutated
module into a scratch copy of ``src/`` and runs the selected tests there (``-x``, a per-mutant
timeout; a timeout counts as killed). With ``--before-tests`` (a folder holding an older copy of
the tests) every mutant is first run against those, so one pass reports the kill share before and
after a change of the tests. Writes a JSON list of mutants with their outcome and prints a summary.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult}
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def mutation_sites(tree: ast.AST) -> list[tuple[int, str]]:
    """(index of the node in ast.walk order, kind) for every mutable node."""
    skip = _docstring_nodes(tree)
    sites = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
            sites.append((i, "binop"))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAP_CMP:
            sites.append((i, "compare"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sites.append((i, "neg"))
        elif isinstance(node, ast.Constant) and id(node) not in skip:
            if isinstance(node.value, bool):
                sites.append((i, "bool"))
            elif isinstance(node.value, (int, float)):
                sites.append((i, "number"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "detach"
            and not node.args
        ):
            sites.append((i, "detach"))
    return sites


def mutate(source: str, index: int, kind: str) -> tuple[str, str, int]:
    """The mutated source, a description and the line number."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    node = nodes[index]
    line = getattr(node, "lineno", 0)
    if kind == "binop":
        new = SWAP_BIN[type(node.op)]
        desc = f"{type(node.op).__name__} -> {new.__name__}"
        node.op = new()
    elif kind == "compare":
        new = SWAP_CMP[type(node.ops[0])]
        desc = f"{type(node.ops[0]).__name__} -> {new.__name__}"
        node.ops = [new()] + node.ops[1:]
    elif kind == "neg":
        desc = "drop unary minus"
        # replace the UnaryOp by its operand in its parent
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, node.operand)
                elif isinstance(value, list) and any(v is node for v in value):
                    setattr(parent, field, [node.operand if v is node else v for v in value])
    elif kind == "bool":
        desc = f"{node.value} -> {not node.value}"
        node.value = not node.value
    elif kind == "number":
        v = node.value
        new = (v + 1) if isinstance(v, int) else (1.0 if v == 0 else v * 2)
        desc = f"{v!r} -> {new!r}"
        node.value = new
    elif kind == "detach":
        desc = "drop .detach()"
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, node.func.value)
                elif isinstance(value, list) and any(v is node for v in value):
                    setattr(parent, field, [node.func.value if v is node else v for v in value])
    else:
        raise ValueError(kind)
    return ast.unparse(tree), desc, line


def run_tests(src: Path, tests: list[str], timeout: float, cwd: Path, select: str = "") -> tuple[str, float]:
    """'killed' / 'survived' / 'timeout' and the seconds taken."""
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.time()
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                *tests,
                *(["-k", select] if select else []),
            ],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - t0
    return ("survived" if r.returncode == 0 else "killed"), time.time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", default="src/replaid/diffusion", help="folder of modules to mutate")
    p.add_argument("--tests", nargs="+", required=True, help="pytest arguments (files, -k ...) of the new tests")
    p.add_argument("--before-tests", nargs="*", default=None, help="pytest arguments of the old tests, run first")
    p.add_argument("--select", default="", help="pytest -k expression applied to both test sets")
    p.add_argument("--n", type=int, default=24, help="mutants drawn at random")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per test run (a timeout = killed)")
    p.add_argument("--out", required=True, help="JSON file of the outcomes")
    p.add_argument(
        "--budget", type=float, default=0, help="stop drawing mutants after this many seconds (0 = no limit)"
    )
    p.add_argument("--scratch", default="/tmp/replaid-mutation")
    a = p.parse_args()

    scratch = Path(a.scratch)
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(ROOT / "src", scratch / "src")
    pkg = ROOT / a.package
    rel = pkg.relative_to(ROOT / "src")
    all_sites = []
    for f in sorted(pkg.glob("*.py")):
        src_text = f.read_text()
        for idx, kind in mutation_sites(ast.parse(src_text)):
            all_sites.append((f.name, idx, kind))
    rng = random.Random(a.seed)
    chosen = rng.sample(all_sites, min(a.n, len(all_sites)))
    print(f"{len(all_sites)} mutants in {a.package}; running {len(chosen)}", flush=True)
    results = []
    t_start = time.time()
    for k, (fname, idx, kind) in enumerate(chosen):
        if a.budget and time.time() - t_start > a.budget:
            print(f"budget of {a.budget:.0f} s used: stopping after {k} mutants", flush=True)
            break
        orig = (pkg / fname).read_text()
        mutated, desc, line = mutate(orig, idx, kind)
        target = scratch / "src" / rel / fname
        target.write_text(mutated)
        try:
            rec = {"file": f"{a.package}/{fname}", "line": line, "kind": kind, "mutation": desc}
            if a.before_tests is not None:
                rec["before"], rec["before_s"] = run_tests(scratch / "src", a.before_tests, a.timeout, ROOT, a.select)
            if a.before_tests is not None and rec["before"] != "survived":
                rec["after"] = rec["before"]  # the new tests keep every old test
            else:
                rec["after"], rec["after_s"] = run_tests(scratch / "src", a.tests, a.timeout, ROOT, a.select)
        finally:
            target.write_text(orig)
        results.append(rec)
        print(
            f"[{k + 1}/{len(chosen)}] {rec['file']}:{line} {desc}: before {rec.get('before', '-')}, "
            f"after {rec['after']}",
            flush=True,
        )
        Path(a.out).write_text(json.dumps(results, indent=2))

    def share(key):
        got = [r[key] for r in results if key in r]
        return sum(x != "survived" for x in got), len(got)

    for key in ("before", "after"):
        k, n = share(key)
        if n:
            print(f"{key}: {k}/{n} killed ({100 * k / n:.0f}%)")


if __name__ == "__main__":
    main()
