"""GPU acceptance in one command (issue 27): the driver behind ``scripts/gpu_check.sh``.

    python benchmarks/gpu_check.py --quick --out $OUT                # what scripts/gpu_check.sh --quick runs
    python benchmarks/gpu_check.py --steps speed,speed_compiled     # a subset (a full check split over calls)
    python benchmarks/gpu_check.py --dry-run                         # the plan; every step's commands resolved
    python benchmarks/gpu_check.py --merge a/gpu_check.json b/gpu_check.json --out docs/gpu_check --record

Each step runs its commands in fresh processes (a clean CUDA allocator, one failure contained) and
writes its part into ``OUT/gpu_check.json`` as soon as it ends; ``OUT/gpu_check.md`` renders the
JSON as tables. A step that fails, times out or errors is recorded with its error and the next one
runs. ``--budget SECONDS`` (``--quick``: 570 s less the set-up time) skips the steps whose estimate no
longer fits, naming them, so a quick check ends inside one 10-minute device call. Steps:

  env             device, driver, torch/CUDA versions, bf16 matmul peak, torch features, dependencies
  tests           the gpu-marked tests + samplers, likelihood, method contract, compile with --device cuda
  bf16            bf16 autocast vs float32 on the same batch and noise, per method: loss and gradients
  syncs           host syncs per training step by CUDA's own sync debug mode, per method
  compile         the loss core under torch._dynamo.explain on CUDA (graphs, breaks); full: compiled = eager
  speed           tokens/s, MFU, step time, peak memory at owt-0.1b, L = 1024, batch 32: AR, MDLM, RePlaid
  speed_compiled  the same with train.compile=true
  memory          peak memory at two more batch sizes against ``replaid memory``'s model
  maxbatch        the largest batch that fits (out-of-memory search) against the model's prediction
  sampler         sampler NFE/s at V = 50,257 (RePlaid's samplers; MDLM's in full)
  likelihood      the ODE likelihood's time per sequence (Heun, owt-0.1b, L = 1024)
  mdlm_ref        the MDLM reference (kuleshov-group/mdlm in .carry/mdlm) step, beside replaid's MDLM

Bad input ends in one line ``replaid: error: ...`` and exit status 2; otherwise the exit status is 0
when every step that ran passed, 1 when one failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
PRESET, L_PAPER = "owt-0.1b", 1024
SPEED_METHODS = ["ar", "mdlm", "replaid"]
ALL_METHODS = ["replaid", "plaid", "mdlm", "duo", "ar"]
# preset of each method at the paper's 0.1B size (plaid and duo have their own published set-ups)
PRESET_OF = {
    "replaid": (PRESET, []),
    "ar": (PRESET, ["method=ar"]),
    "mdlm": (PRESET, ["method=mdlm"]),
    "plaid": ("owt-0.1b-plaid", []),
    "duo": ("owt-0.1b-duo", []),
}
# bf16 autocast vs float32 (same batch and noise, dropout off): the precision table keeps the residual stream,
# norms, softmax, losses and schedule in float32/float64 and rounds matmul operands to bf16 (8 significant
# bits, unit roundoff u = 2^-8 = 3.9e-3). A float32-accumulated product of rounded operands has a relative
# error of order u; the scalar loss averages ~B L such errors, so even a bias stays under u (4e-3); a gradient
# passes through two rounded products per layer and the errors of a 12-layer stack add up in quadrature,
# sqrt(2 x 12) u ~ 2e-2, so 5e-2 bounds the global relative error ||g_bf16 - g_fp32|| / ||g_fp32||. Measured on
# the CPU (12 layers, hidden 256, L = 256, V = 50,257, every method): loss <= 1.1e-5, gradient <= 6.4e-3.
BF16_LOSS_RTOL, BF16_GRAD_RTOL = 4e-3, 5e-2
# host syncs per non-logging step: the non-finite guard's verdict, one for every method (tests/test_sync_free.py;
# the H200 run of 2026-11-26 found two more the meta counter cannot see, both mended: RePlaid's schedule built
# torch.tensor([0, 1], device=...) each step, Duo read t on the host for its numpy operator table)
SYNCS_EXPECTED: dict[str, int] = {}
RUNTIME_DEPS = [
    "numpy",
    "safetensors",
    "tokenizers",
    "transformers",
    "datasets",
    "sentencepiece",
    "tiktoken",
    "yaml",
    "tqdm",
    "matplotlib",
    "scipy",
    "tensorboard",
    "torchdiffeq",
    "filelock",
    "pytest",
]
# torch APIs the project uses that are not in every torch >= 2.0, with the first release that has them
TORCH_FEATURES = [
    ("torch.get_autocast_dtype", "2.4", "the bf16 head's dtype under autocast (model/replaid.py)"),
    ("torch.compiler.is_compiling", "2.3", "the fused head's plain path inside torch.compile (model/replaid.py)"),
    ("torch.nn.attention.sdpa_kernel", "2.3", "replaid likelihood --jvp autograd (eval/likelihood.py)"),
    ("torch.distributed.fsdp.fully_shard", "2.6", "train.parallel=fsdp, FSDP2 (training/dist.py)"),
    ("torch.distributed.tensor.distribute_tensor", "2.5", "FSDP2 checkpoints (training/dist.py)"),
    ("torch.distributed.checkpoint.state_dict.get_optimizer_state_dict", "2.2", "FSDP2 optimizer state"),
    ("torch.func.jvp", "2.0", "replaid likelihood --jvp autograd"),
    ("torch.compile", "2.0", "train.compile"),
    ("torch._dynamo.explain", "2.1", "the compile step and tests/test_compile.py"),
    ("torch.utils._python_dispatch.TorchDispatchMode", "2.0", "SyncCounter, the memory meter"),
    ("torch.cuda.set_sync_debug_mode", "1.10", "the syncs step"),
    ("torch.cuda.OutOfMemoryError", "1.13", "the maxbatch step"),
]
DEVICE_TEST_FILES = [
    "tests/test_samplers.py",
    "tests/test_likelihood.py",
    "tests/test_method_contract.py",
    "tests/test_compile.py",
]


class UsageError(Exception):
    """Bad input: one ``replaid: error:`` line, exit status 2."""


def log(msg: str) -> None:
    print(f"[gpu_check {datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


# ================================================================== child processes (run on the GPU)


def _perturb_zero_init(model) -> None:
    """Give the zero-initialised tensors (adaLN, output layers) small random values, so every path of
    the network carries signal and gradient, as in a trained one."""
    import torch

    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.any():
                p.copy_(0.02 * torch.randn(p.shape, generator=g))


def child_env(device: str = "cuda", peak_seconds: float = 2.0) -> dict:
    """Versions, device properties, the measured bf16 matmul peak, torch features and dependencies."""
    import platform

    import torch

    sys.path.insert(0, str(BENCH))
    from common import datasheet_bf16_flops, peak_matmul_flops

    out: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "features": torch_features(),
        "dependencies": dependencies(),
    }
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    dev = torch.device(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        out.update(
            device=torch.cuda.get_device_name(dev),
            capability=f"{p.major}.{p.minor}",
            multiprocessors=p.multi_processor_count,
            memory_gb=p.total_memory / 1e9,
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
        sheet = datasheet_bf16_flops(dev)
        out["datasheet_bf16_tflops"] = sheet / 1e12 if sheet else None
    out["matmul_bf16_tflops"] = (
        peak_matmul_flops(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, seconds=peak_seconds) / 1e12
    )
    missing = [f["api"] for f in out["features"] if not f["present"]]
    out["ok"] = dev.type != "cuda" or not missing
    if missing:
        out["error"] = f"torch {torch.__version__} lacks {', '.join(missing)}"
    return out


def torch_features() -> list[dict]:
    """Each API of ``TORCH_FEATURES``: present in this torch or not."""
    out = []
    for api, since, used in TORCH_FEATURES:
        parts, obj, ok = api.split("."), None, True
        for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            ok = False
        out.append({"api": api, "since": since, "used_by": used, "present": ok and obj is not None})
    return out


def dependencies() -> dict:
    return {name: importlib.util.find_spec(name) is not None for name in RUNTIME_DEPS}


def child_bf16(
    methods: list, batch: int = 4, length: int = L_PAPER, overrides: Optional[list] = None, device: str = "cuda"
) -> dict:
    """Loss and gradients under bf16 autocast vs float32, same tokens and noise (dropout off), per method."""
    import torch

    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.memory import preset_vocab
    from replaid.training.train import autocast_ctx

    dev = torch.device(device)
    if dev.type == "cuda":  # float32 means float32: no TF32 in the reference pass
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    res = {}
    for name in methods:
        preset, over = PRESET_OF[name]
        # dropout off: CUDA's fused dropout may map its random numbers to elements differently per dtype
        cfg = resolve(preset, None, [*over, f"data.seq_len={length}", "model.dropout=0", *(overrides or [])])
        V = preset_vocab(cfg)
        method = get_method(cfg)
        torch.manual_seed(0)
        model = method.build_model(V).to(dev)
        _perturb_zero_init(model)
        tokens = torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(1)).to(dev)
        runs = {}
        for prec in ("fp32", "bf16"):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(2)
            with autocast_ctx(dev, prec):
                loss, _ = method.train_loss(model, tokens, torch.Generator().manual_seed(3))
            loss.backward()
            runs[prec] = (
                float(loss),
                {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None},
            )
        (l32, g32), (l16, g16) = runs["fp32"], runs["bf16"]
        num = sum(float((g16[n] - g32[n]).pow(2).sum()) for n in g32)
        den = sum(float(g32[n].pow(2).sum()) for n in g32)
        per = {n: float((g16[n] - g32[n]).norm() / g32[n].norm()) for n in g32 if float(g32[n].norm()) > 0}
        worst = max(per, key=per.get)
        rel_loss, rel_grad = abs(l16 - l32) / abs(l32), (num / den) ** 0.5
        res[name] = {
            "preset": preset,
            "batch": batch,
            "L": length,
            "V": V,
            "loss_fp32": l32,
            "loss_bf16": l16,
            "loss_rel_err": rel_loss,
            "grad_rel_err": rel_grad,
            "grad_rel_err_median_tensor": sorted(per.values())[len(per) // 2],
            "grad_rel_err_worst_tensor": [worst, per[worst]],
            "tensors": len(per),
            "ok": rel_loss <= BF16_LOSS_RTOL and rel_grad <= BF16_GRAD_RTOL,
        }
        log(f"bf16 {name}: loss rel err {rel_loss:.2e}, gradient rel err {rel_grad:.2e}")
        del model, runs, g32, g16
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "methods": res,
        "thresholds": {"loss": BF16_LOSS_RTOL, "grad": BF16_GRAD_RTOL},
        "ok": all(r["ok"] for r in res.values()),
    }


def child_syncs(methods: list, steps: int = 3, device: str = "cuda", allow_cpu: bool = False) -> dict:
    """Host syncs per training step, counted by ``torch.cuda.set_sync_debug_mode("warn")``."""
    import warnings
    from collections import Counter

    import torch

    from replaid.config import RunConfig, unread_keys
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer

    dev = torch.device(device)
    if dev.type != "cuda" and not allow_cpu:
        raise RuntimeError("the syncs step counts CUDA syncs: it needs --device cuda")
    res = {}
    for name in methods:
        sets = [
            "model.hidden=64",
            "model.n_layers=2",
            "model.n_heads=2",
            "model.cond_dim=16",
            "diffusion.schedule_hidden=16",
            "train.batch_size=8",
            "data.seq_len=32",
            "optim.ema=0.9",
            "train.log_every=1000",
        ]
        # only the keys this method reads: the config refuses another method's keys
        skip = unread_keys(RunConfig(method=name), [s.partition("=")[0] for s in sets])
        sets = [s for s in sets if s.partition("=")[0] not in skip]
        cfg = resolve("debug", None, [f"method={name}", *sets])
        method = get_method(cfg)
        torch.manual_seed(0)
        model = method.build_model(256).to(dev)
        tr = Trainer(
            cfg,
            model,
            method,
            build_optimizer(model, cfg.optim),
            dev,
            EMA(model, 0.9),
            loss_module=TrainModule(model, method),
        )
        batch = [{"tokens": torch.randint(0, 256, (8, 32))}]
        for _ in range(2):  # warm-up: optimizer state, first EMA, kernels
            tr.train_step(batch, log=False)
        cuda = dev.type == "cuda"  # allow_cpu: the same steps, nothing counted (a CPU test of this code)
        if cuda:
            torch.cuda.synchronize(dev)
        counts = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                for k in range(steps + 1):  # `steps` plain steps, then one logging step
                    before = len(caught)
                    tr.train_step(batch, log=k == steps)
                    counts.append((before, len(caught)))
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        sync = [w for w in caught if "synchroniz" in str(w.message)]
        sites = Counter(
            f"{w.filename.split('/replaid/')[-1] if '/replaid/' in w.filename else w.filename}:{w.lineno}"
            for w in caught[counts[0][0] : counts[steps - 1][1]]
            if "synchroniz" in str(w.message)
        )
        plain = sum(1 for w in caught[counts[0][0] : counts[steps - 1][1]] if "synchroniz" in str(w.message))
        logging_step = sum(1 for w in caught[counts[steps][0] : counts[steps][1]] if "synchroniz" in str(w.message))
        per_step = plain / steps
        expected = SYNCS_EXPECTED.get(name, 1)
        res[name] = {
            "syncs_per_step": per_step,
            "expected": expected,
            "logging_step_syncs": logging_step,
            "sites": dict(sites),
            "total_warnings": len(sync),
            "ok": per_step <= expected,
        }
        log(f"syncs {name}: {per_step:g} per step (expected <= {expected}), logging step {logging_step}")
    return {"methods": res, "ok": all(r["ok"] for r in res.values())}


def child_compile(eager_check: bool = False, device: str = "cuda") -> dict:
    """RePlaid's loss core under ``torch._dynamo.explain`` (graphs, breaks); with ``eager_check`` the
    compiled core's loss and gradients against eager (and the compile time)."""
    import torch
    import torch._dynamo as dynamo

    from replaid.methods import get_method
    from replaid.presets import resolve

    dev = torch.device(device)

    def inputs():
        cfg = resolve(
            "debug",
            None,
            [
                "method=replaid",
                "model.hidden=32",
                "model.n_layers=1",
                "model.n_heads=2",
                "model.cond_dim=16",
                "diffusion.schedule_hidden=16",
            ],
        )
        torch.manual_seed(0)
        m = get_method(cfg)
        model = m.build_model(64).to(dev)
        B, L = 8, 16
        tok = torch.randint(0, 64, (B, L)).to(dev)
        t = torch.cat([torch.zeros(2, dtype=torch.float64), torch.linspace(0.1, 0.9, B - 2, dtype=torch.float64)])
        gamma, dgamma = model.schedule(t.to(dev))
        sc_idx = torch.tensor([2, 5], device=dev)
        sc = torch.zeros(B, dtype=torch.bool, device=dev).index_fill_(0, sc_idx, True)
        return m, model, (model, tok, gamma, dgamma, sc, sc_idx, torch.randn(B, L, model.d_e).to(dev), 2, 1.0, None)

    m, model, args = inputs()
    ex = dynamo.explain(m.loss_core)(*args)
    out = {
        "graph_count": ex.graph_count,
        "graph_break_count": ex.graph_break_count,
        "break_reasons": [str(b.reason)[:200] for b in ex.break_reasons],
    }
    ok = ex.graph_count == 1 and ex.graph_break_count == 0
    if eager_check:
        dynamo.reset()
        vals = []
        for fn in (m.loss_core, torch.compile(m.loss_core)):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss, *_ = fn(*args)
            loss.backward(retain_graph=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            vals.append(
                (
                    float(loss),
                    {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None},
                    time.perf_counter() - t0,
                )
            )
        (le, ge, _), (lc, gc_, tc) = vals
        num = sum(float((gc_[n] - ge[n]).pow(2).sum()) for n in ge)
        den = sum(float(ge[n].pow(2).sum()) for n in ge)
        out.update(
            loss_eager=le,
            loss_compiled=lc,
            loss_rel_err=abs(lc - le) / abs(le),
            grad_rel_err=(num / den) ** 0.5,
            first_compiled_call_s=tc,
        )
        ok = ok and out["loss_rel_err"] < 1e-5 and out["grad_rel_err"] < 1e-3
    out["ok"] = ok
    return out


def child_likelihood(
    n_seqs: int = 8,
    steps: int = 32,
    batch_size: int = 8,
    K: int = 1,
    n_hutch: int = 1,
    length: int = L_PAPER,
    overrides: Optional[list] = None,
    device: str = "cuda",
) -> dict:
    """Time per sequence of the ODE likelihood (Heun on the uniform gamma grid, finite-difference
    Hutchinson, float32 as ``replaid likelihood``) of an owt-0.1b RePlaid at length ``length``."""
    import torch

    from replaid.eval.likelihood import estimate_likelihood, ode_log_weight, schedule_endpoints
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.memory import preset_vocab

    dev = torch.device(device)
    cfg = resolve(PRESET, None, [f"data.seq_len={length}", *(overrides or [])])
    V = preset_vocab(cfg)
    torch.manual_seed(0)
    model = get_method(cfg).build_model(V).to(dev).eval()
    tokens = torch.randint(0, V, (n_seqs, length), generator=torch.Generator().manual_seed(1))
    g0, g1 = schedule_endpoints(model)
    ode_log_weight(model, tokens[:1], g0, g1, steps=1)  # warm-up: kernels, allocator
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    r = estimate_likelihood(model, tokens, g0, g1, K=K, batch_size=batch_size, steps=steps, n_hutch=n_hutch, seed=0)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    secs = time.perf_counter() - t0
    rows = n_seqs * K
    return {
        "n_seqs": n_seqs,
        "K": K,
        "L": length,
        "V": V,
        "steps": steps,
        "n_hutch": n_hutch,
        "batch_size": batch_size,
        "nfe": r.nfe,
        "seconds": secs,
        "s_per_sequence_sample": secs / rows,
        "nfe_per_s": r.nfe / secs,
        "s_per_sequence_at_128_steps": secs / rows * 128 / steps,
        "finite": bool(torch.isfinite(r.log_w).all()),
        "ok": bool(torch.isfinite(r.log_w).all()),
    }


CHILDREN: dict[str, Callable[..., dict]] = {
    "env": child_env,
    "bf16": child_bf16,
    "syncs": child_syncs,
    "compile": child_compile,
    "likelihood": child_likelihood,
}


# ================================================================== the plan


@dataclass
class Cmd:
    """One command of a step: ``kind`` says how the dry run resolves it."""

    kind: str  # script | child | pytest | cli
    args: list  # after the Python interpreter
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
    peak_tflops: Optional[float] = None
    mdlm_ref: Path = REPO / ".carry" / "mdlm"
    tmp: Path = Path(tempfile.gettempdir())
    tiny: bool = False  # --tiny: every model and length shrunk, to try the driver on a CPU

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
    extra: Optional[list] = None,
    env: Optional[dict] = None,
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
    Step("speed_compiled", "tokens/s, MFU, step time (train.compile)", False, (130, 360), cmds_speed_compiled),
]
STEP_NAMES = [s.name for s in STEPS]
# a full check in calls of at most 10 minutes each (set-up included)
FULL_SPLIT = [
    "env,tests,bf16,syncs,compile",
    "env,speed,memory,sampler,mdlm_ref",
    "speed_compiled",
    "maxbatch,likelihood",
]


