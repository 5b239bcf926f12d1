"""Issue 38 class 2: a run is bound to its tokenizer and its data.

* D26: a run whose ``tokenizer/`` is gone is refused (one line, exit 2); no tokenizer is trained
  into it, even when its corpus changed meanwhile (the old code trained a new BPE silently).
* TS1: another tokenizer of the same vocabulary size copied into a run is refused by ``sample``,
  ``eval`` and ``train --resume`` (its files' sha256 differ from those the checkpoint records).
* C7: ``train --resume`` after the corpus changed at the same path is refused, unless
  ``--accept-changed-data``, which a ``metrics.jsonl`` row then records (step, old and new fingerprint).
* Q06: ``train --resume`` with a ``data_state`` outside the data is refused.
* A run written before the hashes were recorded still loads, and records them at its next save.
"""

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest

from replaid.cli import main
from replaid.store import checkpoint as ck


def files(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


def cli(argv: list) -> tuple[int, list[str]]:
    """``replaid ARGV`` in process: (exit status, non-empty stderr lines)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, [ln for ln in err.getvalue().splitlines() if ln.strip()]


def one_error(code: int, err: list[str], needle: str) -> None:
    errors = [ln for ln in err if ln.startswith("replaid: error: ")]
    assert code == 2 and errors == err[-1:] and needle in errors[0] and "Traceback" not in "".join(err), err


def corpus_docs(offset: int = 0, n: int = 120) -> str:
    from replaid.data.sources import stdlib_modules

    docs = [text for _, text in stdlib_modules()][offset : offset + n]
    return "".join(json.dumps({"text": d}) + "\n" for d in docs)


def foreign_tokenizer(dest: Path, vocab_size: int) -> None:
    """TS1: another BPE of the same vocabulary size (trained on other text), saved as a run saves its own."""
    from replaid.data.sources import iter_documents
    from replaid.data.tokenizers import EOT, HFTokenizer, save_tokenizer, train_bpe

    tok = train_bpe(iter_documents("stdlib", "valid"), vocab_size)
    shutil.rmtree(dest, ignore_errors=True)
    save_tokenizer(HFTokenizer(tok, name="bpe-foreign", kind="bpe", eos_token=EOT), dest)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 2-step debug run on a local corpus (``corpus.jsonl`` beside it)."""
    root = tmp_path_factory.mktemp("binding")
    (root / "corpus.jsonl").write_text(corpus_docs())
    run = root / "run"
    code, err = cli(
        ["train", "--preset", "debug", "--no-progress", "--out", run, f"data.source={root / 'corpus.jsonl'}"]
        + ["train.steps=2", "eval.max_batches=1"]
    )
    assert code == 0, err
    return run


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    """A copy of the trained run and its corpus (the copy's config points at the copied corpus)."""
    shutil.copy(trained.parent / "corpus.jsonl", tmp_path / "corpus.jsonl")
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    src = str(trained.parent / "corpus.jsonl")
    for f in [run / "config.json", *run.glob("checkpoints/*/state.json")]:
        f.write_text(f.read_text().replace(src, str(tmp_path / "corpus.jsonl")))
    for f in run.glob("checkpoints/*/state.json"):  # the moved corpus is part of the config the record covers
        st = json.loads(f.read_text())
        st["sha256"][ck.CONFIG_DIGEST] = ck.config_digest(st["config"])
        f.write_text(json.dumps(st, indent=2))
    return run


SAMPLE = ["sample", "{run}", "--num", "1", "--steps", "2", "--length", "8"]
EVAL = ["eval", "{run}", "--max-batches", "1", "--t-samples", "1"]
RESUME = ["train", "--out", "{run}", "--resume", "--no-progress", "train.steps=3"]


def argv(cmd: list, run: Path) -> list:
    return [str(a).replace("{run}", str(run)) for a in cmd]


@pytest.mark.parametrize("cmd", [SAMPLE, EVAL, RESUME], ids=["sample", "eval", "resume"])
def test_D26_a_missing_tokenizer_is_refused_and_never_retrained_into_the_run(copy, cmd):
    shutil.rmtree(copy / "tokenizer")
    (copy.parent / "corpus.jsonl").write_text(corpus_docs(offset=200))  # and the corpus edited
    before = files(copy.parent)
    code, err = cli(argv(cmd, copy))
    one_error(code, err, "has no tokenizer")
    assert not (copy / "tokenizer").exists() and files(copy.parent) == before


@pytest.mark.parametrize("cmd", [SAMPLE, EVAL, RESUME], ids=["sample", "eval", "resume"])
def test_TS1_a_foreign_tokenizer_of_the_same_vocab_size_is_refused(copy, cmd):
    spec = json.loads((copy / "tokenizer" / "tokenizer_spec.json").read_text())
    foreign_tokenizer(copy / "tokenizer", spec["vocab_size"])
    assert json.loads((copy / "tokenizer" / "tokenizer_spec.json").read_text())["vocab_size"] == spec["vocab_size"]
    before = files(copy.parent)
    code, err = cli(argv(cmd, copy))
    one_error(code, err, "tokenizer")
    assert "sha256" in err[-1] and files(copy.parent) == before


def test_C7_a_changed_corpus_is_refused_on_resume_unless_accepted_and_then_recorded(copy):
    corpus = copy.parent / "corpus.jsonl"
    text = corpus.read_text()
    corpus.write_text(text.replace("the", "teh", 3))  # same path, same size, other content
    assert len(corpus.read_text()) == len(text)
    before = files(copy.parent)
    code, err = cli(argv(RESUME, copy))
    one_error(code, err, "--accept-changed-data")
    assert "corpus.jsonl" in err[-1] and files(copy.parent) == before

    old = ck.load_state(ck.find_checkpoint(copy))["binding"]["corpus"]["sha256"]
    code, err = cli(argv(RESUME, copy) + ["--accept-changed-data"])
    assert code == 0, err
    rows = [json.loads(ln) for ln in (copy / "metrics.jsonl").read_text().splitlines()]
    changed = [r for r in rows if r.get("event") == "data_changed"]
    assert len(changed) == 1 and changed[0]["step"] == 2, changed
    new = ck.load_state(ck.find_checkpoint(copy))["binding"]["corpus"]["sha256"]
    assert changed[0]["old_corpus"] == old and changed[0]["new_corpus"] == new != old
    assert ck.load_state(ck.find_checkpoint(copy))["step"] == 3


def test_C7_the_accept_flag_needs_resume(tmp_path):
    code, err = cli(["train", "--preset", "debug", "--out", tmp_path / "r", "--accept-changed-data"])
    one_error(code, err, "--accept-changed-data")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "state", [{"epoch": -5, "index": 10**12}, {"epoch": 0, "index": -1}, {"epoch": 0, "index": 10**6}]
)
def test_Q06_a_data_state_outside_the_data_is_refused_on_resume(copy, state):
    f = ck.find_checkpoint(copy) / "state.json"
    st = json.loads(f.read_text())
    st["data_state"] = state
    f.write_text(json.dumps(st))
    before = files(copy.parent)
    code, err = cli(argv(RESUME, copy))
    one_error(code, err, "data_state")
    assert files(copy.parent) == before


