"""Zero-shot perplexity data in the MDLM lineage's conventions.

Every convention below is MDLM's ``dataloader.py`` (kuleshov-group/mdlm, ``get_dataset`` and the
``*_detokenizer`` functions; Duo's ``dataloader.py`` inherits them unchanged):

* Datasets, versions and splits (MDLM ``get_dataloaders``: ``validation`` except lm1b/ag_news ``test``;
  LAMBADA has only its test file):

  ============  ==============================================  ===========  ================
  name          source                                          split        text field
  ============  ==============================================  ===========  ================
  wikitext2     ``wikitext`` / ``wikitext-2-raw-v1``             validation   text
  wikitext103   ``wikitext`` / ``wikitext-103-raw-v1``           validation   text
  ptb           ``ptb_text_only``                                validation   sentence
  lambada       OpenAI's GPT-2 ``lambada_test.jsonl``            test         text
  lm1b          ``lm1b``                                         test         text
  ag_news       ``ag_news``                                      test         text
  pubmed        ``scientific_papers`` / ``pubmed``               validation   article
  arxiv         ``scientific_papers`` / ``arxiv``                validation   article
  ============  ==============================================  ===========  ================

* Detokenisers: WikiText (``wt_detokenizer``), PTB, LM1B, LAMBADA (curly quotes to straight,
  ``"\\n" + text.strip()``), scientific papers = WikiText then LM1B; none for AG News.
* Wrapping (``wrap=True`` and ``_group_texts``): every document is tokenised without special tokens
  and followed by EOS; the token stream is cut into chunks of ``L - 2`` tokens, each written as
  ``[BOS] chunk [EOS]`` (length ``L``, the model's length), and the remainder is dropped. MDLM
  groups inside ``datasets.map(batched=True)``, i.e. per batch of 1000 documents (the library's
  default ``batch_size``), dropping a remainder per batch; we do the same with one process (MDLM's
  ``num_proc`` shards first, so its chunk boundaries depend on the CPU count).
* Documents are the dataset's rows: WikiText rows are the lines of the file with their newline
  (blank lines are empty rows, as the Hub's ``wikitext`` builder yields them); PTB rows are the
  stripped lines (``ptb_text_only``).

Local files (``--data-dir``, default ``../shared/data/zeroshot``): ``NAME/SPLIT.txt`` (one row per
line as above) or ``NAME/SPLIT.jsonl`` (``{"text": ...}`` rows); ``valid`` and ``validation`` are the
same split. Otherwise the Hub is tried through ``datasets`` (needs the network).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replaid.data.errors import DataError

if TYPE_CHECKING:
    import numpy as np

    from replaid.data.tokenizers import Tokenizer

# ------------------------------------------------------------------ detokenisers (MDLM dataloader.py)


def wt_detokenizer(string: str) -> str:
    """MDLM's ``wt_detokenizer`` (WikiText)."""
    string = string.replace("s '", "s'")
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    string = string.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for p in (":", ";", ".", "!", "?", ","):
        string = string.replace(f" {p} ", f"{p} ")
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    string = string.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    string = string.replace(" " + chr(176) + " ", chr(176))
    string = string.replace(" \n", "\n").replace("\n ", "\n")
    string = string.replace(" N ", " 1 ").replace(" 's", "'s")
    return string


def ptb_detokenizer(x: str) -> str:
    """MDLM's ``ptb_detokenizer``."""
    x = x.replace(" 's", "'s").replace("s ' ", "s' ").replace(" n't", "n't").replace(" \n ", "\n")
    x = x.replace("\\/", "/")
    for _ in range(10):
        x = x.replace(" N ", " 1 ")
    return x.replace("$ 1", "$1").replace("# 1", "#1").replace("<unk>", "?")


def lm1b_detokenizer(x: str) -> str:
    """MDLM's ``lm1b_detokenizer``."""
    x = x.replace("http : / / ", "http://").replace("https : / / ", "https://")
    x = re.sub(r" \'(\w+)", r"'\1", x)
    x = re.sub(r" (\w+) \. ", r" \1. ", x)
    x = re.sub(r" (\w+) \.$", r" \1.", x)
    x = x.replace(" ? ", "? ")
    x = re.sub(r" \?$", "?", x)
    x = x.replace(" ! ", "! ")
    x = re.sub(r" \!$", "!", x)
    x = x.replace(" , ", ", ").replace(" : ", ": ").replace(" ; ", "; ").replace(" / ", "/")
    x = re.sub(r"\" ([^\"]+) \"", r'"\1"', x)
    x = re.sub(r"\' ([^\']+) \'", r"'\1'", x)
    x = re.sub(r"\( ([^\(\)]+) \)", r"(\1)", x)
    x = re.sub(r"\[ ([^\[\]]+) \]", r"[\1]", x)
    return x.replace("$ ", "$").replace("£ ", "£")


def lambada_detokenizer(text: str) -> str:
    """MDLM's ``lambada_detokenizer``."""
    return "\n" + text.replace("“", '"').replace("”", '"').strip()


def scientific_papers_detokenizer(x: str) -> str:
    """MDLM's ``scientific_papers_detokenizer``: WikiText, then LM1B."""
    return lm1b_detokenizer(wt_detokenizer(x))


# ------------------------------------------------------------------ dataset table


@dataclass(frozen=True)
class ZeroShotSet:
    name: str
    hub: tuple[str, ...]  # datasets.load_dataset(*hub)
    split: str
    field: str
    detok: Callable[[str], str] | None
    rows: str = "lines"  # how a local .txt file becomes rows: "lines" (WikiText) | "stripped" (PTB)


