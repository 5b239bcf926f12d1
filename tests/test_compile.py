"""train.compile: RePlaid's loss core (all of Algorithm 1 but the noise draws and the schedule with its
variance hook) compiles as one graph, and the compiled step equals the eager one; on the ``device``
fixture's device (``pytest --device cuda``: Inductor's GPU code)."""

import pytest
import torch

from replaid.methods import get_method
from replaid.presets import resolve

TINY = ["model.hidden=32", "model.n_layers=1", "model.n_heads=2", "model.cond_dim=16", "diffusion.schedule_hidden=16"]


def _inputs(method_name, device="cpu"):
    cfg = resolve("debug", None, [f"method={method_name}", *TINY])
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(64).to(device)
    B, L = 8, 16
    tok = torch.randint(0, 64, (B, L)).to(device)
    t = torch.cat([torch.zeros(2, dtype=torch.float64), torch.linspace(0.1, 0.9, B - 2, dtype=torch.float64)])
    gamma, dgamma = model.schedule(t.to(device))
    sc_idx = torch.tensor([2, 5], device=device)
    sc = torch.zeros(B, dtype=torch.bool, device=device).index_fill_(0, sc_idx, True)
    eps = torch.randn(B, L, model.d_e).to(device)
    return m, model, (model, tok, gamma, dgamma, sc, sc_idx, eps, 2, 1.0, None)


def test_loss_core_has_no_graph_break(device):
    """(Plaid shares the core.) Before: the whole TrainModule broke at the CPU generators, the hook's
    in-place weight and RePlaid.forward's nonzero; only the backbone compiled."""
    import torch._dynamo as dynamo

    m, _, args = _inputs("replaid", device)
    ex = dynamo.explain(m.loss_core)(*args)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]


@pytest.mark.slow
def test_compiled_core_matches_eager_values_and_gradients(device):
    m, model, args = _inputs("replaid", device)
    out = []
    for fn in (m.loss_core, torch.compile(m.loss_core)):
        model.zero_grad()
        loss, *_ = fn(*args)
        loss.backward(retain_graph=True)
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-6)
    for k in out[0][1]:
        torch.testing.assert_close(out[0][1][k], out[1][1][k], rtol=1e-3, atol=1e-5, msg=k)
