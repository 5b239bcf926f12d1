"""``replaid distill``: a teacher run in, a student run folder out (progressive or consistency
distillation, :mod:`replaid.distill.targets`).

The student is a normal run folder (``config.json``, ``tokenizer/``, ``checkpoints/``) that ``sample``,
``eval``, ``export``, ``serve`` load as any RePlaid run; its config is the teacher's with
``model.self_conditioning: false`` (the student sees no self-conditioning input). ``distill.json``
records the distillation settings and the teacher; each checkpoint's ``state.json`` carries
``distill`` (round, student steps). Checkpoints are the trainer's (:func:`replaid.store.checkpoint.
save_checkpoint`: atomic, never a NaN, ``LATEST``), the folder is claimed and locked as ``train``
does, and ``resume`` continues from the newest one with the same optimizer state, data position
and noise streams (seeded by the step). Progressive distillation freezes each round's teacher into
``distill/teacher_round_R.safetensors`` before the round's first step, so a resumed round distils
from the same teacher.

The schedule and the embedding matrix are frozen at the teacher's (they get no gradient).

A block-diffusion teacher (``diffusion.block_size`` = b < ``seq_len``) is distilled per
block (:mod:`replaid.distill.blocks`): each block's PF-ODE given the clean blocks before it, every
(row, block) of a batch at its own step; the student keeps the teacher's blocks, and its K steps are
each block's (``sample_any_length(..., sampler="ddim", steps=K)``). Progressive only.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from replaid import schema
from replaid.config import ConfigError
from replaid.distill import targets as T
from replaid.distill.blocks import block_progressive_batch
from replaid.distill.config import DistillConfig as DistillConfig  # the CLI and tests import it from here
from replaid.fileio import fsync_file
from replaid.model.replaid import RePlaid
from replaid.sampling.continuous import gamma_grid
from replaid.schema import dumps as strict_dumps
from replaid.store import checkpoint as ck
from replaid.store import runfolder
from replaid.store.loading import Run, load_run, run_dir_of
from replaid.training.train import EMA, rng_state, set_rng_state


def _ehat_fn(model: torch.nn.Module) -> T.EHat:
    """The model as the distillers call it: float64 latent and noise level in, float64 ``e_hat`` out."""

    def call(z: Tensor, gamma: float, e_sc: Tensor | None) -> Tensor:
        g = torch.full((z.shape[0],), gamma, dtype=torch.float64, device=z.device)  # (B,)
        sc = None if e_sc is None else e_sc.float()
        e_hat: Tensor = model(z.float(), g, sc).e_hat.double()
        return e_hat

    return call


def _freeze_schedule_and_embeddings(model: RePlaid) -> None:
    for p in list(model.embedding.parameters()) + list(model.schedule.parameters()):
        p.requires_grad_(False)


def _atomic_save(tensors: dict[str, Tensor], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    fsync_file(tmp)
    tmp.replace(path)


def teacher_block(teacher: Run, dcfg: DistillConfig) -> int:
    """The teacher's block size (0: no blocks), after refusing what cannot be distilled: a teacher other
    than RePlaid, consistency distillation of a block run."""
    if not teacher.method.kind.continuous or teacher.cfg.method != "replaid":
        raise ConfigError(
            f"replaid distill needs a RePlaid teacher run; {teacher.ckpt} is a '{teacher.cfg.method}' run"
        )
    block = teacher.method.block_size()  # diffusion.block_size when it splits the sequence, else 0
    if block and dcfg.method != "progressive":
        raise ConfigError(
            f"distill: {teacher.ckpt} has blocks of {block} tokens (diffusion.block_size); block runs are "
            f"distilled with --method progressive only"
        )
    return block


class Distiller:
    """One distillation: the frozen teacher, the student (and its EMA target), the optimiser."""

    def __init__(self, teacher: Run, dcfg: DistillConfig, out: Path):
        # with blocks: each block's PF-ODE given the clean blocks before it (distill/blocks.py)
        self.block = teacher_block(teacher, dcfg)
        self.teacher_run, self.dcfg, self.out = teacher, dcfg, out
        self.device = next(teacher.model.parameters()).device
        self.teacher = cast(RePlaid, teacher.model.eval())  # checked above: a RePlaid run
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.cfg = copy.deepcopy(teacher.cfg)
        self.cfg.model.self_conditioning = False  # the student sees no self-conditioning input
        if dcfg.batch_size:
            self.cfg.train.batch_size = dcfg.batch_size
        self.cfg.train.seed = dcfg.seed
        self.student = copy.deepcopy(self.teacher).train()
        self.student.self_conditioning = False
        for p in self.student.parameters():
            p.requires_grad_(True)
        _freeze_schedule_and_embeddings(self.student)
        self.params = [p for p in self.student.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=dcfg.lr, weight_decay=0.0)
        cd = dcfg.method == "consistency"
        self.target: EMA | None = EMA(self.student, dcfg.cd_ema) if cd else None  # saved as ema.safetensors
        self.target_model = copy.deepcopy(self.student).eval() if cd else None
        self.round_teacher: torch.nn.Module | None = None
        self.round = -1
        self.step = 0
        E = self.teacher.embedding_matrix().detach()  # (V, d_e), frozen
        self.E = E
        self.sc_teacher = bool(self.teacher.self_conditioning) and teacher.cfg.model.self_conditioning

    # ---- progressive ---------------------------------------------------------------------
    def _teacher_file(self, rnd: int) -> Path:
        return self.out / "distill" / f"teacher_round_{rnd}.safetensors"

    def _enter_round(self, rnd: int) -> None:
        """The teacher of round ``rnd``: the original teacher, later the student frozen when the round began."""
        if rnd == self.round:
            return
        self.round = rnd
        if rnd == 0:
            self.round_teacher, self.round_sc = self.teacher, self.sc_teacher
            return
        f = self._teacher_file(rnd)
        if not f.is_file():
            _atomic_save(self.student.state_dict(), f)
        t = copy.deepcopy(self.student).eval()
        ck.load_model_weights(t, load_file(str(f)), str(f))
        for p in t.parameters():
            p.requires_grad_(False)
        self.round_teacher, self.round_sc = t, False

    def progressive_loss(self, tokens: Tensor, gen: torch.Generator) -> tuple[Tensor, dict[str, float]]:
        d = self.dcfg
        rnd = self.step // d.steps_per_round
        self._enter_round(rnd)
        K = d.student_steps(rnd)
        g_teacher = gamma_grid(self.teacher.schedule, 2 * K)  # (2K + 1,) float64, the student's grid every other
        assert self.round_teacher is not None
        teach = _ehat_fn(self.round_teacher)
        # round 0 distils the teacher's chosen solver; later rounds the previous student's DDIM steps,
        # the steps it was trained to take
        solver = d.teacher_solver if rnd == 0 else "ddim"
        if self.block:  # every block of every row at its own step, the clean blocks before it as context
            loss, per_row = block_progressive_batch(
                self.student, self.round_teacher, self.round_sc, self.E, tokens, self.block, g_teacher, gen, solver
            )
            return loss, {
                "loss": float(loss.detach()),
                "mse_e": float(per_row.mean()),
                "round": rnd,
                "student_steps": K,
            }
        loss, per_row = T.progressive_batch(self.student, teach, self.round_sc, self.E, tokens, g_teacher, gen, solver)
        return loss, {"loss": float(loss.detach()), "mse_e": float(per_row.mean()), "round": rnd, "student_steps": K}

    # ---- consistency ---------------------------------------------------------------------
    def consistency_loss(self, tokens: Tensor, gen: torch.Generator) -> tuple[Tensor, dict[str, float]]:
        d = self.dcfg
        g = gamma_grid(self.teacher.schedule, d.cd_levels)  # (N + 1,)
        assert self.target is not None and self.target_model is not None
        self.target_model.load_state_dict(self.target.shadow)
        teach = _ehat_fn(self.teacher)

        def step(z: Tensor, g_t: float, g_s: float) -> Tensor:
            return T.teacher_ode_step(teach, z, g_t, g_s, d.cd_solver, self.sc_teacher)

        loss = T.consistency_batch(self.student, step, _ehat_fn(self.target_model), self.E, tokens, g, gen)
        return loss, {"loss": float(loss.detach())}

    # ---- the loop ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "method": self.cfg.method,
            "vocab_size": self.teacher_run.data.vocab_size,
            "method_state": self.teacher_run.method.state_dict(),
            "data_state": self.loader.state_dict(),
            "binding": self.data.binding(),  # the student's tokenizer/ (the teacher's, copied) and corpus
            "distill": {
                **asdict(self.dcfg),
                "teacher": str(self.teacher_run.ckpt),
                "round": max(self.round, 0),
                "student_steps": self._sampling_steps(),
            },
        }

    def _sampling_steps(self) -> int:
        d = self.dcfg
        if d.method == "consistency":
            return 4
        done = self.step // d.steps_per_round
        return d.student_steps(min(done, d.rounds) - 1) if done else d.from_steps

    def milestones(self) -> set[int]:
        """The steps that end a progressive round: each one's checkpoint is that round's student
        (``checkpoints/step_{r x steps_per_round}`` samples at ``from_steps / 2^r`` steps), kept to the end."""
        d = self.dcfg
        return {r * d.steps_per_round for r in range(1, d.rounds + 1)} if d.method == "progressive" else set()

    def save(self) -> Path:
        ema = self.target.shadow if self.target is not None else None
        return ck.save_checkpoint(
            self.out,
            self.step,
            self.student.state_dict(),
            self.state(),
            ema_sd=None if ema is None else dict(ema),
            opt_sd=self.opt.state_dict(),
            rng=rng_state(),
            milestones=self.milestones(),
        )

    def resume(self) -> None:
        ckpt = ck.latest_checkpoint(self.out)
        if ckpt is None:
            ck.explain_damage(self.out)
            print(f"replaid: note: {self.out} has no checkpoint yet; distilling from step 0", file=sys.stderr)
            return
        stored = ck.Stored(ckpt, ck.load_state(ckpt, need=ck.STATE_KEYS + ("distill",)))
        ck.load_model_weights(self.student, stored.weights(ema=False)[0], str(ckpt))
        opt = stored.optimizer()
        if opt is None:
            raise ck.CheckpointError(f"checkpoint {ckpt} lacks the optimizer state; distil again with --overwrite")
        self.opt.load_state_dict(opt)
        if self.target is not None:
            ema = stored.tensors("ema")
            if ema is not None:
                self.target.shadow = {k: v.to(self.device) for k, v in ema.items()}
        rng = stored.tensors("rng")
        if rng is not None:
            set_rng_state(rng)
        self.loader.load_state_dict(stored.state["data_state"])
        self.step = stored.step

    def run(
        self, resume: bool, progress: bool, stop_after: int | None, log: Callable[[dict[str, float]], None]
    ) -> dict[str, float]:
        from replaid.data.pipeline import DataPipeline

        self.data = DataPipeline(self.cfg, self.out, train=True, new_run=not resume)  # resumed: its own tokenizer/
        self.loader = self.data.train_loader
        if resume:
            self.resume()
        total = self.dcfg.total_steps
        end = total if stop_after is None else min(total, self.step + stop_after)
        loss_fn = self.progressive_loss if self.dcfg.method == "progressive" else self.consistency_loss
        bar = tqdm(total=total, initial=self.step, desc=f"distill ({self.dcfg.method})", disable=not progress)
        t0, m = time.time(), dict[str, float]()
        while self.step < end:
            tokens = next(self.loader)["tokens"]
            assert tokens is not None  # every batch holds its tokens
            tokens = tokens.to(self.device)  # (B, L)
            gen = torch.Generator().manual_seed(self.dcfg.seed * 1_000_003 + self.step)
            loss, m = loss_fn(tokens, gen)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            gn = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            if torch.isfinite(loss) and torch.isfinite(gn):
                self.opt.step()
                if self.target is not None:
                    self.target.update(self.student)
            self.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{m['loss']:.4f}")
            if self.step % 25 == 0 or self.step == end:
                log({"step": self.step, **m, "grad_norm": float(gn), "seconds": time.time() - t0})
            if self.step % self.dcfg.save_every == 0 or self.step == end or self.step in self.milestones():
                self.save()
        bar.close()
        if self.dcfg.method == "progressive" and self.step < total:
            self._enter_round(self.step // self.dcfg.steps_per_round)  # snapshot a round that begins now
        return {"step": self.step, "total_steps": total, "student_steps": self._sampling_steps(), **m}


def distill(
    teacher_path: str | Path,
    out: str | Path,
    dcfg: DistillConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, float]:
    """Distil ``teacher_path`` into the student run folder ``out`` (module docstring); returns the last metrics."""
    dcfg.validate()
    out = Path(out)
    if dcfg.num_threads:
        torch.set_num_threads(dcfg.num_threads)
    teacher = load_run(teacher_path, use_ema=True, train_data=False, device=dcfg.device)
    teacher_block(teacher, dcfg)  # refused before the folder is claimed
    if resume and (out / "distill.json").is_file():
        fix = "it is damaged: restore it, or start the student again with --overwrite"
        stored = schema.read_json(out / "distill.json", schema.DISTILL, fix)
        # a key added since the folder was made reads as its default (teacher_solver: ddim)
        if {**asdict(DistillConfig()), **stored["config"]} != asdict(dcfg):
            raise ConfigError(
                f"--resume: {out} was distilled with other settings ({out / 'distill.json'}); give the same "
                f"options, or --overwrite"
            )
    with runfolder.claim(out, resume=resume, overwrite=overwrite):
        d = Distiller(teacher, dcfg, out)
        if not resume or not (out / "config.json").is_file():
            tok_src = run_dir_of(Path(teacher.ckpt)) / "tokenizer"  # a run's, or an exported folder's
            if tok_src.is_dir() and not (out / "tokenizer").exists():
                shutil.copytree(tok_src, out / "tokenizer")
            runfolder.begin(out, d.cfg.to_json())
            from replaid.fileio import atomic_write_text

            atomic_write_text(
                out / "distill.json", strict_dumps({"config": asdict(dcfg), "teacher": str(teacher.ckpt)}, indent=2)
            )
        log_path = out / "distill_metrics.jsonl"

        def log(row: dict[str, float]) -> None:
            with open(log_path, "a") as f:
                f.write(strict_dumps(row) + "\n")

        return d.run(resume, progress, stop_after, log)
