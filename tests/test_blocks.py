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
