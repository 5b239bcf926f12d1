"""Document sources behind one interface: ``iter_documents(source, split)``.

``source`` is one of

* ``"stdlib"``: docstrings of the installed Python standard library (no download needed);
* a local path: a ``.jsonl`` file (text under ``text_field``), a ``.txt``/``.md``/``.rst`` file
  (one document per file), or a directory of such files. A directory holding
  ``train``/``valid``/``test`` files uses the file of the split; anything else is split 90/5/5
  by a hash of each document;
* ``"hf:NAME"`` or ``"hf:NAME:CONFIG"``: a Hugging Face dataset (needs network or a local copy).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from replaid.data.errors import DataError
from replaid.schema import dumps as strict_dumps

SPLITS = ("train", "valid", "test")
SPLIT_STEMS = {"train": ("train",), "valid": ("valid", "validation", "val"), "test": ("test",)}
TEXT_SUFFIXES = (".txt", ".md", ".rst")
DOC_SUFFIXES = (".jsonl",) + TEXT_SUFFIXES
STDLIB_MIN_CHARS = 200
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
_FIX_SOURCE = "point data.source at a non-empty .jsonl/.txt file or directory, or use data.source=stdlib"


def check_split(split: str) -> None:
    """Raise DataError unless ``split`` is train, valid or test."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: use one of train, valid, test")


def hash_split(key: str) -> str:
    """Deterministic ~90/5/5 assignment of a document key to train/valid/test."""
    bucket = int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "valid" if bucket < 95 else "test"


def iter_documents(source: str, split: str, text_field: str = "text", max_docs: int = 0) -> Iterator[str]:
    """Yield the documents of ``split`` of ``source`` (at most ``max_docs`` if > 0)."""
    check_split(split)
    if source == "stdlib":
        docs: Iterable[str] = (text for rel, text in stdlib_modules() if hash_split(rel) == split)
        docs = _nonempty(
            docs,
            f"no documents in split {split!r} of the stdlib corpus: no docstrings found "
            f"under {stdlib_root()}; use a local data.source instead",
        )
    elif source.startswith("hf:"):
        docs = iter_hf_documents(hf_spec(source), split, text_field)
    else:
        docs = _local_documents(Path(source), split, text_field)
    for n, doc in enumerate(docs, 1):
        yield doc
        if max_docs and n >= max_docs:
            return


def source_fingerprint(source: str, split: str) -> str:
    """A stable string identifying the data of ``split`` (for cache keys)."""
    check_split(split)
    if source == "stdlib":
        return f"stdlib:v1:{sys.version.split()[0]}:{stdlib_root()}:{split}"
    if source.startswith("hf:"):
        spec = hf_spec(source)
        return f"hf:{spec.path}:{spec.config}:{spec.holdout}:{split}"
    files, presplit = _local_files(Path(source), split)
    stats = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return f"local:{'split' if presplit else 'hash'}:{split}:" + "|".join(stats)


# A run's corpus fingerprint (recorded in its checkpoints, compared on ``train --resume``). It must be
# cheap on a 10 GB corpus, so each file contributes its name, its size and the sha256 of a sample of
# its bytes: the whole file up to FULL_HASH_BYTES, else its first and last SAMPLE_BYTES and
# SAMPLE_BLOCKS blocks of BLOCK_BYTES spread evenly in between (about 2.5 MiB read per file). No mtime:
# a copy or a 'touch' of the same bytes is the same corpus. It misses an edit inside a file over
# FULL_HASH_BYTES that keeps the file's size and falls between the sampled blocks.
SAMPLE_BYTES = 1 << 20
FULL_HASH_BYTES = 2 * SAMPLE_BYTES
SAMPLE_BLOCKS, BLOCK_BYTES = 8, 1 << 16


