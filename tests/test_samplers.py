"""Tests for replaid.samplers against the closed-form i.i.d. oracle and small fake denoisers.

Run with ``pytest -s`` to see the total-variation figures per sampler. The tests that run a sampler
take the ``device`` fixture (``pytest --device cuda``: the oracle, latents and fakes live there; the
noise is drawn there from the seeded generators); the closed-form step formulas stay on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from replaid.diffusion.denoiser import DenoiserOutput
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.diffusion.rng import device_generator
from replaid.methods import Kind
from replaid.sampling.continuous import (
    Inpaint,
    LogitTemperature,
    SampleResult,
    ScoreTemperature,
    ddim_step,
    ddpm_step,
    dpmpp_2m_extrapolate,
    exp_integrator_step,
    gamma_grid,
    heun_step,
    infill_inpaint,
    parse_infill_spans,
    prefix_inpaint,
    sample_ddim,
    sample_dpmpp_2m,
    time_grid,
    trajectory_recorder,
)
from replaid.sampling.registry import nfe_for as registry_nfe
from replaid.sampling.registry import samplers_of

SAMPLERS = {name: s.fn for name, s in samplers_of(Kind.CONTINUOUS).items()}  # the continuous samplers


def nfe_for(name: str, T: int) -> int:
    return registry_nfe(Kind.CONTINUOUS, name, T)


V, D_E = 5, 3
P = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08], dtype=torch.float64)
GAMMA_0, GAMMA_1 = -8.0, 8.0
B, L = 20, 1000  # 20000 i.i.d. positions
ALL = list(SAMPLERS)
SOLVERS = [n for n in ALL if n != "consistency"]  # converge to the data law; consistency: tests/test_distill.py
DETERMINISTIC = ["ddim", "dpmpp2m", "heun"]

# TV(empirical, p) must be below these at T = 128. Measured here: ddpm 0.0068, ddim 0.0024,
# dpmpp2m 0.0027, heun 0.0027 (ddpm 0.006-0.013 over other seeds, the others 0.002-0.007);
# the sampling noise of TV alone is about 0.005 for 20000 tokens.
TV_MAX_T128 = {"ddpm": 0.025, "ddim": 0.012, "dpmpp2m": 0.012, "heun": 0.012}


def linear_schedule(t: torch.Tensor) -> torch.Tensor:
    return GAMMA_0 + (GAMMA_1 - GAMMA_0) * t


def grid(T: int) -> torch.Tensor:
    return gamma_grid(linear_schedule, T)


@pytest.fixture(scope="module")
def E(device) -> torch.Tensor:
    return random_unit_embeddings(V, D_E, seed=0).to(device)


@pytest.fixture(scope="module")
def oracle(E) -> OracleDenoiser:
    return OracleDenoiser(P.to(E.device), E)


class Counting:
    """Counts denoiser calls and records the inputs it saw."""

    def __init__(self, inner):
        self.inner = inner
        self.self_conditioning = getattr(inner, "self_conditioning", False)
        self.calls = 0
        self.zs: list[torch.Tensor] = []
        self.gammas: list[torch.Tensor] = []

    def embedding_matrix(self):
        return self.inner.embedding_matrix()

    def __call__(self, z, gamma, e_sc=None):
        self.calls += 1
        self.zs.append(z.clone())
        self.gammas.append(gamma.clone())
        return self.inner(z, gamma, e_sc)


def empirical(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens.flatten().cpu(), minlength=V).double() / tokens.numel()


def tv_to_p(tokens: torch.Tensor) -> float:
    return 0.5 * float((empirical(tokens) - P).abs().sum())


def entropy(tokens: torch.Tensor) -> float:
    q = empirical(tokens)
    q = q[q > 0]
    return float(-(q * q.log()).sum())


def randn(*shape, seed=None, generator=None, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Seeded (CPU) Gaussian values placed on ``device``: the same latents on every device."""
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(device)


def run(name, den, T, seed, batch=B, length=L, **kw) -> SampleResult:
    gen = torch.Generator().manual_seed(seed)
    z = randn(batch, length, D_E, generator=gen, device=den.embedding_matrix().device)
    return SAMPLERS[name](den, z, grid(T), generator=gen, **kw)


