"""Checkpoints that carry their own config and load without executing pickled code.

Layout of a run directory::

    RUN/config.json                 the resolved config
    RUN/tokenizer/                  what rebuilds the tokenizer
    RUN/checkpoints/step_0000100/   model / ema / optimizer / rng as safetensors + state.json; or, written
                                    by an FSDP2 run, rng.safetensors + state.json + sharded/ (DCP shards,
                                    ``store/sharded.py``: every rank writes its own, none gathers)
    RUN/checkpoints/LATEST          name of the newest complete checkpoint (a ``step_N`` of this run)

Guarantees (each tested by fault injection in ``tests/test_crash_safety.py``):

* a checkpoint is written into a temporary ``.step_N.*`` folder, fsynced, renamed into place, and
  only then named in ``LATEST`` (itself replaced atomically); the folder ``LATEST`` names is never
  removed or replaced, so a crash at any point leaves a loadable run;
* the same step is never written twice (a second save of the step ``LATEST`` names is a no-op);
* a checkpoint with a NaN/Inf weight is never written;
* ``state.json`` records the sha256 of every file of the checkpoint (``"sha256": {file: hex}``) and of
  its own ``config`` (the entry :data:`CONFIG_DIGEST`, over the canonical JSON of the config); a load
  checks each file against it and names a file that changed (a flipped bit, a truncation), a config
  edited after it was written, a recorded file that is missing and a file the record does not list, in
  one line, unless verification is off (``replaid --no-verify``: :data:`VERIFY`). A record written before
  the config entry need list only the tensor files;
* a checkpoint inside a run agrees with the run's ``config.json`` on every key that defines the model and
  its data (:func:`identity_difference`): ``sample``, ``eval`` and ``export`` refuse one that does not,
  naming the key, and ``train --resume`` refuses any difference but ``train.steps`` and the
  ``train.grad_accum`` it carries over;
* when ``LATEST`` is missing, names something outside ``checkpoints/`` or an incomplete folder, the
  newest complete ``step_N`` is used and a warning says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from replaid import dist, schema
from replaid.config import ConfigError, RunConfig, read_run_config
from replaid.fileio import atomic_write_text, fsync_dir, fsync_file
from replaid.schema import dumps as strict_dumps
from replaid.store import sharded

STEP_NAME = re.compile(r"step_\d{7,}")
VERIFY = True  # check tensor files against the sha256 in state.json (``replaid --no-verify`` turns it off)
STATE_KEYS = ("step", "config", "method", "vocab_size", "method_state", "data_state")  # what resuming needs
CONFIG_DIGEST = "state.json#config"  # the sha256 record's entry for state.json's own config
TENSOR_SUFFIXES = (".safetensors", ".distcp")  # what a record written before CONFIG_DIGEST had to list
NOT_IDENTITY = ("preset", "optim", "train", "eval", "data.cache_dir")  # the rest defines the model and its data
# what train --resume lets differ from the checkpoint's config: train.steps (the one override), the
# train.grad_accum it carries over to another rank count, and how the run is watched and run (cadence of
# logs, evaluations and saves, threads, trackers, device, the non-finite streak): none changes what is trained
RESUME_MAY_CHANGE = (
    "train.steps", "train.grad_accum", "train.log_every", "train.eval_every", "train.save_every",
    "train.num_threads", "train.logger", "train.wandb_project", "train.device", "train.max_nonfinite_steps",
)  # fmt: skip
OPTIONAL_FILES = ("optimizer.json", "optimizer.safetensors", "rng.safetensors")  # --resume-weights-only goes on


class CheckpointError(ValueError):
    """A missing, damaged or incompatible checkpoint (one-line message with the fix)."""


def warn(msg: str) -> None:
    print(f"replaid: warning: {msg}", file=sys.stderr, flush=True)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(strict_dumps(obj, indent=2))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_digest(config: Any) -> str:
    """sha256 of a config's canonical JSON (sorted keys, no spaces): what :data:`CONFIG_DIGEST` records."""
    return hashlib.sha256(strict_dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def checkpoint_files(ckpt: Path, tensors_only: bool = False) -> list[str]:
    """The files of checkpoint ``ckpt`` its record must list (relative, POSIX): its ``*.safetensors`` and
    ``optimizer.json``, and every file under ``sharded/`` (an exported folder's other files, its
    ``config.json`` and tokenizer, are not the checkpoint's). ``tensors_only``: those a record written
    before :data:`CONFIG_DIGEST` listed."""
    out = [f.name for f in ckpt.glob("*.safetensors") if f.is_file()]
    if (ckpt / "optimizer.json").is_file():
        out.append("optimizer.json")
    if (ckpt / sharded.SHARDED_DIR).is_dir():
        out += [f.relative_to(ckpt).as_posix() for f in (ckpt / sharded.SHARDED_DIR).rglob("*") if f.is_file()]
    if tensors_only:
        out = [f for f in out if f.endswith(TENSOR_SUFFIXES) or f.endswith(f"/{sharded.METADATA}")]
    return sorted(out)


def check_record(ckpt: Path, state: dict[str, Any]) -> None:
    """The sha256 record of ``state`` against the checkpoint (when :data:`VERIFY`): the config it covers
    unchanged, every file it lists there, every file of the checkpoint listed (:func:`checkpoint_files`).
    The files' contents are checked as they are read."""
    rec = state.get("sha256")
    if not VERIFY or not isinstance(rec, dict):
        return
    f = ckpt / "state.json"
    fix = f"remove {ckpt} to fall back on an earlier checkpoint, or pass 'replaid --no-verify' to load it unchecked"
    if CONFIG_DIGEST in rec and "config" in state and config_digest(state["config"]) != rec[CONFIG_DIGEST]:
        raise CheckpointError(
            f'checkpoint file {f}: field "config" does not match the sha256 recorded with it ({CONFIG_DIGEST}): '
            f"it was edited after the checkpoint was written; restore it, or {fix}"
        )
    for rel in rec:
        if rel == CONFIG_DIGEST:
            continue
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise CheckpointError(
                f'checkpoint file {f}: field "sha256" names {rel[:80]!r}, not a file of {ckpt}; {fix}'
            )
        if not (ckpt / rel).is_file() and rel not in OPTIONAL_FILES:  # their absence: _resume names it
            raise CheckpointError(
                f"checkpoint file {ckpt / rel} is recorded in {f} but missing: the checkpoint is incomplete; {fix}"
            )
    unlisted = [r for r in checkpoint_files(ckpt, tensors_only=CONFIG_DIGEST not in rec) if r not in rec]
    if unlisted:
        raise CheckpointError(
            f'checkpoint file {f}: field "sha256" records no sha256 of {unlisted[0]} (a record lists every file of '
            f"the checkpoint, so that none is loaded unchecked); {fix}"
        )


def flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config dict as dotted keys (``mdlm.block_size``) and their values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _exempt(key: str, keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in keys)


def config_difference(a: RunConfig, b: RunConfig, exempt: tuple[str, ...]) -> tuple[str, Any, Any] | None:
    """The first key (dotted, sorted) on which two configs differ, outside ``exempt`` (keys or sections):
    ``(key, a's value, b's value)``, a key one of them lacks given as None; None when they agree."""
    fa, fb = flat_config(a.to_dict()), flat_config(b.to_dict())
    for k in sorted(set(fa) | set(fb)):
        if not _exempt(k, exempt) and fa.get(k) != fb.get(k):
            return k, fa.get(k), fb.get(k)
    return None


def identity_difference(a: RunConfig, b: RunConfig) -> tuple[str, Any, Any] | None:
    """:func:`config_difference` on the keys that define the model and its data: the method, ``model.*``,
    ``data.*`` (but where the caches live) and the method's section (block size, ...)."""
    return config_difference(a, b, NOT_IDENTITY)


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def nonfinite_tensor(sd: dict[str, torch.Tensor] | None) -> str | None:
    """The name of the first floating-point tensor of ``sd`` holding a NaN or Inf, else None."""
    for k, v in (sd or {}).items():
        if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
            return k
    return None


def optimizer_to_tensors(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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


def optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state = {}
    for pid, st in meta["state"].items():
        key = int(pid) if pid.isdigit() else pid  # torch's integer ids, or parameter names
        state[key] = {k: (tensors[f"{pid}.{k}"] if v == "tensor" else v) for k, v in st.items()}
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    run_dir: Path,
    step: int,
    model_sd: dict[str, torch.Tensor],
    state: dict[str, Any],
    ema_sd: dict[str, torch.Tensor] | None = None,
    opt_sd: dict[str, Any] | None = None,
    rng: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
    milestones: Collection[int] = (),
) -> Path:
    """Write checkpoint ``step`` and name it in ``LATEST``; returns its directory. ``keep``: the newest
    checkpoints kept; ``milestones``: steps kept besides them (a progressive distillation's rounds).

    Never writes NaN/Inf weights (:class:`CheckpointError`), never rewrites the step ``LATEST``
    already names, never removes the folder ``LATEST`` names. The caller holds the run's lock.
    """
    for what, sd in (("model", model_sd), ("EMA", ema_sd)):
        bad = nonfinite_tensor(sd)
        if bad is not None:
            raise CheckpointError(f"refusing to write checkpoint step {step}: {what} tensor {bad} holds NaN/Inf")
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    name = step_name(step)
    final = ckdir / name
    current, _ = read_latest(ckdir)
    if current is not None and current.name == name:
        return final  # this step is saved and in force already
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=ckdir))
    trash = None
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
        trash = _commit(tmp, final, {**state, "step": step})
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (OSError, SafetensorError)):  # e.g. a full disk: the checkpoint in force is intact
            raise _write_error(name, ckdir, e) from e
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    _prune(ckdir, step, keep, milestones)
    return final


