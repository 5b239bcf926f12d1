"""The baselines: AR, MDLM, Plaid (original backbone) and Duo.

Known answers (zero head = uniform prediction -> log V), losses against float64 computations
written here, Duo's operator against two independent quadratures, the UDLM integrand against the
small-step limit of the discrete-time KL, and train / eval / sample through the CLI.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from replaid.cli import main
from replaid.methods import METHODS, get_method
from replaid.methods.ar import ARMethod, shift_right
from replaid.methods.duo import DuoMethod, duo_alpha, udlm_integrand
from replaid.methods.mdlm import MDLMMethod, antithetic_times
from replaid.model.dit import KVCache
from replaid.model.plaid_backbone import PlaidBlock, PlaidModel
from replaid.presets import resolve
from replaid.sampling.continuous import time_grid
from replaid.sampling.discrete import sample_mdlm, top_p_filter

V = 40


def cfg_for(method, *over):
    return resolve("debug", None, [f"method={method}", *over])


def perturb_head(model, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.final.linear.weight
        w.copy_(torch.randn(w.shape, generator=g) * scale)
    return model


def tokens_batch(B=4, L=12, seed=1):
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ AR


def test_ar_zero_head_nll_is_log_v():
    m = ARMethod(cfg_for("ar"))
    model = m.build_model(V).eval()
    r = m.eval_bound(model, tokens_batch(), torch.Generator())
    assert torch.allclose(r["nll"], torch.full((4,), math.log(V), dtype=torch.float64), atol=1e-6)


def test_ar_loss_matches_float64_reference():
    m = ARMethod(cfg_for("ar"))
    model = perturb_head(m.build_model(V)).eval()
    x = tokens_batch()
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 7:] = False
    loss, met = m.train_loss(model, x, torch.Generator(), mask=mask)
    inp = torch.cat([torch.full((4, 1), V), x[:, :-1]], 1)  # BOS = V, then the shifted tokens
    lp = torch.log_softmax(model(inp).double(), -1).gather(-1, x[..., None])[..., 0]
    ref = (-(lp * mask).sum(1) / mask.sum(1)).detach()
    assert torch.allclose(met["nll"], ref, atol=1e-6)
    assert abs(float(loss.detach()) - float(ref.mean())) < 1e-6
    assert torch.equal(shift_right(x, V), inp)


def test_ar_kv_cache_matches_full_forward():
    m = ARMethod(cfg_for("ar"))
    model = perturb_head(m.build_model(V)).eval()
    with torch.no_grad():
        for blk in model.backbone.blocks:  # open the zero-initialised AdaLN (shift, scale, gates)
            blk.adaLN.bias.normal_(0, 0.5)
            blk.adaLN.weight.normal_(0, 0.1)
        model.final.adaLN.bias.normal_(0, 0.5)
    x = tokens_batch()
    inp = shift_right(x, V)
    full = model(inp)
    cache = KVCache()
    a = model.forward_cached(inp[:, :5], cache, 0)  # prefill 5, then one at a time
    steps = [model.forward_cached(inp[:, p : p + 1], cache, p) for p in range(5, x.shape[1])]
    cached = torch.cat([a, *steps], 1)
    assert torch.allclose(cached, full, atol=1e-5)


def test_ar_learns_a_predictable_sequence_to_near_zero_nll():
    torch.manual_seed(0)
    cfg = cfg_for("ar")
    m = ARMethod(cfg)
    model = m.build_model(V)
    seq = ((torch.arange(16) * 7) % V).expand(4, -1).contiguous()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss, _ = m.train_loss(model, seq, torch.Generator())
        opt.zero_grad()
        loss.backward()
        opt.step()
    nll = float(m.eval_bound(model.eval(), seq, torch.Generator())["nll"].mean())
    assert nll < 0.05, nll


def test_top_p_keeps_the_nucleus():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    q = top_p_filter(p, 0.7)
    assert torch.allclose(q, torch.tensor([[0.625, 0.375, 0, 0]], dtype=torch.float64))
    assert torch.equal(top_p_filter(p, 1.0), p)


# ------------------------------------------------------------------ MDLM


def test_mdlm_zero_head_nelbo_is_log_v():
    cfg = cfg_for("mdlm", "eval.t_samples=4")
    m = MDLMMethod(cfg)
    model = m.build_model(V).eval()
    x = tokens_batch(B=256, L=64)
    # t = 1: a share 1 - eps of the positions is masked (reference schedule), each costs log V
    s, _ = m.masked_ce(model, x, torch.ones(256, dtype=torch.float64), torch.Generator().manual_seed(0))
    u = torch.rand(256, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    n_masked = (u < 1 - 1e-3).sum(1)
    assert torch.allclose(s, math.log(V) * n_masked.double() / 64, atol=1e-6)
    # the Monte Carlo NELBO averages to log V (std of this mean ~0.06)
    r = m.eval_bound(model, x, torch.Generator().manual_seed(0))
    assert abs(float(r["nelbo"].mean()) - math.log(V)) < 0.3, float(r["nelbo"].mean())


def test_mdlm_low_variance_and_nelbo_differ_only_by_the_weight():
    cfg = cfg_for("mdlm")
    lv, nb = MDLMMethod(cfg, low_variance=True), MDLMMethod(cfg, low_variance=False)
    model = perturb_head(lv.build_model(V)).eval()
    x = tokens_batch(B=8, L=16)
    _, m1 = lv.train_loss(model, x, torch.Generator().manual_seed(5))
    _, m2 = nb.train_loss(model, x, torch.Generator().manual_seed(5))
    t = antithetic_times(8, torch.Generator().manual_seed(5))
    assert torch.allclose(m1["loss"] / t, m2["loss"], rtol=1e-10)
    assert torch.allclose(m1["nelbo"], m2["nelbo"])
    assert 1e-3 <= float(t.min()) and float(t.max()) <= 1.0


def test_mdlm_sampler_unmasks_everything_and_reuses_unchanged_steps():
    m = MDLMMethod(cfg_for("mdlm"))
    model = perturb_head(m.build_model(V)).eval()
    masks = torch.full((2, 6), V)
    res = sample_mdlm(model, masks, time_grid(64), generator=torch.Generator().manual_seed(0))
    ids, nfe = res.tokens, res.nfe
    assert ids.shape == (2, 6) and int(ids.max()) < V and int(ids.min()) >= 0
    assert nfe <= 13  # at most one call per step that changed something (+1): 12 positions
    x = masks.clone()
    x[:, :2] = torch.tensor([3, 4])
    ids = sample_mdlm(model, x, time_grid(8), generator=torch.Generator().manual_seed(0)).tokens
    assert torch.equal(ids[:, :2], x[:, :2])


# ------------------------------------------------------------------ Duo


@pytest.mark.parametrize("vocab", [2, 50, 1000])
def test_duo_operator_matches_two_quadratures(vocab):
    from scipy.integrate import quad
    from scipy.stats import norm

    gammas = np.array([-3.5, -2.7, -1.75, 0.0, 2.0])
    a, da = duo_alpha(torch.tensor(gammas), vocab)
    xs, ws = np.polynomial.hermite_e.hermegauss(200)  # probabilists' Gauss-Hermite
    for g, a_i, da_i in zip(gammas, a.numpy(), da.numpy(), strict=True):
        mu = math.exp(-g / 2)
        p_quad = quad(
            lambda u: norm.pdf(u - mu) * norm.cdf(u) ** (vocab - 1), -np.inf, np.inf, epsabs=1e-13, limit=200
        )[0]
        p_gh = float((ws * norm.cdf(xs + mu) ** (vocab - 1)).sum() / math.sqrt(2 * math.pi))
        for p in (p_quad, p_gh):
            assert abs(a_i - (vocab * p - 1) / (vocab - 1)) < 2e-5, (g, a_i, p)
        if vocab == 2:  # closed form: P(mu + e1 > e2) = Phi(mu / sqrt 2)
            assert abs(a_i - (2 * norm.cdf(mu / math.sqrt(2)) - 1)) < 2e-5
        h = 1e-4  # derivative against a central difference of the quadrature
        pq = [
            quad(
                lambda u: norm.pdf(u - math.exp(-(g + d) / 2)) * norm.cdf(u) ** (vocab - 1),
                -np.inf,
                np.inf,
                epsabs=1e-13,
                limit=200,
            )[0]
            for d in (h, -h)
        ]
        assert abs(da_i - vocab / (vocab - 1) * (pq[0] - pq[1]) / (2 * h)) < 1e-3 * max(1.0, abs(da_i))


def _discrete_kl(xt, x, z, a_t, a_s):
    """KL(q(z_s | z_t, x) || q(z_s | z_t, x_theta)) for one position, float64, from the definitions."""
    n = xt.shape[0]
    a_ts = a_t / a_s
    trans = torch.full((n,), (1 - a_ts) / n, dtype=torch.float64)
    trans[z] += a_ts
    q = trans * (a_s * F.one_hot(torch.tensor(x), n).double() + (1 - a_s) / n)
    p = trans * (a_s * xt + (1 - a_s) / n)
    q, p = q / q.sum(), p / p.sum()
    return float((q * (q / p).log()).sum())


def test_udlm_integrand_is_the_limit_of_the_discrete_kl():
    g = torch.Generator().manual_seed(0)
    n = 7
    logits = torch.randn(1, 2, n, generator=g, dtype=torch.float64) * 2
    x = torch.tensor([[3, 3]])
    z = torch.tensor([[3, 5]])  # z = x and z != x
    for a in (0.05, 0.4, 0.9):
        f = udlm_integrand(
            logits, x, z, torch.tensor([a], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)
        )  # alpha' = -1
        dt = 1e-6
        for l in range(2):
            kl = _discrete_kl(torch.softmax(logits[0, l], -1), 3, int(z[0, l]), a, a + dt)
            assert float(f[0, l]) >= 0
            assert abs(float(f[0, l]) - kl / dt) < 1e-4 * max(1.0, kl / dt), (a, l, float(f[0, l]), kl / dt)
    perfect = F.one_hot(x, n).double() * 60.0  # x_theta = onehot(x): zero
    f = udlm_integrand(
        perfect, x, z, torch.tensor([0.5], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)
    )
    assert float(f.abs().max()) < 1e-10


def test_duo_uniform_prediction_nelbo_is_log_v():
    # int_0^1 E_z[integrand] dt at x_theta = uniform, by quadrature in log t (the integrand grows
    # like log(1/t) at t -> 0): the model is the exact reverse of i.i.d. uniform data, so log V
    n = 30
    s = np.linspace(-30, -1e-9, 20001)
    t = torch.tensor(np.exp(s))
    a, K = 1 - t, len(s)
    x = torch.zeros(K, 2, dtype=torch.long)
    z = torch.tensor([[0, 1]]).expand(K, 2)  # z = x, z != x
    f = udlm_integrand(torch.zeros(K, 2, n, dtype=torch.float64), x, z, a, -torch.ones(K, dtype=torch.float64))
    p_same = a + (1 - a) / n
    g = ((p_same * f[:, 0] + (1 - p_same) * f[:, 1]) * t).numpy()
    total = float(((g[1:] + g[:-1]) / 2 * np.diff(s)).sum())
    assert abs(total - math.log(n)) < 1e-4, total
    # and the zero-head model's Monte Carlo bound
    m = DuoMethod(cfg_for("duo", "eval.t_samples=4"))
    model = m.build_model(V).eval()
    r = m.eval_bound(model, tokens_batch(B=64, L=32), torch.Generator().manual_seed(0))
    # heavy-tailed estimator (terms ~1/t with probability ~t near t = 0): a loose sanity check
    assert abs(float(r["nelbo"].mean()) - math.log(V)) < 0.5, float(r["nelbo"].mean())


def test_plaid_block_scales_residual_branches_and_has_no_biases():
    torch.manual_seed(0)
    n_blocks = 4
    blk = PlaidBlock(32, 2, residual_scale=1 / math.sqrt(n_blocks)).eval()
    assert all(not name.endswith("bias") for name, _ in blk.named_parameters())
    from replaid.model.dit import Rotary

    rope = Rotary(16)(10, torch.device("cpu"))
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        blk.mlp[2].weight.zero_()  # MLP branch off: the block is x + attn / sqrt(n)
        ref = x + blk.attention(blk.norm1(x), rope) / math.sqrt(n_blocks)
        assert torch.allclose(blk(x, rope), ref, atol=1e-6)
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        assert torch.allclose(blk.norm1(x), rms, atol=1e-6)


def test_plaid_model_has_the_replaid_interface():
    cfg = cfg_for("plaid")
    model = get_method(cfg).build_model(V)
    assert isinstance(model, PlaidModel) and not hasattr(model, "cond")
    groups = model.param_groups()
    assert set(groups) == {"embedding", "schedule_mlp", "endpoints", "projections", "backbone", "norms_head"}
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))  # a partition of the parameters
    assert all(p.ndim == 2 for p in groups["backbone"])  # attention QKV/out and MLP matrices only
    nh = {id(p) for p in groups["norms_head"]}
    assert id(model.final.linear.bias) in nh and id(model.backbone.blocks[0].norm1.weight) in nh
    assert all(b.residual_scale == pytest.approx(1 / math.sqrt(cfg.model.n_layers)) for b in model.backbone.blocks)
    z = torch.randn(2, 5, model.d_e)
    out = model(z, torch.tensor([-1.0, 2.0], dtype=torch.float64))
    assert out.logits.dtype == torch.float32 and out.logits.shape == (2, 5, V)
    # zero head at init: the logits are exactly the output prior (posterior under a uniform token prior)
    from replaid.diffusion.denoiser import prior_logits

    ref = prior_logits(z, torch.tensor([-1.0, 2.0], dtype=torch.float64), model.embedding())
    assert torch.allclose(out.logits, ref, atol=1e-5)


# ------------------------------------------------------------------ end to end


def _eval_json(run, capsys):
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("method", [n for n, c in METHODS.items() if c.trainable and n != "replaid"])
def test_method_trains_evaluates_and_samples_through_the_cli(method, tmp_path, capsys):
    """Every trainable baseline (the registry's; RePlaid's own end-to-end tests are in test_train.py)."""
    common = ["optim.ema=0", "eval.max_batches=4", "eval.t_samples=8", "train.log_every=20"]
    one, run = tmp_path / "one", tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "debug",
                "--method",
                method,
                "--out",
                str(one),
                "--no-progress",
                "train.steps=1",
                *common,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                "--preset",
                "debug",
                "--method",
                method,
                "--out",
                str(run),
                "--no-progress",
                "train.steps=60",
                "optim.lr_backbone=3e-3",
                *common,
            ]
        )
        == 0
    )
    key = f"{METHODS[method].bound}_nats_per_token"
    before, after = _eval_json(one, capsys), _eval_json(run, capsys)
    assert after["method"] == method and key in after
    assert after[key] < before[key] - 0.3, (before[key], after[key])
    capsys.readouterr()
    assert main(["sample", str(run), "--num", "2", "--steps", "4", "--length", "8", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 2 and all(len(r["ids"]) == 8 and isinstance(r["text"], str) for r in rows)


def test_plaid_optimiser_table_and_prior_ramp():
    """Paper table "Optimization details for Plaid at the 0.1B scale" and Plaid's 5000-step bias_scale ramp."""
    from replaid.presets import get_preset
    from replaid.training.train import build_optimizer

    cfg = get_preset("owt-0.1b-plaid")
    assert cfg.method == "plaid" and cfg.diffusion.prior_ramp_steps == 5000
    cfg.model.hidden, cfg.model.n_layers, cfg.model.n_heads = 32, 2, 2
    method = get_method(cfg)
    opt = build_optimizer(method.build_model(V), cfg.optim)
    table = {
        "embedding": (1e-2, 0.0),
        "schedule_mlp": (1e-2, 0.0),
        "endpoints": (1e-2, 0.1),
        "projections": (1.4e-3, 0.029),
        "backbone": (4.67e-4, 0.086),
        "norms_head": (1.4e-3, 0.029),
    }
    assert {g["name"]: (g["lr"], g["weight_decay"]) for g in opt.param_groups} == table
    assert opt.defaults["betas"] == (0.9, 0.99)
    # -1 (the default) puts the norms and head with the backbone
    cfg.optim.lr_norms_head = cfg.optim.wd_norms_head = -1.0
    g = {g["name"]: g for g in build_optimizer(method.build_model(V), cfg.optim).param_groups}
    assert (g["norms_head"]["lr"], g["norms_head"]["weight_decay"]) == (4.67e-4, 0.086)
    # the ramp: 0 at the first step, linear, 1 from step 5000 on; carried by the method state
    assert method.prior_scale() == 0.0
    method.step = 1250
    assert method.prior_scale() == 0.25
    method.load_state_dict(method.state_dict() | {"step": 7000})
    assert method.prior_scale() == 1.0