# ----------------------------------------------------------------------------------------------
# the shared test, every sampler
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
def test_sampler_common(name, oracle):
    infos = []
    tvs = {}
    for T in (4, 128):
        den = Counting(oracle)
        res = SAMPLERS[name](
            den,
            randn(B, L, D_E, seed=0, device=oracle.p.device),
            grid(T),
            generator=torch.Generator().manual_seed(1),
            callback=infos.append if T == 4 else None,
        )
        # interface
        assert res.tokens.shape == (B, L) and res.tokens.dtype == torch.long
        assert res.z0.shape == (B, L, D_E) and res.z0.dtype == torch.float32
        assert res.logits.shape == (B, L, V)
        # NFE accounting by counting calls; every call sees (B,) float64 gamma on the grid
        assert den.calls == res.nfe == nfe_for(name, T)
        assert all(g.shape == (B,) and g.dtype == torch.float64 and g.device == oracle.p.device for g in den.gammas)
        assert res.tokens.device == oracle.p.device
        assert torch.allclose(den.gammas[0].cpu(), grid(T)[0].expand(B))
        assert torch.allclose(den.gammas[-1].cpu(), grid(T)[-1].expand(B))  # readout at gamma(0)
        tvs[T] = tv_to_p(res.tokens)
    print(f"\n[{name}] TV(empirical, p) over {B * L} tokens: T=4: {tvs[4]:.4f}  T=128: {tvs[128]:.4f}")
    assert tvs[128] < TV_MAX_T128[name]
    assert tvs[4] > tvs[128] + 0.01

    # callback: once per step, in order, with the documented keys
    assert [info["i"] for info in infos] == list(range(4))
    for info in infos:
        assert {"i", "gamma", "z", "e_hat", "logits"} <= set(info)
        assert info["z"].shape == (B, L, D_E) and info["logits"].shape == (B, L, V)
    assert [info["gamma"] for info in infos] == grid(4)[:-1].tolist()

    # determinism under a seed (z and sampler noise both seeded)
    a = run(name, oracle, 8, seed=3, batch=4, length=64)
    b = run(name, oracle, 8, seed=3, batch=4, length=64)
    c = run(name, oracle, 8, seed=4, batch=4, length=64)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.z0, b.z0)
    assert not torch.equal(a.tokens, c.tokens)


# ----------------------------------------------------------------------------------------------
# grids and bookkeeping
# ----------------------------------------------------------------------------------------------


def test_grids():
    t = time_grid(4)
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    g = grid(4)
    assert g.dtype == torch.float64 and torch.allclose(
        g, torch.tensor([8.0, 4.0, 0.0, -4.0, -8.0], dtype=torch.float64)
    )
    # a schedule returning (gamma, gamma') contributes gamma
    g2 = gamma_grid(lambda t: (linear_schedule(t), torch.full_like(t, 16.0)), 4)
    assert torch.equal(g, g2)
    with pytest.raises(ValueError):
        time_grid(0)


def test_gamma_grid_with_noise_schedule_module():
    from replaid.diffusion.schedule import NoiseSchedule  # the project's own module: never skipped

    sched = NoiseSchedule(GAMMA_0, GAMMA_1, shape="linear")
    assert torch.allclose(gamma_grid(sched, 8), grid(8))


def test_nfe_for_and_bad_grids(oracle):
    assert [nfe_for(n, 10) for n in ("ddpm", "ddim", "dpmpp2m", "heun")] == [11, 11, 11, 20]
    assert nfe_for("heun", 1) == 2
    with pytest.raises(ValueError):
        nfe_for("euler", 4)
    z = torch.randn(2, 3, D_E).to(oracle.p.device)
    for bad in (
        torch.tensor([1.0, 2.0], dtype=torch.float64),  # increasing
        torch.tensor([1.0], dtype=torch.float64),  # no step
        torch.tensor([1.0, float("inf")], dtype=torch.float64),
    ):
        with pytest.raises(ValueError):
            sample_ddim(oracle, z, bad)