def _write_error(name: str, ckdir: Path, e: BaseException) -> CheckpointError:
    return CheckpointError(
        f"could not write checkpoint {name} into {ckdir} ({e.__class__.__name__}: {e}); "
        f"the previous one (LATEST) is intact: free disk space, then --resume"
    )


def _commit(tmp: Path, final: Path, state: dict[str, Any]) -> Path | None:
    """Record the sha256 of every file of ``tmp`` in its state.json (written last), fsync it all,
    rename it to ``final`` and name it in ``LATEST``. Returns the folder a stale ``final`` was moved
    into (to remove once LATEST names the new one), if any."""
    ckdir, name = final.parent, final.name
    files = sorted(f for f in tmp.rglob("*") if f.is_file())
    hashes = {f.relative_to(tmp).as_posix(): sha256_file(f) for f in files}  # every file of the checkpoint
    if "config" in state:
        hashes[CONFIG_DIGEST] = config_digest(state["config"])  # and state.json's own config
    _write_json(tmp / "state.json", {**state, "sha256": hashes})
    for f in [*files, tmp / "state.json"]:
        fsync_file(f)
    for d in sorted({f.parent for f in files} | {tmp}, key=lambda d: -len(d.parts)):
        fsync_dir(d)
    trash = None
    if final.exists():  # left by a save that died before naming it in LATEST: set aside, not deleted
        trash = Path(tempfile.mkdtemp(prefix=f".trash.{name}.", dir=ckdir))
        os.rename(final, trash / name)
    os.rename(tmp, final)
    fsync_dir(ckdir)
    atomic_write_text(ckdir / "LATEST", name)
    return trash


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    state_dict: dict[str, Any],
    state: dict[str, Any],
    rng: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
) -> Path | None:
    """Write checkpoint ``step`` in the sharded format on every rank (a collective): each rank writes
    its shards of ``state_dict`` (``{"model", "optim", "ema"}``, DTensors) through DCP into
    ``.step_N.sharded/sharded/``; then rank 0 adds ``rng.safetensors`` and ``state.json`` (the sha256 of
    every file), renames the folder to ``step_N`` and names it in ``LATEST``: the same guarantees as
    :func:`save_checkpoint` (a crash before the rename leaves the checkpoint in force as it was; the
    next save removes the torn folder). Returns the folder on rank 0, None on the others."""
    local = {
        f"{part}.{k}": (v.to_local() if hasattr(v, "to_local") else v)
        for part in ("model", "ema")
        for k, v in (state_dict.get(part) or {}).items()
    }
    bad = nonfinite_tensor(local)
    flag = dist.all_reduce_sum(torch.tensor([0.0 if bad is None else 1.0]))
    if float(flag[0]) > 0:
        raise CheckpointError(f"refusing to write checkpoint step {step}: a model or EMA tensor holds NaN/Inf")
    ckdir = Path(run_dir) / "checkpoints"
    name = step_name(step)
    final, tmp = ckdir / name, ckdir / f".{name}.sharded"
    current, _ = read_latest(ckdir)
    if current is not None and current.name == name:
        return final if dist.is_main() else None
    if dist.is_main():
        ckdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a torn one, left by a save that died
        tmp.mkdir()
    dist.barrier()
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        sharded.save(tmp / sharded.SHARDED_DIR, state_dict)
    except (OSError, CheckpointException) as e:
        if dist.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(name, ckdir, e) from e
    if not dist.is_main():
        return None
    trash = None
    try:
        if rng:
            save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
        trash = _commit(tmp, final, {**state, "step": step, "format": "dcp"})
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (OSError, SafetensorError)):
            raise _write_error(name, ckdir, e) from e
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    _prune(ckdir, step, keep)
    return final


