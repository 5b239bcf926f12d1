"""Generation for the playground: one request -> a stream of display frames.

A frame is what the page draws for one sampler step: per sample and position the token shown, the
model's confidence in it, and which positions were given by the user (kept). What "the token
shown" is depends on the method, so every method is drawn the same way:

* continuous diffusion (RePlaid, Plaid): the argmax of the denoiser's logits at ``gammas[i]``
  (its current best guess of the clean text) and its softmax probability, from the sampler's
  per-step ``callback`` (k-diffusion style), then one ``final`` frame with the readout at
  ``gammas[T]`` (the returned tokens): T + 1 frames; given positions show the given tokens;
* MDLM: the current state ``z_s``; still-masked positions are ``MASK``; an unmasked token keeps the
  probability ``x_theta`` gave it when it was drawn;
* Duo: the current state ``z_s`` (uniform noise at the start) and ``x_theta`` of that token;
* AR: the tokens so far (later positions ``EMPTY``) and the probability each was drawn with.

Every request goes through :func:`replaid.sampling.generate` (as ``replaid sample`` does) with a
step callback that turns the sampler's state into frames: the same run, seed and settings give the
same final text (tested). An Edit request (:class:`EditRequest`) is the same path with the
``SampleRequest`` of ``replaid edit`` (SDEdit: ``edit``, ``strength``, ``edit_chars`` / ``edit_span``):
its frames start from the given text, and the positions outside the spans are kept (grey). Guidance
(``require``, ``classifier`` + ``label``, ``guidance_scale``) sets the same ``SampleRequest`` fields as
``--require``, ``--guide`` and ``--guidance-scale``; a request names a classifier by the id the server
gave it (:class:`Guide`), never by a path.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from replaid.methods.base import Kind
from replaid.sampling.generate import generate
from replaid.sampling.infill import EditPlan, InfillPlan
from replaid.sampling.registry import get_sampler
from replaid.sampling.request import RequestLimits, SampleRequest, prompt_ids

MASK, EMPTY = -1, -2  # display ids: a masked position (MDLM), a not-yet-generated one (AR)
_GAP = re.compile(r"\[\[\s*(\d*)\s*\]\]")  # an infill gap in the text box: [[8]] = 8 tokens to fill
DEFAULT_GAP = 8
CLASSIFIER_SKIP = {"checkpoints", "tb", "tokenizer"}


class Cancelled(Exception):
    """Raised from the step callback when the page that asked went away."""


MAX_BODY = 1 << 20  # 1 MiB: a request is a few fields and a text of at most max_length tokens


@dataclass
class Limits:
    """Per-request bounds (``replaid serve`` options)."""

    max_steps: int = 1024
    max_samples: int = 4
    max_length: int = 0  # 0: the run's training length data.seq_len
    max_queue: int = 8  # waiting requests per run
    max_body: int = MAX_BODY  # bytes of a request body (more: HTTP 413, refused before it is read)
    max_tokens: int = 0  # /v1/completions' max_tokens (0: 8 x the run's data.seq_len)

    def request_limits(self) -> RequestLimits:
        """The bounds :meth:`SampleRequest.check` applies to every request of this server."""
        return RequestLimits(max_steps=self.max_steps, max_num=self.max_samples, max_length=self.max_length or None)


_TYPES = {"str": str, "int": int, "float": float}


class _Fields:
    """``from_dict``: a JSON object -> the request dataclass, every field type-checked (one line)."""

    @classmethod
    def from_dict(cls, d: dict):
        if not isinstance(d, dict):
            raise ValueError("the request body must be a JSON object")
        names = {f.name: f for f in cls.__dataclass_fields__.values()}  # type: ignore[attr-defined]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}; fields are {', '.join(names)}")
        if "run" not in d:
            raise ValueError("missing field 'run'")
        kw = {}
        for k, v in d.items():
            tname = names[k].type
            if tname == "list[str]":
                if isinstance(v, str):
                    v = [v] if v else []
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise ValueError(f"field {k!r} must be a list of strings, got {v!r}")
                kw[k] = list(v)
                continue
            typ = _TYPES[tname]
            if typ is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if typ is int and isinstance(v, str) and v.strip().lstrip("-").isdigit():
                v = int(v)
            if typ is float and isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    pass
            if not isinstance(v, typ) or isinstance(v, bool):
                raise ValueError(f"field {k!r} must be {tname}, got {v!r}")
            kw[k] = v
        return cls(**kw)


@dataclass
class GenRequest(_Fields):
    """One generation: what the Generate form sends. Validated by :meth:`check`."""

    run: str
    sampler: str = "ddpm"
    steps: int = 64
    temperature: float = 1.0  # logit temperature
    score_temperature: float = 1.0  # Plaid's score temperature (continuous methods only)
    seed: int = 0
    length: int = 0  # 0: the run's data.seq_len
    samples: int = 1
    text: str = ""  # "" unconditional; plain text = prompt prefix; text with [[n]] gaps = infill
    require: list[str] = field(default_factory=list)  # token guidance: WORD, WORD@P or WORD@A:B (--require)
    classifier: str = ""  # classifier guidance: a classifier id from /api/runs (--guide CLF:LABEL)
    label: str = ""  # ... and its label
    guidance_scale: float = 1.0  # w (--guidance-scale)


@dataclass
class EditRequest(_Fields):
    """One edit (SDEdit, ``replaid edit``): what the Edit form sends."""

    run: str
    text: str = ""  # the text to edit (--text)
    strength: float = 0.5  # s in [0, 1] (--strength)
    spans: str = ""  # character spans to re-noise, A:B[,C:D] (--span); "" with no token_spans: all of it
    token_spans: str = ""  # token-position spans to re-noise (--token-span)
    sampler: str = "ddpm"
    steps: int = 64  # T of a full run; an edit takes ceil(s T)
    temperature: float = 1.0
    score_temperature: float = 1.0
    seed: int = 0
    samples: int = 1
    require: list[str] = field(default_factory=list)
    classifier: str = ""
    label: str = ""
    guidance_scale: float = 1.0


Request = Union[GenRequest, EditRequest]


@dataclass
class Guide:
    """A latent classifier the server offers for a run: ``id`` (what requests name), its folder, labels."""

    id: str
    path: Path
    labels: list[str]


def classifier_meta(path: Path) -> dict:
    """``classifier.json`` of a classifier folder (labels, embedding fingerprint); one line when unreadable."""
    f = Path(path) / "classifier.json"
    if not f.is_file() or not (Path(path) / "classifier.safetensors").is_file():
        raise ValueError(
            f"--classifier {path}: no classifier.json + classifier.safetensors there "
            "(replaid classifier train RUN --data LABELLED.jsonl --out DIR writes them)"
        )
    try:
        meta = json.loads(f.read_text())
        meta["labels"] = [str(x) for x in meta["labels"]]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"--classifier {path}: damaged classifier.json; train it again") from None
    return meta


def find_classifiers(run_dir: Path, limit: int = 50) -> list[Path]:
    """Classifier folders (``classifier.json``) under a run folder, checkpoints excluded."""
    out = []
    for f in sorted(Path(run_dir).rglob("classifier.json")):
        rel = f.parent.relative_to(run_dir)
        if rel.parts and rel.parts[0] in CLASSIFIER_SKIP:
            continue
        out.append(f.parent)
    return out[:limit]


def guides_for(run, run_dir: Path, extra: list[Path]) -> dict[str, Guide]:
    """The classifiers offered for ``run``: those under its folder and those given (``--classifier``)
    whose embedding fingerprint matches the run's (a classifier only steers the run it was trained on).
    Ids: the path under the run folder, or the folder's name, made unique."""
    from replaid.training.classifier import embedding_fingerprint

    fp = embedding_fingerprint(run.model.embedding_matrix())
    out: dict[str, Guide] = {}
    seen: set[Path] = set()
    for p in find_classifiers(run_dir) + list(extra):
        p = Path(p).resolve()
        if p in seen:
            continue
        seen.add(p)
        try:
            meta = classifier_meta(p)
        except ValueError:
            if p in [Path(x).resolve() for x in extra]:
                raise
            continue  # a damaged classifier under the run folder is skipped
        if meta.get("embedding_fingerprint") != fp:
            continue
        try:
            base = str(p.relative_to(Path(run_dir).resolve()))
        except ValueError:
            base = p.name
        name, k = base, 2
        while name in out:
            name, k = f"{base}-{k}", k + 1
        out[name] = Guide(name, p, meta["labels"])
    return out


