"""``generate(run, request, callback=None)``: the one way a loaded run makes samples.

``replaid sample``, ``replaid sweep`` and the playground (``web/engine.py``) all call it. It checks the
request against the run's method (:meth:`SampleRequest.check`), then draws ``request.num`` samples in
batches of ``request.batch_size`` with the registered sampler (:mod:`replaid.sampling.registry`):

* continuous methods: ``z ~ N(0, I)`` (B, L, d_e) on the model's device, the noise grid
  ``gamma(t_i)`` of the run's schedule, the denoiser wrapped by :func:`denoiser_for` (temperatures:
  the extension point for guidance terms), prompts and infilling templates by replacement
  (:class:`~replaid.sampling.continuous.Inpaint`);
* masked / uniform / autoregressive methods: their initial state (all [MASK]; uniform noise; the
  prompt) and time grid, prompts as a fixed prefix.

``callback`` receives every step's dict from the sampler (documented on each sampler), and for
continuous methods one more ``{"final": True, "i": T, "T": T, "tokens", "logits"}`` per batch with the
readout. Rows hold ids, text, sampler, steps, nfe, seconds, batch_seconds, seed, temperature (and,
when infilling, ``filled`` / ``marked``; with ``trajectory``, the recorded texts).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from replaid.diffusion.denoiser import Denoiser, alpha_sigma
from replaid.diffusion.rng import device_generator
from replaid.methods.base import Kind
from replaid.sampling.continuous import (
    Inpaint,
    LogitTemperature,
    ScoreTemperature,
    gamma_grid,
    time_grid,
    trajectory_recorder,
)
from replaid.sampling.guidance import (
    ClassifierObjective,
    Guided,
    Objective,
    RequireTokens,
    parse_require,
    sum_objectives,
)
from replaid.sampling.infill import EditPlan, InfillPlan
from replaid.sampling.registry import get_sampler
from replaid.sampling.request import SampleRequest, prompt_ids

Callback = Callable[[dict], None]


def denoiser_for(model, request: SampleRequest) -> Denoiser:
    """The continuous model as the samplers see it: logit and score temperatures applied (identity at 1)."""
    den = model
    if request.temperature != 1.0:
        den = LogitTemperature(den, request.temperature)
    if request.score_temperature != 1.0:
        den = ScoreTemperature(den, request.score_temperature)
    return den


def required_words(tok, req: SampleRequest) -> list[RequireTokens]:
    """The ``--require`` constraints as token objectives (the word's own tokenisation)."""
    out = []
    for spec in req.require:
        word, start, end = parse_require(spec)
        ids = tok.encode(word)
        if not ids:
            raise ValueError(f"--require {spec!r}: the word has no tokens")
        out.append(RequireTokens(ids, start, end))
    return out


def guidance_objective(run, req: SampleRequest, words: list[RequireTokens]) -> Optional[Objective]:
    """The sum of the request's guidance objectives (required words, classifier label), or None."""
    objs: list[Objective] = list(words)
    if req.guide is not None:
        from replaid.training.classifier import load_classifier

        path, _, label = req.guide.rpartition(":")
        clf = load_classifier(path, run)
        dev = next(run.model.parameters()).device
        objs.append(ClassifierObjective(clf.to(dev).eval(), clf.label_index(label)))
    return sum_objectives(objs) if objs else None


def mark_filled(tok, ids: list[int], known: list[bool]) -> str:
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


def _both(a: Optional[Callback], b: Optional[Callback]) -> Optional[Callback]:
    if a is None or b is None:
        return a or b

    def call(info: dict) -> None:
        a(info)
        b(info)

    return call


@torch.no_grad()
def generate(run, request: SampleRequest, callback: Optional[Callback] = None) -> list[dict]:
    """Draw ``request.num`` samples from ``run`` (a :class:`replaid.training.loading.Run`); returns one
    row per sample (module docstring). A request the run cannot honour raises a one-line error first."""
    method = run.method
    plan = request.check(method, run.tokenizer, run.cfg.data.seq_len)
    L = request.length_for(run.cfg.data.seq_len, plan)
    sampler = get_sampler(method, request.sampler)
    check_memory(run, request, L)
    if method.kind is Kind.CONTINUOUS:
        return _continuous(run, request, sampler, plan, L, callback)
    return _discrete(run, request, sampler, L, callback)


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


def _continuous(
    run, req: SampleRequest, sampler, plan: Optional[InfillPlan], L: int, callback: Optional[Callback]
) -> list[dict]:
    model, tok = run.model, run.tokenizer
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
        if req.strength == 0.0:
            return _unchanged(req, eplan, sampler.name)
    # SDEdit (Meng et al.): start at t = s with z_s = alpha_s e(text) + sigma_s eps, ceil(s T) steps
    s_edit = req.strength if eplan is not None else 1.0
    steps = max(1, math.ceil(s_edit * req.steps))
    gammas = gamma_grid(model.schedule, steps, t_start=s_edit)
    gen = device_generator(torch.Generator(device="cpu").manual_seed(req.seed), dev)  # draws on the device
    rows: list[dict] = []
    done = 0
    while done < req.num:
        B = min(req.batch_size, req.num - done)
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
        t0 = time.time()
        res = sampler.fn(
            den,
            z,
            gammas,
            generator=gen,
            callback=_both(rec, callback),
            self_cond=None if req.self_cond else False,
            inpaint=inpaint,
            disable_progress=not req.progress,
        )  # stderr, also with --json
        secs = time.time() - t0
        if callback is not None:
            callback({"final": True, "i": steps, "T": steps, "tokens": res.tokens, "logits": res.logits})
        for b in range(B):
            ids_b = res.tokens[b].tolist()
            row = {
                "ids": ids_b,
                "text": tok.decode(ids_b) if eplan is None else eplan.text_of(tok, ids_b),
                "sampler": sampler.name,
                "steps": steps,
                "nfe": res.nfe,
                "seconds": secs / B,
                "batch_seconds": secs,
                "seed": req.seed,
                "temperature": req.temperature,
            }
            if plan is not None:
                row["filled"] = [list(s) for s in plan.fill_spans()]
                row["marked"] = mark_filled(tok, ids_b, plan.known.tolist())
            if eplan is not None:
                row["strength"] = req.strength
            if objective is not None:
                row["guidance_scale"] = req.guidance_scale
            if words:
                row["required"] = [bool(w.satisfied(res.tokens[b : b + 1])[0]) for w in words]
            if rec is not None:
                row["trajectory"] = [[i, txt[b]] for i, txt in rec.texts]
            rows.append(row)
        done += B
    return rows


def _unchanged(req: SampleRequest, eplan: EditPlan, sampler: str) -> list[dict]:
    """An edit at strength 0: the source text itself, exactly (no network call)."""
    ids = eplan.ids.tolist()
    row = {"ids": ids, "text": req.edit, "sampler": sampler, "steps": 0, "nfe": 0, "seconds": 0.0}
    row.update(batch_seconds=0.0, seed=req.seed, temperature=req.temperature, strength=0.0)
    return [dict(row) for _ in range(req.num)]


def _discrete(run, req: SampleRequest, sampler, L: int, callback: Optional[Callback]) -> list[dict]:
    """MDLM / Duo / AR: their initial state, grid and prefix (the prompt), batch by batch."""
    method, model, tok = run.method, run.model, run.tokenizer
    kind = method.kind
    dev = next(model.parameters()).device
    V = model.n_out
    gen = torch.Generator().manual_seed(req.seed)
    prefix = prompt_ids(tok, req.prompt, L) if req.prompt else torch.zeros(0, dtype=torch.long)
    n_pre = len(prefix)
    steps = L if kind is Kind.AUTOREGRESSIVE else req.steps
    ts = time_grid(req.steps)
    top_p = run.cfg.ar.top_p if req.top_p is None else req.top_p
    rows: list[dict] = []
    done = 0
    bar = tqdm(total=req.num, desc=f"sampling ({method.name})", unit="sample", disable=not req.progress)  # stderr
    while done < req.num:
        B = min(req.batch_size, req.num - done)
        t0 = time.time()
        if kind is Kind.MASKED:
            x = torch.full((B, L), V, dtype=torch.long, device=dev)
            if n_pre:
                x[:, :n_pre] = prefix.to(dev)
            ids, nfe = sampler.fn(model, x, ts, generator=gen, temperature=req.temperature, callback=callback)
        elif kind is Kind.UNIFORM:
            g = device_generator(gen, dev)  # all draws on the model's device
            x = torch.randint(0, V, (B, L), generator=g, device=dev)
            if n_pre:
                x[:, :n_pre] = prefix.to(dev)
            ids, nfe = sampler.fn(
                model,
                x,
                ts,
                generator=g,
                temperature=req.temperature,
                known=(torch.arange(L) < n_pre) if n_pre else None,
                callback=callback,
            )
        else:
            x = torch.zeros(B, L, dtype=torch.long, device=dev)
            if n_pre:
                x[:, :n_pre] = prefix.to(dev)
            ids, nfe = sampler.fn(
                model, x, n_pre, generator=gen, temperature=req.temperature, top_p=top_p, callback=callback
            )
        bar.update(B)
        secs = time.time() - t0
        for b in range(B):
            r = ids[b].tolist()
            rows.append(
                {
                    "ids": r,
                    "text": tok.decode(r),
                    "sampler": sampler.name,
                    "steps": steps,
                    "nfe": nfe,
                    "seconds": secs / B,
                    "batch_seconds": secs,
                    "seed": req.seed,
                    "temperature": req.temperature,
                }
            )
        done += B
    bar.close()
    return rows
