"""Build the local lm-evaluation-harness tasks of ``replaid lmeval`` from ``../shared/data`` (offline).

    python scripts/make_lmeval_tasks.py --out runs/lmeval-tasks [--data ../shared/data] [--held-out tinyshakespeare]

writes into ``--out`` one JSONL file and one task YAML per task (absolute data paths, so the folder is
an ``--include-path`` from anywhere; the data stay out of the repository):

* ``replaid_wikitext2`` (``loglikelihood_rolling``): the WikiText-2 validation articles of
  ``DATA/zeroshot/wikitext2`` (the rows and detokeniser of ``replaid zeroshot``, grouped into articles at
  each level-1 heading, as the harness's ``wikitext`` task); word/byte perplexity, bits per byte;
* ``replaid_lambada`` (``loglikelihood``): LAMBADA-style last-word prediction on held-out text
  (``DATA/HELD_OUT/test.jsonl``): a passage of ``--words`` words, the target its last word; perplexity, acc;
* ``replaid_cloze`` (``multiple_choice``): other passages of the same text, the last word among four
  choices (three distractors drawn, seeded, from the held-out words); acc, acc_norm;
* ``replaid_lambada_gen`` (``generate_until``): the lambada passages, the first generated word scored by
  exact match (case-insensitive).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

WORD = re.compile(r"[A-Za-z]{3,}")
HEADING = re.compile(r"^ ?= [^=].* = ?\n?$")


def _yaml(d: dict) -> str:
    """YAML (JSON values are YAML) of a flat-ish dict, one key per line."""
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in d.items())


def _task(name: str, path: Path, output_type: str, **kw) -> str:
    base = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(path.resolve())}},
        "test_split": "test",
        "output_type": output_type,
    }
    return _yaml({**base, **kw})


def wikitext_articles(data: Path) -> list[str]:
    from replaid.data.zeroshot import load_documents

    rows, _ = load_documents("wikitext2", "validation", str(data / "zeroshot"))
    arts: list[list[str]] = []
    for r in rows:
        if HEADING.match(r) or not arts:
            arts.append([])
        arts[-1].append(r)
    return [t for t in ("".join(a).strip() for a in arts) if t]


def passages(texts: list[str], words: int) -> list[dict]:
    """Passages ending at a word of >= 3 letters: ``{"context", "target"}`` (target = that word)."""
    out = []
    for text in texts:
        spans = [m.span() for m in re.finditer(r"\S+", text)]
        for i in range(words - 1, len(spans), words):
            s, _ = spans[i - words + 1]
            ws, we = spans[i]
            m = WORD.fullmatch(re.sub(r"[^A-Za-z]+$", "", text[ws:we]))
            if m is None:
                continue
            out.append({"context": text[s:ws].rstrip(), "target": m.group(0)})
    return out


def build(data: Path, held_out: str, out: Path, n: int, words: int, seed: int) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    arts = wikitext_articles(data)[:n]
    (out / "wikitext2.jsonl").write_text("".join(json.dumps({"text": a}) + "\n" for a in arts))
    (out / "replaid_wikitext2.yaml").write_text(
        _task(
            "replaid_wikitext2",
            out / "wikitext2.jsonl",
            "loglikelihood_rolling",
            doc_to_text="",
            doc_to_target="{{text}}",
            metric_list=[
                {"metric": "word_perplexity"},
                {"metric": "byte_perplexity"},
                {"metric": "bits_per_byte"},
            ],
        )
    )
    counts["replaid_wikitext2"] = len(arts)
    f = data / held_out / "test.jsonl"
    texts = [json.loads(line)["text"] for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    ps = passages(texts, words)
    rng = random.Random(seed)
    rng.shuffle(ps)
    lam, clo = ps[0::2][:n], ps[1::2][:n]
    (out / "lambada.jsonl").write_text("".join(json.dumps(p) + "\n" for p in lam))
    (out / "replaid_lambada.yaml").write_text(
        _task(
            "replaid_lambada",
            out / "lambada.jsonl",
            "loglikelihood",
            doc_to_text="{{context}}",
            # the harness adds no target_delimiter to a loglikelihood task's continuation (lm-eval 0.4.x):
            # the word's space goes in the target, as in the harness's own lambada_openai
            doc_to_target="{{' ' + target}}",
            metric_list=[
                {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            ],
        )
    )
    vocab = sorted({m.group(0) for t in texts for m in WORD.finditer(t)})
    rows = []
    for p in clo:
        wrong = rng.sample([w for w in vocab if w.lower() != p["target"].lower()], 3)
        choices = [p["target"], *wrong]
        rng.shuffle(choices)
        rows.append({"context": p["context"], "choices": choices, "gold": choices.index(p["target"])})
    (out / "cloze.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "replaid_cloze.yaml").write_text(
        _task(
            "replaid_cloze",
            out / "cloze.jsonl",
            "multiple_choice",
            doc_to_text="{{context}}",
            doc_to_choice="{{choices}}",
            doc_to_target="{{gold}}",
            metric_list=[
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        )
    )
    (out / "replaid_lambada_gen.yaml").write_text(
        _task(
            "replaid_lambada_gen",
            out / "lambada.jsonl",
            "generate_until",
            doc_to_text="{{context}}",
            doc_to_target="{{target}}",
            generation_kwargs={"until": ["\n"], "max_gen_toks": 4, "do_sample": False},
            filter_list=[
                {
                    "name": "first_word",
                    "filter": [{"function": "regex", "regex_pattern": "([A-Za-z]+)"}, {"function": "take_first"}],
                }
            ],
            metric_list=[
                {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": True}
            ],
        )
    )
    counts.update(replaid_lambada=len(lam), replaid_cloze=len(rows), replaid_lambada_gen=len(lam))
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="../shared/data", help="the shared data folder")
    p.add_argument("--held-out", default="tinyshakespeare", help="folder under --data whose test.jsonl is used")
    p.add_argument("--out", required=True, help="folder for the task YAMLs and their JSONL files")
    p.add_argument("--n", type=int, default=200, help="documents per task at most")
    p.add_argument("--words", type=int, default=40, help="words per lambada/cloze passage")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    data = Path(a.data)
    for need in (data / "zeroshot" / "wikitext2", data / a.held_out / "test.jsonl"):
        if not need.exists():
            print(f"make_lmeval_tasks: error: {need} is missing; pass --data DIR (../shared/data)", file=sys.stderr)
            return 2
    counts = build(data, a.held_out, Path(a.out), a.n, a.words, a.seed)
    print(json.dumps({"out": str(Path(a.out).resolve()), "documents": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