def set_aside(run_dir: Path, step: int, dest: Path) -> tuple[Path, Path | None]:
    """Take checkpoint ``step`` out of force without deleting it: ``LATEST`` first names the newest
    complete checkpoint before it (or is removed when there is none), then the folder moves to
    ``dest/step_N`` (``step_N.1``, ... when taken). Returns (where it went, the checkpoint now in force)."""
    ckdir = Path(run_dir) / "checkpoints"
    name = step_name(step)
    earlier = [c for c in complete_checkpoints(ckdir) if _step_of(c) < step]
    if earlier:
        atomic_write_text(ckdir / "LATEST", earlier[-1].name)
    else:
        (ckdir / "LATEST").unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    target, n = dest / name, 0
    while os.path.lexists(target):
        n += 1
        target = dest / f"{name}.{n}"
    os.rename(ckdir / name, target)
    fsync_dir(ckdir)
    return target, (earlier[-1] if earlier else None)


def _prune(ckdir: Path, step: int, keep: int, milestones: Collection[int] = ()) -> None:
    """Keep the newest ``keep`` checkpoints up to ``step`` (the one LATEST names is the newest) and those
    at ``milestones``; remove those beyond ``step``, left by an attempt that never named them in LATEST."""
    done = complete_checkpoints(ckdir)
    older = [c for c in done if _step_of(c) <= step]
    stale = [c for c in (older[:-keep] if keep > 0 else []) if _step_of(c) not in milestones]
    doomed = [c for c in done if _step_of(c) > step] + stale
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_", 1)[1])


