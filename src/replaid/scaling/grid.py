"""A multi-seed grid as a manifest of :mod:`replaid.scaling.runner` (``replaid grid plan|run|report``).

The grid folder holds ``spec.json`` (the :class:`~replaid.eval.grid.GridSpec`), ``manifest.json`` (one
entry per (cell, seed)), ``configs/ID.json`` (each resolved config) and ``runs/ID`` (the run folders);
the runner skips finished runs and resumes interrupted ones, as for a scaling sweep. ``report``
reads each finished run's ``final_eval.json`` and writes ``report.json``, ``report.md`` and
``report.png`` (:func:`replaid.eval.grid.report`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replaid import schema
from replaid.config import ConfigError, RunConfig, read_run_config
from replaid.eval.grid import (
    SIGNATURE_PANELS,
    GridSpec,
    plan,
    plot_curves,
    plot_report,
    plot_signatures,
    report,
    report_markdown,
    run_value,
    spec_from_dict,
)
from replaid.eval.seeds import plateau_exit
from replaid.fileio import atomic_write_text
from replaid.scaling.plan import planned_vocab_size
from replaid.scaling.runner import check_entries, run_status
from replaid.schema import dumps as strict_dumps
from replaid.store import runfolder
from replaid.training.flops import train_flops_per_token

REPLAN = "re-plan the grid with 'replaid grid plan SPEC --out GRID --force' (its runs are kept)"


@dataclass
class GridEntry:
    """One (cell, seed) run of a grid: a :class:`~replaid.scaling.runner.ManifestEntry`."""

    id: str
    cell: str
    seed: int
    overrides: list[str]
    run_dir: str
    config: str
    steps: int
    flops: float

    def cost(self) -> float:
        return self.flops


def write_grid(spec: GridSpec, folder: Path, force: bool = False) -> list[GridEntry]:
    """Resolve every run and write ``spec.json``, ``manifest.json`` and ``configs/``; never replaces
    another grid's manifest unless ``force`` (its runs are kept)."""
    folder = Path(folder)
    man = folder / "manifest.json"
    if man.exists() and not force:
        raise ConfigError(f"{man} exists; pick a new --out, or pass --force to re-plan that grid (runs are kept)")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {folder} is a file; choose a folder for the grid")
    if folder.is_dir() and not man.exists() and any(folder.iterdir()):
        raise ConfigError(f"--out {folder} is a non-empty folder that holds no grid; choose a new or empty folder")
    planned = plan(spec)
    entries = []
    for run, cfg in planned:
        fpt = train_flops_per_token(cfg, planned_vocab_size(cfg))
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len
        entries.append(
            GridEntry(run.id, run.cell, run.seed, run.overrides, run.run_dir, run.config, cfg.train.steps, fpt * tokens)
        )
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    for (_run, cfg), e in zip(planned, entries, strict=True):
        atomic_write_text(folder / e.config, cfg.to_json())
    atomic_write_text(folder / "spec.json", strict_dumps(spec.to_dict(), indent=1))
    obj = {"version": 1, "kind": "grid", "runs": [asdict(e) for e in entries]}
    tmp = man.with_suffix(".json.tmp")
    tmp.write_text(strict_dumps(obj, indent=1))
    os.replace(tmp, man)
    return entries


def read_grid(folder: Path) -> tuple[GridSpec, list[GridEntry]]:
    folder = Path(folder)
    man, sp = folder / "manifest.json", folder / "spec.json"
    if not man.is_file() or not sp.is_file():
        raise ConfigError(
            f"{folder} holds no grid (manifest.json and spec.json); make one with "
            f"'replaid grid plan SPEC --out {folder}'"
        )
    obj = schema.read_json(man, schema.MANIFEST, REPLAN)
    if obj.get("kind") != "grid":
        raise ConfigError(f'{man}: field "kind" is {obj.get("kind")!r}, not "grid"; {REPLAN}')
    entries = []
    for i, r in enumerate(obj["runs"]):
        r = schema.validate(r, schema.GRID_RUN, f"{man}: runs[{i}]", REPLAN)
        if not all(isinstance(o, str) for o in r["overrides"]):
            raise ConfigError(f'{man}: runs[{i}]: field "overrides" is not a list of strings; {REPLAN}')
        entries.append(GridEntry(**{k: r[k] for k in schema.GRID_RUN}))
    spec = spec_from_dict(schema.read_json(sp, None, REPLAN), f"grid spec {sp}")
    check_entries(folder, entries, man)
    return spec, entries


