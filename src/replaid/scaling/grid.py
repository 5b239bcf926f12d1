"""A multi-seed grid as a manifest of :mod:`replaid.scaling.runner` (``replaid grid plan|run|report``).

The grid folder holds ``spec.json`` (the :class:`~replaid.eval.grid.GridSpec`), ``manifest.json`` (one
entry per (cell, seed)), ``configs/ID.json`` (each resolved config) and ``runs/ID`` (the run folders);
the runner skips finished runs and resumes interrupted ones, as for a scaling sweep. ``report``
reads each finished run's ``final_eval.json`` and writes ``report.json``, ``report.md`` and
``report.png`` (:func:`replaid.eval.grid.report`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from replaid.config import ConfigError, RunConfig
from replaid.eval.grid import (
    GridSpec,
    plan,
    plot_curves,
    plot_report,
    report,
    report_markdown,
    run_value,
    spec_from_dict,
)
from replaid.fileio import atomic_write_text
from replaid.scaling.plan import planned_vocab_size
from replaid.scaling.runner import run_status
from replaid.training import runfolder
from replaid.training.flops import train_flops_per_token


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
    for (run, cfg), e in zip(planned, entries):
        atomic_write_text(folder / e.config, cfg.to_json())
    atomic_write_text(folder / "spec.json", json.dumps(spec.to_dict(), indent=1))
    obj = {"version": 1, "kind": "grid", "runs": [asdict(e) for e in entries]}
    tmp = man.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
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
    try:
        obj = json.loads(man.read_text())
        if obj.get("kind") != "grid":
            raise KeyError("kind")
        entries = [GridEntry(**r) for r in obj["runs"]]
        spec = spec_from_dict(json.loads(sp.read_text()), f"grid spec {sp}")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{man} is not a grid manifest ({e.__class__.__name__}); re-plan it with 'replaid grid plan ... --force'"
        ) from None
    return spec, entries


def collect(folder: Path, entries: list[GridEntry]) -> tuple[list[dict], list[str]]:
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
        cfg = json.loads((run / "config.json").read_text())
        planned = json.loads((Path(folder) / e.config).read_text())
        if RunConfig.from_dict(cfg).to_dict() != RunConfig.from_dict(planned).to_dict():
            raise ConfigError(
                f"run {run} was trained with another config than the grid's {e.config} (re-planned "
                f"with --force?); move that run folder away to retrain it, or re-plan as it was"
            )
        rows.append(
            {
                "cell": e.cell,
                "seed": e.seed,
                "value": value,
                "kind": kind,
                "unigram": uni,
                "split": fe["eval"].get("split"),
                "config": e.overrides,
                "id": e.id,
                "threads": cfg.get("train", {}).get("num_threads"),
            }
        )
    return rows, missing


def write_report(
    folder: Path,
    reference: Optional[str] = None,
    confidence: float = 0.95,
    out: Optional[Path] = None,
    title: Optional[str] = None,
    command: Optional[str] = None,
) -> dict:
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
    atomic_write_text(out / "report.json", json.dumps(rep, indent=1))
    md = report_markdown(rep, name, command)
    md += f"\nBase `{spec.base}`, overrides of every run: `{' '.join(spec.overrides) or '(none)'}`.\n"
    if missing:
        md += f"\nNot finished (left out): {', '.join(missing)}.\n"
    md += "\n![every seed, means and intervals](report.png)\n"
    curves = training_curves(folder, [e for e in entries if e.id not in missing])
    if curves:
        md += "\n![training curves](curves.png)\n"
        plot_curves(curves, out / "curves.png", f"{name}: training curves")
    atomic_write_text(out / "report.md", md)
    plot_report(rep, out / "report.png", name)
    return rep


def training_curves(folder: Path, entries: list[GridEntry]) -> dict[str, dict[int, tuple[list[int], list[float]]]]:
    """``{cell: {seed: (steps, loss)}}`` from each run's ``metrics.jsonl`` (the training rows; the
    low-variance MDLM's logged ``nelbo`` where present, else ``loss``). Unreadable lines are skipped."""
    out: dict[str, dict[int, tuple[list[int], list[float]]]] = {}
    for e in entries:
        f = Path(folder) / e.run_dir / "metrics.jsonl"
        if not f.is_file():
            continue
        rows = {}
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = "nelbo" if "nelbo" in r else "loss"
            if isinstance(r, dict) and key in r and "step" in r:
                rows[int(r["step"])] = float(r[key])  # a resumed run logs a step again: keep the last
        if rows:
            steps = sorted(rows)
            out.setdefault(e.cell, {})[e.seed] = (steps, [rows[s] for s in steps])
    return out


def base_config_of(folder: Path, e: GridEntry) -> RunConfig:
    return RunConfig.from_dict(json.loads((Path(folder) / e.config).read_text()))
