"""Multi-node launch: the per-node ``torchrun`` command of a run over N nodes, from the environment
SLURM (or the user) sets, and the sbatch script ``replaid train --nodes N --dry-run`` prints.

Each node runs one ``torchrun`` with a c10d rendezvous on the first node's address, as torchtitan's
``multinode_trainer.slurm`` does (``--rdzv_backend c10d --rdzv_endpoint HEAD:29500 --rdzv_id JOB``):

* the head: ``MASTER_ADDR`` when set, else the first host of ``SLURM_JOB_NODELIST`` (``node[03-06]``
  -> ``node03``); the port: ``MASTER_PORT``, else 29500 + (``SLURM_JOB_ID`` mod 1000);
* the number of nodes: ``SLURM_NNODES`` / ``SLURM_JOB_NUM_NODES`` (they must agree with ``--nodes``);
  the node's rank: ``SLURM_NODEID`` (``NODE_RANK`` outside SLURM); the rendezvous id: ``SLURM_JOB_ID``.

A one-node run keeps ``torchrun --standalone``. Preemption: SLURM's SIGTERM reaches every rank through
torchrun; the trainer saves at a step boundary and exits 75 (``PREEMPTED_EXIT``); the job requeues and
``--resume`` goes on (the sweep runner: submitit's ``checkpoint()``; ``replaid train --nodes``: the
sbatch script's trap and ``scontrol requeue``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from replaid.config import ConfigError

DEFAULT_PORT = 29500  # torchrun's and torchtitan's

# --- the one quoting rule of every generated script (sbatch, torchrun command lines, submitit) ------
# Every value that goes into a script is (1) free of control characters (a newline would start a line
# of its own, a line the shell runs), and (2) shell-quoted where the shell reads it (``shlex.quote``);
# where the shell does not read it (an ``#SBATCH`` line, read by sbatch alone) it is one option of a
# plain character set, so that it can neither end the line nor be read as two options.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=[A-Za-z0-9_.,:@%/+\[\]&|*!=-]+)?")
# submitit parameters that are shell lines or command words by design: refused (no value runs a command)
_COMMAND_PARAMS = frozenset({"setup", "teardown", "srun_args", "python"})
_PARAM_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def script_value(value: str, what: str) -> str:
    """``value`` unchanged when it may go into a generated script (quoted where the shell reads it);
    a ConfigError naming ``what`` when it holds a control character (a newline, a carriage return,
    a tab ...), which would add a line of its own to the script."""
    m = _CONTROL.search(value)
    if m:
        raise ConfigError(
            f"{what} {value[:40]!r} holds a control character ({m.group()!r}) that would add a line to the "
            f"generated job script; give it without newlines or other control characters"
        )
    return value


def sbatch_option(value: str, what: str = "--slurm") -> str:
    """One ``#SBATCH`` option (``--partition=gpu``, ``--exclusive``): refused unless it is one option of
    letters, digits and ``_.,:@%/+[]&|*!=-`` (no space, quote, ``;``, ``$``, backquote or newline)."""
    script_value(value, what)
    if not _SBATCH_OPTION.fullmatch(value):
        raise ConfigError(
            f"{what} {value[:40]!r} is not one #SBATCH option: give one option such as --partition=gpu or "
            f"--exclusive (letters, digits and _.,:@%/+[]&|*!=- after the '='; no space, quote, ';', '$' or "
            f"backquote), one --slurm per option"
        )
    return value


def check_submitit_params(params: Mapping[str, Any], what: str = "--slurm") -> None:
    """The extra submitit parameters of ``grid run`` / ``scaling run --executor slurm``: submitit writes
    them into its sbatch script (``#SBATCH --key=value`` lines; ``setup``/``teardown`` as shell lines,
    ``srun_args`` on the srun line). Refused: a parameter that is a command by design (``slurm_setup``,
    ``slurm_teardown``, ``slurm_srun_args``, ``slurm_python``), a key that is not a plain name, and any
    string (in lists and objects too) holding a control character."""

    def strings(v: Any, where: str) -> None:
        if isinstance(v, str):
            script_value(v, where)
        elif isinstance(v, Mapping):
            for k, x in v.items():
                if not isinstance(k, str) or not _SBATCH_KEY.fullmatch(k):
                    raise ConfigError(
                        f"{where}: key {str(k)[:40]!r} is not an sbatch option name (letters, digits, -_)"
                    )
                strings(x, f"{where}.{k}")
        elif isinstance(v, list | tuple):
            for i, x in enumerate(v):
                strings(x, f"{where}[{i}]")

    for k, v in params.items():
        if not _PARAM_KEY.fullmatch(k):
            raise ConfigError(f"{what} {k[:40]!r}=...: not a submitit parameter name (letters, digits, _)")
        if k.removeprefix("slurm_") in _COMMAND_PARAMS:
            raise ConfigError(
                f"{what} {k}=...: this parameter puts shell commands into the job script, which replaid does "
                f"not pass on; set the environment up before submitting (e.g. in the shell that runs replaid)"
            )
        strings(v, f"{what} {k}")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu-a[07-09,12],gpu-b3`` -> ``gpu-a07``."""
    s = nodelist.strip()
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", s)
    if not s or m is None:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} names no host: run inside a SLURM allocation")
    head, ranges, tail = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return head
    first = ranges.split(",")[0].split("-")[0]
    return f"{head}{first}{tail}"


