"""How each method kind starts a sampler: its initial state, grid, generator and options.

A request becomes a :class:`Start` (one per request) and one :class:`Batch` per batch of samples; then
:func:`replaid.sampling.generate.generate` calls the registered sampler the same way for every kind
(:mod:`replaid.sampling.contract`):

    res = sampler.fn(start.net, batch.state, start.grid, generator=start.generator,
                     callback=batch.callback, **batch.options)

* continuous (RePlaid, Plaid, LangFlow): ``z ~ N(0, I)`` (B, L, d_e) on the model's device, the noise grid
  ``gamma(t_i)`` of the run's schedule, the denoiser wrapped by :func:`denoiser_for` (temperatures) and
  :class:`~replaid.sampling.guidance.Guided` (guidance terms); prompts and infilling templates by
  replacement (:class:`~replaid.sampling.continuous.Inpaint`); SDEdit from ``alpha_s e(text) + sigma_s eps``;
* masked (MDLM): all [MASK] (id V) with the prompt in place, the time grid 1 -> 0;
* uniform (Duo): uniform noise drawn on the model's device with the prompt in place (kept: ``known``),
  the time grid 1 -> 0;
* autoregressive: the prompt (the rest zeros), the grid ``n_prefix, ..., L`` (one step per token).

Each kind's strategy (:mod:`replaid.sampling.strategy`) names its starter; every sampler of the kind starts with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from replaid.diffusion.denoiser import Denoiser, alpha_sigma
from replaid.diffusion.rng import device_generator
from replaid.sampling.continuous import (
    Inpaint,
    LogitTemperature,
    ScoreTemperature,
    gamma_grid,
    time_grid,
    trajectory_recorder,
)
from replaid.sampling.contract import Callback, SampleResult, StepInfo
from replaid.sampling.errors import RequestError, ref
from replaid.sampling.guidance import (
    ClassifierObjective,
    Guided,
    Objective,
    RequireTokens,
    parse_require,
    sum_objectives,
)
from replaid.sampling.infill import InfillPlan
from replaid.sampling.request import SampleRequest, prompt_ids

if TYPE_CHECKING:
    from replaid.store.loading import Run

__all__ = [
    "Batch",
    "DiscreteStart",
    "Start",
    "Starter",
    "denoiser_for",
    "required_words",
    "guidance_objective",
    "mark_filled",
]


def _no_extras(b: int, res: SampleResult) -> dict[str, Any]:
    return {}


def _nothing(res: SampleResult) -> None:
    return None


@dataclass
class Batch:
    """One batch of a request: the sampler's initial state and options, the callback it gets, the
    kind's own fields of row ``b`` (``extras``) and what follows the sampler call (``after``)."""

    state: Tensor  # (B, L, d_e) latent or (B, L) ids, on the model's device
    options: dict[str, Any]
    callback: Callback | None
    extras: Callable[[int, SampleResult], dict[str, Any]] = _no_extras
    after: Callable[[SampleResult], None] = _nothing


@dataclass
class Start:
    """A request set up for its kind: the network the sampler calls, its grid and generator, the step
    count each row reports, the text of a row's ids, and ``batch(B)`` (drawn in order: the batches of one
    request share the generator). ``rows``: the answer without any sampling (an edit at strength 0)."""

    net: Any
    grid: Tensor
    generator: torch.Generator | None
    steps: int
    batch: Callable[[int], Batch]
    text: Callable[[list[int]], str]
    rows: list[dict[str, Any]] | None = field(default=None)


Starter = Callable[[Any, SampleRequest, InfillPlan | None, int, str, Callback | None], Start]


def _both(a: Callback | None, b: Callback | None) -> Callback | None:
    if a is None or b is None:
        return a or b

    def call(info: StepInfo) -> None:
        a(info)
        b(info)

    return call


# ------------------------------------------------------------------ continuous


def denoiser_for(model: Any, request: SampleRequest) -> Denoiser:
    """The continuous model as the samplers see it: logit and score temperatures applied (identity at 1)."""
    den: Denoiser = model
    if request.temperature != 1.0:
        den = LogitTemperature(den, request.temperature)
    if request.score_temperature != 1.0:
        den = ScoreTemperature(den, request.score_temperature)
    return den


def required_words(tok: Any, req: SampleRequest) -> list[RequireTokens]:
    """The ``--require`` constraints as token objectives (the word's own tokenisation)."""
    out = []
    for spec in req.require:
        word, start, end = parse_require(spec)
        ids = tok.encode(word)
        if not ids:
            raise RequestError(f"{ref('require')} {spec!r}: the word has no tokens")
        out.append(RequireTokens(ids, start, end))
    return out


