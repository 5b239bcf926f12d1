"""Progressive distillation of a block model's per-block PF-ODE (issue 39 §2): the target of a block
against two teacher steps written out by hand with the sampler's own block denoiser on the clean
prefix, the context's part in it, and a distilled block student sampled block by block, cached and
uncached, after ``replaid distill`` end to end.

RePlaid's network runs in float32 by design (its input projections and fused head), so the target is
compared with float32 tolerances. Why 1e-5 is a fair bound: ``e_hat`` lies in the convex hull of unit
embedding rows (|e_hat| <= 1); the two routes (the vectorised [z_t, x_0] pass under the block mask, the
sampler's pass over the clean prefix and the block alone) differ only in float32 summation order,
~1e-6 on ``e_hat`` (tests/test_blocks_continuous allows 1e-4 on logits); and the target
``e_tilde = (z''_s - (sigma_s / sigma_t) z_t) / c(t, s)`` is, exactly, the combination
``w1 e_1 + w2 e_2`` with ``w1, w2 > 0`` and ``w1 + w2 = 1`` (the ``z_t`` terms cancel, and two DDIM steps
with a constant ``e_hat`` are one), with the DDIM arithmetic in float64: it inherits the predictions'
rounding, not more. A wrong coefficient, level or context moves it by 1e-2 or more."""

from __future__ import annotations

import json
import math

import pytest
import torch

from blockref import any_length
from replaid.distill import blocks as DB
from replaid.sampling.blocks import BlockDenoiser
from replaid.sampling.continuous import gamma_grid
from replaid.sampling.loop import sample_any_length
from test_blocks_continuous import continuous

torch.set_num_threads(1)

TOL = 1e-5


def _as64(gamma: float) -> tuple[float, float]:
    """alpha, sigma straight from the definitions."""
    g = torch.tensor(gamma, dtype=torch.float64)
    return float(torch.sigmoid(-g).sqrt()), float(torch.sigmoid(g).sqrt())


def _block_model(block: int = 2, L: int = 8):
    method, model = continuous("replaid", block, L=L)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return method, model


def _by_hand(model, tokens, z, g_teacher, g_t, block, sc, solver):
    """Each (row, block) alone: the level triple read off the grid, the teacher's two steps with the
    sampler's block denoiser on the clean prefix (float32 network, float64 steps written from alpha and
    sigma), the e whose one DDIM step from t lands there. Returns e_tilde (B, L, d_e) float64."""
    B, L, _ = z.shape
    grid = g_teacher.tolist()
    out = torch.empty_like(z)
    for i in range(B):
        for s0 in range(0, L, block):
            gt = float(g_t[i, s0])
            assert (g_t[i, s0 : s0 + block] == gt).all()  # one level per block
            j = grid.index(gt)
            assert j % 2 == 0  # a student step starts on every other teacher level
            gm, gs = grid[j + 1], grid[j + 2]
            den = BlockDenoiser(model, s0, None, tokens[i : i + 1, :s0])

            def teach(x, g, e_sc=None):
                gam = torch.tensor([g], dtype=torch.float64)
                return den(x.float(), gam, None if e_sc is None else e_sc.float()).e_hat.double()

            zt = z[i : i + 1, s0 : s0 + block]
            (at, st), (am, sm), (as_, ss) = _as64(gt), _as64(gm), _as64(gs)
            if solver == "ddim":
                e1 = teach(zt, gt)
                zm = am * e1 + sm * (zt - at * e1) / st
                e2 = teach(zm, gm, e1 if sc else None)
                zs = as_ * e2 + ss * (zm - am * e2) / sm
            else:  # Heun in z_bar = z / alpha, sigma_tilde = sigma / alpha: Euler predictor, trapezoid

                def heun(x, g0, g1, e_sc):
                    (a0, s_0), (a1, s_1) = _as64(g0), _as64(g1)
                    xb, t0, t1 = x / a0, s_0 / a0, s_1 / a1
                    e = teach(x, g0, e_sc)
                    slope0 = (xb - e) / t0
                    xb_pred = xb + (t1 - t0) * slope0
                    e_pred = teach(a1 * xb_pred, g1, e if sc else None)
                    return a1 * (xb + (t1 - t0) * (slope0 + (xb_pred - e_pred) / t1) / 2), e_pred

                zm, e1 = heun(zt, gt, gm, None)
                zs, _ = heun(zm, gm, gs, e1 if sc else None)
            out[i, s0 : s0 + block] = (zs - (ss / st) * zt) / (as_ - ss * at / st)
    return out


