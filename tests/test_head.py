"""The fused RePlaid output head (model/head.py) against the plain float64 expression."""

import pytest
import torch

from replaid.model.head import prior_softmax_head, reference_head


def _inputs(N=13, H=6, V=29, d_e=4, prior=True, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(N, H, generator=g, requires_grad=True)
    W = torch.randn(V, H, generator=g, requires_grad=True)
    b = torch.randn(V, generator=g, requires_grad=True) if bias else None
    zs = (3 * torch.randn(N, d_e, generator=g)).requires_grad_() if prior else None
    E = torch.randn(V, d_e, generator=g)
    E = (E / E.norm(dim=-1, keepdim=True)).requires_grad_()
    keep = (torch.rand(N, generator=g) < 0.6).float()
    target = torch.randint(0, V, (N,), generator=g)
    return f, W, b, zs, E, keep, target


@pytest.mark.parametrize("chunk", [1, 4, 100])
@pytest.mark.parametrize("prior,bias", [(True, True), (False, False)])
def test_fused_head_values_and_gradients_match_float64(chunk, prior, bias):
    f, W, b, zs, E, keep, target = _inputs(prior=prior, bias=bias)
    leaves = [t for t in (f, W, b, zs, E) if t is not None]
    g = torch.Generator().manual_seed(1)
    w_e, w_n = torch.randn(f.shape[0], E.shape[1], generator=g), torch.randn(f.shape[0], generator=g)
    out = []
    for fn, kw in ((prior_softmax_head, {"chunk": chunk}), (reference_head, {})):
        e_hat, nll = fn(f, W, b, zs, E, keep, target, **kw)
        grads = torch.autograd.grad((e_hat.double() * w_e).sum() + (nll.double() * w_n).sum(), leaves)
        out.append((e_hat.detach(), nll.detach(), grads))
    (e1, n1, g1), (e2, n2, g2) = out
    assert e1.dtype == torch.float32 and n1.dtype == torch.float32
    torch.testing.assert_close(e1.double(), e2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(n1.double(), n2, atol=1e-5, rtol=1e-5)
    for a, r in zip(g1, g2, strict=True):
        torch.testing.assert_close(a.double(), r.double(), atol=1e-4, rtol=1e-4)


def test_rows_with_keep_zero_give_no_embedding_gradient():
    f, W, b, zs, E, keep, target = _inputs()
    keep = torch.zeros_like(keep)
    e_hat, nll = prior_softmax_head(f, W, b, zs, E, keep, target, chunk=5)
    (gE,) = torch.autograd.grad(e_hat.sum() + nll.sum(), [E])
    assert torch.count_nonzero(gE) == 0


def test_fused_head_holds_one_logits_buffer():
    """Saved for backward: exactly one (N, V) tensor (the logits buffer), nothing else V-sized."""
    f, W, b, zs, E, keep, target = _inputs(N=64, V=512)
    sizes = []

    def pack(t):
        sizes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        prior_softmax_head(f, W, b, zs, E, keep, target, chunk=8)
    big = [s for s in sizes if len(s) == 2 and s[1] == 512 and s[0] == 64]
    assert big == [(64, 512)], sizes
