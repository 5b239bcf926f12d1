"""The step language of the GPU check: a step is a name, a title, whether ``--quick`` runs it, its
estimated seconds and a function from the run's :class:`Ctx` to its commands (:class:`Cmd`); a
command is a script, a child (``benchmarks/gpu_check.py --child NAME --spec JSON``, see
:mod:`gpu_check.children`), a pytest selection or a ``replaid`` command line. :data:`STEPS` is the
plan, in the order the steps run.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .base import ALL_METHODS, L_PAPER, PRESET, REPO, SPEED_METHODS, UsageError

DEVICE_TEST_FILES = [
    "tests/test_samplers.py",
    "tests/test_likelihood.py",
    "tests/test_method_contract.py",
    "tests/test_compile.py",
]


@dataclass
class Cmd:
    """One command of a step: ``kind`` says how the dry run resolves it."""

    kind: str  # script | child | pytest | cli
    args: list  # after the Python interpreter (cli: -m replaid COMMAND ...)
    timeout: float
    label: str = ""
    env: dict = field(default_factory=dict)

    def argv(self, py: str) -> list:
        return [py, *self.args]

    def text(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return (env + " " if env else "") + "python " + " ".join(_quote(a) for a in self.args)


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w@%+=:,./-]+", a) else "'" + a.replace("'", "'\\''") + "'"


@dataclass
class Ctx:
    quick: bool
    device: str = "cuda"
    peak_tflops: float | None = None
    mdlm_ref: Path = REPO / ".carry" / "mdlm"
    tmp: Path = Path(tempfile.gettempdir())
    tiny: bool = False  # --tiny: every model and length shrunk, to try the driver on a CPU
    out: Path | None = None  # the check's --out: what a step keeps there comes back from the device

    def size(self) -> list:
        """Config overrides of the measured models (none: the paper's 0.1B at L = 1024)."""
        return TINY_SET + [f"data.seq_len={TINY_L}"] if self.tiny else []

    def length(self) -> int:
        return TINY_L if self.tiny else L_PAPER

    def batch(self, b: int) -> int:
        return max(2, b // 8) if self.tiny else b


TINY_SET = ["model.hidden=64", "model.n_layers=2", "model.n_heads=2", "model.cond_dim=32"]
TINY_L = 64


def _child(name: str, spec: dict, timeout: float, label: str = "") -> Cmd:
    return Cmd("child", ["benchmarks/gpu_check.py", "--child", name, "--spec", json.dumps(spec)], timeout, label)


def _bench_gpu(
    ctx: Ctx,
    method: str,
    batch: int,
    steps: int,
    warmup: int,
    compile_: bool = False,
    timeout: float = 240,
    extra: list | None = None,
    env: dict | None = None,
) -> Cmd:
    args = [
        "benchmarks/bench_gpu.py",
        "--preset",
        PRESET,
        "--set",
        f"method={method}",
        *ctx.size(),
        "--per-device-batch",
        str(ctx.batch(batch)),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--device",
        ctx.device,
        "--json",
    ]
    if compile_:
        args.append("--compile")
    if ctx.peak_tflops:
        args += ["--peak-tflops", f"{ctx.peak_tflops:.6g}"]
    return Cmd(
        "script",
        args + (extra or []),
        timeout,
        f"{method}{' compiled' if compile_ else ''} batch {ctx.batch(batch)}",
        env or {},
    )


def gpu_test_files() -> list[str]:
    """The test files holding ``pytest.mark.gpu`` tests."""
    return sorted(
        f"tests/{p.name}"
        for p in (REPO / "tests").glob("test_*.py")
        if "pytest.mark.gpu" in p.read_text(errors="replace")
    )


def cmds_env(ctx):
    return [_child("env", {"device": ctx.device}, 120)]


def cmds_tests(ctx):
    files = list(dict.fromkeys(gpu_test_files() + DEVICE_TEST_FILES))
    args = [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--device",
        ctx.device,
        "-o",
        "addopts=-ra",
        "--junitxml",
        str(ctx.tmp / "gpu_check_tests.xml"),
    ]
    if ctx.quick:
        args += ["-m", "not slow"]
    return [Cmd("pytest", args + files, 300 if ctx.quick else 540, "gpu-marked + device-aware tests")]


def cmds_bf16(ctx):
    methods = SPEED_METHODS if ctx.quick else ALL_METHODS
    return [
        _child(
            "bf16",
            {"methods": methods, "batch": 4, "length": ctx.length(), "overrides": ctx.size(), "device": ctx.device},
            240,
        )
    ]


def cmds_syncs(ctx):
    return [_child("syncs", {"methods": ALL_METHODS, "steps": 3, "device": ctx.device}, 180)]


def cmds_compile(ctx):
    return [_child("compile", {"eager_check": not ctx.quick, "device": ctx.device}, 300)]


def cmds_speed(ctx):
    return [_bench_gpu(ctx, m, 32, 10, 3) for m in SPEED_METHODS]


def cmds_speed_compiled(ctx):
    return [
        _bench_gpu(ctx, m, 32, 10, 3, compile_=True, timeout=420) for m in (["replaid"] if ctx.quick else SPEED_METHODS)
    ]


MEMORY_BATCHES = (8, 40)


def cmds_memory(ctx):
    return [
        _bench_gpu(ctx, m, b, 2, 1, timeout=180)
        for m in (["replaid"] if ctx.quick else SPEED_METHODS)
        for b in MEMORY_BATCHES
    ]


def cmds_maxbatch(ctx):
    return [
        _bench_gpu(
            ctx,
            m,
            2,
            1,
            1,
            timeout=300,
            extra=["--max-batch", "--max-probes", "10" if ctx.quick else "14"],
            env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        )
        for m in (["replaid"] if ctx.quick else SPEED_METHODS)
    ]


def cmds_sampler(ctx):
    T = "4" if ctx.tiny else "32" if ctx.quick else "64"
    samplers = ["ddpm", "dpmpp2m"] if ctx.quick else ["ddpm", "ddim", "dpmpp2m", "heun"]
    base = [
        "benchmarks/bench_sample.py",
        "--preset",
        PRESET,
        "--batch",
        str(ctx.batch(16)),
        "--steps",
        T,
        "--device",
        ctx.device,
        "--json",
        *(["--length", str(TINY_L), "--set", *TINY_SET] if ctx.tiny else []),
    ]
    return [
        Cmd("script", base + ["--samplers", *samplers], 240, "replaid samplers"),
        Cmd("script", base + ["--method", "mdlm"], 240, "mdlm sampler"),
    ]


def cmds_likelihood(ctx):
    spec = {"n_seqs": 8, "steps": 32, "batch_size": 8}
    if not ctx.quick:
        spec = {"n_seqs": 16, "steps": 128, "batch_size": 16}
    if ctx.tiny:
        spec = {"n_seqs": 2, "steps": 4, "batch_size": 2}
    return [_child("likelihood", {**spec, "length": ctx.length(), "overrides": ctx.size(), "device": ctx.device}, 300)]


def cmds_mdlm_ref(ctx):
    b, n = (1, 1) if ctx.tiny else (32, 10)
    return [
        Cmd(
            "script",
            [
                "benchmarks/gpu_check_mdlm.py",
                "--ref",
                str(ctx.mdlm_ref),
                "--batch",
                str(b),
                "--steps",
                str(n),
                "--warmup",
                "1" if ctx.tiny else "3",
                "--length",
                str(ctx.length()),
                "--device",
                ctx.device,
                "--json",
            ],
            300,
            f"reference batch {b}",
        )
    ]


@dataclass
class Step:
    name: str
    title: str
    quick: bool  # part of --quick
    est: tuple  # (quick, full) seconds, set-up excluded
    commands: Callable[[Ctx], list]


def cmds_blocks(ctx):
    """Issue 39 §4 on the device: block diffusion's first block, tokens/s and memory at batch 1 and 16 against
    AR with its cache and the full sequence at the same steps per position (``--tiny``: the quick sweep)."""
    size = ["--quick"] if ctx.tiny else ["--batches", "1", "16", "--lengths", "8"] if ctx.quick else []
    out = str(ctx.tmp / "gpu_check_bench_blocks")
    # in one process: a fresh process per configuration costs a CUDA start each; on CUDA the peak memory is
    # torch's own counter, reset per configuration, so sharing the process leaves it clean
    args = ["benchmarks/bench_blocks.py", *size, "--in-process", "--device", ctx.device, "--out", out, "--json"]
    return [Cmd("script", args, 300 if ctx.quick else 540, "block diffusion speed")]


def cmds_blocks_01b(ctx):
    """Issue 39 §4 at the paper's size (full check only): ``owt-0.1b``, 1x ``seq_len`` (1,008 generated
    tokens), blocks of 16 at T = 16, batch 1 and 16, MDLM and RePlaid against AR with its cache and the full
    sequence (``--tiny``: the quick sweep)."""
    size = (
        ["--quick"]
        if ctx.tiny
        else ["--preset", "owt-0.1b", "--block-sizes", "16", "--steps", "16", "--batches", "1", "16", "--lengths", "1"]
    )
    out = str(ctx.tmp / "gpu_check_bench_blocks_01b")
    args = ["benchmarks/bench_blocks.py", *size, "--in-process", "--device", ctx.device, "--out", out, "--json"]
    return [Cmd("script", args, 480, "block diffusion speed at owt-0.1b")]


def cmds_breakdown(ctx):
    """Issue 53 §1: one training step per method taken apart (data, forward, backward, optimiser and the named
    regions: the self-conditioning pass, the loss terms, the output prior), bf16, eager; the bytes model at
    the H100's 3.35 TB/s (``--tiny``: the debug size, seconds on a CPU)."""
    size = ["--tiny"] if ctx.tiny else ["--preset", "owt-0.1b", "--batch", str(ctx.batch(8 if ctx.quick else 32))]
    prec = ["--precision", "bf16"] if ctx.device == "cuda" else []
    args = ["benchmarks/bench_breakdown.py", *size, *prec, "--device", ctx.device, "--steps", "3", "--json"]
    return [Cmd("script", [*args, "--bandwidth", "3.35e12"], 240 if ctx.quick else 420, "step breakdown")]


def cmds_serve(ctx):
    """Issue 52 §3 on the device (full check only): AR, MDLM and RePlaid with blocks of 4 trained briefly
    here, each served under 1, 4, 16, 32 and 64 streaming clients with the server's default limits
    (``--tiny``: the debug size, 1 and 4 clients, seconds on a CPU)."""
    size = (
        ["--preset", "debug", "--train-steps", "3", "--clients", "1", "4", "--max-tokens", "16"]
        if ctx.tiny
        else ["--preset", "demo", "--train-steps", "200", "--clients", "1", "4", "16", "32", "64"]
    )
    out = str(ctx.tmp / "gpu_check_load_grid")
    args = ["benchmarks/load_grid.py", "--train", *size, "--device", ctx.device, "--out", out, "--json"]
    return [Cmd("script", args, 900, "served completions under load")]


def cmds_bf16_train(ctx):
    """Issue 53 §3 (full check only): RePlaid in bf16 autocast against fp32 for 4,000 steps, 3 seeds each, at
    the trend grid's demo configuration (docs/results/trend/bf16.yaml; linux-docs carried in .gl/). Resumable:
    a call that reaches its deadline leaves checkpoints, and the next call with this step goes on from them
    (``--tiny``: the debug size on the embedded corpus, a few steps)."""
    out = str(ctx.tmp / "gpu_check_bf16_runs")
    size = ["--tiny", "--max-parallel", "2"] if ctx.tiny else ["--data", ".gl/linux-docs", "--max-parallel", "6"]
    args = ["benchmarks/bf16_runs.py", *size, "--device", ctx.device, "--out", out, "--deadline", "500"]
    return [Cmd("script", args, 570, "bf16 against fp32 over a whole run")]


def cmds_plateau_b512(ctx):
    """Issue 48 §2 (full check only): MDLM, the default RePlaid and the recipe at batch 512, 600 steps, 3 seeds
    (docs/results/plateau/arms-b512.yaml; linux-docs carried in .gl/); the runs' logs kept under the check's
    --out in plateau_b512/. Resumable as bf16_train is (``--tiny``: the debug size, a few steps)."""
    out = str(ctx.tmp / "gpu_check_plateau_b512")
    keep = str((ctx.out or ctx.tmp) / "plateau_b512")
    size = ["--tiny", "--max-parallel", "3"] if ctx.tiny else ["--data", ".gl/linux-docs", "--max-parallel", "9"]
    args = ["benchmarks/plateau_b512.py", *size, "--device", ctx.device, "--out", out, "--keep", keep]
    return [Cmd("script", [*args, "--deadline", "500"], 570, "the plateau's exit at batch 512")]


STEPS = [
    Step("env", "device, versions, matmul peak, torch features", True, (20, 20), cmds_env),
    Step("tests", "gpu-marked and device-aware tests on CUDA", True, (120, 240), cmds_tests),
    Step("bf16", "bf16 autocast vs float32 per method", True, (40, 80), cmds_bf16),
    Step("syncs", "host syncs per step (CUDA sync debug mode)", True, (25, 25), cmds_syncs),
    Step("compile", "loss core: graphs and breaks on CUDA", True, (15, 90), cmds_compile),
    Step("speed", "tokens/s, MFU, step time, memory (eager)", True, (75, 75), cmds_speed),
    Step("memory", "peak memory at two batch sizes vs the model", True, (35, 100), cmds_memory),
    Step("sampler", "sampler NFE/s at V = 50,257", True, (40, 90), cmds_sampler),
    Step("likelihood", "ODE likelihood time per sequence", True, (35, 150), cmds_likelihood),
    Step("mdlm_ref", "MDLM reference step beside ours", True, (45, 45), cmds_mdlm_ref),
    Step("maxbatch", "largest batch that fits vs the model", True, (50, 150), cmds_maxbatch),
    Step("blocks", "block diffusion: first block, tokens/s, memory", True, (90, 240), cmds_blocks),
    Step("breakdown", "one step per method taken apart (profiler)", True, (60, 150), cmds_breakdown),
    Step("blocks_01b", "block diffusion at owt-0.1b, 1x, batch 1 and 16", False, (300, 300), cmds_blocks_01b),
    Step("speed_compiled", "tokens/s, MFU, step time (train.compile)", False, (130, 360), cmds_speed_compiled),
    Step("serve", "served completions under load: AR and blocks at 1-64 clients", False, (420, 420), cmds_serve),
    Step("bf16_train", "RePlaid bf16 vs fp32, 4,000 steps, 3 seeds (resumable)", False, (540, 540), cmds_bf16_train),
    Step("plateau_b512", "the plateau's exit at batch 512, 3 methods x 3 seeds", False, (540, 540), cmds_plateau_b512),
]
STEP_NAMES = [s.name for s in STEPS]
# a full check in calls of at most 10 minutes each (set-up included)
FULL_SPLIT = [
    "env,tests,bf16,syncs,compile",
    "env,speed,memory,sampler,mdlm_ref",
    "speed_compiled",
    "maxbatch,likelihood",
    "env,blocks,breakdown",
    "env,blocks_01b",
    "env,serve",
    "bf16_train",  # twice if the first call reaches its deadline: the second resumes the runs
    "plateau_b512",  # the same
]


def select_steps(spec: str | None, quick: bool) -> list[Step]:
    if not spec:
        return [s for s in STEPS if s.quick or not quick]
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [n for n in names if n not in STEP_NAMES]
    if bad or not names:
        raise UsageError(
            f"--steps {spec!r}: unknown step {', '.join(bad) or '(none given)'}; choose from {','.join(STEP_NAMES)}"
        )
    return [s for s in STEPS if s.name in names]  # in the plan's order
