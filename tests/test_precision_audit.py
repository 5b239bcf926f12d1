"""The paper's precision table (appendix, "Precision details for RePlaid") audited op by op (issue 53).

One training step's forward and loss (debug preset, CPU, under the bf16 autocast of
``train.precision=bf16``) runs under a ``TorchDispatchMode`` that records the dtype every aten op runs
in (its first floating-point output: after autocast's casts, a matmul's output dtype is its compute
dtype; views, which compute nothing, are left out), attributed to the innermost region: the code's :func:`replaid.regions.region` marks and, for
modules, forward hooks (the noise schedule, the MLP, the residual stream of each block, the LayerNorms
and AdaLN, which the table does not list). A row the table keeps in float32 (float64) fails when any of
its ops runs in a narrower dtype; a bf16 row fails when its matmuls do not run in bf16 (autocast off
would make the audit vacuous); every row a method has must be seen.

The backward is audited by the same rules: each autograd node the forward creates is tagged with the
region its op ran in (a ``TorchFunctionMode`` walks the new nodes of every call), and the node's backward
runs with that region marked (node pre-hook and hook); the fused heads mark their own backward. A cast of a
gradient back to its tensor's dtype (``_to_copy``, ``copy_``: a float32 parameter's gradient from a float64
schedule, a bf16 activation's from the float32 residual stream) stores, it computes nothing, and is left out.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from replaid import regions as R
from replaid.methods import get_method
from replaid.presets import resolve
from replaid.training.train import autocast_ctx

V, B, L = 64, 8, 16
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_dot_product_flash_attention_for_cpu"}
WIDTH = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32, torch.float64: 64}

# region -> the narrowest dtype its ops may run in (the table's row), or "bf16" (matmuls in bf16)
TABLE = {
    "noise schedule": torch.float64,
    R.INPUT_PROJECTIONS: torch.float32,
    R.MLP: "bf16",
    R.ATTENTION: "bf16",
    R.RESIDUAL: torch.float32,
    R.HEAD: "bf16",
    R.PRIOR: torch.float32,
    R.REPARAM: torch.float32,
    R.ELEMENT_LOSS: torch.float32,
    R.AGGREGATION: torch.float64,  # the table: RePlaid's; this project aggregates every method's in float64
}
ROWS = {
    "replaid": set(TABLE),
    # the token models have no input projection, output prior or reparameterisation (N.A. in the table)
    "mdlm": set(TABLE) - {"noise schedule", R.INPUT_PROJECTIONS, R.PRIOR, R.REPARAM},
    "ar": set(TABLE) - {"noise schedule", R.INPUT_PROJECTIONS, R.PRIOR, R.REPARAM},
}


class DtypeAudit(TorchDispatchMode):
    """Records (region, op, dtype) of every aten op with a floating-point output."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = ["(unlisted)"]
        self.seen: dict[str, dict[tuple[str, torch.dtype], int]] = defaultdict(lambda: defaultdict(int))
        self.entered: set[str] = set()

    def mark(self, name: str, entering: bool) -> None:
        if entering:
            self.stack.append(name)
            self.entered.add(name)
        else:
            assert self.stack.pop() == name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        dt = next((o.dtype for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()), None)
        if dt is not None and not func.is_view:  # a view computes nothing
            self.seen[self.stack[-1]][func.overloadpacket.__name__, dt] += 1
        return out

    def violations(self, skip: frozenset[str] = frozenset()) -> list[str]:
        bad = []
        for reg, rule in TABLE.items():
            for (op, dt), n in self.seen.get(reg, {}).items():
                if op in skip:
                    continue
                if rule == "bf16":
                    if op in MATMULS and dt != torch.bfloat16:
                        bad.append(f"{reg}: {op} ran in {dt} x{n} (the table: bfloat16)")
                elif WIDTH[dt] < WIDTH[rule]:
                    bad.append(f"{reg}: {op} ran in {dt} x{n} (the table: {rule})")
        return bad

    def table(self) -> str:
        return "\n".join(
            f"{reg:32s} {op:40s} {str(dt):15s} {n}"
            for reg, ops in sorted(self.seen.items())
            for (op, dt), n in sorted(ops.items(), key=lambda x: (x[0][0], str(x[0][1])))
        )


