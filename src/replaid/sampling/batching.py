"""Continuous batching at block boundaries: independent requests share one running batch.

A block-diffusion run writes a request block by block. :class:`BlockBatch` is the one block loop: it
writes one request's rows (:mod:`replaid.sampling.loop`: the CLI, ``generate``, the benchmarks) or many
requests' rows as one batch (``replaid serve``'s scheduler): each request is a :class:`Lane` (its n samples), every block is one
batched pass of the method's :class:`Kernel` (the block's denoising steps, then one clean commit pass), and
between two blocks lanes may leave (finished, or their client gone: ``index_select`` along the batch) and
new ones join (their prompt prefilled as it would be alone, then appended to the batch).

Rows of different lengths share one :class:`~replaid.model.dit.KVCache` made ragged
(:meth:`~replaid.model.dit.KVCache.ragged`): every row's keys are right-aligned in the cache's slots, the
slots before a row's first key are masked out per row, and each row keeps its own rotary positions (the
positions it has alone; keys are cached already rotated, so sharing slots changes no score). The sliding
window trims all rows alike, which keeps each row's last ``window`` keys, as alone.

Exactness: a lane draws its noise from its own generator (seeded with the request's seed, moved to the
model's device as the request's own sampler does), per row through
:class:`~replaid.diffusion.rng.RowGenerators`, so co-batched requests never change each other's draws; a
request written in a batch, joined at any block, writes the tokens it writes alone (a batch of its lane
only: :func:`~replaid.sampling.loop.iter_lane`).
The network values agree to rounding only (a batch's matrix products and masked attention may round
otherwise than one request's), so the test is token equality in float64, where that rounding is ~1e-15.

AR is a block run of one token (:class:`ARKernel`): a block is one draw from the logits its last commit left in
the cache (``KVCache.head``), its commit one causal pass of the drawn token.

Requests share a batch when they agree on what the kernel does (:data:`KERNEL_FIELDS`: sampler, steps,
temperatures, self-conditioning; AR's: :data:`AR_KERNEL_FIELDS`); the caller (``replaid serve``'s scheduler) starts a new batch otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from replaid.diffusion.denoiser import Denoiser
from replaid.diffusion.rng import RowGenerators, device_generator, randn
from replaid.methods.base import Kind, Method
from replaid.model.dit import KVCache
from replaid.model.tokens import TokenDiT
from replaid.sampling.blocks import (
    BlockDenoiser,
    BlockRows,
    cached_logits,
    commit_ar,
    commit_continuous,
    commit_masked,
    draw_ar,
    prefill_ar,
)
from replaid.sampling.continuous import Inpaint, gamma_grid, time_grid
from replaid.sampling.contract import Callback, Committed, SamplerFn
from replaid.sampling.discrete import tempered_probs, unmask_step
from replaid.sampling.registry import get_sampler
from replaid.sampling.request import SampleRequest
from replaid.sampling.strategy import Kernel, strategy_of

if TYPE_CHECKING:
    from replaid.store.loading import Run

KERNEL_FIELDS = ("sampler", "steps", "temperature", "score_temperature", "self_cond")
AR_KERNEL_FIELDS = ("temperature", "top_p")  # AR's kernel reads no steps: any of them share a batch


def kernel_key(req: SampleRequest, kind: Kind | None = None) -> tuple[Any, ...]:
    """What two requests must agree on to share a batch of a ``kind``'s run (the fields its kernel reads)."""
    return tuple(
        getattr(req, f) for f in (AR_KERNEL_FIELDS if kind is not None and kind.left_to_right else KERNEL_FIELDS)
    )


def commit_each(kernel: Kernel, ids: Tensor, block: int, cache: KVCache) -> int:
    """A diffusion kernel's prefill: one commit per whole block of the prompt."""
    for s0 in range(0, ids.shape[1], block):
        kernel.commit(ids[:, s0 : s0 + block], cache)
    return ids.shape[1] // block


@dataclass
class MaskedKernel:
    """MDLM (BD3-LM): ancestral unmasking of a block from [MASK] on ``ts`` at ``temperature``. Without time
    conditioning a row whose
    block did not change at a step keeps its output, as it does alone; only the rows that changed are
    passed through the network (a view of their cache rows), so a row takes part in the calls it makes
    alone and a batch costs no more network rows than its requests one at a time."""

    model: TokenDiT
    ts: Tensor
    temperature: float

    def fill(
        self, ids: Tensor, known: Tensor, cache: KVCache, gen: RowGenerators, callback: Callback | None = None
    ) -> tuple[Tensor, Tensor]:
        z, probs = ids, ids.new_empty(0)  # probs (B, b, V) once the first step computed it
        stale = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)  # (B,) input changed
        calls: list[Tensor] = []  # per network call: its rows (B,) bool
        for i in range(len(self.ts) - 1):
            t, s = float(self.ts[i]), float(self.ts[i + 1])
            if bool(stale.all()):
                probs = tempered_probs(cached_logits(self.model, z, cache), self.temperature)  # (B, b, V)
                calls.append(stale)
            elif bool(stale.any()):
                rows = stale.nonzero().squeeze(1)  # (K,)
                fresh = tempered_probs(cached_logits(self.model, z[rows], cache.view(rows)), self.temperature)
                probs = probs.index_copy(0, rows, fresh)
                calls.append(stale)
            z_new = unmask_step(z, probs, t, s, gen)
            stale = self.changed(z_new, z)
            z = z_new
            if callback is not None:
                callback({"i": i, "T": len(self.ts) - 1, "t": t, "s": s, "z": z, "probs": probs})
        return z, torch.stack(calls, 1)  # (B, calls)

    @staticmethod
    def changed(new: Tensor, old: Tensor) -> Tensor:
        """The rows (B,) whose block ``new`` differs from ``old`` (B, b): only they need the network again."""
        return (new != old).any(1)

    def commit(self, ids: Tensor, cache: KVCache) -> None:
        commit_masked(self.model, ids, cache.next_pos, cache)

    def prefill(self, ids: Tensor, block: int, cache: KVCache) -> int:
        return commit_each(self, ids, block, cache)


