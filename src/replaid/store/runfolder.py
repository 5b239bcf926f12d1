"""A run folder is owned by one trainer at a time, is never silently overwritten, and says what
state it is in (for sweeps: skip finished runs, resume interrupted ones).

``claim(run_dir, ...)`` takes an exclusive ``filelock`` on ``RUN/.lock`` (released by the kernel
when the process dies, even by SIGKILL), records the holder (pid, host, start time) in
``RUN/.lock.owner`` while it holds the lock (removed on release), refuses a folder that already holds a run unless ``resume`` or ``overwrite``,
and removes the temporaries an interrupted save left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from replaid import schema
from replaid.config import read_run_config
from replaid.fileio import atomic_write_text, remove_stale_temporaries
from replaid.schema import dumps as strict_dumps
from replaid.store import checkpoint as ck

LOCK, OWNER = ".lock", ".lock.owner"
FINAL_EVAL = "final_eval.json"
NONFINITE = "nonfinite"  # checkpoints whose final evaluation was not finite, out of force (kept, not deleted)
RUN_FILES = ("config.json", "tokenizer", "checkpoints", "metrics.jsonl", "tb", "wandb", FINAL_EVAL, NONFINITE)


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked (one-line message with the fix)."""


def _holder(run_dir: Path) -> str:
    try:
        o = json.loads((run_dir / OWNER).read_text())
        return f"pid {o['pid']} on host {o['host']}, started {o['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process whose details are not recorded yet"


def _acquire(run_dir: Path) -> FileLock:
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"--out {run_dir} is a file, not a folder; choose a folder path for the run")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fl = FileLock(str(run_dir / LOCK), timeout=0, preserve_lock_file=True)
        fl.acquire()
    except Timeout:
        raise RunFolderError(
            f"run folder {run_dir} is in use by another trainer ({_holder(run_dir)}); wait for it "
            f"to finish or stop it, or choose another --out"
        ) from None
    except OSError as e:
        raise RunFolderError(
            f"cannot write to run folder {run_dir} ({e.__class__.__name__}: {e.strerror}); choose a writable --out"
        ) from None
    return fl


MANAGED = ("checkpoints", "tokenizer")  # a run's folders that its trainer writes, replaces and prunes


def managed_folder(path: str | Path) -> str | None:
    """What makes ``path`` a place no output may go, or None: a run's own ``checkpoints/`` or
    ``tokenizer/`` (or a folder inside them), of any run; or a checkpoint folder (or inside one)."""
    p = Path(os.path.realpath(path))  # never raises (a symlink loop stays unresolved)
    for a in [p, *p.parents]:
        if a.name in MANAGED and (a.parent / "config.json").is_file():
            return f"inside the {a.name}/ of the run {a.parent}"
    ckpt = next((a for a in [p, *p.parents] if (a / "state.json").is_file() and ck.has_weights(a)), None)
    return f"inside the checkpoint {ckpt}" if ckpt is not None else None


def check_free(run_dir: Path) -> None:
    """Raise the in-use error now if a trainer holds ``run_dir`` (an existing folder)."""
    if (Path(run_dir) / LOCK).is_file():  # no lock file: nobody holds it (and none is made here)
        _acquire(Path(run_dir)).release()