def sampled_sha256(path: Path, size: int) -> str:
    """sha256 of ``path``'s bytes (all of them up to FULL_HASH_BYTES, else a fixed sample) and size."""
    h = hashlib.sha256(f"{size}|".encode())
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(SAMPLE_BYTES), b""):
                h.update(block)
            return h.hexdigest()
        span = size - 2 * SAMPLE_BYTES - BLOCK_BYTES
        offsets = [(0, SAMPLE_BYTES)]
        offsets += [(SAMPLE_BYTES + span * (i + 1) // (SAMPLE_BLOCKS + 1), BLOCK_BYTES) for i in range(SAMPLE_BLOCKS)]
        offsets += [(size - SAMPLE_BYTES, SAMPLE_BYTES)]
        for offset, n in offsets:
            f.seek(offset)
            h.update(f.read(n))
    return h.hexdigest()


def corpus_files(root: Path) -> list[Path]:
    """Every file of a local corpus ``root``: the file itself, the split files of a pre-split folder, or
    the document files of a folder split by hash."""
    if root.is_file():
        return [root]
    presplit = [f for s in SPLITS if (f := _split_file(root, s)) is not None] if root.is_dir() else []
    return list(dict.fromkeys(presplit)) or _local_files(root, "train")[0]


def corpus_fingerprint(source: str) -> dict[str, Any]:
    """What identifies the corpus of ``data.source`` for a run (``"sha256"``: a digest of the rest).

    ``local``: each file's name (relative to the source), size and :func:`sampled_sha256`;
    ``stdlib``: the Python version; ``hf``: the dataset's name, config, split mapping and holdout
    (a new revision of the same Hub dataset is not seen: nothing is downloaded to check it)."""
    fp: dict[str, Any]
    if source == "stdlib":
        fp = {"kind": "stdlib", "python": sys.version.split()[0]}
    elif source.startswith("hf:"):
        spec = hf_spec(source)
        fp = {"kind": "hf", "name": spec.path, "config": spec.config, "splits": spec.splits, "holdout": spec.holdout}
    else:
        root = Path(source)
        entries = []
        for p in corpus_files(root):
            size = p.stat().st_size
            name = p.name if p == root else p.relative_to(root).as_posix()
            entries.append({"name": name, "size": size, "sha256": sampled_sha256(p, size)})
        fp = {"kind": "local", "files": entries}
    fp["sha256"] = hashlib.sha256(strict_dumps(fp, sort_keys=True).encode()).hexdigest()
    return fp


def corpus_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two :func:`corpus_fingerprint` results, in a few words ("" when nothing)."""
    if old.get("sha256") == new.get("sha256"):
        return ""
    if old.get("kind") != "local" or new.get("kind") != "local":
        keys = [k for k in sorted(set(old) | set(new)) if k != "sha256" and old.get(k) != new.get(k)]
        return "; ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:3]) or "its fingerprint differs"
    before = {f["name"]: f for f in old.get("files", []) if isinstance(f, dict) and "name" in f}
    after = {f["name"]: f for f in new.get("files", [])}
    said = [f"{n} removed" for n in before if n not in after] + [f"{n} added" for n in after if n not in before]
    for n in (n for n in after if n in before):
        if before[n].get("size") != after[n]["size"]:
            said.append(f"{n} size {before[n].get('size')} -> {after[n]['size']} bytes")
        elif before[n].get("sha256") != after[n]["sha256"]:
            said.append(f"{n} content changed (same size)")
    more = f" and {len(said) - 3} more" if len(said) > 3 else ""
    return (", ".join(said[:3]) + more) or "its fingerprint differs"


def _nonempty(docs: Iterable[str], message: str) -> Iterator[str]:
    """Pass ``docs`` through; raise DataError(message) if there were none."""
    seen = False
    for doc in docs:
        seen = True
        yield doc
    if not seen:
        raise DataError(message)


# --------------------------------------------------------------------------------------- stdlib
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _defs(stmts: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Class/function definitions among ``stmts`` and their nested blocks, in source order."""
    for st in stmts:
        if isinstance(st, _DEFS):
            yield st
        for attr in ("body", "orelse", "finalbody", "handlers", "cases"):
            sub = getattr(st, attr, None)
            if isinstance(sub, list):
                yield from _defs(sub)


def _docstrings(tree: ast.Module) -> Iterator[str]:
    """Docstrings of a module, its classes and functions, in source order."""
    for node in [tree, *_defs(tree.body)]:
        doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
        if doc and doc.strip():
            yield doc.strip()


@lru_cache(maxsize=1)
def stdlib_modules() -> tuple[tuple[str, str], ...]:
    """(relative path, joined docstrings) of every stdlib module with enough documentation."""
    root = stdlib_root()
    paths = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if not _STDLIB_SKIP_DIRS.intersection(rel.parts[:-1]):
            paths.append(path)
    out = []
    for path in sorted(paths):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue
        text = "\n\n".join(_docstrings(tree))
        if len(text) >= STDLIB_MIN_CHARS:
            out.append((path.relative_to(root).as_posix(), text))
    return tuple(out)


# ---------------------------------------------------------------------------------------- local
def _not_a_file(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (a folder, a pipe, ...); None otherwise."""
    if not path.exists() or path.is_file():
        return None
    if path.is_dir():
        return "a folder"
    return "a pipe" if path.is_fifo() else "a socket" if path.is_socket() else "a device or special file"


def _split_file(root: Path, split: str) -> Path | None:
    for stem in SPLIT_STEMS[split]:
        for suffix in (".jsonl", ".txt"):
            f = root / f"{stem}{suffix}"
            if f.is_file():
                return f
            if what := _not_a_file(f):
                raise DataError(
                    f"{f} is {what}, not a corpus file: the {split} split of {root} must be a regular "
                    f"{suffix} file; replace it with one (or rename it)"
                )
    return None


def _local_files(root: Path, split: str) -> tuple[list[Path], bool]:
    """The files holding ``split`` and whether they are pre-split (no hashing needed)."""
    if not root.exists():
        raise DataError(f"data source {str(root)!r} does not exist: {_FIX_SOURCE}")
    if (what := _not_a_file(root)) and not root.is_dir():  # read, it would block or never end
        raise DataError(
            f"data source {str(root)!r} is {what}, not a corpus file or folder: save the corpus to a "
            f".jsonl/.txt file (or a folder of them) and point data.source there"
        )
    if root.is_file():
        return [root], False
    by_split = {s: _split_file(root, s) for s in SPLITS}
    if any(by_split.values()):
        found = by_split[split]
        if found is None:
            have = ", ".join(s for s, f in by_split.items() if f)
            raise DataError(
                f"split {split!r} not found in {root} (it has {have}): add a {split}.jsonl "
                f"or {split}.txt file there, or use one of the existing splits"
            )
        return [found], True
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in DOC_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if not files:
        raise DataError(f"no documents found in {root}: the directory has no .jsonl/.txt/.md/.rst files; {_FIX_SOURCE}")
    return files, False


def _utf8(data: bytes, path: Path, lineno: int, start: int) -> str:
    """``data`` (line ``lineno`` of ``path``, or the whole file for 0, at byte ``start``) decoded as UTF-8;
    a DataError naming the file, the line and the byte offset when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lineno or data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path}:{line} is not UTF-8 text (byte {start + e.start}: 0x{data[e.start]:02x}): corpus files "
            f"must be UTF-8; convert the file (e.g. iconv -f latin1 -t utf-8) or remove the bad bytes"
        ) from None


def _file_documents(path: Path, text_field: str) -> Iterator[str]:
    """Documents of one file: JSONL lines or the whole text file (UTF-8, strictly)."""
    if path.suffix != ".jsonl":
        text = _utf8(path.read_bytes(), path, 0, 0).replace("\r\n", "\n").replace("\r", "\n")  # as text mode
        if text.strip():
            yield text
        return
    with path.open("rb") as f:
        offset, lineno = 0, 0
        for raw in f:  # split as text mode reads it (universal newlines), each line decoded strictly
            for line in io.StringIO(_utf8(raw, path, lineno + 1, offset), newline=None):
                lineno += 1
                yield from _jsonl_document(line, path, lineno, text_field)
            offset += len(raw)


def _jsonl_document(line: str, path: Path, lineno: int, text_field: str) -> Iterator[str]:
    """The document of one JSONL line (none for a blank line or an empty text)."""
    if not line.strip():
        return
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}:{lineno} is not valid JSON ({e.msg}): each line of a .jsonl file "
            f'must be one JSON object like {{"{text_field}": "..."}}'
        ) from None
    if not isinstance(obj, dict) or text_field not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise DataError(
            f"{path}:{lineno} has no {text_field!r} field (found {keys}): set "
            f"data.text_field to the field that holds the text"
        )
    text = obj[text_field]
    if not isinstance(text, str):
        raise DataError(
            f"{path}:{lineno} field {text_field!r} is {type(text).__name__}, not text: "
            f"set data.text_field to a string field"
        )
    if text:
        yield text