def test_an_old_run_without_recorded_hashes_still_loads_and_records_them(copy):
    f = ck.find_checkpoint(copy) / "state.json"
    st = json.loads(f.read_text())
    st.pop("binding", None)
    f.write_text(json.dumps(st))
    code, err = cli(argv(SAMPLE, copy))
    assert code == 0 and not [ln for ln in err if "error" in ln], err
    code, err = cli(argv(EVAL, copy))
    assert code == 0, err
    code, err = cli(argv(RESUME, copy))
    assert code == 0, err
    binding = ck.load_state(ck.find_checkpoint(copy))["binding"]
    assert binding["tokenizer"]["files"] and binding["corpus"]["sha256"]


def test_an_unchanged_run_resumes_and_loads_without_a_word(copy):
    code, err = cli(argv(SAMPLE, copy))
    assert code == 0 and not [ln for ln in err if ln.startswith("replaid: ")], err
    code, err = cli(argv(RESUME, copy))
    assert code == 0 and not [ln for ln in err if ln.startswith("replaid: ")], err


def test_TS1_an_exported_folder_records_its_tokenizer_and_refuses_another(trained, tmp_path):
    out = tmp_path / "exp"
    code, err = cli(["export", trained, "--out", out])
    assert code == 0, err
    assert ck.load_state(out)["binding"]["tokenizer"]["files"]
    code, err = cli(argv(SAMPLE, out))
    assert code == 0, err
    foreign_tokenizer(
        out / "tokenizer", json.loads((out / "tokenizer" / "tokenizer_spec.json").read_text())["vocab_size"]
    )
    before = files(tmp_path)
    code, err = cli(argv(SAMPLE, out))
    one_error(code, err, "is not the tokenizer checkpoint")
    assert files(tmp_path) == before


def test_the_corpus_fingerprint_is_cheap_and_says_what_it_misses(tmp_path):
    """Up to 2 MiB a file is hashed in full; a bigger one by its first and last MiB and 8 blocks of 64 KiB
    in between: an edit there, or a new size, is seen; an edit elsewhere that keeps the size is not.
    A copy or a touched file with the same bytes is the same corpus (no mtime, names relative)."""
    import os

    from replaid.data.sources import FULL_HASH_BYTES, SAMPLE_BYTES, corpus_change, corpus_fingerprint

    big = random.Random(0).randbytes(5 * SAMPLE_BYTES)
    d = tmp_path / "c"
    d.mkdir()
    (d / "a.txt").write_bytes(big)
    (d / "b.txt").write_text("small file " * 100)
    fp = corpus_fingerprint(str(d))
    assert [f["name"] for f in fp["files"]] == ["a.txt", "b.txt"]

    def with_byte(pos: int) -> dict:
        b = bytearray(big)
        b[pos] ^= 1
        (d / "a.txt").write_bytes(bytes(b))
        return corpus_fingerprint(str(d))

    assert with_byte(10)["sha256"] != fp["sha256"]  # head
    assert with_byte(len(big) - 10)["sha256"] != fp["sha256"]  # tail
    assert corpus_change(fp, with_byte(10)) == "a.txt content changed (same size)"
    assert with_byte(SAMPLE_BYTES + 5)["sha256"] == fp["sha256"]  # the documented miss: between the samples
    (d / "a.txt").write_bytes(big + b"x")
    assert "a.txt size" in corpus_change(fp, corpus_fingerprint(str(d)))
    (d / "a.txt").write_bytes(big)
    os.utime(d / "b.txt", (1, 1))  # touched: same bytes, same corpus
    shutil.copytree(d, tmp_path / "copy")
    assert corpus_fingerprint(str(d))["sha256"] == corpus_fingerprint(str(tmp_path / "copy"))["sha256"] == fp["sha256"]
    (d / "b.txt").write_text("small file " * 99 + "small filf ")  # under FULL_HASH_BYTES: every byte counts
    assert FULL_HASH_BYTES > 1100 and corpus_fingerprint(str(d))["sha256"] != fp["sha256"]
    (d / "c.md").write_text("new")
    assert "c.md added" in corpus_change(fp, corpus_fingerprint(str(d)))
