"""Issue 35: ``replaid sample``'s sampling flags are built from :class:`SampleRequest`'s fields.

A field declared with :func:`~replaid.sampling.request.knob` carries its help, range, choices and metavar;
``commands/sample.py`` names no field. So a new sampling knob touches the request (``sampling/request.py``)
and the code that reads it, nothing else: here a throwaway subclass with new knobs, swapped in for
``SampleRequest``, gets its flags, defaults, help, one-line errors and values through to ``generate`` and the
playground's JSON, with no edit to the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from replaid.cli import _parser, main, parse
from replaid.commands import sample as sample_cmd
from replaid.sampling import request
from replaid.sampling.errors import flag
from replaid.sampling.request import KNOB, SampleRequest, knob


def _sample_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["sample"]


def _options() -> dict[str, argparse.Action]:
    return {o: a for a in _sample_parser(_parser())._actions for o in a.option_strings}


def test_every_knob_is_a_flag_with_the_requests_default_and_the_messages_name():
    options = _options()
    knobs = [f for f in dataclasses.fields(SampleRequest) if KNOB in f.metadata]
    assert {f.name for f in knobs} >= {"steps", "sampler", "max_tokens", "stop", "ignore_eos", "self_cond"}
    for f in knobs:
        assert flag(f.name) in options, f"{f.name}: its messages name {flag(f.name)}, which the CLI lacks"
        assert options[flag(f.name)].help == f.metadata[KNOB].help
    for f in dataclasses.fields(SampleRequest):  # the others are set by code (or replaid edit's own flags)
        if KNOB not in f.metadata:
            assert "--" + f.name.replace("_", "-") not in options, f.name
    assert sample_cmd.request_of(parse(["sample", "RUN"])) == SampleRequest()  # every default is the request's
    assert sample_cmd.request_of(parse(["sample", "RUN", "--no-self-cond", "--stop", "a", "--stop", "b"])) == (
        SampleRequest(self_cond=False, stop=("a", "b"))
    )


def test_the_command_names_no_field():
    """commands/sample.py adds no flag of a request field by hand (its own: the run, --show-positions, --json)."""
    source = inspect.getsource(sample_cmd).replace(sample_cmd.EXAMPLE, "")
    for f in dataclasses.fields(SampleRequest):
        if KNOB in f.metadata:
            assert f'"{flag(f.name)}"' not in source and f"args.{f.name}" not in source, f.name


@dataclasses.dataclass
class Knobbed(SampleRequest):
    """SampleRequest with throwaway knobs of each kind a flag can be."""

    sharpness: float = knob(0.5, "a throwaway float knob", lo=0, hi=2)
    rounds: int | None = knob(None, "a throwaway whole number, absent by default", lo=1, metavar="R")
    taps: tuple[str, ...] = knob((), "a throwaway repeatable knob", metavar="TAP")
    flip: bool = knob(False, "a throwaway switch")
    keep: bool = knob(True, "turn off a throwaway setting that is on by default")
    style: str | None = knob(None, "a throwaway choice", choices=("plain", "fancy"))
    hidden: int = 3  # no knob: set by code, no flag


@pytest.fixture
def knobbed(monkeypatch):
    """Knobbed in place of SampleRequest (where the command reads it); generate replaced by a spy."""
    monkeypatch.setattr(request, "SampleRequest", Knobbed)
    seen: list[SampleRequest] = []

    def generate(run, req):
        seen.append(req)
        return [{"text": "sampled", "ids": [0]}]

    run = SimpleNamespace(method=SimpleNamespace(block_size=lambda: 0), tokenizer=SimpleNamespace(vocab_size=8))
    monkeypatch.setattr("replaid.sampling.generate.generate", generate)
    monkeypatch.setattr("replaid.store.loading.load_run", lambda *a, **k: run)
    return seen


def test_a_new_knob_is_a_flag_and_reaches_the_consumer(knobbed, capsys):
    assert Path(sample_cmd.__file__).read_text().count("sharpness") == 0  # the command was not edited
    options = _options()
    assert options["--sharpness"].default == 0.5 and options["--sharpness"].type.range[:2] == (0, 2)
    assert options["--style"].choices == ("plain", "fancy") and "--hidden" not in options
    assert "--no-keep" in options and "--keep" not in options
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--sharpness SHARPNESS a throwaway float knob (default: 0.5)" in text
    assert "--rounds R a throwaway whole number, absent by default" in text and "--taps TAP" in text

    argv = ["sample", "RUN", "--sharpness", "1.5", "--rounds", "3", "--taps", "a", "--taps", "b", "--flip"]
    assert main([*argv, "--no-keep", "--style", "fancy", "--steps", "8"]) == 0
    assert capsys.readouterr().out.startswith("sampled")
    (req,) = knobbed
    assert isinstance(req, Knobbed)
    assert (req.sharpness, req.rounds, req.taps, req.flip, req.keep, req.style) == (
        1.5,
        3,
        ("a", "b"),
        True,
        False,
        "fancy",
    )
    assert (req.steps, req.hidden) == (8, 3)

    assert main(["sample", "RUN"]) == 0
    assert knobbed[-1] == Knobbed()  # absent flags: the request's defaults


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--sharpness", "3"], "argument --sharpness: 3: must be <= 2"),
        (["--sharpness", "lots"], "argument --sharpness: 'lots' is not a number"),
        (["--rounds", "0"], "argument --rounds: 0: must be >= 1"),
        (["--style", "odd"], "argument --style: invalid choice: 'odd'"),
    ],
)
def test_a_new_knobs_bad_value_is_one_line_naming_its_flag(knobbed, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        main(["sample", "RUN", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"replaid: error: {message}"), err
    assert not knobbed


def test_a_new_knob_is_a_field_of_the_playgrounds_json(monkeypatch):
    """The same knob through the other front end (web/engine.parse, the config's one type coercion)."""
    from replaid.web import engine

    monkeypatch.setattr(engine, "SampleRequest", Knobbed)
    asked = engine.parse({"run": "r", "sharpness": "1.25", "taps": ["x"], "keep": False})
    assert (asked.request.sharpness, asked.request.taps, asked.request.keep) == (1.25, ("x",), False)
    with pytest.raises(ValueError, match="field 'sharpness' must be float"):
        engine.parse({"run": "r", "sharpness": "sharp"})
