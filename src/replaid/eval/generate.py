"""Generation from a trained run through the k-diffusion-style samplers (``replaid sample``)."""
from __future__ import annotations

import time

import torch

from replaid.diffusion.rng import device_generator
from tqdm.auto import tqdm

from replaid.config import ConfigError
from replaid.diffusion.samplers import (Inpaint, LogitTemperature, ScoreTemperature, gamma_grid, get_sampler,
                                        prefix_inpaint, trajectory_recorder)
from replaid.eval.infill import InfillPlan, plan_infill

DEFAULT_SAMPLER = "ddpm"


def check_sample_args(run, args) -> InfillPlan | None:
    """Refuse options the run cannot honour (before any sampling); returns the infilling plan, if any."""
    method = run.cfg.method
    continuous = hasattr(run.model, "schedule")
    L = args.length or run.cfg.data.seq_len
    infill, chars = getattr(args, "infill", None), getattr(args, "infill_chars", None)
    if not continuous:
        own = "its own ancestral sampler" if method != "ar" else "left-to-right ancestral sampling"
        if args.sampler not in (None, "ancestral"):
            raise ValueError(f"--sampler {args.sampler} is for RePlaid/Plaid runs; this '{method}' run samples with "
                             f"{own}: drop --sampler")
        for flag, used in (("--context/--infill", args.context or infill or chars),
                           ("--score-temperature", args.score_temperature != 1.0),
                           ("--trajectory", args.trajectory), ("--no-self-cond", args.no_self_cond)):
            if used:
                raise ValueError(f"{flag} needs a RePlaid/Plaid run; this '{method}' run samples with {own}")
    if args.prompt and (args.context or infill or chars):
        raise ValueError("--prompt and --context are two kinds of conditioning: give one (a prompt is "
                         "the context 'PROMPT[MASK:N]')")
    if args.prompt:
        prompt_ids(run.tokenizer, args.prompt, L)  # raises when it leaves nothing to generate
    if (infill or chars) and not args.context:
        raise ValueError("--infill/--infill-chars need --context TEXT whose tokens are kept outside the spans")
    if args.context:
        return plan_infill(run.tokenizer, args.context, infill, chars, args.length)
    return None


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


def prompt_ids(tok, prompt: str, L: int) -> torch.Tensor:
    """The prompt's token ids (P,), which must leave room for at least one generated token."""
    ids = tok.encode(prompt)
    if len(ids) >= L:
        raise ConfigError(f"--prompt is {len(ids)} tokens but samples are {L} long, leaving nothing to generate; "
                          f"shorten the prompt or pass a larger --length")
    return torch.tensor(ids, dtype=torch.long)


def tempered(model, temperature: float = 1.0, score_temperature: float = 1.0):
    """The denoiser with the logit and score temperatures applied (the identity at 1.0)."""
    den = model
    if temperature != 1.0:
        den = LogitTemperature(den, temperature)
    if score_temperature != 1.0:
        den = ScoreTemperature(den, score_temperature)
    return den


@torch.no_grad()
def generate(run, args) -> list[dict]:
    """Draw ``args.num`` samples; returns rows with ids, text, sampler, steps, nfe, seconds (and, when
    infilling, the ``filled`` positions). Options the run cannot honour raise a ValueError first."""
    model, tok, cfg = run.model, run.tokenizer, run.cfg
    plan = check_sample_args(run, args)
    if not hasattr(model, "schedule"):
        return run.method.sample_rows(run, args)  # methods with their own samplers (AR, MDLM, Duo)
    sampler_name = args.sampler or DEFAULT_SAMPLER
    L = len(plan.ids) if plan is not None else args.length or cfg.data.seq_len
    dev = next(model.parameters()).device
    E = model.embedding_matrix().detach()
    den = tempered(model, args.temperature, args.score_temperature)
    sampler = get_sampler(sampler_name)
    gammas = gamma_grid(model.schedule, args.steps)
    gen = device_generator(torch.Generator(device="cpu").manual_seed(args.seed), dev)  # draws on the device
    rows = []
    done = 0
    while done < args.num:
        B = min(args.batch_size, args.num - done)
        inpaint = None
        if args.prompt:
            ids = prompt_ids(tok, args.prompt, L)
            inpaint = prefix_inpaint(ids.expand(B, -1).to(dev), L, E)
        elif plan is not None:
            inpaint = Inpaint(plan.ids.expand(B, -1).to(dev), plan.known.expand(B, -1).to(dev), E)
        z = torch.randn(B, L, E.shape[1], generator=gen, device=dev)
        rec = trajectory_recorder(args.trajectory, decode=lambda t: [tok.decode(r.tolist()) for r in t]) \
            if args.trajectory else None
        t0 = time.time()
        res = sampler(den, z, gammas, generator=gen, callback=rec,
                      self_cond=False if args.no_self_cond else None, inpaint=inpaint,
                      disable_progress=not getattr(args, "progress", True))  # stderr, also with --json
        secs = time.time() - t0
        for b in range(B):
            ids = res.tokens[b].tolist()
            row = {"ids": ids, "text": tok.decode(ids), "sampler": sampler_name, "steps": args.steps,
                   "nfe": res.nfe, "seconds": secs / B, "batch_seconds": secs, "seed": args.seed,
                   "temperature": args.temperature}
            if plan is not None:
                row["filled"] = [list(s) for s in plan.fill_spans()]
                row["marked"] = mark_filled(tok, ids, plan.known.tolist())
            if rec is not None:
                row["trajectory"] = [[i, txt[b]] for i, txt in rec.texts]
            rows.append(row)
        done += B
    return rows


def ancestral_rows(run, args, draw, steps: int) -> list[dict]:
    """Batched generation for methods with their own ancestral sampler (AR, MDLM, Duo).

    ``draw(B, L, generator, prefix)`` returns ``(ids (B, L), nfe)``; ``prefix`` is the tokenised
    ``--prompt`` expanded to (B, P), or None.
    """
    tok = run.tokenizer
    L = args.length or run.cfg.data.seq_len
    gen = torch.Generator().manual_seed(args.seed)
    prefix = None
    if getattr(args, "prompt", None):
        prefix = prompt_ids(tok, args.prompt, L)
    rows, done = [], 0
    bar = tqdm(total=args.num, desc=f"sampling ({run.cfg.method})", unit="sample",
               disable=not getattr(args, "progress", True))  # stderr
    while done < args.num:
        B = min(args.batch_size, args.num - done)
        t0 = time.time()
        ids, nfe = draw(B, L, gen, None if prefix is None else prefix.expand(B, -1))
        bar.update(B)
        secs = time.time() - t0
        for b in range(B):
            r = ids[b].tolist()
            rows.append({"ids": r, "text": tok.decode(r), "sampler": "ancestral", "steps": steps, "nfe": nfe,
                         "seconds": secs / B, "batch_seconds": secs, "seed": args.seed,
                         "temperature": args.temperature})
        done += B
    bar.close()
    return rows
