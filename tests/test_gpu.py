"""CUDA checks (skipped without a GPU): bf16 training step, flash SDPA, chunked head equivalence."""

import pytest
import torch

from replaid.methods import get_method
from replaid.presets import resolve
from replaid.training.train import Trainer, TrainModule, build_optimizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bf16_train_step_on_gpu():
    """bf16 autocast trains: float32 master weights, and 40 steps on one fixed batch drawn from 64 of the
    512 tokens lower that batch's bound, read before and after by ``eval_bound`` with one fixed generator
    (the same t draws both times; 8 repeats). A training step's own loss is too noisy to compare (each
    step draws its own t: on an H200 the first and last five steps' means differed by 0.40 nats, within
    the noise). On the CPU in float32 the bound falls by 1.2-1.4 nats, seeds 0-2."""
    torch.manual_seed(0)
    cfg = resolve("debug", None, ["train.device=cuda", "train.precision=bf16"])
    method = get_method(cfg)
    model = method.build_model(512).cuda()
    tr = Trainer(
        cfg,
        model,
        method,
        build_optimizer(model, cfg.optim),
        torch.device("cuda"),
        loss_module=TrainModule(model, method),
    )
    batch = torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(0))

    def bound() -> float:
        model.eval()
        with torch.no_grad():
            reps = batch.cuda().repeat(8, 1)  # (64, 32)
            out = method.eval_bound(model, reps, torch.Generator().manual_seed(1))["nelbo"].mean().item()
        model.train()
        return out

    before = bound()
    losses = torch.tensor([tr.train_step([{"tokens": batch}])["loss"] for _ in range(40)])
    after = bound()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.isfinite(losses).all()
    assert after < before - 0.5, (before, after)


def test_fused_head_same_on_gpu():
    """The fused training head under bf16 autocast on CUDA matches its CPU float32 values."""
    cfg = resolve("debug", None, [])
    torch.manual_seed(0)
    a = get_method(cfg).build_model(300)
    z, g = torch.randn(6, 16, 16), torch.linspace(-2, 4, 6, dtype=torch.float64)
    tok, keep = torch.randint(0, 300, (6, 16)), torch.ones(6, dtype=torch.bool)
    ref_nll, ref_e = a.train_outputs(z, g, None, tok, keep)
    b = a.cuda()
    with torch.autocast("cuda", torch.bfloat16):
        nll, e = b.train_outputs(z.cuda(), g.cuda(), None, tok.cuda(), keep.cuda())
    assert torch.allclose(e.cpu(), ref_e, atol=2e-2) and torch.allclose(nll.cpu(), ref_nll, atol=5e-2)


def test_attention_over_a_cache_on_cuda_runs_without_cudnn(monkeypatch):
    """On CUDA every SDPA call over a KV cache runs with cuDNN's backend off (its per-shape plans cost
    40-100 ms per new key length on an H100, and the key length grows at every AR call), and the cached
    logits match the full pass."""
    import torch.nn.functional as F

    from replaid.model.dit import KVCache

    cfg = resolve("debug", None, ["method=ar"])
    torch.manual_seed(0)
    model = get_method(cfg).build_model(300).cuda().eval()
    seen: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    ids = torch.randint(0, 300, (2, 12), device="cuda")
    cache = KVCache()
    with torch.no_grad():
        full = model(ids, None)
        seen.clear()
        steps = [model.forward_cached(ids[:, :4], cache, 0)]
        steps += [model.forward_cached(ids[:, p : p + 1], cache, p) for p in range(4, 12)]
    assert seen and not any(seen)
    assert torch.cat(steps, 1).sub(full).abs().max() < 1e-3