@dataclass
class ContinuousKernel:
    """RePlaid or Plaid: ``sampler`` from ``z ~ N(0, I)`` on ``gammas`` with a block denoiser over the cache
    (``wrap``: the request's temperatures), the prompt's positions by replacement."""

    model: Any  # RePlaid
    sampler: SamplerFn
    gammas: Tensor
    options: dict[str, Any]
    wrap: Callable[[Denoiser], Denoiser]

    def fill(
        self, ids: Tensor, known: Tensor, cache: KVCache, gen: RowGenerators, callback: Callback | None = None
    ) -> tuple[Tensor, Tensor]:
        E = self.model.embedding_matrix().detach()  # (V, d_e)
        den = self.wrap(BlockDenoiser(self.model, cache.next_pos, cache))
        z = randn((*ids.shape, E.shape[1]), gen, ids.device, torch.get_default_dtype())  # (B, b, d_e)
        inpaint = Inpaint(ids, known, E) if bool(known.any()) else None
        # every continuous sampler draws through _Run, which takes per-row streams (SamplerFn names a Generator)
        opts = {**self.options, "inpaint": inpaint}
        res = self.sampler(den, z, self.gammas, generator=cast(Any, gen), callback=callback, **opts)
        return res.tokens, torch.ones(ids.shape[0], res.nfe, dtype=torch.bool, device=ids.device)

    def commit(self, ids: Tensor, cache: KVCache) -> None:
        commit_continuous(self.model, ids, cache.next_pos, cache)

    def prefill(self, ids: Tensor, block: int, cache: KVCache) -> int:
        return commit_each(self, ids, block, cache)


@dataclass
class ARKernel:
    """AR with blocks of one token: a block is one draw
    from the logits the last commit left in ``cache.head`` (no network call); its commit is one causal pass
    of the drawn token, whose logits are the next draw's; a lane's prompt (BOS first) is prefilled in one
    pass where the window allows (:func:`~replaid.sampling.blocks.prefill_ar`)."""

    model: TokenDiT
    temperature: float
    top_p: float

    def fill(
        self, ids: Tensor, known: Tensor, cache: KVCache, gen: RowGenerators, callback: Callback | None = None
    ) -> tuple[Tensor, Tensor]:
        drawn, probs = draw_ar(cache, self.temperature, self.top_p, gen)  # (B,), (B, V)
        z = torch.where(known[:, 0], ids[:, 0], drawn)[:, None]  # (B, 1)
        if callback is not None:
            callback({"i": 0, "T": 1, "z": z, "probs": probs, "nfe": 0})
        return z, known.new_zeros(ids.shape[0], 0)

    def commit(self, ids: Tensor, cache: KVCache) -> None:
        commit_ar(self.model, ids, cache)

    def prefill(self, ids: Tensor, block: int, cache: KVCache) -> int:
        return prefill_ar(self.model, ids, cache)


def kernel_of(run: Run, req: SampleRequest) -> Kernel:
    """The kernel of a block run's method for ``req``'s :data:`KERNEL_FIELDS` (its kind's ``kernel``)."""
    return kernel_for(run.method, run.model, req)


def kernel_for(method: Method[Any], model: Any, req: SampleRequest) -> Kernel:
    """The kernel of ``method``'s kind for its network ``model`` and ``req`` (one line if it has none)."""
    make = strategy_of(method.kind).kernel
    if make is None:
        raise ValueError(f"a {method.name} run has no block-by-block generator: sample it with 'replaid sample'")
    return make(method, model, req)


def masked_kernel(method: Method[Any], model: TokenDiT, req: SampleRequest) -> MaskedKernel:
    """MDLM's kernel for ``req``: its steps per block at its temperature."""
    return MaskedKernel(model, time_grid(req.steps), req.temperature)


def continuous_kernel(method: Method[Any], model: Any, req: SampleRequest) -> ContinuousKernel:
    """A continuous method's kernel for ``req``: its sampler and steps per block, its self-conditioning and
    temperatures (as the full-sequence samplers apply them)."""
    from replaid.sampling.starts import denoiser_for

    fn = get_sampler(method, req.sampler).fn
    options = {"self_cond": None if req.self_cond else False, "disable_progress": True}
    return ContinuousKernel(model, fn, gamma_grid(model.schedule, req.steps), options, lambda d: denoiser_for(d, req))


