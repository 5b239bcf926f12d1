"""Dominant POS per subword: the appendix's worked example and the tally/argmax/entropy formulas."""

import numpy as np
import pytest

from replaid.eval import pos

EXAMPLE = "The cat is purring loudly."
EXAMPLE_IDS = [464, 3797, 318, 1308, 1806, 23112, 13]
EXAMPLE_SPANS = [(0, 3), (3, 7), (7, 10), (10, 14), (14, 18), (18, 25), (25, 26)]
EXAMPLE_WORDS = [(0, 3), (4, 7), (8, 10), (11, 18), (19, 25), (25, 26)]  # spaCy's words (idx, idx + len)


def test_char_to_word_and_alignment_match_the_worked_example():
    c2w = pos.char_to_word(EXAMPLE_WORDS, len(EXAMPLE))
    expect = [0, 0, 0, -1, 1, 1, 1, -1, 2, 2, -1, 3, 3, 3, 3, 3, 3, 3, -1, 4, 4, 4, 4, 4, 4, 5]  # the appendix row
    assert c2w.tolist() == expect
    assert pos.align(EXAMPLE_SPANS, c2w).tolist() == [0, 1, 2, 3, 3, 4, 5]  # " pur" and "ring" -> purring
    # majority, not first character: a span covering 1 char of word 0 and 3 of word 1 goes to word 1
    assert pos.align([(2, 7)], c2w).tolist() == [1]
    assert pos.align([(3, 4), (7, 8)], c2w).tolist() == [-1, -1]  # all whitespace


class FakeWord:
    def __init__(self, text, idx, pos_):
        self.text, self.idx, self.pos_ = text, idx, pos_


def test_tally_argmax_unseen_and_entropy_against_hand_counts():
    doc = [
        FakeWord(EXAMPLE[a:b], a, p)
        for (a, b), p in zip(EXAMPLE_WORDS, ["DET", "NOUN", "AUX", "VERB", "ADV", "PUNCT"], strict=True)
    ]
    enc = lambda text: (EXAMPLE_IDS + [220], EXAMPLE_SPANS + [(26, 27)])
    ids, tags = pos.subword_tags(EXAMPLE + " ", doc, enc)
    names = [pos.UPOS[t] for t in tags]
    assert names == ["DET", "NOUN", "AUX", "VERB", "VERB", "ADV", "PUNCT", "SPACE"]
    C = np.zeros((30000, 18), dtype=np.int64)
    np.add.at(C, (np.array(ids), tags), 1)
    C[464, pos.UPOS.index("PRON")] += 2  # "The" seen twice more as PRON: dominant PRON, entropy H(1/3, 2/3)
    dom = pos.dominant_pos(C)
    assert dom[1308] == pos.UPOS.index("VERB") and dom[1806] == pos.UPOS.index("VERB")
    assert dom[464] == pos.UPOS.index("PRON") and dom[220] == pos.SPACE
    assert dom[0] == -1  # never observed
    H = pos.pos_entropy(C)
    assert H[464] == pytest.approx(-(1 / 3) * np.log2(1 / 3) - (2 / 3) * np.log2(2 / 3))
    assert H[3797] == 0.0 and np.isnan(H[0])
    assert len(pos.UPOS) == 18 and pos.tag_index("") == pos.UPOS.index("X")


def _gpt2(shared):
    from replaid.data.tokenizers import build_tokenizer

    return build_tokenizer("gpt2", str(shared / "tokenizers" / "gpt2"))


def test_worked_example_end_to_end_with_gpt2_and_spacy(shared):
    pytest.importorskip("spacy")
    try:
        nlp = pos.load_spacy()
    except ValueError as e:
        pytest.skip(str(e))
    assert not {"parser", "ner", "lemmatizer"} & set(nlp.pipe_names) and nlp.max_length == 10**6
    tok = _gpt2(shared)
    enc = pos.hf_offsets(tok)
    ids, spans = enc(EXAMPLE)
    assert ids == EXAMPLE_IDS and [tuple(s) for s in spans] == EXAMPLE_SPANS
    doc = nlp(EXAMPLE)
    assert [(w.text, w.idx, w.pos_) for w in doc] == [
        ("The", 0, "DET"),
        ("cat", 4, "NOUN"),
        ("is", 8, "AUX"),
        ("purring", 11, "VERB"),
        ("loudly", 19, "ADV"),
        (".", 25, "PUNCT"),
    ]
    C = pos.count_pos([EXAMPLE_IDS, tok.encode("\n\nThe cat.")], tok.decode, enc, tok.vocab_size, nlp=nlp)
    dom = pos.dominant_pos(C)
    want = {464: "DET", 3797: "NOUN", 318: "AUX", 1308: "VERB", 1806: "VERB", 23112: "ADV", 13: "PUNCT"}
    assert {i: pos.UPOS[dom[i]] for i in want} == want
    assert C[198, pos.SPACE] == 2  # "\n", "\n" (spaCy: one SPACE word) -> SPACE
    assert C.sum() == len(EXAMPLE_IDS) + len(tok.encode("\n\nThe cat."))


def test_pos_counts_are_cached_by_key(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return np.arange(36).reshape(2, 18)

    a, p, hit = pos.cached_pos_counts(tmp_path, "tok|corpus", compute)
    b, p2, hit2 = pos.cached_pos_counts(tmp_path, "tok|corpus", compute)
    assert (a == b).all() and p == p2 and not hit and hit2 and len(calls) == 1
    pos.cached_pos_counts(tmp_path, "tok|other", compute)
    assert len(calls) == 2
