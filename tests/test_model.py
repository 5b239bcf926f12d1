"""Schedule, variance-minimisation hook, DiT blocks, self-conditioning detach, config."""

import pytest
import torch

from replaid.config import ConfigError, ModelConfig, RunConfig, set_key
from replaid.diffusion.denoiser import prior_logits
from replaid.diffusion.schedule import NoiseSchedule
from replaid.methods.replaid import DiffusionOptions, RePlaidMethod, SplitState
from replaid.model.dit import Backbone, DiTBlock
from replaid.model.replaid import RePlaid
from replaid.presets import PRESETS, get_preset, resolve


def test_schedule_monotone_exact_endpoints_float64():
    s = NoiseSchedule(-3.0, 6.0, "learned", hidden=64)
    with torch.no_grad():
        s.shape.a.normal_(0, 2)
        s.shape.b.normal_(0, 2)
        s.shape.c.normal_(0, 2)
    t = torch.linspace(0, 1, 2001, dtype=torch.float64)
    g, dg = s(t)
    assert g.dtype == torch.float64 and dg.dtype == torch.float64
    assert g[0].item() == -3.0 and g[-1].item() == 6.0  # exact
    assert (g[1:] > g[:-1]).all() and (dg > 0).all()


def test_schedule_derivative_matches_finite_differences():
    s = NoiseSchedule(-2.0, 5.0, "learned", hidden=32)
    t = torch.linspace(0.01, 0.99, 50, dtype=torch.float64)
    h = 1e-6
    _, dg = s(t)
    fd = (s(t + h)[0] - s(t - h)[0]) / (2 * h)
    assert torch.allclose(dg, fd, rtol=1e-6, atol=1e-8)


def test_linear_schedule_shape():
    s = NoiseSchedule(-3.0, 6.0, "linear")
    t = torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64)
    g, dg = s(t)
    assert torch.allclose(g, -3 + 9 * t) and torch.allclose(dg, torch.full_like(t, 9.0))
    assert [n for n, p in s.named_parameters()] == ["gamma_0", "gamma_1"]


def _diff_loss(s, t, hook_w=None):
    gamma, dgamma = s(t, var_hook_weight=hook_w)
    mse = torch.linspace(0.5, 1.5, t.numel(), dtype=torch.float64)  # fixed per-row MSE
    return 0.5 * dgamma * torch.exp(-gamma) * mse  # per-row L_diff


def test_variance_hook_shape_gets_squared_loss_grad_endpoints_get_loss_grad():
    torch.manual_seed(0)
    t = torch.rand(16, dtype=torch.float64)
    s = NoiseSchedule(-3.0, 6.0, "learned", hidden=32)
    # with the hook
    w = torch.zeros(16, dtype=torch.float64)
    L = _diff_loss(s, t, w)
    w.copy_(L.detach())
    L.mean().backward()
    hooked = {n: p.grad.clone() for n, p in s.named_parameters()}
    # references: d mean(L^2) for the shape, d mean(L) for the endpoints
    s.zero_grad()
    (_diff_loss(s, t) ** 2).mean().backward()
    sq = {n: p.grad.clone() for n, p in s.named_parameters()}
    s.zero_grad()
    _diff_loss(s, t).mean().backward()
    plain = {n: p.grad.clone() for n, p in s.named_parameters()}
    for n in ("shape.a", "shape.b", "shape.c"):
        assert torch.allclose(hooked[n], sq[n], rtol=1e-5, atol=1e-10), n
        assert not torch.allclose(hooked[n], plain[n], rtol=1e-3)
    for n in ("gamma_0", "gamma_1"):
        assert torch.allclose(hooked[n], plain[n], rtol=1e-6), n


def test_dit_blocks_identity_at_init():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    rope = Backbone(32, 1, 4, 8).rotary(5, x.device)
    blk = DiTBlock(32, 4, cond_dim=8)
    assert torch.equal(blk(x, torch.randn(2, 8), rope), x)
    causal = DiTBlock(32, 4, cond_dim=None, causal=True)
    assert torch.equal(causal(x, None, rope), x)
    # and not the identity once the gates move
    with torch.no_grad():
        blk.adaLN.bias.normal_()
    assert not torch.allclose(blk(x, torch.randn(2, 8), rope), x)