# ----------------------------------------------------------------------------------------------
# update formulas
# ----------------------------------------------------------------------------------------------


def test_ddim_is_exponential_integrator_with_D_equal_e_hat():
    g = torch.Generator().manual_seed(0)
    z, e = torch.randn(2, 2, 7, 4, generator=g, dtype=torch.float64)
    for gt, gs in [(8.0, 7.5), (3.0, -2.0), (-4.0, -8.0)]:
        ref = ddim_step(z, e, gt, gs)
        assert torch.allclose(exp_integrator_step(z, e, gt, gs), ref, atol=1e-12, rtol=1e-12)
        # the Euler step of the VE form (Heun's predictor, its last step) is DDIM as well
        a_t = math.sqrt(1 / (1 + math.exp(gt)))
        a_s = math.sqrt(1 / (1 + math.exp(gs)))
        heun_euler = a_s * heun_step(z / a_t, e, math.exp(gt / 2), math.exp(gs / 2))
        assert torch.allclose(heun_euler, ref, atol=1e-12, rtol=1e-12)
    # the 2M extrapolation of a constant prediction is that prediction
    assert torch.allclose(dpmpp_2m_extrapolate(e, e, 0.3, 0.7), e, atol=1e-15)


def test_dpmpp_2m_extrapolation_hits_the_midpoint():
    """For e linear in lambda, D = e(lambda_t + h / 2) for any step-size ratio r = h_prev / h."""
    a, b = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e = lambda lam: a + b * lam
    lam_t = 0.3
    for h_prev, h in [(0.5, 0.5), (0.2, 0.9), (1.3, 0.1)]:
        D = dpmpp_2m_extrapolate(e(lam_t), e(lam_t - h_prev), h_prev, h)
        assert torch.allclose(D, e(lam_t + h / 2), atol=1e-12)


def test_dpmpp_2m_steps_follow_the_formula(oracle):
    """Every step after the first is eq. (dpmpp-update) with D from eq. (dpmpp-extrap), on a
    non-uniform grid, recomputed from the callback's (z, e_hat)."""
    gammas = torch.tensor([8.0, 6.5, 2.0, 1.5, -1.0, -8.0], dtype=torch.float64)
    z = randn(3, 40, D_E, seed=0, dtype=torch.float64, device=oracle.p.device)
    infos = []
    sample_dpmpp_2m(
        oracle,
        z,
        gammas,
        callback=lambda info: infos.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in info.items()}),
    )
    g = gammas.tolist()
    prev_z = [z] + [info["z"] for info in infos]
    for i in range(1, len(infos)):
        h_prev, h = (g[i - 1] - g[i]) / 2, (g[i] - g[i + 1]) / 2
        D = dpmpp_2m_extrapolate(infos[i]["e_hat"].double(), infos[i - 1]["e_hat"].double(), h_prev, h)
        assert torch.allclose(infos[i]["z"], exp_integrator_step(prev_z[i], D, g[i], g[i + 1]), atol=1e-10)


def test_ddpm_step_is_the_gaussian_posterior():
    """Zero noise gives the VDM posterior mean; the noise scale is sqrt(c) sigma_s."""
    g = torch.Generator().manual_seed(0)
    z, e, eps = torch.randn(3, 4, 5, 2, generator=g, dtype=torch.float64)
    gt, gs = 1.5, -0.5
    at2, as2 = 1 / (1 + math.exp(gt)), 1 / (1 + math.exp(gs))
    snr_t, snr_s = at2 / (1 - at2), as2 / (1 - as2)
    c = 1 - snr_t / snr_s
    mean = (1 - c) * math.sqrt(as2 / at2) * z + c * math.sqrt(as2) * e
    assert torch.allclose(ddpm_step(z, e, gt, gs, torch.zeros_like(eps)), mean, atol=1e-12)
    assert torch.allclose(ddpm_step(z, e, gt, gs, eps) - mean, math.sqrt(c * (1 - as2)) * eps, atol=1e-12)


