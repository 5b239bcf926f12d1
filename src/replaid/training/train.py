"""Training: ``train_step`` (one optimiser step) apart from the loop (nanoGPT/torchtitan style).

The trainer knows a method only through :class:`replaid.methods.base.Method`; the evaluation it runs
(``eval_every`` and at the end) is the ``evaluate`` callable it is given (``replaid.eval.evaluate.evaluate``,
wired in ``commands/train.py`` and by the scaling runner)."""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

import torch
from torch import Tensor, nn

from replaid import dist
from replaid.config import ConfigError, OptimConfig, RunConfig
from replaid.data.cooc import COOC_TOKENS, cooc_embeddings
from replaid.data.errors import DataError
from replaid.data.loader import Batch
from replaid.data.pipeline import DataPipeline
from replaid.data.sources import corpus_change
from replaid.diffusion.nelbo import low_discrepancy
from replaid.diffusion.rng import host_uniform
from replaid.methods import get_method, method_class
from replaid.methods.base import Method, Metrics
from replaid.store import checkpoint as ck
from replaid.store import runfolder
from replaid.store.loading import check_tokenizer, resolve_device
from replaid.store.metrics_log import DeviceMeans, MetricsLogger, require_wandb, trackers
from replaid.training import layout
from replaid.training.signatures import signatures
from replaid.training.threads import announce_threads, set_threads


class TrainingDiverged(RuntimeError):
    """Too many non-finite steps in a row (one-line message: likely causes, last good checkpoint)."""


PREEMPTED_EXIT = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 with a checkpoint saved; requeue and --resume
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1")  # what SLURM (and submitit, timeout, docker stop) send first


class Preempted(RuntimeError):
    """Training stopped by a preemption signal after saving a checkpoint at a step boundary."""


@contextmanager
def preemption_signals() -> Iterator[dict[str, str]]:
    """Catch SIGTERM/SIGUSR1 for the duration (main thread only): the returned dict gets ``signal``
    set to the signal's name; the loop saves a checkpoint at the next step boundary and stops
    (:class:`Preempted`). Once the caller puts a message in ``got["now"]`` (after the last save), a
    signal raises :class:`Preempted` with it at once. The previous handlers are restored afterwards."""
    import signal
    import threading

    got: dict[str, str] = {}
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    sigs = [getattr(signal, n) for n in PREEMPT_SIGNALS if hasattr(signal, n)]

    def handler(signum: int, frame: FrameType | None) -> None:
        got["signal"] = signal.Signals(signum).name
        if "now" in got:  # past the last step boundary (the checkpoint is saved): stop at once
            raise Preempted(got["now"].format(signal=got["signal"]))

    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ------------------------------------------------------------------ optimiser, LR, EMA


