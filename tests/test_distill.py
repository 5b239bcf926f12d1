"""Distillation (issue 24): the progressive target, the oracle's two-step map, the consistency loss,
and distil -> sample -> eval -> export end to end, with resume."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch

from replaid.cli import main
from replaid.config import ModelConfig
from replaid.diffusion.denoiser import DenoiserOutput
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.distill import targets as T
from replaid.distill.loop import DistillConfig, distill
from replaid.eval.evaluate import evaluate
from replaid.methods.replaid import DiffusionOptions
from replaid.model.replaid import RePlaid
from replaid.presets import resolve
from replaid.store import checkpoint as ck
from replaid.training.train import train as _train

torch.set_num_threads(1)


def _as64(gamma: float) -> tuple[float, float]:
    """alpha, sigma straight from the definitions, without the samplers' helpers."""
    g = torch.tensor(gamma, dtype=torch.float64)
    return float(torch.sigmoid(-g).sqrt()), float(torch.sigmoid(g).sqrt())


class ToyTeacher:
    """A float64 nonlinear teacher whose prediction depends on the self-conditioning input."""

    def __init__(self, d: int):
        g = torch.Generator().manual_seed(3)
        self.W = torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        self.calls: list[bool] = []

    def __call__(self, z, gamma, e_sc):
        self.calls.append(e_sc is not None)
        out = torch.tanh(z @ self.W) * (1.0 + 0.1 * gamma)
        return out if e_sc is None else out + 0.3 * e_sc


@pytest.mark.parametrize("sc", [False, True])
def test_progressive_target_is_the_teachers_two_step_ddim_endpoint_in_float64(sc):
    teacher = ToyTeacher(6)
    z = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gt, gm, gs = 2.5, 0.7, -1.9
    e_tilde = T.progressive_target(teacher, z, gt, gm, gs, sc)
    assert teacher.calls == [False, sc]  # the teacher's protocol within the step: s.c. on its own first call

    # independently: two DDIM steps z_s = alpha_s e + sigma_s (z_t - alpha_t e) / sigma_t, then the e
    # whose single step from t lands there, solved from the linear equation as written
    (at, st), (am, sm), (as_, ss) = _as64(gt), _as64(gm), _as64(gs)
    e1 = teacher(z, gt, None)
    z_mid = am * e1 + sm * (z - at * e1) / st
    e2 = teacher(z_mid, gm, e1 if sc else None)
    z_s = as_ * e2 + ss * (z_mid - am * e2) / sm
    e_ref = (z_s - (ss / st) * z) / (as_ - ss * at / st)
    assert torch.allclose(e_tilde, e_ref, rtol=1e-12, atol=1e-12)
    one_step = as_ * e_tilde + ss * (z - at * e_tilde) / st  # the student's one DDIM step
    assert torch.allclose(one_step, z_s, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sc", [False, True])
def test_progressive_heun_target_is_the_teachers_two_heun_steps_in_float64(sc):
    """``--teacher-solver heun``: the target is the DDIM inverse of two Heun (EDM) steps, each a predictor
    and a corrector, the teacher self-conditioned on its previous call within the student's step."""
    teacher = ToyTeacher(6)
    z = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    gt, gm, gs = 2.5, 0.7, -1.9
    e_tilde = T.progressive_target(teacher, z, gt, gm, gs, sc, solver="heun")
    assert teacher.calls == [False, sc, sc, sc]

    # independently, in z_bar = z / alpha and sigma_tilde = sigma / alpha (from the definitions):
    # Euler predictor, then the trapezoid of the two slopes (z_bar - e) / sigma_tilde
    def heun(z, g0, g1, e_sc):
        (a0, s0), (a1, s1) = _as64(g0), _as64(g1)
        zb, t0, t1 = z / a0, s0 / a0, s1 / a1
        e = teacher(z, g0, e_sc)
        slope0 = (zb - e) / t0
        zb_pred = zb + (t1 - t0) * slope0
        e_pred = teacher(a1 * zb_pred, g1, e if sc else None)
        slope1 = (zb_pred - e_pred) / t1
        return a1 * (zb + (t1 - t0) * (slope0 + slope1) / 2), e_pred

    z_mid, e1 = heun(z, gt, gm, None)
    z_s, _ = heun(z_mid, gm, gs, e1 if sc else None)
    (at, st), (as_, ss) = _as64(gt), _as64(gs)
    one_step = as_ * e_tilde + ss * (z - at * e_tilde) / st  # the student's one DDIM step
    assert torch.allclose(one_step, z_s, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="ddim or heun"):
        T.teacher_two_step(teacher, z, gt, gm, gs, sc, solver="euler")


def test_ddim_inverse_refuses_a_step_that_does_not_go_down():
    z = torch.zeros(1, 1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="gamma_s < gamma_t"):
        T.ddim_inverse(z, z, 1.0, 1.0)


# ------------------------------------------------------------------ the oracle


def _oracle(V=12, d_e=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g, dtype=torch.float64) ** 3 + 0.01  # far from uniform
    return OracleDenoiser(p, random_unit_embeddings(V, d_e, seed))


def _oracle_ehat(o: OracleDenoiser):
    return lambda z, gamma, e_sc: o(z, torch.full((z.shape[0],), gamma, dtype=torch.float64)).e_hat.double()


def _student_for(o: OracleDenoiser) -> RePlaid:
    torch.manual_seed(0)
    m = RePlaid(
        ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=16, d_e=o.E.shape[1], self_conditioning=False),
        DiffusionOptions(),
        vocab_size=o.vocab_size,
    )
    with torch.no_grad():
        m.embedding.weight.copy_(o.E.float())
    m.embedding.weight.requires_grad_(False)
    return m