class ConstantEHat:
    """Fake denoiser whose clean prediction ignores its input."""

    self_conditioning = False

    def __init__(self, e: torch.Tensor):
        self.e = e

    def embedding_matrix(self):
        return torch.eye(V, D_E, device=self.e.device)

    def __call__(self, z, gamma, e_sc=None):
        return DenoiserOutput(torch.zeros(*z.shape[:2], V, device=z.device), self.e.to(z.dtype))


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_exact_for_constant_e_hat(name, device):
    """With e_hat constant the PFODE solution is z_s = alpha_s e + (sigma_s / sigma_t)(z_t - alpha_t e)."""
    g = torch.Generator().manual_seed(0)
    e = randn(3, 6, D_E, generator=g, dtype=torch.float64, device=device)
    z = randn(3, 6, D_E, generator=g, dtype=torch.float64, device=device)
    den = ConstantEHat(e)
    for gammas in (
        torch.tensor([4.0, -6.0], dtype=torch.float64),
        torch.tensor([7.0, 5.5, 1.0, 0.5, -3.0, -6.0], dtype=torch.float64),
    ):
        a_t, s_t = math.sqrt(1 / (1 + math.exp(gammas[0]))), math.sqrt(1 / (1 + math.exp(-gammas[0])))
        a_s, s_s = math.sqrt(1 / (1 + math.exp(gammas[-1]))), math.sqrt(1 / (1 + math.exp(-gammas[-1])))
        exact = a_s * e + (s_s / s_t) * (z - a_t * e)
        res = SAMPLERS[name](den, z, gammas)
        assert res.z0.dtype == torch.float64
        assert torch.allclose(res.z0, exact, atol=1e-10, rtol=1e-10)


class SmoothEHat:
    """Fake denoiser with e_hat = c0 + c1 u / (1 + u), u = sigma_tilde = exp(gamma / 2).

    The VE-form PFODE d z_bar / du = (z_bar - e_hat(u)) / u then has the closed-form solution
    z_bar_s / u_s = z_bar_t / u_t + c0 (1/u_s - 1/u_t) - c1 [log(u / (1 + u))]_{u_t}^{u_s}.
    """

    self_conditioning = False

    def __init__(self, c0, c1):
        self.c0, self.c1 = c0, c1

    def embedding_matrix(self):
        return torch.eye(V, D_E, device=self.c0.device)

    def __call__(self, z, gamma, e_sc=None):
        u = torch.exp(gamma.double() / 2).view(-1, 1, 1)
        return DenoiserOutput(
            torch.zeros(*z.shape[:2], V, device=z.device), (self.c0 + self.c1 * u / (1 + u)).to(z.dtype)
        )

    def exact(self, z, gamma_t, gamma_s):
        a_t, a_s = math.sqrt(1 / (1 + math.exp(gamma_t))), math.sqrt(1 / (1 + math.exp(gamma_s)))
        u_t, u_s = math.exp(gamma_t / 2), math.exp(gamma_s / 2)
        F = lambda u: math.log(u / (1 + u))
        z_bar_s = u_s * (z / a_t / u_t + self.c0 * (1 / u_s - 1 / u_t) - self.c1 * (F(u_s) - F(u_t)))
        return a_s * z_bar_s


