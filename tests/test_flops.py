"""FLOP accounting against PyTorch's own FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from replaid.config import ModelConfig
from replaid.methods.replaid import DiffusionOptions
from replaid.model.replaid import RePlaid
from replaid.presets import get_preset
from replaid.training.flops import forward_flops_per_token, self_conditioning_overhead, train_flops_per_token


@pytest.mark.parametrize("hidden,layers,L,V", [(64, 2, 32, 300), (96, 3, 64, 1000)])
def test_forward_flops_match_torch_counter(hidden, layers, L, V):
    """Per-token matmul FLOPs against FlopCounterMode (linear layers, prior logits, e_hat). The
    counter does not see SDPA on CPU; its 4 L d per layer is our closed-form addition."""
    d_e, B = 8, 2
    m = RePlaid(ModelConfig(hidden=hidden, n_layers=layers, n_heads=4, cond_dim=16, d_e=d_e), DiffusionOptions(), V)
    with FlopCounterMode(display=False) as fc:
        m(torch.randn(B, L, d_e), torch.zeros(B, dtype=torch.float64), None)  # no s.c. input
    per_seq = {"RePlaid.in_t", "RePlaid.cond", "RePlaid.final.adaLN"} | {
        f"RePlaid.backbone.blocks.{i}.adaLN" for i in range(layers)
    }
    counts = fc.get_flop_counts()
    per_sequence = sum(sum(counts[k].values()) for k in per_seq)
    counted = (fc.get_total_flops() - per_sequence) / (B * L)
    f = forward_flops_per_token(hidden, layers, L, V, 4, d_e=d_e)
    ours = f.forward - 4 * layers * L * hidden
    assert ours == pytest.approx(counted, rel=1e-9), (ours, counted)


def test_self_conditioning_overhead_is_the_papers_8_3_percent():
    assert self_conditioning_overhead(0.25) == pytest.approx(0.0833, abs=1e-4)
    cfg = get_preset("owt-0.1b")
    with_sc = train_flops_per_token(cfg, 50257)
    cfg.model.self_conditioning = False
    assert with_sc / train_flops_per_token(cfg, 50257) == pytest.approx(1 + 0.25 / 3)


def test_block_diffusion_training_counts_the_doubled_rows_against_torch_counter():
    """BD3-LM's vectorised pass reads ``[x_t, x_0]`` (2L rows, the head on the L noisy rows): the
    counter's matmul FLOPs of ``forward_blocks`` per training token equal the planner's block rule
    less its attention term (the counter does not see SDPA on CPU; 4 x 4 n L d is the closed form)."""
    from replaid.methods import get_method
    from replaid.presets import resolve

    L, B, b = 16, 2, 4
    sets = [f"data.seq_len={L}", "model.hidden=32", "model.n_layers=2", "model.n_heads=4", "model.cond_dim=16"]
    plain = resolve("debug", None, ["method=mdlm", *sets])
    block = resolve("debug", None, ["method=mdlm", f"mdlm.block_size={b}", *sets])
    model = get_method(block).build_model(11).eval()
    z = torch.randint(0, 11, (B, L))
    with FlopCounterMode(display=False) as fc:
        model.forward_blocks(z, z, b)
    per_seq_layers = [model.cond[0], model.cond[2], model.final.adaLN, *(blk.adaLN for blk in model.backbone.blocks)]
    per_sequence = sum(2 * B * m.in_features * m.out_features for m in per_seq_layers)  # (B, cond) inputs
    counted = (fc.get_total_flops() - per_sequence) / (B * L)
    attn = 4 * 2 * L * 32
    per_token = train_flops_per_token(block, 11) / 3  # no self-conditioning pass in MDLM
    assert per_token - 4 * attn == pytest.approx(counted, rel=1e-9), (per_token, counted)
    f_plain = train_flops_per_token(plain, 11) / 3
    head = 2 * 32 * 11
    assert per_token == pytest.approx(2 * (f_plain - head - attn) + 4 * attn + head)
    assert get_method(plain).training_block_size(plain) == 0 and get_method(block).training_block_size(block) == b