def test_attention_is_bidirectional_and_causal_variant_is_causal():
    torch.manual_seed(0)
    blk = DiTBlock(16, 2, cond_dim=None, causal=True)
    with torch.no_grad():
        blk.gates.fill_(1.0)
    rope = Backbone(16, 1, 2, None).rotary(6, torch.device("cpu"))
    x = torch.randn(1, 6, 16)
    y = blk(x, None, rope)
    x2 = x.clone()
    x2[0, -1] += torch.randn(16)
    y2 = blk(x2, None, rope)
    assert torch.allclose(y[0, :-1], y2[0, :-1], atol=1e-6)  # the future does not leak
    bi = DiTBlock(16, 2, cond_dim=None, causal=False)
    with torch.no_grad():
        bi.gates.fill_(1.0)
    assert not torch.allclose(bi(x, None, rope)[0, 0], bi(x2, None, rope)[0, 0])


def tiny_cfg(**kw) -> RunConfig:
    cfg = get_preset("debug")
    for k, v in kw.items():
        set_key(cfg, k, v)
    return cfg.validate()


def test_self_conditioned_rows_do_not_train_embeddings_or_schedule():
    torch.manual_seed(0)
    cfg = tiny_cfg(**{"diffusion.sc_rate": "1.0"})  # every row self-conditioned
    method = RePlaidMethod(cfg)
    model = method.build_model(40)
    tok = torch.randint(0, 40, (6, 8))
    loss, _ = method.train_loss(model, tok, torch.Generator().manual_seed(0), n_recon=2)
    loss.backward()
    # only the prior term (which uses e on all rows, detached on s.c. rows) and gamma_1 remain
    assert model.embedding.weight.grad is None or model.embedding.weight.grad.abs().max() == 0
    assert model.schedule.shape.a.grad is None or model.schedule.shape.a.grad.abs().max() == 0
    assert model.final.linear.weight.grad.abs().max() > 0  # the denoiser still trains


def test_recon_rows_do_not_feed_the_shape():
    """The shape's gradient does not depend on the reconstruction rows' content (they enter only
    through gamma(0) = gamma_0, after the shape), while gamma_0's gradient does (they train it)."""
    torch.manual_seed(0)
    cfg = tiny_cfg(**{"diffusion.sc_rate": "0.0"})
    method = RePlaidMethod(cfg)
    model = method.build_model(40)
    tok = torch.randint(0, 40, (4, 8), generator=torch.Generator().manual_seed(1))
    other = tok.clone()
    other[:3] = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(2))  # new recon rows
    grads = []
    for x in (tok, other):
        model.zero_grad()
        loss, m = method.train_loss(
            model, x, torch.Generator().manual_seed(0), n_recon=3, t_diff=torch.tensor([0.5], dtype=torch.float64)
        )
        loss.backward()
        grads.append((model.schedule.shape.a.grad.clone(), model.schedule.gamma_0.grad.clone(), m["diffusion"]))
    (shape_a, g0_a, diff_a), (shape_b, g0_b, diff_b) = grads
    assert torch.equal(diff_a, diff_b)  # the diffusion row is untouched
    assert shape_a.abs().max() > 0 and torch.allclose(shape_a, shape_b, rtol=1e-6, atol=1e-12)
    assert not torch.allclose(g0_a, g0_b)  # the recon rows do train gamma_0