def _local_documents(root: Path, split: str, text_field: str) -> Iterator[str]:
    files, presplit = _local_files(root, split)
    if presplit:
        yield from _nonempty(
            _file_documents(files[0], text_field), f"no documents found in {files[0]}: the file is empty; {_FIX_SOURCE}"
        )
        return
    total = 0
    kept = 0
    for path in files:
        for doc in _file_documents(path, text_field):
            total += 1
            if hash_split(doc) == split:
                kept += 1
                yield doc
    if total == 0:
        raise DataError(f"no documents found in {root}: the file(s) are empty; {_FIX_SOURCE}")
    if kept == 0:
        raise DataError(
            f"no documents for split {split!r} in {root}: all {total} document(s) hash to other "
            f"splits (90/5/5); add more documents or give a directory with train/valid/test files"
        )


# ------------------------------------------------------------------------------- Hugging Face
_HOLDOUT_SPLITS = {"train": "train", "valid": "train", "test": "train"}


@dataclass(frozen=True)
class HFSpec:
    """How to load one Hugging Face dataset and map our splits onto its splits.

    ``holdout > 0`` follows MDLM's OpenWebText convention: valid (= test) is the last
    ``holdout`` documents of the hub's train split, and train excludes them.
    """

    path: str
    config: str | None = None
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"})
    holdout: int = 0
    streaming: bool = False
    data_files: Any = None
    wikitext: bool = False  # group wikitext's line rows into articles


