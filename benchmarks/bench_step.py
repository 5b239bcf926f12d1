"""CPU time of one training step per method and code version, interleaved; sampler NFE/s.

    python benchmarks/bench_step.py --src before=/tmp/old/src after=src --vocab 2048 50257 --rounds 3

Every (version, method, V) runs in a fresh subprocess at 1 thread: a warm-up step, then ``--steps``
timed steps of the real training step (Algorithm 1, AdamW) on random tokens; the figure is the
process CPU time per step (``time.process_time``), the stable figure on a shared machine. Rounds
interleave all configurations and the median over rounds is reported, next to the FLOP ratio of
``replaid.training.flops``. ``--sample`` also times MDLM's and RePlaid's (DDPM) samplers over 4 NFE (NFE/s).
Model: hidden 256, 4 layers, L = 256, batch 8, fp32 (``--set k=v`` to change).
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
    "train.num_threads=1",
    "optim.ema=0",
]
METHODS = {
    "mdlm": ["method=mdlm"],
    "replaid": ["method=replaid"],
    "replaid-nosc": ["method=replaid", "model.self_conditioning=false"],
}


def one(method: str, V: int, steps: int, overrides: list[str], sample: bool) -> dict:
    import inspect

    import torch

    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.train import Trainer, TrainModule, build_optimizer

    torch.set_num_threads(1)
    cfg = resolve("debug", None, [*BASE, *METHODS[method], *overrides])
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(V)
    tr = Trainer(
        cfg, model, m, build_optimizer(model, cfg.optim), torch.device("cpu"), loss_module=TrainModule(model, m)
    )
    batch = [{"tokens": torch.randint(0, V, (cfg.train.batch_size, cfg.data.seq_len))}]
    kw = {"log": False} if "log" in inspect.signature(tr.train_step).parameters else {}
    tr.train_step(batch)
    t0 = time.process_time()
    for _ in range(steps):
        tr.train_step(batch, **kw)
    out = {"step_cpu_s": (time.process_time() - t0) / steps}
    if sample:
        model.eval()
        g = torch.Generator().manual_seed(0)
        B, L = cfg.train.batch_size, cfg.data.seq_len
        t0 = time.process_time()
        with torch.no_grad():
            if method == "mdlm":
                model.time_conditioning = True  # a network call every step (else skipped when nothing unmasks)
                try:  # the samplers as plain functions (issue 23)
                    from replaid.sampling.continuous import time_grid
                    from replaid.sampling.discrete import sample_mdlm

                    res = sample_mdlm(model, torch.full((B, L), model.n_out), time_grid(4), generator=g)
                    nfe = res[1] if isinstance(res, tuple) else res.nfe  # (ids, nfe) before issue 35
                except ImportError:  # an older src/: the sampler was a method
                    _, nfe = m.sample(model, B, L, 4, g)
            else:
                try:
                    from replaid.sampling.continuous import gamma_grid, sample_ddpm
                except ImportError:  # an older src/
                    from replaid.diffusion.samplers import gamma_grid, get_sampler

                    sample_ddpm = get_sampler("ddpm")
                nfe = sample_ddpm(model, torch.randn(B, L, model.d_e), gamma_grid(model.schedule, 3), generator=g).nfe
        out["nfe_per_s"] = nfe / (time.process_time() - t0)
    return out


def flop_ratio(V: int, overrides: list[str], method: str) -> float:
    from replaid.presets import resolve
    from replaid.training.flops import train_flops_per_token

    f = {
        k: train_flops_per_token(resolve("debug", None, [*BASE, *METHODS[k], *overrides]), V) for k in ("mdlm", method)
    }
    return f[method] / f["mdlm"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--src",
        nargs="+",
        default=[f"after={Path(__file__).resolve().parents[1] / 'src'}"],
        help="NAME=PATH of a src/ directory (code version) to time",
    )
    p.add_argument("--vocab", type=int, nargs="+", default=[2048, 50257])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--sample", action="store_true", help="also time the samplers (mdlm, replaid DDPM)")
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides k=v")
    p.add_argument("--no-record", action="store_true")
    add_one_option(p)
    a = p.parse_args()
    if run_one_if_asked(a, one):
        return
    srcs = dict(s.split("=", 1) for s in a.src)
    res: dict = {}
    for r in range(a.rounds):
        for V in a.vocab:
            for method in a.methods:
                for name, src in srcs.items():
                    spec = dict(method=method, V=V, steps=a.steps, overrides=a.set, sample=a.sample)
                    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_NUM_THREADS": "1"}
                    out, err = run_isolated(__file__, spec, env)
                    if out is None:
                        sys.exit(f"{name} {method} V={V} failed:\n{err[-2000:]}")
                    for k, v in out.items():
                        res.setdefault((name, method, V, k), []).append(v)
                    print(f"round {r} {name:7s} {method:13s} V={V:6d} {out}", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    rows = []
    for V in a.vocab:
        for method in a.methods:
            row = [V, method]
            for name in srcs:
                row.append(med[(name, method, V, "step_cpu_s")])
                if method != "mdlm" and "mdlm" in a.methods:
                    row.append(f"{med[(name, method, V, 'step_cpu_s')] / med[(name, 'mdlm', V, 'step_cpu_s')]:.3f}")
                else:
                    row.append("")
                if a.sample:
                    row.append(med[(name, method, V, "nfe_per_s")])
            row.append(f"{flop_ratio(V, a.set, method):.3f}" if method != "mdlm" else "")
            rows.append(row)
    header = ["V", "method"]
    for name in srcs:
        header += [f"{name} step CPU s", f"{name} / MDLM"] + ([f"{name} NFE/s"] if a.sample else [])
    header.append("FLOP ratio / MDLM")
    for r_ in rows:
        print(" | ".join(str(x) for x in r_))
    if not a.no_record:
        import torch

        append_results(
            f"Training step CPU time by method, {device_name(torch.device('cpu'))} (1 thread)",
            header,
            rows,
            f"`python benchmarks/bench_step.py {' '.join(sys.argv[1:])}`; hidden 256, 4 layers, "
            f"L = 256, batch 8, fp32; process CPU time per step, median of {a.rounds} interleaved "
            f"rounds of {a.steps} steps after a warm-up step, each in a fresh process at 1 thread "
            f"(shared machine). NFE/s: MDLM's sampler with a network call every step, RePlaid's DDPM.",
        )


if __name__ == "__main__":
    main()