@pytest.mark.parametrize("sc,solver", [(False, "ddim"), (True, "ddim"), (True, "heun")])
def test_block_target_is_two_teacher_steps_of_that_block_on_its_clean_prefix(sc, solver):
    method, model = _block_model()
    assert model.self_conditioning  # the debug preset's; the teacher's protocol within the step is tested
    tokens = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    E = model.embedding_matrix()
    g_teacher = gamma_grid(model.schedule, 8).detach()  # K = 4 student steps
    g_t, z, target, _ = DB.block_progressive_target(
        model, sc, E, tokens, 2, g_teacher, torch.Generator().manual_seed(4), solver
    )
    assert len(set(g_t[:, ::2].flatten().tolist())) > 2  # the blocks of a row at different steps
    ref = _by_hand(model, tokens, z, g_teacher, g_t, 2, sc, solver)
    err = float((target - ref).abs().max())
    assert err < TOL, err
    assert float(ref.abs().max()) > 0.05  # not a vacuous comparison


def test_the_context_is_the_clean_prefix_and_only_it():
    """Change the first block's tokens: every later block's target and the student's prediction move
    (the noise and its own tokens being the same); change the last block's: no earlier block's does.
    And a student evaluated on a block without its prefix predicts something else."""
    _, model = _block_model()
    E = model.embedding_matrix()
    g_teacher = gamma_grid(model.schedule, 8).detach()
    a = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    first, last = a.clone(), a.clone()
    first[:, :2] = (a[:, :2] + 1) % 11
    last[:, 6:] = (a[:, 6:] + 1) % 11

    def draw(tokens):
        return DB.block_progressive_target(model, True, E, tokens, 2, g_teacher, torch.Generator().manual_seed(4))

    g_a, z_a, t_a, ctx_a = draw(a)
    g_f, z_f, t_f, ctx_f = draw(first)
    _, z_l, t_l, _ = draw(last)
    assert torch.equal(g_a, g_f) and torch.equal(z_a[:, 2:], z_f[:, 2:])  # same draws past block 0
    for s0 in (2, 4, 6):
        moved = float((t_a[:, s0 : s0 + 2] - t_f[:, s0 : s0 + 2]).abs().amax(dim=(1, 2)).min())
        assert moved > 1e-3, (s0, moved)  # every row's block sees the changed prefix
    assert float((t_a[:, :6] - t_l[:, :6]).abs().max()) < TOL  # no block sees a later one
    # the student (here the same network) through the loss's own call
    with torch.no_grad():
        e_a = DB.block_ehat_fn(model, ctx_a)(z_a, g_a, None)
        e_f = DB.block_ehat_fn(model, ctx_f)(z_a, g_a, None)
        assert float((e_a[:, 2:] - e_f[:, 2:]).abs().amax(dim=(1, 2)).min()) > 1e-3
        for s0 in (2, 4, 6):
            gam = g_a[:, s0]
            with_prefix = BlockDenoiser(model, s0, None, a[:, :s0])(z_a[:, s0 : s0 + 2].float(), gam).e_hat
            alone = BlockDenoiser(model, 0)(z_a[:, s0 : s0 + 2].float(), gam).e_hat
            assert float((with_prefix.double() - e_a[:, s0 : s0 + 2]).abs().max()) < TOL
            assert float((alone - with_prefix).abs().max()) > 1e-3


def test_block_loss_weights_each_block_by_its_own_snr():
    _, model = _block_model()
    E = model.embedding_matrix()
    g_teacher = gamma_grid(model.schedule, 8).detach()
    tokens = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    student = continuous("replaid", 2, L=8)[1]
    loss, per_row = DB.block_progressive_batch(
        student, model, True, E, tokens, 2, g_teacher, torch.Generator().manual_seed(4)
    )
    g_t, z, target, ctx = DB.block_progressive_target(
        model, True, E, tokens, 2, g_teacher, torch.Generator().manual_seed(4)
    )
    with torch.no_grad():
        sq = ((student(z.float(), g_t, None, context=ctx).e_hat.double() - target) ** 2).mean(-1)  # (B, L)
    w = torch.clamp(torch.exp(-g_t[:, ::2]), min=1.0)  # (B, blocks)
    want = (w * sq.view(3, 4, 2).mean(-1)).mean()
    assert abs(float(loss.detach()) - float(want)) < 1e-9 * float(want) and torch.allclose(per_row, sq.mean(1))
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.backbone.parameters())


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def block_student(tmp_path_factory):
    from replaid.cli import main

    root = tmp_path_factory.mktemp("bd")
    run, student = root / "teacher", root / "student"
    sets = ["diffusion.block_size=8", "train.steps=3", "eval.max_batches=1", "train.num_threads=1"]
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", *sets]) == 0
    args = ["distill", str(run), "--out", str(student), "--from-steps", "8", "--to-steps", "2"]
    assert main(args + ["--steps-per-round", "2", "--batch-size", "4", "--no-progress"]) == 0
    return run, student


