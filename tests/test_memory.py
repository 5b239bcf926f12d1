"""The memory model (training/memory.py) against live-heap peaks measured on the CPU, and its command."""

import pytest
import torch

from replaid.presets import resolve
from replaid.training.memory import LiveHeap, estimate, largest_batch
from replaid.training.testbed import measure


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


@pytest.mark.parametrize("method", ["ar", "mdlm", "replaid"])
def test_estimate_within_5_percent_where_the_head_dominates(method):
    """V = 8,192 against hidden 64: the (B L, V) head is most of the step, so a head counted as the plain
    cross-entropy's (a float32 log-softmax and two gradients) where the run uses the fused one is +30%."""
    cfg = resolve(
        "debug",
        None,
        [f"method={method}", "model.hidden=64", "model.n_layers=2", "model.n_heads=4", "data.seq_len=64"]
        + ["optim.ema=0.99", "train.precision=fp32"],
    )
    got, est = measure(cfg, 8192, 8), estimate(cfg, 8192, 8).peak
    assert abs(est - got) / got < 0.05, (est, got)


def test_measure_refuses_a_skipped_step():
    """A RePlaid micro-batch of one row holds no diffusion row: its loss is not finite and the step is
    skipped, so no optimiser state is made and the peak would not be a training step's."""
    cfg = resolve("debug", None, ["method=replaid", "train.precision=fp32"])
    with pytest.raises(ValueError, match="not finite"):
        measure(cfg, 512, 1)


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


@pytest.mark.parametrize("method", ["replaid", "mdlm"])
def test_eval_and_likelihood_estimates_within_2x_of_measured_cpu_peak(method):
    """``replaid eval``'s and ``replaid likelihood``'s refusals rest on these estimates: each within a
    factor of 2 of the live-heap peak of one batch at debug size (weights included)."""
    from replaid.eval.likelihood import estimate_likelihood, schedule_endpoints
    from replaid.methods import get_method
    from replaid.training.memory import eval_estimate, likelihood_estimate

    cfg = resolve("debug", None, [f"method={method}"])
    V, L, rows = 512, cfg.data.seq_len, 32
    torch.manual_seed(0)
    tokens = torch.randint(0, V - 1, (rows, L))
    with LiveHeap() as heap:
        m = get_method(cfg)
        model = m.build_model(V)
        for p in model.parameters():
            heap.track(p)
        n = sum(p.numel() for p in model.parameters())
        Vr = int(m.embedding_rows(model).shape[0])
        model.eval()
        with torch.no_grad():
            m.eval_bound(model, tokens, torch.Generator().manual_seed(0))
    est = eval_estimate(cfg, Vr, n, rows, L).peak
    assert 0.5 < est / heap.peak < 2, (est, heap.peak)
    if method != "replaid":
        return
    g0, g1 = schedule_endpoints(model)
    for jvp in ("fd", "autograd"):
        with LiveHeap() as heap:
            heap.current = heap.peak = 4 * n  # the weights, made before the meter
            estimate_likelihood(model, tokens[: rows // 2], g0, g1, K=2, batch_size=rows, steps=2, jvp=jvp)
        est = likelihood_estimate(cfg, Vr, n, rows, L, rows, 1, jvp).peak
        assert 0.5 < est / heap.peak < 2, (jvp, est, heap.peak)