HF_DATASETS: dict[str, HFSpec] = {
    "openwebtext": HFSpec("openwebtext", splits=_HOLDOUT_SPLITS, holdout=100_000),
    "lm1b": HFSpec("lm1b", splits={"train": "train", "valid": "test", "test": "test"}),
    "slimpajama": HFSpec("cerebras/SlimPajama-627B", streaming=True),
    "wikitext": HFSpec("wikitext", "wikitext-103-raw-v1", wikitext=True),
    "wikitext103": HFSpec("wikitext", "wikitext-103-raw-v1", wikitext=True),
    "wikitext2": HFSpec("wikitext", "wikitext-2-raw-v1", wikitext=True),
}


def hf_spec(source: str) -> HFSpec:
    """Parse ``hf:NAME`` / ``hf:NAME:CONFIG`` into an HFSpec (known names get their conventions)."""
    parts = source[3:].split(":") if source.startswith("hf:") else [source]
    if not parts[0] or len(parts) > 2:
        raise DataError(f"bad Hugging Face source {source!r}: write it as hf:NAME or hf:NAME:CONFIG")
    name, config = parts[0], (parts[1] if len(parts) == 2 else None)
    spec = HF_DATASETS.get(name.lower(), HFSpec(name))
    return spec if config is None else replace(spec, config=config)


def holdout_split(ds: Any, split: str, holdout: int) -> Any:
    """OWT convention on a map-style dataset: the last ``holdout`` rows are valid/test."""
    n = len(ds)
    if n <= holdout:
        raise DataError(
            f"dataset has {n} documents, not more than the {holdout}-document holdout: "
            f"use a larger dataset or a smaller holdout"
        )
    return ds.select(range(n - holdout)) if split == "train" else ds.select(range(n - holdout, n))


