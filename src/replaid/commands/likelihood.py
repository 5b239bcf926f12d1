"""``replaid likelihood``: ODE-based K-IWAE likelihood of a run next to its VDM NELBO."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from replaid.commands import POSITIVE, SEED, STEPS, add_command, check_out, emit, float_in, int_in, run_title
from replaid.config import MAX_SOLVER_STEPS, ODE_TOL_MIN
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    import torch

    from replaid.methods.replaid import ContinuousNet
    from replaid.store.loading import Run

TOLERANCE = float_in(ODE_TOL_MIN, 1)  # dopri5 --rtol/--atol: what its float64 solve resolves

EXAMPLE = (
    "example: replaid likelihood runs/demo --split valid --num-seqs 64 --K 8 --steps 128 "
    "--out runs/demo/likelihood --json"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "likelihood",
        "ODE (PFODE) K-IWAE likelihood bound with the VDM NELBO beside it.",
        EXAMPLE,
        description="ODE (PFODE) K-IWAE likelihood bound with the VDM NELBO beside it.",
    )
    p.add_argument("run", help="run directory or checkpoint directory")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="split scored")
    p.add_argument("--num-seqs", type=POSITIVE, default=64, help="number of sequences scored")
    p.add_argument("--K", type=POSITIVE, default=8, help="importance samples per sequence (K_max of the K-curve)")
    p.add_argument("--steps", type=STEPS, default=128, help="Heun steps on the uniform gamma grid")
    p.add_argument(
        "--solver",
        default="heun",
        choices=["heun", "dopri5"],
        help="fixed-step Heun, or torchdiffeq's adaptive dopri5 (fixed probes per row)",
    )
    p.add_argument("--rtol", type=TOLERANCE, default=1e-5, help=f"dopri5 relative tolerance, in [{ODE_TOL_MIN:g}, 1]")
    p.add_argument("--atol", type=TOLERANCE, default=1e-5, help=f"dopri5 absolute tolerance, in [{ODE_TOL_MIN:g}, 1]")
    p.add_argument(
        "--max-solver-steps",
        type=int_in(1, 10**7),
        default=MAX_SOLVER_STEPS,
        help="dopri5: steps (accepted or rejected) a solve may take before the command stops with an error",
    )
    p.add_argument(
        "--n-hutch",
        type=POSITIVE,
        default=1,
        help="Hutchinson probes per drift evaluation; 2 or more also estimate the upward IWAE bias "
        "their noise causes (hutchinson_bias_nats in the output)",
    )
    p.add_argument("--probe", default="rademacher", choices=["rademacher", "gaussian"], help="Hutchinson probe law")
    p.add_argument("--jvp", default="fd", choices=["fd", "autograd"], help="finite differences or torch.func.jvp")
    p.add_argument(
        "--fd-step",
        dest="h",
        type=float_in(1e-6, 1),
        default=1e-3,
        help="finite-difference step of --jvp fd, in [1e-6, 1] (a smaller step is float32 rounding noise)",
    )
    p.add_argument(
        "--h", dest="h", type=float_in(1e-6, 1), default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )  # old spelling
    p.add_argument(
        "--selfcond-correction",
        default="on",
        choices=["on", "off"],
        help="recompute the self-conditioning input at perturbed states (chain-rule-correct)",
    )
    p.add_argument("--no-self-cond", action="store_true", help="evaluate with self-conditioning off")
    p.add_argument("--subsample", default="groups", choices=["groups", "random"], help="K-curve subsampling")
    p.add_argument("--batch-size", type=POSITIVE, default=16, help="rows (sequence x sample) per ODE batch")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the noise, probes and K-curve subsets")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights, not the EMA")
    p.add_argument("--out", required=True, help="folder for log_weights.npy, likelihood.json, kcurve.png")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def _tokens(run: Run, split: str, n: int) -> torch.Tensor:
    import torch

    bs = max(1, min(n, run.cfg.eval.batch_size))
    rows, got = [], 0
    for batch in run.data.eval_batches(split, bs, -(-n // bs)):
        if batch.get("mask") is not None and not bool(batch["mask"].all()):
            raise ValueError(
                "the ODE likelihood scores every position but this run pads documents "
                "(data.packing=false); evaluate a packed run or use 'replaid eval' (masked NELBO)"
            )
        rows.append(batch["tokens"])
        got += batch["tokens"].shape[0]
        if got >= n:
            break
    if not rows:
        raise ValueError(f"the {split} split produced no sequences")
    return torch.cat(rows)[:n]


def check_memory(run_: Run, args: argparse.Namespace, shape: tuple[int, ...]) -> None:
    """Refuse an ODE solve whose estimated peak cannot fit, before it allocates anything (one line)."""
    from replaid.training.memory import check_fits, likelihood_estimate

    V = int(run_.method.embedding_rows(run_.model).shape[0])
    n_params = sum(p.numel() for p in run_.model.parameters())
    (N, L), cfg = shape, run_.cfg
    total = N * args.K
    check_fits(
        f"the ODE likelihood of {N} x {args.K} rows of {L} tokens",
        lambda rows: likelihood_estimate(cfg, V, n_params, rows, L, total, args.n_hutch, args.jvp),
        min(args.batch_size, total),
        "--batch-size",
        next(run_.model.parameters()).device,
        too_big="not even one row fits: use a smaller --K or --num-seqs, or a larger device",
    )


def _matched_nelbo(run_: Run, model: ContinuousNet, tokens: torch.Tensor, seed: int) -> dict[str, float]:
    """The run's own bound (the VDM NELBO) on the same sequences, beside the ODE likelihood."""
    import torch

    t0 = time.time()
    gen = torch.Generator().manual_seed(seed + 1)
    dev = next(model.parameters()).device
    nels: list[torch.Tensor] = []
    with torch.no_grad():
        for i in range(0, tokens.shape[0], run_.cfg.eval.batch_size):
            r = run_.method.eval_bound(model, tokens[i : i + run_.cfg.eval.batch_size].to(dev), gen)
            nels.append((r["nelbo"] if "nelbo" in r else r["nll"]).double().cpu())
    nel = torch.cat(nels)
    nelbo_nats = float(nel.mean())
    return {
        "nelbo_nats_per_token": nelbo_nats,
        "nelbo_ppl": math.exp(nelbo_nats),
        "nelbo_stderr": float(nel.std() / math.sqrt(len(nel))) if len(nel) > 1 else float("nan"),
        "nelbo_seconds": time.time() - t0,
    }


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from replaid.eval.likelihood import estimate_likelihood, plot_k_curve, schedule_endpoints
    from replaid.store.loading import load_run

    check_out(args.out, protected=(args.run,), names=("likelihood.json",))
    run_ = load_run(args.run, use_ema=not args.no_ema)
    if not run_.method.kind.continuous:
        raise ValueError(
            f"{args.run}: ODE likelihood needs a continuous-diffusion run with a noise schedule "
            f"(RePlaid/Plaid/LangFlow); this is a {run_.cfg.method} run"
        )
    model = cast("ContinuousNet", run_.model)  # checked above: a continuous run's denoiser
    g0, g1 = schedule_endpoints(model)
    tokens = _tokens(run_, args.split, args.num_seqs)
    check_memory(run_, args, tokens.shape)
    sc = model.self_conditioning and not args.no_self_cond and run_.cfg.eval.self_conditioning
    from tqdm.auto import tqdm

    # stderr (JSON goes to stdout); advances at every solver step, in rows (sequence x sample) solved
    bar = tqdm(
        total=tokens.shape[0] * args.K,
        desc="ODE log-weights",
        unit="row",
        bar_format="{l_bar}{bar}| {n:.1f}/{total} rows [{elapsed}<{remaining}]",
    )

    def progress(done: float, n: int) -> None:
        bar.update(done - bar.n)

    res = estimate_likelihood(
        model,
        tokens,
        g0,
        g1,
        K=args.K,
        batch_size=args.batch_size,
        seed=args.seed,
        subsample=args.subsample,
        steps=args.steps,
        n_hutch=args.n_hutch,
        probe=args.probe,
        jvp=args.jvp,
        h=args.h,
        self_cond=sc,
        solver=args.solver,
        rtol=args.rtol,
        atol=args.atol,
        max_steps=args.max_solver_steps,
        selfcond_correction=args.selfcond_correction == "on",
        progress=progress,
    )
    bar.close()
    summary = res.summary()
    summary.update(_matched_nelbo(run_, model, tokens, args.seed))
    nelbo_nats = summary["nelbo_nats_per_token"]
    summary.update(
        gamma_0=g0,
        gamma_1=g1,
        self_conditioning=sc,
        selfcond_correction=args.selfcond_correction == "on",
        solver=args.solver,
        steps=args.steps if args.solver == "heun" else None,
        tolerances=None if args.solver == "heun" else [args.rtol, args.atol],
        n_hutch=args.n_hutch,
        probe=args.probe,
        jvp=args.jvp,
        h=args.h,
        split=args.split,
        checkpoint=str(run_.ckpt),
        step=run_.step,
        weights="ema" if run_.ema_loaded else "raw",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "log_weights.npy", res.log_w.numpy())
    (out / "likelihood.json").write_text(strict_dumps(summary, indent=2))
    title = f"ODE K-IWAE of {run_title(run_)}: {args.split}, {tokens.shape[0]} sequences, {args.solver}" + (
        f" {args.steps} steps" if args.solver == "heun" else ""
    )
    plot_k_curve(
        res.curve, res.fit, str(out / "kcurve.png"), nelbo_nats=nelbo_nats, title=title, sequences=tokens.shape[0]
    )
    emit(summary, args.json)
    if summary["hutchinson_bias_nats"] is None:
        import sys

        print(
            "replaid: note: the Hutchinson IWAE bias is not estimated (needs --n-hutch >= 2 and --solver heun)",
            file=sys.stderr,
        )
    return 0