def build_optimizer(model: nn.Module, ocfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with the paper's parameter groups (embedding, monotone MLP, endpoints, projections, backbone)."""
    groups = []
    for name, params in cast(Any, model).param_groups().items():  # every model class defines param_groups
        if params:
            lr, wd = getattr(ocfg, f"lr_{name}"), getattr(ocfg, f"wd_{name}")
            lr = ocfg.lr_backbone if lr < 0 else lr  # -1: as the backbone
            wd = ocfg.wd_backbone if wd < 0 else wd
            groups.append({"params": params, "name": name, "lr": lr, "weight_decay": wd})
    for g in groups:
        g["initial_lr"] = g["lr"]
    return torch.optim.AdamW(groups, betas=(ocfg.beta1, ocfg.beta2), eps=ocfg.eps)


def warmup_steps(ocfg: OptimConfig, total: int) -> int:
    if ocfg.warmup_frac > 0:
        return max(ocfg.min_warmup_steps, int(round(ocfg.warmup_frac * total)))
    return ocfg.warmup_steps


def lr_at(step: int, base: float, ocfg: OptimConfig, total: int) -> float:
    """Linear warm-up, then constant or cosine decay from ``base`` to ``ocfg.lr_min``."""
    w = warmup_steps(ocfg, total)
    if w > 0 and step < w:
        return base * (step + 1) / w
    if ocfg.lr_schedule == "constant":
        return base
    prog = min(1.0, (step - w) / max(1, total - w))
    lo = min(ocfg.lr_min, base)
    return lo + (base - lo) * 0.5 * (1 + math.cos(math.pi * prog))


class EMA:
    """Exponential moving average of the trainable weights (used for evaluation)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    def load_full(self, full: dict[str, Tensor], model: nn.Module) -> None:
        """Restore from an unsharded checkpoint, placed like the (possibly sharded) model."""
        self.shadow = {k: v.float() for k, v in dist.shard_like(full, model).items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.dtype.is_floating_point:
                self.shadow[k].lerp_(v.float(), 1 - self.decay)
            else:
                self.shadow[k].copy_(v)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({k: self.shadow[k].to(backup[k].dtype) for k in backup})
        try:
            yield model
        finally:
            model.load_state_dict(backup)


def autocast_ctx(device: torch.device, precision: str) -> torch.autocast | nullcontext[None]:
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


# ------------------------------------------------------------------ one step


@dataclass
class Trainer:
    cfg: RunConfig
    model: nn.Module
    method: Method[Any]
    optimizer: torch.optim.Optimizer
    device: torch.device
    ema: EMA | None = None
    step: int = 0
    loss_module: nn.Module | None = None  # TrainModule, wrapped by DDP/FSDP under torchrun
    history: list[dict[str, float]] = field(default_factory=list)
    nonfinite_steps: int = 0  # steps skipped for a NaN/Inf loss or gradient, in all
    nonfinite_in_row: int = 0  # ... and in a row up to now
    window: DeviceMeans = field(default_factory=DeviceMeans)  # metrics since the last logging step

    def train_step(self, micro_batches: list[Batch], log: bool = True) -> dict[str, Any]:
        """One optimiser step over ``grad_accum`` micro-batches (Algorithm 1 + AdamW).

        Nothing waits for the device unless ``log``: noise is drawn there, batches are copied
        without blocking, metrics are summed on the device; a logging step reduces them (one
        all-reduce of a few scalars), returns the means since the last one and refreshes B_r."""
        cfg, model = self.cfg, self.loss_module
        assert model is not None, "Trainer.loss_module is set by train() before the first step"
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(self.step, g["initial_lr"], cfg.optim, cfg.train.steps)
        self.model.train()
        self.method.before_step()
        b = cast(Tensor, micro_batches[0]["tokens"]).shape[0]
        n_recon = self.method.recon_rows(b)
        # low-discrepancy t for the global batch: RePlaid's diffusion rows, or every row of MDLM/Duo
        t_slices = self._global_times(b, n_recon, len(micro_batches)) if self.method.global_times else None
        rows: dict[str, list[Any]] = {}
        losses = []
        for k, mb in enumerate(micro_batches):
            tokens, mask = to_device(mb["tokens"], self.device), to_device(mb.get("mask"), self.device)
            last = k == len(micro_batches) - 1
            ctx = nullcontext() if last else dist.no_sync(model)
            kw = {"t_diff": t_slices[k], "n_recon": n_recon} if t_slices is not None else {}
            with ctx, autocast_ctx(self.device, cfg.train.precision):
                loss, m = model(tokens, self.micro_generator(k), mask=mask, **kw)
                # copied before backward: under FSDP2 (torch 2.13, gloo) reading them after backward segfaulted
                m = {key: (v.detach().clone() if torch.is_tensor(v) else v) for key, v in m.items()}
                (loss / len(micro_batches)).backward()
            losses.append(loss.detach().float())
            for key, v in m.items():
                rows.setdefault(key, []).append(v)
        diag = self.group_grad_norms() if log else {}  # before clipping and the step
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = dist.plain(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))  # on the device
        finite = self._all_finite(torch.stack(losses), grad_norm)  # else skip: weights, EMA, split unchanged
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if finite and self.ema is not None:
            self.ema.update(self.model)
        merged = {
            k: (torch.cat([x.reshape(-1) for x in v]) if torch.is_tensor(v[0]) else v[-1]) for k, v in rows.items()
        }
        if finite:
            self.method.after_step(merged)  # this rank's rows; RePlaid's split all-reduces 4 means
        self.step += 1
        self.nonfinite_in_row = 0 if finite else self.nonfinite_in_row + 1
        self.nonfinite_steps += int(not finite)
        status = dict(step=self.step, skipped=int(not finite), nonfinite_steps=self.nonfinite_steps)
        if finite:
            self.window.add({**merged, "grad_norm": grad_norm})
            if not log:
                return status
            out = self.window.reduce()
            if self.step % cfg.train.log_every == 0:
                self.method.refresh()  # at fixed steps, so a resumed run takes the same B_r
        else:  # a skipped step reports its own (non-finite) values
            out = {
                k: (float(v.double().mean()) if torch.is_tensor(v) else v)
                for k, v in {**merged, "grad_norm": grad_norm}.items()
            }
        if "recon" in out and "diffusion" in out:
            out["loss"] = out["recon"] + out["diffusion"] + out.get("prior", 0.0)
        out.update(diag, **embedding_stats(self.model))
        out.update(lr=self.optimizer.param_groups[-1]["lr"], **status)
        return out

    def group_grad_norms(self) -> dict[str, float]:
        """``grad_norm/<group>``: the 2-norm of each optimiser group's gradients (the paper's groups:
        embedding, schedule, endpoints, projections, backbone, ...), at the logged step, before clipping."""
        out: dict[str, float] = {}
        for g in self.optimizer.param_groups:
            grads = [p.grad for p in g["params"] if p.grad is not None]
            if grads:
                out[f"grad_norm/{g.get('name', len(out))}"] = float(
                    dist.plain(torch.nn.utils.get_total_norm(grads, 2.0))
                )
        return out

    @staticmethod
    def _all_finite(losses: Tensor, grad_norm: Tensor) -> bool:
        """Whether this step's losses and gradient norm are finite on every rank (one verdict for all):
        the one host read of a non-logging step (a device-side skip, e.g. fused AdamW's ``found_inf``,
        would remove it)."""
        bad = ((~torch.isfinite(losses)).any() | ~torch.isfinite(grad_norm)).double().reshape(1)
        return float(dist.all_reduce_sum(bad)) == 0

    def micro_generator(self, k: int) -> torch.Generator:
        """The RNG stream of micro-batch ``k`` of this step on this rank: seeded by (seed, step, global
        slot = k * world + rank), so a run on N ranks draws exactly the noise that one process with
        N-fold gradient accumulation draws, and a resumed run continues the same streams."""
        slot = k * dist.world_size() + dist.rank()
        return torch.Generator().manual_seed((self.cfg.train.seed * 1_000_003 + self.step) * 4099 + slot)

    def _global_times(self, b: int, n_recon: int, accum: int) -> list[Tensor]:
        """Low-discrepancy t for the diffusion rows of the *global* batch, one shared u per step
        (seeded by the step, identical on every rank), strided per rank and accumulation step."""
        world, rank = dist.world_size(), dist.rank()
        n_d = b - n_recon
        n_global = n_d * accum * world
        g = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + self.step)
        t = low_discrepancy(n_global, u=host_uniform(g), device=self.device)  # on the device
        slices = t.view(n_d, accum * world).t()  # slice j = t[j::accum*world]
        return [slices[k * world + rank].contiguous() for k in range(accum)]


@torch.no_grad()
def embedding_stats(model: nn.Module) -> dict[str, float]:
    """For a model with a token-embedding matrix (``model.embedding.weight``, (V, d)): ``emb_norm``, the
    mean norm of its raw rows (before RePlaid's unit normalisation), and ``emb_cosine``, the mean cosine
    over ordered pairs of distinct rows, ``(||sum_i u_i||^2 - V) / (V (V - 1))`` with ``u_i = w_i / ||w_i||``
    (0 for rows spread over the sphere, 1 when collapsed onto one direction)."""
    w = getattr(getattr(model, "embedding", None), "weight", None)
    if not isinstance(w, Tensor) or w.dim() != 2 or w.shape[0] < 2:
        return {}
    w = dist.plain(w.detach()).double()  # (V, d)
    norms = w.norm(dim=-1)  # (V,)
    s = (w / norms.clamp_min(1e-300).unsqueeze(-1)).sum(0)  # (d,)
    V = w.shape[0]
    return {"emb_norm": float(norms.mean()), "emb_cosine": float((s @ s - V) / (V * (V - 1)))}


@torch.no_grad()
def start_from_data(model: nn.Module, data: DataPipeline) -> None:
    """``model.embeddings=cooc``: the embedding rows start at the top co-occurrence directions of the train
    split's first :data:`~replaid.data.cooc.COOC_TOKENS` tokens (identical on every rank)."""
    tokens = data.array("train")[0][:COOC_TOKENS]
    w = cast(Tensor, model.get_submodule("embedding").weight)  # (V, d_e)
    w.copy_(torch.from_numpy(cooc_embeddings(tokens, data.vocab_size, w.shape[1])).to(w.device, w.dtype))


def probe_signatures(trainer: Trainer, tokens: Tensor, unigram_logp: Tensor) -> dict[str, float]:
    """The plateau signatures (:mod:`replaid.training.signatures`) of the training weights on the first
    ``train.signature_rows`` rows of a logged step's first micro-batch, with a generator of their own
    (seed, step). On the main rank of one process or DDP (an FSDP forward needs every rank); {} when off."""
    n = trainer.cfg.train.signature_rows
    if n == 0 or not dist.is_main() or (dist.world_size() > 1 and trainer.cfg.train.parallel != "ddp"):
        return {}
    gen = torch.Generator().manual_seed(trainer.cfg.train.seed * 1_000_003 + trainer.step)
    with autocast_ctx(trainer.device, trainer.cfg.train.precision):
        return signatures(trainer.method, trainer.model, tokens[:n].to(trainer.device), unigram_logp, gen)


def unigram_sums(logp: Tensor, batch: Batch) -> Tensor:
    """(2,) float64: the summed NLL of the batch's real tokens under the train split's add-one unigram
    model ``logp`` (V,), and their count: the reference a training bound is read against (plateau exit)."""
    nll = -logp[cast(Tensor, batch["tokens"]).long()]  # (B, L) float64
    mask = batch.get("mask")
    if mask is not None:
        nll = nll[mask.bool()]
    return torch.stack([nll.sum(), torch.tensor(float(nll.numel()), dtype=torch.float64)])


def compiles(setting: str, device: torch.device) -> bool:
    """Whether ``train.compile`` compiles on ``device``: ``on``, ``off``, or ``auto`` (on CUDA only)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def compile_loss(model: nn.Module, method: Method[Any]) -> None:
    """``train.compile``: what the method compiles (RePlaid, Plaid: the loss core, everything but the
    noise draws and the schedule, without a graph break; the others: the backbone)."""
    method.compile(model)


def to_device(x: Tensor | None, device: torch.device) -> Tensor | None:
    """A batch tensor on ``device`` without blocking the host (pinned first for CUDA)."""
    if x is None or x.device == device:
        return x
    if device.type == "cuda" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


class TrainModule(nn.Module):
    """The whole training loss as one module forward, so DDP/FSDP wrap it from the outside."""

    def __init__(self, model: nn.Module, method: Method[Any]):
        super().__init__()
        self.model, self.method = model, method

    def forward(self, tokens: Tensor, generator: torch.Generator, **kw: Any) -> tuple[Tensor, Metrics]:
        return self.method.train_loss(self.model, tokens, generator, **kw)


# ------------------------------------------------------------------ the loop


def rng_state() -> dict[str, Tensor]:
    """Global RNG states (dropout); the loss's own noise streams are derived from (seed, step)."""
    st = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict[str, Tensor]) -> None:
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])