def test_convergence_orders(device):
    """Global error vs T on a smooth, input-independent e_hat and a very non-uniform grid: DDIM is
    first order, DPM-Solver++(2M) and Heun second order (the slopes pin down their formulas)."""
    g = torch.Generator().manual_seed(0)
    c0, c1, z = randn(3, 2, 5, D_E, generator=g, dtype=torch.float64, device=device)
    den = SmoothEHat(c0, c1)
    gt, gs = 4.0, -4.0
    exact = den.exact(z, gt, gs)

    def warped(T):  # step sizes alternate 1 : 3 (so r_i is 1/3 or 3, never close to 1)
        steps = torch.tensor([1.0, 3.0] * (T // 2), dtype=torch.float64)
        return gt + (gs - gt) * torch.cat([torch.zeros(1, dtype=torch.float64), steps.cumsum(0) / steps.sum()])

    orders = {}
    for name in DETERMINISTIC:
        err = [float((SAMPLERS[name](den, z, warped(T)).z0 - exact).abs().max()) for T in (16, 32, 64)]
        orders[name] = [round(math.log2(err[k] / err[k + 1]), 3) for k in range(2)]
    print(f"\n[orders] {orders}")
    assert all(0.8 < o < 1.2 for o in orders["ddim"])
    assert all(o > 1.7 for o in orders["dpmpp2m"] + orders["heun"])


def test_heun_equals_dpmpp_2m_for_input_independent_e_hat(device):
    """An identity that checks both formulas, the 2M first-step fallback and Heun's skipped last
    corrector: for e_hat independent of z on a grid uniform in lambda, Heun's corrector at step
    i adds alpha_s (exp(h) - 1)/2 (e_{i+1} - e_i), which propagates to the end exactly like
    DPM-Solver++(2M)'s multistep term at step i + 1, so the two samplers coincide."""
    g = torch.Generator().manual_seed(1)
    c0, c1, z = randn(3, 2, 5, D_E, generator=g, dtype=torch.float64, device=device)
    den = SmoothEHat(c0, c1)
    for T in (1, 2, 7):
        gammas = torch.linspace(5.0, -6.0, T + 1, dtype=torch.float64)
        assert torch.allclose(
            SAMPLERS["heun"](den, z, gammas).z0, SAMPLERS["dpmpp2m"](den, z, gammas).z0, atol=1e-12, rtol=1e-12
        )


def test_inpaint_forces_known_tokens(E):
    """The readout is overwritten at known positions even if the denoiser disagrees."""
    tokens = torch.full((2, 9), 3, dtype=torch.long, device=E.device)
    mask = torch.zeros(2, 9, dtype=torch.bool, device=E.device)
    mask[:, ::2] = True
    den = ConstantEHat(torch.zeros(2, 9, D_E, device=E.device))  # logits all zero: argmax is token 0
    for name in ALL:
        res = SAMPLERS[name](den, randn(2, 9, D_E, seed=0, device=E.device), grid(3), inpaint=Inpaint(tokens, mask, E))
        assert (res.tokens[mask] == 3).all() and (res.tokens[~mask] == 0).all()


def test_dpmpp_2m_first_step_is_ddim(oracle):
    z = randn(4, 50, D_E, seed=0, device=oracle.p.device)
    caught = {}
    for name in ("ddim", "dpmpp2m"):
        caught[name] = []
        SAMPLERS[name](oracle, z, grid(8), callback=lambda info, k=name: caught[k].append(info["z"].clone()))
    assert torch.allclose(caught["ddim"][0], caught["dpmpp2m"][0], atol=1e-12)
    # the second step uses the multistep extrapolation and differs
    assert not torch.allclose(caught["ddim"][1], caught["dpmpp2m"][1], atol=1e-6)


def test_deterministic_samplers_converge(oracle):
    z = randn(8, 500, D_E, seed=1, device=oracle.p.device)
    dist = {}
    for T in (16, 256):
        z0 = {n: SAMPLERS[n](oracle, z, grid(T)).z0 for n in DETERMINISTIC}
        for a, b in [("ddim", "dpmpp2m"), ("ddim", "heun"), ("dpmpp2m", "heun")]:
            d = (z0[a] - z0[b]).norm(dim=-1)  # (B, L)
            dist[T, a, b] = (float(d.mean()), float(d.median()))
    for (T, a, b), (mean, med) in dist.items():
        if T == 256:
            mean16, med16 = dist[16, a, b]
            print(f"\n[{a} vs {b}] mean/median |z0 diff|: T=16 {mean16:.2e}/{med16:.2e}  T=256 {mean:.2e}/{med:.2e}")
            assert mean < 0.25 * mean16 and med < 0.25 * med16
            assert med < 1e-3 and mean < 0.02


# ----------------------------------------------------------------------------------------------
# self-conditioning
# ----------------------------------------------------------------------------------------------


class SelfCondFake:
    """Records the e_sc it receives; returns a distinct, input-dependent e_hat at every call."""

    self_conditioning = True

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.received: list = []
        self.returned: list = []

    def embedding_matrix(self):
        return torch.eye(V, D_E, device=self.device)

    def __call__(self, z, gamma, e_sc=None):
        self.received.append(e_sc)
        e_hat = 0.5 * torch.tanh(z) + 0.01 * len(self.received)
        self.returned.append(e_hat)
        return DenoiserOutput(torch.zeros(*z.shape[:2], V, device=z.device), e_hat)


@pytest.mark.parametrize("name", ALL)
def test_self_conditioning_feeds_previous_e_hat(name, device):
    T = 5
    z = randn(2, 7, D_E, seed=0, device=device)
    fake = SelfCondFake(device)
    SAMPLERS[name](fake, z, grid(T), generator=torch.Generator().manual_seed(0))
    assert len(fake.received) == nfe_for(name, T)
    assert fake.received[0] is None
    for k in range(1, len(fake.received)):
        assert fake.received[k] is not None and torch.equal(fake.received[k], fake.returned[k - 1])
    # explicit override: no self-conditioning input at all
    fake = SelfCondFake(device)
    SAMPLERS[name](fake, z, grid(T), self_cond=False, generator=torch.Generator().manual_seed(0))
    assert all(e is None for e in fake.received)


# ----------------------------------------------------------------------------------------------
# temperature wrappers
# ----------------------------------------------------------------------------------------------


def test_temperature_wrappers_identity_and_formulas(oracle, E):
    z = randn(3, 10, D_E, seed=0, device=E.device)
    gamma = torch.tensor([2.0, -1.0, -5.0], dtype=torch.float64, device=E.device)
    ref = oracle(z, gamma)
    for W in (LogitTemperature, ScoreTemperature):
        w = W(oracle, 1.0)
        out = w(z, gamma)
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.e_hat, ref.e_hat)
        near = W(oracle, 1.0 + 1e-7)(z, gamma)  # continuous at tau = 1
        assert torch.allclose(near.e_hat, ref.e_hat, atol=1e-5)
        assert w.self_conditioning is False and torch.equal(w.embedding_matrix(), oracle.embedding_matrix())
        assert not hasattr(w, "vocab_size")  # only the Denoiser interface is offered, not the model
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError):
                W(oracle, bad)
    with pytest.raises(ValueError):
        ScoreTemperature(oracle, 0.0)  # no greedy limit: the score would be infinite

    tau = 0.5
    lt = LogitTemperature(oracle, tau)(z, gamma)
    assert torch.allclose(lt.logits, ref.logits / tau)
    assert torch.equal(lt.logits.argmax(-1), ref.logits.argmax(-1))  # readout unaffected
    assert torch.allclose(lt.e_hat, torch.softmax(ref.logits / tau, -1) @ E.float(), atol=1e-6)

    st = ScoreTemperature(oracle, tau)(z, gamma)
    assert torch.equal(st.logits, ref.logits)
    a = torch.sigmoid(-gamma).sqrt().view(-1, 1, 1)
    s = torch.sigmoid(gamma).sqrt().view(-1, 1, 1)
    eps = (z.double() - a * ref.e_hat.double()) / s / tau
    assert torch.allclose(st.e_hat.double(), (z.double() - s * eps) / a, atol=1e-5)


