"""Loss + backward CPU time of one method at the demo size (issue 23), for the RePlaid / MDLM ratio.

    for m in mdlm replaid; do OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/step_ratio_demo.py $m; done
    PYTHONPATH=/tmp/base/src python benchmarks/step_ratio_demo.py replaid      # another code version
    python benchmarks/step_ratio_demo.py replaid --profile                       # + torch.profiler table

Hidden 128, 4 layers, 4 heads (the demo's network), L = 256, B = 8, V = 2,048, fp32, 1 thread: two
warm-up steps, then ``--steps`` timed ones; prints the process CPU time (``time.process_time``, user +
system: page faults of fresh buffers count) per step. Runs against both code versions (the method
contract's declared ``global_times`` / ``recon_rows`` or, before it, the probed ``split``).
"""

from __future__ import annotations

import argparse
import time

import torch

from replaid.diffusion.nelbo import low_discrepancy
from replaid.methods import get_method
from replaid.presets import resolve

DEMO_SIZE = [
    "model.hidden=128",
    "model.n_layers=4",
    "model.n_heads=4",
    "model.cond_dim=64",
    "data.seq_len=256",
    "train.batch_size=8",
    "data.bpe_vocab_size=2048",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", help="replaid, mdlm, ... (--set k=v for variants)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's table of 3 more steps")
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = resolve("demo", None, [f"method={a.method}", *DEMO_SIZE, *a.set])
    V, B, L = cfg.data.bpe_vocab_size, cfg.train.batch_size, cfg.data.seq_len
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(V)
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    split = m.split if hasattr(m, "split") else None  # the code before issue 23 had no declared contract

    def step(k: int) -> None:
        kw: dict = {}
        n_recon = split.recon_rows(B) if split is not None else 0
        if split is not None or getattr(m, "global_times", False):
            kw["t_diff"] = low_discrepancy(B - n_recon, u=0.37)
            if split is not None:
                kw["n_recon"] = n_recon
        loss, _ = m.train_loss(model, x, torch.Generator().manual_seed(k), **kw)
        loss.backward()
        model.zero_grad(set_to_none=True)

    for k in range(2):
        step(k)
    t0 = time.process_time()
    for k in range(a.steps):
        step(k)
    print(f"{a.method} loss+backward CPU s/step {(time.process_time() - t0) / a.steps:.4f}")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for k in range(3):
                step(k)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
