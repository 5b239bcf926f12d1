"""Count what would make a GPU wait for the host, measured on any device (a test and benchmark tool).

:class:`SyncCounter` is a ``TorchDispatchMode`` that records, for tensors on ``device``:

* host syncs: ``aten._local_scalar_dense`` (``.item()``, ``float()``, ``bool()``, ``int()``),
  ``nonzero``, ``masked_select``, ``equal``, and ``index`` / ``index_put_`` with a boolean mask
  (their output size depends on the data);
* copies between devices (``_to_copy`` / ``copy_`` with source and destination on different devices);
* random draws off the device: a random op whose generator lives on another device than its
  output (which raises on a GPU), or one filling a host tensor of more than one element while
  counting for another device (noise drawn on the CPU, to be copied).

On the ``meta`` device (no values, so a CPU can stand in for a GPU) the data-dependent ops above
cannot run; the counter answers them with placeholders (0, empty, every mask entry true) so the
code runs on and every site is counted. Each event keeps its source line for the report.
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.equal.default}
INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _site() -> str:
    for fr in reversed(traceback.extract_stack()[:-3]):
        if "/replaid/" in fr.filename and not fr.filename.endswith("syncs.py"):
            return f"{fr.filename.split('/replaid/')[-1]}:{fr.lineno}"
    return "?"


class SyncCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves __init_subclass__ unannotated
    def __init__(self, device: str | torch.device = "meta") -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.device = torch.device(device)
        self.syncs: Counter[str] = Counter()  # "op @ file:line" -> count
        self.copies: Counter[str] = Counter()
        self.host_random: Counter[str] = Counter()

    def _on(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == self.device.type

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        on_dev = any(self._on(t) for t in leaves)
        meta = self.device.type == "meta"
        if on_dev and func in SYNC_OPS:
            self.syncs[f"{func.__name__} @ {_site()}"] += 1
            if meta:
                return self._placeholder(func, args)
        if (
            on_dev
            and func in INDEX_OPS
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_leaves(args[1]))
        ):
            self.syncs[f"{func.__name__}[bool] @ {_site()}"] += 1
            if meta:
                return self._placeholder(func, args)
        if func in (aten._to_copy.default, aten.copy_.default):
            src = args[1] if func is aten.copy_.default else args[0]
            dst_dev = args[0].device if func is aten.copy_.default else kwargs.get("device", src.device)
            if (
                dst_dev is not None
                and torch.device(dst_dev).type != src.device.type
                and (self._on(src) or torch.device(dst_dev).type == self.device.type)
            ):
                self.copies[f"{src.device.type}->{torch.device(dst_dev).type} @ {_site()}"] += 1
        out = func(*args, **kwargs)
        name = func.__name__
        if any(w in name for w in ("rand", "normal", "exponential", "uniform", "bernoulli", "multinomial")):
            res = out if isinstance(out, torch.Tensor) else args[0]
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type != res.device.type:
                self.host_random[f"{name} ({gen.device.type} generator -> {res.device.type}) @ {_site()}"] += 1
            elif res.device.type != self.device.type and res.numel() > 1:
                self.host_random[f"{name} on {res.device.type} @ {_site()}"] += 1
        return out

    @staticmethod
    def _placeholder(func: OpOverload, args: tuple[Any, ...]) -> torch.Tensor | float | bool:
        x: torch.Tensor = args[0]
        if func is aten._local_scalar_dense.default:
            return False if x.dtype == torch.bool else (0.0 if x.dtype.is_floating_point else 0)
        if func is aten.equal.default:
            return False
        if func is aten.nonzero.default:
            return torch.arange(x.numel(), device=x.device).view(-1, 1).expand(-1, x.ndim).contiguous()
        if func is aten.masked_select.default:
            return x.reshape(-1)
        if func is aten.index.Tensor:  # every mask entry true: a mask over the leading dims keeps them all
            m = next(i for i in args[1] if isinstance(i, torch.Tensor))
            return x.reshape(m.numel(), *x.shape[m.ndim :]).clone()
        return x  # index_put(_): values land nowhere

    def total(self) -> tuple[int, int]:
        return sum(self.syncs.values()), sum(self.copies.values())


class meta_as_cpu_autocast:
    """``torch.autocast`` has no ``meta`` device type: treat it as the CPU while counting on meta."""

    def __enter__(self) -> meta_as_cpu_autocast:
        self.real, self.real_enabled = torch.autocast, torch.is_autocast_enabled
        real, real_enabled = self.real, self.real_enabled
        meta_cpu = lambda device_type, *a, **k: real("cpu" if device_type == "meta" else device_type, *a, **k)
        setattr(torch, "autocast", meta_cpu)  # noqa: B010  (a patch of torch's class, which mypy refuses as an assignment)
        setattr(torch, "is_autocast_enabled", lambda *a: real_enabled(*("cpu" if x == "meta" else x for x in a)))  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(torch, "autocast", self.real)  # noqa: B010
        setattr(torch, "is_autocast_enabled", self.real_enabled)  # noqa: B010