def _two_step_distance(student, teacher, E, tokens, g_teacher, gen) -> float:
    """mean ||student's one DDIM step - teacher's two|| ^2 over every student step, fixed latents."""
    K = (len(g_teacher) - 1) // 2
    total = 0.0
    with torch.no_grad():
        for k in range(K):
            gt, gm, gs = g_teacher[2 * k : 2 * k + 3].tolist()
            z = T.noisy_latents(E, tokens, torch.full((tokens.shape[0],), gt, dtype=torch.float64), gen)
            ref = T.teacher_two_step(teacher, z, gt, gm, gs, False)
            e = T.student_ehat(student, z, torch.full((z.shape[0],), gt, dtype=torch.float64))
            a, c = T.ddim_coeffs(gt, gs)
            total += float(((a * z + c * e - ref) ** 2).mean())
    return total / K


@pytest.mark.slow
def test_student_approaches_the_oracles_two_step_map():
    o = _oracle()
    teacher, E = _oracle_ehat(o), o.E
    student = _student_for(o)
    g_teacher = torch.linspace(5.0, -4.0, 9, dtype=torch.float64)  # K = 4 student steps, 8 teacher steps
    ev_tokens = o.sample_tokens((64, 8), torch.Generator().manual_seed(11))
    dist = partial(_two_step_distance, student, teacher, E, ev_tokens, g_teacher)
    before = dist(torch.Generator().manual_seed(5))
    opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(300):
        tokens = o.sample_tokens((32, 8), gen)
        loss, _ = T.progressive_batch(student, teacher, False, E, tokens, g_teacher, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = dist(torch.Generator().manual_seed(5))
    assert after < 0.1 * before, (before, after)  # measured: 0.0039 -> 0.00014


class _MapStudent(torch.nn.Module):
    """A float64 'network' whose e_hat makes (C1) the given map to gamma_min (optionally perturbed)."""

    def __init__(self, flow, g_min: float, noise: float = 0.0):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.flow, self.g_min, self.noise = flow, g_min, noise

    def forward(self, z, gammas, e_sc=None):
        out = torch.empty_like(z)
        for gam in gammas.unique().tolist():
            rows = gammas == gam
            zr = z[rows]
            if gam == self.g_min:
                out[rows] = zr  # never used: (C1) is the identity there
                continue
            e = T.ddim_inverse(zr, self.flow(zr, gam, self.g_min), gam, self.g_min)
            out[rows] = e + self.noise * torch.sin(7.0 * zr)
        return DenoiserOutput(out, out + self.dummy)


def test_consistency_loss_is_zero_at_the_exact_ode_map_and_positive_off_it():
    o = _oracle()
    teach = _oracle_ehat(o)
    g = torch.linspace(4.0, -3.0, 9, dtype=torch.float64)  # N = 8 levels
    fine = 3  # Heun sub-steps per level: the ODE flow between grid levels, composed exactly

    def flow(z, g_from, g_to):
        levels = [x for x in g.tolist() if g_to <= x <= g_from]
        for a, b in zip(levels[:-1], levels[1:], strict=False):
            for u, v in zip(
                torch.linspace(a, b, fine + 1)[:-1].tolist(), torch.linspace(a, b, fine + 1)[1:].tolist(), strict=False
            ):
                z = T.teacher_ode_step(teach, z, u, v, "heun", False)
        return z

    g_min = float(g[-1])
    tokens = o.sample_tokens((16, 4), torch.Generator().manual_seed(2))
    exact = _MapStudent(flow, g_min)
    loss = T.consistency_batch(
        exact,
        flow,
        lambda z, gam, _: exact(z, torch.full((z.shape[0],), gam, dtype=torch.float64)).e_hat,
        o.E,
        tokens,
        g,
        torch.Generator().manual_seed(0),
    )
    assert float(loss.detach()) < 1e-20, float(loss.detach())
    off = _MapStudent(flow, g_min, noise=0.05)
    loss_off = T.consistency_batch(
        off,
        flow,
        lambda z, gam, _: off(z, torch.full((z.shape[0],), gam, dtype=torch.float64)).e_hat,
        o.E,
        tokens,
        g,
        torch.Generator().manual_seed(0),
    )
    assert float(loss_off.detach()) > 1e-6, float(loss_off.detach())
    z = torch.randn(2, 3, o.E.shape[1], dtype=torch.float64)
    assert torch.equal(T.consistency_map(z, torch.randn_like(z), g_min, g_min), z)  # boundary condition


def test_consistency_sampler_predicts_renoises_and_reads_its_last_prediction():
    from replaid.methods import Kind
    from replaid.sampling.continuous import sample_consistency
    from replaid.sampling.registry import nfe_for

    o = _oracle()
    gammas = torch.linspace(5.0, -4.0, 5, dtype=torch.float64)  # T = 4
    seen: list[float] = []
    inputs: list[torch.Tensor] = []

    class Counting:
        self_conditioning = False

        def embedding_matrix(self):
            return o.embedding_matrix()

        def __call__(self, z, gamma, e_sc=None):
            seen.append(float(gamma[0]))
            inputs.append(z.double())
            return o(z, gamma)

    z = torch.randn(3, 6, o.E.shape[1], generator=torch.Generator().manual_seed(0))
    infos: list[dict] = []
    res = sample_consistency(Counting(), z, gammas, generator=torch.Generator().manual_seed(1), callback=infos.append)
    assert res.nfe == len(seen) == nfe_for(Kind.CONTINUOUS, "consistency", 4) == 4
    assert seen == gammas[:-1].tolist()  # no extra readout call at gammas[T]
    assert torch.equal(res.tokens, infos[-1]["logits"].argmax(-1))  # the tokens are the last prediction
    # between calls the latent is a fresh forward sample of the prediction at the next level: the noise is
    # standard normal and independent of the latent the prediction was made from
    for i in range(3):
        a, s = _as64(float(gammas[i + 1]))
        eps = ((infos[i]["z"] - a * infos[i]["e_hat"]) / s).flatten()
        before = inputs[i].flatten()
        corr = float(torch.corrcoef(torch.stack([eps, before]))[0, 1])
        assert abs(float(eps.mean())) < 0.2 and 0.8 < float(eps.std()) < 1.2 and abs(corr) < 0.3, (i, corr)
    again = sample_consistency(Counting(), z, gammas, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again.tokens, res.tokens)


def test_distill_config_refuses_bad_settings():
    from replaid.config import ConfigError

    for kw, msg in (
        (dict(from_steps=6), "powers of two"),
        (dict(to_steps=64), "below --from-steps"),
        (dict(method="x"), "--method"),
        (dict(cd_ema=1.0), "--cd-ema"),
    ):
        with pytest.raises(ConfigError, match=msg):
            DistillConfig(**kw).validate()


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("teacher") / "t"
    cfg = resolve("debug", None, ["train.steps=3", "eval.max_batches=1", "eval.t_samples=2", "train.num_threads=1"])
    _train(cfg, run, evaluate=evaluate, progress=False)
    return run


def _weights(run):
    return ck.load_tensors(ck.find_checkpoint(run), "model")


@pytest.mark.slow
def test_progressive_resume_reproduces_the_uninterrupted_distillation(teacher_run, tmp_path):
    d = dict(from_steps=4, to_steps=1, steps_per_round=2, batch_size=4, save_every=1, num_threads=1)
    distill(teacher_run, tmp_path / "full", DistillConfig(**d), progress=False)
    distill(teacher_run, tmp_path / "part", DistillConfig(**d), progress=False, stop_after=3)
    assert (tmp_path / "part" / "distill" / "teacher_round_1.safetensors").is_file()
    out = distill(teacher_run, tmp_path / "part", DistillConfig(**d), progress=False, resume=True)
    assert out["step"] == 4 and out["student_steps"] == 1
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(Exception, match="other settings"):
        distill(teacher_run, tmp_path / "part", DistillConfig(**{**d, "seed": 1}), progress=False, resume=True)


@pytest.mark.slow
def test_every_rounds_student_is_kept_and_loads_at_its_steps(teacher_run, tmp_path):
    """Progressive 8 -> 1 in 3 rounds of 2 steps, saved every 5: the ends of the rounds (steps 2, 4, 6) stay
    beside the newest checkpoints, each stating its round's steps (8 / 2^r), and each loads as a run."""
    from replaid.store.loading import load_run

    d = dict(from_steps=8, to_steps=1, steps_per_round=2, batch_size=4, save_every=5, num_threads=1)
    distill(teacher_run, tmp_path / "s", DistillConfig(**d), progress=False)
    ckdir = tmp_path / "s" / "checkpoints"
    assert sorted(p.name for p in ckdir.glob("step_*")) == [f"step_{n:07d}" for n in (2, 4, 5, 6)]
    for r, n in enumerate((2, 4, 6), start=1):
        st = json.loads((ckdir / f"step_{n:07d}" / "state.json").read_text())
        assert st["distill"]["student_steps"] == 8 // 2**r
        assert load_run(ckdir / f"step_{n:07d}", device="cpu").cfg.method == "replaid"


@pytest.mark.slow
def test_heun_teacher_solver_applies_to_the_first_round_only(teacher_run, tmp_path, monkeypatch):
    """``--teacher-solver heun`` distils the original teacher's Heun steps in round 1; round 2's teacher is
    the round-1 student, trained to take DDIM steps, so it is stepped by DDIM. A folder made before the
    option existed (no ``teacher_solver`` in distill.json) resumes as ddim."""
    seen = []
    real = T.progressive_batch
    monkeypatch.setattr(T, "progressive_batch", lambda *a, **k: seen.append(a[7]) or real(*a, **k))
    d = dict(from_steps=4, to_steps=1, steps_per_round=1, batch_size=2, save_every=1, num_threads=1)
    distill(teacher_run, tmp_path / "h", DistillConfig(**d, teacher_solver="heun"), progress=False)
    assert seen == ["heun", "ddim"]
    distill(teacher_run, tmp_path / "old", DistillConfig(**d), progress=False, stop_after=1)
    f = tmp_path / "old" / "distill.json"
    stored = json.loads(f.read_text())
    del stored["config"]["teacher_solver"]
    f.write_text(json.dumps(stored))
    assert distill(teacher_run, tmp_path / "old", DistillConfig(**d), progress=False, resume=True)["step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["progressive", "consistency"])
def test_distill_sample_eval_export_round_trip(teacher_run, tmp_path, capsys, method):
    student = tmp_path / "student"
    args = ["distill", str(teacher_run), "--out", str(student), "--method", method, "--batch-size", "4"]
    args += ["--from-steps", "4", "--to-steps", "2", "--steps-per-round", "2", "--cd-steps", "2", "--cd-levels", "4"]
    assert main(args + ["--no-progress"]) == 0
    cfg = json.loads((student / "config.json").read_text())
    assert cfg["model"]["self_conditioning"] is False and cfg["method"] == "replaid"
    capsys.readouterr()
    sampler = "consistency" if method == "consistency" else "ddim"
    assert main(["sample", str(student), "--sampler", sampler, "--steps", "2", "--num", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and rows[0]["nfe"] == (2 if method == "consistency" else 3)
    assert main(["eval", str(student), "--max-batches", "1", "--t-samples", "2", "--json"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["nelbo_nats_per_token"])
    assert main(["export", str(student), "--out", str(tmp_path / "exp")]) == 0
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "exp"), "--sampler", sampler, "--steps", "2", "--num", "1"]) == 0


def test_distill_cli_bad_input_is_one_line(teacher_run, tmp_path, capsys):
    assert main(["distill", str(tmp_path / "none"), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replaid: error:")
    assert main(["distill", str(teacher_run), "--out", str(tmp_path / "s"), "--from-steps", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["replaid: error: distill: --from-steps and --to-steps must be powers of two"]
    assert not (tmp_path / "s").exists()  # refused before anything was written
