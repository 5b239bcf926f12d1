"""Issue 48 §3's switches: the block-size curriculum, data-initialised embeddings (``init-file``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from replaid.config import ConfigError, set_key
from replaid.data.cooc import cooc_embeddings, cooccurrence, ppmi
from replaid.methods import get_method
from replaid.presets import get_preset

VOCAB = 50


def method_with(**opts):
    cfg = get_preset("debug")
    for k, v in opts.items():
        set_key(cfg, f"diffusion.{k}", v)
    cfg.validate()
    return get_method(cfg)


def loss_of(method, model, tokens, seed=0):
    n_d = tokens.shape[0] - 2
    t = torch.linspace(0.05, 0.95, n_d, dtype=torch.float64)
    loss, _ = method.train_loss(model, tokens, torch.Generator().manual_seed(seed), t_diff=t, n_recon=2)
    return float(loss.detach())


def test_curriculum_trains_the_block_bound_first_then_the_whole_sequence():
    plain, blocks = method_with(), method_with(block_size=4)
    cur = method_with(curriculum_steps=3, curriculum_block=4)
    torch.manual_seed(0)
    model = plain.build_model(VOCAB)
    tokens = torch.randint(0, VOCAB, (6, plain.cfg.data.seq_len), generator=torch.Generator().manual_seed(1))
    assert cur.train_block() == 4 and cur.block_size() == 0  # sampled and evaluated as the whole sequence
    assert loss_of(cur, model, tokens) == loss_of(blocks, model, tokens)
    assert loss_of(cur, model, tokens) != loss_of(plain, model, tokens)
    cur.step = 3  # the curriculum is over: Algorithm 1 on the whole sequence
    assert cur.train_block() == plain.cfg.data.seq_len
    assert loss_of(cur, model, tokens) == loss_of(plain, model, tokens)
    ev = torch.Generator().manual_seed(2)
    torch.testing.assert_close(
        cur.eval_bound(model, tokens, ev)["nelbo"],
        plain.eval_bound(model, tokens, torch.Generator().manual_seed(2))["nelbo"],
    )


@pytest.mark.parametrize(
    "opts",
    [
        {"curriculum_steps": 5, "curriculum_block": 5},  # does not divide L = 32
        {"curriculum_steps": 5, "block_size": 8},  # already a block run
        {"curriculum_steps": 5, "ce_weight": 0.1},
    ],
)
def test_curriculum_refuses_what_it_cannot_train(opts):
    with pytest.raises(ConfigError, match="diffusion.curriculum_steps"):
        method_with(**opts)


def test_cooccurrence_and_ppmi_match_a_plain_loop():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 7, 300)
    C = cooccurrence(toks, 7, window=2).toarray()
    want = np.zeros((7, 7))
    for i in range(len(toks)):
        for j in range(max(0, i - 2), min(len(toks), i + 3)):
            if j != i:
                want[toks[i], toks[j]] += 1
    np.testing.assert_array_equal(C, want)
    P = ppmi(cooccurrence(toks, 7, window=2)).toarray()
    n = C.sum()
    for i in range(7):
        for j in range(7):
            pmi = np.log(C[i, j] * n / (C[i].sum() * C[:, j].sum())) if C[i, j] else 0.0
            assert P[i, j] == pytest.approx(max(pmi, 0.0))


def test_cooc_embeddings_are_unit_rows_spanning_the_top_ppmi_directions():
    rng = np.random.default_rng(1)
    # two topics: tokens 0-9 co-occur among themselves, 10-19 among themselves; token 20 never occurs
    toks = np.concatenate([rng.integers(0, 10, 50) if k % 2 else rng.integers(10, 20, 50) for k in range(200)])
    w = cooc_embeddings(toks, 21, d_e=4)
    np.testing.assert_allclose(np.linalg.norm(w, axis=1), 1.0, rtol=1e-6)
    evals, evecs = np.linalg.eigh(ppmi(cooccurrence(toks, 21)).toarray())
    order = np.argsort(-np.abs(evals))[:4]
    G = evecs[:, order] @ np.diag(np.abs(evals[order])) @ evecs[:, order].T  # (V, V) the rank-4 PPMI Gram
    d = np.sqrt(np.diag(G)[:20])
    np.testing.assert_allclose(w[:20] @ w[:20].T, G[:20, :20] / np.outer(d, d), atol=1e-5)  # sign-free
    same, other = float(w[0] @ w[1]), float(w[0] @ w[15])
    assert same > other  # a topic's tokens closer to each other than to the other topic's


def test_init_file_embeddings_start_from_the_file_and_learn(tmp_path):
    cfg = get_preset("debug")
    w = torch.randn(VOCAB, cfg.model.d_e)
    save_file({"embedding": w.contiguous()}, str(tmp_path / "e.safetensors"))
    set_key(cfg, "model.embeddings", "init-file")
    set_key(cfg, "model.embeddings_path", str(tmp_path / "e.safetensors"))
    cfg.validate()
    model = get_method(cfg).build_model(VOCAB)
    assert model.embedding.weight.requires_grad
    torch.testing.assert_close(model.embedding(), w / w.norm(dim=-1, keepdim=True), rtol=1e-5, atol=1e-6)
    set_key(cfg, "model.embeddings", "file")
    assert not get_method(cfg).build_model(VOCAB).embedding.weight.requires_grad  # file stays frozen


def test_cooc_mode_starts_training_from_the_train_splits_directions(tmp_path):
    """``model.embeddings=cooc``: the rows a run starts from are :func:`cooc_embeddings` of its train split
    (held by ``optim.lr_embedding=0`` through two steps); the default ``learned`` rows are not."""
    import glob

    from safetensors.torch import load_file

    from replaid.cli import main
    from replaid.data.pipeline import DataPipeline

    rows = {}
    for mode in ("cooc", "learned"):
        out = tmp_path / mode
        argv = ["train", "--preset", "debug", "--out", str(out), "--no-progress", f"model.embeddings={mode}"]
        assert main([*argv, "optim.lr_embedding=0", "train.steps=2", "train.logger=none"]) == 0
        f = sorted(glob.glob(str(out / "checkpoints" / "*" / "model.safetensors")))[-1]
        rows[mode] = load_file(f)["embedding.weight"]
    cfg = get_preset("debug")
    data = DataPipeline(cfg, tmp_path / "cooc", train=False)
    want = cooc_embeddings(data.array("train")[0], data.vocab_size, cfg.model.d_e)
    np.testing.assert_allclose(rows["cooc"].numpy(), want, atol=1e-6)
    assert not np.allclose(rows["learned"].numpy(), want, atol=1e-2)