def is_complete(ckpt: Path) -> bool:
    """A ``step_N`` folder whose state.json parses (written last, before the rename) with its weights; a
    field of the wrong type is damage, not incompleteness: :func:`load_state` names it."""
    try:
        st = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(st, dict) and "step" in st and has_weights(ckpt)


def has_weights(ckpt: Path) -> bool:
    """Whether ``ckpt`` holds weights: ``model.safetensors``, or DCP shards (``sharded/.metadata``)."""
    return (ckpt / "model.safetensors").is_file() or (ckpt / sharded.SHARDED_DIR / sharded.METADATA).is_file()


def complete_checkpoints(ckdir: Path) -> list[Path]:
    """The complete ``step_N`` folders of ``ckdir``, oldest first."""
    if not Path(ckdir).is_dir():
        return []
    found = [p for p in Path(ckdir).iterdir() if STEP_NAME.fullmatch(p.name) and p.is_dir() and is_complete(p)]
    return sorted(found, key=_step_of)


def read_latest(ckdir: Path) -> tuple[Path | None, str]:
    """``(checkpoint LATEST names, "")`` or ``(None, what is wrong with LATEST)``."""
    f = Path(ckdir) / "LATEST"
    if not f.is_file():
        return None, f"{f} is missing"
    try:
        name = f.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None, f"{f} is unreadable"
    if not STEP_NAME.fullmatch(name):  # also refuses ../other-run/... : LATEST stays inside this run
        return None, f"{f} names {name[:60]!r}, not a step_N checkpoint of this run"
    if not is_complete(Path(ckdir) / name):
        return None, f"{f} names {name}, which is missing or incomplete"
    return Path(ckdir) / name, ""