def save(trainer: Trainer, run_dir: Path, data: DataPipeline, extra: dict[str, Any] | None = None) -> Path | None:
    """DDP or one process: gather the full state, write one safetensors file each from rank 0. FSDP2:
    every rank writes its own shards (DCP, :func:`ck.save_sharded_checkpoint`), nothing is gathered."""
    if dist.is_sharded(trainer.model):
        return _save_sharded(trainer, run_dir, data, extra)
    model_sd = dist.full_state_dict(trainer.model)
    ema_sd = dist.full_tensors(trainer.ema.shadow) if trainer.ema else None
    opt_sd = dist.optimizer_state(trainer.model, trainer.optimizer)
    in_sync = dist.params_in_sync(trainer.model)
    if not dist.is_main():
        return None
    state = {**_run_state(trainer, data, extra), "ranks_in_sync": in_sync}
    return ck.save_checkpoint(run_dir, trainer.step, model_sd, state, ema_sd, opt_sd, rng_state())


def _run_state(trainer: Trainer, data: DataPipeline, extra: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "config": trainer.cfg.to_dict(),
        "method": trainer.cfg.method,
        "vocab_size": data.vocab_size,
        "method_state": trainer.method.state_dict(),
        "data_state": data.train_loader.state_dict(),
        "history_tail": trainer.history[-5:],
        "world_size": dist.world_size(),
        "nonfinite_steps": trainer.nonfinite_steps,
        "nonfinite_in_row": trainer.nonfinite_in_row,
        "binding": data.binding(),  # the tokenizer's and the corpus's fingerprints
        **(extra or {}),
    }


