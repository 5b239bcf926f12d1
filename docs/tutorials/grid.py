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
# # Compare two methods with seeds: `replaid grid`
#
# **How to run it**: from the repository root, `python docs/tutorials/grid.py` (or
# `jupytext --to ipynb docs/tutorials/grid.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/grid/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# One trained run is one draw: another `train.seed` (initialisation, data order, diffusion times)
# gives another number. A comparison of two methods is a claim about training, so it needs several
# seeds per method and an interval on the difference. `replaid grid` plans the (cell, seed) runs from
# one spec, runs them (skipping finished ones, resuming interrupted ones) and reports per-cell means
# with t-intervals and differences paired by seed.
#
# Here RePlaid against MDLM at the `debug` size, 2 seeds each, a few seconds per run on a CPU. At
# this size the verdict means nothing about the methods; the workflow is the one used at full size in
# [the ablations page](../results/ablations/README.md).

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")) / "grid"
WORK.mkdir(parents=True, exist_ok=True)


def replaid(*args: str, log: bool = False) -> str:
    """Run `replaid ARGS...` as a user would; its stdout is returned (with its log lines from stderr when
    ``log``), a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout + (p.stderr if log else "")


# %% [markdown]
# ## The spec
#
# `base` is a preset (or a config file), `overrides` apply to every run, each cell adds its own, and
# `seeds: 2` means seeds 0 and 1 (use 3 or more for a real comparison: the
# intervals are Student-t over seeds). Differences are paired against the `reference` cell. The thread
# count changes the numbers, so it is pinned.

# %%
spec = WORK / "methods.yaml"
spec.write_text(
    """\
base: debug
overrides: [train.steps=20, train.num_threads=1, eval.max_batches=4]
seeds: 2
reference: mdlm
cells:
  replaid: [method=replaid]
  mdlm: [method=mdlm]
"""
)
print(replaid("grid", "plan", str(spec), "--out", str(WORK / "study"), "--force"))

# %% [markdown]
# ## Run
#
# Each run is a normal run folder `study/runs/<cell>__s<seed>`; `--max-parallel 2` trains two at a time
# (each on one thread, as pinned above). Running the same command again skips what is done.

# %%
print(replaid("grid", "run", str(WORK / "study"), "--max-parallel", "2", "--no-progress", log=True))
print(replaid("grid", "run", str(WORK / "study"), "--no-progress", log=True))  # nothing left to do

# %% [markdown]
# ## Report
#
# Per-cell mean test bound (nats/token) with its t-interval over seeds, and the difference to the
# reference paired by seed; `report.md`, `report.json` and `report.png` are written into the grid
# folder.

# %%
print(replaid("grid", "report", str(WORK / "study"), "--reference", "mdlm"))
report = json.loads((WORK / "study" / "report.json").read_text())
print(sorted(report))
