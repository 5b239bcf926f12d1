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
# # Add your own method, without forking replaid
#
# **How to run it**: from the repository root, `python docs/tutorials/own_method.py` (or
# `jupytext --to ipynb docs/tutorials/own_method.py`, then open the notebook from the root). It writes
# everything under `runs/tutorials/own_method/` (`REPLAID_TUTORIAL_DIR` moves `runs/tutorials`).
#
# A method is one file: a class that implements the `Method` contract, and beside it a dataclass of its
# own options. A package registers it through the entry-point group `replaid.methods`. After
# `pip install`, `replaid train / eval / sample / export` take it as they take the built-in methods.
# [How to add a method](../adding-a-method.md) lists the contract. This notebook writes a method,
# installs it, checks its loss against an independent computation, and then trains, evaluates and
# samples it with the real CLI. It uses the `debug` size, a few seconds each on a CPU.
#
# The method is an autoregressive model trained with PaLM's z-loss. The training loss adds
# `z * log(Z)^2` per token to the cross-entropy, where `log Z` is the logsumexp of the logits. The
# penalty keeps the softmax normaliser near 1. Evaluation reports the exact NLL, without the penalty,
# so the method's bound stays comparable with AR's.

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("REPLAID_TUTORIAL_DIR", "runs/tutorials")).resolve() / "own_method"
PKG, SITE = WORK / "zloss_ar_pkg", WORK / "site"
PKG.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The file
#
# `options` is the dataclass of the config section `zloss`. Its `validate` refuses a bad value with one
# line that names the key. `kind` picks the samplers, the FLOP counter and the memory model. The model is
# the shared backbone (`TokenDiT`), made causal.

# %%
(PKG / "zloss_ar.py").write_text(
    '''"""An autoregressive model trained with PaLM's z-loss (exact NLL at evaluation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from replaid.config import check
from replaid.diffusion.nelbo import masked_mean
from replaid.methods import Kind, Method
from replaid.model.tokens import TOKEN_MODEL_KEYS, TokenDiT


@dataclass
class ZLossOptions:
    """The config section ``zloss``."""

    z: float = 1e-4  # weight of log(Z)^2 per token in the training loss

    def validate(self) -> None:
        check(self.z >= 0, "zloss.z", "must be >= 0")


class ZLossAR(Method[TokenDiT]):
    name = "zloss-ar"
    kind = Kind.AUTOREGRESSIVE
    description = "autoregressive, z-loss in training (exact NLL)"
    samplers = ("ancestral",)
    bound = "nll"
    conditional = "exact"
    options = ZLossOptions
    section = "zloss"
    model_keys = TOKEN_MODEL_KEYS

    def build_model(self, vocab_size: int) -> TokenDiT:
        return TokenDiT(self.cfg.model, vocab_size + 1, vocab_size, time_conditioning=False, causal=True)

    def logits(self, model: TokenDiT, tokens: Tensor) -> Tensor:
        """(B, L, V): token i predicted from tokens < i (BOS, the input-only id V, first)."""
        bos = torch.full_like(tokens[:, :1], model.n_in - 1)
        return model(torch.cat([bos, tokens[:, :-1]], dim=1)).float()

    def terms(self, model: TokenDiT, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token cross-entropy and log(Z), each (B, L)."""
        logits = self.logits(model, tokens)
        ce = F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")
        return ce, torch.logsumexp(logits, dim=-1)

    def train_loss(self, model, tokens, generator, mask=None, t_diff=None, n_recon=None):
        ce, log_z = self.terms(model, tokens)
        loss = masked_mean(ce + self.cfg.options.z * log_z**2, mask)  # (B,)
        return loss.mean(), {"loss": loss.detach(), "log_z": log_z.detach().mean()}

    @torch.no_grad()
    def eval_bound(self, model, tokens, generator, mask=None):
        return {"nll": masked_mean(self.terms(model, tokens)[0], mask)}

    @torch.no_grad()
    def conditional_nll(self, model, tokens, target, generator):
        return (self.terms(model, tokens)[0].double() * target.double()).sum(1)

    def embedding_rows(self, model: TokenDiT) -> Tensor:
        return model.rows(model.n_out)
'''
)
(PKG / "pyproject.toml").write_text(
    """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "zloss-ar"
version = "0.1"
dependencies = ["replaid"]

[tool.setuptools]
py-modules = ["zloss_ar"]

[project.entry-points."replaid.methods"]
zloss-ar = "zloss_ar:ZLossAR"
"""
)
print(sum(1 for _ in (PKG / "zloss_ar.py").open()), "lines in zloss_ar.py")