def _save_sharded(trainer: Trainer, run_dir: Path, data: DataPipeline, extra: dict[str, Any] | None) -> Path | None:
    """The sharded checkpoint of an FSDP2 run: ``get_state_dict``'s sharded model and optimizer state and
    the sharded EMA, as torchtitan's checkpointer saves them (keys: parameter names)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(trainer.model, trainer.optimizer)
    sd = {"model": msd, "optim": osd, **({"ema": dict(trainer.ema.shadow)} if trainer.ema else {})}
    in_sync = dist.params_in_sync(trainer.model)
    state = {**_run_state(trainer, data, extra), "ranks_in_sync": in_sync}
    return ck.save_sharded_checkpoint(run_dir, trainer.step, sd, state, rng_state())


def use_deterministic_kernels() -> None:
    """Bit-reproducible training for a given seed, thread count and device (README, Reproducibility).

    torch's deterministic mode. On CPU with more than one thread, accumulating index writes -- the
    backward of ``E[tokens]`` once it has >= 32768 elements, e.g. the demo's 32 x 64 x 16 -- otherwise
    add with parallel float atomics whose order (hence rounding) varies from run to run; here they run
    serially. On CUDA it also fixes cuBLAS's workspace. Ops without a deterministic kernel warn, not fail.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


# evaluate(trainer, data, progress=...) -> {metric: value} (replaid.eval.evaluate.evaluate)
Evaluator = Callable[..., dict[str, Any]]


