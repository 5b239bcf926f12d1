"""A training step of every method neither waits for the device (but for the non-finite guard's
one verdict) nor copies across devices (but for the batch) outside logging steps: counted on the ``meta`` device (standing in for a GPU) by
:class:`replaid.training.syncs.SyncCounter`."""

import inspect

import pytest
import torch

from replaid.methods import METHODS
from replaid.training.syncs import SyncCounter, meta_as_cpu_autocast
from replaid.training.testbed import small_trainer
from replaid.training.train import Trainer

V = 64


@pytest.fixture(autouse=True)
def _meta_autocast():
    with meta_as_cpu_autocast():
        yield


def meta_trainer(method_name: str, extra=()):
    """The method's toy trainer on ``meta`` (the GPU check's syncs step builds its own the same way)."""
    sets = [
        "model.hidden=32",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.cond_dim=16",
        "diffusion.schedule_hidden=16",  # dropped for the discrete methods (unread)
        "train.batch_size=8",
        "data.seq_len=8",
        "optim.ema=0.9",
        *extra,
    ]
    return small_trainer(method_name, "meta", sets, V)


TRAINABLE = sorted(n for n, c in METHODS.items() if c.trainable)


@pytest.mark.parametrize("name", TRAINABLE)
def test_train_step_has_no_sync_and_only_the_batch_copy(name):
    tr = meta_trainer(name, ["train.grad_accum=2"] if name in ("replaid", "mdlm") else [])
    accum = tr.cfg.train.grad_accum
    batch = [{"tokens": torch.randint(0, V, (8 // accum, 8))} for _ in range(accum)]
    with SyncCounter("meta"):  # warm-up (optimizer state, first EMA); the counter answers host reads on meta
        tr.train_step(batch, log=False)
    with SyncCounter("meta") as c:
        tr.train_step(batch, log=False)
    # the one host read left: the non-finite guard's verdict (one scalar per step, Trainer._all_finite)
    ((where, n),) = c.syncs.items()
    src, first = inspect.getsourcelines(Trainer._all_finite)
    op, _, loc = where.partition(" @ ")
    file, _, line = loc.rpartition(":")
    assert op == "_local_scalar_dense.default" and n == 1 and file == "training/train.py", dict(c.syncs)
    assert first <= int(line) < first + len(src), f"the host read at line {line} is not the guard's"
    assert sum(c.copies.values()) == accum and all(k.startswith("cpu->meta @ training/train.py") for k in c.copies), (
        dict(c.copies)
    )


def test_counter_sees_each_kind_of_sync():
    x = torch.ones(4, device="meta")
    m = torch.ones(4, dtype=torch.bool, device="meta")
    with SyncCounter("meta") as c:
        float(x.sum()), bool(m.any()), x.nonzero(), x[m], x.masked_select(m), torch.equal(x, x)
        x[m] = 0.0
        torch.zeros(4).to("meta")
    assert sum(c.syncs.values()) == 7 and sum(c.copies.values()) == 1, (c.syncs, c.copies)


# torch.tensor(data, device=d) builds on the host and copies below the dispatcher, where the meta counter
# cannot see it; on CUDA it is a synchronising copy. The H200 check of 2026-11-26 found one in RePlaid's
# schedule, called every step. So no module on the training step's path may write one (outside logging).
STEP_PATH = ["diffusion", "model", "methods", "training/train.py"]
ALLOWED = {("training/train.py", "_stop_requested")}  # several ranks only, at logging steps


def tensor_from_host_sites(src_root):
    import ast

    sites = []
    for part in STEP_PATH:
        p = src_root / part
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            tree = ast.parse(f.read_text())
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Call)
                        and ast.unparse(node.func) == "torch.tensor"
                        and any(k.arg == "device" for k in node.keywords)
                    ):
                        sites.append((str(f.relative_to(src_root)), fn.name, node.lineno))
    return sites


def test_no_host_built_tensor_on_the_step_path():
    from pathlib import Path

    import replaid

    root = Path(replaid.__file__).parent
    bad = [s for s in tensor_from_host_sites(root) if s[:2] not in ALLOWED]
    assert not bad, f"torch.tensor(..., device=...) on the training step's path (a host copy per call): {bad}"


def test_the_host_built_tensor_scan_sees_one(tmp_path):
    (tmp_path / "diffusion").mkdir()
    (tmp_path / "diffusion" / "s.py").write_text(
        "import torch\ndef f(t):\n    return torch.tensor([0.0, 1.0], device=t.device)\n"
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "methods").mkdir()
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "train.py").write_text("")
    assert tensor_from_host_sites(tmp_path) == [("diffusion/s.py", "f", 3)]
