"""One sampling request (``replaid sample``, ``replaid sweep``, the playground): a validated dataclass.

It is the one schema of every front end: ``replaid sample``'s flags are built from its fields (each
declared with :func:`knob`, which holds its help, range and choices; ``commands/sample.py`` names none
of them), the playground's JSON (``web/engine.py``) is mapped onto it through the config's type
coercion, and it is validated once, by :meth:`SampleRequest.check`, so that the same request gets the
same one-line message from either. A server's bounds (``replaid serve --max-steps`` ...) are
:class:`RequestLimits`, checked there too.

The one default-length rule (:meth:`SampleRequest.length_for`): an infilling template (``--context``
or the playground's ``[[n]]`` gaps) is exactly as long as it is (``--length`` may only extend it);
otherwise ``length``, or the run's training length ``data.seq_len`` when it is ``None``.

A *completion* (``max_tokens``, ``stop``; every request on a block-diffusion run, which writes text of any
length block by block: :meth:`~replaid.methods.base.Method.block_size`) continues the prompt by at most
``max_tokens`` tokens (:meth:`SampleRequest.completion_tokens`), cut at the tokenizer's end-of-text token
(unless ``ignore_eos``) and before the first stop string (:mod:`replaid.sampling.stream`). A block run writes
at most :data:`BLOCK_LENGTH_FACTOR` x ``data.seq_len`` tokens per request, past its training context with a
sliding window; so does an AR completion, token by token over its KV cache
(:meth:`~replaid.methods.base.Method.stream_block` is 1). Any other run writes its one length (``length``,
else ``data.seq_len``), so there ``max_tokens`` is at most that length less the prompt.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replaid.config import GUIDANCE_SCALE_MAX, MAX_STEPS, SCORE_TEMPERATURE_RANGE, TEMPERATURE_RANGE, range_problem
from replaid.sampling.errors import RequestError, ref
from replaid.sampling.names import SAMPLER_NAMES

if TYPE_CHECKING:  # imported where they are used: building replaid sample's flags from the fields needs no torch
    import torch

    from replaid.data.tokenizers import Tokenizer
    from replaid.methods.base import Method
    from replaid.sampling.infill import EditPlan, InfillPlan

BLOCK_LENGTH_FACTOR = 64  # a block run's longest request: this many times its data.seq_len (prompt included)


@dataclass(frozen=True)
class RequestLimits:
    """A server's bounds on a request (``replaid serve``'s options), checked by :meth:`SampleRequest.check`
    before anything else; each message names the request's field, the allowed range and the value."""

    max_steps: int = 1024
    max_num: int = 4
    max_length: int | None = None  # None: the run's training length data.seq_len
    max_require: int = 8  # required words per request
    max_require_chars: int = 200
    max_tokens: int | None = None  # a completion's max_tokens (None: 8 x the run's data.seq_len)
    max_stop: int = 4  # stop strings per request (OpenAI's limit) ...
    max_stop_chars: int = 200  # ... of at most this many characters each

    def check(self, req: SampleRequest, trained_len: int) -> None:
        def between(k: str, v: float, lo: float, hi: float, extra: str = "") -> None:
            # NaN fails too; an int is compared as it is (math.isfinite would overflow on one past 1e308)
            if not (lo <= v <= hi and (isinstance(v, int) or math.isfinite(v))):
                raise RequestError(f"{ref(k)} must be between {lo:g} and {hi:g}{extra}, got {v}")

        between("steps", req.steps, 1, self.max_steps)
        between("num", req.num, 1, self.max_num)
        if req.length is not None:
            max_len = self.max_length or trained_len
            between("length", req.length, 1, max_len, f" (none: the run's {trained_len})")
        if req.max_tokens is not None:
            between("max_tokens", req.max_tokens, 1, self.max_tokens or 8 * trained_len)
        if len(req.stop) > self.max_stop or any(len(s) > self.max_stop_chars for s in req.stop):
            raise RequestError(
                f"{ref('stop')}: at most {self.max_stop} stop strings of at most {self.max_stop_chars} characters each"
            )
        if len(req.require) > self.max_require or any(len(w) > self.max_require_chars for w in req.require):
            raise RequestError(
                f"{ref('require')}: at most {self.max_require} required words of at most {self.max_require_chars} "
                "characters each"
            )


