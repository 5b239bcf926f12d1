"""Generation for the playground: one request -> a stream of display frames.

A frame is what the page draws for one sampler step: per sample and position the token shown, the
model's confidence in it, and which positions were given by the user (kept). What "the token
shown" is depends on the method, so each kind's strategy reads it (:mod:`replaid.sampling.strategy`):

* continuous diffusion (RePlaid, Plaid): the argmax of the denoiser's logits at ``gammas[i]``
  (its current best guess of the clean text) and its softmax probability, from the sampler's
  per-step ``callback`` (k-diffusion style), then one ``final`` frame with the readout at
  ``gammas[T]`` (the returned tokens): T + 1 frames; given positions show the given tokens;
* MDLM: the current state ``z_s``; still-masked positions are ``MASK_ID``; an unmasked token keeps the
  probability ``x_theta`` gave it when it was drawn;
* Duo: the current state ``z_s`` (uniform noise at the start) and ``x_theta`` of that token;
* AR: the tokens so far (later positions ``EMPTY_ID``) and the probability each was drawn with.

A request is a :class:`~replaid.sampling.request.SampleRequest`: its JSON fields are the request's own
(:func:`parse`, through the config's type coercion; a few the server sets), besides the run, the text
box and a classifier by id and label (:class:`Asked`). Every request goes through
:func:`replaid.sampling.generate` (as ``replaid sample`` does) with a step callback that turns the
sampler's state into frames: the same run, seed and settings give the same final text (tested); the
first frame, the steps and the NFE are generate's (its :class:`~replaid.sampling.generate.Plan` and
answer). An edit (``POST /api/edit``) is the same path with the ``SampleRequest`` of ``replaid edit``
(SDEdit: ``edit``, ``strength``, ``edit_chars`` / ``edit_span``): its frames start from the given text,
and the positions outside the spans are kept (grey). Guidance (``require``, ``classifier`` + ``label``,
``guidance_scale``) sets the same ``SampleRequest`` fields as ``--require``, ``--guide`` and
``--guidance-scale``; a request names a classifier by the id the server gave it (:class:`Guide`), never
by a path. Errors name the request's fields (``steps``, ``num``, ``edit_chars``), not the CLI's flags.
"""

from __future__ import annotations

import json
import re
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from replaid.config import ConfigError, coerce
from replaid.methods.base import Kind
from replaid.sampling.display import visible
from replaid.sampling.generate import Plan, generate
from replaid.sampling.infill import InfillPlan
from replaid.sampling.request import RequestLimits, SampleRequest, check_text, field_types, prompt_ids
from replaid.sampling.strategy import strategy_of

if TYPE_CHECKING:
    from replaid.data.tokenizers import Tokenizer
    from replaid.methods.replaid import ContinuousNet
    from replaid.sampling.contract import StepInfo
    from replaid.store.loading import Run

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
    max_queue: int = 32  # waiting requests per run (a batched run: beyond its running batch)
    max_body: int = MAX_BODY  # bytes of a request body (more: HTTP 413, refused before it is read)
    max_tokens: int = 0  # /v1/completions' max_tokens (0: 8 x the run's data.seq_len)
    max_batch: int = 16  # a block run's running batch: samples (rows) written together (/v1/completions)
    raw: bool = False  # decoded text as it is (default: control characters and U+FFFD as escapes, display.visible)

    def request_limits(self) -> RequestLimits:
        """The bounds :meth:`SampleRequest.check` applies to every request of this server."""
        return RequestLimits(max_steps=self.max_steps, max_num=self.max_samples, max_length=self.max_length or None)


# The page's requests are SampleRequests: every field of it is a JSON field of the same name, except those
# the server sets (or the page's own fields stand for: the text box, the classifier and its label); a new
# sampling field is one of them with no change here.
OWN = ("run", "text", "classifier", "label")  # the run id; the text box; classifier guidance by id and label
SERVER_SET = frozenset(
    {"batch_size", "allow_longer", "progress", "template", "trajectory", "guide", "prompt", "context", "infill"}
    | {"infill_chars", "edit", "max_tokens", "stop", "ignore_eos"}  # completions: POST /v1/completions
)
EDIT_ONLY = frozenset({"strength", "edit_chars", "edit_span"})  # /api/edit's
ALIASES = {"samples": "num", "spans": "edit_chars", "token_spans": "edit_span"}  # the page's names of fields
DEFAULTS = {"num": 1, "strength": 0.5}  # the page's defaults where they are not SampleRequest's