def samplers_for(run) -> list[str]:
    """Sampler names the playground offers for a run: those its method declares."""
    return list(run.method.samplers)


def check(req: Request, run) -> None:
    """What only the playground's forms can get wrong (one line each); every sampling field is the
    :class:`SampleRequest`'s, checked by :meth:`SampleRequest.check` with the server's :class:`Limits`."""
    if isinstance(req, EditRequest) and run.method.kind is not Kind.CONTINUOUS:
        raise ValueError(
            f"editing needs a continuous-diffusion run (replaid, plaid); {req.run!r} is a {run.cfg.method} run"
        )
    if run.method.block_size():
        raise ValueError(
            f"{req.run!r} is a block-diffusion run ({run.cfg.method}, blocks of {run.method.block_size()} tokens): "
            "it writes text block by block, served at POST /v1/completions (docs/playground/README.md)"
        )
    if len(req.text) > 20000:
        raise ValueError("text is longer than 20000 characters")


@dataclass
class Template:
    """The text box parsed: ``ids`` (L,) with ``known`` (L,) True on given positions."""

    ids: list[int]
    known: list[bool]
    mode: str  # unconditional | prompt | infill


def parse_text(text: str, tok, L: int, max_len: int) -> Template:
    """``""`` -> unconditional length L; text without gaps -> a prompt prefix of a length-L
    sequence; text with ``[[n]]`` gaps -> exactly the template (each kept piece tokenised on its
    own, each gap n positions, ``[[]]`` = 8), its length capped at ``max_len``."""
    if not text.strip():
        return Template([0] * L, [False] * L, "unconditional")
    parts = _GAP.split(text)  # kept, n, kept, n, ..., kept
    if len(parts) == 1:
        ids = prompt_ids(tok, text, L).tolist()  # the request's own message when it leaves nothing to generate
        return Template(ids + [0] * (L - len(ids)), [True] * len(ids) + [False] * (L - len(ids)), "prompt")
    ids: list[int] = []
    known: list[bool] = []
    for k, part in enumerate(parts):
        if k % 2 == 0:
            piece = tok.encode(part) if part else []
            ids += piece
            known += [True] * len(piece)
        else:
            n = int(part) if part else DEFAULT_GAP
            if n < 1:
                raise ValueError("an infill gap [[n]] needs n >= 1")
            ids += [0] * n
            known += [False] * n
    if len(ids) > max_len:
        raise ValueError(f"the infill template is {len(ids)} tokens; the limit is {max_len}")
    return Template(ids, known, "infill")


