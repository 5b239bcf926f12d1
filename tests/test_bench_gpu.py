"""benchmarks/bench_gpu.py runs at debug size on the CPU (so it works the day a GPU appears)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
ARGS = [
    "--preset",
    "debug",
    "--per-device-batch",
    "2",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--device",
    "cpu",
    "--no-record",
]


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_bench_gpu_single_process_on_cpu():
    out = _run([sys.executable, str(SCRIPT), *ARGS])
    assert "tokens/s=" in out and "MFU=" in out and "devices=1" in out


@pytest.mark.distributed
@pytest.mark.slow
def test_bench_gpu_under_torchrun_on_cpu():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            str(SCRIPT),
            *ARGS,
        ]
    )
    assert "devices=2" in out
