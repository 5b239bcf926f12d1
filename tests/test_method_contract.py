"""The method contract (``replaid/methods/base.py``), run against every registered method (diffusers style).

For each method of ``replaid.methods.METHODS``: its declared capabilities, ``build_model``,
``train_loss`` (finite, with gradients; refused for evaluation-only methods), ``eval_bound`` (shape,
finiteness), every sampler it declares through ``replaid.sampling.generate`` (shape, determinism per
seed, callback frames, noise drawn on the model's device), the state round trip, and export/load.
Adding a method to the registry adds it to every test here. The build/loss/bound/sampler tests take the
``device`` fixture (``pytest --device cuda`` runs them on a GPU: ``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from replaid.config import ConfigError, RunConfig, flat_keys, migrate_config, refuse_unread_keys
from replaid.diffusion.nelbo import low_discrepancy
from replaid.eval.evaluate import evaluate
from replaid.methods import METHODS, Kind, get_method
from replaid.presets import resolve
from replaid.sampling import REGISTRY, SampleRequest
from replaid.sampling.continuous import time_grid
from replaid.sampling.generate import generate
from replaid.training.syncs import SyncCounter, meta_as_cpu_autocast
from replaid.training.train import train as _train

FIXTURES = Path(__file__).parent / "fixtures" / "configs"

train = partial(_train, evaluate=evaluate)
V, L, B = 40, 12, 4
NAMES = sorted(METHODS)
PAIRS = [(n, s) for n in NAMES for s in METHODS[n].samplers]
FX = Path(__file__).parent / "fixtures" / "peers"


class CharTok:
    """Token id -> one character (enough for decoding samples)."""

    def encode(self, text):
        return [ord(c) % V for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def setup(name: str, *over: str, device: torch.device | str = "cpu"):
    cfg = resolve("debug", None, [f"method={name}", f"data.seq_len={L}", *over])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(V).to(device)
    with torch.no_grad():  # open the zero-initialised head so that outputs depend on the input
        lin = model.final.linear
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    return cfg, m, model


def tokens(seed: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed)).to(device)


def loss_kwargs(m, b: int) -> dict:
    """What the trainer passes (training/train.py): the global times' slice and the recon rows."""
    if not m.global_times:
        return {}
    n_recon = m.recon_rows(b)
    return {"t_diff": low_discrepancy(b - n_recon, u=0.3), "n_recon": n_recon}


# ------------------------------------------------------------------ declarations


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_declared_and_consistent(name):
    cls = METHODS[name]
    assert cls.name == name and isinstance(cls.kind, Kind) and cls.bound in ("nelbo", "nll")
    assert cls.samplers and all((cls.kind, s) in REGISTRY for s in cls.samplers), cls.samplers
    assert isinstance(cls.description, str) and cls.description
    assert (cls.bound == "nll") == (cls.kind is Kind.AUTOREGRESSIVE)


@pytest.mark.parametrize("name", NAMES)
def test_the_kind_answers_what_the_network_is(name):
    """``kind.continuous``: the network has a noise schedule (what the ODE likelihood, SDEdit and guidance
    read); ``kind.left_to_right``: its bound is an exact NLL; ``kind.mask_token``: a [MASK] id beyond the
    vocabulary is an input, and the bound is not exact."""
    _, m, model = setup(name)
    assert m.kind.continuous == hasattr(model, "schedule")
    assert m.kind.left_to_right == (m.bound == "nll")
    assert m.kind.mask_token == (getattr(model, "n_in", 0) == V + 1 and m.bound != "nll")


def test_langflow_is_evaluation_only_and_the_rest_train():
    assert [n for n, c in METHODS.items() if not c.trainable] == ["langflow"]


# ------------------------------------------------------------------ build, loss, bound


@pytest.mark.parametrize("name", NAMES)
def test_train_loss_is_finite_with_gradients(name, device):
    cfg, m, model = setup(name, device=device)
    x = tokens(device=device)
    if not m.trainable:
        with pytest.raises(ConfigError, match="evaluation-only"):
            m.train_loss(model, x, torch.Generator().manual_seed(0))
        return
    loss, metrics = m.train_loss(model, x, torch.Generator().manual_seed(0), **loss_kwargs(m, B))
    assert loss.ndim == 0 and loss.device == x.device and math.isfinite(float(loss.detach()))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and float(g.abs().sum()) > 0 for g in grads)
    assert all(g is None or bool(torch.isfinite(g).all()) for g in grads)
    m.before_step()
    m.after_step(metrics)
    m.refresh()