@dataclass
class Prepared:
    """A validated request: the ``SampleRequest`` given to :func:`generate`, the positions' ids and
    which of them are given (kept), the mode (unconditional | prompt | infill | edit), the edit plan."""

    request: SampleRequest
    ids: list[int]
    known: list[bool]
    mode: str
    edit: Optional[EditPlan] = None


def guide_of(req: Request, guides: dict[str, Guide]) -> Optional[str]:
    """``--guide CLF_DIR:LABEL`` of the request's classifier id and label (both checked), or None."""
    if not req.classifier:
        if req.label:
            raise ValueError("a label needs a classifier: choose one (classifier guidance)")
        return None
    g = guides.get(req.classifier)
    if g is None:
        known = ", ".join(guides) or "none (replaid serve --classifier DIR, or classifiers under the run folder)"
        raise ValueError(f"unknown classifier {req.classifier!r} for run {req.run!r}; this server offers {known}")
    if req.label not in g.labels:
        raise ValueError(f"label {req.label!r} is not one of classifier {g.id!r}'s labels: {', '.join(g.labels)}")
    return f"{g.path}:{req.label}"


def prepare(req: Request, run, limits: Limits, guides: Optional[dict[str, Guide]] = None) -> Prepared:
    """Validates ``req`` for ``run`` (:func:`check`, then :meth:`SampleRequest.check` with the server's
    limits: the CLI's own checks and messages) and builds its :class:`Prepared` request."""
    check(req, run)
    cfg = run.cfg
    bounds = limits.request_limits()
    guide = guide_of(req, guides or {})
    max_len = limits.max_length or cfg.data.seq_len
    common = dict(
        sampler=req.sampler,
        steps=req.steps,
        num=req.samples,
        batch_size=req.samples,
        temperature=req.temperature,
        score_temperature=req.score_temperature,
        seed=req.seed,
        progress=False,
        allow_longer=True,  # the length is checked against the limits here
        require=tuple(req.require),
        guide=guide,
        guidance_scale=req.guidance_scale,
    )
    if isinstance(req, EditRequest):
        sreq = SampleRequest(
            **common,
            edit=req.text,
            strength=req.strength,
            edit_chars=req.spans.strip() or None,
            edit_span=req.token_spans.strip() or None,
        )
        bounds.check(sreq, cfg.data.seq_len)  # the server's limits
        eplan = sreq.edit_plan(run.tokenizer) if req.text else None
        if eplan is not None and len(eplan.ids) > max_len:
            raise ValueError(f"the text is {len(eplan.ids)} tokens; the limit is {max_len}")
        sreq.check(run.method, run.tokenizer, cfg.data.seq_len)  # empty text, strength, spans: the CLI's messages
        assert eplan is not None
        return Prepared(sreq, eplan.ids.tolist(), eplan.known.tolist(), "edit", eplan)
    asked = SampleRequest(**common, length=req.length or None)
    bounds.check(asked, cfg.data.seq_len)  # the server's limits, before the text is laid out at that length
    tpl = parse_text(
        req.text, run.tokenizer, asked.length_for(cfg.data.seq_len), max_len
    )  # the one default-length rule
    if tpl.mode == "infill" and run.method.kind is not Kind.CONTINUOUS:
        raise ValueError(
            f"infill needs a continuous-diffusion run (replaid, plaid); {req.run!r} is a {cfg.method} "
            "run: give a prompt instead"
        )
    sreq = sample_request(req, tpl, **common)
    sreq.check(run.method, run.tokenizer, cfg.data.seq_len)  # the limits were checked on ``asked``
    return Prepared(sreq, tpl.ids, tpl.known, tpl.mode)


