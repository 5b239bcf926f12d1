"""Small fixed set-ups that the tests and the GPU check measure on, and their gradient comparisons.

One copy for both users:

* :func:`small_trainer`: a :class:`~replaid.training.train.Trainer` of one method at toy sizes. The
  sync-free tests (``tests/test_sync_free.py``) count its host syncs on the ``meta`` device with
  :class:`~replaid.training.syncs.SyncCounter`; the GPU check's ``syncs`` step counts them on CUDA
  with ``torch.cuda.set_sync_debug_mode``.
* :func:`loss_core_inputs`: RePlaid's loss core with fixed arguments (two rows at ``t = 0``, two
  self-conditioned rows). ``tests/test_compile.py`` and the GPU check's ``compile`` step run it under
  ``torch._dynamo.explain`` and compare :func:`eager_and_compiled`.
* :func:`grads` and :func:`grad_rel_err`: the gradients of a backward pass and the global relative
  error of one set against another (the ``bf16`` and ``compile`` steps of the GPU check).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from replaid.config import RunConfig, unread_keys
from replaid.data.loader import Batch
from replaid.methods import get_method
from replaid.methods.base import Method
from replaid.presets import resolve
from replaid.training.memory import LiveHeap
from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer

# the loss core's toy network (tests/test_compile.py and the GPU check's compile step)
LOSS_CORE_SIZES = [
    "model.hidden=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.cond_dim=16",
    "diffusion.schedule_hidden=16",
]


def small_trainer(
    method_name: str, device: str | torch.device, sets: Sequence[str], vocab: int, seed: int = 0
) -> Trainer:
    """A trainer of ``method_name`` on the ``debug`` preset with the ``key=value`` overrides ``sets``,
    an EMA of decay 0.9 and the :class:`TrainModule`, for counting what one training step does.

    The keys of ``sets`` that the method does not read are dropped (the config refuses another
    method's keys), so one list serves every method. The model is built on the ``meta`` device
    directly (no values to move); on another device it is built on the CPU after
    ``torch.manual_seed(seed)`` (the same weights on any device) and moved there.
    """
    skip = set(unread_keys(RunConfig(method=method_name), [s.partition("=")[0] for s in sets]))
    cfg = resolve("debug", None, [f"method={method_name}", *(s for s in sets if s.partition("=")[0] not in skip)])
    method = get_method(cfg)
    dev = torch.device(device)
    torch.manual_seed(seed)
    if dev.type == "meta":
        with dev:
            model = method.build_model(vocab)
    else:
        model = method.build_model(vocab).to(dev)
    return Trainer(
        cfg,
        model,
        method,
        build_optimizer(model, cfg.optim),
        dev,
        EMA(model, 0.9),
        loss_module=TrainModule(model, method),
    )


def loss_core_inputs(
    method_name: str = "replaid", device: str | torch.device = "cpu"
) -> tuple[Method[Any], nn.Module, tuple[Any, ...]]:
    """``(method, model, args)`` with ``method.loss_core(*args)`` one fixed call of the loss core (a
    1-layer, hidden-32 network, V = 64, B = 8, L = 16; the noise drawn after ``torch.manual_seed(0)``)."""
    cfg = resolve("debug", None, [f"method={method_name}", *LOSS_CORE_SIZES])
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(64).to(device)
    B, L = 8, 16
    tok = torch.randint(0, 64, (B, L)).to(device)
    t = torch.cat([torch.zeros(2, dtype=torch.float64), torch.linspace(0.1, 0.9, B - 2, dtype=torch.float64)])
    gamma, dgamma = model.schedule(t.to(device))
    sc_idx = torch.tensor([2, 5], device=device)
    sc = torch.zeros(B, dtype=torch.bool, device=device).index_fill_(0, sc_idx, True)
    eps = torch.randn(B, L, model.d_e).to(device)
    return m, model, (model, tok, gamma, dgamma, sc, sc_idx, eps, 2, 1.0, None)


def grads(model: nn.Module) -> dict[str, Tensor]:
    """The gradient of each parameter that has one, detached, as float64 copies."""
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_rel_err(g: dict[str, Tensor], ref: dict[str, Tensor]) -> float:
    """Global relative error ``||g - ref|| / ||ref||`` over all of ``ref``'s tensors."""
    num = sum(float((g[n] - ref[n]).pow(2).sum()) for n in ref)
    den = sum(float(ref[n].pow(2).sum()) for n in ref)
    rel: float = (num / den) ** 0.5
    return rel


def eager_and_compiled(
    fn: Callable[..., Any], model: nn.Module, args: tuple[Any, ...]
) -> list[tuple[float, dict[str, Tensor], float]]:
    """``fn(*args)`` eager, then under ``torch.compile``: for each, the loss (the first output), the
    gradients after its backward (:func:`grads`) and the call's seconds (the compiled one's includes
    the compilation)."""
    out = []
    for f in (fn, torch.compile(fn)):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, *_ = f(*args)
        loss.backward(retain_graph=True)
        if loss.device.type == "cuda":
            torch.cuda.synchronize(loss.device)
        out.append((float(loss.detach()), grads(model), time.perf_counter() - t0))
    return out


def measure(cfg: RunConfig, V: int, batch: int) -> float:
    """Measured peak live bytes of the second training step (fp32, CPU), the model, optimizer and
    EMA created under the meter so every tensor is counted."""
    torch.manual_seed(0)
    tokens: list[Batch] = [{"tokens": torch.randint(0, V, (batch, cfg.data.seq_len))}]
    with LiveHeap() as heap:
        method = get_method(cfg)
        model = method.build_model(V)
        tr = Trainer(
            cfg,
            model,
            method,
            build_optimizer(model, cfg.optim),
            torch.device("cpu"),
            EMA(model, cfg.optim.ema) if cfg.optim.ema > 0 else None,
            loss_module=TrainModule(model, method),
        )
        for p in model.parameters():  # parameters made outside dispatch (nn.Parameter wrappers) count too
            heap.track(p)
        tr.train_step(tokens, log=False)
        heap.reset_peak()
        tr.train_step(tokens, log=False)
    if tr.nonfinite_steps:  # a skipped step frees no optimiser state: its peak is not a training step's
        raise ValueError(f"method={cfg.method} at batch {batch}: {tr.nonfinite_steps} of the 2 steps were not finite")
    return float(heap.peak)
