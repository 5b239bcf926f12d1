"""Crash-safe file writes: a file is either its old content or its complete new content, never a
truncated mix (write a temporary file in the same folder, fsync it, ``os.replace`` it in, fsync the
folder). Temporaries are named ``.NAME.tmp.PID`` so a later run can recognise and remove them."""

from __future__ import annotations

import os
from pathlib import Path

TMP_MARK = ".tmp."


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside ``path`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically and durably."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete ``.NAME.tmp.PID`` files that an interrupted :func:`atomic_write_bytes` left in ``folder``.
    Call only while holding the folder's lock (another writer's temporary would look the same)."""
    gone = []
    folder = Path(folder)
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(".") and TMP_MARK in p.name and p.is_file():
                p.unlink(missing_ok=True)
                gone.append(p)
    return gone
