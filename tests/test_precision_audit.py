"""The paper's precision table (appendix, "Precision details for RePlaid") audited op by op (issue 53).

One training step's forward and loss (debug preset, CPU, under the bf16 autocast of
``train.precision=bf16``) runs under a ``TorchDispatchMode`` that records the dtype every aten op runs
in (its first floating-point output: after autocast's casts, a matmul's output dtype is its compute
dtype; views, which compute nothing, are left out), attributed to the innermost region: the code's :func:`replaid.regions.region` marks and, for
modules, forward hooks (the noise schedule, the MLP, the residual stream of each block, the LayerNorms
and AdaLN, which the table does not list). A row the table keeps in float32 (float64) fails when any of
its ops runs in a narrower dtype; a bf16 row fails when its matmuls do not run in bf16 (autocast off
would make the audit vacuous); every row a method has must be seen.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
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

    def violations(self) -> list[str]:
        bad = []
        for reg, rule in TABLE.items():
            for (op, dt), n in self.seen.get(reg, {}).items():
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


def audit_step(method: str, *over: str) -> DtypeAudit:
    """One training step's forward and loss of ``method`` under bf16 autocast on the CPU, audited."""
    cfg = resolve("debug", None, [f"method={method}", f"data.seq_len={L}", "train.precision=bf16", *over])
    m = get_method(cfg)
    torch.manual_seed(0)
    model = m.build_model(V)
    with torch.no_grad():  # open the zero-initialised head
        model.final.linear.weight.normal_(0, 0.3)
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    kw = {"t_diff": torch.rand(B - m.recon_rows(B), dtype=torch.float64)} if method == "replaid" else {}
    audit = DtypeAudit()
    handles = _hooks(model, audit)
    try:
        with R.listen(audit.mark), autocast_ctx(torch.device("cpu"), cfg.train.precision), audit:
            loss, _ = m.train_loss(model, tokens, torch.Generator().manual_seed(0), **kw)
    finally:
        for h in handles:
            h.remove()
    assert loss.dtype == torch.float64 and torch.isfinite(loss)
    return audit


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