def check_readable(ckdir: Path) -> None:
    """Refuse a ``checkpoints/`` that is there but cannot be listed (a symlink loop, a dangling link, a
    file, no permission): an error naming it, never "no checkpoint yet" (a fresh start over the run)."""
    if not os.path.lexists(ckdir):
        return
    try:
        os.listdir(ckdir)
    except OSError as e:
        raise CheckpointError(
            f"{ckdir} cannot be read ({e.strerror or e.__class__.__name__}); restore it as the folder of the "
            f"run's step_N checkpoints, or move it away and start again with --overwrite"
        ) from None


def latest_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint in force in a run (LATEST, else the newest complete one, saying so), or None.
    A ``checkpoints/`` that cannot be read is an error (:func:`check_readable`)."""
    p = Path(path)
    ckdir = p if p.name == "checkpoints" else p / "checkpoints"
    check_readable(ckdir)
    ckpt, problem = read_latest(ckdir)
    if ckpt is not None:
        return ckpt
    done = complete_checkpoints(ckdir)
    if done:
        warn(f"{problem}; using the newest complete checkpoint {done[-1]}")
        return done[-1]
    return None


def find_checkpoint(path: str | Path) -> Path:
    """Accept a run directory, its ``checkpoints/`` folder or one checkpoint directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"no run or checkpoint at {p}; pass a run directory made by 'replaid train --out DIR'")
    if not p.is_dir():
        raise CheckpointError(
            f"{p} is a file, not a run or checkpoint folder; pass the folder that holds it ({p.parent})"
        )
    if (p / "state.json").is_file() and has_weights(p):
        return p
    ckpt = latest_checkpoint(p)
    if ckpt is None:
        explain_damage(p)
        raise CheckpointError(
            f"{p} holds no complete checkpoint (no checkpoints/step_N with state.json and "
            f"weights); train it first ('replaid train --out {p} --resume') or pass another run"
        )
    return ckpt


def explain_damage(path: Path) -> None:
    """When a run has checkpoint folders but none complete, raise the error that names what is wrong
    with the newest (its state.json, a missing weights file)."""
    ckdir = path if path.name == "checkpoints" else path / "checkpoints"
    dirs = (
        sorted((c for c in ckdir.glob("step_*") if STEP_NAME.fullmatch(c.name) and c.is_dir()), key=_step_of)
        if ckdir.is_dir()
        else []
    )
    if dirs:
        load_state(dirs[-1], need=("step",))
        raise CheckpointError(
            f"checkpoint {dirs[-1]} is incomplete (no model.safetensors or sharded/) and no other is complete; "
            f"restore it, or start again with --overwrite"
        )


