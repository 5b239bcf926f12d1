"""From a :class:`~replaid.config.DataConfig` to batches: tokenizer, token caches, loaders."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from replaid.config import RunConfig
from replaid.data import (
    BatchLoader,
    DataError,
    SequenceDataset,
    get_token_array,
    load_saved_tokenizer,
    save_tokenizer,
    tokenizer_for_source,
    unigram_logp,
)
from replaid.data.sources import corpus_fingerprint
from replaid.data.tokenizers import SPEC_FILE, Tokenizer, tokenizer_files_sha256, vocab_sha256


def cache_dir(cfg: RunConfig) -> str:
    return os.path.expanduser(os.environ.get("REPLAID_CACHE_DIR", cfg.data.cache_dir))


def has_saved_tokenizer(run_dir: Path) -> bool:
    """RUN/tokenizer/ is complete once its spec (written last, atomically) is there."""
    return (Path(run_dir) / "tokenizer" / SPEC_FILE).is_file()


def load_run_tokenizer(run_dir: Path) -> Tokenizer:
    """The tokenizer a run was trained with (saved in RUN/tokenizer/); never made again in its place."""
    if not has_saved_tokenizer(run_dir):
        raise DataError(
            f"{run_dir} has no tokenizer ({Path(run_dir) / 'tokenizer' / SPEC_FILE} is missing): a run decodes "
            f"and scores only with the tokenizer it was trained with, and none is made again in its place; "
            f"restore its tokenizer/ folder from a copy of the run"
        )
    return load_saved_tokenizer(None, Path(run_dir) / "tokenizer")


def tokenizer_mismatch(recorded: object, now: dict[str, Any]) -> str:
    """Why the tokenizer ``now`` (:meth:`DataPipeline.tokenizer_binding`) is not the one a checkpoint
    recorded (``state["binding"]["tokenizer"]``), or "" when it is, or nothing was recorded (older runs)."""
    if not isinstance(recorded, dict):
        return ""
    old = recorded.get("files")
    if isinstance(old, dict) and old and old != now["files"]:
        names = sorted(n for n in set(old) | set(now["files"]) if old.get(n) != now["files"].get(n))
        return f"the sha256 of tokenizer/{', tokenizer/'.join(names[:3])} differ from those recorded"
    if recorded.get("vocab_sha256") and recorded["vocab_sha256"] != now["vocab_sha256"]:
        return f"the sha256 of its vocabulary ({now['vocab_sha256'][:12]}) differs from the one recorded"
    return ""


class DataPipeline:
    """Tokenizer + train loader + evaluation batches for one run (per rank)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path | None = None,
        rank: int = 0,
        world_size: int = 1,
        train: bool = True,
        new_run: bool = False,
    ) -> None:
        """``run_dir``: the run whose ``tokenizer/`` is loaded; only a run being made (``new_run``: a
        fresh ``train``) gets one built from the config and saved there, any other without one is an
        error (:func:`load_run_tokenizer`). ``train``: build the train loader (and fingerprint the corpus)."""
        self.cfg, d = cfg, cfg.data
        self.cache = cache_dir(cfg)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._binding: dict[str, Any] | None = None
        if run_dir is not None and (has_saved_tokenizer(run_dir) or not new_run):
            self.tokenizer = load_run_tokenizer(Path(run_dir))
        else:
            self.tokenizer = tokenizer_for_source(
                d.tokenizer,
                d.tokenizer_path,
                d.source,
                text_field=d.text_field,
                vocab_size=d.bpe_vocab_size,
                cache_dir=self.cache,
                max_docs=d.max_docs,
            )
            if run_dir is not None and rank == 0:
                save_tokenizer(self.tokenizer, Path(run_dir) / "tokenizer")
        self.vocab_size = self.tokenizer.vocab_size
        self._arrays: dict[str, tuple[np.ndarray, dict[str, Any]]] = {}
        self.rank, self.world_size = rank, world_size
        if train:
            self.binding()  # the corpus as it is now, before it is read
            micro = cfg.train.batch_size // (cfg.train.grad_accum * world_size)
            if micro < 2:
                raise DataError(
                    f"train.batch_size={cfg.train.batch_size} leaves {micro} rows per rank and "
                    f"accumulation step; raise the batch or lower train.grad_accum / the world size"
                )
            self.train_loader = BatchLoader(
                self.dataset("train"),
                micro,
                seed=cfg.train.seed,
                rank=rank,
                world_size=world_size,
                shuffle=True,
                accum=cfg.train.grad_accum,
            )
            self.train_iter = self.train_loader

    def tokenizer_binding(self) -> dict[str, Any]:
        """What identifies the tokenizer: the sha256 of the files of ``RUN/tokenizer/`` and of its
        id -> token table (the latter also covers tokenizers read from ``data.tokenizer_path``)."""
        files = tokenizer_files_sha256(self.run_dir / "tokenizer") if self.run_dir is not None else {}
        return {"files": files, "vocab_sha256": vocab_sha256(self.tokenizer)}

    def binding(self) -> dict[str, Any]:
        """``{"tokenizer": ..., "corpus": ...}`` as checkpoints record it (state.json ``"binding"``),
        computed once (a training pipeline: when it is made, before the corpus is read)."""
        if self._binding is None:
            self._binding = {
                "tokenizer": self.tokenizer_binding(),
                "corpus": corpus_fingerprint(self.cfg.data.source),
            }
        return self._binding

    def array(self, split: str) -> tuple[np.ndarray, dict[str, Any]]:
        """The split's token array (tokenised once into the cache) and its meta."""
        if split not in self._arrays:
            d = self.cfg.data
            self._arrays[split] = get_token_array(
                d.source, split, self.tokenizer, self.cache, text_field=d.text_field, max_docs=d.max_docs
            )
        return self._arrays[split]

    def dataset(self, split: str) -> SequenceDataset:
        arr, meta = self.array(split)
        return SequenceDataset.from_cache(arr, meta, self.cfg.data.seq_len, packed=self.cfg.data.packing)

    def check_splits(self, splits: Iterable[str]) -> None:
        """Raise a DataError naming the split unless each holds at least one sequence (and, for the
        unigram reference, tokens)."""
        for split in dict.fromkeys(splits):
            try:
                n = len(self.dataset(split))
            except DataError as e:
                raise DataError(f"the {split} split of data.source={self.cfg.data.source} is unusable: {e}") from None
            if n < 1:
                raise DataError(
                    f"the {split} split of data.source={self.cfg.data.source} holds no sequence of "
                    f"data.seq_len={self.cfg.data.seq_len}; use a larger corpus or a smaller seq_len"
                )

    def eval_batches(self, split: str, batch_size: int, max_batches: int = 0) -> list[dict[str, Tensor]]:
        """Deterministic, in-order batches of the split (this rank's share)."""
        ds = self.dataset(split)
        idx = list(range(self.rank, len(ds), self.world_size))
        out = []
        for s in range(0, len(idx), batch_size):
            b = ds.get_batch(idx[s : s + batch_size])
            out.append({k: v for k, v in b.items() if v is not None})
            if max_batches and len(out) >= max_batches:
                break
        return out

    def unigram_logp(self) -> np.ndarray:
        """(V,) float64 log-probabilities of the add-one-smoothed unigram model of the train split."""
        if not hasattr(self, "_unigram_logp"):
            self._unigram_logp = unigram_logp(self.array("train")[0], self.vocab_size)
        return self._unigram_logp
