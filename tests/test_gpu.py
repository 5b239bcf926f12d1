"""CUDA checks (skipped without a GPU): bf16 training step, flash SDPA, chunked head equivalence."""
import pytest
import torch

from replaid.presets import resolve
from replaid.methods import get_method
from replaid.training.train import Trainer, TrainModule, build_optimizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bf16_train_step_on_gpu():
    cfg = resolve("debug", None, ["train.device=cuda", "train.precision=bf16"])
    method = get_method(cfg)
    model = method.build_model(512).cuda()
    tr = Trainer(cfg, model, method, build_optimizer(model, cfg.optim), torch.device("cuda"),
                 loss_module=TrainModule(model, method))
    m1 = tr.train_step([{"tokens": torch.randint(0, 512, (8, 32))}])
    for _ in range(20):
        m2 = tr.train_step([{"tokens": torch.randint(0, 512, (8, 32))}])
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.isfinite(torch.tensor(m2["loss"])) and m2["loss"] < m1["loss"] + 1.0


def test_chunked_head_same_on_gpu():
    cfg = resolve("debug", None, [])
    torch.manual_seed(0)
    a = get_method(cfg).build_model(300).cuda()
    cfg.model.head_chunk_rows = 2
    b = get_method(cfg).build_model(300).cuda()
    b.load_state_dict(a.state_dict())
    z, g = torch.randn(6, 16, 16, device="cuda"), torch.linspace(-2, 4, 6, dtype=torch.float64, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        oa, ob = a(z, g, None, logits_rows=2), b(z, g, None, logits_rows=2)
    assert torch.allclose(oa.e_hat, ob.e_hat, atol=1e-3) and torch.allclose(oa.logits, ob.logits, atol=1e-2)
