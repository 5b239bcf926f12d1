"""A manifest runner: bring every run of a manifest to completion, locally or through submitit/SLURM.

A manifest is a folder with a list of entries, each with an ``id``, a ``run_dir`` and the resolved
``config`` file it trains (both relative to the folder), ``steps`` and a ``cost()`` (its share of the
progress bar): :class:`replaid.scaling.plan.PlanEntry` for the IsoFLOP study, and any other list of runs
(a multi-seed grid) that has the same members. A run's state is its run folder's own
(:func:`replaid.store.runfolder.status`): ``done`` runs are skipped, ``partial`` ones resumed,
``new`` ones started. Each run is trained by the training function (:func:`train_entry`: in this process)
or by ``replaid train`` in a subprocess (``--max-parallel`` at a time, logs in ``logs/ID.log``, or a
SLURM job array through submitit, each job under ``torchrun`` when it has several GPUs).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from io import TextIOWrapper
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from replaid.config import ConfigError, read_run_config
from replaid.eval.evaluate import evaluate
from replaid.scaling import launch
from replaid.schema import dumps as strict_dumps
from replaid.store import checkpoint as ck
from replaid.store import runfolder
from replaid.training.train import PREEMPTED_EXIT, Preempted, preemption_signals, train

if TYPE_CHECKING:
    import submitit
    from tqdm import tqdm


class ManifestEntry(Protocol):
    """One run of a manifest (module docstring)."""

    id: str
    run_dir: str  # relative to the manifest folder
    config: str  # the resolved config file, relative to the manifest folder
    steps: int

    def cost(self) -> float: ...


INPROCESS = "inprocess"  # --python inprocess: the training function in this process (no new interpreter)


# ------------------------------------------------------------------ run state


def check_entries(folder: Path, entries: Sequence[ManifestEntry], manifest: Path) -> None:
    """Refuse a manifest whose ``run_dir`` or ``config`` leaves its folder (absolute, or with ``..``):
    a manifest's runs live inside it, so that running it never resumes or replaces a run elsewhere.
    Checked on the paths as written (a ``runs/`` symlinked to other storage stays allowed)."""
    for e in entries:
        for key in ("run_dir", "config"):
            rel = getattr(e, key)
            parts = Path(rel).parts if isinstance(rel, str) else ()
            if not parts or Path(rel).is_absolute() or ".." in parts:
                raise ConfigError(
                    f"{manifest}: run {e.id}'s {key} {str(rel)[:80]!r} is outside the folder {folder} (absolute or "
                    f"with '..'); a manifest's runs live inside its folder: re-plan it, or move that run in"
                )


def legacy_final_eval(run: Path) -> dict[str, Any] | None:
    """Runs written before ``final_eval.json`` existed kept the final evaluation in the last checkpoint."""
    try:
        st = ck.load_state(ck.find_checkpoint(run))
    except ck.CheckpointError:
        return None
    steps = int(st.get("config", {}).get("train", {}).get("steps", -1))
    return st["final_eval"] if st.get("final_eval") and int(st.get("step", 0)) >= steps else None


def run_status(sweep: Path, e: ManifestEntry) -> tuple[str, int]:
    """``(state, step)`` from the run folder's own status (``store/runfolder.py``): ``done``
    (final checkpoint and its ``final_eval.json``), ``partial`` (config written, not finished:
    ``replaid train --resume`` continues it, from step 0 when no checkpoint was saved yet), ``new``."""
    run = Path(sweep) / e.run_dir
    st = runfolder.status(run)
    if st["state"] == "finished" or (st["state"] == "interrupted" and legacy_final_eval(run) is not None):
        return "done", int(st["step"])
    if st["state"] == "interrupted":
        return "partial", int(st["step"] or 0)
    return "new", 0


def command(sweep: Path, e: ManifestEntry, python: str = "replaid", resume: bool = False) -> list[str]:
    """The ``replaid train`` command line of ``e`` (``python``: how replaid is called)."""
    head = shlex.split(python) + ["train", "--out", str(Path(sweep) / e.run_dir), "--no-progress"]
    return head + (["--resume"] if resume else ["--config", str(Path(sweep) / e.config)])


def train_entry(sweep: Path, e: ManifestEntry, resume: bool) -> dict[str, Any]:
    """Train ``e`` with the training function in this process (resuming from its run folder's config)."""
    run = Path(sweep) / e.run_dir
    src = run / "config.json" if resume else Path(sweep) / e.config
    cfg = read_run_config(
        src, "re-plan the manifest" if not resume else "restore it, or move the run away to retrain it"
    )
    return train(cfg, run, evaluate=evaluate, resume=resume, progress=False)


# ------------------------------------------------------------------ executors


def train_command(sweep: Path, e: ManifestEntry, python: str, prefix: str = "") -> list[str]:
    """The command that brings ``e`` to completion from where it stands (resume when it can)."""
    state, _ = run_status(sweep, e)
    return shlex.split(prefix) + command(sweep, e, python, resume=state == "partial")


@dataclass
class RunJob:
    """One run as a picklable callable (submitit): trains it to completion, resuming from the run's
    last checkpoint when there is one, with the training function in this process (``python`` is
    :data:`INPROCESS`) or ``replaid train`` in a subprocess. ``checkpoint()`` makes a preempted or
    timed-out SLURM job requeue itself; the requeued job resumes."""

    sweep: str
    entry: ManifestEntry
    python: str
    prefix: str = ""
    torchrun_gpus: int = 0
    nodes: int = 1  # > 1: this task runs on each of the job's nodes, one torchrun each (scaling/launch.py)

    def _cmd(self) -> list[str]:
        py = self.python
        if self.torchrun_gpus > 0:
            py = shlex.join(launch.torchrun_argv(self.torchrun_gpus, self.nodes, os.environ))
        return train_command(Path(self.sweep), self.entry, py, self.prefix)

    def __call__(self) -> dict[str, Any]:
        e = self.entry
        sweep = Path(self.sweep)
        if run_status(sweep, e)[0] == "done":
            return {"id": e.id, "state": "done", "returncode": 0}
        log = sweep / "logs" / f"{e.id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = self._cmd()
        with open(log, "a") as f:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            if self.python == INPROCESS and not self.prefix and not self.torchrun_gpus:
                rc = _train_inprocess(sweep, e, f)
            else:
                rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env())
        return {"id": e.id, "state": run_status(sweep, e)[0], "returncode": rc}

    def checkpoint(
        self, *args: Any, **kwargs: Any
    ) -> submitit.helpers.DelayedSubmission:  # submitit: requeue on preemption/timeout
        import submitit

        return submitit.helpers.DelayedSubmission(
            RunJob(self.sweep, self.entry, self.python, self.prefix, self.torchrun_gpus, self.nodes)
        )