@dataclass
class Asked:
    """A playground request as sent: the run it names, its :class:`SampleRequest` (the sampling fields),
    the text box (a generation: unconditional, a prompt or a ``[[n]]`` template; an edit: the text to
    edit), classifier guidance by id and label, and whether it is an edit (``POST /api/edit``)."""

    run: str
    request: SampleRequest
    text: str = ""
    classifier: str = ""
    label: str = ""
    edit: bool = False


def _kind(typ: Any) -> str:
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if typing.get_origin(typ) in (tuple, list):
        return "a list of strings"
    return _kind(args[0]) if args else getattr(typ, "__name__", str(typ))


def parse(body: Any, edit: bool = False) -> Asked:
    """A request body (JSON) -> :class:`Asked`, every field converted by the config's one type coercion
    (:func:`replaid.config.coerce`) to the request's declared type; a wrong type or an unknown field is
    one line. ``length`` 0 is the run's length (None), a blank text field none."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    hints = field_types(SampleRequest)
    fields = [f for f in hints if f not in SERVER_SET and (edit or f not in EDIT_ONLY)]
    unknown = sorted(k for k in body if k not in OWN and ALIASES.get(k, k) not in fields)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; fields are {', '.join((*OWN, *fields))}")
    if "run" not in body:
        raise ValueError("missing field 'run'")
    own: dict[str, str] = {}
    kw: dict[str, Any] = {k: v for k, v in DEFAULTS.items() if k in fields}
    fields_in: dict[str, Any] = body  # a JSON object: str keys
    for k, v in fields_in.items():
        f = k if k in OWN else ALIASES.get(k, k)
        typ = str if k in OWN else hints[f]
        if f == "length" and v == 0 or isinstance(v, str) and not v.strip() and typ == str | None:
            v = None
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 2**63:  # a whole number, too large to be one
            raise ValueError(f"field {k!r} is out of range ({len(str(abs(v)))} digits); use a number below 2**63")
        try:
            (own if k in OWN else kw)[f] = coerce(f, v, typ)
        except ConfigError:
            raise ValueError(f"field {k!r} must be {_kind(typ)}, got {repr(v)[:40]}") from None
    return Asked(request=SampleRequest(**kw), edit=edit, **own)


@dataclass
class Guide:
    """A latent classifier the server offers for a run: ``id`` (what requests name), its folder, labels."""

    id: str
    path: Path
    labels: list[str]


def classifier_meta(path: Path) -> dict[str, Any]:
    """``classifier.json`` of a classifier folder (labels, embedding fingerprint); one line when unreadable."""
    f = Path(path) / "classifier.json"
    if not f.is_file() or not (Path(path) / "classifier.safetensors").is_file():
        raise ValueError(
            f"--classifier {path}: no classifier.json + classifier.safetensors there "
            "(replaid classifier train RUN --data LABELLED.jsonl --out DIR writes them)"
        )
    try:
        meta: dict[str, Any] = json.loads(f.read_text())
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


def guides_for(run: Run, run_dir: Path, extra: list[Path]) -> dict[str, Guide]:
    """The classifiers offered for ``run``: those under its folder and those given (``--classifier``)
    whose embedding fingerprint matches the run's (a classifier only steers the run it was trained on).
    Ids: the path under the run folder, or the folder's name, made unique."""
    from replaid.training.classifier import embedding_fingerprint

    fp = embedding_fingerprint(cast("ContinuousNet", run.model).embedding_matrix())  # only continuous runs come here
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


def samplers_for(run: Run) -> list[str]:
    """Sampler names the playground offers for a run: those its method declares."""
    return list(run.method.samplers)


def check(asked: Asked, run: Run) -> None:
    """What only the playground's own fields can get wrong (one line each); every sampling field is the
    :class:`SampleRequest`'s, checked by :meth:`SampleRequest.check` with the server's :class:`Limits`."""
    if asked.edit and not run.method.kind.continuous:
        raise ValueError(
            f"editing needs a continuous-diffusion run (replaid, plaid); {asked.run!r} is a {run.cfg.method} run"
        )
    if run.method.block_size():
        raise ValueError(
            f"{asked.run!r} is a block-diffusion run ({run.cfg.method}, blocks of {run.method.block_size()} tokens): "
            "it writes text block by block, served at POST /v1/completions (docs/playground/README.md)"
        )
    if len(asked.text) > 20000:
        raise ValueError("text is longer than 20000 characters")


@dataclass
class Template:
    """The text box parsed: ``ids`` (L,) with ``known`` (L,) True on given positions."""

    ids: list[int]
    known: list[bool]
    mode: str  # unconditional | prompt | infill