def rendezvous(env: Mapping[str, str], nodes: int) -> dict[str, Any]:
    """``{"host", "port", "node_rank", "nnodes", "rdzv_id"}`` of this node in a ``nodes``-node run,
    from SLURM's variables (or ``MASTER_ADDR``/``MASTER_PORT``/``NODE_RANK`` outside SLURM); a
    ConfigError naming the variable when one is missing or disagrees."""
    host = env.get("MASTER_ADDR") or (first_host(env["SLURM_JOB_NODELIST"]) if env.get("SLURM_JOB_NODELIST") else "")
    if not host:
        raise ConfigError(
            "a multi-node run needs the head node's address: run it inside a SLURM allocation "
            "(SLURM_JOB_NODELIST) or set MASTER_ADDR"
        )
    job = env.get("SLURM_JOB_ID", "")
    # one port per job: jobs of an array may share a head node (the sbatch script sets MASTER_PORT)
    port = env.get("MASTER_PORT") or str(DEFAULT_PORT + (int(job) % 1000 if job.isdigit() else 0))
    got = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if got is not None and got.strip() != str(nodes):
        raise ConfigError(
            f"--nodes {nodes} but this SLURM allocation has {got} nodes (SLURM_NNODES): pass --nodes {got}"
        )
    rank = env.get("SLURM_NODEID", env.get("NODE_RANK"))
    if rank is None or not rank.strip().isdigit() or int(rank) >= nodes:
        raise ConfigError(
            f"this node's rank is {rank!r}: a multi-node run reads SLURM_NODEID (or NODE_RANK), 0 to {nodes - 1}"
        )
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MASTER_PORT={port!r} is not a port number")
    return {
        "host": host,
        "port": int(port),
        "node_rank": int(rank),
        "nnodes": nodes,
        "rdzv_id": env.get("SLURM_JOB_ID", "replaid"),
    }


def torchrun_argv(
    gpus_per_node: int, nodes: int, env: Mapping[str, str], launcher: Sequence[str] = ("torchrun",)
) -> list[str]:
    """This node's ``torchrun ... -m replaid`` (the prefix of ``replaid train ...``); ``launcher``:
    how torchrun is called (``python -m torch.distributed.run`` with this interpreter, by the script)."""
    if gpus_per_node < 1 or nodes < 1:
        raise ConfigError(f"--nodes {nodes} --gpus-per-node {gpus_per_node}: both must be >= 1")
    base = [*launcher, "--nproc_per_node", str(gpus_per_node)]
    if nodes == 1:
        return [*launcher, "--standalone", *base[len(launcher) :], "-m", "replaid"]
    r = rendezvous(env, nodes)
    return [
        *base,
        "--nnodes",
        str(nodes),
        "--node_rank",
        str(r["node_rank"]),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{r['host']}:{r['port']}",
        "--rdzv_id",
        str(r["rdzv_id"]),
        "-m",
        "replaid",
    ]