# %% [markdown]
# ## Install it
#
# In your own environment this is `pip install -e zloss_ar_pkg`. Here the notebook installs into a
# folder of its own (`--target`), so that it leaves the environment as it found it. Then it puts that
# folder on the path of the `replaid` processes it starts.

# %%
pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
subprocess.run([*pip, "--target", str(SITE), "--upgrade", str(PKG)], check=True)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}


def replaid(*args: str) -> str:
    """Run `replaid ARGS...` with the package installed; a failure stops the notebook."""
    p = subprocess.run([sys.executable, "-m", "replaid", *args], capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        raise RuntimeError(f"replaid {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


print(replaid("train", "--help").split("\n")[1])  # the method is now one of --method's choices

# %% [markdown]
# ## Check the loss against an independent computation
#
# A new loss gets a test before it trains anything. Here the method's training loss, on a fresh model,
# equals the same formula written out by hand from the logits: log-softmax, then `z * logsumexp^2`,
# in float64. Planting a bug shows the check does its job. With the penalty's square dropped, say, the
# check fails.

# %%
sys.path.insert(0, str(SITE))
import torch  # noqa: E402

from replaid.methods import get_method  # noqa: E402
from replaid.presets import resolve  # noqa: E402

cfg = resolve("debug", None, ["method=zloss-ar", "zloss.z=0.01"])
method = get_method(cfg)
torch.manual_seed(0)
model = method.build_model(64)
tokens = torch.randint(0, 64, (3, 16))
loss, _ = method.train_loss(model, tokens, torch.Generator().manual_seed(0))

logits = method.logits(model, tokens).double()  # (B, L, V)
log_z = torch.logsumexp(logits, dim=-1)
ce = log_z - logits.gather(-1, tokens[..., None])[..., 0]
by_hand = (ce + 0.01 * log_z**2).mean()
print(f"method {loss.item():.6f}  by hand {by_hand.item():.6f}")
assert abs(loss.item() - by_hand.item()) < 1e-5

# %% [markdown]
# ## Train, evaluate, sample
#
# The run folder records the method's name and its `zloss` section. `eval` reports the exact NLL
# (`bound = "nll"`). `sample` uses the first of the method's `samplers`. Thirty steps at debug size
# leave the model above the unigram level, so its numbers say nothing about the method. They only show
# that every command takes it.

# %%
run = WORK / "run"
args = ["--preset", "debug", "--method", "zloss-ar", "--out", str(run), "--overwrite", "--no-progress"]
out = replaid("train", *args, "zloss.z=0.001", "train.steps=30", "train.num_threads=1")
saved = json.loads((run / "config.json").read_text())
print("method:", saved["method"], " options:", saved.get("zloss"))
ev = json.loads(replaid("eval", str(run), "--json", "--max-batches", "4"))
print({k: round(v, 3) for k, v in ev.items() if isinstance(v, float) and "nats" in k})
print(replaid("sample", str(run), "--num", "2", "--length", "32"))

# %% [markdown]
# ## Where to go next
#
# - Compare the method with AR on seeds with `replaid grid` ([the grid tutorial](grid.md)): a cell
#   `zloss: [method=zloss-ar, zloss.z=1e-4]` beside `ar: [method=ar]`.
# - Put the same file in `src/replaid/methods/`, with one line in `registry.BUILTIN_METHODS`, to make it a
#   built-in method: two files either way.
# - `tests/test_method_contract.py` is the contract test that every built-in method passes. Run it on
#   yours before you trust its numbers.
