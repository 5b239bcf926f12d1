"""``generate(run, request, callback=None)``: the one way a loaded run makes samples.

``replaid sample``, ``replaid sweep`` and the playground (``web/engine.py``) all call it. It checks the
request against the run's method (:meth:`SampleRequest.check`), then draws ``request.num`` samples in
batches of ``request.batch_size`` with the registered sampler (:mod:`replaid.sampling.registry`), every
kind the same way: the sampler's kind builds the initial state, grid, generator and options
(:mod:`replaid.sampling.starts`), and the sampler is called with the one contract
(:mod:`replaid.sampling.contract`).

``callback`` receives every step's :class:`~replaid.sampling.contract.StepInfo` from the sampler
(documented on each sampler), and for continuous methods one more ``{"final": True, "i": T, "T": T,
"tokens", "logits"}`` per batch with the readout. Rows hold ids, text, sampler, steps, nfe, seconds,
batch_seconds, seed, temperature (and, when infilling, ``filled`` / ``marked``; with ``trajectory``, the
recorded texts).

A completion (``max_tokens``, ``stop``; every request on a block-diffusion run) goes through
:class:`~replaid.sampling.stream.Completion`: its rows add ``completion`` and ``finish_reason``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from replaid.sampling.contract import Callback
from replaid.sampling.registry import Sampler, get_sampler
from replaid.sampling.request import SampleRequest
from replaid.sampling.starts import Start, denoiser_for, guidance_objective, mark_filled, required_words
from replaid.sampling.stream import Completion

__all__ = ["generate", "check_memory", "denoiser_for", "guidance_objective", "mark_filled", "required_words"]


@torch.no_grad()
def generate(run, request: SampleRequest, callback: Optional[Callback] = None) -> list[dict]:
    """Draw ``request.num`` samples from ``run`` (a :class:`replaid.training.loading.Run`); returns one
    row per sample (module docstring). A request the run cannot honour raises a one-line error first."""
    method = run.method
    if method.block_size() or request.completion:  # text continued block by block, cut at its end
        return Completion(run, request, callback).rows()
    plan = request.check(method, run.tokenizer, run.cfg.data.seq_len)
    L = request.length_for(run.cfg.data.seq_len, plan)
    sampler = get_sampler(method, request.sampler)
    check_memory(run, request, L)
    start = sampler.start(run, request, plan, L, sampler.name, callback)
    if start.rows is not None:  # answered without sampling (an edit at strength 0)
        return start.rows
    return _sample(request, sampler, start)


def check_memory(run, req: SampleRequest, L: int, free: Optional[float] = None) -> None:
    """Refuse a request whose estimated peak (:func:`replaid.training.memory.sampling_estimate`) exceeds
    90% of the memory free on the model's device, before anything is allocated, saying what fits."""
    from replaid.training.memory import free_bytes, human_bytes, sampling_estimate

    dev = next(run.model.parameters()).device
    free = free_bytes(dev) if free is None else free
    if free is None:
        return
    budget = 0.9 * free
    n_params = sum(p.numel() for p in run.model.parameters())
    V = int(run.method.embedding_rows(run.model).shape[0])  # the run's token rows (MDLM: + its mask row)

    def peak(rows: int, length: int, num: int) -> float:
        return sampling_estimate(run.cfg, V, n_params, rows, length, num).peak

    rows = min(req.batch_size, req.num)
    est = sampling_estimate(run.cfg, V, n_params, rows, L, req.num)
    if est.peak <= budget:
        return

    def largest(fits: Callable[[int], bool], hi: int) -> int:
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    if peak(1, L, req.num) > budget:
        n = largest(lambda k: peak(min(rows, k), L, k) <= budget, req.num)
        k = largest(lambda k: peak(1, k, req.num) <= budget, L)
        hints = ([f"--num {n} or less"] if n >= 1 else []) + (
            [f"--length {k} or less with --batch-size 1"] if k >= 2 else []
        )
        hint = "use " + " or ".join(hints) if hints else "the run's weights alone do not fit: use a larger device"
    else:
        hint = f"use --batch-size {largest(lambda k: peak(k, L, req.num) <= budget, rows)} or less"
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in est.parts.items() if v >= 0.01 * est.peak)
    raise ValueError(
        f"sampling {req.num} x {L} tokens, {rows} at a time, needs about {human_bytes(est.peak)} ({parts}) "
        f"but {dev.type} has {human_bytes(free)} free; {hint}"
    )


def _sample(req: SampleRequest, sampler: Sampler, start: Start) -> list[dict[str, Any]]:
    """The request's batches, each one call of the sampler with the one contract."""
    rows: list[dict[str, Any]] = []
    done = 0
    while done < req.num:
        B = min(req.batch_size, req.num - done)
        batch = start.batch(B)
        t0 = time.time()
        res = sampler.fn(
            start.net, batch.state, start.grid, generator=start.generator, callback=batch.callback, **batch.options
        )
        secs = time.time() - t0
        batch.after(res)
        for b in range(B):
            ids_b = res.tokens[b].tolist()
            row = {
                "ids": ids_b,
                "text": start.text(ids_b),
                "sampler": sampler.name,
                "steps": start.steps,
                "nfe": res.nfe,
                "seconds": secs / B,
                "batch_seconds": secs,
                "seed": req.seed,
                "temperature": req.temperature,
            }
            row.update(batch.extras(b, res))
            rows.append(row)
        done += B
    return rows
