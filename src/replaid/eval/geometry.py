"""Embedding geometry (paper section 5.1, appendix "PCA Scree for d_e = 768").

* PCA scree of the rows of an embedding matrix ``E`` (N, d): centre the rows, ``lambda_k = s_k^2 / (N - 1)``
  from the singular values of the centred matrix, explained-variance ratio ``r_k = lambda_k / sum lambda``,
  its cumulative sum, and ``k_90`` = the fewest components whose cumulative ratio reaches 0.9.
* A 2-D t-SNE of the rows (scikit-learn, PCA initialisation) coloured by each token's dominant POS
  (:mod:`replaid.eval.pos`), marker area growing with the token's training-data frequency.
* POS neighbourhood agreement: the fraction of each token's k nearest neighbours (cosine, in the
  full embedding space) that share its dominant POS, against chance ``sum_p share_p^2``, a number
  to put beside the picture.

Which rows: RePlaid/Plaid use ``E`` as the model does (unit rows; raw rows with
``model.normalize_embeddings=false``); AR/MDLM/Duo their input table without the extra [MASK]/BOS
rows (the d_e-dim unit rows when ``model.factored_embedding``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from replaid.methods.base import Method


def embedding_rows(method: Method[Any], model: torch.nn.Module) -> np.ndarray:
    """(V, d) float64 token-embedding rows of ``model`` as its method defines them
    (:meth:`~replaid.methods.base.Method.embedding_rows`)."""
    with torch.no_grad():
        E = method.embedding_rows(model)
    return E.detach().double().cpu().numpy()


def components_for(cumulative: np.ndarray, fraction: float = 0.9) -> int:
    """Fewest leading components whose cumulative explained-variance ratio reaches ``fraction``."""
    return int(np.searchsorted(cumulative, fraction - 1e-12) + 1)


def pca_scree(X: np.ndarray) -> dict[str, Any]:
    """Explained variance ``lambda_k`` (sample covariance eigenvalues, descending), ratio, cumulative, k_90."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"PCA needs at least 2 rows of a 2-D matrix, got shape {X.shape}")
    Xc = X - X.mean(0, keepdims=True)
    s = np.linalg.svd(Xc, compute_uv=False)  # (min(N, d),)
    var = s**2 / (X.shape[0] - 1)
    ratio = var / var.sum()
    cum = np.cumsum(ratio)
    return {
        "explained_variance": var,
        "ratio": ratio,
        "cumulative": cum,
        "k90": components_for(cum, 0.9),
        "n_rows": int(X.shape[0]),
        "dim": int(X.shape[1]),
    }