def collect(folder: Path, entries: list[GridEntry]) -> tuple[list[dict[str, Any]], list[str]]:
    """The finished runs' rows for :func:`replaid.eval.grid.report`, and the ids not finished."""
    rows, missing = [], []
    for e in entries:
        if run_status(folder, e)[0] != "done":
            missing.append(e.id)
            continue
        run = Path(folder) / e.run_dir
        fe = runfolder.read_final_eval(run)
        if not fe:
            missing.append(e.id)
            continue
        value, kind, uni = run_value(fe)
        run_cfg = read_run_config(run / "config.json")
        if run_cfg.to_dict() != read_run_config(Path(folder) / e.config, REPLAN).to_dict():
            raise ConfigError(
                f"run {run} was trained with another config than the grid's {e.config} (re-planned "
                f"with --force?); move that run folder away to retrain it, or re-plan as it was"
            )
        exit_step, last_step, reference = plateau_exit_of(run)
        rows.append(
            {
                "plateau_exit": exit_step,
                "last_step": last_step,
                "exit_reference": reference,
                "cell": e.cell,
                "seed": e.seed,
                "value": value,
                "kind": kind,
                "unigram": uni,
                "split": fe["eval"].get("split"),
                "config": e.overrides,
                "id": e.id,
                "threads": run_cfg.train.num_threads,
            }
        )
    return rows, missing


