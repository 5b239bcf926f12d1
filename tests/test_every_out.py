"""Issue 49, class "data loss": every command that writes an ``--out`` goes through ``check_out``.

The subcommands with an ``--out`` option are listed from the parser itself (a new one without a case
here fails ``test_every_out_option_has_its_cases``). Each is tried twice: ``--out`` inside a run's
managed folder (``RUN/checkpoints/step_N``, which the next ``--resume`` prunes), and ``--out`` where the
command would replace one of its own inputs (``scaling overtrain ot/v/runs.csv ... --out ot/v``
rewrote its own ``runs.csv``). Each must be one line ``replaid: error: --out ...``, exit 2, with every
file left byte for byte as it was.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.commands import COMMANDS


def out_commands() -> list[str]:
    p = argparse.ArgumentParser(prog="replaid")
    sub = p.add_subparsers(dest="cmd")
    for name in COMMANDS:
        importlib.import_module(f"replaid.commands.{name}").register(sub)
    found: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    walk(sp, [*path, n])
            elif "--out" in a.option_strings:
                found.append(" ".join(path))

    walk(p, [])
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("outs")
    run = root / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2",
                 "eval.max_batches=1"]) == 0  # fmt: skip
    ot = root / "ot" / "v"
    ot.mkdir(parents=True)
    with open(ot / "runs.csv", "w", newline="") as f:  # a study of 2 methods (and a third one, c)
        w = csv.DictWriter(f, fieldnames=["method", "flops", "params", "loss", "seed", "tokens"])
        w.writeheader()
        for m, a, slope, budgets in (("a", 6, -0.5, [1e12, 3e12, 1e13]), ("b", 5, -0.2, [1e11, 1e12, 1e13]),
                                     ("c", 5, -0.3, [1e12, 1e13])):  # fmt: skip
            for c in budgets:
                for s in (0, 1):
                    w.writerow({"method": m, "flops": c, "params": 4e4, "tokens": c / 4e5, "seed": s,
                                "loss": a + slope * math.log10(c / 1e11) + 0.01 * s})  # fmt: skip
    fit = root / "fitin"
    fit.mkdir()
    (fit / "fit.json").write_text((ot / "runs.csv").read_text())  # a CSV that happens to be called fit.json
    spec = root / "g"
    spec.mkdir()
    (spec / "spec.json").write_text(json.dumps({"base": "debug", "vary": {"train.seed": ["0", "1"]}}))
    (root / "cfg").mkdir()
    (root / "cfg" / "config.json").write_text(json.dumps({"train": {"steps": 2}}))
    return {"root": root, "run": run, "ckpt": run / "checkpoints" / "step_0000002", "ot": ot, "fit": fit,
            "spec": spec}  # fmt: skip


# command -> (argv before --out, the own-input case: (argv, out)); {run}, {ckpt}, ... from the world
CASES: dict[str, tuple[list[str], tuple[list[str], str]]] = {
    "train": (["train", "--preset", "debug", "--no-progress"],
              (["train", "--preset", "debug", "--config", "{root}/cfg/config.json", "--no-progress"], "{root}/cfg")),
    "classifier train": (["classifier", "train", "{run}", "--data", "{root}/d.jsonl"],
                         (["classifier", "train", "{run}", "--data", "{root}/d.jsonl"], "{run}")),
    "likelihood": (["likelihood", "{run}"], (["likelihood", "{run}"], "{run}")),
    "diagnose": (["diagnose", "{run}"], (["diagnose", "{run}"], "{run}")),
    "geometry": (["geometry", "{run}"], (["geometry", "{run}"], "{run}")),
    "quality": (["quality", "{root}/s.jsonl"], (["quality", "{root}/q/quality.json"], "{root}/q")),
    "sweep": (["sweep", "{run}"], (["sweep", "{run}"], "{run}")),
    "distill": (["distill", "{run}"], (["distill", "{run}"], "{run}")),
    "export": (["export", "{run}"], (["export", "{run}"], "{run}")),
    "convert": (["convert", "mdlm", "{root}/peer"], (["convert", "mdlm", "{run}"], "{run}")),
    "zeroshot": (["zeroshot", "{run}"], (["zeroshot", "{run}"], "{run}")),
    "lmeval": (["lmeval", "{run}", "--tasks", "lambada"], (["lmeval", "{run}", "--tasks", "lambada"], "{run}")),
    "scaling plan": (["scaling", "plan", "--methods", "ar", "--sizes", "32x1", "--budgets", "1e9", "--per-budget",
                      "0"], (["scaling", "plan", "--methods", "ar", "--sizes", "32x1", "--budgets", "1e9",
                              "--per-budget", "0"], "{run}")),
    "scaling fit": (["scaling", "fit", "{ot}/runs.csv"], (["scaling", "fit", "{fit}/fit.json"], "{fit}")),
    "scaling overtrain": (["scaling", "overtrain", "{ot}/runs.csv", "--optimum", "a=1e12", "b=1e11"],
                          (["scaling", "overtrain", "{ot}/runs.csv", "--optimum", "a=1e12", "b=1e11"], "{ot}")),
    "grid plan": (["grid", "plan", "{spec}/spec.json"], (["grid", "plan", "{spec}/spec.json", "--force"], "{spec}")),
    "grid report": (["grid", "report", "{root}/grid"], (["grid", "report", "{root}/grid"], "{run}")),
    "grid trend": (["grid", "trend", "{root}/grid", "--steps", "2"],
                   (["grid", "trend", "{root}/grid", "--steps", "2"], "{run}")),
}  # fmt: skip


def test_every_out_option_has_its_cases():
    assert sorted(out_commands()) == sorted(CASES)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(world, capsys, argv: list[str]) -> str:
    argv = [a.format(**world) for a in argv]
    before = snapshot(world["root"])
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), (argv, rc, err)
    assert snapshot(world["root"]) == before, argv  # nothing written, nothing replaced
    return err[0]


@pytest.mark.parametrize("command", sorted(CASES))
def test_out_inside_a_runs_checkpoint_is_refused(world, capsys, command):
    argv, _ = CASES[command]
    line = refused(world, capsys, [*argv, "--out", "{ckpt}"])
    assert "--out" in line and ("checkpoint" in line or "holds a run" in line), line


@pytest.mark.parametrize("command", sorted(CASES))
def test_out_that_would_replace_an_input_is_refused(world, capsys, command):
    _, (argv, out) = CASES[command]
    if command == "quality":
        q = world["root"] / "q"
        q.mkdir(exist_ok=True)
        (q / "quality.json").write_text('{"text": "a b c"}\n')
    line = refused(world, capsys, [*argv, "--out", out])
    assert "--out" in line or "already holds a run" in line, line