@pytest.mark.parametrize("name", NAMES)
def test_eval_bound_shape_and_finiteness(name, device):
    cfg, m, model = setup(name, device=device)
    model.eval()
    r = m.eval_bound(model, tokens(device=device), torch.Generator().manual_seed(0))
    b = r[m.bound]
    assert b.shape == (B,) and b.dtype == torch.float64 and bool(torch.isfinite(b).all()) and bool((b > 0).all())
    mask = torch.ones(B, L, dtype=torch.bool, device=device)
    mask[0, L // 2 :] = False
    rm = m.eval_bound(model, tokens(device=device), torch.Generator().manual_seed(0), mask=mask)
    assert bool(torch.isfinite(rm[m.bound]).all())
    assert m.embedding_rows(model).shape[0] == V
    assert isinstance(m.eval_summary(model), dict)
    p = m.probe(model, tokens(device=device), 0.5, torch.Generator().manual_seed(1))  # plateau signatures
    if p is not None:
        assert p.logits.shape == (B, L, V) and p.keep.shape == (B, L) and p.keep.dtype == torch.bool
        assert bool(torch.isfinite(p.logits[p.keep]).all())
        assert p.prior is None or p.prior.shape == p.logits.shape


@pytest.mark.parametrize("name", NAMES)
def test_conditional_nll_sums_over_the_target_and_leaves_the_context_unscored(name, device):
    """``conditional_nll`` (replaid lmeval's loglikelihood): (B,) float64, finite, > 0, ``conditional``
    declared; an exact one is the sum (not the mean) of the target's NLL."""
    cfg, m, model = setup(name, device=device)
    model.eval()
    assert m.conditional in ("exact", "bound")
    x = tokens(device=device)
    target = (torch.arange(L, device=device) >= L // 2).expand(B, L)
    c = m.conditional_nll(model, x, target, torch.Generator().manual_seed(0))
    assert c.shape == (B,) and c.dtype == torch.float64 and bool(torch.isfinite(c).all()) and bool((c > 0).all())
    whole = m.conditional_nll(model, x, torch.ones_like(target), torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(whole).all())
    if m.conditional == "exact":
        per_token = m.eval_bound(model, x, None, mask=target)[m.bound]
        assert torch.allclose(c, per_token * (L - L // 2), rtol=1e-5)


# ------------------------------------------------------------------ samplers


def _run(name, device="cpu"):
    cfg, m, model = setup(name, device=device)
    return SimpleNamespace(cfg=cfg, method=m, model=model.eval(), tokenizer=CharTok())


@pytest.mark.parametrize("name,sampler", PAIRS)
def test_every_declared_sampler_through_generate(name, sampler, device):
    run = _run(name, device)
    T = 4
    frames: list[dict] = []
    req = SampleRequest(sampler=sampler, steps=T, num=3, batch_size=2, seed=0, progress=False)
    rows = generate(run, req, callback=frames.append)
    assert len(rows) == 3 and all(len(r["ids"]) == L and 0 <= min(r["ids"]) and max(r["ids"]) < V for r in rows)
    assert all(r["sampler"] == sampler and r["nfe"] >= 1 for r in rows)
    again = generate(run, SampleRequest(sampler=sampler, steps=T, num=3, batch_size=2, seed=0, progress=False))
    other = generate(run, SampleRequest(sampler=sampler, steps=T, num=3, batch_size=2, seed=1, progress=False))
    assert [r["ids"] for r in again] == [r["ids"] for r in rows]  # deterministic per seed
    assert [r["ids"] for r in other] != [r["ids"] for r in rows]
    # one frame per step and batch (2 batches), a readout frame per batch for continuous methods,
    # one per generated token for AR
    per_batch = {Kind.CONTINUOUS: T + 1, Kind.MASKED: T, Kind.UNIFORM: T, Kind.AUTOREGRESSIVE: L}[run.method.kind]
    assert len(frames) == 2 * per_batch and all({"i", "T"} <= set(f) for f in frames)
    ids = generate(run, SampleRequest(sampler=sampler, steps=T, num=2, seed=0, prompt="abc", progress=False))
    assert all(r["ids"][:3] == CharTok().encode("abc") for r in ids)  # a prompt is kept as given


@pytest.mark.parametrize("name,sampler", [(n, s) for n, s in PAIRS if METHODS[n].kind is not Kind.CONTINUOUS])
def test_discrete_samplers_draw_on_the_device(name, sampler):
    """On ``meta`` (standing in for a GPU): no noise drawn on the host and copied over, no CPU
    generator filling a device tensor (continuous samplers: tests/test_sample_device.py)."""
    cfg, m, _ = setup(name)
    meta = torch.device("meta")
    with meta:
        model = m.build_model(50).eval()
    fn = REGISTRY[m.kind, sampler].fn
    gen = torch.Generator().manual_seed(0)
    with meta_as_cpu_autocast(), torch.no_grad(), SyncCounter("meta") as c:
        if m.kind is Kind.AUTOREGRESSIVE:
            z = fn(model, torch.zeros(2, 5, dtype=torch.long, device=meta), torch.arange(0, 6), generator=gen).tokens
        else:
            start = 50 if m.kind is Kind.MASKED else 7  # all [MASK] / any token
            x = torch.full((2, 5), start, dtype=torch.long, device=meta)
            z = fn(model, x, time_grid(3), generator=gen).tokens
    assert z.device.type == "meta"
    assert not c.host_random and not c.copies, (dict(c.host_random), dict(c.copies))


# ------------------------------------------------------------------ state, checkpoints, export


@pytest.mark.parametrize("name", NAMES)
def test_method_state_round_trip(name):
    cfg, m, model = setup(name)
    if m.trainable:
        for k in range(2):
            loss, metrics = m.train_loss(model, tokens(k), torch.Generator().manual_seed(k), **loss_kwargs(m, B))
            m.after_step(metrics)
        m.refresh()
    sd = json.loads(json.dumps(m.state_dict()))  # JSON-able, as state.json stores it
    fresh = get_method(cfg)
    fresh.load_state_dict(sd)
    assert fresh.state_dict() == sd
    assert fresh.recon_rows(32) == m.recon_rows(32)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every method trained for two steps (LangFlow: converted from its fixture) and exported."""
    from replaid.cli import main

    root = tmp_path_factory.mktemp("contract")
    out = {}
    for name in NAMES:
        if METHODS[name].trainable:
            cfg = resolve("debug", None, [f"method={name}", "train.steps=2", "eval.max_batches=1", "train.log_every=1"])
            train(cfg, root / name, progress=False)
            assert main(["export", str(root / name), "--out", str(root / f"{name}-hf")]) == 0
            out[name] = (root / name, root / f"{name}-hf")
        else:
            tok = FX / "words.json"  # a 40-word tokenizer (the fixtures' vocabulary size)
            over = ["data.tokenizer=file", f"data.tokenizer_path={tok}", "data.source=stdlib", "data.max_docs=50"]
            assert main(["convert", name, str(FX / name), "--out", str(root / f"{name}-hf"), "--set", *over]) == 0
            out[name] = (root / f"{name}-hf", root / f"{name}-hf")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_export_and_load_give_the_same_network_and_state(name, exported):
    from replaid.hub import from_pretrained

    src, folder = exported[name]
    a, b = from_pretrained(src, device="cpu"), from_pretrained(folder, device="cpu")
    assert type(a.method) is type(b.method) is METHODS[name]
    assert a.method.state_dict() == b.method.state_dict()
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randint(0, a.data.vocab_size, (2, a.cfg.data.seq_len), generator=torch.Generator().manual_seed(0))
    ra = a.method.eval_bound(a.model, x, torch.Generator().manual_seed(0))
    rb = b.method.eval_bound(b.model, x, torch.Generator().manual_seed(0))
    assert torch.equal(ra[a.method.bound], rb[b.method.bound])


# ------------------------------------------------------------------ config per method


def test_a_key_of_another_method_is_refused_naming_its_method():
    with pytest.raises(ConfigError, match=r"duo\.gamma_min belongs to method duo.*method=replaid"):
        resolve("debug", None, ["method=replaid", "duo.gamma_min=-4"])
    with pytest.raises(ConfigError, match=r"model\.time_embedding belongs to method ar/mdlm/duo"):
        resolve("debug", None, ["method=replaid", "model.time_embedding=dit"])
    with pytest.raises(ConfigError, match=r"diffusion\.sc_rate belongs to method replaid/plaid"):
        resolve("debug", None, ["method=mdlm", "diffusion.sc_rate=0.5"])
    assert resolve("debug", None, ["method=duo", "duo.gamma_min=-4"]).duo.gamma_min == -4
    with pytest.raises(ConfigError, match=r"baseline\.mdlm_low_variance is the name .* write mdlm\.low_variance="):
        resolve(
            "debug", None, ["method=mdlm", "baseline.mdlm_low_variance=false"]
        )  # old spellings: stored configs only
    old = {"method": "mdlm", "baseline": {"mdlm_low_variance": False, "ar_top_p": 0.9}}
    assert migrate_config(old)["mdlm"] == {"low_variance": False} and "ar" not in migrate_config(old)


def test_a_method_section_is_validated_only_when_that_method_runs():
    cfg = resolve("debug", None, ["method=duo"])
    cfg.duo.gamma_min = 5.0  # > gamma_max
    with pytest.raises(ConfigError, match="duo.gamma_min"):
        cfg.validate()
    cfg.method = "replaid"
    cfg.validate()  # not read by RePlaid: not validated


def test_replaid_refuses_micro_batches_without_a_diffusion_row():
    """``batch_size=4 grad_accum=4`` gave one-row micro-batches, all reconstruction: NaN training."""
    with pytest.raises(ConfigError, match="micro-batches of at least 2 rows"):
        resolve("debug", None, ["method=replaid", "train.batch_size=4", "train.grad_accum=4"])
    resolve("debug", None, ["method=replaid", "train.batch_size=8", "train.grad_accum=4"])
    resolve("debug", None, ["method=ar", "train.batch_size=4", "train.grad_accum=4"])  # AR learns from one row
    cfg = resolve("debug", None, ["method=replaid", "train.batch_size=8", "train.grad_accum=2"])  # 4 rows on 1 rank
    get_method(cfg).check_training(cfg, world_size=2)  # 2 rows per rank: enough
    with pytest.raises(ConfigError, match=r"gives 1; raise train\.batch_size"):  # the same rule, counting ranks
        get_method(cfg).check_training(cfg, world_size=4)


def test_configs_written_before_the_method_sections_migrate_on_read():
    old = json.loads((FIXTURES / "config-before-method-sections.json").read_text())  # as stored then
    assert "baseline" in old and {"ar", "mdlm", "duo", "langflow"}.isdisjoint(old)
    old["baseline"] = {
        "mdlm_low_variance": False,
        "mdlm_time_conditioning": True,
        "duo_curriculum_start": 0.0,
        "duo_curriculum_end": 0.5,
        "duo_gamma_min": -3.55,
        "duo_gamma_max": -1.85,
        "duo_tau_log10_start": -3.0,
        "duo_tau_log10_end": -3.0,
        "ar_top_p": 0.9,
        "langflow_gumbel_loc": 4.0,
        "langflow_gumbel_scale": 0.8,
        "langflow_gumbel_cutoff": 1e-5,
    }
    for method, check in (
        ("mdlm", lambda c: c.mdlm.low_variance is False and c.mdlm.time_conditioning),
        ("duo", lambda c: c.duo.gamma_min == -3.55 and c.duo.tau_log10_end == -3.0),
        ("ar", lambda c: c.ar.top_p == 0.9),
        ("langflow", lambda c: c.langflow.gumbel_loc == 4.0),
        ("replaid", lambda c: c.mdlm.low_variance and c.ar.top_p == 1.0),
    ):  # others' keys: defaults
        d = {**old, "method": method}
        cfg = RunConfig.from_dict(d)
        assert check(cfg), method
        assert "baseline" in d  # the input is not modified
    for method in ("duo", "replaid"):  # what the method never read is dropped: the file is a valid --config
        d = migrate_config({**old, "method": method})
        own = "duo" if method == "duo" else "diffusion"
        assert {"diffusion", "duo", "mdlm", "ar", "langflow"} & set(d) == {own}, method
        assert ("in_z_std" in d["model"]) == (method == "replaid") and ("time_embedding" in d["model"]) == (
            method == "duo"
        )
        refuse_unread_keys(RunConfig(method=method), flat_keys(d))
    assert migrate_config(RunConfig().to_dict()) == RunConfig().to_dict()  # today's layout: unchanged
    assert "duo" not in RunConfig().to_dict() and "duo" in RunConfig(method="duo").to_dict()  # own sections only


def test_configs_written_with_the_owner_tables_load_unchanged():
    """Each method's config.json as the last version with config.py's owner tables wrote it (debug preset,
    one option of the method's section changed): it loads, keeps that option, and is written back the same,
    but for the values that :func:`migrate_config` moves on (``train.compile`` false -> ``off``)."""
    from replaid.config import migrate_config

    stored = json.loads((FIXTURES / "config-owner-tables.json").read_text())
    assert sorted(stored) == sorted(METHODS)
    assert all(d["train"]["compile"] is False for d in stored.values())
    default = RunConfig().to_dict()
    for method, raw in stored.items():
        d = migrate_config(raw)
        d["train"]["compile"] = "off"  # a stored bool reads as its alias (config.VALUE_ALIASES)
        out = RunConfig.from_dict(raw).to_dict()
        assert set(out) == set(d), method  # the same sections
        for sec, keys in d.items():  # every stored key and value kept; keys added since carry their defaults
            if not isinstance(keys, dict):
                assert out[sec] == keys, (method, sec)
                continue
            assert {k: out[sec][k] for k in keys} == keys, (method, sec)
            added = set(out[sec]) - set(keys)
            assert all(out[sec][k] == default[sec][k] for k in added if sec in default), (method, sec, added)
    cfg = RunConfig.from_dict(stored["duo"])
    assert cfg.options.gamma_min == -3.6 and cfg.duo is cfg.options
    assert RunConfig.from_dict(stored["plaid"]).diffusion.prior_ramp_steps == 7
    assert RunConfig.from_dict(stored["ar"]).options.top_p == 0.8


def test_each_method_declares_its_own_options_beside_it():
    """A method's options dataclass lives in the method's module, and its section is what the config
    validates and saves; the config module names no method section."""
    import replaid.config as config_module

    for name, cls in METHODS.items():
        assert cls.options is not None and cls.options.__module__ == cls.__module__ or name == "plaid", name
        cfg = RunConfig(method=name)
        sec = cls.section or cls.name
        assert isinstance(cfg.options, cls.options) and sec in cfg.to_dict(), name
        others = {c.section or c.name for c in METHODS.values()} - {sec}
        assert others.isdisjoint(cfg.to_dict()), name
    gone = ("SECTION_OWNERS", "MODEL_KEY_OWNERS", "METHOD_NAMES", "owners_of", "refuse_foreign_keys")
    assert not [n for n in gone if hasattr(config_module, n)]
    assert not [
        c for c in vars(config_module).values() if isinstance(c, type) and c in {m.options for m in METHODS.values()}
    ]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_logits_do_not_see_the_tokens_they_predict(name):
    """lm-eval's greedy check (``Method.greedy_logits``): a prediction of each scored token from the rest, so
    the scored tokens' own values never reach their logits (AR: a position sees only the tokens before it);
    a continuous method has none."""
    _, m, model = setup(name)
    model.eval()
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    target = torch.zeros(B, L, dtype=torch.bool)
    target[:, L // 2 :] = True
    with torch.no_grad():
        out = m.greedy_logits(model, x, target, 0)
        if m.kind.continuous:
            assert out is None
            return
        assert out.shape[:2] == (B, L)
        y = torch.where(target, (x + 1) % V, x)  # every scored token changed
        got = m.greedy_logits(model, y, target, 0)
    seen = torch.arange(L) <= L // 2 if m.kind.left_to_right else target[0]  # AR: up to the first scored token
    assert torch.allclose(out[:, seen], got[:, seen], atol=1e-6)
