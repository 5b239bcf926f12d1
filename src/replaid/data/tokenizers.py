"""Tokenizers behind one interface: ``build_tokenizer(kind, path)``.

Kinds: ``gpt2`` (local ``tokenizer.json`` or ``vocab.json``+``merges.txt``, else the hub),
``llama2`` (a sentencepiece ``tokenizer.model``), ``bert-base-cased``/``bert-base-uncased``
(a local ``vocab.txt``/``tokenizer.json``, else the hub), ``bpe`` (a byte-level BPE trained on
the corpus and cached by corpus fingerprint) and ``file`` (any saved ``tokenizer.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from replaid import schema
from replaid.data.errors import DataError
from replaid.fileio import atomic_write_text
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    import tokenizers

EOT = "<|endoftext|>"
KINDS = ("gpt2", "llama2", "bert-base-cased", "bert-base-uncased", "bpe", "file")
_EOS_CANDIDATES = (EOT, "</s>", "[SEP]", "<eos>")
_PAD_CANDIDATES = ("[PAD]", "<pad>", "<|pad|>")
SPEC_FILE = "tokenizer_spec.json"


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` (no special tokens added on encode)."""

    def __init__(
        self, tok: tokenizers.Tokenizer, *, name: str, kind: str, path: str = "", eos_token: str | None = None
    ) -> None:
        self._tok = tok
        self.name, self.kind, self.path = name, kind, path
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        eos = tok.token_to_id(eos_token) if eos_token else _first_id(tok, _EOS_CANDIDATES)
        if eos is None:
            raise DataError(
                f"tokenizer {name!r} has no end-of-text token ({', '.join(_EOS_CANDIDATES)}): "
                f"use a tokenizer that defines one"
            )
        self.eos_id: int = eos
        self.pad_id: int | None = _first_id(tok, _PAD_CANDIDATES)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return self._tok.to_str()


class SentencePieceTokenizer:
    """A sentencepiece model (Llama-2); no BOS/EOS added on encode."""

    def __init__(self, model_file: str, *, name: str = "llama2", kind: str = "llama2") -> None:
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(model_file))
        except (OSError, RuntimeError) as e:
            raise DataError(
                f"cannot load sentencepiece model {model_file} ({str(e)[:120]}): set "
                f"data.tokenizer_path to a valid tokenizer.model"
            ) from None
        self.name, self.kind, self.path = name, kind, str(model_file)
        self.vocab_size = self._sp.get_piece_size()
        self.eos_id = self._sp.eos_id()
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else None

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._sp.encode(text)
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        ids: list[list[int]] = self._sp.encode(list(texts))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._sp.decode([int(i) for i in ids])
        return text


def _first_id(tok: tokenizers.Tokenizer, tokens: Sequence[str]) -> int | None:
    for t in tokens:
        i = tok.token_to_id(t)
        if i is not None:
            return i
    return None


def _need_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"tokenizer file {path} not found: set data.tokenizer_path to {what}")
    return path


def _from_hub(name: str) -> tokenizers.Tokenizer:
    import tokenizers

    try:
        return tokenizers.Tokenizer.from_pretrained(name)
    except Exception as e:
        raise DataError(
            f"cannot download tokenizer {name!r} from the Hugging Face hub ({type(e).__name__}): "
            f"it needs network access; set data.tokenizer_path=... to a local copy"
        ) from None


# ------------------------------------------------------------------------------------ builders
def _gpt2(path: str) -> HFTokenizer:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    if not path:
        return HFTokenizer(_from_hub("gpt2"), name="gpt2", kind="gpt2", eos_token=EOT)
    p = Path(path)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        p = p / "tokenizer.json"
    if p.is_dir():
        vocab = _need_file(p / "vocab.json", "a directory with tokenizer.json or vocab.json+merges.txt")
        merges = _need_file(p / "merges.txt", "a directory with tokenizer.json or vocab.json+merges.txt")
        tok = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([EOT])
    else:
        tok = tokenizers.Tokenizer.from_file(str(_need_file(p, "the GPT-2 tokenizer.json or its directory")))
    return HFTokenizer(tok, name="gpt2", kind="gpt2", path=str(Path(path).resolve()), eos_token=EOT)


def _llama2(path: str) -> SentencePieceTokenizer:
    if not path:
        raise DataError(
            "the llama2 tokenizer needs a local sentencepiece model: set data.tokenizer_path=.../tokenizer.model"
        )
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.model"
    return SentencePieceTokenizer(str(_need_file(p, "a sentencepiece tokenizer.model").resolve()))