def test_self_conditioned_rows_do_not_train_the_endpoints():
    """With every row self-conditioned, gamma_0 gets no gradient and gamma_1 only the prior term's,
    computed here from the closed form 1/2 [d_e (s1 - 1 - log s1) + a1 ||e||^2] per token."""
    torch.manual_seed(0)
    cfg = tiny_cfg(**{"diffusion.sc_rate": "1.0"})
    method = RePlaidMethod(cfg)
    model = method.build_model(40)
    tok = torch.randint(0, 40, (6, 8), generator=torch.Generator().manual_seed(1))
    loss, _ = method.train_loss(model, tok, torch.Generator().manual_seed(0), n_recon=2)
    loss.backward()
    g0 = model.schedule.gamma_0.grad
    assert g0 is None or float(g0.abs()) == 0.0
    g1 = model.schedule.gamma_1.detach().double().clone().requires_grad_(True)
    e = model.embedding().detach().double()[tok]  # (B, L, d_e)
    s1, a1 = torch.sigmoid(g1), torch.sigmoid(-g1)
    d_e = e.shape[-1]
    prior = 0.5 * (d_e * (s1 - 1 - torch.log(s1)) + a1 * (e**2).sum(-1))  # (B, L)
    prior.mean().backward()
    assert torch.allclose(model.schedule.gamma_1.grad.double(), g1.grad, rtol=1e-5, atol=1e-10), (
        model.schedule.gamma_1.grad,
        g1.grad,
    )


def test_adaptive_split_neyman():
    s = SplitState(decay=0.5)
    assert s.recon_rows(32) == 4  # B/8 before any statistics
    for _ in range(50):
        s.update(torch.tensor([1.0, 3.0]), torch.tensor([10.0, 10.0, 10.0, 10.0]))  # std 1 vs 0
    assert s.recon_rows(32) == 4  # the device-side statistics reach B_r only at a refresh
    s.refresh()
    assert s.recon_rows(32) == 31  # clipped to B - 1
    s2 = SplitState(decay=0.5)
    for _ in range(50):
        s2.update(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 6.0]))  # std 1 vs 3
    s2.refresh()
    assert s2.recon_rows(32) == 8  # round(32 * 1 / 4)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="model.hidden"):
        resolve("debug", None, ["model.hiden=3"])
    with pytest.raises(ConfigError, match="did you mean 'model.hidden'"):
        resolve("debug", None, ["model.hiden=3"])
    with pytest.raises(ConfigError, match="expects a whole number"):
        resolve("debug", None, ["train.steps=abc"])
    with pytest.raises(ConfigError, match="expects a bool"):
        resolve("debug", None, ["model.self_conditioning=maybe"])
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve("dbug", None, [])
    with pytest.raises(ConfigError, match="not of the form"):
        resolve("debug", None, ["train.steps"])
    with pytest.raises(ConfigError, match="divisible"):
        resolve("debug", None, ["model.n_heads=3"])


def test_yaml_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  hidden: 64\ntrain:\n  steps: 7\n")
    cfg = resolve("debug", str(f), ["train.steps=9"])
    assert cfg.model.hidden == 64 and cfg.train.steps == 9
    f.write_text("model:\n  hiddn: 64\n")
    with pytest.raises(ConfigError, match="model.hiddn"):
        resolve("debug", str(f), [])
    f.write_text("model:\n  hidden: [1, 2]\n")
    with pytest.raises(ConfigError, match="expects a whole number"):
        resolve("debug", str(f), [])


def test_config_roundtrip():
    cfg = get_preset("owt-0.1b")
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_every_preset_validates_and_isoflop_param_counts():
    for name in PRESETS:
        get_preset(name).validate()
    # non-embedding parameters (everything but the token embedding) of the IsoFLOP table,
    # with the Llama-2 vocabulary (V = 32,001) that table uses: within 5%
    for m in (14, 29, 44, 116, 247):
        cfg = get_preset(f"isoflop-{m}m")
        with torch.device("meta"):
            model = RePlaid(cfg.model, cfg.diffusion, 32001)
        got = model.non_embedding_params() / 1e6
        assert abs(got - m) / m < 0.05, (m, got)


def test_owt_01b_builds_with_expected_size():
    cfg = get_preset("owt-0.1b")
    with torch.device("meta"):
        model = RePlaid(cfg.model, cfg.diffusion, 50257)
    n = model.non_embedding_params()
    # paper table: 116M with V = 32,001; the GPT-2 head (V = 50,257) adds 18.3257M x 0.768
    assert abs(n - (116e6 + (50257 - 32001) * 769)) / n < 0.03, n


