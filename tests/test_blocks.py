"""Block diffusion's attention (issue 39 §1-2, model layer): the mask against a dense reference built
by hand, the vectorised ``[x_t, x_0]`` pass against a loop over blocks on their clean prefixes, the KV
cache against both, the sliding window, per-token conditioning, and today's paths unchanged."""

from __future__ import annotations

import pytest
import torch

from replaid.model.blocks import block_diffusion_mask, check_block_size, pair_positions
from replaid.model.dit import Backbone, KVCache

TOL = 1e-10  # float64 throughout (the rotary tables are float32 but shared by every path)


def dense_reference(L: int, b: int) -> torch.Tensor:
    """The mask entry by entry from its definition (BD3-LM, section 3.2)."""
    m = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for i in range(2 * L):
        for j in range(2 * L):
            qi, kj = i % L, j % L
            q_clean, k_clean = i >= L, j >= L
            bq, bk = qi // b, kj // b
            if not q_clean and not k_clean:
                m[i, j] = bq == bk
            elif not q_clean and k_clean:
                m[i, j] = bk < bq
            elif q_clean and k_clean:
                m[i, j] = bk <= bq
    return m


@pytest.mark.parametrize("L,b", [(8, 1), (8, 2), (8, 4), (8, 8), (6, 3), (12, 4)])
def test_mask_equals_the_dense_reference(L, b):
    assert torch.equal(block_diffusion_mask(L, b), dense_reference(L, b))


