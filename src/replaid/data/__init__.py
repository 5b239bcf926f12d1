"""Data pipeline: document sources -> tokenizer -> token cache -> fixed-length batches.

tok = tokenizer_for_source("bpe", source="stdlib", cache_dir=cache)
arr, meta = get_token_array("stdlib", "train", tok, cache)
loader = BatchLoader(SequenceDataset.from_cache(arr, meta, seq_len=128), batch_size=32, seed=0)
batch = next(loader)  # {"tokens": LongTensor (32, 128), "mask": None}
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaid.data.errors import DataError

if TYPE_CHECKING:
    from replaid.data.cache import get_token_array, load_doc_offsets, open_cache, tokenize_to_cache, validate_tokens
    from replaid.data.loader import BatchLoader, SequenceDataset, epoch_seed, unigram_logp, unigram_nll
    from replaid.data.sources import (
        HF_DATASETS,
        SPLITS,
        HFSpec,
        hf_spec,
        holdout_split,
        iter_documents,
        source_fingerprint,
    )
    from replaid.data.tokenizers import (
        Tokenizer,
        build_tokenizer,
        load_saved_tokenizer,
        load_tokenizer_file,
        save_tokenizer,
        tokenizer_for_source,
    )

# The names above load from their modules on first use (PEP 562), so importing a light module of the
# package (``replaid.data.zeroshot``'s table, ``DataError``) imports no torch or numpy: the CLI's parser
# reads ``replaid.data.zeroshot.SETS``.
_LAZY = {
    name: f"replaid.data.{module}"
    for module, names in {
        "cache": "get_token_array load_doc_offsets open_cache tokenize_to_cache validate_tokens",
        "loader": "BatchLoader SequenceDataset epoch_seed unigram_logp unigram_nll",
        "sources": "HF_DATASETS SPLITS HFSpec hf_spec holdout_split iter_documents source_fingerprint",
        "tokenizers": "Tokenizer build_tokenizer load_saved_tokenizer load_tokenizer_file save_tokenizer "
        "tokenizer_for_source",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "DataError",
    "SPLITS",
    "HF_DATASETS",
    "HFSpec",
    "hf_spec",
    "holdout_split",
    "iter_documents",
    "source_fingerprint",
    "Tokenizer",
    "build_tokenizer",
    "tokenizer_for_source",
    "load_tokenizer_file",
    "save_tokenizer",
    "load_saved_tokenizer",
    "tokenize_to_cache",
    "open_cache",
    "load_doc_offsets",
    "get_token_array",
    "validate_tokens",
    "SequenceDataset",
    "BatchLoader",
    "epoch_seed",
    "unigram_logp",
    "unigram_nll",
    "describe",
    "default_cache_dir",
]


def default_cache_dir() -> Path:
    """``$REPLAID_CACHE_DIR`` or the ``data.cache_dir`` default (``~/.cache/replaid``)."""
    from replaid.config import DataConfig

    return Path(os.path.expanduser(os.environ.get("REPLAID_CACHE_DIR", DataConfig.cache_dir)))


def describe(
    source: str,
    tokenizer_kind: str,
    tokenizer_path: str = "",
    split: str = "train",
    *,
    text_field: str = "text",
    max_docs: int = 0,
    vocab_size: int = 2048,
    cache_dir: str | os.PathLike[str] | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Summary of one split: documents, tokens (incl. one EOS per document), vocab, and an example.

    Tokenises the split into the token cache (``cache_dir``, default ``default_cache_dir()``).
    """
    from replaid.data.cache import get_token_array
    from replaid.data.sources import iter_documents
    from replaid.data.tokenizers import tokenizer_for_source

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tok = tokenizer_for_source(
        tokenizer_kind, tokenizer_path, source, text_field=text_field, vocab_size=vocab_size, cache_dir=cache
    )
    arr, meta = get_token_array(
        source, split, tok, cache, text_field=text_field, max_docs=max_docs, show_progress=show_progress
    )
    first = next(iter_documents(source, split, text_field, max_docs=1))
    ids = tok.encode(first[:4000])[:32]
    return {
        "source": source,
        "split": split,
        "documents": meta["n_docs"],
        "tokens": meta["n_tokens"],
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.name,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "cache": meta["path"],
        "example": {"text": first[:200], "ids": ids, "decoded": tok.decode(ids)},
    }