def _train_inprocess(sweep: Path, e: ManifestEntry, log: IO[str]) -> int:
    """:func:`train_entry` in this process, its output into ``log`` (one run at a time); 0 when it finished."""
    with redirect_stdout(log), redirect_stderr(log):
        try:
            res = train_entry(sweep, e, resume=run_status(sweep, e)[0] == "partial")
            print(strict_dumps({k: res[k] for k in ("step", "eval") if k in res}, indent=2))
            return 0
        except Preempted as e:  # its checkpoint is saved: the next 'scaling run' (or the requeue) resumes it
            print(f"replaid: preempted: {e}")
            return PREEMPTED_EXIT
        except Exception:  # one failed run must not end the sweep
            traceback.print_exc()
            return 1


def _env() -> dict[str, Any]:
    """Child environment: this process's, with this ``replaid`` package importable."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the replaid package
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def default_python() -> str:
    return f"{shlex.quote(sys.executable)} -m replaid"


def progress_line(sweep: Path, entries: Sequence[ManifestEntry]) -> str:
    states = [run_status(sweep, e) for e in entries]
    done = [e for e, (s, _) in zip(entries, states, strict=True) if s == "done"]
    spent = sum(e.cost() for e in done) + sum(
        e.cost() * st / max(1, e.steps) for e, (s, st) in zip(entries, states, strict=True) if s == "partial"
    )
    total = sum(e.cost() for e in entries)
    return (
        f"{len(done)}/{len(entries)} runs done, {spent:.3g} FLOPs spent, {total - spent:.3g} left "
        f"({100 * spent / max(total, 1e-30):.0f}%)"
    )


def run_local(
    sweep: Path,
    entries: Sequence[ManifestEntry],
    max_parallel: int = 1,
    python: str | None = None,
    prefix: str = "",
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every unfinished entry, ``max_parallel`` at a time, in subprocesses (logs in ``logs/``)."""
    from tqdm import tqdm

    python = python or default_python()
    todo = [e for e in entries if run_status(sweep, e)[0] != "done"]
    log(f"{len(entries) - len(todo)} of {len(entries)} runs already done; {len(todo)} to run")
    bar = tqdm(
        total=sum(e.cost() for e in entries),
        initial=sum(e.cost() for e in entries if e not in todo),
        unit="FLOP",
        unit_scale=True,
        disable=not progress,
        desc="FLOPs",
    )
    results: list[dict[str, Any]] = []
    running: list[tuple[ManifestEntry, subprocess.Popen[bytes], TextIOWrapper, float]] = []
    queue = list(todo)
    with preemption_signals() as got:  # SIGTERM/SIGUSR1: forwarded to the runs, which save and stop; none starts
        while queue or running:
            _step_local(sweep, entries, queue, running, results, max_parallel, python, prefix, bar, log, got)
    bar.close()
    return results


