"""Fixed-length sequences from a token array, and a deterministic, resumable, sharded batch loader."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from replaid.data.cache import load_doc_offsets, validate_tokens
from replaid.data.errors import DataError

__all__ = ["SequenceDataset", "BatchLoader", "epoch_seed", "validate_tokens", "unigram_logp", "unigram_nll"]

Batch = dict[str, "Tensor | None"]


def epoch_seed(seed: int, epoch: int) -> int:
    """The generator seed of epoch ``epoch``'s permutation under run seed ``seed``.

    Child ``epoch`` of the run seed's ``numpy.random.SeedSequence`` (its ``spawn_key``): every
    (seed, epoch) pair gets its own stream, so no two seeds share an epoch's order (``seed + epoch``
    gave seed s at epoch e + 1 the order of seed s + 1 at epoch e), and one seed is the same order
    in every cell and at every world size.
    """
    if epoch < 0:
        raise DataError(f"bad epoch {epoch}: the data order's epoch counts from 0")
    seq = np.random.SeedSequence(entropy=seed % 2**64, spawn_key=(epoch,))
    return int(seq.generate_state(1, dtype=np.uint64)[0])


class SequenceDataset:
    """Length-``seq_len`` sequences of a 1-D token array.

    ``packed=True`` (MDLM "wrap"): the documents (already EOS-separated) are concatenated and
    cut into consecutive non-overlapping windows; the remainder is dropped; ``mask`` is None.
    ``packed=False`` (no sentence packing): one sequence per document, truncated or padded with
    ``pad_id`` to ``seq_len``; ``mask`` marks real tokens. Needs ``doc_offsets``.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        *,
        packed: bool = True,
        doc_offsets: np.ndarray | None = None,
        pad_id: int | None = None,
    ):
        if seq_len < 1:
            raise DataError(f"seq_len must be positive, got {seq_len}: set data.seq_len to e.g. 128")
        self.tokens, self.seq_len, self.packed = tokens, seq_len, packed
        if packed:
            self.n = len(tokens) // seq_len
            if self.n == 0:
                raise DataError(
                    f"corpus too short: {len(tokens)} tokens is less than one sequence of "
                    f"seq_len={seq_len}; use a smaller data.seq_len or a larger corpus"
                )
            return
        if doc_offsets is None or pad_id is None:
            raise DataError(
                "the unpacked (no sentence packing) mode needs document offsets and a pad id: "
                "build it with SequenceDataset.from_cache"
            )
        self.offsets = np.asarray(doc_offsets, dtype=np.int64)
        self.pad_id = int(pad_id)
        self.n = len(self.offsets) - 1
        if self.n < 1:
            raise DataError("no documents in the token array: point data.source at a non-empty corpus")

    @classmethod
    def from_cache(
        cls, tokens: np.ndarray, meta: dict[str, Any], seq_len: int, *, packed: bool = True, pad_id: int | None = None
    ) -> SequenceDataset:
        """Build from ``get_token_array``'s ``(array, meta)``; pads with the pad id, else EOS."""
        if packed:
            return cls(tokens, seq_len)
        if pad_id is None:
            pad_id = meta["pad_id"] if meta.get("pad_id") is not None else meta["eos_id"]
        return cls(tokens, seq_len, packed=False, doc_offsets=load_doc_offsets(meta["path"]), pad_id=pad_id)

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices: Sequence[int] | np.ndarray | Tensor) -> Batch:
        """``{"tokens": LongTensor (B, L), "mask": BoolTensor (B, L) or None}`` for sequence ``indices``."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        L = self.seq_len
        if self.packed:
            pos = idx[:, None] * L + np.arange(L)
            return {"tokens": torch.from_numpy(np.asarray(self.tokens[pos], dtype=np.int64)), "mask": None}
        out = np.full((len(idx), L), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(idx), L), dtype=bool)
        for b, i in enumerate(idx):
            start = self.offsets[i]
            stop = min(self.offsets[i + 1], start + L)
            out[b, : stop - start] = self.tokens[start:stop]
            mask[b, : stop - start] = True
        return {"tokens": torch.from_numpy(out), "mask": torch.from_numpy(mask)}

    def __getitem__(self, i: int) -> Batch:
        batch = self.get_batch([i])
        return {k: None if v is None else v[0] for k, v in batch.items()}


class BatchLoader:
    """Endless, deterministic, resumable, sharded batches of a SequenceDataset.

    Epoch ``e`` visits ``torch.randperm(n, generator=epoch_seed(seed, e))`` (or ``arange`` without shuffle)
    in *global* batches of ``batch_size * world_size * accum`` consecutive indices, one per optimiser
    step. Each is cut into ``accum * world_size`` micro-batches of ``batch_size``: micro-batch ``k`` of
    rank ``r`` is global slot ``s = k * world_size + r``, the slice ``[s * batch_size, (s + 1) * batch_size)``
    (the slot the trainer seeds that micro-batch's noise with). So the global batches, their order and
    the epoch boundaries depend only on the global batch, never on how it is split over ranks and
    accumulation steps. With ``drop_last=False`` the last, short global batch is filled up from the
    start of the permutation (fixed shapes).

    ``state_dict()`` is ``{"epoch", "index", "global_batch"}`` with ``index`` counted in global batches:
    the same position for any world size, so a checkpoint resumes on another.
    """

    def __init__(
        self,
        dataset: SequenceDataset,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = True,
        accum: int = 1,
    ):
        if batch_size < 1 or world_size < 1 or accum < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"bad loader setup batch_size={batch_size} rank={rank} world_size={world_size} accum={accum}: "
                f"need batch_size >= 1, accum >= 1 and 0 <= rank < world_size"
            )
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size, self.shuffle, self.accum = rank, world_size, shuffle, accum
        self.global_batch = batch_size * world_size * accum
        n = len(dataset)
        if n < self.global_batch:
            acc = f" x accum {accum}" if accum > 1 else ""
            raise DataError(
                f"only {n} sequences of length {getattr(dataset, 'seq_len', '?')}, fewer than one "
                f"global batch of {self.global_batch} (batch_size {batch_size} x world_size "
                f"{world_size}{acc}): use a smaller batch size or seq_len, or more data"
            )
        self.steps_per_epoch = n // self.global_batch if drop_last else math.ceil(n / self.global_batch)
        self.epoch, self.index, self.micro = 0, 0, 0  # index: global batches done; micro: of the next one
        self._perm: tuple[int, Tensor] | None = None

    def permutation(self, epoch: int) -> Tensor:
        """The visiting order of ``epoch``."""
        if self._perm is None or self._perm[0] != epoch:
            n = len(self.dataset)
            if self.shuffle:
                perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch)))
            else:
                perm = torch.arange(n)
            self._perm = (epoch, perm)
        return self._perm[1]

    def global_indices(self, epoch: int, index: int) -> Tensor:
        """The sequence indices of global batch ``index`` of ``epoch`` (every rank's, in slot order)."""
        perm = self.permutation(epoch)
        start = index * self.global_batch
        glob = perm[start : start + self.global_batch]
        if len(glob) < self.global_batch:
            glob = torch.cat([glob, perm[: self.global_batch - len(glob)]])
        return glob

    def indices(self, epoch: int, index: int, micro: int = 0) -> Tensor:
        """This rank's sequence indices for micro-batch ``micro`` of global batch ``index`` of ``epoch``."""
        slot = micro * self.world_size + self.rank
        return self.global_indices(epoch, index)[slot * self.batch_size : (slot + 1) * self.batch_size]

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.micro == 0 and self.index >= self.steps_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        idx = self.indices(self.epoch, self.index, self.micro)
        self.micro += 1
        if self.micro == self.accum:
            self.index, self.micro = self.index + 1, 0
        return self.dataset.get_batch(idx.numpy())

    def state_dict(self) -> dict[str, int]:
        out = {"epoch": self.epoch, "index": self.index, "global_batch": self.global_batch}
        if self.micro:  # only between the micro-batches of one step (checkpoints are saved at step ends)
            out["micro"] = self.micro
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state_dict()``'s ``{"epoch": e, "index": i, "global_batch": g}``: whole numbers,
        ``e >= 0``, ``0 <= i <= steps_per_epoch`` and ``g`` this loader's global batch (else a DataError
        naming them). A state without ``global_batch`` (written before it was recorded) counted ``index`` in
        batches of ``batch_size * world_size``: it is read as ``ceil(index / accum)`` global batches."""
        epoch, index, micro = state["epoch"], state["index"], state.get("micro", 0)
        g = state.get("global_batch")
        ints = (epoch, index, micro) + (() if g is None else (g,))
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
        if ok and g is None:
            index = -(-index // self.accum)
        if not ok or epoch < 0 or not 0 <= index <= self.steps_per_epoch or not 0 <= micro < self.accum:
            raise DataError(
                f"data_state {{epoch: {epoch!r}, index: {index!r}}} lies outside the data: need whole numbers, "
                f"epoch >= 0 and 0 <= index <= {self.steps_per_epoch} (the batches per epoch)"
            )
        if g is not None and g != self.global_batch:
            raise DataError(
                f"data_state counts global batches of {g} sequences, this run's is {self.global_batch} "
                f"(train.batch_size): the data position would not carry over"
            )
        self.epoch, self.index, self.micro = epoch, index, micro


def _counts(arr: np.ndarray, vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    chunk = 1 << 24
    for s in range(0, len(arr), chunk):
        counts += np.bincount(np.asarray(arr[s : s + chunk], dtype=np.int64), minlength=vocab_size)
    return counts


def unigram_logp(train_array: np.ndarray, vocab_size: int) -> np.ndarray:
    """Log-probabilities (V,) float64 of the add-one-smoothed unigram model fitted on ``train_array``."""
    validate_tokens(train_array, vocab_size, "the train array")
    logp: np.ndarray = np.log(_counts(train_array, vocab_size) + 1.0) - np.log(len(train_array) + vocab_size)
    return logp


def unigram_nll(train_array: np.ndarray, eval_array: np.ndarray, vocab_size: int) -> float:
    """NLL (nats/token) on ``eval_array`` of the add-one-smoothed unigram model fitted on ``train_array``."""
    validate_tokens(eval_array, vocab_size, "the eval array")
    if len(eval_array) == 0:
        raise DataError("the eval array is empty: point data.source at a corpus with a non-empty eval split")
    logp = unigram_logp(train_array, vocab_size)
    return float(-(_counts(eval_array, vocab_size) * logp).sum() / len(eval_array))