def mean_pairwise_cosine(X: np.ndarray) -> float:
    """Mean cosine over the ``N (N - 1)`` ordered pairs of distinct rows, ``(||sum_i u_i||^2 - N) / (N (N - 1))``
    with ``u_i = x_i / ||x_i||``: ~0 for rows spread over the sphere, 1 when they have collapsed onto one
    direction (PCA of centred rows cannot see this: it removes the shared direction). X (N, d)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"need at least 2 rows of a 2-D matrix, got shape {X.shape}")
    U = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
    n = U.shape[0]
    s = U.sum(0)
    return float((s @ s - n) / (n * (n - 1)))


def token_frequency(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """(V,) counts of each token id in a token array."""
    return np.bincount(np.asarray(ids, dtype=np.int64).ravel(), minlength=vocab_size)[:vocab_size]


def frequent_rows(freq: np.ndarray, min_count: int, max_rows: int = 0) -> np.ndarray:
    """Ids of tokens seen at least ``min_count`` times, most frequent first (at most ``max_rows``; 0 = all)."""
    idx = np.nonzero(freq >= min_count)[0]
    idx = idx[np.argsort(-freq[idx], kind="stable")]
    return idx[:max_rows] if max_rows else idx


def pos_knn_agreement(X: np.ndarray, labels: np.ndarray, k: int = 10) -> dict[str, Any]:
    """Mean fraction of each row's k nearest neighbours (cosine) with the same label, and chance
    ``sum_p share_p^2`` (the agreement of randomly placed labels). Rows with label < 0 are dropped."""
    keep = labels >= 0
    X, labels = np.asarray(X, dtype=np.float64)[keep], labels[keep]
    n = len(labels)
    if n <= k:
        return {"k": k, "n": n, "agreement": float("nan"), "chance": float("nan")}
    Xn = X / (np.linalg.norm(X, axis=1, keepdims=True) + 1e-12)
    S = Xn @ Xn.T  # (n, n) cosine similarity
    np.fill_diagonal(S, -np.inf)
    nn = np.argpartition(-S, k, axis=1)[:, :k]  # (n, k)
    agree = float((labels[nn] == labels[:, None]).mean())
    share = np.bincount(labels) / n
    return {"k": k, "n": n, "agreement": agree, "chance": float((share**2).sum())}


def tsne_2d(X: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """(N, 2) t-SNE (scikit-learn, PCA init, cosine distances between rows)."""
    from sklearn.manifold import TSNE

    perplexity = min(perplexity, max(2.0, (X.shape[0] - 1) / 3))
    Y: np.ndarray = TSNE(  # scikit-learn ships no types: fit_transform is Any
        n_components=2, init="pca", perplexity=perplexity, metric="cosine", random_state=seed, learning_rate="auto"
    ).fit_transform(np.asarray(X, dtype=np.float64))
    return Y


# ------------------------------------------------------------------ plots


def plot_scree(
    screes: list[tuple[str, dict[str, Any]]], path: str | os.PathLike[str], title: str = "", max_components: int = 64
) -> None:
    """One PNG overlaying several runs: explained-variance ratio per component (log) and cumulative."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (label, s) in enumerate(screes):
        n = min(len(s["ratio"]), max_components)
        k = np.arange(1, n + 1)
        c = f"C{i % 10}"
        a.plot(k, s["ratio"][:n], marker=".", color=c, label=f"{label} (d={s['dim']}, k90={s['k90']})")
        b.plot(k, s["cumulative"][:n], marker=".", color=c, label=label)
        b.axvline(s["k90"], color=c, ls=":", lw=0.8)
    a.set_yscale("log")
    a.set_xlabel("principal component")
    a.set_ylabel("explained variance ratio")
    b.axhline(0.9, color="gray", ls="--", lw=0.8)
    b.set_xlabel("number of components")
    b.set_ylabel("cumulative explained variance")
    b.set_ylim(0, 1.02)
    a.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tsne(
    Y: np.ndarray,
    dom: np.ndarray,
    freq: np.ndarray,
    tag_names: Sequence[str],
    path: str | os.PathLike[str],
    title: str = "",
    annotate: list[str] | None = None,
    n_annotate: int = 40,
) -> None:
    """Scatter of the 2-D points coloured by dominant POS (grey: unseen), area ~ log frequency; legend
    with each tag's count; the ``n_annotate`` most frequent tokens labelled when ``annotate`` is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 7))
    size = 2 + 6 * np.log10(np.maximum(freq, 1))
    cmap = plt.get_cmap("tab20")
    order = sorted(set(dom.tolist()), key=lambda p: -(dom == p).sum())
    for p in order:
        m = dom == p
        name = "unseen" if p < 0 else tag_names[p]
        color = (0.7, 0.7, 0.7, 1.0) if p < 0 else cmap(p % 20)
        ax.scatter(Y[m, 0], Y[m, 1], s=size[m], color=color, alpha=0.75, linewidths=0, label=f"{name} ({int(m.sum())})")
    if annotate is not None:
        for i in np.argsort(-freq)[:n_annotate]:
            ax.annotate(annotate[i], Y[i], fontsize=6, alpha=0.8)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=7, markerscale=2.5, loc="center left", bbox_to_anchor=(1.0, 0.5), title="dominant POS")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
