"""Issue 49: one layout check (``replaid.training.layout``) shared by ``plan-cluster``, ``train --nodes``,
``grid run``/``scaling run`` with ``--nodes-per-job`` and the trainer (a new run and a resume): the global
batch splits over the ranks, HSDP's shard group divides them, the memory per GPU against the stated GPU.
A 2-rank checkpoint resumed on 3 ranks is not called damaged: the line names the rank counts that work.
Each case was seen failing on the old code."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.store import checkpoint as ck


def one_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), (rc, err)
    return err[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("layout") / "run"
    assert main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2",
                 "train.batch_size=8", "eval.max_batches=1", "train.num_threads=1"]) == 0  # fmt: skip
    return run


def test_a_checkpoint_of_2_ranks_resumed_on_3_is_intact_and_the_line_names_the_rank_counts(
    trained, tmp_path, capsys, monkeypatch
):
    """The old code said the checkpoint held "a damaged data_state" and to remove it (it is intact: the
    batch of 8 does not split over 3 ranks). The checkpoint is marked as saved on 2 ranks; this process
    counts as 3 (the check comes before any collective)."""
    from replaid import dist

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    st_file = ck.find_checkpoint(run) / "state.json"
    st = json.loads(st_file.read_text())
    st["world_size"] = 2
    st_file.write_text(json.dumps(st))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.setattr(dist, "world_size", lambda: 3)
    capsys.readouterr()
    line = one_line(capsys, main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=3"]))
    assert "3 ranks" in line and "intact" in line and "1, 2, 4" in line, line
    assert "damaged" not in line and "remove" not in line, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_new_run_whose_batch_does_not_split_over_its_ranks_is_refused(tmp_path, capsys, monkeypatch):
    """Batch 16 over 6 ranks: the old code trained a global batch of 12 (2 rows x 6) with no word."""
    from replaid import dist

    monkeypatch.setattr(dist, "world_size", lambda: 6)
    capsys.readouterr()
    line = one_line(capsys, main(["train", "--preset", "debug", "--out", str(tmp_path / "r"), "--no-progress",
                                  "train.steps=1", "train.batch_size=16"]))  # fmt: skip
    assert "train.batch_size=16 does not split over 6 ranks" in line and "1, 2, 4, 8" in line, line
    assert not (tmp_path / "r").exists()


@dataclass
class Entry:
    """A manifest entry as ``runner.run_submitit`` reads it (one run, its config under ``configs/``)."""

    id: str = "r0"
    run_dir: str = "runs/r0"
    config: str = "configs/r0.json"
    steps: int = 10

    def cost(self) -> float:
        return 1.0


@pytest.mark.parametrize(
    "nodes, gpus, sets, says",
    [
        (2, 3, ["train.batch_size=8"], "train.batch_size=8 does not split over 6 ranks"),
        (2, 2, ["train.batch_size=8", "train.parallel=hsdp", "train.hsdp_shard=3"], "train.hsdp_shard=3"),
        (2, 2, ["train.batch_size=16", "train.grad_accum=4"], "row(s) per micro-batch"),
    ],
)
def test_train_nodes_refuses_a_layout_that_cannot_run(tmp_path, capsys, nodes, gpus, sets, says):
    capsys.readouterr()
    argv = ["train", "--out", str(tmp_path / "r"), "--preset", "debug", "--nodes", str(nodes), "--gpus-per-node",
            str(gpus), "--dry-run", *sets]  # fmt: skip
    line = one_line(capsys, main(argv))
    assert says in line and f"--nodes {nodes} --gpus-per-node {gpus}" in line, line
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.sbatch").exists()


def test_plan_cluster_says_which_plans_do_not_fit_the_stated_gpu(capsys):
    """For a stated 1 GB GPU the old code printed plans of several GB per GPU without a word."""
    capsys.readouterr()
    assert main(["plan-cluster", "--nodes", "1", "2", "--gpu-memory-gb", "1"]) == 0
    out, err = capsys.readouterr()
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("owt-0.1b")]
    assert len(rows) == 2 and all(r[7] == "NO" for r in rows), out  # preset nodes GPUs micro x acc mem fits
    assert "do not fit the stated 1 GB per GPU" in err, err
    assert main(["plan-cluster", "--nodes", "1", "--gpu-memory-gb", "80"]) == 0
    out, err = capsys.readouterr()
    assert "yes" in out.split("\n")[2] and "do not fit" not in err


def test_plan_cluster_refuses_what_the_trainer_refuses(capsys):
    """HSDP's shard group from the config (train.hsdp_shard), and micro-batches of at least 2 rows."""
    capsys.readouterr()
    line = one_line(capsys, main(["plan-cluster", "--nodes", "1", "--gpus-per-node", "3", "--global-batch", "8"]))
    assert "does not split over 3 ranks" in line, line
    line = one_line(capsys, main(["plan-cluster", "--nodes", "1", "--gpus-per-node", "4", "--global-batch", "8",
                                  "--micro-batch", "1"]))  # fmt: skip
    assert "at least 2 rows" in line, line


