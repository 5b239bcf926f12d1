"""``replaid`` command line: builds the parser from ``replaid.commands`` and maps errors to exit codes.

Every bad input ends in one line ``replaid: error: ...`` naming the problem and the fix, exit 2. A
reader that closes the output early (``replaid presets | head``) ends the command quietly with
:data:`SIGPIPE_EXIT`, as ``ls``, ``git`` and other Unix tools killed by SIGPIPE do.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

from replaid.commands import COMMANDS

SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `ls | head`; the output was cut short, not complete


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors (no usage block): ``replaid: error: <what>; <where help is>``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"replaid: error: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="replaid",
        description="RePlaid: likelihood-based continuous diffusion LMs.",
        epilog="run 'replaid COMMAND --help' for each command's options and an example",
    )
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error (also REPLAID_DEBUG=1)")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="load checkpoint tensor files without checking them against the sha256 their state.json records",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        importlib.import_module(f"replaid.commands.{name}").register(sub)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """``replaid ARGV`` parsed and checked without running it (and without importing torch).

    Returns the namespace the command would run with. Bad input exits as ``replaid`` does: one
    ``replaid: error: ...`` line on stderr and ``SystemExit(2)``; ``--help`` prints and exits 0. For
    tools that plan ``replaid`` command lines and resolve them before a run (the GPU check's dry run).
    """
    return _parser().parse_args(argv)


def _end_progress_bars() -> None:
    """Close every live tqdm bar, so that the message printed next is the last line of stderr, alone.

    A bar left open by an exception is otherwise drawn again when it is garbage-collected (at exit),
    after the message, and the message starts on the bar's unfinished line. Inner bars (position > 0)
    are closed first; the outermost is left drawn (its last state: how far the command got) and ends
    its line, whatever its ``leave``.
    """
    std = sys.modules.get("tqdm.std")  # tqdm not imported yet: no bar was ever drawn
    if std is None:
        return
    for bar in sorted(list(std.tqdm._instances), key=lambda b: abs(getattr(b, "pos", 0)), reverse=True):
        try:
            if not abs(getattr(bar, "pos", 0)):
                bar.leave = True  # ends the line with '\n' (leave=False would only clear it with '\r')
            bar.close()
        except Exception:
            pass


def _say(line: str) -> None:
    """``line`` on stderr on a line of its own, after the live progress bars are closed."""
    _end_progress_bars()
    sys.stderr.write(line + "\n")  # one write(2): ranks sharing a pipe never interleave inside a line
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)  # builds and parses without torch: ``--help`` and usage errors exit here

    from replaid.config import ConfigError
    from replaid.data import DataError
    from replaid.store import checkpoint
    from replaid.store.checkpoint import CheckpointError
    from replaid.training.train import PREEMPTED_EXIT, Preempted, TrainingDiverged

    checkpoint.VERIFY = not args.no_verify
    debug = args.debug or os.environ.get("REPLAID_DEBUG", "") not in ("", "0")
    try:
        code: int = args.func(args)  # every sub-command's run() returns its exit status
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit (exit 120 and a traceback)
        return code
    except BrokenPipeError:  # the reader went away (`| head`): quiet, as Unix tools are (Python docs, signal)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the final flush at exit writes nowhere, without a second error
        return SIGPIPE_EXIT
    except (ConfigError, DataError, CheckpointError, TrainingDiverged, OSError, ValueError) as e:
        if debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        if isinstance(e, OSError) and e.filename:  # e.g. a read-only or full disk: name the file
            msg = f"{e.strerror or e.__class__.__name__}: {e.filename}; check the path and its permissions/space"
        _say(f"replaid: error: {msg}")
        return 2
    except Preempted as e:  # a checkpoint was saved: the scheduler requeues, the next start resumes
        _say(f"replaid: preempted: {e}")
        return PREEMPTED_EXIT
    except KeyboardInterrupt:
        _say("replaid: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
