"""The plateau signatures of the training log (issue 48 §1), each against an independent numpy
computation on the weights and activations of a real (debug-size) model, and the log itself."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.special import log_softmax as np_log_softmax

from replaid.methods import get_method
from replaid.presets import get_preset
from replaid.training import signatures as sg

VOCAB = 64


def model_for(method: str, seed: int = 0):
    cfg = get_preset("debug")
    cfg.method = method
    torch.manual_seed(seed)
    m = get_method(cfg)
    model = m.build_model(VOCAB)
    with torch.no_grad():  # weights away from their zero init, so every path carries signal
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return cfg, m, model.eval()


def np_kl(logits: np.ndarray, unigram_logp: np.ndarray, keep: np.ndarray) -> float:
    logp = np_log_softmax(logits.astype(np.float64), axis=-1)
    kl = (np.exp(logp) * (logp - unigram_logp)).sum(-1)
    return float(kl[keep].mean())


def test_kl_prior_share_rank_distance_match_numpy():
    g = torch.Generator().manual_seed(0)
    logits, prior = torch.randn(3, 5, VOCAB, generator=g) * 3, torch.randn(3, 5, VOCAB, generator=g)
    keep = torch.rand(3, 5, generator=g) < 0.6
    uni = torch.log_softmax(torch.randn(VOCAB, generator=g, dtype=torch.float64), -1)
    assert sg.kl_from_unigram(logits, uni, keep) == pytest.approx(np_kl(logits.numpy(), uni.numpy(), keep.numpy()))
    assert sg.kl_from_unigram(uni.expand(2, 3, VOCAB), uni, torch.ones(2, 3, dtype=torch.bool)) == pytest.approx(
        0.0, abs=1e-12
    )
    vp, vh = prior.numpy().var(-1), (logits - prior).numpy().var(-1)
    want = (vp / (vp + vh))[keep.numpy()].mean()
    assert sg.prior_share(logits - prior, prior, keep) == pytest.approx(want, rel=1e-9)
    w = torch.randn(40, 6, generator=g)
    s = np.linalg.svd(w.numpy().astype(np.float64), compute_uv=False)
    p = s / s.sum()
    assert sg.effective_rank(w) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert sg.effective_rank(torch.eye(6)) == pytest.approx(6.0)  # isotropic: full rank
    assert sg.min_pairwise_distance(w) == pytest.approx(pdist(w.numpy().astype(np.float64)).min(), rel=1e-9)
    for chunk in (1, 7, 64):  # row blocks of every size, the last one short
        assert sg.min_pairwise_distance(w, chunk) == pytest.approx(pdist(w.numpy().astype(np.float64)).min(), rel=1e-9)


def np_rotary(x: np.ndarray, L: int, hd: int) -> np.ndarray:
    """RoPE on halves of the head dim, frequencies 10000^(-2i/hd), written out in numpy."""
    inv = 1.0 / 10_000.0 ** (np.arange(0, hd, 2) / hd)
    f = np.arange(L)[:, None] * inv[None, :]  # (L, hd/2)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([x1 * np.cos(f) - x2 * np.sin(f), x1 * np.sin(f) + x2 * np.cos(f)], -1)


@pytest.mark.parametrize("method", ["replaid", "plaid", "mdlm"])
def test_layer_signatures_match_numpy_on_saved_weights_and_activations(method):
    cfg, m, model = model_for(method)
    backbone = model.get_submodule("backbone")
    tokens = torch.randint(0, VOCAB, (3, cfg.data.seq_len), generator=torch.Generator().manual_seed(1))
    inputs: dict[int, np.ndarray] = {}  # what each block's qkv projection reads, saved by the test's own hook
    hooks = [
        blk.qkv.register_forward_hook(lambda _m, inp, _o, i=i: inputs.__setitem__(i, inp[0].detach().double().numpy()))
        for i, blk in enumerate(backbone.blocks)
    ]
    with sg.recorded_layers(backbone) as rec:
        m.probe(model, tokens, 0.5, torch.Generator().manual_seed(2))
    for h in hooks:
        h.remove()
    out = sg.layer_signatures(backbone, rec, tokens.shape[1], tokens.device)
    for i, blk in enumerate(backbone.blocks):
        W = blk.qkv.weight.detach().double().numpy()  # (3D, D)
        B, L, D = inputs[i].shape
        H, hd = blk.n_heads, D // blk.n_heads
        qkv = (inputs[i] @ W.T).reshape(B, L, 3, H, hd).transpose(2, 0, 3, 1, 4)  # (3, B, H, L, hd)
        q, k = np_rotary(qkv[0], L, hd), np_rotary(qkv[1], L, hd)
        logp = np_log_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), axis=-1)
        assert out[f"attn_entropy/{i}"] == pytest.approx(-(np.exp(logp) * logp).sum(-1).mean(), rel=1e-4)
        h = rec["out"][i].double().numpy()  # (B, L, D)
        u = h / np.linalg.norm(h, axis=-1, keepdims=True)
        cos = np.einsum("bld,bmd->blm", u, u)
        off = ~np.eye(L, dtype=bool)
        assert out[f"pos_cosine/{i}"] == pytest.approx(cos[:, off].mean(), rel=1e-9)
        assert 0 < out[f"attn_entropy/{i}"] <= math.log(L) + 1e-9


def test_replaid_probe_splits_head_and_prior_and_feeds_back_self_conditioning():
    cfg, m, model = model_for("replaid")
    tokens = torch.randint(0, VOCAB, (2, cfg.data.seq_len), generator=torch.Generator().manual_seed(3))
    p = m.probe(model, tokens, 0.3, torch.Generator().manual_seed(4))
    assert p.prior is not None and p.sc_estimate is not None and p.clean is not None and p.keep.all()
    # the prior logits are (alpha / sigma^2) z E^T at gamma(0.3): recompute z from the same noise in float64
    with torch.no_grad():
        gamma = float(model.schedule(torch.tensor([0.3], dtype=torch.float64))[0])
        E = model.embedding().double().numpy()
    alpha, sigma2 = math.sqrt(1 / (1 + math.exp(gamma))), 1 / (1 + math.exp(-gamma))
    eps = torch.randn(p.clean.shape, generator=torch.Generator().manual_seed(4)).double().numpy()
    z = alpha * E[tokens.numpy()] + math.sqrt(sigma2) * eps
    np.testing.assert_allclose(p.prior.double().numpy(), alpha / sigma2 * z @ E.T, rtol=1e-4, atol=1e-4)
    # what self-conditioning feeds back is the first pass's categorical mean x_hat E
    first = model(torch.from_numpy(z).float(), torch.full((2,), gamma, dtype=torch.float64), None)
    np.testing.assert_allclose(p.sc_estimate.numpy(), first.e_hat.detach().numpy(), rtol=1e-4, atol=1e-5)
    cos = (p.sc_estimate.double().numpy() * E[tokens.numpy()]).sum(-1) / np.linalg.norm(p.sc_estimate.numpy(), axis=-1)
    out = sg.signatures(
        m, model, tokens, torch.log_softmax(torch.zeros(VOCAB, dtype=torch.float64), -1), torch.Generator()
    )
    assert {"sc_cosine", "sc_input", "prior_share/t0.5", "kl_unigram/t0.5", "emb_rank", "emb_min_dist"} <= set(out)
    assert -1 <= out["sc_cosine"] <= 1 and out["sc_input"] >= 0 and np.isfinite(cos).all()


def test_mdlm_probe_predicts_at_masked_positions_only():
    cfg, m, model = model_for("mdlm")
    tokens = torch.randint(0, VOCAB, (4, cfg.data.seq_len), generator=torch.Generator().manual_seed(5))
    p = m.probe(model, tokens, 0.5, torch.Generator().manual_seed(6))
    frac = float(p.keep.double().mean())
    assert 0.3 < frac < 0.7 and p.prior is None  # about half masked at t = 0.5
    z = torch.where(p.keep, torch.full_like(tokens, model.n_out), tokens)
    np.testing.assert_allclose(p.logits.detach().numpy(), model(z, None).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_signatures_in_the_log_and_training_unchanged(tmp_path):
    """Every signature lands in metrics.jsonl on logging steps, and the trajectory is the one trained
    without them (the probes draw from their own generator and leave the weights alone)."""
    from replaid.eval.evaluate import evaluate
    from replaid.training.train import train

    rows = {}
    for n in (0, 4):
        cfg = get_preset("debug")
        cfg.train.steps, cfg.train.log_every, cfg.train.logger, cfg.train.signature_rows = 6, 3, "none", n
        out = tmp_path / f"r{n}"
        train(cfg, out, evaluate=evaluate, progress=False)
        rows[n] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows[4] if "loss" in r]
    assert logged and all("kl_unigram/t0.5" in r and "attn_entropy/0" in r and "emb_rank" in r for r in logged)
    assert not any("kl_unigram/t0.5" in r for r in rows[0])
    for a, b in zip(rows[0], rows[4], strict=True):
        for k in ("loss", "recon", "diffusion", "gamma_0", "grad_norm", "eval/nelbo"):
            assert a.get(k) == b.get(k), k