@pytest.mark.parametrize("prior_scale", [1.0, 0.3])
@pytest.mark.parametrize("chunk", [0, 2])
def test_train_outputs_match_plain_forward_values_and_gradients(prior_scale, chunk):
    """The fused training head (any ``head_chunk_rows``) equals the plain forward's CE and e_hat,
    with E.detach() on the e_keep = False rows, in values and in every parameter's gradient,
    also with a ramped output prior."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    mc = ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4, head_chunk_rows=chunk)
    m = RePlaid(mc, DiffusionOptions(), 23)
    with torch.no_grad():  # non-trivial head so the logits matter
        m.final.linear.weight.normal_()
        m.final.adaLN.bias.normal_()
    z, gamma = torch.randn(7, 5, 4), torch.linspace(-2, 3, 7, dtype=torch.float64)
    tokens = torch.randint(0, 23, (7, 5))
    keep = torch.tensor([1, 0, 1, 0, 0, 1, 1], dtype=torch.bool)
    w_e, w_l = torch.randn(7, 5, 4), torch.randn(7, 5)

    def plain():  # float64 head on the plain forward; rows ~keep through a copy with E detached
        feats, _ = m.hidden_states(z, gamma, None)
        outs = []
        for E in (m.embedding(), m.embedding().detach()):
            logits = m.final.linear(feats).double() + prior_scale * prior_logits(z, gamma, E).double()
            outs.append(
                (
                    F.cross_entropy(logits.reshape(-1, 23), tokens.reshape(-1), reduction="none").view(7, 5),
                    torch.softmax(logits, -1) @ E.double(),
                )
            )
        k = keep.view(-1, 1)
        return torch.where(k, outs[0][0], outs[1][0]), torch.where(k[..., None], outs[0][1], outs[1][1])

    res = []
    for fn in (lambda: m.train_outputs(z, gamma, None, tokens, keep, prior_scale), plain):
        m.zero_grad()
        nll, e_hat = fn()
        ((e_hat.double() * w_e).sum() + (nll.double() * w_l).sum()).backward()
        res.append(
            (
                nll.detach().double(),
                e_hat.detach().double(),
                {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None},
            )
        )
    (n1, e1, g1), (n2, e2, g2) = res
    torch.testing.assert_close(n1, n2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e2, atol=1e-5, rtol=1e-5)
    assert g1.keys() == g2.keys() and "embedding.weight" in g1
    for k in g1:  # float32 sums: the absolute error scales with the gradient's size (~1e3 for the
        # input projections under the small width-scaled W_z init)
        tol = 1e-4 + 2e-6 * float(g2[k].abs().max())
        torch.testing.assert_close(g1[k].double(), g2[k].double(), atol=tol, rtol=1e-4, msg=k)


def test_prior_scale_multiplies_exactly_the_output_prior():
    """Plaid's bias_scale: logits(s) = head + s (alpha / sigma^2) z E^T (eq. of the output prior)."""
    from replaid.diffusion.denoiser import prior_logits

    torch.manual_seed(0)
    m = RePlaid(ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4), DiffusionOptions(), 11)
    with torch.no_grad():
        m.final.linear.weight.normal_()
    z, gamma = torch.randn(3, 5, 4), torch.tensor([-2.0, 0.5, 3.0], dtype=torch.float64)
    head = m(z, gamma, prior_scale=0.0).logits
    prior = prior_logits(z, gamma, m.embedding())
    assert torch.allclose(m(z, gamma).logits, head + prior, atol=1e-5)
    assert torch.allclose(m(z, gamma, prior_scale=0.25).logits, head + 0.25 * prior, atol=1e-5)


