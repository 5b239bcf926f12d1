"""Likelihood requests of EleutherAI's lm-evaluation-harness, answered from a run's bound (``replaid lmeval``).

No ``lm_eval`` import here: :mod:`replaid.hub.lmeval` wraps these functions in the harness's ``LM``.

Every request becomes *rows* of at most L tokens (L = the run's ``data.seq_len``): a row is a
context (unscored, held clean) followed by its scored tokens, and each row is scored by the method's
:meth:`~replaid.methods.base.Method.conditional_nll` (AR: exact; MDLM/Duo: the NELBO with only the
scored tokens corrupted; RePlaid/Plaid/LangFlow: the scored tokens' share of the VDM NELBO, an upper
bound on the inpainting conditional) or, for a row with no context, its joint bound
(:meth:`~replaid.methods.base.Method.eval_bound` x tokens, the very computation of ``replaid zeroshot``;
with ``likelihood="ode"``: the ODE/IWAE bound ``-log (1/K) sum_k w_k`` of :mod:`replaid.eval.likelihood`).

Windows (:func:`windows`), the token accounting stated exactly: the tokens ``[start, n)`` are scored,
each exactly once, in chunks; a chunk ending at ``end`` is the tail of the row
``tokens[max(0, end - L) : end]``, so every row is filled back with as much preceding text as fits
(the harness's convention for its last rolling window and for truncating a long context). With
``start = 0`` (``loglikelihood_rolling``) the first chunk is ``min(n, L)`` tokens with no context, every
later chunk ``L - context`` tokens: the scored chunks are exactly those of the harness's
``get_rolling_token_windows(max_seq_len=L, context_len=context + 1)``, and each row's context is the
harness's context without its first token (the harness's AR input is L + 1 tokens long; a row here is
L). ``context = 0`` (the default) gives disjoint windows of L tokens, ``replaid zeroshot``'s rows for the
same token stream, the last one filled back. A request's own context (``start > 0``) always keeps at
least one position in its first row.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

WHAT = {
    "exact": "exact log-likelihood",
    "bound": "lower bound on the log-likelihood (NELBO with the context held clean)",
    "continuous": "lower bound on the log-likelihood of the inpainting conditional (VDM NELBO, context noised)",
}


def windows(n: int, L: int, start: int = 0, context: int = 0) -> list[tuple[int, int, int]]:
    """``(row_start, row_end, n_scored)`` rows scoring tokens ``[start, n)`` once each (module docstring)."""
    if not 0 <= context < L:
        raise ValueError(f"rolling context {context} must be in [0, L - 1] = [0, {L - 1}]")
    out = []
    pos = start
    while pos < n:
        k = min(n - pos, L if pos == 0 else L - context)
        if pos == start and start > 0:
            k = min(k, L - 1)
        end = pos + k
        out.append((max(0, end - L), end, k))
        pos = end
    return out


@dataclass
class Row:
    """One scored row: ``ids`` (<= L tokens), of which the last ``n_scored`` are scored."""

    ids: list[int]
    n_scored: int
    request: int  # index of the request it belongs to
    nats: float = 0.0
    greedy: bool = True


@dataclass
class Scorer:
    """Scores rows with a loaded run (``replaid.store.loading.Run``)."""

    run: object
    mc: int = 4  # diffusion times per row (the t_samples of the bound); ignored by AR
    batch_size: int = 8
    seed: int = 0
    likelihood: str = "nelbo"  # rolling rows without context: "nelbo" | "ode" (continuous runs)
    K: int = 1  # ODE/IWAE importance samples per row
    ode_steps: int = 64
    progress: bool = True
    stats: dict[str, float] = field(default_factory=lambda: {"rows": 0, "forward_seconds": 0.0, "ode_rows": 0})

    def __post_init__(self) -> None:
        method = self.run.method  # type: ignore[attr-defined]
        if self.mc < 1 or self.batch_size < 1 or self.K < 1:
            raise ValueError(f"mc_samples ({self.mc}), batch_size ({self.batch_size}) and K ({self.K}) must be >= 1")
        if self.likelihood not in ("nelbo", "ode"):
            raise ValueError(f"likelihood={self.likelihood!r}: choose nelbo or ode")
        if self.likelihood == "ode" and not method.kind.continuous:
            raise ValueError(
                f"likelihood=ode needs a continuous-diffusion run (RePlaid/Plaid/LangFlow); this is a {method.name} run"
            )
        self.run.cfg.eval.t_samples = self.mc  # type: ignore[attr-defined]
        self.gen = torch.Generator().manual_seed(self.seed)

    @property
    def L(self) -> int:
        return int(self.run.cfg.data.seq_len)  # type: ignore[attr-defined]

    def what(self) -> str:
        """What a request's number is, in words."""
        m = self.run.method  # type: ignore[attr-defined]
        if m.conditional == "exact":
            return WHAT["exact"]
        return WHAT["continuous" if m.kind.continuous else "bound"]

    @torch.no_grad()
    def score(self, rows: list[Row], greedy: bool = False, desc: str = "replaid") -> None:
        """Fill each row's ``nats`` (summed over its scored tokens) and ``greedy``, batching rows of one
        length, in a fixed order (deterministic for a seed, batch size and request list)."""
        run = self.run
        method, model = run.method, run.model  # type: ignore[attr-defined]
        dev = next(model.parameters()).device
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i].ids), i))
        bar = tqdm(total=len(rows), desc=desc, unit="row", disable=not self.progress, leave=False)
        i = 0
        while i < len(order):
            n = len(rows[order[i]].ids)
            j = i
            while j < len(order) and j - i < self.batch_size and len(rows[order[j]].ids) == n:
                j += 1
            batch = [rows[k] for k in order[i:j]]
            x = torch.tensor([r.ids for r in batch], dtype=torch.long, device=dev)  # (B, n)
            k = torch.tensor([r.n_scored for r in batch], device=dev)
            target = torch.arange(n, device=dev).view(1, -1) >= (n - k).view(-1, 1)  # (B, n) scored tail
            t0 = time.time()
            whole = bool(target.all())
            if whole and self.likelihood == "ode":
                nats = self._ode(x)
                self.stats["ode_rows"] += len(batch)
            elif whole:
                r = method.eval_bound(model, x, self.gen)  # the joint bound: replaid zeroshot's computation
                nats = r[method.bound].double() * n
            else:
                nats = method.conditional_nll(model, x, target, self.gen)
            if greedy:
                hit = self._greedy(x, target)
            self.stats["forward_seconds"] += time.time() - t0
            for b, r in enumerate(batch):
                r.nats = float(nats[b])
                r.greedy = bool(hit[b]) if greedy else False
            self.stats["rows"] += len(batch)
            bar.update(len(batch))
            i = j
        bar.close()

    def _ode(self, x: Tensor) -> Tensor:
        """``-log (1/K) sum_k w_k`` per row (B,): the ODE/IWAE bound (:mod:`replaid.eval.likelihood`)."""
        from replaid.eval.likelihood import iwae, ode_log_weights, schedule_endpoints

        model = self.run.model  # type: ignore[attr-defined]
        g0, g1 = schedule_endpoints(model)
        sc = model.self_conditioning and self.run.cfg.eval.self_conditioning  # type: ignore[attr-defined]
        log_w = ode_log_weights(
            model, x, g0, g1, K=self.K, batch_size=self.batch_size * self.K, generator=self.gen,
            steps=self.ode_steps, self_cond=sc,
        )[0]  # fmt: skip
        return -iwae(log_w)

    def _greedy(self, x: Tensor, target: Tensor) -> Tensor:
        """(B,) bool: is every scored token the argmax of the model's prediction? AR: exact greedy
        decoding (teacher-forced argmax). MDLM/Duo: the one-step argmax with every scored token
        corrupted (masked / uniform noise at t = 1) and the context clean. Continuous: False (no
        one-step greedy continuation exists; the harness's ``acc`` is then not reported as meaningful)."""
        method, model = self.run.method, self.run.model  # type: ignore[attr-defined]
        logits = method.greedy_logits(model, x, target, self.seed)
        if logits is None:
            return torch.zeros(x.shape[0], dtype=torch.bool)
        ok: Tensor = (logits.argmax(-1) == x) | ~target  # the run is typed object here: logits is Any
        return ok.all(1).cpu()


def request_rows(ctx: list[int], cont: list[int], L: int, index: int, context: int = 0) -> list[Row]:
    """Rows of ``log p(cont | ctx)``: the continuation's tokens, each scored once (module docstring)."""
    ids = ctx + cont
    return [Row(ids[a:b], k, index) for a, b, k in windows(len(ids), L, len(ctx), context)]


def rolling_rows(ids: list[int], L: int, index: int, context: int = 0) -> list[Row]:
    """Rows of the whole document ``ids`` (``loglikelihood_rolling``)."""
    return [Row(ids[a:b], k, index) for a, b, k in windows(len(ids), L, 0, context)]


def totals(rows: list[Row], n: int) -> list[tuple[float, bool]]:
    """Per request: (log-likelihood = -sum of its rows' nats, every row greedy)."""
    ll = [0.0] * n
    greedy = [True] * n
    for r in rows:
        ll[r.request] -= r.nats
        greedy[r.request] = greedy[r.request] and r.greedy
    return list(zip(ll, greedy, strict=True))


def ppl(nats: float, tokens: int) -> float:
    """Token-level perplexity ``exp(nats / tokens)``."""
    return math.exp(nats / max(tokens, 1))
