"""Token embeddings from the data: the top directions of a token co-occurrence matrix.

``C[i, j]`` counts token j within ``window`` positions of token i (both directions) in a token stream;
``PPMI[i, j] = max(0, log(C[i, j] N / (C[i] C[j])))`` (Church and Hanks; Levy and Goldberg, 2014); the
embedding is ``U[:, :d] sqrt(|S[:d]|)`` of its top-d eigenpairs by magnitude (the SVD of a symmetric
matrix), rows scaled to unit length (RePlaid's unit sphere). Tokens that never occur get random unit
rows (seeded). The matrices are sparse, so a 50k-token vocabulary costs its pairs, not V^2.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

COOC_TOKENS = 10_000_000  # model.embeddings=cooc counts the train split's first tokens, at most this many


def cooccurrence(tokens: npt.ArrayLike, vocab_size: int, window: int = 2) -> sp.csr_matrix:
    """(V, V) float64 sparse counts of ordered pairs (i, j) with j at distance 1..window from i, either side."""
    t = np.asarray(tokens, dtype=np.int64).ravel()
    rows, cols = [], []
    for d in range(1, window + 1):
        rows += [t[:-d], t[d:]]
        cols += [t[d:], t[:-d]]
    r, c = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(vocab_size, vocab_size))  # duplicates summed


def ppmi(C: sp.csr_matrix) -> sp.csr_matrix:
    """Positive pointwise mutual information of a sparse (V, V) count matrix (0 where a count is 0)."""
    C = sp.coo_matrix(C)
    n = C.sum()
    row, col = np.asarray(C.sum(1)).ravel(), np.asarray(C.sum(0)).ravel()
    pmi = np.log(C.data * n / (row[C.row] * col[C.col]))
    keep = pmi > 0
    return sp.csr_matrix((pmi[keep], (C.row[keep], C.col[keep])), shape=C.shape)


def cooc_embeddings(tokens: npt.ArrayLike, vocab_size: int, d_e: int, window: int = 2, seed: int = 0) -> np.ndarray:
    """(V, d_e) float32 unit rows: the top-d_e PPMI directions of ``tokens`` (module docstring)."""
    P = ppmi(cooccurrence(tokens, vocab_size, window))
    k = min(d_e, vocab_size - 1)
    v0 = np.random.default_rng(seed).standard_normal(vocab_size)  # a fixed start: the same rows every run
    vals, vecs = eigsh(P, k=k, which="LM", v0=v0)
    order = np.argsort(-np.abs(vals))
    w = np.zeros((vocab_size, d_e))
    w[:, :k] = vecs[:, order] * np.sqrt(np.abs(vals[order]))
    norms = np.linalg.norm(w, axis=1)
    empty = norms < 1e-12
    w[empty] = np.random.default_rng(seed + 1).standard_normal((int(empty.sum()), d_e))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    return np.ascontiguousarray(w, dtype=np.float32)
