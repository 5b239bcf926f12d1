"""Continuous batching at block boundaries (issue 39 §3): requests join and leave one running batch.

* The ragged KV cache (rows at different committed lengths share its slots, right-aligned, the unused ones
  masked per row, each row at its own rotary positions) equals the uncached vectorised pass row by row, with
  rows joining (one after a prefill longer than the cache holds), leaving, and a sliding window; in float64
  to 1e-10. Planted bugs (the validity mask forgotten, the positions off by one) fail it.
* A request written in a batch writes the tokens it writes alone (``replaid sample``'s block starters) at
  its seed, whether it joined at the start or mid-stream, and whatever leaves: MDLM in float64 (bit for bit:
  token equality; the network values agree to ~1e-15, what the batch's matrix products round otherwise);
  RePlaid with a deterministic (DDIM) and a stochastic (DDPM) sampler and Plaid with DPM-Solver++(2M), their
  networks float32 by design (token equality; the values agree to float32 rounding, far below any decision
  margin of these draws). A planted bug (one generator shared by the batch instead of one per request)
  fails it.
* The scheduler's admission: ``max_batch`` rows run, ``max_queue`` requests wait beyond them.
"""

from __future__ import annotations

import threading
import types
from collections import deque

import pytest
import torch

from replaid.model.blocks import pair_positions
from replaid.model.dit import KVCache
from replaid.sampling import batching
from replaid.sampling.batching import BlockBatch, kernel_of, lane_of
from replaid.sampling.loop import start_blocks
from replaid.sampling.request import SampleRequest
from replaid.sampling.stream import starter_for
from test_blocks import backbone, mdlm, windowed_mask
from test_blocks_continuous import continuous

TOL = 1e-10
CPU = torch.device("cpu")

# ------------------------------------------------------------------ the ragged cache (model layer)


@torch.no_grad()
def ragged_error(window: int | None, L: int = 16, b: int = 2) -> float:
    """Rows 0..3 join a ragged batch at steps 0, 0, 2, 3 (row 2 after a prefill of 5 blocks, longer than the
    cache then holds), row 1 leaves at step 4 (a dropped client), every row leaves after its last block.
    Each step every row's noisy block goes through one batched cached pass, then the clean blocks are
    committed in one pass. Returns the largest difference from the vectorised pass of each row alone."""
    net = backbone()
    g = torch.Generator().manual_seed(1)
    B, D, C = 4, 32, 16
    noisy, clean = torch.randn(B, L, D, generator=g, dtype=torch.float64), torch.randn(B, L, D, generator=g).double()
    c_noisy, c_clean = torch.randn(B, L, C, generator=g).double(), torch.randn(B, L, C, generator=g).double()
    x, c = torch.cat([noisy, clean], 1), torch.cat([c_noisy, c_clean], 1)
    full = net(x, c, positions=pair_positions(L), mask=windowed_mask(L, b, window))[:, :L]  # (B, L, D)
    joins, prefill = {0: [0, 1], 2: [2], 3: [3]}, {2: 5}
    cache = KVCache(window=window).ragged(0, CPU)
    active: list[list[int]] = []  # [row, its block]
    err = 0.0
    for step in range(L // b + 4):
        for r in joins.get(step, []):
            own = KVCache(window=window)  # the row's prompt, committed alone
            for k in range(prefill.get(r, 0)):
                net(
                    clean[r : r + 1, k * b : (k + 1) * b],
                    c_clean[r : r + 1, k * b : (k + 1) * b],
                    cache=own,
                    commit=True,
                )
            cache.join(own.ragged(1, CPU))
            active.append([r, prefill.get(r, 0)])
        if not active:
            break

        def blocks(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t[r : r + 1, k * b : (k + 1) * b] for r, k in active])

        got = net(blocks(noisy), blocks(c_noisy), cache=cache)  # (rows, b, D)
        for i, (r, k) in enumerate(active):
            err = max(err, float((got[i] - full[r, k * b : (k + 1) * b]).abs().max()))
        keep = [i for i, (r, k) in enumerate(active) if (k + 1) * b < L and not (step == 4 and r == 1)]
        cache.select(torch.tensor(keep, dtype=torch.long))
        active = [active[i] for i in keep]
        if active:
            net(blocks(clean), blocks(c_clean), cache=cache, commit=True)
            assert cache.length <= (window or L)
        for a in active:
            a[1] += 1
    return err


