"""One range per sampling option (issue 51 §4): each numeric field of SampleRequest declares its range once
(:func:`~replaid.sampling.request.knob`), and ``replaid sample``'s flag, the request's own check (what the
playground and ``/v1/completions`` run) and :func:`replaid.config.range_problem` give the same answer for
the same value. A field's range written a second time elsewhere (as the playground's 0.01..100 temperature
was) fails the second test."""

from __future__ import annotations

import argparse

import pytest

from replaid.config import range_problem
from replaid.sampling.errors import RequestError
from replaid.sampling.request import SampleRequest, knobs


def outside(lo, hi, or_zero, is_int):
    """Values just outside ``[lo, hi]`` (never the special 0 of an ``or_zero`` range)."""
    out = []
    if lo is not None:
        below = lo - 1 if is_int else (lo / 2 if lo > 0 else lo - 1.0)
        out.append(below if not (or_zero and below == 0) else lo / 2)
    if hi is not None:
        out.append(hi + 1 if is_int else hi * 2)
    return out


RANGED = {k: kb for k, kb in knobs().items() if kb.lo is not None or kb.hi is not None}


def test_every_ranged_option_is_found():
    assert {"steps", "num", "batch_size", "temperature", "score_temperature", "seed", "guidance_scale"} <= set(RANGED)


@pytest.mark.parametrize("name", sorted(RANGED))
def test_the_flag_and_the_request_refuse_the_same_values_alike(name, capsys):
    from replaid.commands.sample import add_request_args

    kb = RANGED[name]
    is_int = isinstance(kb.lo, int) and (kb.hi is None or isinstance(kb.hi, int))
    parser = argparse.ArgumentParser(prog="replaid sample")
    add_request_args(parser, [name])
    flag = "--" + name.replace("_", "-")
    for v in outside(kb.lo, kb.hi, kb.or_zero, is_int):
        why = range_problem(v, kb.lo, kb.hi, or_zero=kb.or_zero)
        assert why, (name, v)
        with pytest.raises(SystemExit):
            parser.parse_args([flag, str(v)])
        assert f"{v if is_int else format(v, 'g')}: {why}" in capsys.readouterr().err, (name, v)
        req = SampleRequest(**{name: v})
        with pytest.raises(RequestError) as e:
            req._check_numbers(None, 64)
        assert why in e.value.named(), (name, v, e.value.named())
    for end in (kb.lo, kb.hi):  # both ends are inside: no second, narrower range anywhere in the check
        if end is not None:
            SampleRequest(**{name: end})._check_numbers(None, 64)


def test_the_playground_takes_the_declared_range_not_one_of_its_own():
    """The playground's bounds are the server's resource limits (steps, samples, length), not a second range
    for an option: a temperature the CLI takes, the playground takes."""
    from replaid.web.engine import Limits

    bounds = Limits().request_limits()
    assert not hasattr(bounds, "temperature")
    bounds.check(SampleRequest(temperature=500.0, num=1), 64)


def test_every_option_is_on_the_api_or_says_why_not():
    """Each option of the request is a ``/v1/completions`` field under its OpenAI name, or is listed in
    ``NOT_ON_V1`` with the reason; nothing is left undecided."""
    from replaid.web.completions import NAMES, NOT_ON_V1, v1_fields

    assert set(NOT_ON_V1) <= set(knobs()) and all(NOT_ON_V1.values())
    for k in knobs():
        assert k in NOT_ON_V1 or NAMES.get(k, k) in v1_fields(), k
    want = {"steps", "sampler", "temperature", "score_temperature", "self_cond", "seed", "n", "max_tokens"}
    assert want <= v1_fields()


def test_a_new_option_reaches_the_cli_the_playground_and_the_api_alike(monkeypatch, capsys):
    """An option added to SampleRequest (one ``knob`` declaration, here ``sharpness`` in [0.5, 2]) is a flag of
    ``replaid sample``, a field of the playground and of ``/v1/completions``, each refusing a value outside its
    one range with the same words and passing one inside to the request. Seen failing with the API's field
    list frozen at import (the new field an unknown one) and with the playground's field list fixed."""
    import dataclasses
    from types import SimpleNamespace

    import replaid.sampling.request as rq
    from replaid.commands.sample import add_request_args
    from replaid.web import completions, engine

    @dataclasses.dataclass
    class Wider(rq.SampleRequest):
        sharpness: float = rq.knob(1.0, "a new option", lo=0.5, hi=2.0)

    for mod in (rq, completions, engine):
        monkeypatch.setattr(mod, "SampleRequest", Wider)
    why = range_problem(3.0, 0.5, 2.0)
    parser = argparse.ArgumentParser(prog="replaid sample")
    add_request_args(parser, ["sharpness"])
    assert parser.parse_args(["--sharpness", "1.5"]).sharpness == 1.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--sharpness", "3"])
    assert why in capsys.readouterr().err
    played = engine.parse({"run": "r", "sharpness": 1.5}).request
    slot = SimpleNamespace(run=SimpleNamespace(default_sampler=None, default_steps=None))
    _, api, _ = completions.request_of({"model": "r", "sharpness": 1.5}, {"r": slot})
    for req in (played, api):
        assert isinstance(req, Wider) and req.sharpness == 1.5
    played = engine.parse({"run": "r", "sharpness": 3.0}).request
    _, api, _ = completions.request_of({"model": "r", "sharpness": 3.0}, {"r": slot})
    for req in (played, api):
        with pytest.raises(RequestError) as e:
            req._check_numbers(None, 64)
        assert why in e.value.named()
    with pytest.raises(completions.ApiError, match="sharpness must be a number"):
        completions.request_of({"model": "r", "sharpness": "1.5"}, {"r": slot})
