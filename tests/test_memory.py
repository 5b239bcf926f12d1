"""The memory model (training/memory.py) against live-heap peaks measured on the CPU, and its command."""

import pytest
import torch

from replaid.presets import resolve
from replaid.training.memory import LiveHeap, estimate, largest_batch, measure


def test_live_heap_counts_allocations_not_rss():
    with LiveHeap() as h:
        a = torch.ones(1000, 250)  # 1 MB
        b = a * 2
        del b
        c = a.sum()
    assert h.peak == 2_000_000 + 0 and h.current == 1_000_000 + c.untyped_storage().nbytes()


@pytest.mark.parametrize("method", ["replaid", "mdlm"])
@pytest.mark.parametrize("size", [(64, 32, 512, 4), (128, 64, 2048, 8)])
def test_estimate_within_15_percent_of_measured_cpu_peak(method, size):
    d, L, V, b = size
    cfg = resolve(
        "debug",
        None,
        [
            f"method={method}",
            f"model.hidden={d}",
            "model.n_layers=2",
            "model.n_heads=4",
            f"data.seq_len={L}",
            "optim.ema=0.99",
            "train.precision=fp32",
        ],
    )
    got, est = measure(cfg, V, b), estimate(cfg, V, b).peak
    assert abs(est - got) / got < 0.15, (est, got)


def test_fused_head_and_checkpointing_lower_the_estimate_and_raise_the_batch():
    cfg = resolve("owt-0.1b", None, [])
    fused, plain = estimate(cfg, 50257, 32, bf16=True), estimate(cfg, 50257, 32, bf16=True, fused_head=False)
    assert fused.peak < plain.peak
    assert fused.parts["head: saved (B L, V)"] == 32 * 1024 * 50257 * 4  # one float32 (B L, V) buffer
    assert largest_batch(cfg, 50257, 80e9, act_ckpt=True) > largest_batch(cfg, 50257, 80e9) > 32


def test_memory_command(capsys):
    from replaid.cli import main

    assert main(["memory", "--preset", "owt-0.1b", "--per-device-batch", "32", "--gpu-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "peak" in out and "largest per-device batch" in out
    assert main(["memory", "--preset", "owt-0.1b", "--gpu-memory", "eighty"]) == 2
    assert "replaid: error: --gpu-memory" in capsys.readouterr().err