@pytest.mark.parametrize("window", [None, 6])
def test_the_ragged_cache_equals_the_vectorised_pass_of_each_row(window):
    assert ragged_error(window) < TOL


def test_the_ragged_cache_fails_without_its_validity_mask_or_with_positions_off_by_one(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(KVCache, "key_mask", lambda self, L, mask: mask)  # the plant: the left slots seen
        assert ragged_error(None) > 1e-3
    ragged = KVCache.ragged

    def off_by_one(self, B, device):
        self.next_pos += 1 if B else 0  # the joining rows' next positions, its keys rotated where they were
        return ragged(self, B, device)

    with monkeypatch.context() as m:
        m.setattr(KVCache, "ragged", off_by_one)  # the plant: a joining row's positions one too far
        assert ragged_error(None) > 1e-3
    assert ragged_error(None) < TOL


# ------------------------------------------------------------------ requests alone and joined (sampling layer)


def as_run(method, model):
    return types.SimpleNamespace(method=method, model=model, cfg=method.cfg)


def alone(run, req: SampleRequest, prompt: torch.Tensor, length: int) -> torch.Tensor:
    """The request as ``replaid sample`` writes it: its kind's block starter, every block (n, N)."""
    return torch.cat([c.tokens for c in starter_for(run.method)(run, req, prompt, length, None)(req.num)], 1)


def batched(run, asks, joins: dict[int, list[int]], drop: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """The requests ``asks`` (request, prompt, length) in one :class:`BlockBatch`: request i joins at the
    steps ``joins`` say, ``drop`` = (request, step) leaves then; returns each request's ids (n, N)."""
    batch = BlockBatch(kernel_of(run, asks[0][0]), run.cfg.data.seq_len - run.method.stream_block(), CPU)
    lanes = [lane_of(run, *a, tag=i) for i, a in enumerate(asks)]
    for step in range(1000):
        for i in joins.get(step, []):
            batch.join(lanes[i])
        if not batch.lanes and step > max(joins):
            break
        if batch.lanes:
            batch.step()
            batch.advance([x for x in batch.lanes if drop is None or (x.tag, step) != drop])
    return [x.ids for x in lanes]


def requests(**kw):
    def req(seed: int, n: int) -> SampleRequest:
        return SampleRequest(seed=seed, num=n, batch_size=n, steps=3, progress=False, **kw)

    empty = torch.tensor([], dtype=torch.long)
    return [
        (req(11, 2), torch.tensor([1, 2, 3, 4, 5]), 40),  # two samples; the prompt's second block in part
        (req(12, 1), torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]), 30),  # two whole blocks of prompt (prefilled)
        (req(13, 1), torch.tensor([5, 6]), 24),  # the prompt's first block in part, joining mid-stream
        (req(14, 1), empty, 17),
    ]


JOINS = {0: [0, 3], 2: [1], 5: [2]}  # request 3 joins at the start with 0, requests 1 and 2 mid-stream


def check_alone_equals_joined(run, monkeypatch, **kw):
    asks = requests(**kw)
    want = [alone(run, *a) for a in asks]
    got = batched(run, asks, JOINS)
    for i, (w, x) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(w, x), i
    # request 0 leaves at step 3 (its client went away): the others are unchanged
    got = batched(run, asks, JOINS, drop=(0, 3))
    assert all(torch.equal(w, x) for w, x in zip(want[1:], got[1:], strict=True))
    assert not torch.equal(want[0], got[0])  # its later blocks were never written
    alone_in_a_batch = batched(run, asks[1:2], {0: [0]})[0]
    assert torch.equal(alone_in_a_batch, want[1])
    with monkeypatch.context() as m:  # the plant: one generator for the whole batch, the first request's
        m.setattr(batching, "RowGenerators", lambda streams: streams[0][1])
        planted = batched(run, asks, JOINS)
    assert not all(torch.equal(w, x) for w, x in zip(want, planted, strict=True))