def test_replaid_distill_makes_a_block_student_that_samples_cached_as_uncached(block_student, capsys):
    from replaid.cli import main
    from replaid.store import checkpoint as ck
    from replaid.store.loading import load_run

    run, student = block_student
    cfg = json.loads((student / "config.json").read_text())
    assert cfg["diffusion"]["block_size"] == 8 and cfg["data"]["seq_len"] == 32
    assert cfg["model"]["self_conditioning"] is False
    state = json.loads((ck.find_checkpoint(student) / "state.json").read_text())
    assert state["distill"]["student_steps"] == 2 and state["step"] == 4
    t_w = load_run(str(run), use_ema=True, train_data=False, device="cpu").model.state_dict()  # what distil copies
    s_w = ck.load_tensors(ck.find_checkpoint(student), "model")
    assert any(not torch.equal(t_w[k], s_w[k]) for k in t_w if "backbone" in k)  # the student trained
    assert all(torch.equal(t_w[k], s_w[k]) for k in t_w if k.startswith(("embedding.", "schedule.")))  # frozen

    loaded = load_run(str(student), device="cpu")
    assert loaded.method.blocks and loaded.method.block == 8

    def draw(p, cached):
        """The one block loop (cached), or the reference loop recomputing the clean prefix (tests/blockref.py)."""
        g = torch.Generator().manual_seed(0)
        if cached:
            return sample_any_length(loaded.method, loaded.model, p, 45, sampler="ddim", steps=2, generator=g)
        return any_length(loaded.method, loaded.model, p, 45, sampler="ddim", steps=2, generator=g, use_cache=False)

    prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
    res = [draw(prompt, c) for c in (True, False)]  # the student's steps, each block's
    assert torch.equal(res[0].tokens, res[1].tokens) and res[0].tokens.shape == (2, 48)  # past the trained 32
    assert torch.equal(res[0].tokens[:, :3], prompt)
    assert res[1].nfe == 6 * 3 and res[0].nfe == 6 * 3 + 5  # T + 1 calls per block, a commit per block but the last
    # AdaLN-Zero gates start at zero and seven optimiser steps leave the context's pull below the argmax's
    # resolution (a cache of wrong ids passes the check above); with values in every layer the context
    # decides tokens, and cached == uncached must still hold token for token
    torch.manual_seed(0)
    for m in loaded.model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    other = torch.tensor([[1, 2, 3], [4, 3, 2]])

    a, b, c = draw(prompt, True), draw(prompt, False), draw(other, True)
    assert torch.equal(a.tokens, b.tokens)
    assert (a.tokens[:, 8:] != c.tokens[:, 8:]).any()  # the prompt (the context) decides tokens past block 0
    capsys.readouterr()
    assert main(["eval", str(student), "--json", "--max-batches", "1", "--t-samples", "2"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["nelbo_nats_per_token"])


def test_block_runs_refuse_consistency_distillation_in_one_line(block_student, tmp_path, capsys):
    from replaid.cli import main

    run, _ = block_student
    capsys.readouterr()
    assert main(["distill", str(run), "--out", str(tmp_path / "cd"), "--method", "consistency"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--method progressive only" in err[0], err
    assert not (tmp_path / "cd").exists()


def test_a_block_student_is_served_at_its_own_steps_and_sampler(block_student):
    """``replaid serve`` of the student: a ``/v1/completions`` request that names no ``steps`` runs at the
    student's 2 steps per block with DDIM (what ``replaid distill`` printed), as ``replaid sample --sampler
    ddim --steps 2`` writes it; ``steps`` in the request still rules. Checked with the official client."""
    openai = pytest.importorskip("openai", reason="the 'web' extra (openai) is not installed")
    from replaid.sampling.request import SampleRequest
    from replaid.sampling.stream import Completion
    from replaid.store.loading import load_run
    from replaid.web.app import create_app
    from replaid.web.engine import Limits
    from test_openai_api import serving

    run, student = block_student
    loaded = load_run(str(student), device="cpu")
    assert loaded.student == ("ddim", 2) and load_run(str(run), device="cpu").student is None
    torch.manual_seed(0)  # values in every layer: decisive draws (a few steps leave float32 ties otherwise)
    for m in loaded.model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    app = create_app([str(student)], Limits(raw=True), runs=[loaded])
    rid = next(iter(app.state.slots))

    def reference(**kw) -> str:
        req = SampleRequest(prompt="ab", max_tokens=40, seed=3, ignore_eos=True, progress=False, num=1, **kw)
        comp = Completion(loaded, req)
        list(comp)
        return comp.samples[0].text

    with serving(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)

        def served(**extra) -> str:
            body = {"ignore_eos": True, **extra}
            r = client.completions.create(model=rid, prompt="ab", max_tokens=40, seed=3, extra_body=body)
            return r.choices[0].text

        at_own, at_3 = served(), served(steps=3)
    assert at_own == reference(sampler="ddim", steps=2)
    assert at_3 == reference(sampler="ddim", steps=3) and at_3 != at_own