def test_logit_temperature_zero_is_the_greedy_limit(oracle, E):
    """tau = 0: e_hat is the argmax token's embedding, the limit of softmax(logits / tau) @ E as tau -> 0
    (checked against a float64 computation at tau = 1e-6); the logits (and so the readout) unchanged."""
    z = randn(3, 10, D_E, seed=1, device=E.device)
    gamma = torch.tensor([2.0, -1.0, -5.0], dtype=torch.float64, device=E.device)
    ref = oracle(z, gamma)
    g = LogitTemperature(oracle, 0.0)(z, gamma)
    limit = torch.softmax(ref.logits.double() / 1e-6, -1) @ E.double()  # (B, L, d_e)
    assert torch.allclose(g.e_hat.double(), limit, atol=1e-5)
    assert torch.equal(g.logits, ref.logits)


def test_tempered_probs_zero_is_one_hot_argmax():
    from replaid.sampling.discrete import tempered_probs

    logits = torch.randn(4, 7, 50, generator=torch.Generator().manual_seed(0))
    p0 = tempered_probs(logits, 0.0)
    assert p0.dtype == torch.float64 and torch.equal(p0.sum(-1), torch.ones(4, 7, dtype=torch.float64))
    assert torch.equal(p0.argmax(-1), logits.argmax(-1)) and torch.equal(p0.max(-1).values, torch.ones(4, 7).double())
    assert torch.allclose(p0, tempered_probs(logits, 1e-6))
    assert torch.allclose(tempered_probs(logits, 0.5), torch.softmax(logits.double() * 2, -1))


