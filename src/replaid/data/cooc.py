"""Token embeddings from the data (issue 48 §3): the top directions of a token co-occurrence matrix.

``C[i, j]`` counts token j within ``window`` positions of token i (both directions) in a token stream;
``PPMI[i, j] = max(0, log(C[i, j] N / (C[i] C[j])))`` (Church and Hanks; Levy and Goldberg, 2014); the
embedding is ``U[:, :d] sqrt(S[:d])`` of its SVD, rows scaled to unit length (RePlaid's unit sphere).
Tokens that never occur get random unit rows (seeded).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def cooccurrence(tokens: npt.ArrayLike, vocab_size: int, window: int = 2) -> np.ndarray:
    """(V, V) float64 counts of ordered pairs (i, j) with j at distance 1..window from i, either side."""
    t = np.asarray(tokens, dtype=np.int64).ravel()
    C = np.zeros((vocab_size, vocab_size), dtype=np.float64)
    for d in range(1, window + 1):
        a, b = t[:-d], t[d:]
        np.add.at(C, (a, b), 1.0)
        np.add.at(C, (b, a), 1.0)
    return C


def ppmi(C: np.ndarray) -> np.ndarray:
    """Positive pointwise mutual information of a (V, V) count matrix (0 where a count is 0)."""
    n = C.sum()
    row, col = C.sum(1, keepdims=True), C.sum(0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        pmi = np.log(C * n / (row * col))
    return np.where(np.isfinite(pmi) & (C > 0), np.maximum(pmi, 0.0), 0.0)


def cooc_embeddings(tokens: npt.ArrayLike, vocab_size: int, d_e: int, window: int = 2, seed: int = 0) -> np.ndarray:
    """(V, d_e) float32 unit rows: the top-d_e PPMI directions of ``tokens`` (module docstring)."""
    C = cooccurrence(tokens, vocab_size, window)
    U, S, _ = np.linalg.svd(ppmi(C), hermitian=True)
    order = np.argsort(-np.abs(S))[:d_e]  # the SVD of a symmetric matrix: |eigenvalues|
    w = U[:, order] * np.sqrt(np.abs(S[order]))
    norms = np.linalg.norm(w, axis=1, keepdims=True)
    empty = norms[:, 0] < 1e-12
    w[empty] = np.random.default_rng(seed).standard_normal((int(empty.sum()), d_e))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    return np.ascontiguousarray(w, dtype=np.float32)