HUB_PROBE_SECONDS = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the Hugging Face Hub (``HF_ENDPOINT``) cannot be reached, from one TCP connection of at
    most ``timeout`` seconds; None when it answers, when ``HF_HUB_OFFLINE`` is set (the libraries then
    read their cache without the network) or behind a proxy (which this probe cannot see through).
    Lets a Hub load fail in one line at once instead of after minutes of the libraries' retries."""
    import os
    import socket
    from urllib.parse import urlsplit

    try:
        from huggingface_hub import constants

        endpoint, offline = constants.ENDPOINT, bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - comes with transformers
        endpoint, offline = os.environ.get("HF_ENDPOINT", "https://huggingface.co"), False
    if offline or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    u = urlsplit(endpoint)
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
        socket.create_connection((u.hostname or "", port), timeout=timeout).close()
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        return f"the Hugging Face Hub ({endpoint}) could not be reached: {why}"
    return None


def load_hf_split(spec: HFSpec, split: str, cache_dir: str | None = None) -> Any:
    """Load our ``split`` of the dataset (a ``datasets`` Dataset or IterableDataset)."""
    check_split(split)
    if not spec.data_files and (why := hub_unreachable()):  # local data files need no Hub
        raise DataError(
            f"cannot load Hugging Face dataset {spec.path!r}: {why}; set data.source to a local "
            f".jsonl/.txt path or directory (e.g. ../shared/data/wiki-sample), or set HF_HUB_OFFLINE=1 "
            f"to use a copy in the local Hugging Face cache"
        )
    try:
        import datasets

        dsets = datasets.load_dataset(
            spec.path, spec.config, data_files=spec.data_files, streaming=spec.streaming, cache_dir=cache_dir
        )
    except Exception as e:  # network, missing dataset, bad files: all the same fix
        reason = f"{type(e).__name__}: {str(e)[:200]}"
        raise DataError(
            f"cannot load Hugging Face dataset {spec.path!r} ({reason}): it needs network access "
            f"or a local copy; set data.source to a local .jsonl/.txt path or directory "
            f"(e.g. ../shared/data/wiki-sample) or data.source=stdlib"
        ) from None
    hub_split = spec.splits.get(split, split)
    if hub_split not in dsets:
        raise DataError(
            f"split {hub_split!r} does not exist in Hugging Face dataset {spec.path!r} (it has "
            f"{', '.join(dsets)}): use one of those splits or another data.source"
        )
    ds = dsets[hub_split]
    return holdout_split(ds, split, spec.holdout) if spec.holdout else ds


def _wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """Join wikitext's one-line rows into articles (an article starts at a ' = Title = ' line)."""
    buf: list[str] = []
    for line in lines:
        s = line.strip()
        is_title = s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")
        if is_title and any(b.strip() for b in buf):
            yield "".join(buf).strip("\n")
            buf = []
        buf.append(line)
    if any(b.strip() for b in buf):
        yield "".join(buf).strip("\n")


def _row_text(row: dict[str, Any], text_field: str, name: str) -> str:
    if text_field not in row:
        raise DataError(
            f"Hugging Face dataset {name!r} has no {text_field!r} field (it has {', '.join(row)}): "
            f"set data.text_field to the field holding the text"
        )
    text: str = row[text_field]
    return text


def iter_hf_documents(
    spec: HFSpec, split: str, text_field: str = "text", cache_dir: str | None = None
) -> Iterator[str]:
    """Yield the non-empty texts of our ``split`` of a Hugging Face dataset."""
    ds = load_hf_split(spec, split, cache_dir)
    texts: Iterable[str] = (_row_text(row, text_field, spec.path) for row in ds)
    if spec.wikitext:
        texts = _wikitext_articles(texts)
    yield from _nonempty(
        (t for t in texts if t and t.strip()),
        f"no documents in split {split!r} of Hugging Face dataset {spec.path!r}: "
        f"the split is empty; use another split or data.source",
    )