def test_precision_policy_under_bf16_autocast():
    """Precision table: input projections, prior logits, reparameterisation and residual stream in
    float32; attention/MLP/head matmuls in bf16 under autocast; schedule in float64."""
    torch.manual_seed(0)
    m = RePlaid(ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4), DiffusionOptions(), 11)
    seen = {}

    def grab(name):
        return lambda mod, inp, out: seen.__setitem__(name, out.dtype)

    m.in_z.register_forward_hook(grab("in_z"))
    m.backbone.blocks[0].mlp[0].register_forward_hook(grab("mlp"))
    m.backbone.blocks[0].qkv.register_forward_hook(grab("qkv"))
    m.final.linear.register_forward_hook(grab("head"))
    m.backbone.register_forward_hook(grab("residual"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(torch.randn(2, 3, 4), torch.tensor([0.0, 1.0], dtype=torch.float64))
        g, dg = m.schedule(torch.tensor([0.5], dtype=torch.float64))
    assert seen == {
        "in_z": torch.float32,
        "mlp": torch.bfloat16,
        "qkv": torch.bfloat16,
        "head": torch.bfloat16,
        "residual": torch.float32,
    }
    assert out.logits.dtype == torch.float32 and out.e_hat.dtype == torch.float32
    assert g.dtype == torch.float64 and dg.dtype == torch.float64


# ------------------------------------------------------------------ how the input and time reach RePlaid's DiT


@pytest.mark.parametrize(
    "std, hidden, expected",
    [
        (0.0, 768, 1 / (3 * 16) ** 0.5),
        (0.0, 128, (128 / 768) / (3 * 16) ** 0.5),
        (0.0, 1536, 1 / (3 * 16) ** 0.5),
        (-1.0, 128, 0.25),
        (0.05, 128, 0.05),
    ],
)
def test_input_projection_init_std(std, hidden, expected):
    """W_z's init: 0 = Plaid's default-init std 1/sqrt(3 d_e) scaled by min(1, hidden/768); -1 = 1/sqrt(d_e)."""
    from replaid.model.replaid import input_init_std

    cfg = ModelConfig(hidden=hidden, n_heads=8, d_e=16, in_z_std=std)
    assert input_init_std(cfg, 16) == pytest.approx(expected, rel=1e-12)
    torch.manual_seed(0)
    m = RePlaid(ModelConfig(hidden=256, n_layers=1, n_heads=4, cond_dim=8, in_z_std=std), DiffusionOptions(), 50)
    got = float(m.in_z.weight.std())  # 256 x 16 normal draws: the sample std is within ~5% of its target
    assert got == pytest.approx(input_init_std(m.cfg, 16), rel=0.06)


def test_old_replaid_configs_keep_their_input_init():
    """A stored RePlaid config without model.in_z_std was trained with std 1/sqrt(d_e): it migrates to -1."""
    d = RunConfig().to_dict()
    d["model"].pop("in_z_std")
    assert RunConfig.from_dict(d).model.in_z_std == -1
    assert RunConfig.from_dict(RunConfig().to_dict()).model.in_z_std == 0  # today's: unchanged
    with pytest.raises(ConfigError, match="belongs to method replaid"):
        resolve("debug", None, ["method=plaid", "model.in_z_std=0.05"])
    with pytest.raises(ConfigError, match="model.in_z_std"):
        resolve("debug", None, ["model.in_z_std=-0.5"])


def _model(**kw):
    torch.manual_seed(0)
    m = RePlaid(ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4, **kw), DiffusionOptions(), 12)
    with torch.no_grad():  # open the zero-initialised projections and gates so every path matters
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m


def test_adaln_features_and_time_input_switches():
    z = torch.randn(2, 5, 4)
    g = torch.tensor([-1.0, 3.0], dtype=torch.float64)
    _, c_plaid = _model().hidden_states(z, g, None)
    assert not torch.allclose(c_plaid[0], c_plaid[1])  # the condition depends on gamma
    _, c_none = _model(adaln_features="none").hidden_states(z, g, None)
    assert torch.equal(c_none[0], c_none[1])  # constant condition: time enters through in_t only
    m = _model(adaln_features="dit")
    _, c_dit = m.hidden_states(z, g, None)
    assert m.cond[0].in_features == 256 and not torch.allclose(c_dit[0], c_dit[1])
    m = _model(time_input=False)
    m(z, g).logits.sum().backward()
    assert m.in_t.weight.grad is None  # in_t unused
    a, b = _model(), _model(readout_mult=2.0)
    fa, _ = a.hidden_states(z, g, None)
    fb, _ = b.hidden_states(z, g, None)
    assert torch.allclose(fb, 2 * fa)