def parse_text(text: str, tok: Tokenizer, L: int, max_len: int) -> Template:
    """``""`` -> unconditional length L; text without gaps -> a prompt prefix of a length-L
    sequence; text with ``[[n]]`` gaps -> exactly the template (each kept piece tokenised on its
    own, each gap n positions, ``[[]]`` = 8), its length capped at ``max_len``."""
    if not text.strip():
        return Template([0] * L, [False] * L, "unconditional")
    parts = _GAP.split(text)  # kept, n, kept, n, ..., kept
    if len(parts) == 1:
        pids = prompt_ids(tok, text, L).tolist()  # the request's own message when it leaves nothing to generate
        return Template(pids + [0] * (L - len(pids)), [True] * len(pids) + [False] * (L - len(pids)), "prompt")
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


def guide_of(asked: Asked, guides: dict[str, Guide]) -> str | None:
    """``--guide CLF_DIR:LABEL`` of the request's classifier id and label (both checked), or None."""
    if not asked.classifier:
        if asked.label:
            raise ValueError("a label needs a classifier: choose one (classifier guidance)")
        return None
    g = guides.get(asked.classifier)
    if g is None:
        known = ", ".join(guides) or "none (replaid serve --classifier DIR, or classifiers under the run folder)"
        raise ValueError(f"unknown classifier {asked.classifier!r} for run {asked.run!r}; this server offers {known}")
    if asked.label not in g.labels:
        raise ValueError(f"label {asked.label!r} is not one of classifier {g.id!r}'s labels: {', '.join(g.labels)}")
    return f"{g.path}:{asked.label}"


def prepare(asked: Asked, run: Run, limits: Limits, guides: dict[str, Guide] | None = None) -> SampleRequest:
    """The :class:`SampleRequest` of ``asked`` for ``run``, validated (:func:`check`, the server's limits,
    then :meth:`SampleRequest.check`: the CLI's checks, its messages naming the request's fields): one
    batch, the text box laid out (a prompt, a ``[[n]]`` template or the text to edit), the classifier's
    guide."""
    check(asked, run)
    check_text("text", asked.text)  # before the text box is tokenised
    cfg, tok = run.cfg, run.tokenizer
    bounds = limits.request_limits()
    max_len = limits.max_length or cfg.data.seq_len
    req = replace(asked.request, batch_size=asked.request.num, progress=False, guide=guide_of(asked, guides or {}))
    req.allow_longer = True  # the length is checked against the limits here
    bounds.check(req, cfg.data.seq_len)  # the server's limits, before the text is laid out
    if asked.edit:
        req.edit = asked.text
        eplan = req.edit_plan(tok) if asked.text else None
        if eplan is not None and len(eplan.ids) > max_len:
            raise ValueError(f"the text is {len(eplan.ids)} tokens; the limit is {max_len}")
    else:
        tpl = parse_text(asked.text, tok, req.length_for(cfg.data.seq_len), max_len)  # the one default-length rule
        if tpl.mode == "infill" and not run.method.kind.continuous:
            raise ValueError(
                f"infill needs a continuous-diffusion run (replaid, plaid); {asked.run!r} is a {cfg.method} "
                "run: give a prompt instead"
            )
        if tpl.mode == "infill":
            req.template = InfillPlan(torch.tensor(tpl.ids), torch.tensor(tpl.known))
            req.length = None
        else:
            req.prompt = asked.text if tpl.mode == "prompt" else None
            req.length = len(tpl.ids)
    req.check(run.method, tok, cfg.data.seq_len)
    return req


@dataclass
class Result:
    ids: list[list[int]]
    texts: list[str]
    nfe: int
    steps: int
    seconds: float
    first_step_seconds: float | None
    mode: str
    frames: list[dict[str, Any]] = field(default_factory=list)