def select_steps(spec: Optional[str], quick: bool) -> list[Step]:
    if not spec:
        return [s for s in STEPS if s.quick or not quick]
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [n for n in names if n not in STEP_NAMES]
    if bad or not names:
        raise UsageError(
            f"--steps {spec!r}: unknown step {', '.join(bad) or '(none given)'}; choose from {','.join(STEP_NAMES)}"
        )
    return [s for s in STEPS if s.name in names]  # in the plan's order


# ================================================================== running


def run_cmd(cmd: Cmd, py: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout the whole group is killed (compile workers
    and other grandchildren too, which would otherwise hold the output pipes open)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **cmd.env}
    argv = cmd.argv(py)
    with subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("the command printed no JSON line")


def json_lines(stdout: str) -> list:
    return [json.loads(x) for x in stdout.splitlines() if x.strip().startswith("{")]


def parse_junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [], "skipped_reasons": {}}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    out["failed"].append({"test": name, "message": (el.get("message") or "")[:300]})
            sk = case.find("skipped")
            if sk is not None:
                reason = (sk.get("message") or "")[:120]
                out["skipped_reasons"][reason] = out["skipped_reasons"].get(reason, 0) + 1
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    return out


def execute(step: Step, ctx: Ctx, py: str, deadline: Optional[float]) -> dict:
    """Run a step's commands; the step's result (``status`` ok / fail / error)."""
    if step.name == "mdlm_ref":
        sys.path.insert(0, str(BENCH))
        from gpu_check_mdlm import missing_files

        miss = missing_files(ctx.mdlm_ref)
        if miss:
            return {
                "status": "skipped",
                "reason": f"no MDLM reference at {ctx.mdlm_ref} ({', '.join(miss)} "
                f"missing): run scripts/gpu_check.sh --fetch-mdlm SNAPSHOT here and carry .carry",
            }
    results, errors = [], []
    for cmd in step.commands(ctx):
        left = None if deadline is None else deadline - time.time()
        timeout = cmd.timeout if left is None else max(10.0, min(cmd.timeout, left))
        log(f"  {cmd.text()}")
        t0 = time.time()
        xml = ctx.tmp / "gpu_check_tests.xml"
        if cmd.kind == "pytest":
            xml.unlink(missing_ok=True)
        try:
            p = run_cmd(cmd, py, timeout)
        except subprocess.TimeoutExpired as e:
            errors.append(f"{cmd.label or step.name}: timed out after {timeout:.0f} s")
            results.append(
                {
                    "label": cmd.label,
                    "timed_out": True,
                    "stdout_tail": (e.output or "")[-2000:],
                    "stderr_tail": (e.stderr or "")[-2000:],
                }
            )
            continue
        secs = time.time() - t0
        if cmd.kind == "pytest":
            rec = parse_junit(xml) if xml.is_file() else {}
            rec.update(
                returncode=p.returncode,
                seconds=secs,
                tail=(p.stdout + p.stderr)[-3000:],
                device=cmd.args[cmd.args.index("--device") + 1],
                files=[a for a in cmd.args if a.startswith("tests/")],
            )
            if p.returncode != 0:
                errors.append(
                    f"pytest exit {p.returncode}: {rec.get('failures', '?')} failed, {rec.get('errors', '?')} errors"
                )
            results.append(rec)
            continue
        if p.returncode != 0:
            errors.append(f"{cmd.label or step.name}: exit {p.returncode}: {_last_error(p.stderr)[:240]}")
            results.append({"label": cmd.label, "returncode": p.returncode, "stderr_tail": p.stderr[-3000:]})
            continue
        try:
            data = (
                json_lines(p.stdout)
                if cmd.kind == "script" and "bench_sample.py" in cmd.args[0]
                else last_json(p.stdout)
            )
        except ValueError as e:
            errors.append(f"{cmd.label or step.name}: {e}")
            results.append({"label": cmd.label, "stdout_tail": p.stdout[-2000:]})
            continue
        results.append({"label": cmd.label, "seconds": secs, "data": data})
        if isinstance(data, dict) and data.get("ok") is False:
            errors.append(f"{cmd.label or step.name}: {data.get('error') or 'a check did not pass (see the data)'}")
    out = {"results": results}
    if errors:
        out.update(status="fail", error="; ".join(errors)[:1500])
    else:
        out["status"] = "ok"
    return out