def _hooks(model: torch.nn.Module, audit: DtypeAudit) -> list[torch.utils.hooks.RemovableHandle]:
    """Module regions: the schedule, each block's own ops (the residual stream), its MLP, LayerNorms, AdaLN."""
    names = {"schedule": "noise schedule", "mlp": R.MLP, "norm": "(norm)", "adaLN": "(adaLN)", "cond": "(cond)"}
    handles = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        reg = names.get(leaf.rstrip("12")) or (R.RESIDUAL if type(mod).__name__ in ("DiTBlock", "Backbone") else None)
        if reg is None:
            continue
        handles.append(mod.register_forward_pre_hook(lambda m, a, reg=reg: audit.mark(reg, True)))
        handles.append(mod.register_forward_hook(lambda m, a, o, reg=reg: audit.mark(reg, False)))
    return handles


CASTS = frozenset({"_to_copy", "copy_"})  # in the backward: a gradient stored in its tensor's dtype


class NodeTagger(TorchFunctionMode):
    """Tags the autograd nodes each torch call creates (those reachable from its outputs that no earlier call
    tagged) with the forward audit's current region; each node's backward then runs with it marked in ``back``."""

    def __init__(self, forward: DtypeAudit, back: DtypeAudit) -> None:
        super().__init__()
        self.forward, self.back = forward, back
        self.nodes: set[object] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        reg = self.forward.stack[-1]
        outs = out if isinstance(out, (tuple, list)) else [out]
        todo = [o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node in self.nodes or type(node).__name__ == "AccumulateGrad":
                continue
            self.nodes.add(node)
            node.register_prehook(lambda g, reg=reg: self.back.mark(reg, True))
            node.register_hook(lambda gi, go, reg=reg: self.back.mark(reg, False))
            todo += [m for m, _ in node.next_functions if m is not None]
        return out


def audit_step(method: str, *over: str, backward: bool = False) -> DtypeAudit:
    """One training step's forward and loss of ``method`` under bf16 autocast on the CPU, audited; with
    ``backward``, the audit of its backward instead."""
    cfg = resolve("debug", None, [f"method={method}", f"data.seq_len={L}", "train.precision=bf16", *over])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(V)
    with torch.no_grad():  # open the zero-initialised head
        model.final.linear.weight.normal_(0, 0.3)
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    kw = {"t_diff": torch.rand(B - m.recon_rows(B), dtype=torch.float64)} if method == "replaid" else {}
    audit, back = DtypeAudit(), DtypeAudit()
    tagger = NodeTagger(audit, back) if backward else nullcontext()
    handles = _hooks(model, audit)
    try:
        with R.listen(audit.mark), autocast_ctx(torch.device("cpu"), cfg.train.precision), audit, tagger:
            loss, _ = m.train_loss(model, tokens, torch.Generator().manual_seed(0), **kw)
    finally:
        for h in handles:
            h.remove()
    assert loss.dtype == torch.float64 and torch.isfinite(loss)
    if not backward:
        return audit
    with R.listen(back.mark), back:
        loss.backward()
    assert back.stack == ["(unlisted)"]  # every node's region closed
    return back


@pytest.mark.parametrize("method", ["replaid", "mdlm", "ar"])
def test_every_row_of_the_precision_table_runs_in_its_dtype(method):
    audit = audit_step(method)
    missing = ROWS[method] - set(audit.seen)
    assert not missing, f"regions never seen: {missing}\n{audit.table()}"
    assert not audit.violations(), "\n".join(audit.violations()) + "\n" + audit.table()


def test_the_self_conditioning_pass_is_audited_too():
    """RePlaid's self-conditioning pass (no grad) runs the same network: its ops are in the same rows."""
    audit = audit_step("replaid", "diffusion.sc_rate=1.0")
    assert R.SELF_CONDITIONING in audit.entered
    assert not audit.violations(), "\n".join(audit.violations())


@pytest.mark.parametrize("method", ["replaid", "mdlm", "ar"])
def test_every_row_runs_its_backward_in_its_dtype(method):
    """The gradients of each row in the row's dtype: the prior, the reparameterisation and the per-element
    loss in float32, the schedule and the aggregation in float64, the bf16 rows' matmuls in bf16."""
    back = audit_step(method, backward=True)
    missing = ROWS[method] - set(back.seen)
    assert not missing, f"regions never seen in the backward: {missing}\n{back.table()}"
    bad = back.violations(CASTS)
    assert not bad, "\n".join(bad) + "\n" + back.table()
    for reg in ROWS[method]:  # every matmul of the backward attributed: each bf16 row's are seen, none outside
        if TABLE[reg] == "bf16":
            assert any(op in MATMULS for op, _ in back.seen[reg]), (reg, back.table())
    assert not [op for op, _ in back.seen.get("(unlisted)", {}) if op in MATMULS], back.table()