def train(
    cfg: RunConfig,
    run_dir: Path,
    *,
    evaluate: Evaluator,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    overwrite: bool = False,
    weights_only: bool = False,
    accept_changed_data: bool = False,
) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; returns the final metrics (and ``evaluate``'s evaluation).

    The run folder is locked for the duration (rank 0); a folder holding a run needs ``resume`` or
    ``overwrite``; ``weights_only`` lets a resume proceed from a checkpoint without optimizer/RNG state;
    ``accept_changed_data`` one whose corpus changed since the checkpoint (a metrics.jsonl row records it).
    """
    run_dir = Path(run_dir)
    if not method_class(cfg.method).trainable:  # before anything is written
        raise ConfigError(
            f"method={cfg.method} is for converted checkpoints (evaluation and sampling); it "
            f"cannot be trained: use method=replaid"
        )
    if "wandb" in trackers(cfg.train.logger) and dist.is_main():
        require_wandb()  # before the run folder is touched
    use_deterministic_kernels()
    set_threads(cfg.train.num_threads, announce=dist.is_main())
    device = dist.setup_device(resolve_device(cfg.train.device))
    claim = runfolder.claim(run_dir, resume=resume, overwrite=overwrite) if dist.is_main() else nullcontext()
    with claim:
        dist.barrier()
        return _train(cfg, run_dir, device, evaluate, resume, progress, stop_after, weights_only, accept_changed_data)


def _train(
    cfg: RunConfig,
    run_dir: Path,
    device: torch.device,
    evaluate: Evaluator,
    resume: bool,
    progress: bool,
    stop_after: int | None,
    weights_only: bool,
    accept_changed_data: bool = False,
) -> dict[str, Any]:
    """A claimed run's phases: the layout check, the build (data, method, network, restored state), the
    log, the step loop and the final evaluation."""
    world = dist.world_size()
    if resume:
        cfg = carry_micro_batch(cfg, run_dir)
        saved_on = saved_world_size(run_dir)
        if saved_on:  # a checkpoint saved on other ranks: intact, and resumable on the rank counts named
            layout.check_resume_layout(cfg.train.batch_size, cfg.train.grad_accum, world, saved_on)
    layout.check_layout(cfg, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))  # the ranks it runs on
    data, method, model = _build(cfg, run_dir, device, resume)
    trainer = Trainer(cfg, model, method, cast(torch.optim.Optimizer, None), device)  # built below, after sharding
    changed: dict[str, Any] = {}  # the corpus change --accept-changed-data accepted, if any (logged below)
    stored = _resume(trainer, run_dir, data, weights_only, accept_changed_data, changed) if resume else None
    _shard_and_restore(trainer, stored)
    if compiles(cfg.train.compile, device):
        compile_loss(model, method)

    final = runfolder.read_final_eval(run_dir) if resume else None
    final = final if final and final.get("step") == trainer.step else None
    log = _open_log(cfg, run_dir, trainer.step, resume, final is not None, changed)
    end = cfg.train.steps if stop_after is None else min(cfg.train.steps, trainer.step + stop_after)
    start = trainer.step
    with preemption_signals() as got:
        saved = _loop(
            trainer, data, evaluate, log, got, end, trainer.step if stored is not None else None, progress, run_dir
        )
        ran = trainer.step - start
        if ran > 0 and trainer.nonfinite_in_row >= ran:  # no step of this call changed the weights
            log.close()
            raise TrainingDiverged(_all_skipped(trainer, ran, start, run_dir))
        if final is not None and final.get("step") != trainer.step:  # resumed with more steps: evaluate anew
            final = None
        result = _final_eval(trainer, data, evaluate, log, got, saved, final, progress and dist.is_main(), run_dir)
    done = trainer.step >= cfg.train.steps
    bad = nonfinite_entries(result["eval"]) if done and final is None else []
    if bad:  # a failed run: no final_eval.json, and its checkpoint out of force (eval would refuse it)
        log.close()
        raise TrainingDiverged(_nonfinite_final_eval(trainer, bad, run_dir, wrote=start != trainer.step))
    if done and final is None and dist.is_main():
        runfolder.write_final_eval(run_dir, trainer.step, result["eval"])
        log.log(trainer.step, {f"eval/{k}": v for k, v in result["eval"].items() if isinstance(v, (int, float))})
    log.close()
    return result


def _build(
    cfg: RunConfig, run_dir: Path, device: torch.device, resume: bool
) -> tuple[DataPipeline, Method[Any], nn.Module]:
    """The data pipeline (rank 0 first: it trains the tokenizer and fills the token caches, the others then
    read them; a new run gets its tokenizer built and saved, a resumed one only ever loads its own), the
    method and a fresh network, identical on every rank; a new run's folder is begun here."""
    torch.manual_seed(cfg.train.seed * 1_000_003 + 17)  # identical initial weights on every rank
    data = (
        DataPipeline(cfg, run_dir, rank=0, world_size=dist.world_size(), new_run=not resume) if dist.is_main() else None
    )
    dist.barrier()
    data = data or DataPipeline(cfg, run_dir, rank=dist.rank(), world_size=dist.world_size(), new_run=not resume)
    data.check_splits(("train", cfg.eval.split))  # an unusable split fails now, not after training
    method = get_method(cfg)
    method.check_training(cfg, dist.world_size())
    if cfg.train.parallel == "hsdp" and dist.is_dist():
        try:
            dist.hsdp_mesh_shape(cfg.train.hsdp_shard)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    model = method.build_model(data.vocab_size).to(device)  # reads model.embeddings_path: a bad file leaves no run
    if not resume and cfg.model.embeddings == "cooc" and cfg.options is not None:  # a continuous method's rows
        start_from_data(model, data)
    if not resume and dist.is_main():
        runfolder.begin(run_dir, cfg.to_json())
    announce_threads()  # the input is accepted: the thread choice's line, once
    torch.manual_seed(cfg.train.seed * 1_000_003 + 29 + dist.rank())  # per-rank dropout streams
    return data, method, model


def _shard_and_restore(trainer: Trainer, stored: ck.Stored | None) -> None:
    """Parallelism applied from the outside (DDP, FSDP2 or HSDP), then the optimizer (after sharding: FSDP2
    swaps parameters) and the EMA, each with a resumed checkpoint's state (sharded: each rank reads its own)."""
    cfg, model, method, device = trainer.cfg, trainer.model, trainer.method, trainer.device
    trainer.loss_module = dist.wrap_model(TrainModule(model, method), cfg.train.parallel, device, cfg.train.hsdp_shard)
    trainer.optimizer = optimizer = build_optimizer(model, cfg.optim)
    if stored is not None and stored.sharded:  # weights, optimizer, EMA: each rank reads its shards (DCP)
        trainer.ema = EMA(model, cfg.optim.ema) if cfg.optim.ema > 0 else None
        ck.load_sharded_training_state(stored, model, optimizer, trainer.ema.shadow if trainer.ema else None)
        if trainer.ema is not None and not stored.has_part("ema"):
            trainer.ema = EMA(model, cfg.optim.ema)
    elif cfg.optim.ema > 0:
        trainer.ema = EMA(model, cfg.optim.ema)
        full = stored.tensors("ema") if stored is not None else None
        if full is not None:
            trainer.ema.load_full(full, model)
    opt_sd = stored.optimizer() if stored is not None else None
    if opt_sd is not None:
        dist.load_optimizer_state(model, optimizer, opt_sd)


def _open_log(
    cfg: RunConfig, run_dir: Path, step: int, resume: bool, final_recorded: bool, changed: dict[str, Any]
) -> MetricsLogger:
    """The run's metrics log (and trackers), resumed at ``step``; a final evaluation that was not recorded
    is redone (its rows dropped), and an accepted corpus change is logged."""
    tracked = trackers(cfg.train.logger)
    log = MetricsLogger(
        run_dir,
        enabled=dist.is_main(),
        tensorboard="tensorboard" in tracked,
        wandb={"project": cfg.train.wandb_project, "config": cfg.to_dict()} if "wandb" in tracked else None,
        resume_step=step if resume else None,
        keep=lambda row: final_recorded or row["step"] < cfg.train.steps or not any(k.startswith("eval/") for k in row),
    )
    if changed:
        log.log(step, changed)
        log.write(
            f"replaid: note: --accept-changed-data: the corpus changed since step {step} "
            f"({changed['change']}); training goes on with it (recorded in {run_dir / 'metrics.jsonl'})"
        )
    return log


def _loop(
    trainer: Trainer,
    data: DataPipeline,
    evaluate: Evaluator,
    log: MetricsLogger,
    got: dict[str, Any],
    end: int,
    saved: int | None,
    progress: bool,
    run_dir: Path,
) -> int | None:
    """Optimiser steps up to ``end``: logging (with the unigram NLL of the logged tokens and the plateau
    signatures), periodic evaluations and checkpoints, and a checkpoint then :class:`Preempted` when a
    preemption signal arrived. ``saved``, and the return: the step of the checkpoint in force (None: none)."""
    cfg = trainer.cfg
    micro = cfg.train.batch_size // (cfg.train.grad_accum * dist.world_size())
    bar = log.progress(total=cfg.train.steps, initial=trainer.step, disable=not progress)
    show = progress and dist.is_main()  # evaluation bars (stderr)
    t0, tokens_seen = time.time(), 0
    uni_logp, uni_sum = torch.from_numpy(data.unigram_logp()), torch.zeros(2, dtype=torch.float64)  # (V,), (2,)
    while trainer.step < end:
        mbs = [next(data.train_iter) for _ in range(cfg.train.grad_accum)]
        logging = (trainer.step + 1) % cfg.train.log_every == 0 or trainer.step + 1 == end
        uni = sum(unigram_sums(uni_logp, mb) for mb in mbs)
        m = trainer.train_step(mbs, log=logging)
        if not m.get("skipped"):
            uni_sum += uni  # the same (finite) steps as the trainer's logging window
        tokens_seen += micro * cfg.train.grad_accum * dist.world_size() * cfg.data.seq_len
        bar.update(1)
        _guard_nonfinite(trainer, m, run_dir, log)
        if logging:
            m["tokens_per_s"] = tokens_seen / max(time.time() - t0, 1e-9)
            if not m.get("skipped"):  # the unigram NLL of the tokens behind the logged (windowed) bound
                tot = dist.all_reduce_sum(uni_sum.to(trainer.device)).cpu()
                m["unigram"] = float(tot[0] / tot[1])
                uni_sum.zero_()
                m.update(probe_signatures(trainer, cast(Tensor, mbs[0]["tokens"]), uni_logp))
            trainer.history.append({k: v for k, v in m.items() if isinstance(v, (int, float))})
            log.log(trainer.step, m)
            bar.set_postfix(loss=f"{m.get('loss', float('nan')):.3f}", B_r=m.get("B_r", "-"))
        if cfg.train.eval_every and trainer.step % cfg.train.eval_every == 0 and trainer.step < end:
            ev = evaluate(trainer, data, progress=show)
            log.log(trainer.step, {f"eval/{k}": v for k, v in ev.items() if isinstance(v, (int, float))})
        if cfg.train.save_every and trainer.step % cfg.train.save_every == 0 and not trainer.nonfinite_in_row:
            save(trainer, run_dir, data)
            saved = trainer.step
        if _stop_requested(got, logging, trainer.device) and trainer.step < end:
            if saved != trainer.step:
                save(trainer, run_dir, data)
            log.close()
            raise Preempted(
                f"{got.get('signal', 'a preemption signal')} received: checkpoint saved at step {trainer.step} of "
                f"{cfg.train.steps} in {run_dir}; resume with 'replaid train --out {run_dir} --resume'"
            )
    bar.close()
    return saved


def _final_eval(
    trainer: Trainer,
    data: DataPipeline,
    evaluate: Evaluator,
    log: MetricsLogger,
    got: dict[str, Any],
    saved: int | None,
    final: dict[str, Any] | None,
    show: bool,
    run_dir: Path,
) -> dict[str, Any]:
    """The last checkpoint (saved first: a failing evaluation must not lose the run), then at the end of
    training the final evaluation, or the recorded one of this step. From the save on, a signal stops at
    once (exit 75): the checkpoint is saved and ``--resume`` redoes the evaluation."""
    cfg = trainer.cfg
    if saved != trainer.step:
        save(trainer, run_dir, data)
    got["now"] = (
        f"{{signal}} received during the final evaluation: checkpoint saved at step {trainer.step} in {run_dir}; "
        f"resume with 'replaid train --out {run_dir} --resume' to evaluate it"
    )
    result: dict[str, Any] = {"step": trainer.step, "train": trainer.history[-1] if trainer.history else {}}
    try:
        if "signal" in got:  # arrived during the last step or the save
            raise Preempted(got["now"].format(signal=got["signal"]))
        if trainer.step >= cfg.train.steps:
            result["eval"] = final["eval"] if final is not None else evaluate(trainer, data, progress=show)
    except Preempted:
        log.close()
        raise
    finally:
        del got["now"]  # the writes below are not interrupted: a signal now lets the run finish
    return result


def saved_world_size(run_dir: Path) -> int:
    """The rank count the checkpoint in force was saved on (0: none, or not recorded; damage is
    reported by :func:`_resume`)."""
    try:
        ckpt = ck.latest_checkpoint(run_dir)
        w = ck.load_state(ckpt).get("world_size") if ckpt is not None else None
    except ck.CheckpointError:
        return 0
    return w if isinstance(w, int) and w >= 1 else 0


def carry_micro_batch(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """Resuming on another number of ranks than the checkpoint was saved on: keep its micro-batch (rows
    per rank and accumulation step) by setting ``train.grad_accum`` so that micro x accumulation x ranks
    is still ``train.batch_size`` (said in a note). The data order is the same either way (the loader
    counts global batches); the same micro-batches also draw the same noise (seeded by global slot), so
    the run goes on as it would have. Without such a split the configured accumulation stays."""
    ckpt = ck.latest_checkpoint(run_dir)
    try:
        st = ck.load_state(ckpt) if ckpt is not None else {}
        old_world, old_accum = int(st["world_size"]), int(st["config"]["train"]["grad_accum"])
    except (ck.CheckpointError, KeyError, TypeError, ValueError):
        return cfg  # damage is reported by _resume
    world, batch = dist.world_size(), cfg.train.batch_size
    if old_world == world or old_world < 1 or old_accum < 1 or batch % (old_accum * old_world):
        return cfg
    micro = batch // (old_accum * old_world)
    if batch % (micro * world):
        return cfg
    accum = batch // (micro * world)
    if accum != cfg.train.grad_accum:
        if dist.is_main():
            print(
                f"replaid: note: checkpoint {ckpt} was saved on {old_world} rank(s), this run has {world}: "
                f"train.grad_accum={accum} keeps its micro-batch of {micro} rows (global batch {batch})",
                file=sys.stderr,
            )
        cfg = copy.deepcopy(cfg)
        cfg.train.grad_accum = accum
    return cfg


def _stop_requested(got: dict[str, str], logging: bool, device: torch.device) -> bool:
    """Whether to stop now: at once on one process; with several, all ranks agree at a logging step
    (which synchronises anyway), so that every rank saves at the same step."""
    if dist.world_size() == 1:
        return "signal" in got
    if not logging:
        return False
    flag = torch.tensor([1.0 if "signal" in got else 0.0], device=device)
    return bool(dist.all_reduce_sum(flag).item() > 0)


def nonfinite_entries(res: dict[str, Any], prefix: str = "") -> list[str]:
    """``key=value`` for each NaN/Inf number of a (nested) evaluation result."""
    bad = []
    for k, v in res.items():
        if isinstance(v, dict):
            bad += nonfinite_entries(v, f"{prefix}{k}.")
        elif isinstance(v, float) and not math.isfinite(v):
            bad.append(f"{prefix}{k}={v}")
    return bad


def _causes(trainer: Trainer) -> str:
    """The likely causes of non-finite losses, with the settings to change."""
    o = trainer.cfg.optim
    hint = trainer.method.divergence_hint(trainer.model)
    causes = f"learning rate too large (optim.lr_backbone={o.lr_backbone:g}, lr_embedding={o.lr_embedding:g}"
    return causes + f", grad_clip={o.grad_clip:g})" + (f" or {hint}" if hint else "")


def _all_skipped(trainer: Trainer, ran: int, start: int, run_dir: Path) -> str:
    """O26: every step of this call was skipped as non-finite: the weights never changed; nothing is saved."""
    last = ck.latest_checkpoint(run_dir)
    since = f" from step {start}" if start else ""
    return (
        f"training failed: all {ran} steps{since} had a non-finite loss or gradient and were skipped (the weights "
        f"never changed); likely cause: {_causes(trainer)}; no checkpoint was written (in force: "
        f"{last if last is not None else 'none'}): fix the config and start again with --overwrite"
    )


def _nonfinite_final_eval(trainer: Trainer, bad: list[str], run_dir: Path, wrote: bool) -> str:
    """O26: the final evaluation is not finite. The checkpoint it evaluated, when this call wrote it, is
    moved to ``RUN/nonfinite/`` (kept, out of force: ``eval`` would refuse it); the one before is in force."""
    step, name = trainer.step, ck.step_name(trainer.step)
    if not wrote:
        kept = f"its checkpoint {name} (saved before this call) is kept"
    elif not dist.is_main():
        kept = f"checkpoint {name} was set aside"
    else:
        aside, now = ck.set_aside(run_dir, step, run_dir / runfolder.NONFINITE)
        kept = f"checkpoint {name} was moved to {aside}; in force: {now if now is not None else 'none'}"
    return (
        f"the final evaluation at step {step} is not finite ({', '.join(bad[:3])}): the run failed; {kept}; "
        f"likely cause: {_causes(trainer)}; fix the config and start again with --overwrite"
    )


def _guard_nonfinite(trainer: Trainer, m: dict[str, Any], run_dir: Path, log: MetricsLogger) -> None:
    """Say that a non-finite step was skipped; after ``train.max_nonfinite_steps`` in a row, log the
    row and stop with the likely causes and the checkpoint still in force."""
    if not m["skipped"]:
        return
    cfg, n = trainer.cfg, trainer.nonfinite_in_row
    log.write(
        f"replaid: warning: step {trainer.step}: non-finite loss or gradient (loss {m.get('loss')}, "
        f"grad norm {m['grad_norm']}); update skipped ({n} in a row, {trainer.nonfinite_steps} in all)"
    )
    if n < cfg.train.max_nonfinite_steps:
        return
    log.log(trainer.step, m)
    causes = _causes(trainer)
    last = ck.latest_checkpoint(run_dir)
    raise TrainingDiverged(
        f"training diverged: {n} steps in a row up to step {trainer.step} had a non-finite loss or "
        f"gradient; likely cause: {causes}; the last checkpoint (finite, saved before the streak) is "
        f"{last if last is not None else 'none (nothing was saved)'}: lower the learning rate "
        f"and start again with --overwrite, or raise train.max_nonfinite_steps"
    )


def _check_data(data: DataPipeline, st: dict[str, Any], ckpt: Path, accept: bool, changed: dict[str, Any]) -> None:
    """C7: refuse a corpus that changed since ``ckpt`` unless ``accept`` (then ``changed`` is filled
    with the metrics row that records it); Q06: refuse a ``data_state`` outside the data."""
    binding = st.get("binding")
    old: dict[str, Any] | None = binding.get("corpus") if isinstance(binding, dict) else None
    if not isinstance(old, dict):
        old = None
    if old is None:
        print(
            f"replaid: note: checkpoint {ckpt} records no tokenizer or corpus fingerprint (written before "
            f"they were); the next checkpoint records them",
            file=sys.stderr,
        )
    new = data.binding()["corpus"]
    what = corpus_change(old, new) if old is not None else ""
    if what and not accept:
        raise ck.CheckpointError(
            f"--resume: the corpus data.source={data.cfg.data.source} changed since checkpoint {ckpt} ({what}); "
            f"going on would train the rest of the run on other data: restore it, or pass "
            f"--accept-changed-data to continue on the new data (recorded in metrics.jsonl)"
        )
    if what:
        changed.update(
            {
                "event": "data_changed",
                "change": what,
                "old_corpus": str(old.get("sha256") if old is not None else None),
                "new_corpus": new["sha256"],
            }
        )
    loader, ds = data.train_loader, st["data_state"]
    try:
        if what and isinstance(ds, dict) and isinstance(ds.get("index"), int):  # other data: go on from its next epoch
            ds = {**ds, "index": min(ds["index"], loader.steps_per_epoch)}
        loader.load_state_dict(ds)
        if loader.epoch > int(st["step"]):  # an epoch takes at least one (global) batch, one per step
            raise DataError(f"epoch {loader.epoch} is beyond the {st['step']} batches drawn by step {st['step']}")
    except (DataError, KeyError, TypeError, AttributeError) as e:
        raise ck.CheckpointError(
            f"checkpoint file {ckpt / 'state.json'} holds a damaged data_state ({e}); remove {ckpt} to fall "
            f"back on an earlier one"
        ) from None


def _resume(
    trainer: Trainer,
    run_dir: Path,
    data: DataPipeline,
    weights_only: bool = False,
    accept_changed_data: bool = False,
    changed: dict[str, Any] | None = None,
) -> ck.Stored | None:
    """Restore weights, method and data state, RNG and step (before wrapping); returns the checkpoint
    read, or None when the run has none yet (it then starts from step 0). The tokenizer and the corpus
    must be those the checkpoint records (:func:`check_tokenizer`, :func:`_check_data`)."""
    ckpt = ck.latest_checkpoint(run_dir)
    if ckpt is None:
        ck.explain_damage(run_dir)  # checkpoint folders, none complete: refuse, naming the damage
        print(f"replaid: note: {run_dir} has no checkpoint yet; starting it from step 0", file=sys.stderr)
        return None
    stored = ck.Stored(ckpt, ck.load_state(ckpt, need=ck.STATE_KEYS))
    st = stored.state
    if st.get("method") != trainer.cfg.method:
        raise ck.CheckpointError(
            f"checkpoint {ckpt} is a '{st.get('method')}' run, not '{trainer.cfg.method}'; "
            f"resume it with --method {st.get('method')} or start a new --out"
        )
    diff = ck.config_difference(trainer.cfg, stored.config(), ck.RESUME_MAY_CHANGE)
    if diff is not None:  # config.json edited behind the checkpoint's back (e.g. a block size 8 -> 16)
        key, now, then = diff
        raise ck.CheckpointError(
            f"--resume: {run_dir / 'config.json'} gives {key}={now!r} but checkpoint {ckpt} was trained with "
            f"{then!r}; --resume changes only train.steps (and how the run is logged, saved and run, not what it "
            f"trains): restore {key} in config.json, or train a new run with --out"
        )
    files = ("rng.safetensors",) if stored.sharded else ("optimizer.safetensors", "optimizer.json", "rng.safetensors")
    lacking = [f for f in files if not (ckpt / f).is_file()]
    if stored.sharded and not stored.has_part("optim"):
        lacking.append("an optimizer state in sharded/")
    if lacking and not weights_only:
        raise ck.CheckpointError(
            f"checkpoint {ckpt} lacks {', '.join(lacking)}: resuming would restart the "
            f"optimizer/RNG and not continue the run; pass --resume-weights-only to go on anyway"
        )
    check_tokenizer(data, st, ckpt)
    _check_data(data, st, ckpt, accept_changed_data, {} if changed is None else changed)
    if not stored.sharded:  # a sharded one is read once the model is placed (_train)
        ck.load_model_weights(trainer.model, stored.weights(ema=False)[0], str(ckpt))
    rng = stored.tensors("rng")
    if rng is not None:
        set_rng_state(rng)
    try:
        trainer.method.load_state_dict(st["method_state"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        why = str(e) if isinstance(e, ValueError) else e.__class__.__name__
        raise ck.CheckpointError(
            f"checkpoint file {ckpt / 'state.json'} holds a damaged method/data state "
            f"({why}); remove {ckpt} to fall back on an earlier one"
        ) from None
    trainer.step = int(st["step"])
    trainer.history = list(st.get("history_tail", []))
    trainer.nonfinite_steps, trainer.nonfinite_in_row = st.get("nonfinite_steps", 0), st.get("nonfinite_in_row", 0)
    return stored
