# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Distil a student and sample it: `replaid distill`
#
# **How to run it**: from the repository root, `python docs/tutorials/distill.py` (or
# `jupytext --to ipynb docs/tutorials/distill.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/distill/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# RePlaid samples by integrating its probability-flow ODE (DDIM, Heun, DPM-Solver++) or by ancestral
# DDPM steps; good samples take tens of steps. Progressive distillation (Salimans & Ho) trains a student
# whose one DDIM step lands where two of the teacher's do, halving the step count each round;
# consistency distillation trains a student that maps any point of the ODE trajectory to its end. The
# derivations and the measured few-step frontier are in [the distillation page](../results/distillation/README.md).
#
# Here: a `debug` teacher, a progressive student from 8 teacher steps to 2 in two short rounds, then
# the student sampled with its 2 DDIM steps. At this size the numbers mean nothing; every step is the
# one used at full size.

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")) / "distill"
TEACHER, STUDENT = WORK / "teacher", WORK / "student"
WORK.mkdir(parents=True, exist_ok=True)


def replaid(*args: str) -> str:
    """Run `replaid ARGS...` as a user would; its stdout is returned, a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


# %% [markdown]
# ## The teacher
#
# Any RePlaid run folder (or an exported folder, or a Hub id) can be a teacher.

# %%
replaid(
    "train", "--preset", "debug", "--out", str(TEACHER), "--overwrite", "--no-progress",
    "train.steps=40", "train.num_threads=1",
)  # fmt: skip
print(
    "teacher NELBO (nats/token):", json.loads((TEACHER / "final_eval.json").read_text())["eval"]["nelbo_nats_per_token"]
)

# %% [markdown]
# ## Progressive distillation
#
# `--from-steps 8 --to-steps 2`: round 1 trains a 4-step student on the teacher's 8 DDIM steps, round 2
# a 2-step student on round 1's student. `--steps-per-round` optimiser steps per halving (200 by
# default; a few here). The student is a normal run folder; `distill.json` records how it was made.

# %%
replaid(
    "distill", str(TEACHER), "--out", str(STUDENT), "--overwrite", "--no-progress",
    "--from-steps", "8", "--to-steps", "2", "--steps-per-round", "10", "--batch-size", "8",
)  # fmt: skip
made = json.loads((STUDENT / "distill.json").read_text())
print("teacher:", made["teacher"])
print({k: made["config"][k] for k in ("method", "from_steps", "to_steps", "steps_per_round", "teacher_solver")})

# %% [markdown]
# ## Sample the student, evaluate it
#
# A progressive student samples with DDIM at its step count (here 2 steps). `replaid eval` takes it as
# any run: its NELBO is still a valid bound, computed with the student network.

# %%
for line in replaid("sample", str(STUDENT), "--sampler", "ddim", "--steps", "2", "--num", "3", "--json").splitlines():
    row = json.loads(line)
    print(f"[{row['sampler']}, {row['steps']} steps, {row['nfe']} NFE] {row['text']!r}")
res = json.loads(replaid("eval", str(STUDENT), "--json"))
print(f"student NELBO {res['nelbo_nats_per_token']:.3f} nats/token (unigram {res['unigram_nats_per_token']:.3f})")
