"""The command line's help: every option documented, defaults shown, methods listed from the registry."""

from __future__ import annotations

import argparse

import pytest

from replaid.cli import _parser, main


def _subparsers():
    p = _parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _all_parsers(parser, path=()):
    """Every (sub-)command parser, nested ones (``replaid scaling fit``) included."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield " ".join(path + (name,)), sp
                yield from _all_parsers(sp, path + (name,))


def test_every_option_has_help_and_shows_its_default():
    for name, sp in _all_parsers(_parser()):
        text = sp.format_help()
        for a in sp._actions:
            if a.help == argparse.SUPPRESS:
                continue
            assert a.help, f"replaid {name} {a.option_strings or a.dest} has no help"
            shown = a.default not in (None, False, "", argparse.SUPPRESS) and a.option_strings
            if shown and a.dest != "help":
                assert f"(default: {a.default})" in " ".join(text.split()), (name, a.dest)


def test_train_method_choices_are_the_registry():
    from replaid.methods import METHODS

    train = _subparsers()["train"]
    action = next(a for a in train._actions if a.dest == "method")
    assert tuple(action.choices) == tuple(METHODS)  # this repository's, then plug-ins (an eval-only one is
    assert "{replaid,plaid,ar,mdlm,duo,langflow}" in train.format_help()  # refused by the trainer, one line)


def test_likelihood_fd_step_and_old_spelling():
    p = _parser()
    base = ["likelihood", "RUN", "--out", "OUT"]
    assert p.parse_args(base).h == 1e-3
    assert p.parse_args(base + ["--fd-step", "0.02"]).h == 0.02
    assert p.parse_args(base + ["--h", "0.01"]).h == 0.01  # still accepted, no longer listed
    assert "--h " not in _subparsers()["likelihood"].format_help()


def test_unknown_method_rejected_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "--method", "foo", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("replaid: error: argument --method: invalid choice: 'foo'"), err
    assert main(["train", "--out", str(out), "method=foo"]) == 2
    assert "unknown method 'foo'" in capsys.readouterr().err
    assert not out.exists()


def test_the_error_line_is_one_write_so_ranks_sharing_a_pipe_never_interleave(monkeypatch):
    """torchrun's ranks share one stderr pipe: a line written in two pieces (``print`` writes the text,
    then ``\\n``) can be cut by another rank's line (CI saw it, 2026-11-28). One ``write`` below PIPE_BUF
    is atomic."""
    import sys

    from replaid import cli

    writes: list[str] = []

    class Recorder:
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    cli._say("replaid: error: x")
    assert writes == ["replaid: error: x\n"]