@dataclass
class Result:
    ids: list[list[int]]
    texts: list[str]
    nfe: int
    steps: int
    seconds: float
    first_step_seconds: Optional[float]
    mode: str
    frames: list[dict] = field(default_factory=list)


class _Framer:
    """Turns per-step sampler state into display frames and hands them to ``emit``."""

    def __init__(
        self,
        emit: Callable[[dict], None],
        cancelled: Callable[[], bool],
        tok,
        known: torch.Tensor,
        known_ids: torch.Tensor,
    ):
        self.emit, self.cancelled, self.tok = emit, cancelled, tok
        self.known, self.known_ids = known, known_ids  # (L,) bool, (L,) long
        self.sent: set[int] = set()
        self.t0 = time.perf_counter()
        self.first: Optional[float] = None
        self.nfe = 0

    def strings(self, ids: torch.Tensor) -> dict[str, str]:
        """Display strings of the token ids not yet sent on this stream."""
        new = {}
        for i in set(ids.flatten().tolist()) - self.sent:
            if i >= 0:
                new[str(i)] = self.tok.decode([i])
        self.sent.update(int(k) for k in new)
        return new

    def frame(self, i: int, T: int, ids: torch.Tensor, conf: torch.Tensor, final: bool = False) -> None:
        """ids (B, L) long display ids, conf (B, L) float in [0, 1]; ``final`` marks the readout."""
        if self.cancelled():
            raise Cancelled()
        ids = torch.where(self.known, self.known_ids, ids.cpu())
        conf = torch.where(self.known, torch.ones((), dtype=conf.dtype), conf.cpu())
        now = time.perf_counter() - self.t0
        if self.first is None:
            self.first = now
        self.emit(
            {
                "type": "step",
                "i": i + 1,
                "T": T,
                "final": final,
                "ids": ids.tolist(),
                "conf": (conf * 100).round().to(torch.int64).clamp(0, 100).tolist(),
                "tokens": self.strings(ids),
                "seconds": round(now, 4),
                "nfe": self.nfe or None,
            }
        )


def _count_calls(module: torch.nn.Module, framer: _Framer):
    def hook(*_):
        framer.nfe += 1

    return module.register_forward_hook(hook)


def sample_request(req: GenRequest, tpl: Template, **common) -> SampleRequest:
    """The :class:`~replaid.sampling.request.SampleRequest` of a playground request (one batch);
    ``common``: the fields :func:`prepare` sets for every request."""
    prompt = infill = None
    if tpl.mode == "prompt":
        prompt = req.text
    elif tpl.mode == "infill":
        infill = InfillPlan(torch.tensor(tpl.ids, dtype=torch.long), torch.tensor(tpl.known, dtype=torch.bool))
    return SampleRequest(
        **common,
        length=len(tpl.ids) if tpl.mode != "infill" else None,
        prompt=prompt,
        template=infill,
    )


