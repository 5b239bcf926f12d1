"""The one block loop: every block-by-block generation is a :class:`~replaid.sampling.batching.BlockBatch`.

A run with blocks (BD3-LM's MDLM, RePlaid and Plaid with ``diffusion.block_size``, AR as blocks of one
token) writes a request block by block: its prompt's whole blocks are prefilled into a KV cache, then each
block is written by the kind's :class:`~replaid.sampling.strategy.Kernel` (its denoising steps, or AR's draw)
and committed by one clean pass. ``replaid serve`` runs many requests through one ``BlockBatch``, joining
and leaving at block boundaries (:mod:`replaid.web.batcher`); everything else runs one request as a batch
of its own lane, here:

* :func:`iter_lane`: the loop itself, a generator of each block once written (closing it stops the
  generation; a block is committed only when the next is asked for);
* :func:`start_blocks`: a run's request as a :class:`~replaid.sampling.strategy.BlockStarter`, which
  :class:`~replaid.sampling.stream.Completion` (``replaid sample``, ``generate``, the playground, a run
  served one request at a time) drives;
* :func:`sample_any_length`: the loop on a method, its network and a prompt tensor (the benchmarks'
  entry), run to ``max_tokens`` or to ``stop``.

So the speed pages, the CLI and the server time and run the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from replaid.diffusion.rng import device_generator
from replaid.methods.base import Method
from replaid.sampling.batching import BlockBatch, Lane, kernel_for, kernel_of
from replaid.sampling.blocks import BlockRows, Stop
from replaid.sampling.contract import Callback, Committed, StepInfo
from replaid.sampling.request import SampleRequest
from replaid.sampling.strategy import Kernel

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = ["AnyLength", "iter_lane", "sample_any_length", "start_blocks"]


def _tagged(callback: Callback | None, lane: Lane) -> Callback | None:
    """The kernel's step callback with the lane's block ``k`` and its first position ``start`` added."""
    if callback is None:
        return None
    k, start = lane.k, lane.start

    def call(info: StepInfo) -> None:
        callback(StepInfo(**info, block=k, start=start))

    return call


@torch.no_grad()  # torch enters it around each step of a generator function
def iter_lane(
    kernel: Kernel,
    lane: Lane,
    window: int | None,
    device: torch.device,
    callback: Callback | None = None,
    progress: bool = False,
) -> Generator[Committed, None, None]:
    """One request's ``lane`` written alone: a :class:`BlockBatch` of this lane, its prompt's whole blocks
    prefilled (and yielded, ``prompt`` True), then each block written (``kernel``), yielded, and committed
    once the next is asked for (never after the last, nor after the consumer closes the generator). ``callback`` gets each step's
    :class:`StepInfo` with ``block`` and ``start``; ``Committed.nfe`` counts the lane's network calls."""
    batch = BlockBatch(kernel, window, device)
    batch.join(lane)
    for k in range(lane.k):  # the prompt's whole blocks, prefilled: final as they are
        yield Committed(lane.ids[:, k * lane.block : (k + 1) * lane.block], k * lane.block, lane.nfe, prompt=True)
    n = lane.ids.shape[1] // lane.block
    with tqdm(total=n - lane.k, disable=not progress, desc="blocks", leave=False) as bar:
        while batch.lanes:
            (c,) = batch.step(_tagged(callback, lane))
            yield c
            bar.update(1)
            batch.advance(batch.lanes)


def start_blocks(
    run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
) -> Callable[[int], Iterator[Committed]]:
    """A block run's request as a :class:`~replaid.sampling.strategy.BlockStarter`: ``batch(B)`` writes B
    rows of ``length`` tokens (rounded up to whole blocks), ``prompt`` (P,) first, with the kernel of the
    request (:func:`~replaid.sampling.batching.kernel_of`: steps, sampler, temperatures) and the cache's
    window of :class:`~replaid.sampling.blocks.BlockRows`. The batches of one request draw in order from
    one generator seeded with ``req.seed`` on the model's device (as the request draws in a shared batch)."""
    kernel = kernel_of(run, req)
    r = BlockRows.of(run, prompt, length)
    fill = int(r.model.n_out) if run.method.kind.mask_token else 0  # [MASK], or any id (replaced)
    gen = device_generator(torch.Generator().manual_seed(req.seed), r.device)

    def batch(B: int) -> Iterator[Committed]:
        lane = Lane(r.ids(B, fill), r.known(B).clone(), gen, r.block)
        return iter_lane(kernel, lane, r.window, r.device, callback, req.progress)

    return batch


