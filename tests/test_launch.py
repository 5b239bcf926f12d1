"""Issue 36 §1: the multi-node launch path (scaling/launch.py, ``replaid train --nodes N``), tested by
simulating SLURM's environment: the per-node torchrun command, the sbatch script ``--dry-run`` prints,
one-line errors, and two ``torchrun --nnodes 2`` launchers on this machine (127.0.0.1 c10d rendezvous,
gloo, 2 ranks each) started with the commands the launcher builds, whose run equals a one-node
4-rank run."""

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest
import torch

from replaid.config import ConfigError
from replaid.scaling import launch
from replaid.store import checkpoint as ck

SLURM = {"SLURM_JOB_NODELIST": "gpu-a[07-09,12]", "SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_ID": "4242"}


def test_first_host_of_slurm_node_lists():
    assert launch.first_host("gpu-a[07-09,12],gpu-b3") == "gpu-a07"
    assert launch.first_host("node[3,5]") == "node3"
    assert launch.first_host("n[001-004]-ib") == "n001-ib"
    assert launch.first_host("solo,other") == "solo"
    assert launch.first_host("127.0.0.1") == "127.0.0.1"


def test_each_node_gets_torchrun_with_a_c10d_rendezvous_on_the_first_node():
    argv = launch.torchrun_argv(8, 4, SLURM)
    assert argv == shlex.split(
        "torchrun --nproc_per_node 8 --nnodes 4 --node_rank 2 --rdzv_backend c10d "
        "--rdzv_endpoint gpu-a07:29742 --rdzv_id 4242 -m replaid"
    )
    own = launch.torchrun_argv(8, 4, {**SLURM, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "31000"})
    assert "10.0.0.9:31000" in own  # torchrun's own variables win
    assert launch.torchrun_argv(8, 1, {}) == shlex.split("torchrun --standalone --nproc_per_node 8 -m replaid")
    outside = launch.torchrun_argv(2, 2, {"MASTER_ADDR": "h", "NODE_RANK": "1"})  # no SLURM: torchrun's names
    assert outside[outside.index("--node_rank") + 1] == "1" and "h:29500" in outside


@pytest.mark.parametrize(
    "env, needle",
    [
        ({**SLURM, "SLURM_NNODES": "2"}, "this SLURM allocation has 2 nodes"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_NODEID"}, "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "7"}, "0 to 3"),
        ({"SLURM_NODEID": "0"}, "head node's address"),
        ({**SLURM, "MASTER_PORT": "http"}, "not a port number"),
    ],
)
def test_a_bad_or_missing_variable_is_named(env, needle):
    with pytest.raises(ConfigError, match=needle):
        launch.torchrun_argv(8, 4, env)


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120
    )


def test_the_node_command_module_prints_this_nodes_torchrun_or_one_error_line():
    r = cli("replaid.scaling.launch", "--nodes", "4", "--gpus-per-node", "8", env=SLURM)
    assert r.returncode == 0
    assert shlex.split(r.stdout)[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--node_rank 2" in r.stdout and "gpu-a07:29742" in r.stdout  # 29500 + job id mod 1000
    r = cli("replaid.scaling.launch", "--nodes", "2", "--gpus-per-node", "8", env=SLURM)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "replaid: error: --nodes 2 but this SLURM allocation has 4 nodes (SLURM_NNODES): pass --nodes 4"
    ]


