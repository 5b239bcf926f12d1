"""What the GPU check measures in its own processes (``python benchmarks/gpu_check.py --child NAME
--spec JSON``): each child function returns one JSON-able dict whose ``ok`` says whether it passed.

The set-ups and gradient comparisons it shares with the tests come from
:mod:`replaid.training.testbed` (one copy): the syncs step's trainers, the compile step's loss-core
inputs and its compiled-vs-eager pass, the gradients of the bf16 step.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Callable

from .base import BENCH, L_PAPER, PRESET, PRESET_OF, log

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
    methods: list, batch: int = 4, length: int = L_PAPER, overrides: list | None = None, device: str = "cuda"
) -> dict:
    """Loss and gradients under bf16 autocast vs float32, same tokens and noise (dropout off), per method."""
    import torch

    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.memory import preset_vocab
    from replaid.training.testbed import grad_rel_err, grads
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
            runs[prec] = (float(loss), grads(model))
        (l32, g32), (l16, g16) = runs["fp32"], runs["bf16"]
        per = {n: float((g16[n] - g32[n]).norm() / g32[n].norm()) for n in g32 if float(g32[n].norm()) > 0}
        worst = max(per, key=per.get)
        rel_loss, rel_grad = abs(l16 - l32) / abs(l32), grad_rel_err(g16, g32)
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

    from replaid.training.testbed import small_trainer

    dev = torch.device(device)
    if dev.type != "cuda" and not allow_cpu:
        raise RuntimeError("the syncs step counts CUDA syncs: it needs --device cuda")
    res = {}
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
    for name in methods:
        # (the keys a method does not read are dropped: the config refuses another method's keys)
        tr = small_trainer(name, dev, sets, 256)
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

    from replaid.training.testbed import eager_and_compiled, grad_rel_err, loss_core_inputs

    m, model, args = loss_core_inputs("replaid", torch.device(device))
    ex = dynamo.explain(m.loss_core)(*args)
    out = {
        "graph_count": ex.graph_count,
        "graph_break_count": ex.graph_break_count,
        "break_reasons": [str(b.reason)[:200] for b in ex.break_reasons],
    }
    ok = ex.graph_count == 1 and ex.graph_break_count == 0
    if eager_check:
        dynamo.reset()
        (le, ge, _), (lc, gc_, tc) = eager_and_compiled(m.loss_core, model, args)
        out.update(
            loss_eager=le,
            loss_compiled=lc,
            loss_rel_err=abs(lc - le) / abs(le),
            grad_rel_err=grad_rel_err(gc_, ge),
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
    overrides: list | None = None,
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
