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


# ------------------------------------------------------------------ the token models' fused cross-entropy (issue 53)


def _ce_inputs(N=13, H=6, V=29, bias=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(N, H, generator=g, dtype=dtype, requires_grad=True)
    W = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    target = torch.randint(0, V, (N,), generator=g)
    w = torch.randn(N, generator=g, dtype=torch.float64)  # an upstream gradient per row (reduction="none")
    return f, W, b, target, w


def _value_and_grads(nll, f, W, b, w):
    leaves = [t for t in (f, W, b) if t is not None]
    return nll.detach(), torch.autograd.grad((nll.double() * w).sum(), leaves)


@pytest.mark.parametrize("chunk", [1, 4, 100])
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_cross_entropy_equals_the_plain_loss_and_gradients_in_float64(chunk, bias):
    from replaid.model.head import linear_cross_entropy

    f, W, b, target, w = _ce_inputs(bias=bias)
    n1, g1 = _value_and_grads(linear_cross_entropy(f, W, b, target, chunk), f, W, b, w)
    plain = torch.nn.functional.cross_entropy(f @ W.t() + (0 if b is None else b), target, reduction="none")
    n2, g2 = _value_and_grads(plain, f, W, b, w)
    assert n1.dtype == torch.float64
    torch.testing.assert_close(n1, n2, atol=1e-12, rtol=1e-12)
    for a, r in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, r, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("chunk", [3, 100])
def test_chunked_cross_entropy_under_bf16_autocast_matches_autocasts_plain_head(chunk):
    """float32 weights under CPU bf16 autocast: the same numbers as the path it replaced (autocast's bf16
    linear, a float32 copy, float32 F.cross_entropy), values to float32 rounding, gradients to bf16's."""
    from replaid.model.head import linear_cross_entropy

    f, W, b, target, w = _ce_inputs(N=37, H=16, V=301, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        n1, g1 = _value_and_grads(linear_cross_entropy(f, W, b, target, chunk, torch.bfloat16), f, W, b, w)
        logits = torch.nn.functional.linear(f, W, b).float()
        n2, g2 = _value_and_grads(torch.nn.functional.cross_entropy(logits, target, reduction="none"), f, W, b, w)
    assert n1.dtype == torch.float32
    torch.testing.assert_close(n1, n2, atol=1e-5, rtol=1e-5)
    for a, r in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, r, atol=2e-2, rtol=2e-2)


def test_chunked_cross_entropy_keeps_no_float32_logits():
    """Saved for backward under bf16: one (N, V) tensor, in bf16 (the plain path keeps a float32 log-softmax)."""
    from replaid.model.head import linear_cross_entropy

    f, W, b, target, _ = _ce_inputs(N=64, H=8, V=512, dtype=torch.float32)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy(f, W, b, target, 8, torch.bfloat16)
    big = [s for s in saved if s[0] == (64, 512)]
    assert big == [((64, 512), torch.bfloat16)], saved


@pytest.mark.parametrize("method", ["ar", "mdlm"])
def test_the_token_models_training_loss_is_the_plain_cross_entropy(method):
    """AR's and MDLM's training loss through the fused cross-entropy equals the plain head + F.cross_entropy
    of the same network (float64 model), and so do its gradients."""
    from replaid.methods import get_method
    from replaid.presets import resolve

    V, B, L = 40, 4, 8
    cfg = resolve("debug", None, [f"method={method}", f"data.seq_len={L}"])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(V).double()
    with torch.no_grad():
        model.final.linear.weight.normal_(0, 0.3)
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(1))
    out = []
    for fused in (True, False):
        if not fused:  # the replaced path: full logits, then F.cross_entropy
            model.token_nll = lambda feats, target: torch.nn.functional.cross_entropy(
                model.head(feats).reshape(-1, V), target.reshape(-1), reduction="none"
            ).view(target.shape)
        loss, _ = m.train_loss(model, x, torch.Generator().manual_seed(2))
        out.append((loss.detach(), torch.autograd.grad(loss, [model.final.linear.weight, model.embed.weight])))
    (l1, g1), (l2, g2) = out
    torch.testing.assert_close(l1, l2, atol=1e-12, rtol=1e-12)
    for a, r in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, r, atol=1e-12, rtol=1e-12)