def test_an_mdlm_request_writes_in_a_batch_what_it_writes_alone(monkeypatch):
    method, model = mdlm(4)  # float64
    check_alone_equals_joined(as_run(method, model), monkeypatch)


def lanes_written(run, asks) -> list:
    """The requests ``asks`` joined together at the first block, written to the end: their lanes."""
    batch = BlockBatch(kernel_of(run, asks[0][0]), run.cfg.data.seq_len - run.method.stream_block(), CPU)
    lanes = [lane_of(run, *a) for a in asks]
    for lane in lanes:
        batch.join(lane)
    while batch.lanes:
        batch.step()
        batch.advance(batch.lanes)
    return lanes


def test_an_mdlm_row_is_passed_through_the_network_only_when_its_block_changed(monkeypatch):
    """With 16 steps for blocks of 4 most steps unmask nothing in a row: a row whose block did not change
    keeps its output and is left out of the call (a view of the other rows' cache), so each request takes
    part in exactly the calls it makes alone, and still writes the same tokens."""
    method, model = mdlm(4)  # float64
    run = as_run(method, model)
    empty = torch.tensor([], dtype=torch.long)
    asks = [
        (SampleRequest(seed=seed, num=n, batch_size=n, steps=16, progress=False), prompt, length)
        for seed, n, prompt, length in [(21, 1, empty, 16), (22, 2, torch.tensor([1, 2]), 16), (23, 1, empty, 12)]
    ]
    starts = [list(start_blocks(run, *a, None)(a[0].num)) for a in asks]
    want_ids = [torch.cat([c.tokens for c in cs], 1) for cs in starts]
    want_nfe = [cs[-1].nfe for cs in starts]
    assert all(n < 16 * 4 + 3 for n in want_nfe)  # alone, the reuse skips calls: fewer than steps x blocks
    lanes = lanes_written(run, asks)
    assert [x.nfe for x in lanes] == want_nfe
    assert all(torch.equal(w, x.ids) for w, x in zip(want_ids, lanes, strict=True))

    with monkeypatch.context() as m:  # the plant: the batch's rule, every row again whenever any changed
        m.setattr(batching.MaskedKernel, "changed", staticmethod(lambda new, old: (new != old).any().expand(len(new))))
        planted = lanes_written(run, asks)
    assert [x.nfe for x in planted] != want_nfe
    view = KVCache.view
    with monkeypatch.context() as m:  # the plant: the changed rows read the first rows' cache
        m.setattr(KVCache, "view", lambda self, rows: view(self, torch.arange(len(rows))))
        planted = lanes_written(run, asks)
    assert not all(torch.equal(w, x.ids) for w, x in zip(want_ids, planted, strict=True))


@pytest.mark.parametrize("name,sampler", [("replaid", "ddim"), ("replaid", "ddpm"), ("plaid", "dpmpp2m")])
def test_a_continuous_request_writes_in_a_batch_what_it_writes_alone(monkeypatch, name, sampler):
    method, model = continuous(name, 4)
    check_alone_equals_joined(as_run(method, model.eval()), monkeypatch, sampler=sampler, temperature=0.8)


def ar(L: int = 8):
    """A float64 AR model (causal DiT, no time conditioning) with values in its zero-initialised layers."""
    from replaid.methods import get_method
    from replaid.presets import resolve

    sets = ["method=ar", f"data.seq_len={L}", "model.hidden=32", "model.n_layers=2", "model.n_heads=4"]
    method = get_method(resolve("debug", None, [*sets, "model.cond_dim=16"]))
    torch.manual_seed(0)
    model = method.build_model(11).double().eval()
    for m in model.modules():  # the zero head starts at zero: give it values
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    return method, model


