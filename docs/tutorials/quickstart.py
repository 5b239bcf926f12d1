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
# # Quickstart: train, evaluate, sample, plot
#
# **How to run it**: from the repository root, `python docs/tutorials/quickstart.py` (or
# `jupytext --to ipynb docs/tutorials/quickstart.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/quickstart/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# A RePlaid model at the `debug` size (2 DiT blocks of width 32, sequences of 32 tokens, a 512-token
# BPE tokenizer) trained for a few seconds on a CPU, on the built-in corpus (the docstrings of the
# installed Python standard library: nothing is downloaded). At this size the model has barely left the
# unigram plateau: the point is the workflow, not the text. `replaid train --preset first-run` (what
# `scripts/demo.sh` trains) is the same run at a size that learns (about six minutes on 2 cores).
#
# Every step is the command line a user would type (`replaid train`, `replaid eval`) or the Python API
# behind it (`replaid.hub.from_pretrained`, `replaid.sampling.generate.generate`).

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

# where the runs go (CI points this at a temporary folder)
WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")) / "quickstart"
RUN = WORK / "run"
WORK.mkdir(parents=True, exist_ok=True)


def replaid(*args: str) -> str:
    """Run `replaid ARGS...` as a user would; its stdout is returned, a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


# %% [markdown]
# ## Train
#
# `--preset debug` picks the size; `key=value` overrides change any config key (`replaid train
# --show-config` prints them all). `--overwrite` lets the notebook be run again into the same folder.
# The run folder holds `config.json`, the checkpoints, `metrics.jsonl` (one JSON row per logged step),
# TensorBoard events under `tb/` and `final_eval.json`.

# %%
replaid(
    "train", "--preset", "debug", "--out", str(RUN), "--overwrite", "--no-progress",
    "train.steps=60", "train.log_every=5", "train.num_threads=1",
)  # fmt: skip
print(sorted(p.name for p in RUN.iterdir()))

# %% [markdown]
# ## Evaluate: the NELBO and its pieces
#
# `replaid eval` reports the per-token negative ELBO (nats) on held-out text and its three terms, the
# reconstruction loss at `t = 0`, the diffusion loss over `t` and the prior KL at `t = 1`, beside the
# perplexity a unigram model of the same tokens would get: a model that learned anything beats it.

# %%
res = json.loads(replaid("eval", str(RUN), "--split", "valid", "--json"))
pieces = {k: res[k] for k in ("recon", "diffusion", "prior")}
print(f"step {res['step']}: NELBO {res['nelbo_nats_per_token']:.3f} nats/token = {pieces}")
print(f"NELBO perplexity {res['nelbo_ppl']:.1f}; unigram perplexity of the same tokens {res['unigram_ppl']:.1f}")
assert abs(sum(pieces.values()) - res["nelbo_nats_per_token"]) < 1e-6 * max(1.0, res["nelbo_nats_per_token"])

# %% [markdown]
# ## Sample
#
# `from_pretrained` loads a run folder, an exported folder or a Hugging Face Hub id; `generate` is what
# `replaid sample` calls. The default sampler of a RePlaid run is DDPM ancestral sampling of the
# continuous latent; `steps` is the number of denoising steps.

# %%
from replaid.hub import from_pretrained  # noqa: E402
from replaid.sampling.generate import generate  # noqa: E402
from replaid.sampling.request import SampleRequest  # noqa: E402

run = from_pretrained(RUN, device="cpu")
rows = generate(run, SampleRequest(num=3, steps=32, seed=0, progress=False))
for r in rows:
    print(f"[{r['sampler']}, {r['steps']} steps] {r['text']!r}")

# %% [markdown]
# ## Plot: the training curve and the learned noise schedule
#
# The training loss (the NELBO estimate of each logged step) against the unigram model's loss on the
# same batches, and the trained model's learned schedule `gamma(t) = -log SNR(t)`, increasing in `t`
# from `gamma_0` to `gamma_1` (the symbols: [notation](../notation.md)).

# %%
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

rows = [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]
train_rows = [r for r in rows if "loss" in r]
t = torch.linspace(0, 1, 101, dtype=torch.float64)
with torch.no_grad():
    gamma = run.model.schedule.gamma(t.to(next(run.model.schedule.parameters()).dtype))

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
a.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], label="NELBO (train batch)")
a.plot([r["step"] for r in train_rows], [r["unigram"] for r in train_rows], "--", label="unigram")
a.set(xlabel="step", ylabel="nats / token", title="training")
a.legend()
b.plot(t.numpy(), gamma.double().numpy())
b.set(xlabel="t", ylabel="gamma(t)", title="learned schedule")
fig.tight_layout()
png = WORK / "quickstart.png"
fig.savefig(png, dpi=100)
print(f"wrote {png}")
assert png.stat().st_size > 0 and len(train_rows) >= 10
