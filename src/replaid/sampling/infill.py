"""Infilling requests in the user's terms: marker text, character spans or token spans -> known tokens.

``replaid sample --context TEXT`` accepts three ways of saying what to fill:

* markers in the text: ``"def f(x):[MASK:8] return y"`` -- each ``[MASK:N]`` is N token positions to
  generate; the text between markers is tokenised piece by piece and kept (spaces just before a marker
  are left to the generated tokens, which carry their own leading space in GPT-2-style BPE);
* ``--infill-chars A:B[,C:D]``: character spans of the context (widened over the spaces just before
  them), each replaced by as many positions as its own text has tokens (the span's text is tokenised
  alone, so BPE merges across its edges may differ from tokenising the whole context);
* ``--infill A:B[,C:D]``: token positions of the tokenised context (``--show-positions`` prints them).

The sequence is exactly as long as the context (or ``--length``, when longer: the positions past the
context are generated too), so nothing is ever padded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from replaid.data.tokenizers import Tokenizer
from replaid.sampling.continuous import parse_infill_spans
from replaid.sampling.errors import RequestError, ref

MARKER = re.compile(r"\[MASK:(\d+)\]")


@dataclass
class InfillPlan:
    """Token ids (L,) (0 at positions to fill) and the known mask (L,) bool of one infilling request."""

    ids: Tensor
    known: Tensor

    def fill_spans(self) -> list[tuple[int, int]]:
        """Half-open ``[start, end)`` runs of positions to fill."""
        spans, start = [], None
        for i, k in enumerate(self.known.tolist() + [True]):
            if not k and start is None:
                start = i
            elif k and start is not None:
                spans.append((start, i))
                start = None
        return spans

    def describe(self, tok: Tokenizer) -> str:
        """One line per kept token (position, text) and one per span to fill."""
        fill = dict(self.fill_spans())
        lines, i, L = [f"token positions (L={len(self.ids)}; ___ = to fill):"], 0, len(self.ids)
        while i < L:
            if i in fill:
                n = fill[i] - i
                where = f"{i:5d}-{fill[i] - 1:<5d}" if n > 1 else f"{i:5d}      "
                lines.append(f"{where} ___ ({n} token{'s' if n > 1 else ''})")
                i = fill[i]
            else:
                lines.append(f"{i:5d}       {tok.decode([int(self.ids[i])])!r}")
                i += 1
        return "\n".join(lines)


def _char_spans_to_markers(tok: Tokenizer, context: str, spec: str) -> str:
    """``context`` with each character span of ``spec`` replaced by ``[MASK:n]``, n = its token count."""
    spans = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        a, sep, b = part.partition(":")
        try:
            start, end = int(a) if a.strip() else 0, int(b) if b.strip() else len(context)
        except ValueError:
            start, end, sep = 0, 0, ""
        if not sep or not 0 <= start < end <= len(context):
            raise RequestError(
                f"bad {ref('infill_chars')} span {part!r}: expected START:END with "
                f"0 <= START < END <= {len(context)} (the context's characters)"
            )
        spans.append((start, end))
    spans.sort()
    if any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)):
        raise RequestError(f"{ref('infill_chars')} spans overlap: {spec!r}")
    out, pos = [], 0
    for start, end in spans:
        while start > pos and context[start - 1].isspace():
            start -= 1
        out += [context[pos:start], f"[MASK:{max(1, len(tok.encode(context[start:end])))}]"]
        pos = end
    return "".join(out + [context[pos:]])


def plan_infill(
    tok: Tokenizer, context: str, spans: str | None = None, char_spans: str | None = None, length: int | None = None
) -> InfillPlan:
    """The known tokens of an infilling request (module docstring); errors name the option to fix."""
    if sum(x is not None for x in (spans, char_spans)) > 1:
        raise RequestError(f"give {ref('infill')} (token positions) or {ref('infill_chars')} (characters), not both")
    if char_spans is not None:
        if MARKER.search(context):
            raise RequestError(f"{ref('infill_chars')} with [MASK:N] markers in {ref('context')}: use one or the other")
        context = _char_spans_to_markers(tok, context, char_spans)
    pieces = MARKER.split(context)  # text, n, text, n, ..., text
    if len(pieces) > 1:
        if spans is not None:
            raise RequestError(f"{ref('infill')} with [MASK:N] markers in {ref('context')}: use one or the other")
        ids, known = [], []
        for j, piece in enumerate(pieces):
            if j % 2:
                n = int(piece)
                if n < 1:
                    raise ValueError("[MASK:N] needs N >= 1 token positions")
                ids += [0] * n
                known += [False] * n
            elif piece.rstrip() if j + 1 < len(pieces) else piece:
                t = tok.encode(piece.rstrip() if j + 1 < len(pieces) else piece)
                ids += t
                known += [True] * len(t)
    else:
        if spans is None:
            raise RequestError(
                f"{ref('context')} needs what to fill: [MASK:N] markers in the text, {ref('infill_chars')} A:B "
                f"or {ref('infill')} A:B (token positions; see --show-positions)"
            )
        ids = tok.encode(context)
        n_ctx = len(ids)
        ends = [int(p.partition(":")[2]) for p in spans.split(",") if p.partition(":")[2].strip().isdigit()]
        need = max([n_ctx] + ends)
        ids = ids + [0] * (need - n_ctx)  # positions past the context: generated
        known = [k and i < n_ctx for i, k in enumerate(parse_infill_spans(spans, need).tolist())]
    L = len(ids)
    if length is not None:
        if length < L:
            raise RequestError(
                f"the infilling context is {L} tokens but {ref('length')} is {length}; "
                f"raise {ref('length')} to at least {L} or shorten {ref('context')}"
            )
        ids, known = ids + [0] * (length - L), known + [False] * (length - L)
    if all(known):
        raise ValueError("nothing to fill: the spans cover no position")
    return InfillPlan(torch.tensor(ids, dtype=torch.long), torch.tensor(known, dtype=torch.bool))


@dataclass
class EditPlan:
    """An SDEdit request's source: token ids (L,) of the text, the kept mask (L,) bool (True outside the
    spans to re-noise; all False without spans), and, for character spans, the text pieces
    ``(text, kept)`` that the output is stitched from (kept pieces verbatim, so they cannot change)."""

    ids: Tensor
    known: Tensor
    pieces: list[tuple[str, bool]] | None = None

    def text_of(self, tok: Tokenizer, ids: list[int]) -> str:
        """The edited text: kept character pieces verbatim, edited pieces decoded from ``ids``."""
        if self.pieces is None:
            return tok.decode(ids)
        out, pos = [], 0
        for text, kept in self.pieces:
            n = len(tok.encode(text)) if text else 0
            out.append(text if kept else tok.decode(ids[pos : pos + n]))
            pos += n
        return "".join(out)


def plan_edit(tok: Tokenizer, text: str, spans: str | None = None, char_spans: str | None = None) -> EditPlan:
    """The source of ``replaid edit``: the whole text re-noised, or only token spans (``--token-span``,
    as ``--infill``) or character spans (``--span``; each piece is tokenised alone) of it."""
    if spans is not None and char_spans is not None:
        raise RequestError(f"give {ref('edit_chars')} (characters) or {ref('edit_span')} (token positions), not both")
    if not text:
        raise RequestError(f"{ref('edit')} is empty: give the text to edit")
    if char_spans is None:
        ids = tok.encode(text)
        if len(ids) < 2:
            raise RequestError(f"{ref('edit')} is {len(ids)} token long; editing needs at least 2 tokens")
        known = parse_infill_spans(spans, len(ids)) if spans is not None else torch.zeros(len(ids), dtype=torch.bool)
        if bool(known.all()):
            raise ValueError("nothing to edit: the spans cover no position")
        return EditPlan(torch.tensor(ids, dtype=torch.long), known)
    cuts = []
    for part in filter(None, (p.strip() for p in char_spans.split(","))):
        a, sep, b = part.partition(":")
        try:
            start, end = int(a) if a.strip() else 0, int(b) if b.strip() else len(text)
        except ValueError:
            sep = ""
        if not sep or not 0 <= start < end <= len(text):
            raise RequestError(
                f"bad {ref('edit_chars')} {part!r}: expected START:END with 0 <= START < END <= {len(text)} (the text's characters)"
            )
        cuts.append((start, end))
    cuts.sort()
    if not cuts or any(b[0] < a[1] for a, b in zip(cuts, cuts[1:], strict=False)):
        raise RequestError(f"{ref('edit_chars')} {char_spans!r}: give non-overlapping START:END character spans")
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for start, end in cuts:
        pieces += [(text[pos:start], True), (text[start:end], False)]
        pos = end
    pieces.append((text[pos:], True))
    pieces = [(t, k) for t, k in pieces if t]
    all_ids: list[int] = []
    kept: list[bool] = []
    for t, k in pieces:
        piece_ids = tok.encode(t)
        all_ids += piece_ids
        kept += [k] * len(piece_ids)
    return EditPlan(torch.tensor(all_ids, dtype=torch.long), torch.tensor(kept, dtype=torch.bool), pieces)