KNOB = "knob"  # the metadata key of a field that is a flag too


@dataclass(frozen=True)
class Knob:
    """How a :class:`SampleRequest` field (declared with :func:`knob`) is a ``replaid sample`` flag. The
    command line builds the flag from the field alone (``commands/sample.py``): ``--`` and the name with
    dashes, the field's type and default, and this: a whole number or a float takes ``[lo, hi]`` (a float
    with ``or_zero`` 0 too), a ``str`` any text (``choices``: one of them), a ``tuple[str, ...]`` is a
    repeatable flag, a bool defaulting to False is a switch that sets it and one defaulting to True is
    ``--no-NAME``, which clears it."""

    help: str
    metavar: str | None = None
    lo: int | float | None = None
    hi: int | float | None = None
    or_zero: bool = False
    choices: tuple[str, ...] | None = None
    why: str = ""  # what an out-of-range value is told besides the range


def knob(
    default: Any,
    help: str,
    *,
    metavar: str | None = None,
    lo: int | float | None = None,
    hi: int | float | None = None,
    or_zero: bool = False,
    choices: tuple[str, ...] | None = None,
    why: str = "",
) -> Any:
    """A :class:`SampleRequest` field defaulting to ``default`` that is a ``replaid sample`` flag too
    (:class:`Knob`); ``help`` is its help text. ``[lo, hi]`` is its one range: the flag's, and the one
    :meth:`SampleRequest.check` applies to every request (the playground's and the API's too)."""
    return field(default=default, metadata={KNOB: Knob(help, metavar, lo, hi, or_zero, choices, why)})


def knobs() -> dict[str, Knob]:
    """The declared :class:`Knob` of each :class:`SampleRequest` field that has one."""
    return {f.name: f.metadata[KNOB] for f in dataclasses.fields(SampleRequest) if KNOB in f.metadata}


def field_types(cls: type[SampleRequest] | None = None) -> dict[str, Any]:
    """The declared type of every field of ``cls`` (:class:`SampleRequest` or a subclass), resolved
    without importing torch: ``template``'s :class:`~replaid.sampling.infill.InfillPlan`, which no front
    end takes from its user, stays a name."""
    return typing.get_type_hints(cls or SampleRequest, localns={"InfillPlan": Any})


_SPANS = "A:B[,C:D]"


