"""The per-step callback of the discrete methods' samplers (MDLM, Duo, AR), used by ``replaid serve``.

The hook must not change what is sampled (same tokens with and without it), must be called once
per step with the state after that step, and must report the distribution the step drew from.
"""
import torch

from replaid.methods.ar import ARMethod
from replaid.methods.duo import DuoMethod
from replaid.methods.mdlm import MDLMMethod
from replaid.presets import resolve

V = 40


def _model(method):
    torch.manual_seed(0)
    model = method.build_model(V).eval()
    with torch.no_grad():  # a non-uniform head so draws depend on the model
        w = model.final.linear.weight
        w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * 0.3)
    return model


def _record(frames):
    def cb(info):
        frames.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in info.items()})
    return cb


def test_mdlm_callback_reports_each_unmasking_step_without_changing_the_draw():
    m = MDLMMethod(resolve("debug", None, ["method=mdlm"]))
    model = _model(m)
    ref, nfe_ref = m.sample(model, 2, 8, 16, torch.Generator().manual_seed(3))
    frames = []
    ids, nfe = m.sample(model, 2, 8, 16, torch.Generator().manual_seed(3), callback=_record(frames))
    assert torch.equal(ids, ref) and nfe == nfe_ref
    assert [f["i"] for f in frames] == list(range(16)) and all(f["T"] == 16 for f in frames)
    assert torch.equal(frames[-1]["z"], ids)
    prev = torch.full_like(ids, V)
    for f in frames:
        z, probs = f["z"], f["probs"]
        assert probs.shape == (2, 8, V)
        assert ((prev != V) <= (z == prev)).all()  # unmasked tokens never change
        new = (prev == V) & (z != V)
        # each newly unmasked token was drawn from the reported x_theta: it has positive mass there
        assert (probs.gather(-1, z.clamp(max=V - 1).unsqueeze(-1)).squeeze(-1)[new] > 0).all()
        prev = z


def test_duo_callback_reports_each_step_without_changing_the_draw():
    m = DuoMethod(resolve("debug", None, ["method=duo"]))
    model = _model(m)
    ref, _ = m.sample(model, 2, 8, 6, torch.Generator().manual_seed(1))
    frames = []
    ids, _ = m.sample(model, 2, 8, 6, torch.Generator().manual_seed(1), callback=_record(frames))
    assert torch.equal(ids, ref)
    assert [f["i"] for f in frames] == list(range(6)) and torch.equal(frames[-1]["z"], ids)
    assert all(f["probs"].shape == (2, 8, V) for f in frames)
    assert torch.allclose(frames[0]["probs"].sum(-1), torch.ones(2, 8, dtype=torch.float64))


def test_ar_callback_reports_tokens_left_to_right():
    m = ARMethod(resolve("debug", None, ["method=ar"]))
    model = _model(m)
    pre = torch.tensor([[5, 6]]).expand(2, -1)
    ref, _ = m.sample(model, 2, 7, torch.Generator().manual_seed(2), prefix=pre)
    frames = []
    ids, _ = m.sample(model, 2, 7, torch.Generator().manual_seed(2), prefix=pre, callback=_record(frames))
    assert torch.equal(ids, ref)
    assert [f["pos"] for f in frames] == list(range(2, 7)) and [f["i"] for f in frames] == list(range(5))
    assert all(f["T"] == 5 for f in frames)
    for f in frames:
        p = f["pos"]
        assert torch.equal(f["tokens"][:, :p + 1], ids[:, :p + 1])
        assert (f["probs"].gather(-1, ids[:, p:p + 1]) > 0).all()  # drawn from the reported distribution
