"""Steering the continuous latent (issue 26): SDEdit editing, token guidance and classifier guidance.

Closed forms on the i.i.d.-token oracle (:mod:`replaid.diffusion.oracle`), whose posterior is exact:

* a per-token "classifier" ``p(y | x) = r_x`` has the exact noisy posterior ``p(y | z_t) = sum_v q(v | z_t) r_v``;
  guidance with it at ``w = 1`` samples ``p(x | y) ∝ p_x r_x`` (Bayes' rule);
* token guidance towards token v at position j (``w = 1``) samples ``x_j = v`` always, the other
  positions as before; "anywhere" (``log sum_j q(x_j = v | z_t)``) tilts the sequence law by its count of
  v, so ``E'[count] = E[count^2] / E[count] = (1 - p_v) + L p_v`` and ``P'(count = 0) = 0``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from replaid.diffusion.denoiser import DenoiserOutput, alpha_sigma
from replaid.diffusion.oracle import OracleDenoiser, random_unit_embeddings
from replaid.methods import Kind, get_method
from replaid.presets import resolve
from replaid.sampling.continuous import Inpaint, gamma_grid
from replaid.sampling.generate import generate
from replaid.sampling.guidance import ClassifierObjective, Guided, RequireTokens, guidance_gradient, parse_require
from replaid.sampling.registry import samplers_of
from replaid.sampling.request import SampleRequest

V, D_E = 5, 3
P = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08], dtype=torch.float64)
R = torch.tensor([0.9, 0.2, 0.2, 0.9, 0.5], dtype=torch.float64)  # p(y = 0 | x = v)
SAMPLERS = {name: s.fn for name, s in samplers_of(Kind.CONTINUOUS).items()}
ALL = list(SAMPLERS)


def grid(T: int) -> torch.Tensor:
    return gamma_grid(lambda t: -8.0 + 16.0 * t, T)


@pytest.fixture(scope="module")
def oracle() -> OracleDenoiser:
    return OracleDenoiser(P, random_unit_embeddings(V, D_E, seed=0))


class Oracle64(OracleDenoiser):
    """The oracle returning float64 logits and e_hat (for float64 gradient checks)."""

    def __call__(self, z, gamma, e_sc=None):
        logits = self.logits64(z, gamma)
        return DenoiserOutput(logits, torch.softmax(logits, -1) @ self.E)


def noisy_label_classifier(oracle: OracleDenoiser):
    """The exact ``p(y | z_t)`` (B, 2) logits of sequences of one token with ``p(y = 0 | x) = R[x]``."""

    def clf(z, gamma):
        q = torch.softmax(oracle.logits64(z, gamma), -1)[:, 0]  # (B, V) (L = 1)
        p0 = q @ R.to(q)
        return torch.stack([p0.log(), (1 - p0).log()], dim=-1)

    return clf


def sample(name, den, B, L, T, seed):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(B, L, D_E, generator=gen)
    return SAMPLERS[name](den, z, grid(T), generator=gen)


# ------------------------------------------------------------------ the guided score


def test_guided_prediction_is_score_plus_w_grad_log_p_checked_by_finite_differences():
    o = Oracle64(P, random_unit_embeddings(V, D_E, seed=0))
    obj = ClassifierObjective(noisy_label_classifier(o), 0)
    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 1, D_E, generator=g, dtype=torch.float64)
    gamma = torch.tensor([-3.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    w = 2.5
    out = o(z, gamma)
    guided = Guided(o, obj, w)(z, gamma)
    assert guided.e_hat.dtype == torch.float64 and torch.equal(guided.logits, out.logits)
    # grad log p(y | z) by central differences in float64
    h = 1e-6
    fd = torch.zeros_like(z)
    for b in range(4):
        for k in range(D_E):
            dz = torch.zeros_like(z)
            dz[b, 0, k] = h
            fd[b, 0, k] = (obj(z + dz, gamma, o(z + dz, gamma).logits)[b] - obj(z - dz, gamma, None)[b]) / (2 * h)
    _, grad, _ = guidance_gradient(o, obj, z, gamma)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-8)
    a, s = alpha_sigma(gamma)
    a, s2 = a.view(-1, 1, 1), (s**2).view(-1, 1, 1)
    score = (a * out.e_hat - z) / s2  # (G1)
    score_w = (a * guided.e_hat - z) / s2
    torch.testing.assert_close(score_w, score + w * fd, rtol=1e-6, atol=1e-6)  # (G2)


@pytest.mark.parametrize("name", ALL)
def test_guidance_at_scale_zero_is_bit_identical(name, oracle):
    unguided = sample(name, oracle, 8, 16, 6, seed=1)
    guided = sample(name, Guided(oracle, RequireTokens([4]), 0.0), 8, 16, 6, seed=1)
    assert torch.equal(unguided.tokens, guided.tokens) and torch.equal(unguided.z0, guided.z0)
    moved = sample(name, Guided(oracle, RequireTokens([4]), 1.0), 8, 16, 6, seed=1)
    assert not torch.equal(unguided.z0, moved.z0)


# ------------------------------------------------------------------ Bayes' rule at w = 1


@pytest.mark.parametrize("name", ["ddpm", "ddim"])
def test_classifier_guidance_at_w1_samples_the_bayes_posterior(name, oracle):
    obj = ClassifierObjective(noisy_label_classifier(oracle), 0)
    res = sample(name, Guided(oracle, obj, 1.0), 20000, 1, 128, seed=0)
    freq = torch.bincount(res.tokens.flatten(), minlength=V).double() / res.tokens.numel()
    post = P * R / (P * R).sum()  # Bayes: p(x | y = 0)
    assert 0.5 * float((freq - post).abs().sum()) < 0.03
    in_class = [0, 3]  # the tokens the label favours: p(x in C | y) vs p(x in C)
    assert float(freq[in_class].sum()) == pytest.approx(float(post[in_class].sum()), abs=0.02)
    assert float(post[in_class].sum()) - float(P[in_class].sum()) > 0.2  # a real shift to detect


def test_token_guidance_at_w1_fixes_the_token_at_its_position(oracle):
    res = sample("ddpm", Guided(oracle, RequireTokens([4], start=2, end=3), 1.0), 4000, 4, 128, seed=0)
    assert float((res.tokens[:, 2] == 4).double().mean()) > 0.97  # exact conditional: x_2 = 4
    other = torch.bincount(res.tokens[:, [0, 1, 3]].flatten(), minlength=V).double() / (3 * 4000)
    assert 0.5 * float((other - P).abs().sum()) < 0.03  # the other positions untouched


def test_token_guidance_anywhere_tilts_by_the_count(oracle):
    L, v = 10, 4
    base = sample("ddpm", oracle, 3000, L, 128, seed=0)
    res = sample("ddpm", Guided(oracle, RequireTokens([v]), 1.0), 3000, L, 128, seed=0)
    p = float(P[v])
    count = (res.tokens == v).sum(-1).double()
    assert float(count.mean()) == pytest.approx((1 - p) + L * p, abs=0.1)  # E[c^2] / E[c] = 1.72
    assert float((count == 0).double().mean()) < 0.03  # P'(count = 0) = 0
    rate0 = float(RequireTokens([v]).satisfied(base.tokens).double().mean())
    assert rate0 == pytest.approx(1 - (1 - p) ** L, abs=0.04)  # the unguided base rate 0.57


def test_parse_require():
    assert parse_require(" king") == (" king", None, None)
    assert parse_require("king@5") == ("king", 5, 6)
    assert parse_require("a@b@2:7") == ("a@b", 2, 7)
    with pytest.raises(ValueError, match="WORD@POS"):
        parse_require("king@x")


# ------------------------------------------------------------------ editing through generate


class CharTok:
    """One character per token (V = 40)."""

    def encode(self, text):
        return [ord(c) % 40 for c in text]

    def decode(self, ids):
        return "".join(chr(48 + i) for i in ids)


TEXT = "the cat sat on the mat; a dog"  # 29 characters = 29 tokens


def fake_run():
    cfg = resolve("debug", None, ["method=replaid", "data.seq_len=32"])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(40)
    with torch.no_grad():
        lin = model.final.linear
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    return SimpleNamespace(cfg=cfg, method=m, model=model.eval(), tokenizer=CharTok())


@pytest.fixture(scope="module")
def run():
    return fake_run()


def edit(run, callback=None, **kw):
    base = dict(steps=8, num=3, batch_size=2, seed=0, progress=False, edit=TEXT)
    return generate(run, SampleRequest(**{**base, **kw}), callback)


@pytest.mark.parametrize("sampler", ALL)
def test_edit_every_sampler(sampler, run):
    rows = edit(run, sampler=sampler, strength=0.0)
    assert all(r["text"] == TEXT and r["nfe"] == 0 for r in rows)  # s = 0: the text, exactly
    enc = CharTok().encode(TEXT)
    for s in (0.6, 1.0):
        toks = edit(run, sampler=sampler, strength=s, edit_span="4:7,19:22")
        for r in toks:
            kept = [i for i in range(len(enc)) if not (4 <= i < 7 or 19 <= i < 22)]
            assert [r["ids"][i] for i in kept] == [enc[i] for i in kept]
        assert any(r["ids"][4:7] != enc[4:7] for r in toks)  # the span was edited
        chars = edit(run, sampler=sampler, strength=s, edit_chars="4:7")
        assert all(r["text"][:4] == TEXT[:4] and r["text"][7:] == TEXT[7:] for r in chars)
        assert all(r["ids"][:4] == enc[:4] and r["ids"][7:] == enc[7:] for r in chars)
    full = edit(run, sampler=sampler, strength=0.3)
    assert all(len(r["ids"]) == len(enc) and r["steps"] == 3 for r in full)  # ceil(0.3 * 8) steps


def test_inpaint_replace_is_the_forward_sample_at_known_positions():
    """``Inpaint.replace``: known positions ``alpha e + sigma eps`` (eps the generator's next draw), the rest kept."""
    E = random_unit_embeddings(V, D_E, seed=0).double()  # (V, d_e)
    toks = torch.tensor([[3, 0, 4, 1], [2, 2, 0, 4]])  # (B, L)
    known = torch.tensor([True, False, True, True])  # (L,)
    z = torch.randn(2, 4, D_E, dtype=torch.float64)
    out = Inpaint(toks, known, E).replace(z, -1.5, torch.Generator().manual_seed(7))
    eps = torch.randn(z.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    a, s = alpha_sigma(torch.tensor(-1.5, dtype=torch.float64))
    want = torch.where(known[None, :, None], a * E[toks] + s * eps, z)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sampler", ALL)
def test_edit_replaces_the_kept_latents_by_the_noised_source(sampler, run):
    """Before any token forcing: after every step to level gamma_s the kept positions' latent is
    ``alpha_s e(source) + sigma_s eps`` with eps ~ N(0, I) (SDEdit with a span: replacement, as Inpaint),
    checked from the latents the sampler reports to the callback."""
    enc = torch.tensor(CharTok().encode(TEXT))  # (L,)
    kept = torch.ones(len(enc), dtype=torch.bool)
    kept[4:7] = kept[19:22] = False
    E = run.model.embedding_matrix().detach().double()  # (V, d_e)
    steps: list[dict] = []
    edit(run, sampler=sampler, strength=0.6, edit_span="4:7,19:22", callback=steps.append)
    checked = 0
    for info in steps:
        if info.get("final") or (sampler == "consistency" and info["i"] == info["T"] - 1):
            continue  # consistency's last report holds the latent of the level before (no update)
        a, s = alpha_sigma(torch.tensor(info["gamma_next"], dtype=torch.float64))
        eps = (info["z"].double() - a * E[enc])[:, kept] / s  # (B, 23, d_e): the noise if z = alpha e + sigma eps
        m, v, top = float(eps.mean()), float(eps.var()), float(eps.abs().max())
        assert abs(m) < 0.2 and 0.75 < v < 1.3 and top < 5.5, (
            f"step {info['i']} (gamma {info['gamma_next']:.2f}): the kept latents are not alpha e + sigma eps, "
            f"eps mean {m:.3g}, var {v:.3g}, max |eps| {top:.3g} over {eps.numel()} draws"
        )
        checked += 1
    assert checked >= 2 * 4  # 2 batches (3 samples, 2 at a time) x 4 or 5 steps (ceil(0.6 x 8) = 5)


def test_edit_at_strength_one_is_an_unconditional_sample(run):
    a = edit(run, strength=1.0)
    b = generate(run, SampleRequest(steps=8, num=3, batch_size=2, seed=0, progress=False, length=len(TEXT)))
    assert [r["ids"] for r in a] == [r["ids"] for r in b]


def test_token_guidance_through_generate(run):
    """``--require c@3``: bit-identical at w = 0; at w = 50 the word is at position 3 in (nearly) every one of
    32 samples (w = 1 puts it in 23 of them, w = 0 in none): a sign or a scale lost on the way fails."""
    base = dict(steps=6, num=32, batch_size=32, seed=0, progress=False, length=16)
    c = ord("c") % 40
    plain = generate(run, SampleRequest(**base))
    zero = generate(run, SampleRequest(**base, require=("c",), guidance_scale=0.0))
    assert [r["ids"] for r in plain] == [r["ids"] for r in zero]  # bit-identical at w = 0
    assert all(r["required"] == [RequireTokens([c]).satisfied(torch.tensor([r["ids"]]))[0]] for r in zero)
    strong = generate(run, SampleRequest(**base, require=("c@3",), guidance_scale=50.0))
    rate0, rate50 = (sum(r["ids"][3] == c for r in rows) / 32 for rows in (plain, strong))
    assert rate0 <= 0.1 and rate50 >= 0.95, (rate0, rate50)
    assert all(r["required"] == [r["ids"][3] == c] and r["guidance_scale"] == 50.0 for r in strong)


def test_guided_prediction_through_generate_is_g3(run):
    """Every guided DDIM step of ``generate`` returns (G3), ``e_hat + w (sigma^2 / alpha) grad_z log
    x_theta(z)[3, c]``, recomputed here from the network (its gradient checked by central differences
    along a random direction); no self-conditioning, so each step's input is the latent the step before
    reported."""
    w, c = 3.0, ord("c") % 40
    req = SampleRequest(
        steps=4, num=3, batch_size=3, seed=0, progress=False, length=16, sampler="ddim",
        require=("c@3",), guidance_scale=w, self_cond=False,
    )  # fmt: skip
    steps: list[dict] = []
    generate(run, req, steps.append)
    model, gen = run.model, torch.Generator().manual_seed(0)

    def logp(z, gamma):  # (B,) log x_theta(z)[3, c] of the network (float32)
        return torch.log_softmax(model(z.float(), gamma, None).logits.double(), -1)[:, 3, c]

    for prev, info in zip(steps, steps[1:-1], strict=False):  # step i evaluates the latent step i - 1 reported
        gamma = torch.full((3,), info["gamma"], dtype=torch.float64)  # (B,)
        z0 = prev["z"].float()  # (B, L, d_e)
        with torch.enable_grad():
            z = z0.clone().requires_grad_(True)
            out = model(z, gamma, None)
            (grad,) = torch.autograd.grad(torch.log_softmax(out.logits, -1)[:, 3, c].sum(), z)
        v = torch.randn(z0.shape, generator=gen)  # (B, L, d_e)
        h = 1e-2
        fd = (logp(z0 + h * v, gamma) - logp(z0 - h * v, gamma)) / (2 * h)  # (B,) directional derivatives
        torch.testing.assert_close((grad.double() * v).sum((1, 2)), fd, rtol=2e-2, atol=1e-3)
        a2, s2 = torch.sigmoid(-gamma[0]), torch.sigmoid(gamma[0])  # alpha^2, sigma^2
        e_hat = out.e_hat.detach().double()  # (B, L, d_e) unguided
        want = e_hat + w * s2 / a2.sqrt() * grad.double()  # (B, L, d_e), eq. (G3)
        assert float((want - e_hat).abs().max()) > 0.05  # the guidance term is not negligible here
        torch.testing.assert_close(info["e_hat"].double(), want, rtol=1e-4, atol=1e-5)
    assert len(steps) == 5  # 4 steps and the readout


def test_bad_requests_are_refused_in_one_line(run):
    for kw, msg in (
        (dict(strength=1.5), "--strength"),
        (dict(edit_chars="9:3"), "bad --span"),
        (dict(edit_span="0:99"), "bad infill span"),
        (dict(prompt="ab"), "drop --prompt"),
        (dict(guidance_scale=-1.0), "--guidance-scale"),
        (dict(require=("a@999",)), "beyond the sample length"),
    ):
        with pytest.raises(ValueError, match=msg):
            edit(run, **kw)


# ------------------------------------------------------------------ the CLI, end to end at debug size


@pytest.mark.slow
def test_classifier_train_guided_sampling_and_edit_end_to_end(tmp_path, capsys):
    from replaid.cli import main

    a, b = tmp_path / "a", tmp_path / "b"
    for out, seed in ((a, 0), (b, 1)):
        assert (
            main(
                [
                    "train",
                    "--preset",
                    "debug",
                    "--out",
                    str(out),
                    "--no-progress",
                    "train.steps=2",
                    f"train.seed={seed}",
                ]
            )
            == 0
        )
    data = tmp_path / "labelled.jsonl"
    lines = [
        {"text": ("To be or not to be? " if i % 2 else "The king is dead. ") * 20, "label": "q" if i % 2 else "s"}
        for i in range(20)
    ]
    data.write_text("".join(json.dumps(d) + "\n" for d in lines))
    clf = tmp_path / "clf"
    assert main(["classifier", "train", str(a), "--data", str(data), "--out", str(clf), "--steps", "3"]) == 0
    assert (clf / "classifier.safetensors").is_file() and json.loads((clf / "classifier.json").read_text())[
        "labels"
    ] == ["q", "s"]
    capsys.readouterr()
    assert (
        main(["sample", str(a), "--guide", f"{clf}:q", "--guidance-scale", "2", "--num", "2", "--steps", "3", "--json"])
        == 0
    )
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and rows[0]["guidance_scale"] == 2.0
    assert main(["edit", str(a), "--text", "To be or not to be", "--strength", "0", "--num", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "To be or not to be"
    assert (
        main(
            [
                "edit",
                str(a),
                "--text",
                "To be or not to be",
                "--strength",
                "0.5",
                "--span",
                "3:5",
                "--json",
                "--steps",
                "4",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["text"][:3] == "To " and out["text"].endswith(" or not to be")
    for argv, msg in (
        (["sample", str(b), "--guide", f"{clf}:q"], "another run's embeddings"),
        (["sample", str(a), "--guide", f"{clf}:maybe"], "not one of this classifier's labels"),
        (["sample", str(a), "--guide", f"{tmp_path}:q"], "no classifier.json"),
        (["edit", str(a), "--text", "hello there", "--strength", "2"], "--strength"),
        (
            ["classifier", "train", str(a), "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "clf2")],
            "no such file",
        ),
    ):
        try:
            code = main(argv)
        except SystemExit as e:  # refused by the option's argparse type (--strength: a number in [0, 1])
            code = e.code
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("replaid: error:") and msg in err and len(err.strip().splitlines()) == 1


def test_classifier_windows_are_uniform_over_the_corpus_not_over_documents():
    """A label's share of the training windows is its share of the text's windows: one long document of
    label 0 (991 windows) against ten one-window documents of label 1 gives label 0 ~ 991/1001 of the
    draws (choosing the document first would give it 1/11)."""
    from replaid.training.classifier import _batch

    L = 10
    docs = [(list(range(1000)), 0)] + [(list(range(L)), 1) for _ in range(10)]
    x, y = _batch(docs, L, 4000, torch.Generator().manual_seed(0))
    assert x.shape == (4000, L)
    share = float((y == 0).float().mean())
    assert abs(share - 991 / 1001) < 0.01, share
    starts = x[y == 0, 0].float()  # window offsets in the long document: uniform on 0..990
    assert abs(float(starts.mean()) - 495) < 20