def test_temperature_lowers_sample_entropy(oracle):
    h1 = entropy(run("ddpm", oracle, 32, seed=0).tokens)
    h_logit = entropy(run("ddpm", LogitTemperature(oracle, 0.25), 32, seed=0).tokens)
    h_score = entropy(run("ddpm", ScoreTemperature(oracle, 0.8), 32, seed=0).tokens)
    print(
        f"\n[temperature] entropy of DDPM samples, T=32: tau=1 {h1:.4f}  logit tau=0.25 {h_logit:.4f}"
        f"  score tau=0.8 {h_score:.4f}  (H(p) = {oracle.entropy():.4f})"
    )
    assert h_logit < h1 - 0.03
    assert h_score < h1 - 0.03


# ----------------------------------------------------------------------------------------------
# inpainting / infilling
# ----------------------------------------------------------------------------------------------


def test_parse_infill_spans():
    mask = parse_infill_spans("3:10, 20:25", 30)
    expected = torch.ones(30, dtype=torch.bool)
    expected[3:10] = False
    expected[20:25] = False
    assert torch.equal(mask, expected)
    assert torch.equal(
        parse_infill_spans(":2,28:", 30), torch.cat([torch.zeros(2), torch.ones(26), torch.zeros(2)]).bool()
    )
    for bad in ("5", "10:3", "0:31", "a:b"):
        with pytest.raises(ValueError):
            parse_infill_spans(bad, 30)