def write_report(
    folder: Path,
    reference: str | None = None,
    confidence: float = 0.95,
    out: Path | None = None,
    title: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """``report.json``, ``report.md`` and ``report.png`` of the grid's finished runs (in ``out``,
    default the grid folder)."""
    folder = Path(folder)
    spec, entries = read_grid(folder)
    rows, missing = collect(folder, entries)
    if not rows:
        raise ConfigError(f"grid {folder} has no finished run yet; run 'replaid grid run {folder}' first")
    ref = reference if reference is not None else spec.reference
    rep = report(rows, ref, confidence, list(spec.cell_overrides()), spec.orderings, spec.paper)
    rep.update(grid=str(folder), base=spec.base, overrides=spec.overrides, unfinished=missing)
    out = Path(out) if out else folder
    out.mkdir(parents=True, exist_ok=True)
    name = title or f"Grid report: {folder.name}"
    atomic_write_text(out / "report.json", strict_dumps(rep, indent=1))
    md = report_markdown(rep, name, command)
    md += f"\nBase `{spec.base}`, overrides of every run: `{' '.join(spec.overrides) or '(none)'}`.\n"
    if missing:
        md += f"\nNot finished (left out): {', '.join(missing)}.\n"
    md += "\n![every seed, means and intervals](report.png)\n"
    curves = training_curves(folder, [e for e in entries if e.id not in missing])
    if curves:
        md += "\n![training curves](curves.png)\n"
        plot_curves(curves, out / "curves.png", f"{name}: training curves")
    sig = signature_series(folder, [e for e in entries if e.id not in missing])
    if sig:
        exits: dict[str, dict[int, int | None]] = {}
        for r in rows:
            exits.setdefault(r["cell"], {})[r["seed"]] = r["plateau_exit"]
        md += "\n![plateau signatures beside each run's exit](signatures.png)\n"
        plot_signatures(sig, exits, out / "signatures.png", f"{name}: plateau signatures (dotted: exits)")
    atomic_write_text(out / "report.md", md)
    plot_report(rep, out / "report.png", name)
    return rep


def metrics_rows(run: Path) -> Iterator[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (:data:`replaid.schema.METRICS_ROW`), in order; a stray
    line of this append-only log (a torn last line, an edit) is skipped with a warning."""
    yield from schema.jsonl_rows(Path(run) / "metrics.jsonl", schema.METRICS_ROW)


def training_rows(run: Path) -> dict[int, tuple[float, float | None]]:
    """``{step: (bound, unigram or None)}`` of a run's logged training rows (:func:`metrics_rows`; the
    low-variance MDLM's ``nelbo`` where present, else ``loss``; ``unigram``: the same tokens' unigram
    NLL, logged by the trainer). A step logged again (resume) keeps the last."""
    rows: dict[int, tuple[float, float | None]] = {}
    for r in metrics_rows(run):
        key = "nelbo" if "nelbo" in r else "loss"
        if isinstance(r.get(key), (int, float)):
            u = r.get("unigram")
            rows[r["step"]] = (float(r[key]), float(u) if isinstance(u, (int, float)) else None)
    return rows


def plateau_exit_of(run: Path) -> tuple[int | None, int | None, str]:
    """(plateau-exit step, last logged step, what the bound was read against) of a finished run
    (:func:`replaid.eval.seeds.plateau_exit`): the logged unigram NLL of each row's training tokens;
    for a run logged before that existed, the train split's unigram NLL (the same model, the expected
    value over the split rather than over each row's tokens)."""
    rows = training_rows(run)
    if not rows:
        return None, None, "no training rows"
    steps = sorted(rows)
    bound = [rows[s][0] for s in steps]
    uni = [rows[s][1] for s in steps]
    if all(u is not None for u in uni):
        reference = "the logged rows' tokens"
        ref = [float(u) for u in uni]  # type: ignore[arg-type]
    else:
        reference = "the train split (rows logged without 'unigram')"
        ref = [train_split_unigram(run)] * len(steps)
    return plateau_exit(steps, bound, ref), steps[-1], reference


def train_split_unigram(run: Path) -> float:
    """The train split's NLL (nats/token) under its own add-one unigram model, with the run's tokenizer."""
    from replaid.data import unigram_nll
    from replaid.data.pipeline import DataPipeline

    cfg = read_run_config(Path(run) / "config.json")
    data = DataPipeline(cfg, Path(run), train=False)
    arr = data.array("train")[0]
    return unigram_nll(arr, arr, data.vocab_size)


def training_curves(folder: Path, entries: list[GridEntry]) -> dict[str, dict[int, tuple[list[int], list[float]]]]:
    """``{cell: {seed: (steps, bound)}}`` from each run's logged training rows (:func:`training_rows`)."""
    out: dict[str, dict[int, tuple[list[int], list[float]]]] = {}
    for e in entries:
        rows = training_rows(Path(folder) / e.run_dir)
        if rows:
            steps = sorted(rows)
            out.setdefault(e.cell, {})[e.seed] = (steps, [rows[s][0] for s in steps])
    return out


def signature_series(
    folder: Path, entries: list[GridEntry]
) -> dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]]:
    """``{key: {cell: {seed: (steps, values)}}}`` of the plateau signatures each run logged
    (:mod:`replaid.training.signatures`) and its gamma_0; per-layer keys under ``<name>/last`` (the
    deepest layer logged). Empty when no run logged a signature."""
    out: dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]] = {}
    for e in entries:
        series: dict[str, dict[int, float]] = {}
        for r in metrics_rows(Path(folder) / e.run_dir):
            if "loss" not in r:
                continue
            layers: dict[str, tuple[int, float]] = {}
            for k, v in r.items():
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                head, _, tail = k.partition("/")
                if head in ("attn_entropy", "pos_cosine") and tail.isdigit():
                    if int(tail) >= layers.get(head, (-1, 0.0))[0]:
                        layers[head] = (int(tail), float(v))
                elif k in {key for key, _ in SIGNATURE_PANELS}:
                    series.setdefault(k, {})[r["step"]] = float(v)
            for head, (_, v) in layers.items():
                series.setdefault(f"{head}/last", {})[r["step"]] = v
        if not any(k != "gamma_0" for k in series):
            continue
        for k, by_step in series.items():
            steps = sorted(by_step)
            out.setdefault(k, {}).setdefault(e.cell, {})[e.seed] = (steps, [by_step[s] for s in steps])
    return out


def base_config_of(folder: Path, e: GridEntry) -> RunConfig:
    return read_run_config(Path(folder) / e.config, REPLAN)