def _step_local(
    sweep: Path,
    entries: Sequence[ManifestEntry],
    queue: list[ManifestEntry],
    running: list[tuple[ManifestEntry, subprocess.Popen[bytes], TextIOWrapper, float]],
    results: list[dict[str, Any]],
    max_parallel: int,
    python: str,
    prefix: str,
    bar: tqdm,
    log: Callable[[str], None],
    got: dict[str, Any],
) -> None:
    """One turn of :func:`run_local`: start what may start, then collect what ended."""
    if "signal" in got:
        if queue:
            log(f"{got['signal']}: stopping; {len(queue)} run(s) not started, running ones save and stop")
        queue.clear()
        for e, p, _f, _t0 in running:
            if p.poll() is None and not got.get(e.id):
                p.send_signal(signal.SIGTERM)
                got[e.id] = True
    while queue and len(running) < max(1, max_parallel):
        e = queue.pop(0)
        job = RunJob(str(sweep), e, python, prefix)
        if python == INPROCESS:
            t0 = time.time()
            r = job()
            results.append({**r, "seconds": time.time() - t0})
            bar.update(e.cost())
            log(f"{e.id}: {r['state']} (exit {r['returncode']}); " + progress_line(sweep, entries))
            if r["returncode"] == PREEMPTED_EXIT:
                got.setdefault("signal", "preempted")
                queue.clear()
            continue
        logf = Path(sweep) / "logs" / f"{e.id}.log"
        logf.parent.mkdir(parents=True, exist_ok=True)
        f = open(logf, "a")
        cmd = job._cmd()
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        running.append((e, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env()), f, time.time()))
    time.sleep(0.2)
    for item in list(running):
        e, p, f, t0 = item
        if p.poll() is None:
            continue
        f.close()
        running.remove(item)
        state = run_status(sweep, e)[0]
        results.append({"id": e.id, "state": state, "returncode": p.returncode, "seconds": time.time() - t0})
        bar.update(e.cost())
        msg = f"{e.id}: {state} (exit {p.returncode}, {time.time() - t0:.0f}s)"
        if state != "done":
            msg += f"; see {Path(sweep) / 'logs' / (e.id + '.log')}"
        log(msg + "; " + progress_line(sweep, entries))


def _check_layouts(
    sweep: Path, todo: Sequence[ManifestEntry], nodes_per_job: int, gpus_per_job: int, gpu_memory_gb: float
) -> None:
    """Each run's layout on its job's ranks (batch over ranks, shard groups, memory against the stated GPU)."""
    from replaid.config import read_run_config
    from replaid.training.layout import check_layout

    for e in todo:
        src = Path(sweep) / e.run_dir / "config.json"
        cfg = read_run_config(src if src.is_file() else Path(sweep) / e.config)
        where = f"run {e.id} on --nodes-per-job {nodes_per_job} x --gpus-per-job {gpus_per_job}"
        check_layout(cfg, nodes_per_job * gpus_per_job, gpus_per_job, where, gpu_gb=gpu_memory_gb)


