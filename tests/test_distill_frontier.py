"""scripts/distill_frontier.py's paired comparison (issue 24): A - B over samples paired by seed and index,
checked against a float64 Student-t interval computed here; re-rendering from a frontier.json; and the
pairing itself: the script's draws start sample i of a seed from the same noise for every model and sampler."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("distill_frontier", REPO / "scripts" / "distill_frontier.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(model, sampler, steps, nll, ent):
    iv = {"n": 2, "mean": 1.0, "sd": 0.1, "lo": 0.9, "hi": 1.1, "confidence": 0.95}
    return {
        "model": model,
        "sampler": sampler,
        "steps": steps,
        "nfe": steps + 1,
        "gen_ppl": iv,
        "entropy": iv,
        "seconds_per_sample": iv,
        "per_sample": [{"nll": list(n), "entropy": list(e)} for n, e in zip(nll, ent, strict=True)],
    }


def test_paired_difference_is_the_t_interval_over_pairs_in_float64(tmp_path):
    fr = _script()
    rng = np.random.default_rng(0)
    base = rng.normal(6.5, 0.4, size=(2, 20))  # shared by the pair (the starting noise), 2 seeds x 20
    a = base + 0.05 + rng.normal(0, 0.03, size=base.shape)
    b = base + rng.normal(0, 0.03, size=base.shape)
    ea, eb = rng.normal(3.6, 0.1, size=base.shape), rng.normal(3.6, 0.1, size=base.shape)
    rows = [_row("S", "ddim", 4, a, ea), _row("teacher", "heun", 4, b, eb)]
    p = fr.paired(rows, "S:ddim:4", "teacher:heun:4")
    d = (a - b).ravel()
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    assert p["nll"]["mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert (p["nll"]["lo"], p["nll"]["hi"]) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-12)
    # pairing removes the shared spread: the paired interval is far narrower than an unpaired one would be
    assert p["nll"]["hi"] - p["nll"]["lo"] < 0.2 * 2 * stats.t.ppf(0.975, 38) * a.std() * math.sqrt(2 / 40)
    assert p["corr"] > 0.9
    de = (ea - eb).ravel()
    assert p["entropy"]["mean"] == pytest.approx(de.mean(), abs=1e-12)
    with pytest.raises(SystemExit, match="no such configuration"):
        fr.paired(rows, "S:ddim:8", "teacher:heun:4")

    meta = {
        "date": "d",
        "host": "h",
        "seeds": [0, 1],
        "num": 20,
        "reference": {"windows": 40, "entropy": 3.7, "gen_ppl": 43.0},
    }
    src = tmp_path / "in.json"
    src.write_text(json.dumps({"meta": meta, "rows": rows}))
    fr.write_outputs(meta, rows, [("S:ddim:4", "teacher:heun:4")], tmp_path / "out")
    md = (tmp_path / "out" / "frontier.md").read_text()
    assert "| S:ddim:4 | teacher:heun:4 | 5 vs 5 |" in md and "unigram entropy 3.700" in md
    assert (tmp_path / "out" / "frontier_genppl_entropy.png").stat().st_size > 0


def _fake_run(self_conditioning: bool, weight_seed: int):
    """A debug-size RePlaid run (V = 40, L = 16) with its own weights; one character per token."""
    import torch

    from replaid.methods import get_method
    from replaid.presets import resolve

    class CharTok:
        def encode(self, text):
            return [ord(c) % 40 for c in text]

        def decode(self, ids):
            return "".join(chr(48 + i) for i in ids)

    cfg = resolve("debug", None, ["method=replaid", "data.seq_len=16", f"model.self_conditioning={self_conditioning}"])
    m = get_method(cfg)
    torch.manual_seed(weight_seed)
    return SimpleNamespace(cfg=cfg, method=m, model=m.build_model(40).eval(), tokenizer=CharTok())


def test_every_model_and_sampler_starts_sample_i_of_a_seed_from_the_same_noise(monkeypatch):
    """The pairing of :func:`paired`: the script's draws for a teacher (self-conditioned) and a student (its
    own weights, no self-conditioning), any sampler and step count, hand the sampler the same starting
    latent (B, L, d_e) at the same seed, and another at another seed."""
    import dataclasses
    import importlib

    import torch

    gen = importlib.import_module("replaid.sampling.generate")  # the module, not its function generate

    starts: list = []
    real = gen.get_sampler

    def spy(method, name=None):  # the registered sampler, recording the latent it starts from
        s = real(method, name)

        def fn(den, z, gammas, **kw):
            starts.append(z.clone())
            return s.fn(den, z, gammas, **kw)

        return dataclasses.replace(s, fn=fn)

    monkeypatch.setattr(gen, "get_sampler", spy)
    fr = _script()
    teacher, student = _fake_run(True, 0), _fake_run(False, 1)
    configs = [(teacher, "heun", 4), (teacher, "ddpm", 2), (student, "ddim", 2), (student, "consistency", 1)]
    z = {}
    for seed in (0, 1):
        for run, sampler, T in configs:
            starts.clear()
            rows = fr.draw(run, sampler, T, seed, 4)
            assert len(rows) == 4 and len(starts) == 1  # one batch
            z[seed, id(run), sampler] = starts[0]  # (4, 16, d_e)
        first = z[seed, id(teacher), "heun"]
        assert first.shape == (4, 16, teacher.cfg.model.d_e)
        for run, sampler, _ in configs:
            assert torch.equal(z[seed, id(run), sampler], first), f"seed {seed}: {sampler} starts elsewhere"
    assert not torch.equal(z[0, id(teacher), "heun"], z[1, id(teacher), "heun"])