def _last_error(stderr: str) -> str:
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    for x in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|error:)", x.strip()) or x.startswith("replaid: error"):
            return x.strip()[:300]
    return (lines[-1].strip() if lines else "no output")[:300]


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; give the gpu_check.json that a run wrote under --out") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e.msg} at line {e.lineno}); give a gpu_check.json") from None


def header_info(setup_json: Optional[str]) -> dict:
    """What the wrapper measured (set-up time, nvidia-smi, wheels) and this Python's versions."""
    info: dict = {
        "python": sys.version.split()[0],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:
        info["torch"] = None
    if setup_json:
        p = Path(setup_json)
        if p.is_file():
            try:
                info["setup"] = json.loads(p.read_text())
            except json.JSONDecodeError:
                info["setup"] = {"error": f"{p} is not JSON"}
    return info


def run_plan(a, steps: list[Step], out: Path) -> int:
    ctx = Ctx(quick=a.quick, device=a.device, mdlm_ref=Path(a.mdlm_ref).resolve(), tiny=a.tiny)
    path = out / "gpu_check.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc.setdefault("runs", []).append(
        {**header_info(a.setup_json), "mode": "quick" if a.quick else "full", "steps": [s.name for s in steps]}
    )
    doc.setdefault("steps", {})
    env = doc["steps"].get("env", {})
    ctx.peak_tflops = _env_data(env).get("matmul_bf16_tflops") if env.get("status") == "ok" else None
    budget = a.budget
    if budget is None and a.quick:
        setup_s = (doc["runs"][-1].get("setup") or {}).get("setup_seconds", 0) or 0
        budget = 570 - float(setup_s)
    deadline = None if budget is None else time.time() + budget
    log(
        f"{'quick' if a.quick else 'full'} check: {len(steps)} steps, out {out}"
        + ("" if budget is None else f", budget {budget:.0f} s")
    )
    failed = False
    for i, step in enumerate(steps):
        est = step.est[0 if a.quick else 1]
        if deadline is not None and time.time() + est > deadline:
            rest = [s.name for s in steps[i:]]
            left = max(0.0, deadline - time.time())
            for s in steps[i:]:
                doc["steps"][s.name] = {
                    "status": "skipped",
                    "reason": f"out of the time budget ({left:.0f} s left, "
                    f"~{s.est[0 if a.quick else 1]} s needed): run --steps {','.join(rest)}",
                }
            log(f"budget: {left:.0f} s left; skipping {', '.join(rest)} (run them with --steps {','.join(rest)})")
            break
        log(f"step {step.name}: {step.title} (~{est} s)")
        t0 = time.time()
        try:
            res = execute(step, ctx, a.python, deadline)
        except Exception as e:  # the driver's own failure is one step's, not the run's
            res = {
                "status": "error",
                "error": f"{e.__class__.__name__}: {e}",
                "traceback": traceback.format_exc()[-2000:],
            }
        res["seconds"] = time.time() - t0
        res["mode"] = "quick" if a.quick else "full"
        doc["steps"][step.name] = res
        if step.name == "env" and res["status"] in ("ok", "fail"):
            ctx.peak_tflops = _env_data(res).get("matmul_bf16_tflops")
        failed |= res["status"] in ("fail", "error")
        log(
            f"step {step.name}: {res['status']} in {res['seconds']:.0f} s"
            + (f" ({res['error'][:300]})" if res.get("error") else "")
        )
        write_outputs(doc, out)
    write_outputs(doc, out)
    log(f"done: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    return 1 if failed else 0


def _env_data(step: dict) -> dict:
    r = step.get("results") or [{}]
    return r[0].get("data") or {}


def write_outputs(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out / "gpu_check.json")
    (out / "gpu_check.md").write_text(render(doc))


# ================================================================== the markdown table


def _f(x, fmt=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return format(x, fmt)
    return str(x)


def _table(header: list, rows: list) -> str:
    if not rows:
        return ""
    return (
        "\n".join(
            ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_f(c) for c in r) + " |" for r in rows]
        )
        + "\n"
    )