SETS = {
    "wikitext2": ZeroShotSet("wikitext2", ("wikitext", "wikitext-2-raw-v1"), "validation", "text", wt_detokenizer),
    "wikitext103": ZeroShotSet(
        "wikitext103", ("wikitext", "wikitext-103-raw-v1"), "validation", "text", wt_detokenizer
    ),
    "ptb": ZeroShotSet("ptb", ("ptb_text_only",), "validation", "sentence", ptb_detokenizer, rows="stripped"),
    "lambada": ZeroShotSet(
        "lambada",
        ("json-url", "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"),
        "test",
        "text",
        lambada_detokenizer,
    ),
    "lm1b": ZeroShotSet("lm1b", ("lm1b",), "test", "text", lm1b_detokenizer),
    "ag_news": ZeroShotSet("ag_news", ("ag_news",), "test", "text", None),
    "pubmed": ZeroShotSet(
        "pubmed", ("scientific_papers", "pubmed"), "validation", "article", scientific_papers_detokenizer
    ),
    "arxiv": ZeroShotSet(
        "arxiv", ("scientific_papers", "arxiv"), "validation", "article", scientific_papers_detokenizer
    ),
}
_SPLIT_FILES = {"validation": ("validation", "valid"), "test": ("test",), "train": ("train",)}


def text_rows(path: Path, rows: str) -> list[str]:
    """Rows of a local .txt (per line: WikiText keeps the newline and empties blank lines; PTB strips)
    or .jsonl (``text`` / ``sentence`` / ``article`` field) file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"zero-shot file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise DataError(
                    f"zero-shot file {path} line {n}: not JSON ({str(e)[:60]}); fix or remove the line"
                ) from None
            row = [d[k] for k in ("text", "sentence", "article") if k in d] if isinstance(d, dict) else []
            if not row or not isinstance(row[0], str):
                raise DataError(
                    f'zero-shot file {path} line {n}: no string field "text", "sentence" or "article"; '
                    f"each line must be a JSON object holding one"
                )
            out.append(row[0])
        return out
    lines = text.splitlines(keepends=True)
    if rows == "stripped":
        return [ln.strip() for ln in lines]
    return [ln if ln.strip() else "" for ln in lines]


def load_documents(name: str, split: str | None = None, data_dir: str | None = None) -> tuple[list[str], str]:
    """(detokenised documents, where they came from) for a zero-shot set."""
    if name not in SETS:
        raise DataError(f"unknown zero-shot dataset '{name}'; choose from {', '.join(SETS)}")
    s = SETS[name]
    split = split or s.split
    split = "validation" if split == "valid" else split
    rows: list[str] | None = None
    origin = ""
    if data_dir:
        for stem in _SPLIT_FILES.get(split, (split,)):
            for ext in (".txt", ".jsonl"):
                f = Path(data_dir).expanduser() / name / f"{stem}{ext}"
                if f.is_file():
                    rows, origin = text_rows(f, s.rows), str(f)
                    break
            if rows is not None:
                break
    if rows is None:
        rows, origin = _hub_rows(s, split)
    if s.detok is not None:
        rows = [s.detok(r) for r in rows]
    return rows, origin


def _hub_rows(s: ZeroShotSet, split: str) -> tuple[list[str], str]:
    try:
        import datasets

        if s.hub[0] == "json-url":
            ds = datasets.load_dataset("json", data_files=s.hub[1], split="train")
        else:
            ds = datasets.load_dataset(*s.hub, split=split)
        return [r[s.field] for r in ds], "hf:" + "/".join(s.hub) + f":{split}"
    except Exception as e:
        raise DataError(
            f"zero-shot set '{s.name}' ({split}) is not in --data-dir and cannot be loaded from the "
            f"Hub ({e.__class__.__name__}); put it at DATA_DIR/{s.name}/{split}.txt or go online"
        ) from None


# ------------------------------------------------------------------ wrapping

MAP_BATCH = 1000  # datasets.map(batched=True) default batch_size, MDLM's grouping unit


def wrap_documents(docs: list[list[int]], seq_len: int, bos: int, eos: int, group: int = MAP_BATCH) -> np.ndarray:
    """MDLM ``_group_texts``: per group of ``group`` documents, concatenate ``doc + [EOS]``, cut into
    ``seq_len - 2`` tokens, write ``[BOS] chunk [EOS]``, drop the remainder. Returns (N, seq_len) int64."""
    import numpy as np  # here, not at the top: the CLI's parser reads SETS and needs no numpy

    if seq_len < 3:
        raise DataError(f"model length {seq_len} leaves no room between [BOS] and [EOS]")
    n = seq_len - 2
    rows = []
    for g in range(0, len(docs), group):
        stream = [t for d in docs[g : g + group] for t in (*d, eos)]
        for i in range(0, len(stream) // n * n, n):
            rows.append([bos, *stream[i : i + n], eos])
    return np.asarray(rows, dtype=np.int64).reshape(-1, seq_len)


def bos_eos(tok: Tokenizer) -> tuple[int, int]:
    """MDLM's BOS/EOS: the tokenizer's own (GPT-2: both <|endoftext|>); BERT-style: [CLS] / [SEP]."""
    inner = getattr(tok, "_tok", None)
    cls = inner.token_to_id("[CLS]") if inner is not None else None
    return (cls if cls is not None else tok.eos_id), tok.eos_id