def guidance_objective(run: Run, req: SampleRequest, words: list[RequireTokens]) -> Objective | None:
    """The sum of the request's guidance objectives (required words, classifier label), or None."""
    objs: list[Objective] = list(words)
    if req.guide is not None:
        from replaid.training.classifier import load_classifier

        path, _, label = req.guide.rpartition(":")
        clf = load_classifier(path, run)
        dev = next(run.model.parameters()).device
        objs.append(ClassifierObjective(clf.to(dev).eval(), clf.label_index(label)))
    return sum_objectives(objs) if objs else None


def mark_filled(tok: Any, ids: list[int], known: list[bool]) -> str:
    """The sample's text with each generated span of an infilling request between ``[[`` and ``]]``."""
    out, i = [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and known[j] == known[i]:
            j += 1
        text = tok.decode(ids[i:j])
        out.append(text if known[i] else f"[[{text}]]")
        i = j
    return "".join(out)


def start_continuous(
    run: Run, req: SampleRequest, plan: InfillPlan | None, L: int, sampler: str, callback: Callback | None
) -> Start:
    model: Any = run.model  # a continuous denoiser (RePlaid, Plaid, LangFlow)
    tok = run.tokenizer
    dev = next(model.parameters()).device
    E = model.embedding_matrix().detach()
    den = denoiser_for(model, req)
    words = required_words(tok, req)
    objective = guidance_objective(run, req, words)
    if objective is not None:
        den = Guided(den, objective, req.guidance_scale)
    eplan = req.edit_plan(tok)
    if eplan is not None:
        L = len(eplan.ids)
    # SDEdit (Meng et al.): start at t = s with z_s = alpha_s e(text) + sigma_s eps, ceil(s T) steps
    s_edit = req.strength if eplan is not None else 1.0
    steps = max(1, math.ceil(s_edit * req.steps))

    def text(ids: list[int]) -> str:
        return tok.decode(ids) if eplan is None else eplan.text_of(tok, ids)

    if eplan is not None and req.strength == 0.0:  # the source text itself, exactly (no network call)
        row: dict[str, Any] = {"ids": eplan.ids.tolist(), "text": req.edit, "sampler": sampler, "steps": 0, "nfe": 0}
        row.update(seconds=0.0, batch_seconds=0.0, seed=req.seed, temperature=req.temperature, strength=0.0)
        return Start(den, torch.zeros(0), None, 0, _no_batch, text, rows=[dict(row) for _ in range(req.num)])
    gammas = gamma_grid(model.schedule, steps, t_start=s_edit)
    gen = device_generator(torch.Generator(device="cpu").manual_seed(req.seed), dev)  # draws on the device

    def batch(B: int) -> Batch:
        inpaint = None
        if eplan is not None and bool(eplan.known.any()):
            inpaint = Inpaint(eplan.ids.expand(B, -1).to(dev), eplan.known.expand(B, -1).to(dev), E)
        if req.prompt:
            ids = prompt_ids(tok, req.prompt, L)
            known = torch.arange(L) < len(ids)
            inpaint = Inpaint(
                torch.cat([ids, ids.new_zeros(L - len(ids))]).expand(B, -1).to(dev), known.expand(B, -1).to(dev), E
            )
        elif plan is not None:
            inpaint = Inpaint(plan.ids.expand(B, -1).to(dev), plan.known.expand(B, -1).to(dev), E)
        z = torch.randn(B, L, E.shape[1], generator=gen, device=dev)  # (B, L, d_e)
        if eplan is not None and s_edit < 1.0:
            a, sg = alpha_sigma(gammas[0])
            e = E[eplan.ids.to(dev)].expand(B, -1, -1)  # (B, L, d_e)
            z = (float(a) * e.double() + float(sg) * z.double()).to(z.dtype)  # z_s = alpha_s e + sigma_s eps
        rec = (
            trajectory_recorder(req.trajectory, decode=lambda t: [tok.decode(r.tolist()) for r in t])
            if req.trajectory
            else None
        )

        def extras(b: int, res: SampleResult) -> dict[str, Any]:
            row: dict[str, Any] = {}
            if plan is not None:
                row["filled"] = [list(s) for s in plan.fill_spans()]
                row["marked"] = mark_filled(tok, res.tokens[b].tolist(), plan.known.tolist())
            if eplan is not None:
                row["strength"] = req.strength
            if objective is not None:
                row["guidance_scale"] = req.guidance_scale
            if words:
                row["required"] = [bool(w.satisfied(res.tokens[b : b + 1])[0]) for w in words]
            if rec is not None:
                row["trajectory"] = [[i, txt[b]] for i, txt in rec.texts]
            return row

        def after(res: SampleResult) -> None:  # the readout, as one more frame
            if callback is not None:
                assert res.logits is not None  # a continuous sampler's readout
                callback(StepInfo(final=True, i=steps, T=steps, tokens=res.tokens, logits=res.logits, nfe=res.nfe))

        options = {"self_cond": None if req.self_cond else False, "inpaint": inpaint}
        options["disable_progress"] = not req.progress  # stderr, also with --json
        return Batch(z, options, _both(rec, callback), extras, after)

    return Start(den, gammas, gen, steps, batch, text)


def _no_batch(B: int) -> Batch:
    raise AssertionError("a request answered without sampling has no batches")


# ------------------------------------------------------------------ discrete


@dataclass(frozen=True)
class DiscreteStart:
    """A discrete kind's starter, declared by its parts:

    * ``initial(B, L, V, device, generator)``: the state (B, L) before the prompt is put in place;
    * ``on_device``: the generator (and every draw) lives on the model's device; else it is a CPU generator
      from which the sampler derives its device streams;
    * ``grid(req, n_prefix, L)``: the grid the sampler walks;
    * ``steps(req, L)``: the step count a row reports;
    * ``options(run, req, n_prefix, L)``: the sampler's own options (``temperature`` and
      ``disable_progress`` are set for every discrete sampler)."""

    initial: Callable[[int, int, int, torch.device, torch.Generator | None], Tensor]
    on_device: bool
    grid: Callable[[SampleRequest, int, int], Tensor]
    steps: Callable[[SampleRequest, int], int]
    options: Callable[[Any, SampleRequest, int, int], dict[str, Any]]

    def __call__(
        self,
        run: Run,
        req: SampleRequest,
        plan: InfillPlan | None,
        L: int,
        sampler: str,
        callback: Callback | None,
    ) -> Start:
        model: Any = run.model  # a TokenDiT (MDLM, Duo, AR)
        tok = run.tokenizer
        dev = next(model.parameters()).device
        V = int(model.n_out)
        gen: torch.Generator | None = torch.Generator().manual_seed(req.seed)
        if self.on_device:
            gen = device_generator(gen, dev)
        prefix = prompt_ids(tok, req.prompt, L) if req.prompt else torch.zeros(0, dtype=torch.long)
        n_pre = len(prefix)
        opts = {"temperature": req.temperature, "disable_progress": not req.progress}
        opts.update(self.options(run, req, n_pre, L))

        def batch(B: int) -> Batch:
            x = self.initial(B, L, V, dev, gen)
            if n_pre:
                x[:, :n_pre] = prefix.to(dev)
            return Batch(x, dict(opts), callback)

        return Start(model, self.grid(req, n_pre, L), gen, self.steps(req, L), batch, tok.decode)


def _time_grid(req: SampleRequest, n_prefix: int, L: int) -> Tensor:
    return time_grid(req.steps)  # (T + 1,) float64, 1 -> 0


def _req_steps(req: SampleRequest, L: int) -> int:
    return req.steps


start_masked = DiscreteStart(
    initial=lambda B, L, V, dev, gen: torch.full((B, L), V, dtype=torch.long, device=dev),  # all [MASK] (id V)
    on_device=False,
    grid=_time_grid,
    steps=_req_steps,
    options=lambda run, req, n, L: {},
)
start_uniform = DiscreteStart(
    initial=lambda B, L, V, dev, gen: torch.randint(0, V, (B, L), generator=gen, device=dev),  # uniform noise
    on_device=True,
    grid=_time_grid,
    steps=_req_steps,
    options=lambda run, req, n, L: {"known": (torch.arange(L) < n) if n else None},  # the prompt stays
)
start_autoregressive = DiscreteStart(
    initial=lambda B, L, V, dev, gen: torch.zeros(B, L, dtype=torch.long, device=dev),
    on_device=False,
    grid=lambda req, n, L: torch.arange(n, L + 1),  # tokens filled so far: one step per generated token
    steps=lambda req, L: L,
    options=lambda run, req, n, L: {"top_p": run.cfg.ar.top_p if req.top_p is None else req.top_p},
)