def _data(doc: dict, step: str) -> list:
    return [r["data"] for r in (doc.get("steps", {}).get(step, {}).get("results") or []) if "data" in r]


def render(doc: dict) -> str:
    """``gpu_check.md``: the JSON as dated tables (what docs/benchmarks.md includes)."""
    runs = doc.get("runs") or [{}]
    env = next(iter(_data(doc, "env")), {})
    setup = next((r.get("setup") for r in reversed(runs) if r.get("setup")), {}) or {}
    device = env.get("device") or setup.get("gpu") or "no GPU seen"
    date = (runs[0].get("started") or "")[:10]
    out = [f"### GPU check — {date} — {device}\n\n"]
    facts = [
        ("date(s)", ", ".join(sorted({(r.get("started") or "?")[:16] for r in runs}))),
        ("device", device),
        ("driver", setup.get("driver") or "-"),
        ("torch / CUDA", f"{env.get('torch') or runs[-1].get('torch')} / {env.get('cuda') or runs[-1].get('cuda')}"),
        ("Python", env.get("python") or runs[-1].get("python")),
        ("set-up time", ", ".join(f"{r['setup'].get('setup_seconds', '?')} s" for r in runs if r.get("setup")) or "-"),
        (
            "bf16 matmul peak (measured / datasheet)",
            f"{_f(env.get('matmul_bf16_tflops'))} / {_f(env.get('datasheet_bf16_tflops'))} TFLOP/s",
        ),
        ("modes", ", ".join(sorted({r.get("mode", "?") for r in runs}))),
    ]
    out.append(_table(["", ""], [[k, v] for k, v in facts]))
    rows = []
    for s in STEPS:
        st = doc.get("steps", {}).get(s.name)
        if st:
            rows.append(
                [
                    s.name,
                    st.get("status"),
                    _f(st.get("seconds"), ".0f"),
                    (st.get("error") or st.get("reason") or "")[:240].replace("|", "/"),
                ]
            )
    out.append("\n" + _table(["step", "status", "s", "note"], rows))
    feats = env.get("features") or []
    if feats:
        out.append("\n**torch features** (the first release that has each; 'present': in the torch measured)\n\n")
        out.append(
            _table(
                ["API", "needs torch >=", "present", "used by"],
                [[f["api"], f["since"], f["present"], f["used_by"]] for f in feats],
            )
        )
        missing = [k for k, v in (env.get("dependencies") or {}).items() if not v]
        if missing:
            out.append(f"\nDependencies missing there (not needed by the check): {', '.join(missing)}\n")
    t = doc.get("steps", {}).get("tests", {})
    for r in t.get("results") or []:
        if "tests" in r:
            out.append(
                f"\n**tests** (`pytest --device {r.get('device', 'cuda')}`: {', '.join(r.get('files', []))}): "
                f"{r['passed']} passed, {r['failures']} failed, {r['errors']} "
                f"errors, {r['skipped']} skipped in {_f(r.get('seconds'), '.0f')} s\n"
            )
            for f in r.get("failed", [])[:20]:
                out.append(f"- FAILED {f['test']}: {f['message'][:200]}\n")
    for d in _data(doc, "bf16")[:1]:
        th = d.get("thresholds", {})
        out.append(
            f"\n**bf16 autocast vs float32** (same batch, noise, dropout; batch x L as listed; thresholds: "
            f"loss {th.get('loss')}, gradient {th.get('grad')})\n\n"
        )
        out.append(
            _table(
                [
                    "method",
                    "B x L",
                    "loss fp32",
                    "loss bf16",
                    "loss rel err",
                    "grad rel err",
                    "median tensor",
                    "worst tensor",
                    "pass",
                ],
                [
                    [
                        m,
                        f"{r['batch']} x {r['L']}",
                        r["loss_fp32"],
                        r["loss_bf16"],
                        r["loss_rel_err"],
                        r["grad_rel_err"],
                        r["grad_rel_err_median_tensor"],
                        f"{r['grad_rel_err_worst_tensor'][0]} {_f(r['grad_rel_err_worst_tensor'][1])}",
                        r["ok"],
                    ]
                    for m, r in d.get("methods", {}).items()
                ],
            )
        )
    for d in _data(doc, "syncs")[:1]:
        out.append("\n**host syncs per training step** (`torch.cuda.set_sync_debug_mode('warn')`)\n\n")
        out.append(
            _table(
                ["method", "syncs / step", "expected", "logging step", "sites"],
                [
                    [
                        m,
                        r["syncs_per_step"],
                        r["expected"],
                        r["logging_step_syncs"],
                        ", ".join(f"{k} x{v}" for k, v in r["sites"].items()),
                    ]
                    for m, r in d.get("methods", {}).items()
                ],
            )
        )
    for d in _data(doc, "compile")[:1]:
        extra = (
            f"; compiled vs eager: loss rel err {_f(d['loss_rel_err'])}, gradient rel err "
            f"{_f(d['grad_rel_err'])}, first compiled call {_f(d['first_compiled_call_s'])} s"
            if "loss_rel_err" in d
            else ""
        )
        out.append(
            f"\n**compile** (RePlaid loss core on CUDA): {d['graph_count']} graph(s), "
            f"{d['graph_break_count']} graph breaks{extra}\n"
        )
    speed = [(d, "eager") for d in _data(doc, "speed")] + [(d, "compiled") for d in _data(doc, "speed_compiled")]
    if speed:
        out.append(
            f"\n**training step at {PRESET}** (MFU = the model's training FLOPs per token x tokens/s / the "
            f"bf16 matmul peak, measured or the datasheet's)\n\n"
        )
        out.append(
            _table(
                [
                    "method",
                    "mode",
                    "precision",
                    "batch x L",
                    "step s",
                    "tokens/s",
                    "MFU (measured peak)",
                    "MFU (datasheet)",
                    "peak mem GB",
                    "model GB",
                    "warm-up s",
                ],
                [
                    [
                        d["method"],
                        mode,
                        d["precision"],
                        f"{d['batch']} x {d['L']}",
                        d["step_s"],
                        d["tokens_per_s"],
                        _pct(d.get("mfu")),
                        _pct(d.get("mfu_datasheet")),
                        d["peak_mem_gb"],
                        d["model_gb"],
                        d.get("warmup_s"),
                    ]
                    for d, mode in speed
                ],
            )
        )
    mem = _data(doc, "memory") + _data(doc, "speed")
    if _data(doc, "memory"):
        out.append("\n**peak memory vs `replaid memory`** (max allocated; the model's estimate for the same batch)\n\n")
        out.append(
            _table(
                ["method", "batch", "measured GB", "model GB", "measured / model"],
                [
                    [d["method"], d["batch"], d["peak_mem_gb"], d["model_gb"], d["peak_mem_gb"] / d["model_gb"]]
                    for d in sorted(mem, key=lambda d: (d["method"], d["batch"]))
                ],
            )
        )
    mb = _data(doc, "maxbatch")
    if mb:
        out.append(
            "\n**largest batch that fits** (one training step; out-of-memory search from the model's "
            "prediction for the whole device memory)\n\n"
        )
        out.append(
            _table(
                ["method", "measured largest", "first failing", "model's prediction", "device GB", "probes"],
                [
                    [
                        d["method"],
                        d["max_batch"],
                        d["first_failing_batch"],
                        d["predicted_max_batch"],
                        d["device_memory_gb"],
                        len(d["probes"]),
                    ]
                    for d in mb
                ],
            )
        )
    sm = [x for d in _data(doc, "sampler") for x in (d if isinstance(d, list) else [d])]
    if sm:
        out.append(f"\n**samplers** (untrained {PRESET} weights; bf16 autocast on a GPU)\n\n")
        out.append(
            _table(
                ["sampler", "T", "NFE", "batch x L", "V", "s", "NFE/s", "tokens/s"],
                [
                    [
                        d["sampler"],
                        d["T"],
                        d["nfe"],
                        f"{d['batch']} x {d['L']}",
                        d["V"],
                        d["seconds"],
                        d["nfe_per_s"],
                        d["tokens_per_s"],
                    ]
                    for d in sm
                ],
            )
        )
    for d in _data(doc, "likelihood")[:1]:
        out.append(
            f"\n**ODE likelihood** ({d['n_seqs']} sequences x K = {d['K']}, L = {d['L']}, Heun {d['steps']} "
            f"steps, {d['n_hutch']} probe(s), batch {d['batch_size']}): {_f(d['s_per_sequence_sample'])} s per "
            f"sequence-sample ({_f(d['s_per_sequence_at_128_steps'])} s at 128 steps), {d['nfe']} NFE, "
            f"{_f(d['nfe_per_s'])} NFE/s\n"
        )
    ref = doc.get("steps", {}).get("mdlm_ref", {})
    for d in _data(doc, "mdlm_ref")[:1]:
        ours = next((x for x in _data(doc, "speed") if x["method"] == "mdlm" and x["batch"] == d["batch"]), None)
        rows = [["kuleshov-group/mdlm", d["batch"], d["step_s"], d["tokens_per_s"], d["peak_mem_gb"], d["loss"]]]
        if ours:
            rows.append(
                [
                    "replaid mdlm (eager)",
                    ours["batch"],
                    ours["step_s"],
                    ours["tokens_per_s"],
                    ours["peak_mem_gb"],
                    ours["loss"],
                ]
            )
        out.append(f"\n**MDLM reference vs replaid's MDLM** (L = {d['L']}; {'; '.join(d.get('stand_ins', []))})\n\n")
        out.append(_table(["code", "batch", "step s", "tokens/s", "peak mem GB", "loss"], rows))
    if ref.get("status") == "skipped":
        out.append(f"\n**MDLM reference**: not run: {ref.get('reason')}\n")
    return "".join(out)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def merge(paths: list[str]) -> dict:
    doc: dict = {"runs": [], "steps": {}}
    for p in paths:
        d = load_json(Path(p))
        if not isinstance(d, dict) or "steps" not in d:
            raise UsageError(f"{p}: not a gpu_check.json (no 'steps'); give the file a run wrote under --out")
        doc["runs"] += d.get("runs", [])
        for k, v in d["steps"].items():  # a later file wins, unless its step was only skipped
            if v.get("status") != "skipped" or k not in doc["steps"]:
                doc["steps"][k] = v
    return doc