def load_state(ckpt: Path, need: tuple[str, ...] = ("step",)) -> dict[str, Any]:
    """state.json of ``ckpt``, checked against its schema (:data:`replaid.schema.STATE`) and to hold
    ``need``; the sha256 record may be absent only under ``replaid --no-verify``."""
    f = ckpt / "state.json"
    fix = f"it is damaged or foreign: remove {ckpt} to fall back on an earlier checkpoint"
    try:
        state: dict[str, Any] = schema.read_json(
            f, schema.STATE, fix, optional=() if VERIFY else ("sha256",), need=need
        )
    except schema.SchemaError as e:
        also = ", or pass 'replaid --no-verify' to load it unchecked" if '"sha256"' in str(e) else ""
        raise CheckpointError(f"checkpoint file {e}{also}") from None
    check_record(ckpt, state)
    return state


def load_optimizer(ckpt: Path, sha256: str | None = None, json_sha256: str | None = None) -> dict[str, Any] | None:
    """The optimizer state dict saved in ``ckpt``, or None when it has none (``sha256``, ``json_sha256``:
    the recorded digests of its tensor file and of ``optimizer.json``, as for :func:`load_tensors`)."""
    f = ckpt / "optimizer.json"
    if not f.is_file():
        return None
    if json_sha256 is not None and VERIFY and sha256_file(f) != json_sha256:
        raise CheckpointError(
            f"checkpoint file {f} does not match the sha256 recorded in {ckpt / 'state.json'}: it was "
            f"damaged after it was written; remove {ckpt} to fall back on an earlier checkpoint, or "
            f"pass 'replaid --no-verify' to load it anyway"
        )
    try:
        meta = json.loads(f.read_text())
        tensors = load_tensors(ckpt, "optimizer", sha256)
        return optimizer_from_tensors(tensors or {}, meta)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"checkpoint file {f} is damaged ({e.__class__.__name__}); remove {ckpt} to fall "
            f"back on an earlier checkpoint"
        ) from None


def load_tensors(ckpt: Path, name: str, sha256: str | None = None) -> dict[str, torch.Tensor] | None:
    """``ckpt/NAME.safetensors`` (None when absent), checked against ``sha256`` when given and
    :data:`VERIFY` is on."""
    f = ckpt / f"{name}.safetensors"
    if not f.is_file():
        return None
    if sha256 is not None and VERIFY and sha256_file(f) != sha256:
        raise CheckpointError(
            f"checkpoint file {f} does not match the sha256 recorded in {ckpt / 'state.json'}: it was "
            f"damaged after it was written; remove {ckpt} to fall back on an earlier checkpoint, or "
            f"pass 'replaid --no-verify' to load it anyway"
        )
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
        detail = (
            f"missing {missing[:2]}"
            if missing
            else f"unexpected {unexpected[:2]}"
            if unexpected
            else f"shape of {bad[0]} is {tuple(sd[bad[0]].shape)} vs {tuple(own[bad[0]].shape)}"
        )
        raise CheckpointError(
            f"checkpoint {where} does not match this model ({detail}); "
            f"it was written by another model or config: load it with its own config.json"
        )
    model.load_state_dict(sd, strict=True)


