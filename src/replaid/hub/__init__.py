"""Runs in and out of the Hugging Face ecosystem.

* :func:`resolve` (from :mod:`replaid.store.loading`) turns what a command was given (a run directory, a checkpoint directory, an
  exported folder, or a Hub id ``owner/name[@revision]``) into a local directory. Hub ids go
  through ``huggingface_hub.snapshot_download``; offline (``HF_HUB_OFFLINE=1`` or no network) the
  local Hub cache is used, and a model that is not there ends in one ``CheckpointError`` line.
* :func:`from_pretrained` is the one Python call: ``run = replaid.hub.from_pretrained("owner/name")``
  gives ``run.model``, ``run.method`` and ``run.tokenizer`` (a :class:`replaid.store.loading.Run`).
* ``replaid.hub.export`` writes a run as a Hub folder; ``replaid.hub.peers`` converts the official
  MDLM / Duo checkpoints into such folders.
"""

from __future__ import annotations

import os

from replaid.store.loading import Run, load_run, looks_like_hub_id, resolve

__all__ = ["Run", "from_pretrained", "looks_like_hub_id", "resolve"]


def from_pretrained(path_or_id: str | os.PathLike[str], use_ema: bool = True, device: str = "auto") -> Run:
    """Load a run, an exported folder or a Hub id; returns a :class:`replaid.store.loading.Run` with
    ``.model``, ``.method``, ``.tokenizer`` (and ``.cfg``, ``.data`` for evaluation)."""
    return load_run(os.fspath(path_or_id), use_ema=use_ema, device=device)