@dataclass
class AnyLength:
    """What :func:`sample_any_length` wrote: ``tokens`` (B, n) the prompt then the generated ids, up to
    the last block written (whole blocks: the caller trims to ``prompt_len + max_tokens`` and at its
    stop); ``blocks`` (start position, ids (B, b)) of each block written, in order (the prompt's whole
    blocks are not written); ``nfe`` the network calls."""

    tokens: Tensor
    prompt_len: int
    nfe: int
    blocks: list[tuple[int, Tensor]] = field(default_factory=list)


@torch.no_grad()
def sample_any_length(
    method: Method[Any],
    model: Any,
    prompt_ids: Tensor,
    max_tokens: int,
    stop: Stop | None = None,
    sampler: str | None = None,
    steps: int = 64,
    window: int | None = None,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    *,
    on_block: Callable[[int, Tensor], None] | None = None,
    temperature: float = 1.0,
) -> AnyLength:
    """Generate ``max_tokens`` ids after ``prompt_ids`` (B, P) long (P may be 0) with a run of any method
    with blocks (MDLM, RePlaid, Plaid; AR token by token), through the one loop (:func:`iter_lane`):
    N = ``ceil((P + max_tokens) / b)`` whole blocks. A run without blocks is one block of ``seq_len``
    (P + max_tokens <= seq_len).

    ``sampler``: a registered name of the method (None: its default); ``steps``: each block's T;
    ``window``: the KV cache's committed rows (None: all; past ``seq_len`` pass at most ``seq_len - b``
    to stay inside the trained context); ``generator``: every draw's (a CPU generator is moved to the
    model's device as :func:`replaid.diffusion.rng.device_generator` does); ``callback``: each step's
    :class:`StepInfo` with ``block``; ``on_block(k, ids)``: each block as it is written (streaming);
    ``temperature``: the request's (MDLM's and AR's draws). Returns :class:`AnyLength`."""
    b = method.stream_block() or method.cfg.data.seq_len  # a run without blocks: one block of its length
    L = method.cfg.data.seq_len
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids[None]
    Bn, P = prompt_ids.shape
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    N = math.ceil((P + max_tokens) / b) * b
    if b >= L and N > L:
        raise ValueError(
            f"this {method.name} run has no blocks: it writes at most data.seq_len={L} tokens "
            f"(prompt {P} + max_tokens {max_tokens})"
        )
    dev = next(model.parameters()).device
    kernel = kernel_for(method, model, SampleRequest(sampler=sampler, steps=steps, temperature=temperature))
    fill = int(model.n_out) if method.kind.mask_token else 0
    ids = torch.full((Bn, N), fill, dtype=torch.long, device=dev)
    ids[:, :P] = prompt_ids.to(dev)
    known = (torch.arange(N, device=dev) < P).expand(Bn, N).clone()  # (B, N)
    lane = Lane(ids, known, device_generator(generator, dev), b)
    written: list[tuple[int, Tensor]] = []
    blocks = iter_lane(kernel, lane, window, dev, callback)
    nfe, end = 0, 0
    for c in blocks:
        end, nfe = c.start + b, c.nfe
        if not c.prompt:
            written.append((c.start, c.tokens.clone()))
            if on_block is not None:
                on_block(c.start // b, c.tokens)
        if stop is not None and bool(stop(ids[:, :end]).all()):
            blocks.close()
            break
    return AnyLength(ids[:, :end], P, nfe, written)