def test_mask_written_out_for_four_tokens_in_blocks_of_two():
    want = torch.tensor(
        [  # x_t: 0 1 2 3 | x_0: 0 1 2 3
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 1],
            [0, 0, 0, 0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_diffusion_mask(4, 2), want)


def test_a_block_size_must_divide_the_length():
    with pytest.raises(ValueError, match="divisor"):
        check_block_size(8, 3)


def backbone(causal: bool = False, cond: int | None = 16) -> Backbone:
    torch.manual_seed(0)
    net = Backbone(hidden=32, n_layers=3, n_heads=4, cond_dim=cond, causal=causal).double().eval()
    for p in net.parameters():  # AdaLN-Zero starts as the identity: give every weight a value
        torch.nn.init.normal_(p, std=0.3)
    return net


def inputs(B: int = 2, L: int = 8, D: int = 32, cond: int = 16):
    g = torch.Generator().manual_seed(1)
    noisy = torch.randn(B, L, D, generator=g, dtype=torch.float64)
    clean = torch.randn(B, L, D, generator=g, dtype=torch.float64)
    c_noisy = torch.randn(B, L, cond, generator=g, dtype=torch.float64)  # per block in use; any values here
    c_clean = torch.randn(B, L, cond, generator=g, dtype=torch.float64)
    return noisy, clean, c_noisy, c_clean


def vectorised(net, noisy, clean, c_noisy, c_clean, b):
    L = noisy.shape[1]
    x = torch.cat([noisy, clean], 1)  # (B, 2L, D)
    c = torch.cat([c_noisy, c_clean], 1)  # (B, 2L, cond)
    out = net(x, c, positions=pair_positions(L), mask=block_diffusion_mask(L, b))
    return out[:, :L], out[:, L:]


@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_vectorised_equals_each_block_alone_on_its_clean_prefix(b):
    net = backbone()
    noisy, clean, c_noisy, c_clean = inputs()
    L = noisy.shape[1]
    got, _ = vectorised(net, noisy, clean, c_noisy, c_clean, b)
    for k in range(L // b):
        s, e = k * b, (k + 1) * b
        x = torch.cat([clean[:, :s], noisy[:, s:e]], 1)  # the clean prefix, then the noisy block
        c = torch.cat([c_clean[:, :s], c_noisy[:, s:e]], 1)
        n = s + b
        mask = torch.zeros(n, n, dtype=torch.bool)
        blk = torch.arange(n) // b
        mask[:s, :s] = blk[:s, None] >= blk[None, :s]  # the prefix among itself, block-causally
        mask[s:, :] = True  # the noisy block: the whole prefix and itself
        want = net(x, c, positions=torch.arange(n), mask=mask)[:, s:]
        assert (got[:, s:e] - want).abs().max() < TOL, (b, k)


def windowed_mask(L: int, b: int, window: int | None) -> torch.Tensor:
    """The block-diffusion mask of a sampler whose cache keeps the last ``window`` committed rows: a row
    of block k (noisy or clean) sees the clean rows from ``k b - window`` on, and the noisy/clean rules
    of the full mask otherwise."""
    m = block_diffusion_mask(L, b).clone()
    if window is not None:
        start = (torch.arange(L) // b) * b  # the first row of each row's block
        too_old = torch.arange(L)[None, :] < (start[:, None] - window)  # (query row, clean key row)
        m[:L, L:] &= ~too_old
        m[L:, L:] &= ~too_old
    return m


@pytest.mark.parametrize("b", [1, 2, 4])
@pytest.mark.parametrize("window", [None, 4, 3])
def test_the_kv_cache_equals_the_vectorised_pass(b, window):
    """Commit the clean blocks one by one (one clean pass each, written to the cache), then denoise the
    next noisy block against the cache: the vectorised noisy half, block for block. With a window,
    the reference is the vectorised pass under the windowed mask (each block sees the last ``window``
    clean rows before it, as the cache held them when the block came)."""
    net = backbone()
    noisy, clean, c_noisy, c_clean = inputs()
    L = noisy.shape[1]
    x, c = torch.cat([noisy, clean], 1), torch.cat([c_noisy, c_clean], 1)
    full = net(x, c, positions=pair_positions(L), mask=windowed_mask(L, b, window))[:, :L]
    cache = KVCache(window=window)
    for k in range(L // b):
        s, e = k * b, (k + 1) * b
        got = net(noisy[:, s:e], c_noisy[:, s:e], positions=torch.arange(s, e), cache=cache)
        assert (got - full[:, s:e]).abs().max() < TOL, (b, k, window)
        net(clean[:, s:e], c_clean[:, s:e], cache=cache, commit=True)  # commit the clean block
        assert cache.next_pos == e and cache.length == (e if window is None else min(e, window))


def test_the_window_changes_the_answer_once_the_prefix_is_longer():
    """The windowed reference is not the full mask in disguise: past the window the outputs differ."""
    net = backbone()
    noisy, clean, c_noisy, c_clean = inputs()
    x, c = torch.cat([noisy, clean], 1), torch.cat([c_noisy, c_clean], 1)
    full = net(x, c, positions=pair_positions(8), mask=windowed_mask(8, 2, None))[:, :8]
    win = net(x, c, positions=pair_positions(8), mask=windowed_mask(8, 2, 4))[:, :8]
    assert (full[:, :6] - win[:, :6]).abs().max() < TOL and (full[:, 6:] - win[:, 6:]).abs().max() > 1e-3


def test_rotary_offsets_are_relative_so_positions_past_the_context_change_nothing():
    """A block and its cached prefix shifted by 1,000 positions give the same output (rotary scores
    depend on position differences only): the sliding window's answer to lengths past seq_len."""
    net = backbone()
    noisy, clean, c_noisy, c_clean = inputs()
    outs = []
    for start in (0, 1000):
        cache = KVCache(next_pos=start)
        net(clean[:, :4], c_clean[:, :4], cache=cache, commit=True)
        outs.append(net(noisy[:, 4:6], c_noisy[:, 4:6], cache=cache))
    assert (outs[0] - outs[1]).abs().max() < 1e-5  # the float32 rotary tables at angle ~1e3 rad


def test_per_token_conditioning_with_equal_rows_equals_the_per_sequence_path():
    net = backbone()
    x = inputs()[0]
    c = torch.randn(2, 16, dtype=torch.float64)
    assert (net(x, c) - net(x, c[:, None].expand(-1, x.shape[1], -1))).abs().max() < TOL


def test_todays_forward_is_unchanged_by_an_all_true_mask_and_explicit_positions():
    net = backbone().float()
    noisy, _, c_noisy, _ = inputs()
    x, c = noisy.float(), c_noisy[:, 0].float()
    L = x.shape[1]
    plain = net(x, c)
    assert (plain - net(x, c, positions=torch.arange(L), mask=torch.ones(L, L, dtype=torch.bool))).abs().max() < 1e-6


def test_a_causal_backbone_with_a_cache_equals_its_full_pass():
    """The AR path: prefill 5 rows, then one at a time (the cache builds the causal mask itself)."""
    net = backbone(causal=True, cond=None)
    x = inputs()[0]
    full = net(x, None)
    cache = KVCache()
    steps = [net(x[:, :5], None, cache=cache, commit=True)]
    steps += [net(x[:, p : p + 1], None, cache=cache, commit=True) for p in range(5, x.shape[1])]
    assert (torch.cat(steps, 1) - full).abs().max() < TOL


def test_cached_attention_on_cuda_leaves_out_cudnn_and_restores_the_backends():
    """cuDNN's SDPA builds a plan per new shape, and a cache's key length changes at every commit: on CUDA
    the cached path allows flash, memory-efficient and math only; on the CPU it changes nothing."""
    from replaid.model.dit import cached_sdpa

    flags = torch.backends.cuda
    before = (flags.cudnn_sdp_enabled(), flags.flash_sdp_enabled(), flags.mem_efficient_sdp_enabled())
    assert before == (True, True, True)
    with cached_sdpa(torch.device("cuda")):
        assert not flags.cudnn_sdp_enabled()
        assert flags.flash_sdp_enabled() and flags.mem_efficient_sdp_enabled() and flags.math_sdp_enabled()
    with cached_sdpa(torch.device("cpu")):
        assert flags.cudnn_sdp_enabled()
    assert (flags.cudnn_sdp_enabled(), flags.flash_sdp_enabled(), flags.mem_efficient_sdp_enabled()) == before
    # it narrows what the caller allows, never widens it: math alone stays math alone; cuDNN alone stays
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH), cached_sdpa(torch.device("cuda")):
        assert flags.math_sdp_enabled() and not (flags.flash_sdp_enabled() or flags.mem_efficient_sdp_enabled())
        assert not flags.cudnn_sdp_enabled()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), cached_sdpa(torch.device("cuda")):
        assert flags.cudnn_sdp_enabled() and not flags.math_sdp_enabled()


@pytest.mark.parametrize("kind", ["dit", "plaid"])
def test_every_attention_over_a_cache_runs_under_the_cached_backends(monkeypatch, kind):
    """Every SDPA call over a KV cache (prefill, one row at a time, a block's noisy pass without commit)
    runs inside ``cached_sdpa``, in both backbones; a pass without a cache (training, the full sequence)
    keeps every backend. The CUDA policy is forced here so that the CPU shows it."""
    import torch.nn.functional as F

    from replaid.model import dit, plaid_backbone

    seen: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*a, **kw)

    policy = dit.cached_sdpa
    for module in (dit, plaid_backbone):
        monkeypatch.setattr(module, "cached_sdpa", lambda device: policy(torch.device("cuda")))
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    if kind == "dit":
        net = backbone(causal=True, cond=None)
    else:
        torch.manual_seed(0)
        net = plaid_backbone.PlaidBackbone(32, 3, 4, 4, 0.0).double().eval()
    x = inputs()[0]
    net(x, None)
    assert seen == [True] * 3  # three layers, no cache: every backend
    seen.clear()
    cache = KVCache()
    net(x[:, :5], None, cache=cache, commit=True)
    net(x[:, 5:6], None, cache=cache, commit=True)
    net(x[:, 6:8], None, cache=cache, commit=False)
    assert seen == [False] * 9


# ------------------------------------------------------------------ MDLM with blocks (BD3-LM), the method


def mdlm(block: int, L: int = 8, **kw):
    import torch.nn as nn

    from replaid.methods import get_method
    from replaid.presets import resolve

    cfg = resolve(
        "debug",
        None,
        ["method=mdlm", f"mdlm.block_size={block}", f"data.seq_len={L}", "model.hidden=32", "model.n_layers=2"]
        + ["model.n_heads=4", "model.cond_dim=16", *kw.get("sets", [])],
    )
    method = get_method(cfg)
    torch.manual_seed(0)
    model = method.build_model(11).double().eval()
    for m in model.modules():  # AdaLN-Zero and the zero head start as the identity/zero: give them values
        if isinstance(m, nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    return method, model


def test_mdlm_block_size_of_the_whole_sequence_is_plain_mdlm_bit_for_bit():
    tokens = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(3))
    out = []
    for block in (0, 8):
        method, model = mdlm(block)
        assert not method.blocks
        loss, rows = method.train_loss(model, tokens, torch.Generator().manual_seed(5))
        out.append((loss, rows["nelbo"]))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    # and the vectorised block pass with one block is the plain forward
    method, model = mdlm(4)
    z = torch.where(torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) < 0.5, 11, tokens)
    assert (model.forward_blocks(z, tokens, 8) - model(z)).abs().max() < TOL