def ar_kernel(method: Method[Any], model: TokenDiT, req: SampleRequest) -> ARKernel:
    """AR's kernel for ``req``: its temperature within its ``top_p`` (else the run's ``ar.top_p``)."""
    top_p = req.top_p if req.top_p is not None else method.cfg.ar.top_p
    return ARKernel(model, req.temperature, top_p)


@dataclass
class Lane:
    """One request's rows in a batch: ``ids`` (n, N) (the prompt in place, [MASK] or 0 elsewhere), the
    prompt's positions ``known`` (n, N), its own stream ``gen``, the next block ``k``, the network calls it
    took part in, and the caller's ``tag``."""

    ids: Tensor
    known: Tensor
    gen: torch.Generator | None
    block: int
    k: int = 0
    nfe: int = 0
    tag: Any = None

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @property
    def start(self) -> int:
        """The first position of block k."""
        return self.k * self.block

    @property
    def last(self) -> bool:
        """Block k is the lane's last."""
        return self.start + self.block >= self.ids.shape[1]

    def span(self, t: Tensor) -> Tensor:
        """Block k of ``t`` (n, N): (n, b)."""
        return t[:, self.start : self.start + self.block]


def lane_of(run: Run, req: SampleRequest, prompt: Tensor, length: int, tag: Any = None) -> Lane:
    """``req.num`` rows of ``length`` tokens (whole blocks), ``prompt`` (P,) first, drawing from a generator
    seeded with ``req.seed`` on the model's device (as the request draws alone)."""
    r = BlockRows.of(run, prompt, length)
    fill = int(r.model.n_out) if run.method.kind.mask_token else 0  # [MASK], or any id (replaced)
    gen = device_generator(torch.Generator().manual_seed(req.seed), r.device)
    return Lane(r.ids(req.num, fill), r.known(req.num).clone(), gen, r.block, tag=tag)


class BlockBatch:
    """A running batch of lanes (module docstring) over one ragged cache with the run's ``window``."""

    def __init__(self, kernel: Kernel, window: int | None, device: torch.device):
        self.kernel, self.window, self.device = kernel, window, device
        self.lanes: list[Lane] = []
        self.cache = KVCache(window=window).ragged(0, device)

    @property
    def rows(self) -> int:
        return sum(lane.rows for lane in self.lanes)

    @torch.no_grad()
    def join(self, lane: Lane) -> None:
        """Prefill the lane's whole prompt blocks as alone (its own cache, one commit per block), then its
        rows join the batch (their slots right-aligned with the others')."""
        cache = KVCache(window=self.window)
        while not lane.last and bool(lane.span(lane.known).all()):
            lane.k += 1
        lane.nfe += self.kernel.prefill(lane.ids[:, : lane.start], lane.block, cache)
        self.cache.join(cache.ragged(lane.rows, self.device))
        self.lanes.append(lane)

    @torch.no_grad()
    def step(self, callback: Callback | None = None) -> list[Committed]:
        """Write every lane's block k in one batch; returns each lane's block (in ``lanes``' order).
        ``callback``: the kernel's per-step :class:`~replaid.sampling.contract.StepInfo` of the batch."""
        ids = torch.cat([lane.span(lane.ids) for lane in self.lanes])  # (B, b)
        known = torch.cat([lane.span(lane.known) for lane in self.lanes])  # (B, b)
        gen = RowGenerators([(lane.rows, lane.gen) for lane in self.lanes])
        tokens, part = self.kernel.fill(ids, known, self.cache, gen, callback)  # (B, b), (B, calls)
        out, lo = [], 0
        for lane in self.lanes:
            lane.span(lane.ids)[:] = tokens[lo : lo + lane.rows]
            lane.nfe += int(part[lo : lo + lane.rows].any(0).sum())  # the calls its rows took part in: as alone
            out.append(Committed(lane.span(lane.ids), lane.start, lane.nfe))
            lo += lane.rows
        return out

    @torch.no_grad()
    def advance(self, keep: list[Lane]) -> None:
        """The lanes not in ``keep`` (and those whose block was their last) leave; the others' blocks are
        committed in one clean pass and they move to their next block."""
        keep = [lane for lane in keep if not lane.last]
        if [id(x) for x in keep] != [id(x) for x in self.lanes]:
            kept = {id(x) for x in keep}
            idx: list[int] = []
            lo = 0
            for lane in self.lanes:
                if id(lane) in kept:
                    idx += range(lo, lo + lane.rows)
                lo += lane.rows
            self.cache.select(torch.tensor(idx, dtype=torch.long, device=self.device))
            self.lanes = [lane for lane in self.lanes if id(lane) in kept]
        if not self.lanes:
            self.cache = KVCache(window=self.window).ragged(0, self.device)
            return
        self.kernel.commit(torch.cat([lane.span(lane.ids) for lane in self.lanes]), self.cache)
        for lane in self.lanes:
            lane.k, lane.nfe = lane.k + 1, lane.nfe + 1
