"""Tokenise a document stream once into a flat token file (``.bin``) with EOS after every document.

Beside ``x.bin`` live ``x.json`` (meta: dtype, n_tokens, n_docs, vocab_size, tokenizer, ...) and
``x.idx.npy`` (int64 document start offsets, ``n_docs + 1`` entries). Every file is written to a
temporary name and renamed, the meta last, so a present meta means a complete cache.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from replaid.data.errors import DataError
from replaid.data.sources import iter_documents, source_fingerprint
from replaid.data.tokenizers import Tokenizer
from replaid.schema import dumps as strict_dumps

CACHE_VERSION = 1


def cache_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def meta_path(cache_path: Path) -> Path:
    return Path(cache_path).with_suffix(".json")


def index_path(cache_path: Path) -> Path:
    return Path(cache_path).with_suffix(".idx.npy")


def _batched(items: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def _replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_cache(cache_path: str | os.PathLike[str]) -> tuple[np.memmap, dict[str, Any]]:
    """Open a complete cache read-only: ``(tokens, meta)``."""
    cache_path = Path(cache_path)
    try:
        meta = json.loads(meta_path(cache_path).read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        int(meta["n_tokens"])
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"token cache meta {meta_path(cache_path)} is damaged ({e.__class__.__name__}): delete it "
            f"and {cache_path.name} to rebuild"
        ) from None
    size = cache_path.stat().st_size if cache_path.exists() else -1
    if size != meta["n_tokens"] * dtype.itemsize:
        raise DataError(
            f"token cache {cache_path} is incomplete ({size} bytes, expected "
            f"{meta['n_tokens'] * dtype.itemsize}): delete it and its .json to rebuild"
        )
    meta["path"] = str(cache_path)
    return np.memmap(cache_path, dtype=dtype, mode="r", shape=(meta["n_tokens"],)), meta


def load_doc_offsets(cache_path: str | os.PathLike[str]) -> np.ndarray:
    """Document start offsets (``n_docs + 1`` int64 entries, the last = n_tokens)."""
    path = index_path(Path(cache_path))
    if not path.is_file():
        raise DataError(f"document index {path} not found: delete the token cache {cache_path} to rebuild it")
    offsets: np.ndarray = np.load(path)
    return offsets


def tokenize_to_cache(
    docs: Iterable[str],
    tok: Tokenizer,
    cache_path: str | os.PathLike[str],
    *,
    show_progress: bool = True,
    batch_docs: int = 64,
    extra_meta: dict[str, Any] | None = None,
) -> np.memmap:
    """Tokenise ``docs`` (EOS after each) into ``cache_path`` unless it already exists; return the memmap."""
    cache_path = Path(cache_path)
    if cache_path.exists() and meta_path(cache_path).exists():
        return open_cache(cache_path)[0]
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    dtype = cache_dtype(tok.vocab_size)
    offsets = [0]
    max_id = -1

    def write_tokens(tmp: Path) -> None:
        nonlocal max_id
        total = len(docs) if hasattr(docs, "__len__") else None  # type: ignore[arg-type]
        with (
            open(tmp, "wb") as f,
            tqdm(total=total, desc=f"tokenizing {cache_path.name}", unit="doc", disable=not show_progress) as bar,
        ):
            for batch in _batched(docs, batch_docs):
                encoded = tok.encode_batch(batch)
                flat = np.fromiter(itertools.chain.from_iterable(ids + [tok.eos_id] for ids in encoded), dtype=np.int64)
                if flat.size:
                    max_id = max(max_id, int(flat.max()))
                    if int(flat.min()) < 0 or max_id >= tok.vocab_size:
                        raise DataError(
                            f"tokenizer {tok.name!r} produced id {max_id} outside its vocab "
                            f"{tok.vocab_size}: use a consistent tokenizer"
                        )
                f.write(flat.astype(dtype).tobytes())
                for ids in encoded:
                    offsets.append(offsets[-1] + len(ids) + 1)
                bar.update(len(batch))
        if len(offsets) == 1:
            raise DataError(
                f"no documents to tokenise for {cache_path.name}: the source is empty; point "
                f"data.source at a non-empty corpus"
            )

    _replace_atomically(cache_path, write_tokens)

    def write_index(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(offsets, dtype=np.int64))

    _replace_atomically(index_path(cache_path), write_index)
    meta = {
        "version": CACHE_VERSION,
        "dtype": dtype.name,
        "n_tokens": offsets[-1],
        "n_docs": len(offsets) - 1,
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.name,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "max_id": max_id,
        "bin": cache_path.name,
        "index": index_path(cache_path).name,
        **(extra_meta or {}),
    }
    _replace_atomically(
        meta_path(cache_path), lambda tmp: tmp.write_text(strict_dumps(meta, indent=2) + "\n", encoding="utf-8")
    )
    return open_cache(cache_path)[0]


def validate_tokens(arr: np.ndarray, vocab_size: int, where: str = "the token array") -> None:
    """Raise DataError (naming the max id) if any id is >= ``vocab_size``."""
    chunk = 1 << 24
    max_id = max((int(np.max(arr[s : s + chunk])) for s in range(0, len(arr), chunk)), default=-1)
    if max_id >= vocab_size:
        raise DataError(
            f"token id {max_id} >= vocab size {vocab_size} in {where}: it was built with another "
            f"tokenizer; delete the cache file(s) or use the matching data.tokenizer"
        )


def cache_key(source: str, split: str, tok: Tokenizer, text_field: str = "text", max_docs: int = 0) -> str:
    """Stable file stem for (source split, tokenizer, options)."""
    fingerprint = source_fingerprint(source, split)
    raw = f"v{CACHE_VERSION}|{fingerprint}|{tok.name}|{tok.vocab_size}|{text_field}|{max_docs}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", tok.name)[:40]
    return f"{split}-{slug}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def get_token_array(
    source: str,
    split: str,
    tok: Tokenizer,
    cache_dir: str | os.PathLike[str],
    *,
    text_field: str = "text",
    max_docs: int = 0,
    show_progress: bool = True,
    validate: bool = True,
) -> tuple[np.memmap, dict[str, Any]]:
    """Token array of ``split`` of ``source`` (tokenised once into ``cache_dir``) and its meta."""
    path = Path(cache_dir) / f"{cache_key(source, split, tok, text_field, max_docs)}.bin"
    docs = iter_documents(source, split, text_field, max_docs)
    arr = tokenize_to_cache(
        docs,
        tok,
        path,
        show_progress=show_progress,
        extra_meta={"source": source, "split": split, "text_field": text_field},
    )
    meta = open_cache(path)[1]
    if meta["vocab_size"] != tok.vocab_size or meta["tokenizer"] != tok.name:
        raise DataError(
            f"token cache {path} was built with tokenizer {meta['tokenizer']!r} (vocab "
            f"{meta['vocab_size']}), not {tok.name!r}: delete it to rebuild"
        )
    if validate:
        validate_tokens(arr, tok.vocab_size, str(path))
    return arr, meta