def test_plaid_ramp_reaches_the_training_loss(tmp_path):
    """With the ramp on, the first steps train with a scaled prior; the logged scale follows the step."""
    assert (
        main(
            [
                "train",
                "--preset",
                "debug",
                "--method",
                "plaid",
                "--out",
                str(tmp_path / "r"),
                "--no-progress",
                "train.steps=6",
                "train.log_every=1",
                "diffusion.prior_ramp_steps=4",
                "eval.max_batches=1",
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    scales = [r["prior_scale"] for r in rows if "prior_scale" in r]
    assert scales == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.slow
def test_compare_methods_script_smoke(shared, tmp_path):
    """scripts/compare_methods.py (the methods table, a preset of ``replaid grid``) runs end to end at
    debug size with 2 seeds per cell, and its table carries the seeds, intervals and orderings."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    res = tmp_path / "results"
    cmd = [
        sys.executable,
        str(repo / "scripts" / "compare_methods.py"),
        "--preset",
        "debug",
        "--steps",
        "2",
        "--seeds",
        "2",
        "--max-parallel",
        "2",
        "--out",
        str(tmp_path / "runs"),
        "--results",
        str(res),
        "--corpus",
        str(shared / "data" / "tinyshakespeare"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((res / "methods.json").read_text())
    cells = {c["cell"]: c for c in data["cells"]}
    assert set(cells) == {"ar", "mdlm", "duo", "plaid", "replaid-nosc", "replaid"}
    assert cells["ar"]["kind"] == "exact NLL" and all(c["n"] == 2 and math.isfinite(c["mean"]) for c in cells.values())
    assert cells["ar"]["config"][-1] == "train.seed=0" and "train.num_threads=1" in cells["ar"]["config"]
    assert len(data["orderings"]) == 7 and cells["mdlm"]["paired"]["seeds"] == [0, 1]
    md = (res / "methods.md").read_text()
    assert "| replaid | 22.1 | 2 |" in md and "--threads 1" in md and "| ar < replaid | 2 |" in md
    assert (res / "methods_training.png").is_file() and (res / "methods_report.png").is_file()
    again = subprocess.run([*cmd, "--report-only"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads((res / "methods.json").read_text())["cells"] == data["cells"]
