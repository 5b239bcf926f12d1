"""Tests of the data pipeline: sources, tokenizers, token cache, sequences and the batch loader."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from replaid.data import (
    BatchLoader,
    DataError,
    HFSpec,
    SequenceDataset,
    build_tokenizer,
    describe,
    epoch_seed,
    get_token_array,
    hf_spec,
    iter_documents,
    load_doc_offsets,
    load_saved_tokenizer,
    load_tokenizer_file,
    save_tokenizer,
    source_fingerprint,
    tokenize_to_cache,
    unigram_nll,
    validate_tokens,
)
from replaid.data.cache import open_cache
from replaid.data.sources import HF_DATASETS, _wikitext_articles, hash_split, iter_hf_documents, stdlib_modules

SHARED = Path(__file__).resolve().parents[2] / "shared"
WIKI = SHARED / "data" / "wiki-sample"
GPT2 = SHARED / "tokenizers" / "gpt2"
LLAMA = SHARED / "tokenizers" / "llama2" / "tokenizer.model"
needs_shared = pytest.mark.skipif(not WIKI.is_dir(), reason="../shared (data and tokenizers) not present")


class ByteTok:
    """Bytes as tokens, EOS = 256: a dependency-free tokenizer for cache/loader tests."""

    name, vocab_size, eos_id, pad_id = "bytes", 257, 256, None

    def encode(self, text):
        return list(text.encode())

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def write_jsonl(path: Path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t}) + "\n" for t in texts))
    return path


def one_line_error(excinfo, *needles):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.fixture(scope="module")
def gpt2():
    if not GPT2.is_dir():
        pytest.skip("../shared/tokenizers/gpt2 not present")
    return build_tokenizer("gpt2", str(GPT2))


@pytest.fixture(scope="module")
def small_corpus():
    return list(iter_documents("stdlib", "train", max_docs=200))


# ----------------------------------------------------------------------------------- sources
def test_stdlib_corpus_split_is_deterministic_and_disjoint():
    modules = stdlib_modules()
    assert len(modules) > 200
    rels = [rel for rel, _ in modules]
    assert rels == sorted(rels)
    assert not any(
        part in {"test", "tests", "idlelib", "lib2to3", "site-packages"} for rel in rels for part in rel.split("/")[:-1]
    )
    assert all(len(text) >= 200 for _, text in modules)
    splits = {s: list(iter_documents("stdlib", s)) for s in ("train", "valid", "test")}
    assert all(splits.values())
    assert sum(len(d) for d in splits["train"]) > 1_000_000  # > 1 MB of text
    assert sum(len(v) for v in splits.values()) == len(modules)
    assert 0.8 < len(splits["train"]) / len(modules) < 0.97
    for a, b in [("train", "valid"), ("train", "test"), ("valid", "test")]:
        assert not set(splits[a]) & set(splits[b])
    # the split is a pure function of the module path: fixed forever
    keys = ("json/__init__.py", "os.py", "k11", "k17")
    assert [hash_split(k) for k in keys] == ["valid", "train", "test", "valid"]
    assert list(iter_documents("stdlib", "valid")) == splits["valid"]
    # the fingerprint keys the token cache across processes: a fresh interpreter (its own hash seed)
    # must compute the same one
    code = "from replaid.data import source_fingerprint; print(source_fingerprint('stdlib', 'train'))"
    other = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    ]
    assert other == [source_fingerprint("stdlib", "train")] * 2
    assert source_fingerprint("stdlib", "train") != source_fingerprint("stdlib", "valid")
    assert len(list(iter_documents("stdlib", "train", max_docs=7))) == 7


@needs_shared
def test_split_directory_of_jsonl_files():
    valid = list(iter_documents(str(WIKI), "valid"))
    lines = (WIKI / "valid.jsonl").read_text().splitlines()
    assert len(valid) == len(lines) == 9
    assert valid[0].startswith("Alabama") and valid[0] == json.loads(lines[0])["text"]
    assert list(iter_documents(str(WIKI), "test")) != valid


def test_local_files_text_field_validation_alias_and_fingerprint(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ["a b", "c d", ""], field="body")
    write_jsonl(tmp_path / "validation.jsonl", ["v"], field="body")
    assert list(iter_documents(str(tmp_path), "train", text_field="body")) == ["a b", "c d"]
    assert list(iter_documents(str(tmp_path), "valid", text_field="body")) == ["v"]
    fp = source_fingerprint(str(tmp_path), "train")
    write_jsonl(tmp_path / "train.jsonl", ["a b", "c d", "e"], field="body")
    assert source_fingerprint(str(tmp_path), "train") != fp  # size/mtime are part of the key


def test_hash_split_of_unsplit_directory_and_file(tmp_path):
    texts = [f"document number {i}\nwith some text" for i in range(300)]
    docs_dir = tmp_path / "docs"
    (docs_dir / "sub").mkdir(parents=True)
    for i, t in enumerate(texts):
        (docs_dir / ("sub" if i % 2 else "") / f"{i:03d}.txt").write_text(t)
    single = write_jsonl(tmp_path / "all.jsonl", texts)
    for source in (str(docs_dir), str(single)):
        parts = {s: list(iter_documents(source, s)) for s in ("train", "valid", "test")}
        assert sorted(sum(parts.values(), [])) == sorted(texts)
        assert all(parts.values()) and len(parts["train"]) > 240
        assert parts == {s: list(iter_documents(source, s)) for s in ("train", "valid", "test")}
    assert set(iter_documents(str(docs_dir), "valid")) == set(iter_documents(str(single), "valid"))


# ------------------------------------------------------------------------------ hugging face
def test_hf_names_and_conventions():
    owt = hf_spec("hf:openwebtext")
    assert owt.holdout == 100_000 and set(owt.splits.values()) == {"train"}
    assert hf_spec("hf:lm1b").splits["valid"] == "test"
    assert hf_spec("hf:slimpajama").path == "cerebras/SlimPajama-627B" and hf_spec("hf:slimpajama").streaming
    assert hf_spec("hf:wikitext").config == "wikitext-103-raw-v1"
    assert hf_spec("hf:wikitext2").config == "wikitext-2-raw-v1"
    assert hf_spec("hf:someone/data:cfg").config == "cfg" and "openwebtext" in HF_DATASETS
    lines = [" = A = \n", "\n", " a text \n", " = = Sub = = \n", " more \n", " = B = \n", " b \n"]
    assert list(_wikitext_articles(lines)) == [" = A = \n\n a text \n = = Sub = = \n more ", " = B = \n b "]


def test_owt_holdout_convention_on_local_json(tmp_path):
    data = write_jsonl(tmp_path / "owt.jsonl", [f"doc {i}" for i in range(20)])
    spec = HFSpec("json", data_files=str(data), splits=dict(HF_DATASETS["openwebtext"].splits), holdout=3)
    cache = str(tmp_path / "hf")
    train = list(iter_hf_documents(spec, "train", cache_dir=cache))
    valid = list(iter_hf_documents(spec, "valid", cache_dir=cache))
    assert train == [f"doc {i}" for i in range(17)]
    assert valid == ["doc 17", "doc 18", "doc 19"] == list(iter_hf_documents(spec, "test", cache_dir=cache))
    with pytest.raises(DataError) as e:
        next(iter_hf_documents(spec, "train", text_field="body", cache_dir=cache))
    one_line_error(e, "no 'body' field", "data.text_field")
    with pytest.raises(DataError) as e:  # the json "hub" dataset has no validation split
        list(iter_hf_documents(HFSpec("json", data_files=str(data)), "valid", cache_dir=cache))
    one_line_error(e, "'validation' does not exist", "data.source")


def test_hf_offline_is_a_data_error(monkeypatch, tmp_path):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # nothing cached
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as e:
        next(iter_documents("hf:lm1b", "train"))
    one_line_error(e, "needs network access or a local copy", "data.source")
    with pytest.raises(DataError) as e:
        build_tokenizer("gpt2")
    one_line_error(e, "data.tokenizer_path=")


# -------------------------------------------------------------------------------- tokenizers
@needs_shared
def test_gpt2_ids_equal_tiktoken(gpt2, tmp_path):
    os.environ["TIKTOKEN_CACHE_DIR"] = str(GPT2 / "tiktoken_cache")
    import tiktoken

    ref = tiktoken.get_encoding("gpt2")
    docs = list(iter_documents(str(WIKI), "valid", max_docs=3))
    paragraphs = [p for d in docs for p in d.split("\n\n")[:6]]
    paragraphs.append("  Tabs\tand   spaces, 'quotes' — ünïcödé 日本 🙂")
    assert (gpt2.vocab_size, gpt2.eos_id, gpt2.pad_id) == (50257, 50256, None)
    (tmp_path / "vm").mkdir()  # the vocab.json + merges.txt route gives the same ids
    for f in ("vocab.json", "merges.txt"):
        (tmp_path / "vm" / f).symlink_to(GPT2 / f)
    gpt2_vm = build_tokenizer("gpt2", str(tmp_path / "vm"))
    batch = gpt2.encode_batch(paragraphs)
    for text, ids in zip(paragraphs, batch, strict=True):
        assert ids == ref.encode_ordinary(text) == gpt2.encode(text) == gpt2_vm.encode(text)
        assert gpt2.decode(ids) == text
    assert gpt2.encode("<|endoftext|>") == [50256]


@needs_shared
def test_llama2_sentencepiece_round_trip():
    if not LLAMA.is_file():
        pytest.skip("../shared/tokenizers/llama2 not present")
    tok = build_tokenizer("llama2", str(LLAMA.parent))
    assert (tok.vocab_size, tok.eos_id) == (32000, 2)
    text = next(iter_documents(str(WIKI), "valid"))[:5000]
    ids = tok.encode(text)
    assert len(text) / 8 < len(ids) < len(text) / 2 and max(ids) < 32000
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "Hello"]) == [ids, tok.encode("Hello")]


def test_bert_wordpiece_from_local_vocab(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hello", "hello", "world", "##s", ",", "!"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    cased = build_tokenizer("bert-base-cased", str(tmp_path / "vocab.txt"))
    assert (cased.vocab_size, cased.eos_id, cased.pad_id) == (11, 3, 0)
    assert cased.encode("Hello worlds!") == [5, 7, 8, 10]
    assert cased.decode([5, 7, 8, 10]) == "Hello worlds!"
    assert build_tokenizer("bert-base-uncased", str(tmp_path)).encode("Hello") == [6]


def test_bpe_training_is_deterministic_and_cached(tmp_path, small_corpus):
    a = build_tokenizer("bpe", corpus=lambda: iter(small_corpus), vocab_size=512)
    b = build_tokenizer("bpe", corpus=lambda: iter(small_corpus), vocab_size=512)
    assert a.to_json() == b.to_json() and a.name == b.name and a.vocab_size == 512
    text = small_corpus[0][:2000]
    assert a.decode(a.encode(text)) == text and len(a.encode(text)) < len(text.encode()) * 0.7

    def no_training():
        raise AssertionError("retrained instead of loading the cached tokenizer")

    cached = build_tokenizer("bpe", "corpus-fp", corpus=lambda: iter(small_corpus), vocab_size=512, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("bpe-512-*.json"))) == 1
    again = build_tokenizer("bpe", corpus=no_training, vocab_size=512, cache_dir=tmp_path, fingerprint="corpus-fp")
    assert again.name == cached.name == a.name and again.encode(text) == a.encode(text)
    with pytest.raises(DataError) as e:  # another fingerprint is not in the cache, and no corpus
        build_tokenizer("bpe", "other-corpus", vocab_size=512, cache_dir=tmp_path)
    one_line_error(e, "data.tokenizer_path")
    # a run directory carries its tokenizer.json and restores it without the corpus
    spec = save_tokenizer(a, tmp_path / "run")
    restored = load_saved_tokenizer(spec, tmp_path / "run")
    assert restored.name == a.name and restored.encode(text) == a.encode(text)
    assert load_saved_tokenizer(None, tmp_path / "run").eos_id == a.eos_id
    assert load_tokenizer_file(tmp_path / "run" / "tokenizer.json", kind="bpe").name == a.name


@needs_shared
def test_save_and_restore_path_tokenizers(gpt2, tmp_path):
    spec = save_tokenizer(gpt2, tmp_path)
    assert spec["kind"] == "gpt2" and Path(spec["path"]).exists()
    assert load_saved_tokenizer(spec, tmp_path).encode("Hello there") == gpt2.encode("Hello there")


# ------------------------------------------------------------------------------------- cache
def test_cache_puts_eos_after_every_document(tmp_path):
    docs = ["hello world", "foo", "", "ünï"]
    tok = ByteTok()
    arr = tokenize_to_cache(docs, tok, tmp_path / "c.bin", show_progress=False)
    lens = [len(tok.encode(d)) for d in docs]
    assert len(arr) == sum(lens) + len(docs) and arr.dtype == np.uint16
    offsets = load_doc_offsets(tmp_path / "c.bin")
    assert offsets.tolist() == [0, 12, 16, 17, 23]
    assert [int(arr[o - 1]) for o in offsets[1:]] == [tok.eos_id] * 4
    assert np.asarray(arr[:12]).tolist() == tok.encode("hello world") + [256]
    meta = json.loads((tmp_path / "c.json").read_text())
    expected = {"dtype": "uint16", "n_tokens": 23, "n_docs": 4, "vocab_size": 257, "tokenizer": "bytes"}
    assert meta.items() >= expected.items()

    def never():
        raise AssertionError("re-tokenised an existing cache")
        yield

    again = tokenize_to_cache(never(), tok, tmp_path / "c.bin", show_progress=False)
    assert np.array_equal(again, arr)
    assert not list(tmp_path.glob("*.tmp*"))

    class BigVocab(ByteTok):
        name, vocab_size = "big", 70_000

    assert tokenize_to_cache(["x"], BigVocab(), tmp_path / "big.bin", show_progress=False).dtype == np.uint32


@needs_shared
def test_cache_of_real_text_decodes_with_eos_between_documents(gpt2, tmp_path):
    arr, meta = get_token_array(str(WIKI), "valid", gpt2, tmp_path, show_progress=False)
    docs = list(iter_documents(str(WIKI), "valid"))
    assert meta["n_docs"] == len(docs) and meta["n_tokens"] == len(arr)
    assert len(arr) == sum(len(ids) for ids in gpt2.encode_batch(docs)) + len(docs)
    text = gpt2.decode(np.asarray(arr[:200_000]).tolist())
    assert text == "<|endoftext|>".join(docs) + "<|endoftext|>"
    arr2, meta2 = get_token_array(str(WIKI), "valid", gpt2, tmp_path, show_progress=False)
    assert meta2["path"] == meta["path"] and len(list(tmp_path.glob("*.bin"))) == 1


# ----------------------------------------------------------------------------------- loader
def test_packed_sequences_are_consecutive_windows():
    ds = SequenceDataset(np.arange(103, dtype=np.uint16), 10)
    assert len(ds) == 10
    batch = ds.get_batch([0, 9, 3])
    assert batch["mask"] is None and batch["tokens"].dtype == torch.long
    assert batch["tokens"].tolist() == [list(range(0, 10)), list(range(90, 100)), list(range(30, 40))]
    assert ds[4]["tokens"].tolist() == list(range(40, 50))


def test_unpacked_sequences_pad_truncate_and_mask(tmp_path):
    docs = ["abc", "defghijklmnop", "q"]
    tokenize_to_cache(docs, ByteTok(), tmp_path / "u.bin", show_progress=False)
    arr, meta = open_cache(tmp_path / "u.bin")
    ds = SequenceDataset.from_cache(arr, meta, 6, packed=False)
    assert len(ds) == 3
    b = ds.get_batch([0, 1, 2])
    eos = 256
    assert b["tokens"].tolist() == [[97, 98, 99, eos, eos, eos], list(b"defghi"), [113, eos, eos, eos, eos, eos]]
    assert b["mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 0, 0, 0, 0]]
    assert SequenceDataset.from_cache(arr, meta, 6, packed=False, pad_id=0).get_batch([2])["tokens"].tolist() == [
        [113, eos, 0, 0, 0, 0]
    ]


def batches(loader, k):
    return [next(loader)["tokens"] for _ in range(k)]


def test_loader_is_deterministic_and_visits_each_sequence_once_per_epoch():
    ds = SequenceDataset(np.arange(40 * 4, dtype=np.uint16), 4)  # 40 sequences
    a, b = BatchLoader(ds, 8, seed=3), BatchLoader(ds, 8, seed=3)
    assert a.steps_per_epoch == 5
    first = batches(a, 10)
    assert all(torch.equal(x, y) for x, y in zip(first, batches(b, 10), strict=False))
    assert not torch.equal(first[0], next(BatchLoader(ds, 8, seed=4))["tokens"])
    for epoch in range(2):
        seen = torch.cat([t[:, 0] // 4 for t in first[5 * epoch : 5 * epoch + 5]])
        assert (
            seen.tolist() == torch.randperm(40, generator=torch.Generator().manual_seed(epoch_seed(3, epoch))).tolist()
        )
    plain = BatchLoader(ds, 8, shuffle=False)
    assert next(plain)["tokens"][:, 0].tolist() == [4 * i for i in range(8)]


def epoch_orders(seed: int, epochs: int, n: int = 40, batch: int = 8) -> list[tuple[int, ...]]:
    """Each epoch's visiting order, read from the loader's batches (sequence i starts with token 4i)."""
    ds = SequenceDataset(np.arange(n * 4, dtype=np.uint16), 4)
    loader = BatchLoader(ds, batch, seed=seed)
    per = n // batch
    firsts = [t[:, 0] // 4 for t in batches(loader, per * epochs)]
    return [tuple(torch.cat(firsts[per * e : per * (e + 1)]).tolist()) for e in range(epochs)]


def test_no_two_seeds_share_an_epochs_order():
    """Issue 33: under the old rule (generator seed = seed + epoch) seed s at epoch e + 1 visited
    exactly seed s + 1's epoch-e order, so seeds 0-2 of a 9-epoch grid trained on the same
    permutations, shifted. Every (seed, epoch) must get its own order."""
    seen: dict[tuple[int, ...], tuple[int, int]] = {}
    for seed in range(6):
        for epoch, order in enumerate(epoch_orders(seed, 10)):
            assert order not in seen, f"seed {seed} epoch {epoch} repeats seed/epoch {seen[order]}"
            seen[order] = (seed, epoch)
    assert len({epoch_seed(s, e) for s in range(-3, 50) for e in range(50)}) == 53 * 50
    assert epoch_seed(-1, 0) == epoch_seed(2**64 - 1, 0)  # a seed is read modulo 2**64


def test_cells_with_the_same_seed_see_the_same_batches(tmp_path, monkeypatch):
    """A seed names one data order across a grid's cells: two methods and two widths with the same
    train.seed draw identical training batches; another seed draws others."""
    from replaid.data.pipeline import DataPipeline
    from replaid.presets import resolve

    monkeypatch.setenv("REPLAID_CACHE_DIR", str(tmp_path / "cache"))

    def first_batches(*overrides: str) -> list[torch.Tensor]:
        pipe = DataPipeline(resolve("debug", None, ["train.batch_size=8", *overrides]), None)
        per = pipe.train_loader.steps_per_epoch
        return [next(pipe.train_iter)["tokens"] for _ in range(per + 3)]  # across an epoch boundary

    a = first_batches("train.seed=1")
    b = first_batches("method=mdlm", "model.hidden=32", "train.seed=1")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = first_batches("train.seed=2")
    assert not any(torch.equal(x, y) for x, y in zip(a, c, strict=False))


def test_loader_resume_matches_uninterrupted():
    ds = SequenceDataset(np.arange(37 * 3, dtype=np.uint16), 3)  # 37 sequences, 4 batches of 8 per epoch
    full = BatchLoader(ds, 8, seed=11)
    reference = batches(full, 12)
    for k in (0, 3, 4, 7):
        part = BatchLoader(ds, 8, seed=11)
        batches(part, k)
        state = json.loads(json.dumps(part.state_dict()))
        resumed = BatchLoader(ds, 8, seed=11)
        resumed.load_state_dict(state)
        assert all(torch.equal(x, y) for x, y in zip(batches(resumed, 12 - k), reference[k:], strict=False))
    short = BatchLoader(ds, 8, seed=11, drop_last=False)
    assert short.steps_per_epoch == 5 and all(t.shape == (8, 3) for t in batches(short, 6))


def test_loader_shards_disjoint_and_union_is_the_global_batch():
    ds = SequenceDataset(np.arange(50 * 2, dtype=np.uint16), 2)
    glob = BatchLoader(ds, 12, seed=5)
    ranks = [BatchLoader(ds, 6, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(9):  # crosses two epoch boundaries (4 global batches per epoch)
        g = next(glob)["tokens"]
        parts = [next(r)["tokens"] for r in ranks]
        assert torch.equal(torch.cat(parts), g)
        assert not set(parts[0][:, 0].tolist()) & set(parts[1][:, 0].tolist())


SPLITS = [(1, 1, 8), (1, 4, 2), (2, 2, 2), (4, 1, 2), (2, 1, 4), (1, 2, 4), (8, 1, 1)]  # (world, accum, micro)


def global_batches(ds, world: int, accum: int, micro: int, steps: int, state: dict | None = None):
    """The first sequence of each row of the global batch of each of ``steps`` optimiser steps, put
    together from ``world`` rank loaders drawing ``accum`` micro-batches each, by the trainer's slot
    ``k * world + rank``; also the (JSON round-tripped) loader state after them."""
    ranks = [BatchLoader(ds, micro, seed=7, rank=r, world_size=world, accum=accum) for r in range(world)]
    for r in ranks:
        if state is not None:
            r.load_state_dict(state)
    out = []
    for _ in range(steps):
        slots = {}
        for k in range(accum):
            for r, loader in enumerate(ranks):
                slots[k * world + r] = next(loader)["tokens"][:, 0]
        out.append(torch.cat([slots[s] for s in sorted(slots)]).tolist())
    return out, json.loads(json.dumps(ranks[0].state_dict()))


def test_global_data_order_is_the_same_for_any_world_size_and_accumulation():
    """Issue 36: the global batches, their order and the epoch boundaries depend only on the global
    batch (8), not on its split into ranks x accumulation x micro-batch; a state saved under one split
    resumes under any other (index counted in global batches)."""
    ds = SequenceDataset(np.arange(45 * 2, dtype=np.uint16), 2)  # 45 sequences: 5 global batches + 5 left over
    ref, _ = global_batches(ds, 1, 1, 8, 13)  # 2.6 epochs
    perm = [torch.randperm(45, generator=torch.Generator().manual_seed(epoch_seed(7, e))) for e in range(3)]
    assert ref[5] == (2 * perm[1][:8]).tolist()  # epoch 1 starts at step 5 (the 5 left over are dropped)
    for world, accum, micro in SPLITS:
        got, _ = global_batches(ds, world, accum, micro, 13)
        assert got == ref, (world, accum, micro)
    for a in SPLITS:  # saved under split a at step 7 (epoch 1), resumed under every split b
        _, state = global_batches(ds, *a, 7)
        assert state == {"epoch": 1, "index": 2, "global_batch": 8}
        for b in SPLITS:
            got, _ = global_batches(ds, *b, 6, state=state)
            assert got == ref[7:], (a, b)


def test_a_data_state_from_before_global_units_still_loads():
    """A state without ``global_batch`` counted batches of batch_size x world (per accumulation step)."""
    ds = SequenceDataset(np.arange(45 * 2, dtype=np.uint16), 2)
    loader = BatchLoader(ds, 2, accum=4)
    loader.load_state_dict({"epoch": 0, "index": 8})
    assert (loader.epoch, loader.index) == (0, 2)
    with pytest.raises(DataError, match="global batches of 16 sequences"):
        loader.load_state_dict({"epoch": 0, "index": 1, "global_batch": 16})


def test_unigram_nll_reference_floor():
    got = unigram_nll(np.array([0, 0, 1], np.uint16), np.array([0, 2], np.uint16), 3)
    assert math.isclose(got, -(math.log(3 / 6) + math.log(1 / 6)) / 2)
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.125, 0.125])
    train, test = rng.choice(4, 100_000, p=p), rng.choice(4, 20_000, p=p)
    assert abs(unigram_nll(train, test, 4) - float(-(p * np.log(p)).sum())) < 0.01


@needs_shared
def test_describe_reports_counts_and_round_trip(tmp_path):
    d = describe(str(WIKI), "gpt2", str(GPT2), split="valid", cache_dir=tmp_path)
    assert (d["documents"], d["vocab_size"], d["tokenizer"]) == (9, 50257, "gpt2")
    assert d["tokens"] > 50_000 and len(d["example"]["ids"]) == 32
    assert d["example"]["text"].startswith(d["example"]["decoded"][:50]) and d["example"]["decoded"]


# ------------------------------------------------------------------------------- data errors
def test_data_errors_are_one_line_and_name_the_fix(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "emptydir").mkdir()
    write_jsonl(tmp_path / "nofield.jsonl", ["x"], field="content")
    (tmp_path / "split").mkdir()
    write_jsonl(tmp_path / "split" / "train.jsonl", ["x"])
    cases = [
        (lambda: next(iter_documents(str(tmp_path / "missing"), "train")), ["does not exist", "data.source"]),
        (lambda: next(iter_documents(str(tmp_path / "empty.jsonl"), "train")), ["no documents", "data.source"]),
        (lambda: next(iter_documents(str(tmp_path / "emptydir"), "train")), ["no documents", "data.source"]),
        (
            lambda: next(iter_documents(str(tmp_path / "nofield.jsonl"), "train")),
            ["nofield.jsonl:1", "'text'", "data.text_field"],
        ),
        (lambda: next(iter_documents(str(tmp_path / "split"), "test")), ["split 'test' not found", "test.jsonl"]),
        (lambda: next(iter_documents("stdlib", "dev")), ["unknown split", "train, valid, test"]),
        (lambda: build_tokenizer("wordpiece9"), ["unknown tokenizer kind", "data.tokenizer"]),
        (lambda: build_tokenizer("llama2", str(tmp_path / "nope.model")), ["not found", "data.tokenizer_path"]),
        (lambda: build_tokenizer("gpt2", str(tmp_path / "emptydir")), ["not found", "data.tokenizer_path"]),
        (lambda: SequenceDataset(np.arange(5), 8), ["5 tokens", "seq_len=8", "smaller data.seq_len"]),
        (
            lambda: BatchLoader(SequenceDataset(np.arange(40), 4), 4, world_size=3),
            ["only 10 sequences", "global batch of 12", "smaller batch size or seq_len"],
        ),
        (lambda: validate_tokens(np.array([1, 600, 3], np.uint16), 512), ["token id 600 >= vocab size 512", "delete"]),
    ]
    for fn, needles in cases:
        with pytest.raises(DataError) as e:
            fn()
        one_line_error(e, *needles)