@dataclass
class Stored:
    """The one checkpoint reader: what a checkpoint (or exported / converted folder) holds, read on
    demand. Resuming (``training/train.py``), :func:`replaid.store.loading.load_run` and the
    exporter all read through it; nothing is unpickled."""

    path: Path
    state: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, need: tuple[str, ...] = ("step", "config", "vocab_size")) -> Stored:
        """The checkpoint in force at ``path`` (a run, its ``checkpoints/`` or one checkpoint folder)."""
        ckpt = find_checkpoint(path)
        stored = cls(ckpt, load_state(ckpt, need))
        if "config" in stored.state:
            stored.check_run_config()
        return stored

    def check_run_config(self) -> None:
        """A checkpoint inside a run (``RUN/checkpoints/step_N``) agrees with ``RUN/config.json`` on every key
        that defines the model and its data (:func:`identity_difference`), else one line naming the key."""
        if self.path.parent.name != "checkpoints" or not (self.path.parent.parent / "config.json").is_file():
            return  # an exported or converted folder (its config.json is transformers'), or one checkpoint alone
        f = self.path.parent.parent / "config.json"
        try:
            run_cfg = read_run_config(f, 'restore it from the checkpoint\'s state.json (its field "config")')
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        diff = identity_difference(run_cfg, self.config())
        if diff is not None:
            key, mine, theirs = diff
            raise CheckpointError(
                f"{f} and checkpoint {self.path / 'state.json'} disagree on {key} ({mine!r} vs {theirs!r}), a key "
                f"that defines the model or its data: one of them was edited after training; restore {key} in the "
                f"edited file (the checkpoint's sha256 record covers its state.json config)"
            )

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def config(self) -> RunConfig:
        """The run's config, migrated to the current layout and validated."""
        try:
            return RunConfig.from_dict(self.state["config"])
        except ConfigError as e:
            raise CheckpointError(
                f'checkpoint file {self.path / "state.json"}: field "config" is not a valid run config ({e}); '
                f"it is damaged or from another version: remove {self.path} to fall back on an earlier checkpoint"
            ) from None

    @property
    def sharded(self) -> bool:
        """Whether the tensors are DCP shards (written by an FSDP2 run) rather than safetensors files."""
        return self.state.get("format") == "dcp"

    def has_part(self, part: str) -> bool:
        """Whether a sharded checkpoint holds ``part`` (``model``, ``ema``, ``optim``)."""
        try:
            keys = sharded.stored_keys(self.shards())
        except sharded.UnsafeCheckpoint as e:
            raise CheckpointError(str(e)) from None
        return any(w[0] == part for w in keys.values())

    def shards(self) -> Path:
        """The DCP folder of a sharded checkpoint, its files checked against the sha256 in state.json
        (unless :data:`VERIFY` is off); a missing or changed file is named in one line."""
        folder = self.path / sharded.SHARDED_DIR
        rec = self.state.get("sha256")
        rec = {k: v for k, v in rec.items() if k.startswith(f"{sharded.SHARDED_DIR}/")} if isinstance(rec, dict) else {}
        if not rec or not (folder / sharded.METADATA).is_file():
            raise CheckpointError(
                f"checkpoint {self.path} is sharded but {folder} lacks its files (or state.json their sha256); "
                f"it is damaged: remove {self.path} to fall back on an earlier checkpoint"
            )
        if VERIFY and not getattr(self, "_verified", False):
            for rel, h in rec.items():
                f = self.path / rel
                if not f.is_file() or sha256_file(f) != h:
                    raise CheckpointError(
                        f"checkpoint file {f} does not match the sha256 recorded in {self.path / 'state.json'}"
                        f"{' (it is missing)' if not f.is_file() else ''}: it was damaged after it was written; "
                        f"remove {self.path} to fall back on an earlier checkpoint, or pass 'replaid --no-verify' "
                        f"to load it anyway"
                    )
            self._verified = True
        return folder

    def tensors(self, name: str) -> dict[str, torch.Tensor] | None:
        """``model`` / ``ema`` / ``optimizer`` / ``rng`` tensors, None when the file is absent (the
        full ``model`` / ``ema`` tensors of a sharded checkpoint, read from its shards in this process;
        its optimizer state is read by :func:`load_sharded_training_state`)."""
        if self.sharded and name in ("model", "ema", "optimizer"):
            if name == "optimizer":
                return None
            try:
                return sharded.load_full(self.shards(), name)
            except sharded.UnsafeCheckpoint as e:
                raise CheckpointError(str(e)) from None
            except CheckpointError:
                raise
            except sharded.read_errors() as e:  # DCP's own read errors (a truncated or missing shard)
                raise CheckpointError(
                    f"checkpoint {self.path} has unreadable shards ({sharded.why(e)}); it is damaged: remove it "
                    f"to fall back on an earlier checkpoint"
                ) from None
        return load_tensors(self.path, name, self.sha256(name))

    def sha256(self, name: str) -> str | None:
        """The recorded sha256 of ``NAME.safetensors``; a tensor file without one is an error (None only
        under ``replaid --no-verify``), never a file loaded unchecked."""
        rec = self.state.get("sha256")
        h = rec.get(f"{name}.safetensors") if isinstance(rec, dict) else None
        if h is None and VERIFY and (self.path / f"{name}.safetensors").is_file():
            raise CheckpointError(
                f'checkpoint file {self.path / "state.json"}: field "sha256" records no sha256 of '
                f"{name}.safetensors; remove {self.path} to fall back on an earlier checkpoint, or pass "
                f"'replaid --no-verify' to load it unchecked"
            )
        return h if isinstance(h, str) else None

    def weights(self, ema: bool = True) -> tuple[dict[str, torch.Tensor], bool]:
        """(network weights, whether they are the EMA file's): the EMA when asked for and stored, else
        the trained ones; refuses a missing weights file and non-finite weights."""
        w = self.tensors("ema") if ema else None
        from_ema = w is not None
        if w is None:
            w = self.tensors("model")
        if w is None:
            raise CheckpointError(f"checkpoint {self.path} has no model.safetensors; it is incomplete")
        bad = nonfinite_tensor(w)
        if bad is not None:
            raise CheckpointError(
                f"checkpoint {self.path} holds non-finite weights (NaN/Inf in {bad}); it comes "
                f"from a diverged run: use an earlier checkpoint or retrain with a smaller "
                f"learning rate"
            )
        return w, from_ema

    def optimizer(self) -> dict[str, Any] | None:
        """The full optimizer state of a single-file checkpoint (None for a sharded one: see
        :func:`load_sharded_training_state`)."""
        if self.sharded:
            return None
        rec = self.state.get("sha256")
        h = rec.get("optimizer.json") if isinstance(rec, dict) else None
        return load_optimizer(self.path, self.sha256("optimizer"), h if isinstance(h, str) else None)


