"""Block diffusion for the continuous methods (issue 39 §1-§2, RePlaid and Plaid): the vectorised block
loss against a loop that runs each block alone on its clean prefix, ``diffusion.block_size = seq_len``
against today's model bit for bit, the per-block eval bound, and block-by-block generation (cached
against uncached, past the training length with a window, prompt and stop).

RePlaid's network runs in float32 by design (its input projections and fused head), so the loop
comparisons hold to float32 rounding (2e-5 on O(1) terms) with every aggregate in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from replaid.diffusion.nelbo import forward_noise
from replaid.methods import get_method
from replaid.presets import resolve

V = 11
TOL = 2e-5


def continuous(name: str, block: int, L: int = 8, sets: tuple[str, ...] = ()):
    cfg = resolve(
        "debug",
        None,
        [f"method={name}", f"diffusion.block_size={block}", f"data.seq_len={L}", "model.hidden=32"]
        + ["model.n_layers=2", "model.n_heads=4", "model.cond_dim=16", "train.batch_size=8", *sets],
    )
    method = get_method(cfg)
    torch.manual_seed(0)
    model = method.build_model(V)
    for m in model.modules():  # AdaLN-Zero, in_sc, in_t and the head start at zero: give them values
        if isinstance(m, nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    return method, model


def draws(method, model, B: int = 6, L: int = 8, B_r: int = 2, sc_rows=(1, 4)):
    """Fixed tokens, times per (row, block), self-conditioning rows and noise."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (B, L), generator=g)
    t = torch.cat([torch.zeros(B_r, dtype=torch.float64), torch.rand(B - B_r, generator=g, dtype=torch.float64)])
    is_recon = torch.arange(B) < B_r
    t_bk = method.block_times(t, is_recon, L // method.block)  # (B, K)
    sc = torch.zeros(B, dtype=torch.bool)
    sc_idx = torch.tensor(sc_rows, dtype=torch.long)
    sc[sc_idx] = True
    eps = torch.randn(B, L, model.d_e, generator=g)
    return tokens, t_bk, sc, sc_idx, eps


def loop_reference(model, tokens, gamma, dgamma, sc, eps, block, B_r):
    """Each block k alone: its clean prefix (``alpha_0 e`` at ``gamma_0``, built here) and its noisy block
    (at the block's own gamma, per row) under a hand-made mask; with self-conditioning, a first pass of
    the same block feeds its second. Returns the per-row recon (B_r,) and diffusion (B - B_r,) sums."""
    E = model.embedding()
    e = E[tokens]  # (B, L, d_e)
    B, L = tokens.shape
    z = forward_noise(e, gamma.repeat_interleave(block, 1), eps)
    g0 = model.schedule.endpoints()[0].detach()
    a0 = torch.sigmoid(-g0).sqrt()
    recon = torch.zeros(B, dtype=torch.float64)
    diff = torch.zeros(B, dtype=torch.float64)
    for k in range(L // block):
        s, t = k * block, (k + 1) * block
        g_k = gamma[:, k]  # (B,): this block's level, per row
        n = t
        mask = torch.zeros(n, n, dtype=torch.bool)
        blk = torch.arange(n) // block
        mask[:s, :s] = blk[:s, None] >= blk[None, :s]  # the prefix among itself, block-causally
        mask[s:, :] = True  # the noisy block: the whole prefix and itself

        def run(e_sc):
            h_n, c_n = model.input_states(z[:, s:t], g_k, e_sc)
            h_c, c_c = model.input_states((a0 * e[:, :s].double()).float(), g0.expand(B, s), None)
            c = None if c_n is None else torch.cat([c_c, c_n[:, None].expand(-1, block, -1)], 1)
            h = model.backbone(torch.cat([h_c, h_n], 1), c, positions=torch.arange(n), mask=mask)[:, s:]
            return model.output(model.readout(h, c_n), z[:, s:t], g_k, E)

        first = run(None)
        out = run(torch.where(sc.view(-1, 1, 1), first.e_hat, torch.zeros(())))
        ce = -torch.log_softmax(out.logits.double(), -1).gather(-1, tokens[:, s:t, None])[..., 0]
        recon += ce.sum(1) / L
        w = 0.5 * dgamma[:, k] * torch.exp(-g_k)  # -1/2 SNR'(t_k)
        diff += w * ((out.e_hat.double() - e[:, s:t].double()) ** 2).sum((1, 2)) / L
    return recon[:B_r], diff[B_r:]


@pytest.mark.parametrize("name", ["replaid", "plaid"])
@pytest.mark.parametrize("block", [1, 2, 4])
def test_the_block_loss_equals_each_block_alone_on_its_clean_prefix(name, block):
    """gamma_0 = 0: the reconstruction rows' CE is O(1) (at -3 RePlaid's output prior makes it ~1e-3)."""
    method, model = continuous(name, block, sets=("diffusion.gamma_0=0",))
    assert method.blocks and method.block == block
    tokens, t_bk, sc, sc_idx, eps = draws(method, model)
    gamma, dgamma = model.schedule(t_bk)  # (B, K)
    with torch.no_grad():
        loss, recon, diff, prior = method.block_loss_core(model, tokens, gamma, dgamma, sc, sc_idx, eps, 2, 1.0, None)
        want_r, want_d = loop_reference(model, tokens, gamma, dgamma, sc, eps, block, 2)
    assert (recon - want_r).abs().max() < TOL * want_r.abs().max().clamp_min(1)
    assert (diff - want_d).abs().max() < TOL * want_d.abs().max().clamp_min(1)
    assert torch.isfinite(loss) and abs(float(loss - (recon.mean() + diff.mean() + prior.mean()))) < 1e-12


def test_the_per_block_times_are_uniform_shifts_of_the_row_time_and_zero_on_recon_rows():
    method, _ = continuous("replaid", 2)
    t = torch.tensor([0.0, 0.1, 0.9], dtype=torch.float64)
    tk = method.block_times(t, torch.tensor([True, False, False]), 4)
    want = torch.tensor([[0, 0, 0, 0], [0.1, 0.35, 0.6, 0.85], [0.9, 0.15, 0.4, 0.65]], dtype=torch.float64)
    assert (tk - want).abs().max() < 1e-15


def test_self_conditioning_changes_the_self_conditioned_rows_only():
    """Self-conditioning matters here (in_sc is non-zero), so the loop test above, which feeds each block
    its own first estimate, would see an estimate fed to another block or row; rows without it are
    untouched by the others' first pass."""
    method, model = continuous("replaid", 2)
    tokens, t_bk, sc, sc_idx, eps = draws(method, model)
    gamma, dgamma = model.schedule(t_bk)
    none = torch.zeros(6, dtype=torch.bool)
    with torch.no_grad():
        with_sc = method.block_loss_core(model, tokens, gamma, dgamma, sc, sc_idx, eps, 2, 1.0, None)
        without = method.block_loss_core(model, tokens, gamma, dgamma, none, sc_idx[:0], eps, 2, 1.0, None)
    assert (with_sc[2][2] - without[2][2]).abs() > 1e-4  # row 4, a diffusion row with s.c. (index 2 of 4)
    assert (with_sc[2][0] - without[2][0]).abs() < 1e-12  # row 2 has none


@pytest.mark.parametrize("name", ["replaid", "plaid"])
def test_a_block_of_the_whole_sequence_is_todays_model_bit_for_bit(name):
    """``block_size = seq_len`` and ``0`` take today's code path: the same loss, gradients, eval bound and
    samples bit for bit at a fixed seed; and the vectorised block pass with one block computes today's
    loss (to float32 rounding: it attends under a mask)."""
    from replaid.sampling.continuous import gamma_grid, prefix_inpaint, sample_ddim
    from replaid.sampling.loop import sample_any_length

    tokens = torch.randint(0, V, (8, 8), generator=torch.Generator().manual_seed(3))
    out = []
    for block in (0, 8):
        method, model = continuous(name, block)
        assert not method.blocks and method.sampling_refusal() is None
        loss, rows = method.train_loss(model, tokens, torch.Generator().manual_seed(5))
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        model.eval()
        bound = method.eval_bound(model, tokens, torch.Generator().manual_seed(7))["nelbo"]
        any_len = sample_any_length(
            method, model, tokens[:2, :3], 5, sampler="ddim", steps=4, generator=torch.Generator().manual_seed(9)
        )
        out.append((loss.detach(), rows["diffusion"], grads, bound, any_len.tokens))
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)
    # the any-length sampler on a one-block run is today's sampler call, draw for draw
    g = torch.Generator().manual_seed(9)
    z = torch.randn(2, 8, model.d_e, generator=g)
    plain = sample_ddim(
        model,
        z,
        gamma_grid(model.schedule, 4),
        generator=g,
        inpaint=prefix_inpaint(tokens[:2, :3], 8, model.embedding_matrix().detach()),
    )
    assert torch.equal(plain.tokens, out[0][4])
    # the block path forced to one block: today's loss, by another route
    method, model = continuous(name, 8)
    t = torch.linspace(0.05, 0.95, 8, dtype=torch.float64)
    is_recon = torch.arange(8) < 2
    t = torch.where(is_recon, torch.zeros(()), t)
    sc = torch.zeros(8, dtype=torch.bool)
    sc[[1, 5]] = True
    sc_idx = torch.tensor([1, 5])
    eps = torch.randn(8, 8, model.d_e, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        gamma, dgamma = model.schedule(t)
        plain_core = method.loss_core(model, tokens, gamma, dgamma, sc, sc_idx, eps, 2, 1.0, None)
        block_core = method.block_loss_core(
            model, tokens, gamma[:, None], dgamma[:, None], sc, sc_idx, eps, 2, 1.0, None
        )
    for a, b in zip(plain_core, block_core, strict=True):
        assert (a - b).abs().max() < TOL * b.abs().max().clamp_min(1)


@pytest.mark.parametrize("name", ["replaid", "plaid"])
def test_the_block_eval_bound_is_finite_and_its_blocks_sum_to_it(name):
    method, model = continuous(name, 2)
    model.eval()
    tokens = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[2, 5:] = False  # a padded row
    for m in (None, mask):
        total = method.eval_bound(model, tokens, torch.Generator().manual_seed(4), m)
        shares = method.block_bound(model, tokens, torch.Generator().manual_seed(4), m)
        assert shares["nelbo"].shape == (3, 4)
        for k in ("recon", "diffusion", "prior", "nelbo"):
            assert torch.isfinite(total[k]).all() and total[k].shape == (3,)
            assert (shares[k].sum(1) - total[k]).abs().max() < 1e-12, k
        assert (shares["recon"] + shares["diffusion"] + shares["prior"] - shares["nelbo"]).abs().max() < 1e-12
    # a padded block contributes nothing; the conditional bound is the target's share
    assert float(shares["nelbo"][2, 3].abs()) == 0.0
    target = torch.zeros(3, 8, dtype=torch.bool)
    target[:, 4:] = True
    cond = method.conditional_nll(model, tokens, target, torch.Generator().manual_seed(4))
    assert torch.isfinite(cond).all() and cond.shape == (3,)


def test_block_options_are_checked():
    from replaid.config import ConfigError

    with pytest.raises(ConfigError, match="diffusion.block_size=3 must be 0"):
        continuous("replaid", 3)
    with pytest.raises(ConfigError, match="diffusion.ce_weight"):
        continuous("replaid", 4, sets=("diffusion.ce_weight=0.1",))
    method, _ = continuous("plaid", 4)
    assert method.sampling_refusal() is None and method.block_size() == 4  # sampled block by block
    assert continuous("replaid", 0)[0].block_size() == 0


def test_a_continuous_block_run_trains_and_evaluates(tmp_path, capsys):
    import json

    from replaid.cli import main

    run = tmp_path / "bd3"
    sets = ["diffusion.block_size=4", "train.steps=3", "eval.max_batches=1", "data.seq_len=16"]
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", *sets]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--json", "--max-batches", "1"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (
        got["nelbo_nats_per_token"] > 0
        and abs(got["recon"] + got["diffusion"] + got["prior"] - got["nelbo_nats_per_token"]) < 1e-6
    )


# ------------------------------------------------------------------ generation block by block (§2)


@pytest.mark.parametrize(
    "name,sampler", [("replaid", "ddim"), ("replaid", "dpmpp2m"), ("replaid", "heun"), ("plaid", "ddpm")]
)
def test_cached_and_uncached_block_generation_draw_the_same_tokens_past_the_training_length(name, sampler):
    from replaid.sampling.loop import sample_any_length

    """The one block loop (RePlaid's or Plaid's kernel over the KV cache) draws what the reference loop draws
    with the clean prefix recomputed at every call (tests/blockref.py)."""
    from blockref import any_length

    method, model = continuous(name, 4)
    model.eval()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    g = [torch.Generator().manual_seed(0) for _ in range(2)]
    runs = [
        sample_any_length(method, model, prompt, 21, sampler=sampler, steps=3, generator=g[0]),
        any_length(method, model, prompt, 21, sampler=sampler, steps=3, generator=g[1], use_cache=False),
    ]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and runs[0].tokens.shape == (2, 24)  # 3x the trained 8
    assert torch.equal(runs[0].tokens[:, :3], prompt)
    assert [s for s, _ in runs[0].blocks] == [0, 4, 8, 12, 16, 20]
    assert torch.equal(torch.cat([ids for _, ids in runs[0].blocks], 1), runs[0].tokens)
    assert runs[0].nfe == runs[1].nfe + 24 // 4 - 1  # one commit per block but the last


def test_the_cache_is_what_the_vectorised_training_pass_computes():
    """The block denoiser against the cache equals the vectorised [z_t, x_0] pass's noisy block."""
    from replaid.model.dit import KVCache
    from replaid.model.replaid import BlockContext
    from replaid.sampling.blocks import BlockDenoiser, commit_continuous

    method, model = continuous("replaid", 2)
    model.eval()
    tokens = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    gamma = torch.tensor([1.0, -2.0], dtype=torch.float64)
    z = torch.randn(2, 8, model.d_e, generator=torch.Generator().manual_seed(4))
    e_sc = torch.randn(2, 8, model.d_e, generator=torch.Generator().manual_seed(5)) * 0.3
    with torch.no_grad():
        full = model(z, gamma[:, None].expand(2, 8), e_sc, context=BlockContext(model.embedding()[tokens], 2))
        cache = KVCache()
        for k in range(4):
            s, t = 2 * k, 2 * k + 2
            got = BlockDenoiser(model, s, cache)(z[:, s:t], gamma, e_sc[:, s:t])
            ref = BlockDenoiser(model, s, None, tokens[:, :s])(z[:, s:t], gamma, e_sc[:, s:t])
            assert (got.logits - full.logits[:, s:t]).abs().max() < 1e-4, k
            assert (got.logits - ref.logits).abs().max() < 1e-4, k
            commit_continuous(model, tokens[:, s:t], s, cache)


def test_block_generation_runs_to_eight_times_the_context_with_a_window_and_stops():
    from replaid.sampling.loop import sample_any_length

    method, model = continuous("replaid", 4)
    model.eval()
    empty = torch.zeros(1, 0, dtype=torch.long)
    res = sample_any_length(method, model, empty, 64, steps=2, window=4, generator=torch.Generator().manual_seed(1))
    assert res.tokens.shape == (1, 64) and len(res.blocks) == 16
    stop_tok = int(res.tokens[0, 20])
    res2 = sample_any_length(
        method,
        model,
        empty,
        64,
        steps=2,
        window=4,
        generator=torch.Generator().manual_seed(1),
        stop=lambda ids: (ids == stop_tok).any(1),
    )
    first = int((res.tokens[0] == stop_tok).nonzero()[0])
    assert res2.tokens.shape[1] == (first // 4 + 1) * 4  # ended with the block that wrote it
    assert torch.equal(res2.tokens, res.tokens[:, : res2.tokens.shape[1]])
    plain, pmodel = continuous("replaid", 0)
    with pytest.raises(ValueError, match="has no blocks"):
        sample_any_length(plain, pmodel, empty, 9)


def test_the_any_length_entry_point_serves_mdlm_and_tags_each_step_with_its_block():
    """One function for every block method: an MDLM block run through it is the reference loop's
    ``sample_blocks`` (tests/blockref.py), draw for draw; a continuous run's callback sees every block's
    steps, tagged; a kind without a kernel (Duo) is refused in one line."""
    from blockref import sample_blocks
    from replaid.sampling.continuous import time_grid
    from replaid.sampling.loop import sample_any_length
    from test_blocks import mdlm

    method, model = mdlm(4)
    prompt = torch.tensor([[1, 2, 3]])
    got = sample_any_length(method, model, prompt, 9, steps=5, generator=torch.Generator().manual_seed(0))
    x = torch.full((1, 12), model.n_out)
    x[:, :3] = prompt
    want = sample_blocks(model, x, time_grid(5), generator=torch.Generator().manual_seed(0), block=4)
    assert torch.equal(got.tokens, want.tokens) and got.nfe == want.nfe and len(got.blocks) == 3
    method, model = continuous("replaid", 4)
    seen: list[tuple[int, int]] = []
    sample_any_length(
        method,
        model,
        prompt,
        9,
        steps=2,
        generator=torch.Generator().manual_seed(0),
        callback=lambda info: seen.append((info["block"], info["i"])),
    )
    assert seen == [(k, i) for k in range(3) for i in range(2)]
    with pytest.raises(ValueError, match="no block-by-block generator"):
        duo = get_method(resolve("debug", None, ["method=duo", "data.seq_len=8"]))
        sample_any_length(duo, duo.build_model(V), prompt, 4)
