"""NELBO evaluation: per-token bound, its pieces, and the unigram reference on the same tokens."""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from replaid import dist
from replaid.config import RunConfig
from replaid.data.pipeline import DataPipeline
from replaid.methods.base import Method


class Averaged(Protocol):
    """The EMA weights a training run keeps (:class:`replaid.training.train.EMA`): what evaluation reads."""

    shadow: dict[str, torch.Tensor]

    def applied(self, model: torch.nn.Module) -> AbstractContextManager[torch.nn.Module]: ...


class Trained(Protocol):
    """A training run in progress (:class:`replaid.training.train.Trainer`): what :func:`evaluate` reads, so
    that evaluation needs nothing of the training loop."""

    model: torch.nn.Module
    method: Method[Any]
    cfg: RunConfig
    device: torch.device

    @property
    def ema(self) -> Averaged | None: ...


def ppl(nats: float) -> float:
    """exp(nats), ``inf`` where it overflows (a diverged model) rather than an OverflowError."""
    return float("inf") if nats > 709.0 else math.exp(nats)  # NaN stays NaN


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    method: Method[Any],
    data: DataPipeline,
    cfg: RunConfig,
    split: str | None = None,
    ema: Averaged | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Token-weighted mean of the per-token bound over the split (``cfg.eval``; the first ``max_batches``
    batches when set), beside the train-split unigram model's NLL on exactly the tokens evaluated."""
    ecfg = cfg.eval
    split = split or ecfg.split
    max_batches = ecfg.max_batches if max_batches is None else max_batches
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(cfg.train.seed + 12345)
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    per_seq: list[torch.Tensor] = []
    n_tok = 0
    t0 = time.time()
    ctx = ema.applied(model) if (ema is not None and ecfg.use_ema) else nullcontext()
    uni_logp = torch.from_numpy(data.unigram_logp()).to(device)  # (V,) float64
    with ctx:
        batches = data.eval_batches(split, ecfg.batch_size, max_batches)
        for batch in tqdm(batches, desc=f"eval {split}", unit="batch", disable=not progress, leave=False):
            tokens = batch["tokens"].to(device)
            mask = batch.get("mask")
            mask = mask.to(device) if mask is not None else None
            r = method.eval_bound(model, tokens, gen, mask=mask)
            w = (
                mask.double().sum(1)
                if mask is not None
                else torch.full((tokens.shape[0],), float(tokens.shape[1]), dtype=torch.float64, device=device)
            )
            for k, v in r.items():
                sums[k] = sums.get(k, 0.0) + float((v.double() * w).sum())
            uni = -uni_logp[tokens]  # (B, L)
            sums["unigram_nats_per_token"] = sums.get("unigram_nats_per_token", 0.0) + float(
                (uni * mask).sum() if mask is not None else uni.sum()
            )
            per_seq.append(r[method.bound].double().cpu())
            n_tok += int(w.sum())
        extra = method.eval_summary(model)  # of the weights evaluated (EMA when used)
    model.train(was_training)
    if dist.is_dist():  # sums over every rank's share of the split
        keys = sorted(sums)
        tot = dist.all_reduce_sum(torch.tensor([sums[k] for k in keys] + [float(n_tok)], dtype=torch.float64))
        sums, n_tok = dict(zip(keys, tot[:-1].tolist(), strict=True)), int(tot[-1])
        per_seq = [dist.all_gather_cat(torch.cat(per_seq))] if per_seq else per_seq
    if n_tok == 0:
        raise ValueError(
            f"the {split} split produced no evaluation tokens; use a larger split or a smaller data.seq_len"
        )
    key = method.bound
    nats = sums[key] / n_tok
    seq = torch.cat(per_seq)
    out: dict[str, Any] = {
        f"{key}_nats_per_token": nats,
        f"{key}_ppl": ppl(nats),
        **{k: v / n_tok for k, v in sums.items() if k != key},
        "stderr_nats": float(seq.std() / math.sqrt(len(seq))) if len(seq) > 1 else float("nan"),
        "tokens": n_tok,
        "sequences": len(seq),
        "split": split,
        "ema": bool(ema is not None and ecfg.use_ema),
        "seconds": time.time() - t0,
    }
    out.update(extra)
    out.update(
        unigram_ppl=ppl(float(out["unigram_nats_per_token"])),
        batches=len(batches),
        unigram_on="the evaluated tokens (train-split add-one unigram model)",
    )
    return out


def evaluate(trainer: Trained, data: DataPipeline, split: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Evaluate a training run's model (its EMA weights when kept). Sharded (FSDP2) parameters are
    gathered into a plain replica first; each rank then scores its share of the split."""
    if not dist.is_sharded(trainer.model):
        return evaluate_model(trainer.model, trainer.method, data, trainer.cfg, split, trainer.ema, progress=progress)
    full = dist.full_tensors(
        trainer.ema.shadow if trainer.ema and trainer.cfg.eval.use_ema else trainer.model.state_dict()
    )
    replica = trainer.method.build_model(data.vocab_size)
    replica.load_state_dict({k: v.to(dtype=replica.state_dict()[k].dtype) for k, v in full.items()})
    return evaluate_model(replica.to(trainer.device), trainer.method, data, trainer.cfg, split, None, progress=progress)