@pytest.mark.parametrize("block", [1, 2, 4])
def test_the_block_loss_equals_each_block_alone_on_its_clean_prefix(block):
    """BD3-LM's vectorised loss, token for token, against a loop that runs each block on its own clean
    prefix and noisy block (the same masks: the same draws from the same generator)."""
    method, model = mdlm(block)
    B, L, V = 3, 8, 11
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    t_tok = method.block_times(B, L, torch.Generator().manual_seed(4))
    assert torch.equal(t_tok[:, ::block].repeat_interleave(block, 1), t_tok)  # one time per block
    ce, n = method.masked_terms(model, tokens, t_tok, torch.Generator().manual_seed(6))
    u = torch.rand(B, L, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    z = torch.where(u < (1 - 1e-3) * t_tok, V, tokens)  # the same draw, made again
    c = model.conditioning(None, B, tokens.device)
    want = torch.zeros(B, L, dtype=torch.float64)
    for k in range(L // block):
        s, e = k * block, (k + 1) * block
        h = torch.cat([model.input_states(tokens[:, :s]), model.input_states(z[:, s:e])], 1)
        mask = torch.zeros(e, e, dtype=torch.bool)
        blk = torch.arange(e) // block
        mask[:s, :s] = blk[:s, None] >= blk[None, :s]
        mask[s:, :] = True
        logits = model.head(model.final.features(model.backbone(h, c, positions=torch.arange(e), mask=mask), c))
        lp = torch.log_softmax(logits[:, s:].double(), -1).gather(-1, tokens[:, s:e, None])[..., 0]
        want[:, s:e] = torch.where(z[:, s:e] == V, -lp, torch.zeros(()))
    assert (ce - want).abs().max() < 1e-6
    nelbo = (ce / t_tok).sum(1) / n  # the bound: each block's conditional NELBO, summed
    assert (nelbo - (want / t_tok).sum(1) / L).abs().max() < 1e-5
    # the training step's NELBO and low-variance loss are these sums, from the same draws
    _, rows = method.train_loss(model, tokens, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    t2 = method.block_times(B, L, g)
    ce2, n2 = method.masked_terms(model, tokens, t2, g)
    assert torch.equal(rows["nelbo"], (ce2 / t2).sum(1) / n2) and torch.equal(rows["loss"], ce2.sum(1) / n2)


def test_at_block_size_one_the_bound_is_the_cross_entropy_of_the_same_logits():
    """Blocks of one token: a masked token is predicted from the clean tokens before it alone (the AR
    limit), so its CE is the same at every t and under every other token's draw, and the bound's
    expectation over the masking, (1/L) sum P(masked) CE / t = (1 - eps) CE, is the mean CE of those
    logits (MDLM's schedule leaves out [0, eps], hence 1 - eps)."""
    method, model = mdlm(1)
    B, L, V = 2, 8, 11
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    all_masked = torch.full((B, L), V)
    ar = -torch.log_softmax(model.forward_blocks(all_masked, tokens, 1).double(), -1).gather(-1, tokens[..., None])
    ar = ar[..., 0]  # (B, L): CE of each token given the tokens before it
    later = tokens.clone()
    later[:, 5:] = (later[:, 5:] + 1) % V  # no position sees a later token
    ar2 = -torch.log_softmax(model.forward_blocks(all_masked, later, 1).double(), -1).gather(-1, later[..., None])
    assert (ar[:, :5] - ar2[:, :5, 0]).abs().max() < TOL
    expected = torch.zeros(B, dtype=torch.float64)
    for seed in range(3):
        t_tok = method.block_times(B, L, torch.Generator().manual_seed(seed))
        ce, n = method.masked_terms(model, tokens, t_tok, torch.Generator().manual_seed(10 + seed))
        hit = ce > 0
        assert (ce[hit] - ar[hit]).abs().max() < 1e-6  # every masked token's CE is its AR-limit CE
        p = (1 - 1e-3) * t_tok  # the masking integrated out: P(masked) CE / t
        expected = (p * ar / t_tok).sum(1) / L
        assert (expected - (1 - 1e-3) * ar.mean(1)).abs().max() < 1e-12


def test_block_options_are_checked_and_a_block_run_says_its_block_size():
    from replaid.config import ConfigError

    with pytest.raises(ConfigError, match="divide data.seq_len"):
        mdlm(3)
    with pytest.raises(ConfigError, match="without time conditioning"):
        mdlm(4, sets=["mdlm.time_conditioning=true"])
    method, _ = mdlm(4)
    assert method.block_size() == 4 and method.sampling_refusal() is None
    assert mdlm(0)[0].block_size() == 0 and mdlm(8)[0].block_size() == 0  # one block: plain MDLM


def test_a_bd3lm_run_trains_evaluates_and_samples_block_by_block(tmp_path, capsys):
    """Sampling block runs in depth: tests/test_completions.py."""
    import json

    from replaid.cli import main

    run = tmp_path / "bd3"
    sets = ["method=mdlm", "mdlm.block_size=4", "train.steps=3", "eval.max_batches=1", "data.seq_len=16"]
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", *sets]) == 0
    assert main(["eval", str(run), "--json", "--max-batches", "1"]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--num", "2", "--steps", "4", "--json", "--ignore-eos"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(len(r["ids"]), r["finish_reason"]) for r in rows] == [(16, "length")] * 2  # data.seq_len by default


# ------------------------------------------------------------------ generation block by block (§2)


def test_cached_and_uncached_block_generation_draw_the_same_tokens_past_the_training_length():
    """The one block loop (a batch of one lane over the KV cache, MDLM's kernel) draws what the reference
    loop draws with the clean prefix recomputed at every call (tests/blockref.py, no cache)."""
    from blockref import sample_blocks
    from replaid.sampling.continuous import time_grid
    from replaid.sampling.loop import sample_any_length

    method, model = mdlm(4)  # trained length 8: generate 24 (3x), with a 3-token prompt
    V = model.n_out
    x = torch.full((2, 24), V)
    x[:, :3] = torch.tensor([1, 2, 3])
    got = sample_any_length(method, model, x[:, :3], 21, steps=6, generator=torch.Generator().manual_seed(0))
    ref = sample_blocks(model, x, time_grid(6), generator=torch.Generator().manual_seed(0), block=4, use_cache=False)
    assert torch.equal(got.tokens, ref.tokens) and got.tokens.shape == (2, 24)
    assert bool((got.tokens != V).all()) and torch.equal(got.tokens[:, :3], x[:, :3])
    # the cache's run pays one commit pass per block but the last; both pay the same denoising calls
    assert got.nfe == ref.nfe + 24 // 4 - 1


def test_block_generation_runs_to_eight_times_the_context_with_a_window_and_stops():
    from replaid.sampling.loop import sample_any_length

    method, model = mdlm(4)
    V = model.n_out
    empty = torch.zeros(1, 0, dtype=torch.long)  # 64 tokens: 8 x the trained length 8
    res = sample_any_length(method, model, empty, 64, steps=4, window=8, generator=torch.Generator().manual_seed(1))
    assert res.tokens.shape == (1, 64) and bool((res.tokens != V).all())
    stop_tok = int(res.tokens[0, 20])  # stop once the token drawn at position 20 has appeared
    res2 = sample_any_length(
        method,
        model,
        empty,
        64,
        steps=4,
        window=8,
        generator=torch.Generator().manual_seed(1),
        stop=lambda ids: (ids == stop_tok).any(1),
    )
    first = int((res.tokens[0] == stop_tok).nonzero()[0])
    assert res2.tokens.shape[1] == (first // 4 + 1) * 4  # ended with the block that wrote it
    assert torch.equal(res2.tokens, res.tokens[:, : res2.tokens.shape[1]])
