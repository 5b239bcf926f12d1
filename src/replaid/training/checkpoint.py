"""Checkpoints that carry their own config and load without executing pickled code.

Layout of a run directory::

    RUN/config.json                 the resolved config
    RUN/tokenizer/                  what rebuilds the tokenizer
    RUN/checkpoints/step_000100/    model / ema / optimizer / rng as safetensors + state.json
    RUN/checkpoints/LATEST          name of the newest complete checkpoint

A checkpoint is written into a temporary directory, fsynced, renamed into place, and only then
named in ``LATEST`` (itself replaced atomically): a crash mid-write leaves the previous one intact.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file


class CheckpointError(ValueError):
    """A missing, damaged or incompatible checkpoint (one-line message with the fix)."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    except OSError:
        pass


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2))


def optimizer_to_tensors(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Flatten an optimizer state dict into named tensors + a JSON-able remainder."""
    tensors, meta = {}, {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        meta["state"][str(pid)] = {}
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
                meta["state"][str(pid)][k] = "tensor"
            else:
                meta["state"][str(pid)][k] = v
    return tensors, meta


def optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state = {}
    for pid, st in meta["state"].items():
        key = int(pid) if pid.isdigit() else pid  # torch's integer ids, or parameter names
        state[key] = {k: (tensors[f"{pid}.{k}"] if v == "tensor" else v) for k, v in st.items()}
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run_dir: Path, step: int, model_sd: dict, state: dict,
                    ema_sd: Optional[dict] = None, opt_sd: Optional[dict] = None,
                    rng: Optional[dict[str, torch.Tensor]] = None, keep: int = 2) -> Path:
    """Atomically write checkpoint ``step``; returns its directory."""
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=ckdir))
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in model_sd.items()}, str(tmp / "model.safetensors"))
        if ema_sd is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in ema_sd.items()}, str(tmp / "ema.safetensors"))
        if opt_sd is not None:
            tensors, meta = optimizer_to_tensors(opt_sd)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            _write_json(tmp / "optimizer.json", meta)
        if rng:
            save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
        _write_json(tmp / "state.json", {**state, "step": step})
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = ckdir / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        latest_tmp = ckdir / ".LATEST.tmp"
        latest_tmp.write_text(name)
        with open(latest_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(latest_tmp, ckdir / "LATEST")
        _fsync_dir(ckdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # prune old complete checkpoints
    done = sorted(p for p in ckdir.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def find_checkpoint(path: str | Path) -> Path:
    """Accept a run directory, its ``checkpoints/`` folder or one checkpoint directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"no run or checkpoint at {p}; pass a run directory made by 'replaid train --out DIR'")
    if (p / "state.json").is_file() and (p / "model.safetensors").is_file():
        return p
    for ckdir in (p / "checkpoints", p):
        latest = ckdir / "LATEST"
        if latest.is_file():
            c = ckdir / latest.read_text().strip()
            if (c / "state.json").is_file():
                return c
    raise CheckpointError(f"{p} holds no complete checkpoint (no checkpoints/LATEST); train first or pass another run")


def load_state(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt} has an unreadable state.json ({e.__class__.__name__}); "
                              f"it is damaged: use an earlier checkpoint") from None


def load_tensors(ckpt: Path, name: str) -> Optional[dict[str, torch.Tensor]]:
    f = ckpt / f"{name}.safetensors"
    if not f.is_file():
        return None
    try:
        return load_file(str(f))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"checkpoint file {f} cannot be read ({e.__class__.__name__}); it is damaged") from None


def load_model_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor], where: str) -> None:
    """Strict load with a one-line error for a checkpoint of another model."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    bad = [k for k in own if k in sd and tuple(own[k].shape) != tuple(sd[k].shape)]
    if missing or unexpected or bad:
        detail = (f"missing {missing[:2]}" if missing else f"unexpected {unexpected[:2]}" if unexpected
                  else f"shape of {bad[0]} is {tuple(sd[bad[0]].shape)} vs {tuple(own[bad[0]].shape)}")
        raise CheckpointError(f"checkpoint {where} does not match this model ({detail}); "
                              f"it was written by another model or config: load it with its own config.json")
    model.load_state_dict(sd, strict=True)