def _executor(
    executor: str,
    folder: Path,
    n_jobs: int,
    max_parallel: int,
    nodes_per_job: int,
    gpus_per_job: int,
    slurm_params: dict[str, Any] | None,
) -> submitit.Executor:
    """The submitit executor of ``executor`` with its parameters (a SLURM array of ``n_jobs``)."""
    import submitit

    if executor == "slurm":
        import shutil

        if not shutil.which("sbatch"):
            raise ConfigError(
                "--executor slurm needs SLURM's sbatch on PATH (run it on a login node); "
                "here use --executor local or submitit-local"
            )
        ex: submitit.Executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        params = {
            "slurm_array_parallelism": max_parallel or n_jobs,
            "timeout_min": 24 * 60,
            "slurm_signal_delay_s": 120,
            "nodes": nodes_per_job,
            "tasks_per_node": 1,
        }
        if gpus_per_job:
            params.update(gpus_per_node=gpus_per_job, cpus_per_task=8 * gpus_per_job)
        params.update(slurm_params or {})
        ex.update_parameters(**params)
    elif executor == "submitit-local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=60 * 24, **(slurm_params or {}))
    elif executor == "debug":
        ex = submitit.DebugExecutor(folder=folder)
    else:
        raise ConfigError(f"unknown executor '{executor}'; choose local, slurm, submitit-local or debug")
    return ex


def run_submitit(
    sweep: Path,
    entries: Sequence[ManifestEntry],
    executor: str = "slurm",
    max_parallel: int = 0,
    python: str | None = None,
    prefix: str = "",
    gpus_per_job: int = 0,
    slurm_params: dict[str, Any] | None = None,
    wait: bool = True,
    log: Callable[[str], None] = print,
    nodes_per_job: int = 1,
    gpu_memory_gb: float = 0.0,
) -> list[dict[str, Any]]:
    """Submit the unfinished entries as one job array through submitit (``gpu_memory_gb`` > 0: each run's step
    must fit it, :func:`~replaid.training.layout.check_layout`).

    ``nodes_per_job`` > 1 (slurm, with ``gpus_per_job``): each job spans that many nodes, one task per
    node, each running its node's torchrun with a c10d rendezvous on the job's first node.

    ``executor``: ``slurm`` (``submitit.AutoExecutor``, a SLURM array with ``max_parallel`` jobs at
    once, each a ``torchrun`` over ``gpus_per_job`` GPUs when > 0; preempted/timed-out jobs requeue
    and resume), ``submitit-local`` (``submitit.LocalExecutor``: subprocesses, same code path) or
    ``debug`` (``submitit.DebugExecutor``: in this process)."""

    if nodes_per_job > 1 and (executor != "slurm" or gpus_per_job < 1):
        raise ConfigError(
            f"--nodes-per-job {nodes_per_job} needs --executor slurm and --gpus-per-job G (torchrun on each node)"
        )
    # the one quoting rule of generated scripts (scaling/launch.py): submitit writes these into its
    # sbatch script (the parameters as #SBATCH lines, the folder as the log paths)
    launch.check_submitit_params(slurm_params or {})
    if executor == "slurm":
        launch.script_value(str(sweep), "the folder")
    python = python or default_python()
    todo = [e for e in entries if run_status(sweep, e)[0] != "done"]
    if executor == "slurm" and gpus_per_job:  # the layout each job will run, before any is submitted
        _check_layouts(sweep, todo, nodes_per_job, gpus_per_job, gpu_memory_gb)
    log(
        f"scaling run ({executor}): {len(entries) - len(todo)} of {len(entries)} runs already done; "
        f"{len(todo)} to submit"
    )
    if not todo:
        return []
    ex = _executor(
        executor, Path(sweep) / "submitit" / "%j", len(todo), max_parallel, nodes_per_job, gpus_per_job, slurm_params
    )
    # a submitit job is itself a Python worker: it runs replaid in-process unless it needs torchrun or a prefix
    job_python = python if (prefix or (gpus_per_job and executor == "slurm")) else INPROCESS
    gpus = gpus_per_job if executor == "slurm" else 0
    jobs_in = [RunJob(str(sweep), e, job_python, prefix, gpus, nodes_per_job) for e in todo]
    if executor == "submitit-local" and max_parallel:
        # LocalExecutor has no array throttle: submit in waves of max_parallel
        waves = [jobs_in[i : i + max_parallel] for i in range(0, len(jobs_in), max_parallel)]
    else:
        waves = [jobs_in]
    results = []
    for wave in waves:
        with ex.batch():
            jobs = [ex.submit(j) for j in wave]
        log(
            f"submitted {len(jobs)} job(s): {', '.join(str(j.job_id) for j in jobs[:5])}"
            f"{' ...' if len(jobs) > 5 else ''}"
        )
        if not wait:
            continue
        for job in jobs:
            r = job.result()
            results.append(r)
            log(f"{r['id']}: {r['state']} (exit {r['returncode']}); {progress_line(sweep, entries)}")
    return results
