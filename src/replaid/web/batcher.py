"""A block run's ``/v1/completions`` scheduler: continuous batching at block boundaries.

Each served run that writes any length (``method.stream_block() > 0``: a block-diffusion run, or AR with blocks
of one token) has one :class:`Batcher`: a thread that owns the run's running batch (:class:`~replaid.sampling.batching.BlockBatch`). It loops block by block; at each
boundary:

1. the requests whose client has gone leave (their rows, ``index_select`` along the batch), as do those
   that finished (end of text, a stop string, ``max_tokens``) — after their last block was sent;
2. waiting requests join in arrival order while their samples fit in ``max_batch`` rows and they agree
   with the batch on what its kernel does (sampler, steps, temperatures: :data:`KERNEL_FIELDS`); the first
   that does not waits (and so do those behind it) until the batch has room or has emptied (a request
   of more than ``max_batch`` samples runs once the batch is empty);
3. one block of every request is written in one batch and each request's block goes to its own client.

A request writes what it writes alone, at its seed (:mod:`replaid.sampling.batching`). The bound:
``max_batch`` rows run and at most ``max_queue`` requests wait beyond them (those that will not fit at the
next boundary); one more gets HTTP 429.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replaid.sampling.batching import KERNEL_FIELDS, BlockBatch, kernel_key, kernel_of, lane_of
from replaid.sampling.request import SampleRequest
from replaid.sampling.stream import Completion, SampleText
from replaid.web.jobs import Emit, channel, one_line

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = ["KERNEL_FIELDS", "Batcher", "Job", "done_event"]


def done_event(comp: Completion) -> dict[str, Any]:
    """A finished completion's last event: each sample's text and finish reason, and the token counts."""
    usage = sum(len(x.kept_ids()) for x in comp.samples)
    texts = [(x.text, x.finish_reason) for x in comp.samples]
    return {"type": "done", "texts": texts, "prompt_tokens": len(comp.prompt), "completion_tokens": usage}


@dataclass
class Job:
    """One request: what it asks, how its events reach its client, its samples' texts once started."""

    req: SampleRequest
    emit: Emit
    gone: threading.Event
    comp: Completion | None = None
    rows: list[SampleText] = field(default_factory=list)

    def done(self) -> None:
        assert self.comp is not None
        self.emit(done_event(self.comp))

    def fail(self, rid: str, e: BaseException) -> None:
        print(f"replaid serve: generation failed on {rid}: {e!r}", file=sys.stderr)
        self.emit({"type": "error", "message": one_line(e)})


