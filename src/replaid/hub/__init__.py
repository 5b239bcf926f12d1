"""Runs in and out of the Hugging Face ecosystem.

* :func:`resolve` turns what a command was given (a run directory, a checkpoint directory, an
  exported folder, or a Hub id ``owner/name[@revision]``) into a local directory. Hub ids go
  through ``huggingface_hub.snapshot_download``; offline (``HF_HUB_OFFLINE=1`` or no network) the
  local Hub cache is used, and a model that is not there ends in one ``CheckpointError`` line.
* :func:`from_pretrained` is the one Python call: ``run = replaid.hub.from_pretrained("owner/name")``
  gives ``run.model``, ``run.method`` and ``run.tokenizer`` (a :class:`replaid.loading.Run`).
* ``replaid.hub.export`` writes a run as a Hub folder; ``replaid.hub.peers`` converts the official
  MDLM / Duo checkpoints into such folders.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from replaid.training.checkpoint import CheckpointError

# owner/name with the Hub's allowed characters, optionally @revision
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")


def looks_like_hub_id(s: str) -> bool:
    return bool(_HUB_ID.match(str(s))) and not str(s).startswith((".", "/", "~"))


def resolve(path_or_id: str | os.PathLike) -> Path:
    """A local directory for ``path_or_id``: an existing path as is, else a Hub snapshot."""
    p = Path(path_or_id).expanduser()
    if p.exists() or not looks_like_hub_id(str(path_or_id)):
        return p  # local (a missing local path is reported by the checkpoint loader)
    repo_id, _, revision = str(path_or_id).partition("@")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise CheckpointError(f"{path_or_id} is not a local path and huggingface_hub is not installed; "
                              f"pip install huggingface_hub or pass a local folder") from None
    kw = dict(repo_id=repo_id, revision=revision or None)
    try:
        return Path(snapshot_download(**kw))
    except LocalEntryNotFoundError:
        pass  # offline mode (HF_HUB_OFFLINE=1) and not cached, or the Hub is unreachable
    except Exception as e:  # not found on the Hub, gated, network errors ...
        try:
            return Path(snapshot_download(**kw, local_files_only=True))
        except Exception:
            raise CheckpointError(f"cannot fetch {path_or_id} from the Hugging Face Hub "
                                  f"({e.__class__.__name__}) and it is not in the local cache; check the id, "
                                  f"or download it where online with 'hf download {repo_id}'") from None
    raise CheckpointError(f"{path_or_id} is neither a local path nor in the local Hugging Face cache and the Hub is "
                          f"unreachable (offline); download it with 'hf download {repo_id}' or pass a local folder")


def from_pretrained(path_or_id: str | os.PathLike, use_ema: bool = True, device: str = "auto"):
    """Load a run, an exported folder or a Hub id; returns a :class:`replaid.loading.Run` with
    ``.model``, ``.method``, ``.tokenizer`` (and ``.cfg``, ``.data`` for evaluation)."""
    from replaid.loading import load_run

    return load_run(path_or_id, use_ema=use_ema, device=device)