class _Framer:
    """Turns per-step sampler state into display frames and hands them to ``emit``; the given positions
    (``known``, ``known_ids``) and the kind's drawing (``draw``) are set from :func:`generate`'s plan."""

    def __init__(
        self, emit: Callable[[dict[str, Any]], None], cancelled: Callable[[], bool], tok: Tokenizer, raw: bool = False
    ) -> None:
        self.emit, self.cancelled, self.tok, self.raw = emit, cancelled, tok, raw
        self.known = self.known_ids = torch.zeros(0)  # (L,) bool, (L,) long
        self.draw: Callable[[StepInfo], None] = lambda info: None
        self.sent: set[int] = set()
        self.t0 = time.perf_counter()
        self.first: float | None = None

    def strings(self, ids: torch.Tensor) -> dict[str, str]:
        """Display strings of the token ids not yet sent on this stream."""
        new = {}
        for i in set(ids.flatten().tolist()) - self.sent:
            if i >= 0:
                new[str(i)] = visible(self.tok.decode([i]), self.raw)
        self.sent.update(int(k) for k in new)
        return new

    def frame(self, info: StepInfo, ids: torch.Tensor, conf: torch.Tensor, final: bool = False) -> None:
        """ids (B, L) long display ids, conf (B, L) float in [0, 1] of the step ``info``; ``final`` marks
        the readout."""
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
                "i": info["i"] + 1,
                "T": info["T"],
                "final": final,
                "ids": ids.tolist(),
                "conf": (conf * 100).round().to(torch.int64).clamp(0, 100).tolist(),
                "tokens": self.strings(ids),
                "seconds": round(now, 4),
                "nfe": info.get("nfe") or None,  # the sampler's count so far
            }
        )


@torch.no_grad()
def generate_stream(
    run: Run,
    asked: Asked,
    emit: Callable[[dict[str, Any]], None],
    cancelled: Callable[[], bool] = lambda: False,
    limits: Limits | None = None,
    guides: dict[str, Guide] | None = None,
) -> Result:
    """Runs one request (a generation or an edit) on ``run`` (a :class:`replaid.store.loading.Run`)
    through :func:`generate`, calling ``emit`` with a ``start`` event (from generate's plan), one ``step``
    frame per sampler step and a ``done`` event (also returned).

    Raises ValueError on a bad request and :class:`Cancelled` if ``cancelled()`` turns true."""
    limits = Limits() if limits is None else limits
    req = prepare(asked, run, limits, guides)
    tok, cfg, method = run.tokenizer, run.cfg, run.method
    B = req.num
    framer = _Framer(emit, cancelled, tok, limits.raw)

    def start(plan: Plan) -> None:
        framer.known, framer.known_ids = plan.known.cpu(), plan.ids.cpu()
        framer.draw = _frames(method.kind, framer, B, plan.length, run.model)
        edit = plan.mode == "edit"
        guided = bool(req.require or req.guide)
        emit(
            {
                "type": "start",
                "run": asked.run,
                "method": cfg.method,
                "sampler": plan.sampler,
                "steps": plan.steps,
                "L": plan.length,
                "B": B,
                "mode": plan.mode,
                "known": plan.known.tolist(),
                "ids": plan.ids.tolist(),  # an edit: the source text (frame 0 shows it)
                "tokens": framer.strings(plan.ids if edit else plan.ids[plan.known]),
                "nfe_expected": plan.nfe if method.kind.continuous and plan.steps else None,
                "strength": req.strength if edit else None,
                "guided": guided,
                "guidance_scale": req.guidance_scale if guided else None,
            }
        )

    rows = generate(run, req, callback=lambda info: framer.draw(info), on_plan=start)
    assert rows.plan is not None  # no completion: refused by check()
    tokens = torch.where(framer.known, framer.known_ids, torch.tensor([r["ids"] for r in rows], dtype=torch.long))
    secs = time.perf_counter() - framer.t0
    ids = tokens.tolist()
    # an edit's text is generate()'s: kept character pieces verbatim (EditPlan.text_of)
    texts = [r["text"] for r in rows] if rows.plan.mode == "edit" else [tok.decode(r) for r in ids]
    texts = [visible(t, limits.raw) for t in texts]
    res = Result(
        ids=ids,
        texts=texts,
        nfe=rows.nfe,
        steps=rows.steps,
        seconds=secs,
        first_step_seconds=framer.first,
        mode=rows.plan.mode,
    )
    done = {
        "type": "done",
        "ids": ids,
        "texts": res.texts,
        "nfe": res.nfe,
        "steps": res.steps,
        "seconds": round(secs, 4),
        "first_step_seconds": None if framer.first is None else round(framer.first, 4),
        "tokens": framer.strings(tokens),
    }
    if rows and "required" in rows[0]:
        done["required"] = [r["required"] for r in rows]  # per sample, per word: present where asked
    emit(done)
    return res


def _frames(kind: Kind, framer: _Framer, B: int, L: int, model: torch.nn.Module) -> Callable[[StepInfo], None]:
    """The step callback drawing the sampler's state as its kind's strategy reads it (module docstring)."""
    read = strategy_of(kind).frames(B, L, model)

    def draw(info: StepInfo) -> None:
        ids, conf, final = read(info)
        framer.frame(info, ids, conf, final=final)

    return draw