class Batcher:
    """The scheduler thread of one block run (module docstring)."""

    def __init__(self, rid: str, run: Run, max_batch: int, max_queue: int):
        self.rid, self.run, self.max_batch, self.max_queue = rid, run, max_batch, max_queue
        self.cond = threading.Condition()
        self.waiting: deque[Job] = deque()
        self.running = 0  # rows in the batch (or joining it)
        self.key: tuple[Any, ...] | None = None  # the batch's kernel fields
        self.batch: BlockBatch | None = None
        self.device = next(run.model.parameters()).device
        self.kind = run.method.kind
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"batch-{rid}")
        self.thread.start()

    # ---- the event loop's side

    def beyond(self) -> int:
        """Waiting requests that will not join at the next boundary (hold the lock)."""
        return self._split()[1]

    def _split(self) -> tuple[int, int]:
        """(samples of the waiting requests that join at the next boundary, requests waiting beyond them)."""
        room, joining, n = self.max_batch - self.running, 0, 0
        for job in self.waiting:
            if n or job.req.num > room:
                n += 1
            else:
                room -= job.req.num
                joining += job.req.num
        return joining, n

    def admit(self, num: int) -> bool:
        """Whether a request of ``num`` samples may wait for the batch (False: HTTP 429)."""
        with self.cond:
            beyond = self.beyond()
            room = self.max_batch - self.running - sum(j.req.num for j in self.waiting)
            idle = self.running == 0 and not self.waiting  # more than max_batch samples run alone, at once now
            return (beyond == 0 and (num <= room or idle)) or beyond < self.max_queue

    def load(self) -> tuple[int, int]:
        """(Rows running or joining, requests waiting): the metrics' gauges."""
        with self.cond:
            return self.running, len(self.waiting)

    def busy(self) -> str:
        """The 429's message."""
        with self.cond:
            rows, (joining, beyond) = self.running, self._split()
        return (
            f"run {self.rid!r} is busy: {rows} samples are running and {joining} join at the next block (limit "
            f"{self.max_batch}), and {beyond} requests are waiting beyond them (limit {self.max_queue}); try again "
            f"shortly"
        )

    def submit(self, req: SampleRequest) -> tuple[asyncio.Queue[dict[str, Any]], threading.Event]:
        """Queue an admitted request (from the event loop): its events' queue and the event to set when its
        client goes."""
        queue, gone, emit = channel()
        with self.cond:
            self.waiting.append(Job(req, emit, gone))
            self.cond.notify()
        return queue, gone

    # ---- the scheduler thread

    def _boundary(self) -> list[Job]:
        """Wait for work; take the waiting requests that join now (module docstring, step 2)."""
        with self.cond:
            while not self.waiting and not (self.batch is not None and self.batch.lanes):
                self.cond.wait()
            joining: list[Job] = []
            self.running = self.batch.rows if self.batch is not None else 0
            while self.waiting:
                job = self.waiting[0]
                if job.gone.is_set():
                    self.waiting.popleft()
                    continue
                empty = self.running == 0 and not joining
                if not empty and (
                    kernel_key(job.req, self.kind) != self.key or self.running + job.req.num > self.max_batch
                ):
                    break
                if empty:
                    self.key = kernel_key(job.req, self.kind)
                joining.append(self.waiting.popleft())
                self.running += job.req.num
            return joining

    def _start(self, job: Job) -> None:
        """The request's completion and rows; its lane joins the batch (a new batch when it is empty)."""
        try:
            comp = job.comp = Completion(self.run, job.req)
            job.rows = comp.new_rows(job.req.num)
            lane = lane_of(self.run, job.req, comp.prompt, len(comp.prompt) + comp.max_tokens, tag=job)
            if self.batch is None or not self.batch.lanes:
                window = self.run.cfg.data.seq_len - lane.block
                self.batch = BlockBatch(kernel_of(self.run, job.req), window, self.device)
            self.batch.join(lane)
        except Exception as e:
            with self.cond:  # its rows freed before its client hears (a next request is admitted at once)
                self.running -= job.req.num
            job.fail(self.rid, e)

    def _block(self, batch: BlockBatch) -> list[Job]:
        """One block of every lane; each to its client; the lanes that go on stay (steps 1 and 3). Returns
        the requests that finished: their ``done`` is sent once their rows are freed (:meth:`_loop`)."""
        keep, finished = [], []
        for lane, c in zip(list(batch.lanes), batch.step(), strict=True):
            job: Job = lane.tag
            assert job.comp is not None
            if job.gone.is_set():  # dropped: its rows leave at this boundary
                continue
            deltas = job.comp.deltas(job.rows, c)
            if deltas is not None:
                job.emit({"type": "block", "choices": [d.__dict__ for d in deltas]})
            if lane.last or all(r.finish_reason is not None for r in job.rows):
                finished.append(job)
            else:
                keep.append(lane)
        batch.advance(keep)
        return finished

    def _loop(self) -> None:
        while True:
            for job in self._boundary():
                self._start(job)
            batch = self.batch
            if batch is None or not batch.lanes:
                continue
            finished: list[Job] = []
            failed: list[tuple[Job, BaseException]] = []
            try:
                finished = self._block(batch)
            except Exception as e:
                failed = [(lane.tag, e) for lane in batch.lanes]
                self.batch = None
            with self.cond:
                self.running = self.batch.rows if self.batch is not None else 0
            # the last events after the rows are freed: a client that has read its answer and sends its next
            # request at once finds the room (freed after the answer, a client sending its next request at once got 429 with --max-queue 0)
            for job in finished:
                job.done()
            for job, err in failed:
                job.fail(self.rid, err)
