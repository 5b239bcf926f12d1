"""Completions: a prompt continued block by block, each committed block given out as it comes.

The interface a method's generator plugs into is a :class:`BlockStarter`: the one block loop
(:func:`~replaid.sampling.loop.start_blocks`, with the kind's kernel) when its run has blocks
(:meth:`~replaid.methods.base.Method.stream_block` > 0):

    batch = starter(run, request, prompt, length, callback)   # prompt: (P,) ids; length: P + max_tokens
    for block in batch(B): ...                                 # Committed(tokens (B, n), start, nfe)

``batch(B)`` writes B rows of at least ``length`` tokens, the prompt first, and yields every block once it
is final (blocks of the prompt too, which the consumer skips); the batches of one request draw in order
from the request's seeded generator, and closing the iterator stops the generation (MDLM, RePlaid and Plaid
with blocks; AR token by token over its KV cache). A run without blocks writes its one length in a single pass of its
registered sampler (:func:`one_pass`, the draws of :func:`~replaid.sampling.generate.generate`): one block.

:class:`Completion` turns the blocks into text: each sample is cut at the tokenizer's end-of-text token
(unless ``ignore_eos``), at ``max_tokens`` and before the first stop string (the first written: the one that
ends first, whatever the blocks), and each committed block gives one :class:`Delta` per unfinished sample
(the text new since the last; the tail that could still become a stop string is held back, as is a byte
sequence not yet a whole character). Generation ends when every sample of the batch has finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from replaid.methods.base import Method
from replaid.sampling.contract import Callback, Committed
from replaid.sampling.loop import start_blocks
from replaid.sampling.registry import get_sampler
from replaid.sampling.request import SampleRequest
from replaid.sampling.strategy import BlockStarter, strategy_of

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = ["BlockStarter", "Completion", "Delta", "SampleText", "one_pass", "starter_for"]


def one_pass(
    run: Run, req: SampleRequest, prompt: Tensor, length: int, callback: Callback | None
) -> Callable[[int], Iterator[Committed]]:
    """A run without blocks: the registered sampler writes the request's one length (``length`` or
    ``data.seq_len``) at once, drawn as :func:`~replaid.sampling.generate.generate` draws it: one block."""
    sampler = get_sampler(run.method, req.sampler)
    start = sampler.start(run, req, None, req.length_for(run.cfg.data.seq_len), sampler.name, callback)

    def batch(B: int) -> Iterator[Committed]:
        b = start.batch(B)
        res = sampler.fn(start.net, b.state, start.grid, generator=start.generator, callback=b.callback, **b.options)
        b.after(res)
        yield Committed(res.tokens, 0, res.nfe)

    return batch


def starter_for(method: Method[Any]) -> BlockStarter:
    """The block generator of ``method``'s runs: the one block loop (:func:`~replaid.sampling.loop.start_blocks`,
    with its kind's kernel) when the run has blocks (AR's: blocks of one token,
    :meth:`~replaid.methods.base.Method.stream_block`), else :func:`one_pass`."""
    if not method.stream_block():
        return one_pass
    if strategy_of(method.kind).kernel is None:
        raise ValueError(f"a {method.name} run with blocks has no block-by-block generator yet")
    return start_blocks


@dataclass
class Delta:
    """What one committed block adds to one sample."""

    index: int  # the sample, 0 .. num - 1
    text: str  # the text new since this sample's last delta ("" when nothing is final yet)
    finish_reason: str | None = None  # set once: "stop" (end-of-text or a stop string), "length" (max_tokens)


class SampleText:
    """One sample's completion as its tokens come: the ids kept (cut at end-of-text and ``max_tokens``),
    the text given out so far and, once finished, why."""

    def __init__(self, tok: Any, max_tokens: int, stop: tuple[str, ...], eos: int | None):
        self.tok, self.max_tokens, self.stop, self.eos = tok, max_tokens, stop, eos
        self.ids: list[int] = []
        self.text = ""  # given out
        self.finish_reason: str | None = None
        self.cut: int | None = None  # the stop string's offset in the decoded ids

    def feed(self, ids: list[int]) -> str:
        """Take a block's new ids; returns the text now final (module docstring)."""
        if self.finish_reason is not None:
            return ""
        for i in ids:
            if i == self.eos:
                self.finish_reason = "stop"
                break
            self.ids.append(i)
            if len(self.ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
        text = self.tok.decode(self.ids)
        # the stop written first (the one that ends first, the longest of those), as one token at a time would
        # find it: a block that completes two overlapping stops ("a" in "bab") cuts where a smaller block would
        hits = [(k + len(s), -len(s), k) for s in self.stop if (k := text.find(s)) >= 0]
        if hits:
            self.cut = min(hits)[2]
            text, self.finish_reason = text[: self.cut], "stop"
        elif self.finish_reason is None:
            text = text[: len(text) - self._held(text)]
        new = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text += new
        return new

    def _held(self, text: str) -> int:
        """Characters at the end of ``text`` not final yet: an incomplete character, or the longest tail
        that is the start of a stop string."""
        n = len(text) - len(text.rstrip("\ufffd"))
        tail = text[: len(text) - n]
        k = max((j for s in self.stop for j in range(1, len(s)) if tail.endswith(s[:j])), default=0)
        return n + k

    def kept_ids(self) -> list[int]:
        """The fewest ids whose text covers the completion (cut before a stop string: the ids up to the
        one that writes the text's last character, all of its bytes: a character two tokens write is
        one replacement character after the first)."""
        if self.cut is None:
            return list(self.ids)
        lo, hi = 0, len(self.ids)  # the fewest tokens whose text starts with the completion
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.tok.decode(self.ids[:mid]).startswith(self.text) else (mid + 1, hi)
        return self.ids[:lo]


class Completion:
    """A checked completion request on a loaded run: iterate it for one list of :class:`Delta` per
    committed block (the deltas of the batch's unfinished samples), or call :meth:`rows` for
    :func:`~replaid.sampling.generate.generate`'s rows. ``samples``, ``nfe`` and ``batches`` fill in as it runs."""

    def __init__(self, run: Run, req: SampleRequest, callback: Callback | None = None):
        self.run, self.req = run, req
        L = run.cfg.data.seq_len
        req.check(run.method, run.tokenizer, L)
        tok = run.tokenizer
        self.prompt = torch.tensor(tok.encode(req.prompt) if req.prompt else [], dtype=torch.long)
        self.max_tokens = req.completion_tokens(L, len(self.prompt))
        self.eos = None if req.ignore_eos else tok.eos_id
        self.batch = starter_for(run.method)(run, req, self.prompt, len(self.prompt) + self.max_tokens, callback)
        self.samples: list[SampleText] = []
        self.nfe = 0  # network calls of the batch running (or last run)
        self.batches: list[tuple[int, float, int]] = []  # per batch done: its samples, seconds and network calls

    def new_rows(self, B: int) -> list[SampleText]:
        """B more samples (appended to ``samples``), to be fed a batch's blocks by :meth:`deltas`."""
        rows = [SampleText(self.run.tokenizer, self.max_tokens, self.req.stop, self.eos) for _ in range(B)]
        self.samples += rows
        return rows

    def deltas(self, rows: list[SampleText], c: Committed) -> list[Delta] | None:
        """A committed block of the batch of ``rows`` fed to them: the deltas of those unfinished (None for
        a block of the prompt)."""
        self.nfe = c.nfe
        lo = max(0, len(self.prompt) - c.start)
        if lo >= c.tokens.shape[1]:  # the prompt's (prefilled)
            return None
        new = c.tokens[:, lo:].tolist()
        first = self.samples.index(rows[0])
        live = [b for b in range(len(rows)) if rows[b].finish_reason is None]
        return [Delta(first + b, rows[b].feed(new[b]), rows[b].finish_reason) for b in live]

    def __iter__(self) -> Iterator[list[Delta]]:
        req = self.req
        while len(self.samples) < req.num:
            B = min(req.batch_size, req.num - len(self.samples))
            rows = self.new_rows(B)
            t0, self.nfe = time.time(), 0
            blocks = self.batch(B)
            try:
                for c in blocks:
                    deltas = self.deltas(rows, c)
                    if deltas is None:
                        continue
                    yield deltas
                    if all(r.finish_reason is not None for r in rows):
                        break
            finally:
                close = getattr(blocks, "close", None)
                if close is not None:
                    close()
            self.batches.append((B, time.time() - t0, self.nfe))

    def rows(self) -> list[dict[str, Any]]:
        """Run to the end; one row per sample: ``ids`` (the prompt's and those kept), ``text`` (the prompt
        and the completion), ``completion``, ``finish_reason`` and :func:`generate`'s other fields."""
        for _ in self:
            pass
        req, out = self.req, []
        sampler = self.run.method.samplers[0] if req.sampler is None else req.sampler
        for k, s in enumerate(self.samples):
            B, secs, nfe = self.batches[k // req.batch_size]
            out.append(
                {
                    "ids": self.prompt.tolist() + s.kept_ids(),
                    "text": (req.prompt or "") + s.text,
                    "completion": s.text,
                    "finish_reason": s.finish_reason,
                    "sampler": sampler,
                    "steps": req.steps,
                    "nfe": nfe,
                    "seconds": secs / B,
                    "batch_seconds": secs,
                    "seed": req.seed,
                    "temperature": req.temperature,
                }
            )
        return out