@dataclass
class SampleRequest:
    """One sampling request (module docstring). Each field declared with :func:`knob` is a ``replaid sample``
    flag of the same name (:class:`Knob`); every field but those the server sets is a JSON field of the
    playground (``web/engine.py``)."""

    sampler: str | None = knob(
        None,
        "sampler (default: the method's first: ddpm for RePlaid/Plaid, ancestral for AR, MDLM and Duo, which "
        "refuse the continuous ones)",
        choices=SAMPLER_NAMES,
    )
    steps: int = knob(64, "T, number of sampling steps", lo=1, hi=MAX_STEPS)  # AR: one step per generated token
    num: int = knob(4, "number of samples", lo=1)
    batch_size: int = knob(16, "samples generated at once", lo=1)
    length: int | None = knob(  # None: the template's length, else the run's data.seq_len
        None, "sequence length (default: the run's data.seq_len; with --context, the context's)", lo=1
    )
    allow_longer: bool = knob(False, "allow --length beyond the run's trained length")
    temperature: float = knob(
        1.0,
        f"logit temperature: 0 (greedy, the argmax of every draw) or in [{TEMPERATURE_RANGE[0]:g}, "
        f"{TEMPERATURE_RANGE[1]:g}] (below it the draws are greedy to float32 precision: give 0)",
        lo=TEMPERATURE_RANGE[0],
        hi=TEMPERATURE_RANGE[1],
        or_zero=True,
        why=f"below {TEMPERATURE_RANGE[0]:g} the draws are greedy to float32 precision: give 0 for greedy",
    )
    score_temperature: float = knob(  # (continuous methods)
        1.0,
        f"Plaid's score temperature, in [{SCORE_TEMPERATURE_RANGE[0]:g}, {SCORE_TEMPERATURE_RANGE[1]:g}]",
        lo=SCORE_TEMPERATURE_RANGE[0],
        hi=SCORE_TEMPERATURE_RANGE[1],
    )
    top_p: float | None = None  # AR nucleus mass (None: the run's ar.top_p)
    seed: int = knob(0, "seed of the sampling noise", lo=0, hi=2**63 - 1)
    prompt: str | None = knob(None, "text fixed at the start of every sample (default: none)")
    context: str | None = knob(
        None,
        "infilling: text whose tokens are kept; mark what to fill with [MASK:N] (N tokens) in it, or with "
        "--infill-chars / --infill",
    )
    infill: str | None = knob(None, "token-position spans of --context to fill (see --show-positions)", metavar=_SPANS)
    infill_chars: str | None = knob(
        None, "character spans of --context to fill (each by as many tokens as it holds)", metavar=_SPANS
    )
    template: InfillPlan | None = None  # an already tokenised infilling template (the playground's)
    # self-conditioning while sampling (continuous methods that have it); its flag is --no-self-cond
    self_cond: bool = knob(True, "disable self-conditioning while sampling")
    trajectory: int = knob(0, "record the argmax text every k steps", lo=0)  # (continuous methods)
    progress: bool = True  # progress bars on stderr
    edit: str | None = None  # SDEdit: the source text (replaid edit --text)
    strength: float = 1.0  # SDEdit: start time s in [0, 1] (0: the text unchanged; 1: a fresh sample)
    edit_span: str | None = None  # SDEdit: token spans to re-noise (the rest is kept)
    edit_chars: str | None = None  # SDEdit: character spans to re-noise (the rest is kept verbatim)
    require: tuple[str, ...] = knob(
        (),
        "token guidance towards samples containing WORD (its own tokens; mind GPT-2's leading space, ' king'), "
        "anywhere, starting at token P, or starting in [A, B); repeat for several words",
        metavar="WORD[@P|@A:B]",
    )
    guide: str | None = knob(
        None,
        "classifier guidance towards LABEL with the classifier saved in folder CLF (replaid classifier train)",
        metavar="CLF:LABEL",
    )
    guidance_scale: float = knob(  # w in e_hat + w sigma^2/alpha grad log p(y | z_t) (sampling/guidance.py)
        1.0,
        "w: adds w * grad log p(y | z_t) to the score (0: unguided, 1: the exact conditional; at most "
        f"{GUIDANCE_SCALE_MAX:g}: beyond it the guidance term alone decides every token)",
        lo=0,
        hi=GUIDANCE_SCALE_MAX,
    )
    max_tokens: int | None = knob(
        None,
        "a completion: at most N tokens after the prompt, cut at the end-of-text token and --stop. A "
        "block-diffusion run (mdlm.block_size) writes block by block, past its data.seq_len with a sliding "
        f"window (up to {BLOCK_LENGTH_FACTOR} x data.seq_len with the prompt), and streams the text as each "
        "block is committed when a batch holds one sample (--num 1 or --batch-size 1); any other run writes its "
        "--length at once (N at most that less the prompt). Default on a block run: data.seq_len less the prompt",
        lo=1,
        metavar="N",
    )
    stop: tuple[str, ...] = knob(
        (), "a completion ends before the first S in its text (repeatable; see --max-tokens)", metavar="S"
    )
    ignore_eos: bool = knob(False, "a completion goes on past the end-of-text token (see --max-tokens)")

    @property
    def _infilling(self) -> bool:
        return bool(self.context or self.infill or self.infill_chars or self.template is not None)

    @property
    def completion(self) -> bool:
        """Whether this asks for a completion (module docstring), whatever the run."""
        return self.max_tokens is not None or bool(self.stop) or self.ignore_eos

    def completion_tokens(self, trained_len: int, n_prompt: int) -> int:
        """A completion's most tokens after the prompt: ``max_tokens``, else what the length (``length``,
        else ``data.seq_len``) leaves after the ``n_prompt`` prompt tokens."""
        return self.max_tokens if self.max_tokens is not None else self.length_for(trained_len) - n_prompt

    def edit_plan(self, tok: Tokenizer) -> EditPlan | None:
        """The SDEdit source (tokens and kept mask), or None when this is no edit."""
        if self.edit is None:
            return None
        from replaid.sampling.infill import plan_edit

        return plan_edit(tok, self.edit, self.edit_span, self.edit_chars)

    def length_for(self, trained_len: int, plan: InfillPlan | None = None) -> int:
        """The sample length (module docstring)."""
        if plan is not None:
            return len(plan.ids)
        return self.length if self.length is not None else trained_len

    def check(
        self, method: Method[Any], tok: Tokenizer, trained_len: int, limits: RequestLimits | None = None
    ) -> InfillPlan | None:
        """Refuse what ``method``'s run (or a server's ``limits``) cannot honour, before any sampling (one
        line, naming the option); returns the infilling plan, if any."""
        from replaid.sampling.infill import plan_infill

        if limits is not None:
            limits.check(self, trained_len)
        self._check_text()
        refusal = method.sampling_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        continuous = method.kind.continuous
        if not continuous:
            own = "left-to-right ancestral sampling" if method.kind.left_to_right else "its own ancestral sampler"
            if self.sampler is not None and self.sampler not in method.samplers:
                raise RequestError(
                    f"{ref('sampler')} {self.sampler!r} is not available for a {method.name} run, which "
                    f"samples with {own}: drop {ref('sampler')}"
                )
            for flag, used in (
                ("editing (replaid edit)", self.edit is not None),
                (ref("require"), bool(self.require)),
                (ref("guide"), self.guide is not None),
                (f"{ref('context')}/{ref('infill')}", self._infilling),
                (ref("score_temperature"), self.score_temperature != 1.0),
                (ref("trajectory"), self.trajectory),
                (ref("self_cond"), not self.self_cond),
            ):
                if used:
                    raise RequestError(
                        f"{flag} needs a continuous-diffusion run; this '{method.name}' run samples with {own}"
                    )
        elif self.sampler is not None and self.sampler not in method.samplers:
            raise RequestError(
                f"{ref('sampler')} {self.sampler!r} is not available for a {method.name} run; choose {', '.join(method.samplers)}"
            )
        if self.prompt and self._infilling:
            raise RequestError(
                f"{ref('prompt')} and {ref('context')} are two kinds of conditioning: give one (a prompt is "
                "the context 'PROMPT[MASK:N]')"
            )
        # a completion is written as the run streams it (AR: token by token); any other sample as it samples
        blocks = method.stream_block() if self.completion else method.block_size()
        if blocks or self.completion:
            n = self._check_completion(tok, trained_len, blocks, method.name)
            if blocks:  # its own length rule: at most BLOCK_LENGTH_FACTOR x data.seq_len, checked there
                self._check_numbers(None, n)  # and any length from one token: a block holds the rest
                return None
        if (self.infill or self.infill_chars) and not self.context:
            raise RequestError(
                f"{ref('infill')}/{ref('infill_chars')} need {ref('context')} TEXT whose tokens are kept outside the spans"
            )
        spans = f"{ref('edit_chars')}/{ref('edit_span')}"
        if self.edit is not None and (self.prompt or self._infilling):
            raise RequestError(f"editing keeps the text outside {spans}: drop {ref('prompt')}/{ref('context')}")
        if (self.edit_span or self.edit_chars) and self.edit is None:
            raise RequestError(f"{spans} need {ref('edit')}, the text to edit")
        if self.edit is not None:
            if not (0.0 <= self.strength <= 1.0):
                raise RequestError(
                    f"{ref('strength')} {self.strength}: must be in [0, 1] (0: unchanged, 1: a fresh sample)"
                )
            if self.length is not None:
                raise RequestError(f"{ref('length')} does not apply to editing: the edit is as long as {ref('edit')}")
            eplan = self.edit_plan(tok)
            assert eplan is not None
            n = len(eplan.ids)
            if n > trained_len and not self.allow_longer:
                raise RequestError(
                    f"{ref('edit')} is {n} tokens, beyond the run's trained length (data.seq_len={trained_len}); "
                    f"shorten it or pass {ref('allow_longer')}"
                )
            self._check_numbers(n, n)
            self._check_guidance(len(eplan.ids))
            return None
        plan = self.template
        if self.context:
            plan = plan_infill(tok, self.context, self.infill, self.infill_chars, self.length)
        L = self.length_for(trained_len, plan)
        if plan is not None and self.length is None and L > trained_len and not self.allow_longer:
            what = f"{ref('infill')} {self.infill}" if self.infill else ref("context")
            raise RequestError(
                f"{what} makes samples {L} tokens long, beyond the run's trained length (data.seq_len="
                f"{trained_len}); keep spans and context within {trained_len} tokens or pass {ref('allow_longer')}"
            )
        if self.prompt:
            prompt_ids(tok, self.prompt, L)  # raises when it leaves nothing to generate
        self._check_numbers(L, trained_len)
        self._check_guidance(L)
        return plan

    def _check_text(self) -> None:
        """Refuse the request's text that no tokenizer can read (:func:`check_text`)."""
        texts = {"prompt": (self.prompt,), "context": (self.context,), "edit": (self.edit,), "require": self.require}
        for k, values in texts.items():
            for v in values:
                if v is not None:
                    check_text(k, v)

    def _check_completion(self, tok: Tokenizer, trained_len: int, blocks: int, method: str) -> int:
        """Refuse a completion this run cannot write (module docstring); returns its most tokens, the
        prompt's included."""
        what = (
            f"a block-diffusion run ({method}, blocks of {blocks} tokens)"
            if blocks > 1
            else f"a completion of this {method} run"
        )
        for flag, used in (
            (f"{ref('context')}/{ref('infill')}", self._infilling),
            ("editing (replaid edit)", self.edit is not None),
        ):
            if used:
                raise RequestError(f"{flag} does not apply to {what}, which continues a {ref('prompt')}: give a prompt")
        if self.max_tokens is not None:
            if blocks and self.length is not None:
                raise RequestError(
                    f"{ref('length')} and {ref('max_tokens')} both set the length of a block run: give one "
                    f"({ref('max_tokens')} counts the tokens after the prompt)"
                )
            if self.max_tokens < 1:
                raise RequestError(f"{ref('max_tokens')} {self.max_tokens}: must be >= 1")
        if any(not s for s in self.stop):
            raise RequestError(f"{ref('stop')} '': a stop string must not be empty")
        P = len(tok.encode(self.prompt)) if self.prompt else 0
        cap, L = BLOCK_LENGTH_FACTOR * trained_len, self.length_for(trained_len)
        limit = f"{cap} tokens ({BLOCK_LENGTH_FACTOR} x the run's data.seq_len={trained_len}) per request"
        # a prompt that fills all a request may hold: no max_tokens can help, the prompt must shrink
        if blocks and P >= cap:
            raise RequestError(
                f"the prompt is {P} tokens, which leaves nothing to generate within the limit of {limit}; "
                f"shorten the prompt to fewer than {cap} tokens"
            )
        if not blocks and P >= L:
            raise RequestError(
                f"the prompt is {P} tokens but this run is no block-diffusion run and writes {L} tokens at once "
                f"({ref('length')}, else data.seq_len), leaving nothing to generate; shorten the prompt to "
                f"fewer than {L} tokens"
            )
        n = self.completion_tokens(trained_len, P)
        if n < 1:
            raise RequestError(
                f"the prompt is {P} tokens but samples are {P + n} long, leaving nothing to generate; "
                f"ask for more with {ref('max_tokens')}"
            )
        if blocks and P + n > cap:
            if self.max_tokens is None:  # the length asked for, the prompt's included
                raise RequestError(f"{ref('length')} {P + n}: passes the limit of {limit}; ask for at most {cap}")
            raise RequestError(
                f"{ref('max_tokens')} {n}: with the prompt's {P} tokens that passes the limit of {limit}; "
                f"ask for at most {cap - P}"
            )
        if not blocks and P + n > L:
            raise RequestError(
                f"{ref('max_tokens')} {n}: this run is no block-diffusion run, it writes {L} tokens at once ({ref('length')}, "
                f"else data.seq_len), {P} of them the prompt's; ask for at most {L - P}"
            )
        return P + n

    def _check_guidance(self, L: int) -> None:
        if not (0 <= self.guidance_scale <= GUIDANCE_SCALE_MAX):  # NaN fails too
            raise RequestError(
                f"{ref('guidance_scale')} {self.guidance_scale:g}: must be in [0, {GUIDANCE_SCALE_MAX:g}]"
            )
        if self.guide is not None and ":" not in self.guide:
            raise RequestError(
                f"{ref('guide')} {self.guide!r}: expected CLASSIFIER_DIR:LABEL (see replaid classifier train)"
            )
        from replaid.sampling.guidance import parse_require

        for spec in self.require:
            _, start, _ = parse_require(spec)
            if start is not None and start >= L:
                raise RequestError(f"{ref('require')} {spec!r}: position {start} is beyond the sample length {L}")

    def _check_numbers(self, L: int | None, trained_len: int) -> None:
        """The numeric fields' ranges, and the sample length ``L`` (None: a block run's, checked already)."""

        def need(ok: bool, k: str, msg: str, value: object = None) -> None:
            if not ok:
                raise RequestError(f"{ref(k)} {getattr(self, k) if value is None else value}: {msg}")

        for k, knob_ in knobs().items():  # each range as its field declares it (the CLI's flags read the same)
            v = getattr(self, k)
            if (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and (knob_.lo is not None or knob_.hi is not None)
            ):
                why = range_problem(v, knob_.lo, knob_.hi, or_zero=knob_.or_zero)
                need(not why, k, why + (f" ({knob_.why})" if knob_.why else ""))
        need(self.top_p is None or 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        if L is None:
            return
        need(L >= 2, "length", "must be >= 2", L)
        need(
            L <= trained_len or self.allow_longer,
            "length",
            f"beyond the run's trained length "
            f"(data.seq_len={trained_len}); use at most {trained_len} or pass {ref('allow_longer')} to sample beyond it",
            L,
        )


def check_text(field: str, text: str) -> None:
    """Refuse ``text`` (request field ``field``) when no tokenizer can read it: a lone surrogate, which is
    what Python makes of command-line bytes that are not UTF-8, and what a JSON ``"\\udcff"`` escape gives."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(
            f"{ref(field)} is not valid Unicode: character {e.start} is a lone surrogate ({text[e.start]!r}, what "
            "bytes that are not UTF-8 become); give UTF-8 text"
        ) from None


def prompt_ids(tok: Tokenizer, prompt: str, L: int) -> torch.Tensor:
    """The prompt's token ids (P,), which must leave room for at least one generated token."""
    import torch

    ids = tok.encode(prompt)
    if len(ids) >= L:
        raise RequestError(
            f"the prompt is {len(ids)} tokens but samples are {L} long, leaving nothing to generate; "
            f"shorten the prompt or ask for a longer length"
        )
    return torch.tensor(ids, dtype=torch.long)
