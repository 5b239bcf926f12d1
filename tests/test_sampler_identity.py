"""Samples at fixed seeds are bit-identical to those recorded before the sampler contract was unified.

``tests/fixtures/sampler_identity.json`` holds, for every registered (method, sampler) and a handful of
requests (unconditional, prompted, greedy, tempered, split batches, another seed, AR's nucleus,
continuous infilling), the ids, NFE and step count of every row ``replaid.sampling.generate.generate``
returned, and a fingerprint of every callback payload's tensors. The file was written by the code before
issue 35's refactor (``REPLAID_RECORD_IDENTITY=1 pytest tests/test_sampler_identity.py``); any later
change to what a sampler draws, in which order, fails here. The callback fingerprints were re-recorded on
2026-11-28 with float payloads rounded to 4 decimals (their low bits differ between CPUs), after the ids,
NFE, step and callback counts of every entry were seen equal to the original record.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from replaid.methods import METHODS, Kind, get_method
from replaid.presets import resolve
from replaid.sampling.generate import generate
from replaid.sampling.infill import InfillPlan
from replaid.sampling.request import SampleRequest

V, L = 40, 12
FIXTURE = Path(__file__).parent / "fixtures" / "sampler_identity.json"
PAIRS = [(n, s) for n in sorted(METHODS) for s in METHODS[n].samplers]


class CharTok:
    def encode(self, text):
        return [ord(c) % V for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def _run(name: str):
    cfg = resolve("debug", None, [f"method={name}", f"data.seq_len={L}"])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(V)
    with torch.no_grad():  # open the zero-initialised head so that outputs depend on the input
        lin = model.final.linear
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    return SimpleNamespace(cfg=cfg, method=m, model=model.eval(), tokenizer=CharTok())


def _requests(kind: Kind) -> dict[str, dict]:
    base = dict(steps=5, num=3, batch_size=2, seed=0, progress=False)
    out = {
        "plain": base,
        "seed7": {**base, "seed": 7},
        "prompt": {**base, "prompt": "abcd"},
        "greedy": {**base, "temperature": 0.0},
        "tempered": {**base, "temperature": 0.7, "num": 2},
        "one_batch": {**base, "batch_size": 3, "steps": 3},
    }
    if kind is Kind.AUTOREGRESSIVE:
        out["top_p"] = {**base, "top_p": 0.5}
    if kind is Kind.CONTINUOUS:
        known = torch.tensor([True] * 3 + [False] * 5 + [True] * 4)
        out["infill"] = {**base, "template": InfillPlan(torch.arange(L) % V, known)}
    return out


KEYS = ("T", "e_hat", "gamma", "gamma_next", "i", "logits", "pos", "probs", "s", "t", "tokens", "z")


def _digest(info) -> str:
    """A fingerprint of a callback payload (a dict, or an object with these attributes); a key holding the
    very object of a key before it (AR's ``z``, which is its ``tokens``) adds nothing."""
    h = hashlib.sha256()
    seen: list[object] = []
    for k in KEYS:
        v = info.get(k) if isinstance(info, dict) else getattr(info, k, None)
        if v is None or (isinstance(v, torch.Tensor) and any(v is x for x in seen)):
            continue
        seen.append(v)
        h.update(k.encode())
        if isinstance(v, torch.Tensor) and v.is_floating_point():  # to 4 decimals: the low bits of a
            # float payload differ between CPUs (AR's prompted logits on a Zen 4 EPYC, 2026-11-28)
            h.update(np.round(v.detach().cpu().double().numpy(), 4).tobytes())
        elif isinstance(v, torch.Tensor):
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(v, (int, float, bool)):
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def _record(name: str, sampler: str) -> dict:
    run = _run(name)
    out = {}
    for label, kw in _requests(run.method.kind).items():
        seen: list[str] = []
        rows = generate(run, SampleRequest(sampler=sampler, **kw), callback=lambda info: seen.append(_digest(info)))
        out[label] = {
            "ids": [r["ids"] for r in rows],
            "nfe": [r["nfe"] for r in rows],
            "steps": [r["steps"] for r in rows],
            "callbacks": hashlib.sha256("".join(seen).encode()).hexdigest()[:16],
            "n_callbacks": len(seen),
        }
    return out


@pytest.mark.skipif(not os.environ.get("REPLAID_RECORD_IDENTITY"), reason="records the fixture (opt-in)")
def test_record_fixture():
    FIXTURE.parent.mkdir(exist_ok=True)
    lines = [f"{json.dumps(f'{n}/{s}')}: {json.dumps(_record(n, s))}" for n, s in PAIRS]
    FIXTURE.write_text("{\n" + ",\n".join(lines) + "\n}\n")


@pytest.mark.parametrize("name,sampler", PAIRS)
def test_samples_identical_to_the_recorded_ones(name, sampler):
    want = json.loads(FIXTURE.read_text())[f"{name}/{sampler}"]
    got = _record(name, sampler)
    for label in want:
        assert got[label]["ids"] == want[label]["ids"], label
        assert got[label]["nfe"] == want[label]["nfe"], label
        assert got[label]["steps"] == want[label]["steps"], label
        assert got[label]["n_callbacks"] == want[label]["n_callbacks"], label
        assert got[label]["callbacks"] == want[label]["callbacks"], label