def test_an_ar_request_writes_in_a_batch_what_it_writes_alone(monkeypatch):
    """AR served as a block run of one token: past its length of 8 (the window keeps 7 tokens before each
    query, BOS dropped once it leaves), a prompt of 8 tokens prefilled (one pass of BOS and 7, then one
    more), requests joining at any token and leaving: each writes what it writes alone."""
    method, model = ar()
    assert method.stream_block() == 1 and method.block_size() == 0
    check_alone_equals_joined(as_run(method, model), monkeypatch, temperature=0.9)


def test_ar_token_blocks_are_sample_ars_draws_within_the_training_length():
    """Inside ``data.seq_len`` the token-by-token starter is the registered AR sampler (``sample_ar``):
    the same draws from the same seed, the same tokens, prompt or none."""
    from replaid.sampling.discrete import sample_ar

    method, model = ar()
    run = as_run(method, model)
    for prompt in (torch.tensor([], dtype=torch.long), torch.tensor([3, 1, 4])):
        req = SampleRequest(seed=5, num=3, batch_size=3, progress=False, temperature=0.7)
        got = alone(run, req, prompt, 8)
        x = torch.zeros(3, 8, dtype=torch.long)
        x[:, : len(prompt)] = prompt
        pos = torch.arange(len(prompt), 9)
        want = sample_ar(model, x, pos, generator=torch.Generator().manual_seed(5), temperature=0.7).tokens
        assert torch.equal(got, want), prompt
        infos = []
        list(start_blocks(run, req, prompt, 8, infos.append)(3))
        assert [i["start"] for i in infos] == list(range(len(prompt), 8))  # one step per token written