BEGIN, END = "<!-- gpu_check:begin -->", "<!-- gpu_check:end -->"


def record(md: str, docs: Path) -> None:
    """Put ``md`` between the gpu_check markers of ``docs`` (docs/benchmarks.md)."""
    text = docs.read_text()
    if BEGIN not in text or END not in text:
        raise UsageError(f"{docs} has no '{BEGIN}' ... '{END}' block; restore the GPU acceptance section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    docs.write_text(f"{head}{BEGIN}\n{md.rstrip()}\n{END}{tail}")


# ================================================================== the dry run


def resolve_cmd(cmd: Cmd, py: str) -> tuple[bool, str]:
    """Whether ``cmd`` would start as written: its script exists and parses these arguments, its child
    function takes this spec, its pytest selection collects tests."""
    if cmd.kind == "script":
        path = REPO / cmd.args[0]
        if not path.is_file():
            return False, f"{cmd.args[0]}: no such script"
        try:
            sys.path.insert(0, str(BENCH))
            spec = importlib.util.spec_from_file_location(f"_dry_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            parser = mod.build_parser()
        except Exception as e:
            return False, f"{cmd.args[0]}: does not import ({e.__class__.__name__}: {e})"
        return _parses(parser, cmd.args[1:], cmd.args[0])
    if cmd.kind == "child":
        name, spec = cmd.args[2], json.loads(cmd.args[4])
        fn = CHILDREN.get(name)
        if fn is None:
            return False, f"--child {name}: no such child"
        try:
            inspect.signature(fn).bind(**spec)
        except TypeError as e:
            return False, f"--child {name}: {e}"
        return True, f"child {name}({', '.join(spec)})"
    if cmd.kind == "pytest":
        args = list(cmd.args)
        if "--junitxml" in args:
            i = args.index("--junitxml")
            del args[i : i + 2]
        files = [a for a in args if a.startswith("tests/")]
        miss = [f for f in files if not (REPO / f).is_file()]
        if miss:
            return False, f"no such test file {', '.join(miss)}"
        dev = args.index("--device")
        args[dev + 1] = "cpu"  # collected here without CUDA
        p = subprocess.run(
            [py, *args, "--collect-only", "-q"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        per_file = re.findall(r"^(tests/\S+\.py): (\d+)$", p.stdout, re.M)  # -qq: one line per file
        m = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", p.stdout)
        n = sum(int(k) for _, k in per_file) if per_file else int(m.group(1)) if m else 0
        empty = sorted(set(files) - {f for f, k in per_file if int(k)}) if per_file else []
        if p.returncode != 0 or n == 0 or empty:
            why = f"no test selected in {', '.join(empty)}" if empty else (p.stdout + p.stderr).strip()[-400:]
            return False, f"pytest --collect-only exit {p.returncode}: {why}"
        return True, f"{n} tests collect ({', '.join(f'{f} {k}' for f, k in per_file) or f'{len(files)} files'})"
    if cmd.kind == "cli":
        from replaid.cli import _parser

        return _parses(_parser(), cmd.args[2:], "replaid")
    return False, f"unknown command kind {cmd.kind}"


def _parses(parser, args: list, name: str) -> tuple[bool, str]:
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return False, f"{name} rejects its arguments: {err.getvalue().strip().splitlines()[-1:]}"
    return True, f"{name} parses"


def resolve_setup(py: str) -> tuple[bool, list]:
    """The set-up's pieces (scripts/gpu_check.sh): pip for ``py``, a buildable project, the wheels."""
    lines, ok = [], True
    p = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True)
    good = p.returncode == 0 and (REPO / "pyproject.toml").is_file() and (REPO / "src" / "replaid").is_dir()
    ok &= good
    lines.append(
        f"  {'ok ' if good else 'BAD'} python -m pip install --no-index --no-deps --no-build-isolation "
        f"--target /tmp/replaid-site .whl/*.whl ."
    )
    lines.append(
        f"      -> {'pip ' + p.stdout.split()[1] if p.returncode == 0 else 'no pip for ' + py}; "
        f"pyproject.toml {'present' if (REPO / 'pyproject.toml').is_file() else 'MISSING'}"
    )
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    need = os.environ.get("GPU_CHECK_WHEELS", "").split()
    if wheels:
        mb = sum(w.stat().st_size for w in wheels) / 2**20
        lines.append(f"      -> {len(wheels)} wheel(s) in .whl ({mb:.1f} MiB): {' '.join(w.name for w in wheels)}")
    else:
        lines.append(
            "      -> no wheels in .whl: the MDLM reference will lack "
            f"{' '.join(need) or 'its packages'} (bash scripts/gpu_check.sh --fetch-wheels)"
        )
    return ok, lines


def dry_run(a, steps: list[Step]) -> int:
    """Print the plan (each step, its commands, estimated time) and resolve every command."""
    ctx = Ctx(quick=a.quick, device="cuda", peak_tflops=None, mdlm_ref=Path(a.mdlm_ref).resolve())
    total, bad = 0, 0
    print(f"plan: {'quick' if a.quick else 'full'} GPU check, {len(steps)} steps (estimates on one H100)", flush=True)
    ok, lines = resolve_setup(a.python)
    bad += not ok
    print("\n[setup] set-up without a network: carried wheels, then the project with --no-deps (~30 s)")
    print("\n".join(lines), flush=True)
    for s in steps:
        est = s.est[0 if a.quick else 1]
        total += est
        print(f"\n[{s.name}] {s.title} (~{est} s)", flush=True)
        for cmd in s.commands(ctx):
            ok, why = resolve_cmd(cmd, a.python)
            bad += not ok
            print(f"  {'ok ' if ok else 'BAD'} {cmd.text()}\n      -> {why}", flush=True)
        if s.name == "mdlm_ref":
            sys.path.insert(0, str(BENCH))
            from gpu_check_mdlm import missing_files

            miss = missing_files(ctx.mdlm_ref)
            state = (
                "present"
                if not miss
                else (
                    f"absent (the step will be skipped: {', '.join(miss)} missing; "
                    "bash scripts/gpu_check.sh --fetch-mdlm SNAPSHOT)"
                )
            )
            print(f"      reference: {state}", flush=True)
    feats = torch_features()
    print(
        f"\ntorch {__import__('torch').__version__} here: "
        + ", ".join(f"{f['api']} (>= {f['since']})" + ("" if f["present"] else " MISSING") for f in feats)
    )
    print(
        f"\nestimated total: {total} s ({total / 60:.1f} min) + set-up; "
        + (
            "quick mode ends inside one 10-minute call (steps that no longer fit are skipped and named)"
            if a.quick
            else "a full check in 10-minute calls: " + " | ".join(f"--steps {x}" for x in FULL_SPLIT)
        )
    )
    n = sum(len(s.commands(ctx)) for s in steps)
    print(
        f"resolved: {n + 1 - bad}/{n + 1} commands (set-up included)"
        + ("; dry run: every step resolved" if not bad else f"; {bad} do not resolve (BAD above)"),
        flush=True,
    )
    return 0 if not bad else 1


# ================================================================== entry point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the subset that fits one 10-minute call")
    p.add_argument("--out", default=None, help="folder for gpu_check.json/.md (default: $OUT, else runs/gpu_check)")
    p.add_argument("--steps", default=None, help=f"comma-separated subset of {','.join(STEP_NAMES)}")
    p.add_argument("--dry-run", action="store_true", help="print the plan and resolve every command; run nothing")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for all steps; steps that no longer fit are skipped (quick: 570 - set-up)",
    )
    p.add_argument("--device", default="cuda", help="device of the steps (cuda; cpu only to try the driver)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="shrink every model and length (hidden 64, L = 64): tries the driver itself on a CPU",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for the steps' processes")
    p.add_argument("--mdlm-ref", default=str(REPO / ".carry" / "mdlm"), help="copy of kuleshov-group/mdlm")
    p.add_argument("--setup-json", default=None, help="the wrapper's set-up record (time, nvidia-smi, wheels)")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="merge gpu_check.json files of several calls into --out (and render the table)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="with --merge: also put the table into docs/benchmarks.md between the gpu_check markers",
    )
    p.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)  # the wrapper's early check
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="{}", help=argparse.SUPPRESS)
    return p


def main(argv: Optional[list] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.child:
            sys.path.insert(0, str(REPO / "src"))
            if a.child not in CHILDREN:
                raise UsageError(f"--child {a.child}: no such child; one of {', '.join(CHILDREN)}")
            print(json.dumps(CHILDREN[a.child](**json.loads(a.spec)), default=str), flush=True)
            return 0
        out = Path(a.out or os.environ.get("OUT") or REPO / "runs" / "gpu_check")
        if a.merge:
            doc = merge(a.merge)
            write_outputs(doc, out)
            print(f"merged {len(a.merge)} file(s) into {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
            if a.record:
                record(render(doc), REPO / "docs" / "benchmarks.md")
                print("recorded the table in docs/benchmarks.md")
            return 0
        if a.record:
            raise UsageError("--record goes with --merge JSON... (it records merged results)")
        steps = select_steps(a.steps, a.quick)
        if a.budget is not None and a.budget <= 0:
            raise UsageError(f"--budget {a.budget:g}: give a positive number of seconds")
        if a.check_args:
            return 0
        if a.dry_run:
            return dry_run(a, steps)
        return run_plan(a, steps, out)
    except UsageError as e:
        print(f"replaid: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