def test_a_sweep_over_several_nodes_refuses_a_layout_that_cannot_run_before_submitting(tmp_path):
    """grid run / scaling run --executor slurm --nodes-per-job N --gpus-per-job G: each run's config is
    checked against N x G ranks before anything is submitted (the old code submitted it)."""
    from replaid.config import ConfigError
    from replaid.presets import resolve
    from replaid.scaling import runner

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "r0.json").write_text(resolve("debug", None, ["train.batch_size=8"]).to_json())
    with pytest.raises(ConfigError, match=r"run r0 .*train.batch_size=8 does not split over 6 ranks"):
        runner.run_submitit(tmp_path, [Entry()], "slurm", nodes_per_job=2, gpus_per_job=3)


def test_train_nodes_and_sweeps_check_memory_against_the_stated_gpu(tmp_path, capsys):
    """The stated GPU's memory is checked by the one layout check wherever it is stated: ``train --nodes
    --gpu-memory-gb`` and ``grid/scaling run --executor slurm --gpus-per-job --gpu-memory-gb`` refuse a step
    that the memory model puts above it (before anything is written or submitted), naming the
    ``train.grad_accum`` that fits; plan-cluster's memory column is the same function's figure."""
    from replaid.config import ConfigError
    from replaid.presets import resolve
    from replaid.scaling import runner
    from replaid.training.layout import gpu_memory, memory_problem

    sets = ["train.batch_size=64"]  # owt-0.1b: 8 rows per GPU over 8 GPUs, about 10 GB a step in bf16
    cfg = resolve("owt-0.1b", None, sets)
    need = gpu_memory(cfg, 50257, 8, 1) / 1e9
    assert 2 < need < 60, need
    capsys.readouterr()
    argv = ["train", "--out", str(tmp_path / "r"), "--preset", "owt-0.1b", "--nodes", "1", "--gpus-per-node", "8",
            "--dry-run", *sets]  # fmt: skip
    line = one_line(capsys, main([*argv, "--gpu-memory-gb", "5"]))
    assert f"needs about {need:.1f} GB per GPU" in line and "over the stated 5 GB" in line, line
    assert "train.grad_accum=" in line and "fits" in line, line
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.sbatch").exists()
    assert main([*argv, "--gpu-memory-gb", "80"]) == 0  # fits: the dry run prints its script
    capsys.readouterr()
    accum = int(line.split("train.grad_accum=")[1].split()[0])  # the advice holds: that accumulation fits
    assert not memory_problem(resolve("owt-0.1b", None, [*sets, f"train.grad_accum={accum}"]), 8, 8, 5, 0)
    assert (
        main(["plan-cluster", "--nodes", "1", "--global-batch", "64", "--micro-batch", "8", "--parallel", "ddp"]) == 0
    )
    row = next(ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("owt-0.1b"))
    assert float(row[6]) == pytest.approx(need, abs=0.06), row  # preset nodes GPUs micro x acc mem: one model

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "r0.json").write_text(cfg.to_json())
    with pytest.raises(ConfigError, match=r"run r0 .*needs about .* GB per GPU .* over the stated 5 GB"):
        runner.run_submitit(tmp_path, [Entry()], "slurm", gpus_per_job=8, gpu_memory_gb=5)
    (tmp_path / "spec.yaml").write_text("base: debug\ncells:\n  a: [method=ar]\n")
    assert main(["grid", "plan", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "g")]) == 0
    capsys.readouterr()
    line = one_line(capsys, main(["grid", "run", str(tmp_path / "g"), "--gpu-memory-gb", "2"]))
    assert "--gpu-memory-gb" in line and "--executor slurm --gpus-per-job" in line, line
