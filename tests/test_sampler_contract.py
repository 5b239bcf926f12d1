"""The one sampler contract (``replaid/sampling/contract.py``), checked for every registered sampler of
every method (diffusers style: adding a sampler or a method to the registries adds it to every test here).

Each test builds the request's start the way ``generate`` does (the sampler's kind declares the initial
state, grid, generator and options: ``replaid/sampling/starts.py``) and calls the registered function
with the one signature ``fn(net, state, grid, *, generator, callback, **options) -> SampleResult``:

* shapes: the tokens are (B, L) ids of the vocabulary, the callback's ``z`` has the state's shape;
* determinism: the same seed gives the same tokens, another seed others;
* the callback is called once per step (T = len(grid) - 1) with i = 0..T-1 and the documented keys;
* NFE: the network calls counted here equal ``SampleResult.nfe`` and the registry's declaration;
* a prompt's tokens are kept;
* temperature 0 is greedy: every draw is the argmax of the distribution the step reports.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from replaid.methods import METHODS, Kind, get_method
from replaid.presets import resolve
from replaid.sampling.contract import STEP_KEYS, SampleResult
from replaid.sampling.registry import REGISTRY, Sampler, get_sampler
from replaid.sampling.request import SampleRequest

V, L, B = 40, 12, 3
PAIRS = [(n, s) for n in sorted(METHODS) for s in METHODS[n].samplers]
# what each kind's samplers add to i, T, z (documented on StepInfo)
KIND_KEYS = {  # and every registered sampler's "nfe": its network calls so far
    Kind.CONTINUOUS: {"gamma", "gamma_next", "e_hat", "logits", "nfe"},
    Kind.MASKED: {"t", "s", "probs", "nfe"},
    Kind.UNIFORM: {"t", "s", "probs", "nfe"},
    Kind.AUTOREGRESSIVE: {"pos", "tokens", "probs", "nfe"},
}


class CharTok:
    def encode(self, text):
        return [ord(c) % V for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


class Counting:
    """The network as the sampler sees it, counting its calls (``__call__`` and AR's ``forward_cached``)."""

    def __init__(self, net: Any):
        self.net, self.calls = net, 0

    def __call__(self, *a, **k):
        self.calls += 1
        return self.net(*a, **k)

    def forward_cached(self, *a, **k):
        self.calls += 1
        return self.net.forward_cached(*a, **k)

    def __getattr__(self, name: str):
        return getattr(self.net, name)


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name in METHODS:
        cfg = resolve("debug", None, [f"method={name}", f"data.seq_len={L}"])
        m = get_method(cfg)
        torch.manual_seed(0)
        model = m.build_model(V)
        with torch.no_grad():  # open the zero-initialised head so that outputs depend on the input
            lin = model.final.linear
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
        out[name] = SimpleNamespace(cfg=cfg, method=m, model=model.eval(), tokenizer=CharTok())
    return out


def draw(run, sampler: Sampler, steps: int = 4, **kw) -> tuple[SampleResult, list[dict], Any, torch.Tensor]:
    """One batch of B samples through the one contract; returns the result, the callback's payloads,
    the start and the initial state."""
    req = SampleRequest(sampler=sampler.name, steps=steps, num=B, batch_size=B, progress=False, **kw)
    plan = req.check(run.method, run.tokenizer, L)
    start = sampler.start(run, req, plan, req.length_for(L, plan), sampler.name, None)
    batch = start.batch(B)
    seen: list[dict] = []
    net = Counting(start.net)
    state = batch.state.clone()
    with torch.no_grad():
        res = sampler.fn(net, batch.state, start.grid, generator=start.generator, callback=seen.append, **batch.options)
    assert net.calls == res.nfe, "SampleResult.nfe is not the number of network calls"
    return res, seen, start, state


@pytest.mark.parametrize("name,sampler", PAIRS)
def test_every_registered_sampler_keeps_the_contract(runs, name, sampler):
    run = runs[name]
    s = get_sampler(run.method, sampler)
    assert REGISTRY[run.method.kind, sampler] is s
    res, seen, start, state = draw(run, s, seed=0)
    T = len(start.grid) - 1
    # shapes
    assert isinstance(res, SampleResult)
    assert res.tokens.shape == (B, L) and res.tokens.dtype == torch.long
    assert 0 <= int(res.tokens.min()) and int(res.tokens.max()) < V
    assert state.shape[:2] == (B, L)
    # the callback: once per step, in order, with the documented keys
    assert [info["i"] for info in seen] == list(range(T))
    assert all(info["T"] == T for info in seen)
    want = set(STEP_KEYS) | KIND_KEYS[run.method.kind]
    assert all(set(info) == want for info in seen), [sorted(info) for info in seen[:1]]
    assert all(info["z"].shape == state.shape for info in seen)
    # NFE as the registry declares it
    if s.nfe_exact:
        assert res.nfe == s.nfe(T)
    else:
        assert 1 <= res.nfe <= s.nfe(T)
    # determinism at a fixed seed; another seed draws others
    again, *_ = draw(run, s, seed=0)
    other, *_ = draw(run, s, seed=1)
    assert torch.equal(again.tokens, res.tokens) and again.nfe == res.nfe
    assert not torch.equal(other.tokens, res.tokens)


@pytest.mark.parametrize("name,sampler", PAIRS)
def test_every_registered_sampler_keeps_the_prompt(runs, name, sampler):
    run = runs[name]
    s = get_sampler(run.method, sampler)
    for seed in (0, 1):
        res, seen, start, _ = draw(run, s, seed=seed, prompt="abcd")
        prompt = torch.tensor(CharTok().encode("abcd"))
        assert torch.equal(res.tokens[:, :4], prompt.expand(B, -1))
        if run.method.kind is not Kind.CONTINUOUS:  # a discrete state holds the prompt after every step
            assert all(torch.equal(info["z"][:, :4], prompt.expand(B, -1)) for info in seen)
    assert len(seen) == len(start.grid) - 1


def _greedy_continuous(run, res: SampleResult, seen: list[dict]) -> None:
    E = run.model.embedding_matrix().float()  # e_hat of the greedy limit: the embedding of the argmax
    for info in seen:
        assert torch.allclose(info["e_hat"].float(), E[info["logits"].argmax(-1)])
    assert res.logits is not None and torch.equal(res.tokens, res.logits.argmax(-1))


def _greedy_masked(run, res: SampleResult, seen: list[dict]) -> None:
    prev = torch.full((B, L), V)
    for info in seen:
        z, probs = info["z"], info["probs"]
        new = (prev == V) & (z != V)  # unmasked at this step: the argmax of the x_theta it was drawn from
        assert torch.equal(z[new], probs.argmax(-1)[new])
        prev = z.clone()
    assert bool((prev != V).all())


def _greedy_uniform(run, res: SampleResult, seen: list[dict]) -> None:
    last = seen[-1]  # at s = 0 the posterior is x_theta itself: greedy, its argmax
    assert last["s"] == 0.0
    assert torch.equal(res.tokens, last["probs"].argmax(-1))


def _greedy_autoregressive(run, res: SampleResult, seen: list[dict]) -> None:
    for info in seen:
        assert torch.equal(info["tokens"][:, info["pos"]], info["probs"].argmax(-1))


GREEDY = {
    Kind.CONTINUOUS: _greedy_continuous,
    Kind.MASKED: _greedy_masked,
    Kind.UNIFORM: _greedy_uniform,
    Kind.AUTOREGRESSIVE: _greedy_autoregressive,
}


@pytest.mark.parametrize("name,sampler", PAIRS)
def test_temperature_zero_is_greedy(runs, name, sampler):
    run = runs[name]
    s = get_sampler(run.method, sampler)
    res, seen, _, _ = draw(run, s, seed=0, temperature=0.0)
    GREEDY[run.method.kind](run, res, seen)
    hot, hot_seen, _, _ = draw(run, s, seed=0, temperature=1.0)
    with pytest.raises(AssertionError):  # the check itself tells a tempered draw from a greedy one
        GREEDY[run.method.kind](run, hot, hot_seen)
