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
# # A sweep on SLURM: `replaid scaling run --executor slurm`
#
# **How to run it**: from the repository root, `python docs/tutorials/slurm.py` (or
# `jupytext --to ipynb docs/tutorials/slurm.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/slurm/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# `replaid scaling plan` resolves every (method, FLOP budget, model size) run of an IsoFLOP study into
# a manifest; `replaid scaling run` trains the unfinished ones: locally, or as one SLURM job array
# through [submitit](https://github.com/facebookincubator/submitit), each job a `torchrun` over
# `--gpus-per-job` GPUs, preempted or timed-out jobs requeued and resumed from their checkpoints.
#
# This notebook runs where there is no cluster, so it puts a stand-in `sbatch` on `PATH` that keeps
# the batch script it is given and answers as `sbatch` does. Everything else is the real code path: the
# script shown below is the one submitit writes for this sweep. On a login node, leave the stand-in
# out.

# %%
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")) / "slurm"
SWEEP = WORK / "sweep"
WORK.mkdir(parents=True, exist_ok=True)


def replaid(*args: str, env: dict | None = None) -> str:
    """Run `replaid ARGS...` as a user would; its stdout and stderr are returned, a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


# %% [markdown]
# ## Plan the sweep
#
# Two methods, one budget of 1e9 training FLOPs, the `tiny` sizes (widths 8 to 24, one block): eight
# runs. `replaid scaling plan --sizes paper` prints the paper's five budgets with their GPU-hours.

# %%
print(replaid("scaling", "plan", "--methods", "replaid", "mdlm", "--sizes", "tiny", "--budgets", "1e9",
              "--out", str(SWEEP), "--force"))  # fmt: skip

# %% [markdown]
# ## Submit it as a job array
#
# The stand-in: `sbatch` copies the script to `submitted.sh` and prints `Submitted batch job 4242`;
# submitit also checks that `srun` exists (it is only called inside the jobs, on the cluster).

# %%
bin_dir = WORK / "bin"
bin_dir.mkdir(exist_ok=True)
(bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" "{WORK / "submitted.sh"}"\necho "Submitted batch job 4242"\n')
(bin_dir / "srun").write_text("#!/bin/sh\necho 'srun: not on a cluster' >&2\nexit 1\n")
for f in ("sbatch", "srun"):
    (bin_dir / f).chmod(0o755)
cluster = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

# 8 GPUs per job, at most 4 jobs at once, 10 hours each, partition "gpu"; --no-wait: submit and return
print(replaid("scaling", "run", str(SWEEP), "--executor", "slurm", "--gpus-per-job", "8", "--max-parallel", "4",
              "--slurm", "slurm_partition=gpu", "timeout_min=600", "--no-wait", env=cluster))  # fmt: skip

# %% [markdown]
# ## The batch script
#
# One array of eight tasks (`--array=0-7%4`), each on one node with 8 GPUs. `--signal=USR2@120` warns a
# job two minutes before its time limit; submitit then calls the job's `checkpoint()`, which requeues
# it, and the requeued job resumes the run from its last checkpoint. Each task unpickles its run (under
# `SWEEP/submitit/`) and trains it with `torchrun` over the node's GPUs.

# %%
script = (WORK / "submitted.sh").read_text()
print(script)
assert "#SBATCH --array=0-7%4" in script and "#SBATCH --gpus-per-node=8" in script

# %% [markdown]
# ## Progress
#
# `--status` reads the run folders, wherever the jobs ran: nothing is done yet here. `replaid scaling fit
# SWEEP` fits the laws once the runs are done.

# %%
print(replaid("scaling", "run", str(SWEEP), "--status"))