@contextmanager
def lock(run_dir: Path, check: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``RUN/.lock`` for the duration, or fail at once naming the holder. ``check`` runs once the
    lock is held and before anything is written: when it refuses, the folder is left as it was (a lock
    file or folder this call made is removed again, ``.lock.owner`` is not touched)."""
    run_dir = Path(run_dir)
    created, had_lock = not run_dir.exists(), (run_dir / LOCK).exists()
    fl = _acquire(run_dir)
    try:
        if check is not None:
            check()
    except BaseException:
        if not had_lock:
            (run_dir / LOCK).unlink(missing_ok=True)
        fl.release()
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        atomic_write_text(run_dir / OWNER, strict_dumps(owner))
        yield
    finally:
        (run_dir / OWNER).unlink(missing_ok=True)  # it names the holder while held, and only then
        fl.release()


def _run_files(run_dir: Path, resume: bool) -> list[str]:
    """The run files in ``run_dir`` (a lone ``tokenizer/`` of a start killed before its config.json is none)."""
    present = [n for n in RUN_FILES if os.path.lexists(run_dir / n)]  # a broken link is there too
    return [] if present == ["tokenizer"] and not resume else present


@contextmanager
def claim(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[None]:
    """Lock ``run_dir`` for a trainer.

    Refuses a folder holding a run unless ``resume`` (continue it) or ``overwrite`` (its run files are
    deleted first), and a non-empty folder holding no run; a refusal changes nothing (lock files
    included). Removes stale temporaries (``.step_*`` folders, ``.NAME.tmp.PID`` files). A new run
    exists once :func:`begin` wrote its ``config.json``; a start that fails before that leaves nothing
    behind (a folder this call created is removed again).
    """
    run_dir = Path(run_dir)
    created = not run_dir.exists()

    def check() -> None:
        present = _run_files(run_dir, resume)
        foreign = [q.name for q in run_dir.iterdir() if q.name not in (*RUN_FILES, LOCK, OWNER)]
        if foreign and not present and not resume:
            raise RunFolderError(
                f"--out {run_dir} is a non-empty folder that holds no run ({', '.join(sorted(foreign)[:3])}); "
                f"choose a new or empty folder"
            )
        if present and not (resume or overwrite):
            raise RunFolderError(
                f"run folder {run_dir} already holds a run ({', '.join(present)}); pass --resume "
                f"to continue it, --overwrite to replace it, or choose another --out"
            )
        if resume and not (run_dir / "config.json").is_file():
            raise RunFolderError(f"--resume: {run_dir} has no config.json; start a run there without --resume first")
        if resume:
            ck.check_readable(run_dir / "checkpoints")  # unreadable: an error, never a start from step 0

    inside = managed_folder(run_dir)
    if inside:
        raise RunFolderError(f"--out {run_dir} is {inside}, which its trainer prunes; choose a folder outside it")
    with lock(run_dir, check), _undo_failed_start(run_dir, created and not resume):
        if (run_dir / "tokenizer").exists() and not _run_files(run_dir, resume) and not resume:
            shutil.rmtree(run_dir / "tokenizer")  # a start killed before its config.json: no run yet
        if overwrite and not resume:
            for n in _run_files(run_dir, resume):
                q = run_dir / n
                shutil.rmtree(q) if q.is_dir() else q.unlink()
        remove_stale(run_dir)
        yield


def begin(run_dir: Path, config_json: str) -> None:
    """Make the claimed folder a run: write its config (atomically), once its data checked out."""
    atomic_write_text(Path(run_dir) / "config.json", config_json)


@contextmanager
def _undo_failed_start(run_dir: Path, created: bool) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if created and not (run_dir / "config.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def remove_stale(run_dir: Path) -> None:
    """Delete what interrupted writes left: ``checkpoints/.step_*``/``.trash.*`` and temp files."""
    ckdir = run_dir / "checkpoints"
    stale = []
    if ckdir.is_dir():
        for p in ckdir.iterdir():
            if p.name.startswith((".step_", ".trash.")) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
                stale.append(p)
        stale += remove_stale_temporaries(ckdir)
    for folder in (run_dir, run_dir / "tokenizer"):
        stale += remove_stale_temporaries(folder)
    if stale:
        print(
            f"replaid: note: removed {len(stale)} temporary file(s) an interrupted run left in {run_dir}",
            file=sys.stderr,
        )


def status(run_dir: Path) -> dict[str, Any]:
    """``{"state": "empty"|"interrupted"|"finished", "step": int|None, "steps": int|None}``.

    ``finished``: the final checkpoint (step >= train.steps of config.json) and ``final_eval.json``
    exist; ``interrupted``: config.json exists but not both; ``empty``: no config.json.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        return {"state": "empty", "step": None, "steps": None}
    steps = read_run_config(run_dir / "config.json").train.steps
    ckpt = ck.latest_checkpoint(run_dir)
    if ckpt is None:
        ck.explain_damage(run_dir)  # checkpoint folders, none complete: name what is wrong
    step = int(ck.load_state(ckpt, ("step",))["step"]) if ckpt is not None else None
    final = read_final_eval(run_dir)
    done = step is not None and step >= steps and final is not None and final.get("step") == step
    return {"state": "finished" if done else "interrupted", "step": step, "steps": steps}


def read_final_eval(run_dir: Path) -> dict[str, Any] | None:
    """``RUN/final_eval.json`` checked against :data:`replaid.schema.FINAL_EVAL`; None when absent."""
    f = Path(run_dir) / FINAL_EVAL
    if not f.is_file():
        return None
    fix = f"it is damaged: remove it, then 'replaid train --out {run_dir} --resume' evaluates the run again"
    final: dict[str, Any] = schema.read_json(f, schema.FINAL_EVAL, fix)
    return final


def recorded_final_eval(ckpt: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """The final evaluation recorded for checkpoint ``ckpt`` (``RUN/final_eval.json`` of its step; runs
    written before it existed kept it in ``state["final_eval"]``), or None."""
    ckpt = Path(ckpt)
    d = read_final_eval(ckpt.parent.parent) if ckpt.parent.name == "checkpoints" else None
    if d is not None and d.get("step") == state.get("step") and isinstance(d.get("eval"), dict):
        ev: dict[str, Any] = d["eval"]
        return ev
    return state.get("final_eval") or None


def write_final_eval(run_dir: Path, step: int, result: dict[str, Any]) -> None:
    atomic_write_text(Path(run_dir) / FINAL_EVAL, strict_dumps({"step": step, "eval": result}, indent=2))