@pytest.mark.parametrize("name", ALL)
def test_infilling_keeps_known_tokens(name, oracle, E):
    Bi, Li, T = 32, 40, 12
    gen = torch.Generator().manual_seed(5)
    reference = oracle.sample_tokens((Bi, Li), gen)
    inp = infill_inpaint(reference, "3:10,20:25", E)
    known = inp.known_mask
    den = Counting(oracle)
    gammas = gamma_grid(lambda t: -8.0 + 10.0 * t, T)  # gamma(1) = 2: the signal is visible at t = 1
    res = SAMPLERS[name](
        den,
        randn(Bi, Li, D_E, generator=gen, device=E.device),
        gammas,
        inpaint=inp,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(res.tokens[known], reference[known])
    # known latents seen by the denoiser are forward samples of the truth: standardised residuals
    # (z - alpha e) / sigma are N(0, 1) at every call, the first (at gammas[0]) included
    e = E.float()[reference]  # (B, L, d_e)
    for zk, gk in zip(den.zs, den.gammas, strict=True):
        a, s = torch.sigmoid(-gk[0]).sqrt().item(), torch.sigmoid(gk[0]).sqrt().item()
        r = ((zk - a * e) / s)[known]  # (N, d_e)
        assert abs(float(r.mean())) < 0.1 and 0.85 < float(r.std()) < 1.15
        assert abs(float((r * e[known]).sum(-1).mean())) < 0.15  # unreplaced: about -alpha/sigma
    # same seed, same output; the unknown positions are generated (not copied)
    gen = torch.Generator().manual_seed(5)
    oracle.sample_tokens((Bi, Li), gen)
    repeat = SAMPLERS[name](
        oracle,
        randn(Bi, Li, D_E, generator=gen, device=E.device),
        gammas,
        inpaint=inp,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(repeat.tokens, res.tokens) and torch.equal(repeat.z0, res.z0)
    assert (res.tokens[~known] != reference[~known]).any()


def test_inpainting_latents_are_exact_forward_samples(oracle, E):
    """DDIM draws noise only for the replacements, in order (start, then after each step), so
    the known latents can be reproduced exactly: z = alpha_s e + sigma_s eps."""
    Bi, Li, T, seed = 4, 12, 6, 11
    tokens = oracle.sample_tokens((Bi, Li), torch.Generator().manual_seed(0))
    mask = (torch.rand(Bi, Li, generator=torch.Generator().manual_seed(1)) < 0.5).to(E.device)
    inp = Inpaint(tokens, mask, E)
    gammas = gamma_grid(lambda t: -8.0 + 10.0 * t, T)
    z = randn(Bi, Li, D_E, seed=2, dtype=torch.float64, device=E.device)
    den = Counting(oracle)
    after_step = []
    res = sample_ddim(
        den,
        z,
        gammas,
        inpaint=inp,
        generator=torch.Generator().manual_seed(seed),
        callback=lambda info: after_step.append(info["z"].clone()),
    )
    gen = device_generator(torch.Generator().manual_seed(seed), E.device)  # as the sampler derives its stream
    e = E[tokens]  # (B, L, d_e) float64
    latents = [den.zs[0]] + after_step  # at gammas[0], gammas[1], ..., gammas[T]
    for k, zk in enumerate(latents):
        eps = torch.randn(Bi, Li, D_E, generator=gen, dtype=torch.float64, device=E.device)
        g = gammas[k]
        truth = torch.sigmoid(-g).sqrt() * e + torch.sigmoid(g).sqrt() * eps
        assert torch.allclose(zk[mask], truth[mask], atol=1e-12)
        if k == 0:
            assert torch.equal(zk[~mask], z[~mask])  # unknown positions untouched at the start
    assert torch.equal(res.z0[mask], latents[-1][mask])
    assert torch.equal(res.tokens[mask], tokens[mask])


def test_prefix_prompt(oracle, E):
    Bp, Lp, Pn = 6, 30, 8
    prompt = oracle.sample_tokens((Bp, Pn), torch.Generator().manual_seed(0))
    inp = prefix_inpaint(prompt, Lp, E)
    assert inp.known_mask[:, :Pn].all() and not inp.known_mask[:, Pn:].any()
    outs = [
        run(name, oracle, 10, seed=s, batch=Bp, length=Lp, inpaint=inp)
        for name, s in [("ddpm", 0), ("ddpm", 0), ("ddpm", 1), ("dpmpp2m", 0)]
    ]
    for o in outs:
        assert torch.equal(o.tokens[:, :Pn], prompt)
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    assert not torch.equal(outs[0].tokens[:, Pn:], outs[2].tokens[:, Pn:])
    with pytest.raises(ValueError):
        prefix_inpaint(prompt, Pn - 1, E)


# ----------------------------------------------------------------------------------------------
# trajectories
# ----------------------------------------------------------------------------------------------


def test_trajectory_recorder(oracle):
    letters = "abcde"
    rec = trajectory_recorder(every=4, decode=lambda t: ["".join(letters[i] for i in row) for row in t.tolist()])
    res = run("ddpm", oracle, 10, seed=0, batch=2, length=300, callback=rec)
    assert [i for i, _ in rec.records] == [0, 4, 8, 9]
    assert [i for i, _ in rec.texts] == [0, 4, 8, 9]
    assert all(tok.shape == (2, 300) and tok.dtype == torch.long for _, tok in rec.records)
    assert len(rec.texts[-1][1]) == 2 and len(rec.texts[-1][1][0]) == 300
    # text emerges: the late predictions agree with the final tokens far more than the first
    agree = [float((tok == res.tokens.cpu()).float().mean()) for _, tok in rec.records]
    assert agree[-1] > 0.9 and agree[-1] > agree[0] + 0.3


def test_trajectory_recorder_accepts_every_step_and_refuses_zero():
    """Mutation survivor (samplers.py, the ``every`` check)."""
    import pytest as _pytest

    from replaid.sampling.continuous import TrajectoryRecorder

    assert TrajectoryRecorder(1).every == 1
    with _pytest.raises(ValueError):
        TrajectoryRecorder(0)
