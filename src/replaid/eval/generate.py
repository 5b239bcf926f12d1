"""Generation from a trained run through the k-diffusion-style samplers (``replaid sample``)."""
from __future__ import annotations

import time

import torch

from replaid.config import ConfigError

from replaid.diffusion.samplers import (LogitTemperature, ScoreTemperature, gamma_grid, get_sampler, infill_inpaint,
                       prefix_inpaint, trajectory_recorder)


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
    """Draw ``args.num`` samples; returns rows with ids, text, sampler, steps, nfe, seconds."""
    model, tok, cfg = run.model, run.tokenizer, run.cfg
    if not hasattr(model, "schedule"):
        return run.method.sample_rows(run, args)  # methods with their own samplers (AR, MDLM, Duo)
    L = args.length or cfg.data.seq_len
    dev = next(model.parameters()).device
    E = model.embedding_matrix().detach()
    den = tempered(model, args.temperature, args.score_temperature)
    sampler = get_sampler(args.sampler)
    gammas = gamma_grid(model.schedule, args.steps)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    rows = []
    done = 0
    while done < args.num:
        B = min(args.batch_size, args.num - done)
        inpaint = None
        if args.prompt:
            ids = prompt_ids(tok, args.prompt, L)
            inpaint = prefix_inpaint(ids.expand(B, -1).to(dev), L, E)
        elif args.infill:
            if not args.context:
                raise ValueError("--infill needs --context TEXT whose tokens are kept outside the spans")
            ids = tok.encode(args.context)[:L]
            ids = ids + [tok.eos_id] * (L - len(ids))
            inpaint = infill_inpaint(torch.tensor(ids, dtype=torch.long).expand(B, -1).to(dev), args.infill, E)
        z = torch.randn(B, L, E.shape[1], generator=gen).to(dev)
        rec = trajectory_recorder(args.trajectory, decode=lambda t: [tok.decode(r.tolist()) for r in t]) \
            if args.trajectory else None
        t0 = time.time()
        res = sampler(den, z, gammas, generator=gen, callback=rec,
                      self_cond=False if args.no_self_cond else None, inpaint=inpaint,
                      disable_progress=bool(args.json))
        secs = time.time() - t0
        for b in range(B):
            ids = res.tokens[b].tolist()
            row = {"ids": ids, "text": tok.decode(ids), "sampler": args.sampler, "steps": args.steps,
                   "nfe": res.nfe, "seconds": secs / B, "batch_seconds": secs, "seed": args.seed,
                   "temperature": args.temperature}
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
    while done < args.num:
        B = min(args.batch_size, args.num - done)
        t0 = time.time()
        ids, nfe = draw(B, L, gen, None if prefix is None else prefix.expand(B, -1))
        secs = time.time() - t0
        for b in range(B):
            r = ids[b].tolist()
            rows.append({"ids": r, "text": tok.decode(r), "sampler": "ancestral", "steps": steps, "nfe": nfe,
                         "seconds": secs / B, "batch_seconds": secs, "seed": args.seed,
                         "temperature": args.temperature})
        done += B
    return rows
