"""RePlaid's ablation switches each train and evaluate (debug preset), and the CE term's gradient
reaches only the embeddings and the denoiser (paper section 5.1)."""

from functools import partial

import numpy as np
import pytest
import torch

from replaid.eval.evaluate import evaluate
from replaid.methods.replaid import RePlaidMethod
from replaid.presets import resolve
from replaid.training.train import train as _train

train = partial(_train, evaluate=evaluate)  # the trainer with the evaluation commands/train.py wires in


ABLATIONS = {
    "no-output-prior": ["model.output_prior=false"],
    "no-self-conditioning": ["model.self_conditioning=false"],
    "fixed-linear-schedule": ["diffusion.schedule=linear"],
    "frozen-random-embeddings": ["model.embeddings=frozen-random"],
    "one-hot-embeddings": ["model.embeddings=one-hot"],
    "d_e-64": ["model.d_e=64"],
    "ce-term": ["diffusion.ce_weight=1.0"],
}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_ablation_trains_and_evaluates(tmp_path, name):
    cfg = resolve("debug", None, ["train.steps=3", "eval.max_batches=1", *ABLATIONS[name]])
    res = train(cfg, tmp_path / name, progress=False)
    assert np.isfinite(res["eval"]["nelbo_nats_per_token"])
    assert res["eval"]["nelbo_nats_per_token"] > 0


def test_frozen_embeddings_from_file(tmp_path):
    from safetensors.torch import save_file

    V = 512  # the debug preset's BPE vocabulary
    save_file({"embedding": torch.randn(V, 8)}, str(tmp_path / "emb.safetensors"))
    cfg = resolve(
        "debug",
        None,
        [
            "train.steps=2",
            "eval.max_batches=1",
            "model.embeddings=file",
            "model.d_e=8",
            f"model.embeddings_path={tmp_path / 'emb.safetensors'}",
        ],
    )
    res = train(cfg, tmp_path / "run", progress=False)
    assert np.isfinite(res["eval"]["nelbo_nats_per_token"])


def test_ce_term_gradient_reaches_only_embeddings_and_denoiser():
    cfg = resolve("debug", None, ["diffusion.ce_weight=1.0", "diffusion.sc_rate=0"])
    method = RePlaidMethod(cfg)
    torch.manual_seed(0)
    model = method.build_model(40)
    with torch.no_grad():
        model.final.linear.weight.normal_(0, 0.1)
    tok = torch.randint(0, 40, (4, 8))
    t = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    ce = method._ce_term(model, tok, t, torch.Generator().manual_seed(0), None, 1)
    ce.backward()
    assert model.schedule.gamma_0.grad is None and model.schedule.shape.a.grad is None
    assert model.embedding.weight.grad.abs().max() > 0 and model.final.linear.weight.grad.abs().max() > 0
