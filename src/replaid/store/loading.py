"""Load a trained run (config + tokenizer + weights) for evaluation and sampling.

``path`` may be a run directory, a checkpoint directory, a folder made by ``replaid export`` or
``replaid convert``, or a Hugging Face Hub id (:func:`resolve`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from replaid.config import ConfigError, RunConfig
from replaid.data.pipeline import DataPipeline, tokenizer_mismatch
from replaid.data.sources import hub_unreachable
from replaid.data.tokenizers import Tokenizer
from replaid.methods import get_method
from replaid.methods.base import Method
from replaid.store import checkpoint as ck
from replaid.store.checkpoint import CheckpointError


def resolve_device(name: str) -> torch.device:
    """``train.device`` (or ``--device``) as a device: ``auto`` is CUDA where there is one; a CUDA name on a
    machine without one is one line."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but this machine has no CUDA device; use train.device=cpu or auto")
    return torch.device(name)


def check_tokenizer(data: DataPipeline, state: dict[str, Any], ckpt: Path) -> None:
    """Refuse a tokenizer whose files (or vocabulary) differ from those checkpoint ``ckpt`` recorded
    (TS1: another run's tokenizer decodes the same ids to other text); a warning under
    ``replaid --no-verify``. Checkpoints written before the hashes were recorded pass unchecked."""
    binding = state.get("binding")
    why = tokenizer_mismatch(binding.get("tokenizer") if isinstance(binding, dict) else None, data.tokenizer_binding())
    if not why:
        return
    where = data.run_dir / "tokenizer" if data.run_dir is not None else "the tokenizer"
    msg = f"{where} is not the tokenizer checkpoint {ckpt} was trained with ({why} in its state.json)"
    if not ck.VERIFY:
        ck.warn(f"{msg}; used anyway (--no-verify): its output may be other text")
        return
    raise ck.CheckpointError(
        f"{msg}: the same ids would decode to other text; restore the run's own tokenizer/ folder, "
        f"or pass 'replaid --no-verify' to use this one anyway"
    )


@dataclass
class Run:
    cfg: RunConfig
    model: torch.nn.Module
    method: Method[Any]
    data: DataPipeline
    ckpt: Path
    step: int
    ema_loaded: bool
    student: tuple[str, int] | None = None  # a distilled student's (sampler, steps): what it is sampled with

    @property
    def default_steps(self) -> int | None:
        """The steps a request that names none runs at: a student's own (None: the request's default)."""
        return self.student[1] if self.student is not None else None

    @property
    def default_sampler(self) -> str | None:
        """The sampler a request that names none runs: a student's own (None: the method's first)."""
        return self.student[0] if self.student is not None else None

    @property
    def tokenizer(self) -> Tokenizer:
        tok: Tokenizer = self.data.tokenizer
        return tok


# owner/name with the Hub's allowed characters, optionally @revision
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")


def looks_like_hub_id(s: str) -> bool:
    return bool(_HUB_ID.match(str(s))) and not str(s).startswith((".", "/", "~"))


def resolve(path_or_id: str | os.PathLike[str]) -> Path:
    """A local directory for ``path_or_id``: an existing path as is, else a Hub snapshot."""
    p = Path(path_or_id).expanduser()
    if p.exists() or not looks_like_hub_id(str(path_or_id)):
        return p  # local (a missing local path is reported by the checkpoint loader)
    repo_id, _, revision = str(path_or_id).partition("@")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise CheckpointError(
            f"{path_or_id} is not a local path and huggingface_hub is not installed; "
            f"pip install huggingface_hub or pass a local folder"
        ) from None
    kw: dict[str, Any] = dict(repo_id=repo_id, revision=revision or None)

    def cached(message: str) -> Path:
        """The snapshot in the local cache, else a CheckpointError with ``message``."""
        try:
            return Path(snapshot_download(**kw, local_files_only=True))
        except Exception:
            raise CheckpointError(message) from None

    if why := hub_unreachable():  # the cache, or one line at once (not minutes of retries)
        return cached(
            f"{path_or_id} is not a local path and {why}; pass a local folder, or set HF_HUB_OFFLINE=1 "
            f"with a copy in the local Hugging Face cache ('hf download {repo_id}' where online)"
        )
    try:
        return Path(snapshot_download(**kw))
    except LocalEntryNotFoundError:
        pass  # offline mode (HF_HUB_OFFLINE=1) and not cached, or the Hub is unreachable
    except Exception as e:  # not found on the Hub, gated, network errors ...
        return cached(
            f"cannot fetch {path_or_id} from the Hugging Face Hub "
            f"({e.__class__.__name__}) and it is not in the local cache; check the id, "
            f"or download it where online with 'hf download {repo_id}'"
        )
    raise CheckpointError(
        f"{path_or_id} is neither a local path nor in the local Hugging Face cache and the Hub is "
        f"unreachable (offline); download it with 'hf download {repo_id}' or pass a local folder"
    )