def load_sharded_training_state(
    stored: Stored, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ema: dict[str, torch.Tensor] | None
) -> None:
    """Restore the weights, the optimizer state and the EMA ``ema`` (a name -> tensor dict, filled in
    place) of a sharded checkpoint into a model as placed now (FSDP2 on any number of ranks, DDP, or
    one process): DCP reads each rank's part of every tensor, re-sharding as needed (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = stored.shards()
    try:
        keys = sharded.stored_keys(folder)
    except sharded.UnsafeCheckpoint as e:
        raise CheckpointError(str(e)) from None
    saved = {str(w[1]) for w in keys.values() if len(w) == 2 and w[0] == "model"}
    own = set(model.state_dict())
    if saved != own:
        miss, extra = sorted(own - saved), sorted(saved - own)
        detail = f"missing {miss[:2]}" if miss else f"unexpected {extra[:2]}"
        raise CheckpointError(
            f"checkpoint {stored.path} does not match this model ({detail}); it was written by another model "
            f"or config: load it with its own config.json"
        )
    msd, osd = get_state_dict(model, optimizer)
    sd: dict[str, Any] = {"model": msd, "optim": osd}
    has_ema = any(w[0] == "ema" for w in keys.values())
    if ema is not None and has_ema:
        sd["ema"] = ema
    try:
        sharded.load(folder, sd)
    except sharded.read_errors() as e:  # DCP's read errors (a shard missing for this world, a torn file)
        raise CheckpointError(
            f"checkpoint {stored.path} has unreadable shards ({sharded.why(e)}); "
            f"remove it to fall back on an earlier checkpoint"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