def sbatch_script(
    out: str,
    train_args: Sequence[str],
    nodes: int,
    gpus_per_node: int,
    *,
    job_name: str = "replaid",
    time_min: int = 24 * 60,
    cpus_per_gpu: int = 8,
    extra: Sequence[str] = (),
    python: str = "python",
) -> str:
    """The sbatch script of one run into ``out`` over ``nodes`` x ``gpus_per_node``: one task per node,
    each running this node's torchrun (the node's rank and the head come from SLURM's variables at run
    time, through ``python -m replaid.scaling.launch``). SIGTERM 120 s before the time limit (or on
    preemption) reaches the batch shell, which passes it on to every rank (each saves a checkpoint and
    exits 75) and requeues the job; the requeued job finds ``out/config.json`` and resumes.

    Every value follows the quoting rule above: ``out``, ``train_args`` and ``python`` are shell-quoted
    and free of control characters, each of ``extra`` is one plain ``#SBATCH`` option; the numbers are
    whole numbers. A value that breaks the rule is a ConfigError (nothing is written)."""
    script_value(out, "--out")
    for a in train_args:
        script_value(a, "the train option")
    script_value(python, "the interpreter path")
    for x in extra:
        sbatch_option(x)
    for name, n in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node), ("cpus", cpus_per_gpu), ("time", time_min)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"{name} {n!r}: must be a whole number >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_name):
        raise ConfigError(f"job name {job_name[:40]!r}: letters, digits and _.- only")
    py = shlex.quote(python)
    fresh = shlex.join(["train", "--out", out, *train_args])
    again = shlex.join(["train", "--out", out, "--resume"])
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f"#SBATCH --cpus-per-task={cpus_per_gpu * gpus_per_node}",
        f"#SBATCH --time={time_min}",
        "#SBATCH --signal=B:TERM@120",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        *(f"#SBATCH {x}" for x in extra),
        "",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_PORT={DEFAULT_PORT}",
        f"if [ -f {shlex.quote(out + '/config.json')} ]; then run=({again}); else run=({fresh}); fi",
        "# on each node: this node's torchrun (rank from SLURM_NODEID, c10d rendezvous on MASTER_ADDR)",
        f"srun --kill-on-bad-exit=1 {py} -m replaid.scaling.launch --nodes {nodes} "
        f'--gpus-per-node {gpus_per_node} --exec "${{run[@]}}" &',
        "pid=$!",
        "# preempted or near the time limit: SIGTERM through srun and torchrun to every rank, which saves a",
        "# checkpoint at a step boundary and exits 75; then requeue (the requeued job resumes)",
        """trap 'kill -TERM "$pid"; wait "$pid"; scontrol requeue "$SLURM_JOB_ID"; exit 75' TERM""",
        'wait "$pid"',
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m replaid.scaling.launch --nodes N --gpus-per-node G``: print this node's torchrun prefix."""
    import argparse
    import os
    import sys

    p = argparse.ArgumentParser(prog="python -m replaid.scaling.launch")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument(
        "--exec",
        nargs=argparse.REMAINDER,
        help="run this node's torchrun with these arguments (replaid's), no shell in between",
    )
    a = p.parse_args(argv)
    try:
        cmd = torchrun_argv(a.gpus_per_node, a.nodes, os.environ, (sys.executable, "-m", "torch.distributed.run"))
    except ConfigError as e:
        sys.stderr.write(f"replaid: error: {e}\n")
        return 2
    if a.exec is not None:  # the sbatch script's srun task: exec, no word splitting or shell
        sys.stdout.flush()
        os.execv(cmd[0], [*cmd, *a.exec])
    print(shlex.join(cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