def run_dir_of(ckpt: Path) -> Path:
    """The run folder that holds checkpoint ``ckpt`` (its tokenizer's): ``RUN/checkpoints/step_N`` -> ``RUN``;
    a checkpoint reached through a symlink elsewhere -> its target's run; anything else is its own folder."""
    if ckpt.parent.name == "checkpoints":
        return ckpt.parent.parent
    real = ckpt.resolve()
    return real.parent.parent if real != ckpt.absolute() and real.parent.name == "checkpoints" else ckpt


def load_run(path: str | Path, use_ema: bool = True, train_data: bool = False, device: str = "auto") -> Run:
    """``path``: a run or checkpoint directory, a folder made by ``replaid export``, or a Hub id. ``device``:
    ``auto`` keeps the run's ``train.device`` where this machine has it (else CUDA if present, else CPU)."""
    stored = ck.Stored.open(resolve(path))
    ckpt, st = stored.path, stored.state
    cfg = stored.config()
    if device == "auto":  # the training device when this machine has it: a GPU-trained run loads on a CPU box
        recorded = cfg.train.device
        device = "auto" if recorded.startswith("cuda") and not torch.cuda.is_available() else recorded
    cfg.train.device = device
    dev = resolve_device(device)
    data = DataPipeline(cfg, run_dir_of(ckpt), train=train_data)  # its own tokenizer/, never a new one
    check_tokenizer(data, st, ckpt)  # TS1: the files the checkpoint recorded
    if data.vocab_size != st["vocab_size"]:
        raise ck.CheckpointError(
            f"checkpoint {ckpt} was trained with vocab size {st['vocab_size']} but its "
            f"tokenizer now has {data.vocab_size}; restore the run's tokenizer/ folder"
        )
    method = get_method(cfg)
    model = method.build_model(st["vocab_size"])
    weights, from_ema = stored.weights(ema=use_ema)
    ema_loaded = from_ema or st.get("weights") == "ema"  # exported folders say which
    ck.load_model_weights(model, weights, str(ckpt))
    if "method_state" in st:
        try:  # D31: a damaged method state is one line naming the file and the field, not a KeyError
            method.load_state_dict(st["method_state"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            why = str(e) if isinstance(e, ValueError) else f"{e.__class__.__name__}: {e}"
            raise ck.CheckpointError(
                f"{ckpt / 'state.json'}: {why}; the checkpoint's method state is damaged: restore the file "
                f"or use an earlier checkpoint"
            ) from None
    model.to(dev).eval()
    return Run(cfg, model, method, data, ckpt, stored.step, ema_loaded, student_of(st))


def student_of(state: dict[str, Any]) -> tuple[str, int] | None:
    """(sampler, steps) of a ``replaid distill`` student from its checkpoint's ``distill`` section (progressive:
    DDIM at its last round's steps; consistency: multistep consistency sampling), None for any other run."""
    d = state.get("distill")
    if not isinstance(d, dict) or not isinstance(d.get("student_steps"), int):
        return None
    return ("consistency" if d.get("method") == "consistency" else "ddim"), int(d["student_steps"])
