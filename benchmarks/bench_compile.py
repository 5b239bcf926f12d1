"""train.compile speedup: CPU time per training step, eager vs compiled, interleaved, at 1 thread.

    python benchmarks/bench_compile.py --vocab 2048 --rounds 3 --steps 3

Each mode runs in a fresh process (compilation and two warm-up steps excluded); model as
bench_step.py (hidden 256, 4 layers, L = 256, batch 8, fp32). Prints the table; --record appends it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_one_option, append_results, device_name, run_isolated, run_one_if_asked

BASE = [
    "model.hidden=256",
    "model.n_layers=4",
    "model.n_heads=4",
    "data.seq_len=256",
    "train.batch_size=8",
    "train.precision=fp32",
    "optim.ema=0",
]


def one(method: str, V: int, steps: int, compiled: bool) -> dict:
    import torch

    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.train import Trainer, TrainModule, build_optimizer, compile_loss

    torch.set_num_threads(1)
    cfg = resolve("debug", None, [*BASE, f"method={method}"])
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(V)
    tr = Trainer(
        cfg, model, m, build_optimizer(model, cfg.optim), torch.device("cpu"), loss_module=TrainModule(model, m)
    )
    if compiled:
        compile_loss(model, m)
    batch = [{"tokens": torch.randint(0, V, (8, 256))}]
    for _ in range(2):
        tr.train_step(batch, log=False)
    t0 = time.process_time()
    for _ in range(steps):
        tr.train_step(batch, log=False)
    return {"step_cpu_s": (time.process_time() - t0) / steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--methods", nargs="+", default=["replaid", "mdlm"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--record", action="store_true")
    add_one_option(p)
    a = p.parse_args()
    if run_one_if_asked(a, one):
        return
    res: dict = {}
    for r in range(a.rounds):
        for method in a.methods:
            for compiled in (False, True):
                spec = dict(method=method, V=a.vocab, steps=a.steps, compiled=compiled)
                out, err = run_isolated(__file__, spec, {**os.environ, "OMP_NUM_THREADS": "1"})
                if out is None:
                    sys.exit(err[-2000:])
                v = out["step_cpu_s"]
                res.setdefault((method, compiled), []).append(v)
                print(f"round {r} {method} compiled={compiled} {v:.4f} s", flush=True)
    rows = []
    for method in a.methods:
        e, c = statistics.median(res[(method, False)]), statistics.median(res[(method, True)])
        rows.append([method, a.vocab, e, c, f"{e / c:.3f}"])
        print(rows[-1])
    if a.record:
        import torch

        append_results(
            f"train.compile speedup, {device_name(torch.device('cpu'))} (1 thread)",
            ["method", "V", "eager step CPU s", "compiled step CPU s", "speedup"],
            rows,
            f"`python benchmarks/bench_compile.py {' '.join(sys.argv[1:])}`; CPU time per step, median of "
            f"{a.rounds} interleaved rounds, fresh process each, compilation excluded. RePlaid compiles "
            f"its loss core (one graph), MDLM its backbone.",
        )


if __name__ == "__main__":
    main()
