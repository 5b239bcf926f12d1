"""``replaid classifier train``: a latent classifier ``p(label | z_t, gamma)`` for classifier guidance.

Trained with the run's network frozen: its embeddings ``E`` and noise schedule ``gamma(t)`` make the
noisy latents ``z_t = alpha e(x) + sigma eps`` (``alpha^2 = sigmoid(-gamma)``, ``sigma^2 = sigmoid(gamma)``,
``t ~ U(0, 1)``) of random ``data.seq_len``-token windows of labelled texts, and the classifier
(:class:`replaid.model.classifier.LatentClassifier`) minimises the cross-entropy of the label.

Saved as ``CLF/classifier.safetensors`` + ``CLF/classifier.json`` (config, labels, and a fingerprint of
the run's embeddings, so a classifier is refused on a run it was not trained for); never pickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from replaid.diffusion.denoiser import alpha_sigma
from replaid.fileio import atomic_write_bytes, atomic_write_text
from replaid.model.classifier import LatentClassifier, LatentClassifierConfig
from replaid.schema import dumps as strict_dumps

if TYPE_CHECKING:
    from replaid.data.tokenizers import Tokenizer
    from replaid.methods.replaid import ContinuousNet
    from replaid.store.loading import Run


@dataclass
class ClassifierTrainConfig:
    steps: int = 400
    batch_size: int = 32
    lr: float = 2e-3
    hidden: int = 128
    seed: int = 0
    valid_frac: float = 0.1  # held-out texts for the accuracy report


class TrainedClassifier(LatentClassifier):
    """A latent classifier with its label names."""

    labels: list[str]

    def label_index(self, label: str) -> int:
        """The index of ``label`` (a name, or an index); one-line error listing the labels otherwise."""
        if label in self.labels:
            return self.labels.index(label)
        if label.isdigit() and int(label) < len(self.labels):
            return int(label)
        raise ValueError(f"--guide label {label!r} is not one of this classifier's labels: {', '.join(self.labels)}")


def embedding_fingerprint(E: torch.Tensor) -> str:
    """A short hash of the run's embedding matrix (V, d_e) (rounded, so devices agree)."""
    data = (E.detach().float().cpu() * 1e4).round().to(torch.int64).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def read_labelled(path: str | Path) -> tuple[list[str], list[str]]:
    """Texts and labels of a JSONL file of ``{"text": ..., "label": ...}`` lines."""
    texts, labels = [], []
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--data {path}: no such file; give a JSONL file of {{'text': ..., 'label': ...}} lines")
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            texts.append(str(d["text"]))
            labels.append(str(d["label"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f"--data {path} line {n}: expected a JSON object with 'text' and 'label'; fix or remove the line"
            ) from None
    if len(set(labels)) < 2:
        raise ValueError(f"--data {path}: needs at least two distinct labels, found {sorted(set(labels))}")
    return texts, labels


def _windows(tok: Tokenizer, texts: list[str], labels: list[int], L: int) -> list[tuple[list[int], int]]:
    docs = [(tok.encode(t), y) for t, y in zip(texts, labels, strict=True)]
    return [(ids, y) for ids, y in docs if len(ids) >= L]


def _window_counts(docs: list[tuple[list[int], int]], L: int) -> torch.Tensor:
    """Windows of ``L`` tokens per document (D,): the weights of :func:`_batch`'s document draw."""
    return torch.tensor([len(ids) - L + 1 for ids, _ in docs], dtype=torch.float64)


def _batch(
    docs: list[tuple[list[int], int]], L: int, B: int, g: torch.Generator, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """B windows drawn uniformly over every ``L``-token window of the corpus (a document is chosen with
    probability proportional to its number of windows, ``counts``, then a window in it), with their
    labels. Choosing the document first would weight a label by its count of documents instead of its
    amount of text."""
    n = _window_counts(docs, L) if counts is None else counts  # (D,)
    idx = torch.multinomial(n, B, replacement=True, generator=g).tolist()
    rows, ys = [], []
    for i in idx:
        ids, y = docs[i]
        o = int(torch.randint(len(ids) - L + 1, (1,), generator=g))
        rows.append(ids[o : o + L])
        ys.append(y)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


def noisy_latents(
    model: ContinuousNet, E: torch.Tensor, x: torch.Tensor, t: torch.Tensor, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``z_t = alpha e(x) + sigma eps`` (B, L, d_e) and gamma (B,) at times t (B,) of the run's schedule."""
    with torch.no_grad():
        out = model.schedule(t.to(E.device).double())
        gamma = (out[0] if isinstance(out, (tuple, list)) else out).double()  # (B,)
    a, s = alpha_sigma(gamma)
    eps = torch.randn(*x.shape, E.shape[1], generator=g).to(E.device)  # (B, L, d_e)
    z = a.view(-1, 1, 1).float() * E[x.to(E.device)] + s.view(-1, 1, 1).float() * eps
    return z, gamma


def train_classifier(
    run: Run, texts: list[str], labels: list[str], cfg: ClassifierTrainConfig, log: Callable[[str], None] | None = None
) -> tuple[TrainedClassifier, dict[str, Any]]:
    """Trains the classifier (module docstring); returns it and its metrics (held-out accuracy by t)."""
    torch.manual_seed(cfg.seed)
    names = sorted(set(labels))
    ys = [names.index(y) for y in labels]
    L = run.cfg.data.seq_len
    tok, model = run.tokenizer, cast("ContinuousNet", run.model)  # a continuous run (the command checks)
    E = model.embedding_matrix().detach().float()  # (V, d_e), frozen
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(texts), generator=g).tolist()
    n_valid = max(1, int(round(cfg.valid_frac * len(texts))))
    valid = _windows(tok, [texts[i] for i in perm[:n_valid]], [ys[i] for i in perm[:n_valid]], L)
    train = _windows(tok, [texts[i] for i in perm[n_valid:]], [ys[i] for i in perm[n_valid:]], L)
    if not train or not valid:
        raise ValueError(
            f"--data: too few texts of at least {L} tokens (the run's data.seq_len) to train and hold out; "
            f"give longer or more texts"
        )
    clf = TrainedClassifier(LatentClassifierConfig(d_e=E.shape[1], n_labels=len(names), hidden=cfg.hidden))
    clf.labels = names
    clf.to(E.device)
    opt = torch.optim.AdamW(clf.parameters(), lr=cfg.lr, weight_decay=0.01)
    t0 = time.time()
    counts = _window_counts(train, L)  # once, not per step
    for step in range(1, cfg.steps + 1):
        x, y = _batch(train, L, cfg.batch_size, g, counts)
        t = torch.rand(cfg.batch_size, generator=g, dtype=torch.float64)
        z, gamma = noisy_latents(model, E, x, t, g)
        lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for pg in opt.param_groups:
            pg["lr"] = lr
        loss = torch.nn.functional.cross_entropy(clf(z, gamma), y.to(E.device))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        opt.step()
        if log is not None and (step % 50 == 0 or step == cfg.steps):
            log(f"step {step}/{cfg.steps} loss {loss.item():.4f}")
    clf.eval()
    acc, recall = {}, {}
    gv = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        for tv in (0.0, 0.25, 0.5, 0.75, 1.0):
            x, y = _batch(valid, L, 256, gv)
            z, gamma = noisy_latents(model, E, x, torch.full((256,), tv, dtype=torch.float64), gv)
            hit = clf(z, gamma).argmax(-1).cpu() == y  # (256,)
            acc[f"t={tv}"] = float(hit.float().mean())
            recall[f"t={tv}"] = {n: float(hit[y == i].float().mean()) for i, n in enumerate(names) if (y == i).any()}
    label_counts = {n: ys.count(i) for i, n in enumerate(names)}
    metrics = {"valid_accuracy": acc, "valid_recall": recall, "label_counts": label_counts, "seconds": time.time() - t0}
    return clf, metrics


def save_classifier(
    clf: TrainedClassifier, out: str | Path, run: Run, train_cfg: ClassifierTrainConfig, metrics: dict[str, Any]
) -> None:
    """``out/classifier.safetensors`` and ``out/classifier.json`` (module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    E = cast("ContinuousNet", run.model).embedding_matrix()
    meta = {
        "format": "replaid-latent-classifier-1",
        "config": clf.cfg.to_dict(),
        "labels": clf.labels,
        "embedding_fingerprint": embedding_fingerprint(E),
        "seq_len": run.cfg.data.seq_len,
        "train": train_cfg.__dict__,
        "metrics": metrics,
        "run": str(run.ckpt),
    }
    weights = {k: v.detach().cpu().contiguous() for k, v in clf.state_dict().items()}
    atomic_write_bytes(out / "classifier.safetensors", safetensors_bytes(weights))
    atomic_write_text(out / "classifier.json", strict_dumps(meta, indent=2) + "\n")


def load_classifier(path: str | Path, run: Run | None = None) -> TrainedClassifier:
    """Reads a saved classifier (safetensors + JSON; no unpickling). With ``run``, refuses a classifier
    trained on another run's embeddings."""
    p = Path(path)
    meta_f, w_f = p / "classifier.json", p / "classifier.safetensors"
    if not meta_f.is_file() or not w_f.is_file():
        raise ValueError(
            f"--guide {path}: no classifier.json + classifier.safetensors there; train one with "
            f"'replaid classifier train RUN --data LABELLED.jsonl --out {path}'"
        )
    try:
        meta = json.loads(meta_f.read_text())
        clf = TrainedClassifier(LatentClassifierConfig(**meta["config"]))
        clf.labels = [str(x) for x in meta["labels"]]
        clf.load_state_dict(load_file(str(w_f)))
    except Exception as e:  # damaged JSON, missing keys, safetensors errors, shape mismatches
        raise ValueError(f"--guide {path}: damaged classifier ({type(e).__name__}); train it again") from None
    if run is not None and meta.get("embedding_fingerprint") != embedding_fingerprint(
        cast("ContinuousNet", run.model).embedding_matrix()
    ):
        raise ValueError(
            f"--guide {path}: this classifier was trained on another run's embeddings ({meta.get('run')}); "
            f"train one for this run with 'replaid classifier train'"
        )
    return clf.eval()