def test_train_nodes_dry_run_prints_the_sbatch_script_and_node_0s_command(tmp_path):
    out = tmp_path / "big run"
    r = cli("replaid", "train", "--out", str(out), "--preset", "debug", "--nodes", "2", "--gpus-per-node", "8",
            "--slurm=--partition=gpu", "--dry-run", "train.batch_size=32", "train.parallel=hsdp")  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=B:TERM@120", "#SBATCH --requeue", "#SBATCH --partition=gpu"):  # fmt: skip
        assert line in s.splitlines(), line
    assert "replaid.scaling.launch --nodes 2 --gpus-per-node 8" in s and "scontrol requeue" in s
    assert f"run=(train --out {shlex.quote(str(out))} --resume)" in s  # a requeued job resumes
    node0 = s.splitlines()[-1]
    assert node0.startswith("# node 0 runs: torchrun --nproc_per_node 8 --nnodes 2 --node_rank 0 --rdzv_backend c10d")
    assert node0.endswith("train.parallel=hsdp") and not out.exists()  # nothing submitted, nothing written
    bash = subprocess.run(["bash", "-n"], input=s, text=True, capture_output=True)
    assert bash.returncode == 0, bash.stderr  # the script parses


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--nodes", "2"], "--gpus-per-node 0: both must be >= 1"),
        (["--gpus-per-node", "8"], "go with --nodes N"),
        (["--nodes", "2", "--gpus-per-node", "8", "--resume"], "--resume"),
        (["--nodes", "2", "--gpus-per-node", "8", "train.parallel=zero3"], "train.parallel"),
    ],
)
def test_bad_launch_input_is_one_line_exit_2(tmp_path, extra, needle):
    r = cli("replaid", "train", "--out", str(tmp_path / "r"), "--preset", "debug", "--dry-run", *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("replaid: error: ") and needle in lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRAIN = ["--preset", "debug", "--no-progress", "train.steps=3", "train.batch_size=8", "train.log_every=1"]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_one_node_of_four(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = tmp_path / "single"
    one_node = launch.torchrun_argv(4, 1, {}, (sys.executable, "-m", "torch.distributed.run"))
    one_node[one_node.index("--standalone")] = f"--master_port={free_port()}"
    r = subprocess.run([*one_node, "train", "--out", str(single), *TRAIN], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]

    multi = tmp_path / "multi"
    slurm = {
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "7",
        "MASTER_PORT": str(free_port()),
    }
    procs = []
    for node in (0, 1):  # what each node's srun task runs: python -m replaid.scaling.launch, then that command
        node_env = {**env, **slurm, "SLURM_NODEID": str(node)}
        r = cli("replaid.scaling.launch", "--nodes", "2", "--gpus-per-node", "2", env=node_env)
        assert r.returncode == 0, r.stderr
        cmd = [*shlex.split(r.stdout), "train", "--out", str(multi), *TRAIN]
        procs.append(subprocess.Popen(cmd, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]

    def losses(run):
        return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    assert len(losses(single)) == 3
    for a, b in zip(losses(single), losses(multi), strict=True):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
    st = ck.load_state(ck.find_checkpoint(multi))
    assert st["world_size"] == 4 and st["ranks_in_sync"] is True
    wa = ck.load_tensors(ck.find_checkpoint(single), "model")
    wb = ck.load_tensors(ck.find_checkpoint(multi), "model")
    # the same arithmetic but for the order of gloo's all-reduce sums (4 ranks on 2 launchers vs 1)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6), k


def test_a_sweep_job_over_several_nodes_runs_each_nodes_torchrun(tmp_path, monkeypatch):
    """The sweep runner's multi-node option: a submitit task on each node of the job builds that node's
    torchrun from SLURM's variables (the rest of the command is the one-node job's)."""
    from replaid.scaling import runner
    from test_layout import Entry

    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    cmd = runner.RunJob(str(tmp_path), Entry(), "replaid", torchrun_gpus=8, nodes=4)._cmd()
    assert cmd[: cmd.index("train")] == launch.torchrun_argv(8, 4, SLURM)
    assert cmd[cmd.index("train") :] == ["train", "--out", str(tmp_path / "runs/r0"), "--no-progress", "--config",
                                         str(tmp_path / "configs/r0.json")]  # fmt: skip
    one = runner.RunJob(str(tmp_path), Entry(), "replaid", torchrun_gpus=8)._cmd()
    assert one[:5] == ["torchrun", "--standalone", "--nproc_per_node", "8", "-m"]  # one node: as before
    with pytest.raises(ConfigError, match="--nodes-per-job 2 needs --executor slurm"):
        runner.run_submitit(tmp_path, [Entry()], "submitit-local", nodes_per_job=2, gpus_per_job=8)


def test_train_nodes_refuses_an_out_that_already_holds_a_run(tmp_path, capsys):
    """Issue 49: ``train --out EXISTING_RUN --nodes 2 ... train.steps=100`` wrote a job script that resumed
    the existing run and dropped the overrides; now one line, as without ``--nodes``."""
    from replaid.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    rc = main(["train", "--out", str(run), "--preset", "debug", "--nodes", "2", "--gpus-per-node", "2", "--dry-run",
               "train.steps=100", "model.hidden=64"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "already holds a run" in err[0]
    assert [p.name for p in run.iterdir()] == ["config.json"]
