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

The answer is :class:`Samples`: the list of rows, with what every caller would otherwise work out again
(``steps``, ``nfe``, and the :class:`Plan`: the sampler, the length, the given tokens and which positions
are kept). ``on_plan`` receives the plan once the request is checked and set up, before the first step
(the playground draws its first frame from it).

A completion (``max_tokens``, ``stop``; every request on a block-diffusion run) goes through
:class:`~replaid.sampling.stream.Completion`: its rows add ``completion`` and ``finish_reason``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from replaid.sampling.contract import Callback
from replaid.sampling.errors import RequestError, ref
from replaid.sampling.infill import EditPlan, InfillPlan
from replaid.sampling.registry import Sampler, get_sampler
from replaid.sampling.request import SampleRequest, prompt_ids
from replaid.sampling.starts import Start, denoiser_for, guidance_objective, mark_filled, required_words
from replaid.sampling.stream import Completion

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = [
    "Plan",
    "Samples",
    "generate",
    "check_memory",
    "denoiser_for",
    "guidance_objective",
    "mark_filled",
    "required_words",
]


@dataclass
class Plan:
    """A checked request as it is sampled: the sampler, the length ``L``, the steps each sample takes (an
    edit: ceil(strength x steps); AR: one per generated token), the network calls a batch is expected to
    make (``nfe``; ``nfe_exact`` False: at most that many), and per position the
    given token ids (0 where generated; an edit: the source text) and whether it is kept as given."""

    sampler: str
    length: int
    steps: int
    nfe: int
    nfe_exact: bool
    mode: str  # unconditional | prompt | infill | edit
    ids: Tensor  # (L,) long
    known: Tensor  # (L,) bool
    infill: InfillPlan | None = None
    edit: EditPlan | None = None


class Samples(list[dict[str, Any]]):
    """:func:`generate`'s answer: one row per sample (module docstring), and ``steps`` (the sampler's, as
    :attr:`Plan.steps`),
    ``nfe`` (the network calls of all batches together) and ``plan`` (:class:`Plan`; None for a
    completion)."""

    def __init__(self, rows: list[dict[str, Any]], steps: int, nfe: int, plan: Plan | None = None):
        super().__init__(rows)
        self.steps, self.nfe, self.plan = steps, nfe, plan


@torch.no_grad()
def generate(
    run: Run,
    request: SampleRequest,
    callback: Callback | None = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> Samples:
    """Draw ``request.num`` samples from ``run`` (a :class:`replaid.store.loading.Run`); returns one
    row per sample with the steps, NFE and plan (module docstring). A request the run cannot honour
    raises a one-line error first."""
    method = run.method
    if method.block_size() or request.completion:  # text continued block by block, cut at its end
        comp = Completion(run, request, callback)
        rows = comp.rows()
        return Samples(rows, request.steps, sum(nfe for _, _, nfe in comp.batches))
    infill = request.check(method, run.tokenizer, run.cfg.data.seq_len)
    L = request.length_for(run.cfg.data.seq_len, infill)
    sampler = get_sampler(method, request.sampler)
    check_memory(run, request, L)
    start = sampler.start(run, request, infill, L, sampler.name, callback)
    plan = _plan(run, request, sampler, start, infill, L)
    if on_plan is not None:
        on_plan(plan)
    if start.rows is not None:  # answered without sampling (an edit at strength 0)
        return Samples(start.rows, 0, 0, plan)
    rows, nfe = _sample(request, sampler, start)
    return Samples(rows, plan.steps, nfe, plan)


def _plan(run: Run, req: SampleRequest, sampler: Sampler, start: Start, infill: InfillPlan | None, L: int) -> Plan:
    """The :class:`Plan` of a checked, started request."""
    edit = req.edit_plan(run.tokenizer)
    if edit is not None:
        mode, ids, known = "edit", edit.ids, edit.known
    elif infill is not None:
        mode, ids, known = "infill", infill.ids, infill.known
    else:
        given = prompt_ids(run.tokenizer, req.prompt, L) if req.prompt else torch.zeros(0, dtype=torch.long)
        mode = "prompt" if req.prompt else "unconditional"
        ids = torch.cat([given, given.new_zeros(L - len(given))])
        known = torch.arange(L) < len(given)
    steps = max(0, len(start.grid) - 1)  # the steps the sampler walks (AR: the prompt's tokens not counted)
    nfe = sampler.nfe(steps) if steps else 0
    return Plan(sampler.name, len(ids), steps, nfe, sampler.nfe_exact, mode, ids, known, infill, edit)


def check_memory(run: Run, req: SampleRequest, L: int, free: float | None = None) -> None:
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
        hints = ([f"{ref('num')} {n} or less"] if n >= 1 else []) + (
            [f"{ref('length')} {k} or less with {ref('batch_size')} 1"] if k >= 2 else []
        )
        hint = "use " + " or ".join(hints) if hints else "the run's weights alone do not fit: use a larger device"
    else:
        hint = f"use {ref('batch_size')} {largest(lambda k: peak(k, L, req.num) <= budget, rows)} or less"
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in est.parts.items() if v >= 0.01 * est.peak)
    raise RequestError(
        f"sampling {req.num} x {L} tokens, {rows} at a time, needs about {human_bytes(est.peak)} ({parts}) "
        f"but {dev.type} has {human_bytes(free)} free; {hint}"
    )


def _sample(req: SampleRequest, sampler: Sampler, start: Start) -> tuple[list[dict[str, Any]], int]:
    """The request's batches, each one call of the sampler with the one contract; the rows and the
    network calls of all batches."""
    rows: list[dict[str, Any]] = []
    done = nfe = 0
    while done < req.num:
        B = min(req.batch_size, req.num - done)
        batch = start.batch(B)
        t0 = time.time()
        res = sampler.fn(
            start.net, batch.state, start.grid, generator=start.generator, callback=batch.callback, **batch.options
        )
        secs = time.time() - t0
        batch.after(res)
        nfe += res.nfe
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
    return rows, nfe
