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
# # Evaluate a converted peer checkpoint: `replaid convert`
#
# **How to run it**: from the repository root, `python docs/tutorials/peers.py` (or
# `jupytext --to ipynb docs/tutorials/peers.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/peers/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# The official MDLM, Duo and LangFlow checkpoints convert into replaid run folders, so that
# `replaid eval`, `sample`, `likelihood`, `zeroshot` and `lmeval` score them with the same code and
# the same data as replaid's own runs. Online, the source is a Hugging Face Hub id:
#
# ```bash
# replaid convert mdlm kuleshov-group/mdlm-owt --out peers/mdlm --set data.tokenizer_path=PATH/TO/gpt2
# ```
#
# This notebook runs offline from a clone of the repository, on the tiny MDLM checkpoint of the
# converter tests (`tests/fixtures/peers/mdlm`: random weights at hidden size 16 and a 40-word vocabulary,
# saved in the Hub layout of `kuleshov-group/mdlm-owt` by MDLM's own modelling code). Its numbers
# mean nothing; the commands are the ones for the real checkpoint. The converters are verified
# against the peers' own code in [the Hub page](../results/hub/README.md).

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")) / "peers"
FIXTURES = Path("tests/fixtures/peers")  # relative to the repository's root
OUT = WORK / "mdlm"
WORK.mkdir(parents=True, exist_ok=True)


def replaid(*args: str) -> str:
    """Run `replaid ARGS...` as a user would; its stdout is returned, a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


# %% [markdown]
# ## Convert
#
# `--set` gives the run config of the converted folder: which tokenizer the checkpoint was trained
# with (for the real MDLM: GPT-2's) and which data `replaid eval` reads by default. A converted folder is
# never overwritten; the notebook removes its own earlier output first.

# %%
import shutil  # noqa: E402

shutil.rmtree(OUT, ignore_errors=True)
print(FIXTURES / "mdlm", "->", sorted(p.name for p in (FIXTURES / "mdlm").iterdir()))
replaid(
    "convert", "mdlm", str(FIXTURES / "mdlm"), "--out", str(OUT), "--set",
    "data.tokenizer=file", f"data.tokenizer_path={FIXTURES / 'words.json'}", "data.source=stdlib",
    "data.max_docs=200", "eval.batch_size=4", "eval.t_samples=2",
)  # fmt: skip
print(OUT, "->", sorted(p.name for p in OUT.iterdir()))

# %% [markdown]
# ## Evaluate and sample
#
# MDLM's bound is its NELBO over masking rates, computed by replaid's MDLM method on the converted
# network; sampling uses MDLM's ancestral sampler.

# %%
res = json.loads(replaid("eval", str(OUT), "--max-batches", "1", "--json"))
print(f"{res['method']}: NELBO {res['nelbo_nats_per_token']:.3f} nats/token on {res['tokens']} tokens")
for line in replaid("sample", str(OUT), "--num", "2", "--steps", "4", "--json").splitlines():
    row = json.loads(line)
    print(f"[{row['sampler']}, {row['steps']} steps] {row['text']!r}")

# %% [markdown]
# ## From Python
#
# `from_pretrained` loads the converted folder like any run: `.model`, `.method`, `.tokenizer`.

# %%
from replaid.hub import from_pretrained  # noqa: E402

run = from_pretrained(OUT, device="cpu")
print(type(run.method).__name__, run.method.kind, sum(p.numel() for p in run.model.parameters()), "parameters")