def _bert(kind: str, path: str) -> HFTokenizer:
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    if not path:
        return HFTokenizer(_from_hub(kind), name=kind, kind=kind, eos_token="[SEP]")
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json" if (p / "tokenizer.json").is_file() else p / "vocab.txt"
    _need_file(p, "a BERT vocab.txt or tokenizer.json (or their directory)")
    if p.suffix == ".json":
        tok = tokenizers.Tokenizer.from_file(str(p))
    else:
        tok = tokenizers.Tokenizer(models.WordPiece.from_file(str(p), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=kind.endswith("uncased"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.add_special_tokens(
            [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if tok.token_to_id(t) is not None]
        )
    return HFTokenizer(tok, name=kind, kind=kind, path=str(Path(path).resolve()), eos_token="[SEP]")


def train_bpe(texts: Iterator[str], vocab_size: int) -> tokenizers.Tokenizer:
    """Train a byte-level BPE (special token ``<|endoftext|>``) on ``texts``."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise DataError(f"bpe vocab_size {vocab_size} is too small: use at least 257 (256 bytes + EOS)")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        show_progress=True,  # stderr
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(split_long_words(texts), trainer=trainer)
    return tok


MAX_WORD_CHARS = 256
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1},}}")


def split_long_words(texts: Iterator[str], n: int = MAX_WORD_CHARS) -> Iterator[str]:
    """Texts for BPE training, a run of more than ``n`` non-space characters cut into ``n``-character
    pieces given as separate texts. BPE training time grows super-linearly with the length of a
    pre-tokenised word (text without whitespace: 240 KB took 39 s, 795 KB over 300 s); ordinary
    words are untouched, so the trained vocabulary of ordinary text does not change."""
    for text in texts:
        if not _LONG_WORD.search(text):
            yield text
            continue
        start = 0
        for m in _LONG_WORD.finditer(text):
            word = m.group()
            yield text[start : m.start()] + word[:n]
            for i in range(n, len(word), n):
                yield word[i : i + n]
            start = m.end()
        yield text[start:]


def _content_name(kind: str, tok: tokenizers.Tokenizer) -> str:
    digest = hashlib.sha256(tok.to_str().encode()).hexdigest()[:10]
    return f"{kind}-{tok.get_vocab_size(with_added_tokens=True)}-{digest}"


def _bpe(
    path: str,
    corpus: Callable[[], Iterator[str]] | None,
    vocab_size: int,
    cache_dir: str | os.PathLike[str] | None,
    fingerprint: str,
) -> HFTokenizer:
    if path.endswith(".json"):
        return load_tokenizer_file(path, kind="bpe")
    fingerprint = fingerprint or path
    cached = None
    if cache_dir is not None and fingerprint:
        key = hashlib.sha256(f"bpe|v1|{fingerprint}|{vocab_size}".encode()).hexdigest()[:16]
        cached = Path(cache_dir) / f"bpe-{vocab_size}-{key}.json"
        if cached.is_file():
            return load_tokenizer_file(cached, kind="bpe")
    if corpus is None:
        raise DataError(
            "the bpe tokenizer is not cached and has no corpus to train on: pass the training "
            "corpus (data.source) or set data.tokenizer_path to a saved tokenizer.json"
        )
    tok = train_bpe(corpus(), vocab_size)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, cached)
    return HFTokenizer(tok, name=_content_name("bpe", tok), kind="bpe", eos_token=EOT)


def build_tokenizer(
    kind: str,
    path: str = "",
    *,
    corpus: Callable[[], Iterator[str]] | None = None,
    vocab_size: int = 2048,
    cache_dir: str | os.PathLike[str] | None = None,
    fingerprint: str = "",
) -> Tokenizer:
    """Build a tokenizer of ``kind`` from ``path`` (bpe: train on ``corpus()`` or load from cache).

    For ``bpe``, the cache key is ``fingerprint`` (or ``path``) plus ``vocab_size``; a ``path``
    ending in ``.json`` loads that saved tokenizer instead.
    """
    kind = kind.lower()
    path = str(path or "")
    if kind == "gpt2":
        return _gpt2(path)
    if kind in ("llama2", "llama"):
        return _llama2(path)
    if kind in ("bert-base-cased", "bert-base-uncased"):
        return _bert(kind, path)
    if kind == "bpe":
        return _bpe(path, corpus, vocab_size, cache_dir, fingerprint)
    if kind == "file":
        return load_tokenizer_file(path)
    raise DataError(f"unknown tokenizer kind {kind!r}: set data.tokenizer to one of {', '.join(KINDS)}")


def load_tokenizer_file(
    json_path: str | os.PathLike[str], *, kind: str = "file", name: str | None = None
) -> HFTokenizer:
    """Load a Hugging Face ``tokenizer.json`` (e.g. one a run directory carries)."""
    import tokenizers

    p = _need_file(Path(json_path), "a saved tokenizer.json")
    try:
        tok = tokenizers.Tokenizer.from_file(str(p))
    except Exception as e:
        raise DataError(
            f"cannot read tokenizer file {p} ({str(e)[:120]}): set data.tokenizer_path to a valid tokenizer.json"
        ) from None
    return HFTokenizer(tok, name=name or _content_name(kind, tok), kind=kind, path=str(p.resolve()))


def save_tokenizer(tok: Tokenizer, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Save what is needed to rebuild ``tok`` into ``out_dir``; return the spec (also written there).

    Trained/file tokenizers are copied as ``tokenizer.json``; the others store kind and path.
    """
    kind = getattr(tok, "kind", None)
    if kind not in KINDS:
        raise DataError(f"cannot save tokenizer {tok.name!r} of unknown kind: build it with build_tokenizer")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = {"kind": kind, "name": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "pad_id": tok.pad_id}
    if kind in ("bpe", "file"):
        atomic_write_text(out / "tokenizer.json", tok.to_json())  # type: ignore[attr-defined]
        spec["file"] = "tokenizer.json"
    else:
        spec["path"] = getattr(tok, "path", "")
    atomic_write_text(out / SPEC_FILE, strict_dumps(spec, indent=2) + "\n")  # last: its presence means complete
    return spec


def load_saved_tokenizer(spec: dict[str, Any] | None, out_dir: str | os.PathLike[str]) -> Tokenizer:
    """Rebuild a tokenizer saved by ``save_tokenizer`` (spec None: read it from ``out_dir``)."""
    if spec is None:
        spec_path = _need_file(Path(out_dir) / SPEC_FILE, "a run directory holding tokenizer_spec.json")
        fix = "the tokenizer file is damaged: restore the run's tokenizer/ folder or retrain with --overwrite"
        try:
            spec = schema.read_json(spec_path, schema.TOKENIZER_SPEC, fix)
        except schema.SchemaError as e:
            raise DataError(str(e)) from None
    if "file" in spec:
        tok: Tokenizer = load_tokenizer_file(Path(out_dir) / spec["file"], kind=spec["kind"], name=spec["name"])
    else:
        tok = build_tokenizer(spec["kind"], spec.get("path", ""))
    if tok.vocab_size != spec["vocab_size"]:
        raise DataError(
            f"restored tokenizer {spec['name']!r} has vocab {tok.vocab_size}, the saved one "
            f"{spec['vocab_size']}: point data.tokenizer_path at the original tokenizer files"
        )
    return tok


def vocab_sha256(tok: Tokenizer) -> str:
    """sha256 of the id -> token table of ``tok`` (what decoding reads), whatever files it came from."""
    if isinstance(tok, HFTokenizer):
        table = sorted((i, t) for t, i in tok._tok.get_vocab(with_added_tokens=True).items())
    elif isinstance(tok, SentencePieceTokenizer):
        table = [(i, tok._sp.id_to_piece(i)) for i in range(tok.vocab_size)]
    else:
        table = [(i, tok.decode([i])) for i in range(tok.vocab_size)]
    return hashlib.sha256(strict_dumps(table, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def tokenizer_files_sha256(folder: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of the files a saved tokenizer folder (``RUN/tokenizer/``) is rebuilt from: its spec and
    the file the spec names (another file there changes nothing and is left out)."""
    root = Path(folder)
    spec_path = root / SPEC_FILE
    if not spec_path.is_file():
        return {}
    try:
        named = json.loads(spec_path.read_text(encoding="utf-8")).get("file")
    except (ValueError, AttributeError, UnicodeDecodeError):
        named = None
    names = [SPEC_FILE] + ([named] if isinstance(named, str) and (root / named).is_file() else [])
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in sorted(names)}


def tokenizer_for_source(
    kind: str,
    path: str = "",
    source: str = "",
    *,
    text_field: str = "text",
    vocab_size: int = 2048,
    cache_dir: str | os.PathLike[str] | None = None,
    max_docs: int = 0,
) -> Tokenizer:
    """``build_tokenizer``, training a ``bpe`` on the train split of ``source`` when needed."""
    if kind.lower() != "bpe" or str(path).endswith(".json"):
        return build_tokenizer(kind, path, vocab_size=vocab_size, cache_dir=cache_dir)
    from replaid.data.sources import iter_documents, source_fingerprint

    fingerprint = f"{source_fingerprint(source, 'train')}|{text_field}|{max_docs}"
    return build_tokenizer(
        "bpe",
        corpus=lambda: iter_documents(source, "train", text_field, max_docs),
        vocab_size=vocab_size,
        cache_dir=cache_dir,
        fingerprint=fingerprint,
    )
