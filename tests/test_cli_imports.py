"""``replaid --help`` and every ``replaid COMMAND --help`` import no torch (nor numpy, matplotlib, ...).

The parser is built from the command modules' ``register`` functions; they read their choices from
torch-free modules (``registry.method_names``, ``sampling.names``, ``distill.config``, ``data.zeroshot``)
and import their work inside ``run``. One fresh interpreter runs ``python -m replaid [COMMAND ...] --help``
(via ``runpy``) for the top level and every sub-command, nested ones included, and reports the first
that loaded a heavy module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import replaid

HEAVY = ("torch", "numpy", "scipy", "matplotlib", "transformers", "datasets", "safetensors", "lm_eval")

SCRIPT = textwrap.dedent(
    """
    import argparse, contextlib, importlib.abc, io, json, runpy, sys, traceback

    HEAVY = {heavy!r}
    WHERE = {{}}  # heavy module -> the replaid lines that imported it first

    class Tracer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            top = name.split(".")[0]
            if top in HEAVY and top not in WHERE:
                stack = traceback.extract_stack()
                WHERE[top] = [f"{{f.filename.split('/src/')[-1]}}:{{f.lineno}}" for f in stack if "/replaid/" in f.filename]
            return None

    sys.meta_path.insert(0, Tracer())

    def paths(parser, path=()):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield path + (name,)
                    yield from paths(sp, path + (name,))

    def loaded():
        return sorted({{m.split(".")[0] for m in sys.modules}} & set(HEAVY))

    def run(path):
        sys.argv = ["replaid", *path, "--help"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                runpy.run_module("replaid", run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code
        return code, out.getvalue()

    report = {{"helps": []}}
    code, text = run(())  # python -m replaid --help, first, in a fresh interpreter
    report["helps"].append([[], code, text.startswith("usage: replaid"), loaded()])
    from replaid.cli import _parser

    for path in paths(_parser()):
        code, text = run(path)
        report["helps"].append([list(path), code, text.startswith("usage: replaid " + " ".join(path)), loaded()])
    report["where"] = WHERE
    print(json.dumps(report))
    """
).format(heavy=HEAVY)


def test_help_imports_no_torch():
    src = str(Path(replaid.__file__).resolve().parents[1])  # the replaid these tests import
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    helps = report["helps"]
    commands = {tuple(path) for path, *_ in helps}
    assert {(), ("train",), ("sample",), ("scaling",), ("scaling", "fit")} <= commands, commands
    for path, code, usage, heavy in helps:
        what = "replaid " + " ".join([*path, "--help"])
        assert code == 0 and usage, f"{what}: exit {code}, help text printed: {usage}"
        chains = "; ".join(f"{m} via " + " -> ".join(report["where"].get(m, ["?"])) for m in heavy)
        assert not heavy, f"{what} imported {', '.join(heavy)} ({chains}); import it inside the command's run function"