def test_an_ar_prefill_sees_what_token_by_token_commits_see_past_the_window(monkeypatch):
    """``prefill_ar`` of a prompt longer than the window equals committing it token by token (the
    next-token logits to 1e-12); a planted one-pass prefill of the whole prompt (every query seeing more
    than the window's keys) does not."""
    from replaid.sampling import blocks
    from replaid.sampling.blocks import commit_ar, prefill_ar

    method, model = ar()
    ids = torch.randint(0, 11, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        one = KVCache(window=7)
        for j in range(13):
            commit_ar(model, ids[:, j : j + 1], one)
        fast = KVCache(window=7)
        assert prefill_ar(model, ids, fast) == 1 + 13 - 7
        assert fast.next_pos == one.next_pos == 14 and fast.length == one.length == 7
        assert (fast.head - one.head).abs().max() < 1e-12
        with monkeypatch.context() as m:
            m.setattr(blocks, "commit_ar", lambda model, x, cache: commit_ar(model, ids, cache) if x.shape[1] else None)
            planted = KVCache(window=7)
            blocks.prefill_ar(model, ids, planted)
        assert (planted.head - one.head).abs().max() > 1e-6


# ------------------------------------------------------------------ the scheduler's admission (web layer)


def test_the_scheduler_admits_max_batch_rows_and_max_queue_waiting_beyond_them():
    pytest.importorskip("fastapi", reason="the 'web' extra is not installed")
    from replaid.web.batcher import Batcher, Job

    method, model = mdlm(4)
    sched = Batcher("bd3", as_run(method, model), max_batch=4, max_queue=1)

    def job(n: int) -> Job:
        return Job(SampleRequest(num=n), print, threading.Event())

    with sched.cond:  # the scheduler sleeps: nothing notifies it
        sched.running = 3
    assert sched.admit(1) and not sched.beyond()  # fits the batch's last row
    with sched.cond:
        sched.waiting = deque([job(1)])
    assert sched.admit(2) and sched.admit(1)  # one may wait beyond the batch (max_queue 1)
    with sched.cond:
        sched.waiting.append(job(2))
    assert sched.beyond() == 1 and not sched.admit(1)  # one waits beyond already
    msg = sched.busy()  # 3 rows run, job(1) joins at the next block, job(2) waits beyond the batch
    assert "3 samples are running and 1 join at the next block (limit 4)" in msg, msg
    assert "1 requests are waiting beyond them (limit 1)" in msg, msg
    with sched.cond:
        sched.running, sched.waiting = 0, deque()
    # a request of more than max_batch samples (replaid serve --max-samples 8 --max-batch 4) runs alone once
    # the batch is empty: on an idle run it is admitted even when nothing may wait (--max-queue 0), where it
    # was a 429 'busy' that no retry could pass; behind a running batch it is a 429 then
    idle = Batcher("bd3", as_run(method, model), max_batch=4, max_queue=0)
    assert idle.admit(6)
    with idle.cond:
        idle.running = 1
    assert not idle.admit(6)


def test_the_scheduler_joins_in_arrival_order_what_fits_and_agrees_with_the_batch():
    pytest.importorskip("fastapi", reason="the 'web' extra is not installed")
    from replaid.web.batcher import Batcher, Job

    method, model = mdlm(4)
    sched = Batcher("bd3", as_run(method, model), max_batch=4, max_queue=8)

    def job(n: int, steps: int = 4, gone: bool = False) -> Job:
        j = Job(SampleRequest(num=n, steps=steps), print, threading.Event())
        if gone:
            j.gone.set()
        return j

    def joining(*jobs: Job) -> list[Job]:
        with sched.cond:  # the scheduler sleeps: nothing notifies it
            sched.waiting = deque(jobs)
        out = sched._boundary()
        with sched.cond:
            sched.running, sched.waiting, sched.key = 0, deque(), None
        return out

    a, b, c = job(1), job(1, steps=5), job(1)
    assert joining(a, b, c) == [a]  # b's steps differ: it waits for the batch to empty, and c behind it
    a, b, c = job(1, gone=True), job(3), job(2)
    assert joining(a, b, c) == [b]  # a's client went away; c does not fit in the 4 rows
    big = job(6)
    assert joining(big, job(1)) == [big]  # more than max_batch samples: alone, in an empty batch


def test_the_default_limits_hold_a_burst_of_48_streaming_clients():
    """Issue 52 §2: ``replaid serve``'s defaults (``--max-batch 16 --max-queue 32``) admit a burst of 48
    one-sample requests to a running block or AR run (16 running, 32 waiting beyond the batch): none is a 429;
    the 49th is (with ``Retry-After``, tested on the server)."""
    pytest.importorskip("fastapi", reason="the 'web' extra is not installed")
    from replaid.web.batcher import Batcher, Job
    from replaid.web.engine import Limits

    lim = Limits()
    assert (lim.max_batch, lim.max_queue) == (16, 32)
    method, model = mdlm(4)
    sched = Batcher("bd3", as_run(method, model), lim.max_batch, lim.max_queue)
    with sched.cond:  # a running batch of 16 rows; the scheduler sleeps (nothing notifies it)
        sched.running = 16
    admitted = 0
    while sched.admit(1) and admitted < 100:
        with sched.cond:  # (the condition's lock is re-entrant: admit() takes it too)
            sched.waiting.append(Job(SampleRequest(num=1), print, threading.Event()))
        admitted += 1
    assert admitted == 32  # 16 running + 32 waiting: a burst of 48 without a 429
    with sched.cond:
        sched.running, sched.waiting = 0, deque()
    for _ in range(16):  # and from idle: 16 join the batch at the next boundary, 32 wait beyond it
        assert sched.admit(1)
        with sched.cond:
            sched.waiting.append(Job(SampleRequest(num=1), print, threading.Event()))
    assert sched.beyond() == 0 and all(sched.admit(1) for _ in range(1))
