"""Host syncs and cross-device copies per training step, per method, with their source lines.

    python benchmarks/count_syncs.py                 # this code, counted on the meta device (a stand-in GPU)
    PYTHONPATH=/old/src python benchmarks/count_syncs.py --device cpu   # another version, counted on the CPU

On ``meta`` every event is one a GPU would see. On ``cpu`` (for code that cannot run on meta) every
event on a CPU tensor counts, including harmless reads of CPU-generator scalars: read the sites.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location(
    "syncs", Path(__file__).resolve().parents[1] / "src" / "replaid" / "training" / "syncs.py"
)
syncs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(syncs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="meta", choices=["meta", "cpu"])
    p.add_argument("--methods", nargs="+", default=["replaid", "plaid", "mdlm", "duo", "ar"])
    a = p.parse_args()
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer

    dev = torch.device(a.device)
    for name in a.methods:
        cfg = resolve(
            "debug",
            None,
            [
                f"method={name}",
                "model.hidden=32",
                "model.n_layers=1",
                "model.n_heads=2",
                "model.cond_dim=16",
                "diffusion.schedule_hidden=16",
                "train.batch_size=8",
                "data.seq_len=8",
            ],
        )
        m = get_method(cfg)
        with dev:
            model = m.build_model(64)
        tr = Trainer(
            cfg, model, m, build_optimizer(model, cfg.optim), dev, EMA(model, 0.9), loss_module=TrainModule(model, m)
        )
        batch = [{"tokens": torch.randint(0, 64, (8, 8))}]
        kw = {"log": False} if "log" in inspect.signature(tr.train_step).parameters else {}
        with syncs.meta_as_cpu_autocast():
            with syncs.SyncCounter(a.device):
                tr.train_step(batch, **kw)
            with syncs.SyncCounter(a.device) as c:
                tr.train_step(batch, **kw)
        n_s, n_c = c.total()
        print(f"{name}: {n_s} syncs, {n_c} cross-device copies")
        for k, v in sorted(c.syncs.items()):
            print(f"    sync  {v} x {k}")
        for k, v in sorted(c.copies.items()):
            print(f"    copy  {v} x {k}")


if __name__ == "__main__":
    main()
