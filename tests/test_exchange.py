"""The embedding-exchange ablation switches (appendix "Exchanging Embedding Configurations"):
RePlaid with MDLM's embeddings (d_e = hidden, no up-projection, raw rows) and MDLM with RePlaid's
(d_e-dim unit rows, bias-free up-projection, the embedding optimiser group)."""

import math

import pytest
import torch

from replaid.config import ConfigError
from replaid.diffusion.denoiser import alpha_sigma, prior_logits
from replaid.methods import get_method
from replaid.model.replaid import RePlaid
from replaid.model.tokens import TokenDiT
from replaid.presets import resolve
from replaid.training.train import build_optimizer


def _cfg(*overrides):
    return resolve("debug", None, list(overrides))


def test_prior_logits_with_row_norms_are_the_gaussian_posterior_for_any_row_length():
    g = torch.Generator().manual_seed(0)
    V, d = 7, 5
    E = torch.randn(V, d, generator=g, dtype=torch.float64) * torch.linspace(0.3, 3.0, V, dtype=torch.float64)[:, None]
    z = torch.randn(2, 3, d, generator=g, dtype=torch.float64)
    gamma = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    a, s = alpha_sigma(gamma)
    # float64 reference: log N(z; alpha e_v, sigma^2 I) over v, up to a per-position constant
    ref = -((z[:, :, None, :] - a.view(-1, 1, 1, 1) * E) ** 2).sum(-1) / (2 * s.view(-1, 1, 1) ** 2)
    got = prior_logits(z, gamma, E, row_norms=True).double()
    diff = got - ref
    assert torch.allclose(diff, diff[..., :1].expand_as(diff), atol=1e-3)
    # without the norm term the rows' lengths leak in (that is why the switch exists)
    bad = prior_logits(z, gamma, E).double() - ref
    assert not torch.allclose(bad, bad[..., :1].expand_as(bad), atol=1e-2)


def test_replaid_with_mdlm_embeddings_raw_rows_and_no_up_projection():
    cfg = _cfg("model.d_e=32", "model.up_projection=false", "model.normalize_embeddings=false")
    m = RePlaid(cfg.model, cfg.diffusion, 50)
    assert isinstance(m.in_z, torch.nn.Identity)
    with torch.no_grad():
        m.embedding.weight.mul_(torch.linspace(0.5, 2.0, 50)[:, None])
    E = m.embedding_matrix()
    assert torch.allclose(E, m.embedding.weight)  # rows are not renormalised
    assert not torch.allclose(E.norm(dim=-1), torch.ones(50), atol=1e-2)
    # z enters the backbone unchanged (times the fixed input scale): no in_z parameters anywhere
    groups = m.param_groups()
    assert all(p.shape != (32, 32) or p is not getattr(m.in_z, "weight", None) for p in groups["projections"])
    assert len(groups["projections"]) == 2
    # the output prior logits use the exact Gaussian posterior (row-norm term)
    z, gamma = torch.randn(2, 4, 32), torch.tensor([0.0, 1.0], dtype=torch.float64)
    with torch.no_grad():
        out = m(z, gamma)
        feats, _ = m.hidden_states(z, gamma, None)
        expect = m.head_logits(feats) + prior_logits(z, gamma, E, row_norms=True)
    assert torch.allclose(out.logits, expect, atol=1e-4)
    # default RePlaid: unit rows and a d_e -> hidden up-projection
    d = _cfg()
    m0 = RePlaid(d.model, d.diffusion, 50)
    assert torch.allclose(m0.embedding_matrix().norm(dim=-1), torch.ones(50), atol=1e-5)
    assert isinstance(m0.in_z, torch.nn.Linear) and m0.in_z.bias is None


def test_up_projection_off_needs_d_e_equal_hidden():
    with pytest.raises(ConfigError, match="model.up_projection"):
        _cfg("model.up_projection=false")  # debug: d_e 16, hidden 32
    _cfg("model.up_projection=false", "model.d_e=32")


def test_mdlm_with_replaid_embeddings_unit_rows_up_projection_and_embedding_group():
    cfg = _cfg(
        "method=mdlm",
        "model.factored_embedding=true",
        "model.d_e=8",
        "optim.lr_embedding=0.01",
        "optim.wd_embedding=0",
        "optim.lr_backbone=0.001",
        "optim.wd_backbone=0.1",
    )
    model = get_method(cfg).build_model(20)  # 20 tokens + [MASK]
    assert model.embed.weight.shape == (21, 8) and model.embed_up.bias is None
    assert model.embed_up.weight.shape == (cfg.model.hidden, 8)
    with torch.no_grad():
        model.embed.weight.mul_(3.0)
    ids = torch.tensor([[0, 5, 20, 3]])
    h = model.input_states(ids)  # (1, 4, hidden)
    e = model.embed.weight[ids[0]]
    ref = (e / e.norm(dim=-1, keepdim=True)) * math.sqrt(8) @ model.embed_up.weight.t()
    assert torch.allclose(h[0], ref, atol=1e-5)
    # soft one-hot weights over the rows (Duo's input) give the same states as the ids
    soft = torch.nn.functional.one_hot(ids, 21).float()
    assert torch.allclose(model.input_states(soft), h, atol=1e-5)
    assert torch.allclose(model.rows().norm(dim=-1), torch.ones(21), atol=1e-5)
    # the rows train with the embedding LR / no weight decay, everything else as the backbone
    opt = build_optimizer(model, cfg.optim)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert [p is model.embed.weight for p in by_name["embedding"]["params"]] == [True]
    assert by_name["embedding"]["lr"] == 0.01 and by_name["embedding"]["weight_decay"] == 0.0
    assert any(p is model.embed_up.weight for p in by_name["backbone"]["params"])
    assert by_name["backbone"]["lr"] == 0.001
    # MDLM's default: one hidden-wide table in the backbone group
    d = _cfg()
    plain = TokenDiT(d.model, 21, 20)
    assert plain.embed.weight.shape == (21, d.model.hidden) and list(plain.param_groups()) == ["backbone"]


def test_exchanged_runs_train_and_evaluate_through_the_same_code(tmp_path):
    from replaid.eval.evaluate import evaluate
    from replaid.training.train import train

    for method, over in (
        ("mdlm", ["model.factored_embedding=true"]),
        ("replaid", ["model.d_e=32", "model.up_projection=false", "model.normalize_embeddings=false"]),
    ):
        cfg = _cfg(f"method={method}", "train.steps=3", "eval.max_batches=1", *over)
        res = train(cfg, str(tmp_path / method), evaluate=evaluate, progress=False)
        assert math.isfinite(res["eval"]["nelbo_nats_per_token"])