@torch.no_grad()
def generate_stream(
    run,
    req: Request,
    emit: Callable[[dict], None],
    cancelled: Callable[[], bool] = lambda: False,
    limits: Limits = Limits(),
    guides: Optional[dict[str, Guide]] = None,
) -> Result:
    """Runs one validated request (a generation or an edit) on ``run`` (a
    :class:`replaid.training.loading.Run`), calling ``emit`` with a ``start`` event, one ``step`` frame
    per sampler step and a ``done`` event (also returned).

    Raises ValueError on a bad request and :class:`Cancelled` if ``cancelled()`` turns true."""
    prep = prepare(req, run, limits, guides)
    sreq = prep.request
    model, tok, cfg, method = run.model, run.tokenizer, run.cfg, run.method
    L = len(prep.ids)
    sampler = get_sampler(method, req.sampler)
    if method.kind is Kind.AUTOREGRESSIVE:
        steps = L - sum(prep.known)
    elif prep.mode == "edit":
        steps = 0 if req.strength == 0 else max(1, math.ceil(req.strength * req.steps))  # as generate() does
    else:
        steps = req.steps
    B = req.samples
    known = torch.tensor(prep.known, dtype=torch.bool)  # (L,)
    known_ids = torch.tensor(prep.ids, dtype=torch.long)  # (L,)
    framer = _Framer(emit, cancelled, tok, known, known_ids)
    emit(
        {
            "type": "start",
            "run": req.run,
            "method": cfg.method,
            "sampler": req.sampler,
            "steps": steps,
            "L": L,
            "B": B,
            "mode": prep.mode,
            "known": prep.known,
            "ids": known_ids.tolist(),  # an edit: the source text (frame 0 shows it)
            "tokens": framer.strings(known_ids if prep.mode == "edit" else known_ids[known]),
            "nfe_expected": sampler.nfe(steps) if method.kind is Kind.CONTINUOUS and sampler.nfe and steps else None,
            "strength": req.strength if prep.mode == "edit" else None,
            "guided": bool(sreq.require or sreq.guide),
            "guidance_scale": sreq.guidance_scale if (sreq.require or sreq.guide) else None,
        }
    )
    handle = _count_calls(model, framer)
    try:
        rows = generate(run, sreq, callback=_frames(method.kind, framer, B, L, model))
    finally:
        handle.remove()
    tokens = torch.where(known, known_ids, torch.tensor([r["ids"] for r in rows], dtype=torch.long))
    nfe = rows[0]["nfe"]
    secs = time.perf_counter() - framer.t0
    ids = tokens.tolist()
    # an edit's text is generate()'s: kept character pieces verbatim (EditPlan.text_of)
    texts = [r["text"] for r in rows] if prep.mode == "edit" else [tok.decode(r) for r in ids]
    res = Result(
        ids=ids,
        texts=texts,
        nfe=int(nfe),
        steps=steps,
        seconds=secs,
        first_step_seconds=framer.first,
        mode=prep.mode,
    )
    done = {
        "type": "done",
        "ids": ids,
        "texts": res.texts,
        "nfe": res.nfe,
        "steps": steps,
        "seconds": round(secs, 4),
        "first_step_seconds": None if framer.first is None else round(framer.first, 4),
        "tokens": framer.strings(tokens),
    }
    if rows and "required" in rows[0]:
        done["required"] = [r["required"] for r in rows]  # per sample, per word: present where asked
    emit(done)
    return res


def _frames(kind: Kind, framer: _Framer, B: int, L: int, model) -> Callable[[dict], None]:
    """The step callback drawing each kind's sampler state (module docstring)."""
    if kind is Kind.CONTINUOUS:

        def continuous(info: dict) -> None:
            p = torch.softmax(info["logits"].float(), -1)  # (B, L, V)
            conf, ids = p.max(-1)
            framer.frame(
                info["i"], info["T"], info["tokens"] if info.get("final") else ids, conf, final=bool(info.get("final"))
            )

        return continuous
    V = model.n_out
    conf = torch.zeros(B, L, dtype=torch.float64)  # kept per position for MDLM / AR
    if kind is Kind.MASKED:

        def masked(info: dict) -> None:
            z, p = info["z"].cpu(), info["probs"].cpu()
            new = (z != V) & (conf == 0)
            pz = p.gather(-1, z.clamp(max=V - 1).unsqueeze(-1)).squeeze(-1)  # (B, L)
            conf[new] = pz[new]
            framer.frame(info["i"], info["T"], torch.where(z == V, MASK, z), conf.float())

        return masked
    if kind is Kind.UNIFORM:

        def uniform(info: dict) -> None:
            z, p = info["z"].cpu(), info["probs"].cpu()
            framer.frame(info["i"], info["T"], z, p.gather(-1, z.unsqueeze(-1)).squeeze(-1).float())

        return uniform

    def autoregressive(info: dict) -> None:
        pos, toks = info["pos"], info["tokens"].cpu()
        conf[:, pos] = info["probs"].cpu().gather(-1, toks[:, pos : pos + 1]).squeeze(-1)
        ids = torch.full((B, L), EMPTY, dtype=torch.long)
        ids[:, : pos + 1] = toks[:, : pos + 1]
        framer.frame(info["i"], info["T"], ids, conf.float())

    return autoregressive
