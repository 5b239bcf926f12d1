"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), written by FSDP2 runs.

A sharded checkpoint is a ``step_N`` folder like the single-file one (``state.json`` with the sha256
of every file, ``rng.safetensors``), whose tensors live in ``sharded/``: one ``__R_0.distcp`` file per
rank and DCP's ``.metadata``, holding ``{"model": ..., "ema": ..., "optim": ...}`` as
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives them (parameter names as keys, as in
torchtitan's checkpoints). Every rank writes its own shards and no rank gathers the full state. DCP
re-shards on load, so a checkpoint saved on N ranks resumes on any other number (or one process).

Nothing is unpickled on load: DCP reads the tensor files as raw storage and its small non-tensor
items with ``torch.load(weights_only=True)``; its ``.metadata`` file, which DCP itself reads with
``pickle.load``, is read here by :class:`SafeReader` through an unpickler that admits only DCP's own
metadata classes, torch dtypes and sizes, and refuses anything else (one-line error).
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

SHARDED_DIR = "sharded"  # inside a step_N folder
METADATA = ".metadata"


def _dist() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextmanager
def _one_process_quiet() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class UnsafeCheckpoint(ValueError):
    """DCP metadata that names a global outside the allow-list (never loaded)."""


def _allowed(module: str, name: str) -> bool:
    if module == "torch.distributed.checkpoint.metadata":
        import torch.distributed.checkpoint.metadata as m

        obj = getattr(m, name, None)
        return isinstance(obj, type) and obj.__module__ == module
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
    return (module, name) in {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise UnsafeCheckpoint(f"{module}.{name}")
        return super().find_class(module, name)


def read_metadata(path: Path) -> Metadata:
    """DCP's ``.metadata`` of ``path`` (a ``sharded/`` folder) through the restricted unpickler."""
    f = Path(path) / METADATA
    try:
        md = _MetadataUnpickler(io.BytesIO(f.read_bytes())).load()
    except UnsafeCheckpoint as e:
        raise UnsafeCheckpoint(
            f"{f} names {e}, which is not DCP checkpoint metadata: it was not written by replaid and is not "
            f"loaded (nothing was executed)"
        ) from None
    except Exception as e:
        raise UnsafeCheckpoint(f"{f} cannot be read ({why(e)}); the checkpoint is damaged") from None
    if not isinstance(md, Metadata):
        raise UnsafeCheckpoint(f"{f} holds a {type(md).__name__}, not DCP checkpoint metadata")
    return md


class SafeReader(FileSystemReader):
    """DCP's file-system reader with :func:`read_metadata` in place of its ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpoint("per-rank DCP metadata files are not read")
        md = read_metadata(Path(self.path))
        meta = getattr(md, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        md.storage_meta = meta
        return md


def read_errors() -> tuple[type[BaseException], ...]:
    """What a DCP read raises on a damaged checkpoint: DCP's ``CheckpointException`` (a BaseException, so
    ``except Exception`` lets it through as a traceback: a truncated or deleted shard under
    ``--no-verify``) and the errors of reading the files."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (CheckpointException, Exception)


def why(e: BaseException) -> str:
    """One line for a DCP read error: the first rank's own error (``EOFError``, ``FileNotFoundError: ...``),
    not the multi-line traceback text of ``CheckpointException``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        e = inner[0] if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException) else e
    text = " ".join(str(e).split())[:160]
    return f"{e.__class__.__name__}: {text}" if text else e.__class__.__name__


def save(path: Path, state_dict: dict[str, Any]) -> None:
    """Write ``state_dict`` (DTensors as this rank's shards) into ``path`` on every rank (a collective)."""
    with _one_process_quiet():
        dcp.save(state_dict, checkpoint_id=str(path), no_dist=not _dist())


def load(path: Path, state_dict: dict[str, Any]) -> None:
    """Fill ``state_dict`` in place from ``path`` (DTensors get their shards, plain tensors the full
    tensor): a collective under torch.distributed, a plain read in one process."""
    with _one_process_quiet():
        dcp.load(state_dict, storage_reader=SafeReader(str(path)), no_dist=not _dist())


def stored_keys(path: Path) -> dict[str, tuple[str | int, ...]]:
    """Flat DCP key -> its path in the nested state dict (e.g. ``("model", "backbone.x.weight")``)."""
    md = read_metadata(Path(path))
    return dict(md.planner_data or {})


def load_full(path: Path, part: str) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) CPU tensors of ``part`` (``"model"`` or ``"ema"``) in one process, or None
    when the checkpoint has none."""
    md = read_metadata(Path(path))
    want: dict[str, torch.Tensor] = {}
    for flat, where in (md.planner_data or {}).items():
        if len(where) == 2 and where[0] == part:
            meta = md.state_dict_metadata[flat]
            size, props = getattr(meta, "size", None), getattr(meta, "properties", None)
            if size is None or props is None:
                continue
            want[str(where[1])] = torch.empty(tuple(size), dtype=props.dtype)
    if not want:
        return None
    sd = {part: want}
    with _one_process_quiet():
        dcp.load(sd, storage_reader=SafeReader(str(path)), no_dist=True)
    return sd[part]
