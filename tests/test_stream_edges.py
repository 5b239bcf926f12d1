"""Completions at their edges (issue 39), as properties over many random cases drawn from seeded generators:

* one sample's text (:class:`~replaid.sampling.stream.SampleText`): for random ids cut into random blocks
  and random stop strings (prefixes of one another, overlapping, spanning tokens, several characters per
  token, characters several tokens write), the deltas add up to the final text, which is a reference's
  written here in a few lines: the text up to the end-of-text token and ``max_tokens``, cut before the
  stop string written first; the kept ids are the fewest that write it. Whatever the blocks;
* a block run writes a completion of one token with no prompt (a block holds any length).
"""

from __future__ import annotations

import random
import types

from replaid.sampling.request import SampleRequest
from replaid.sampling.stream import Completion, SampleText
from test_batching import as_run
from test_blocks import mdlm


def reference(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut before the stop string written first (the first to end; the longest of those), and
    whether one was found: read one character at a time."""
    for end in range(len(text) + 1):
        for s in sorted(stop, key=len, reverse=True):
            if text[:end].endswith(s):
                return text[: end - len(s)], True
    return text, False


def expected(decode, ids: list[int], max_tokens: int, stop: tuple[str, ...], eos: int | None) -> tuple[str, str]:
    """The reference completion of ``ids`` and its finish reason (ids enough to reach the end)."""
    kept: list[int] = []
    for i in ids:
        if i == eos:
            break
        kept.append(i)
        if len(kept) == max_tokens:
            break
    text, stopped = reference(decode(kept), stop)
    return text, "stop" if stopped or len(kept) < max_tokens else "length"


class Pieces:
    """Tokens of zero to three characters (end-of-text: id 0)."""

    eos_id = 0
    pieces = ("<eos>", "a", "b", "ab", "ba", "c", "abc", " ", "x", "ca", "")

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


class Bytes:
    """One id per UTF-8 byte (GPT-2's byte-level decoding: an incomplete character is U+FFFD)."""

    eos_id = 256

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")


def blocks(rng: random.Random, ids: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i : i + n])
        i += n
    return out


def check_sample_texts(tok, alphabet: list[int], stops: list[str], cases: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(cases):
        max_tokens = rng.randint(1, 16)
        ids = [rng.choice(alphabet) for _ in range(max_tokens + rng.randint(0, 3))]  # enough to reach the end
        stop = tuple(rng.sample(stops, rng.randint(0, 3)))
        eos = rng.choice([tok.eos_id, None])
        want = expected(tok.decode, ids, max_tokens, stop, eos)
        for cut in (blocks(rng, ids), [ids], [[i] for i in ids]):  # random blocks, one, one token each
            s = SampleText(tok, max_tokens, stop, eos)
            deltas = [s.feed(b) for b in cut]
            case = (ids, cut, stop, eos, max_tokens)
            assert "".join(deltas) == s.text, case
            assert (s.text, s.finish_reason) == want, case
            kept = s.kept_ids()
            assert tok.decode(kept).startswith(s.text), case  # every byte of the last character kept
            if s.cut is not None:  # cut before a stop: the fewest ids that write the text
                assert not kept or not tok.decode(kept[:-1]).startswith(s.text), case


def test_streamed_text_is_the_reference_whatever_the_blocks_with_multi_character_tokens():
    stops = ["a", "ab", "abc", "bca", "cab", "b a", "aa", "bab", "c", "<eos>"]
    check_sample_texts(Pieces(), list(range(len(Pieces.pieces))), stops, 2000, seed=0)


def test_streamed_text_is_the_reference_whatever_the_blocks_with_byte_level_tokens():
    alphabet = list(b"ab") + list("é€😀".encode()) + [0x80, 0xE2]  # whole, split and broken characters
    check_sample_texts(Bytes(), alphabet, ["a", "ab", "é", "€a", "b😀", "ba", "😀"], 2000, seed=1)


def feed(sample: SampleText, *pieces: str) -> list[str]:
    return [sample.feed([Pieces.pieces.index(p) for p in block]) for block in pieces]


def test_stop_strings_at_their_edges():
    def sample(*stop: str) -> SampleText:
        return SampleText(Pieces(), 100, stop, eos=0)

    s = sample("abc")  # split across two blocks, and across tokens: held back, then cut
    assert feed(s, ["x", "ab"], ["c", "x"]) == ["x", ""] and (s.text, s.finish_reason) == ("x", "stop")
    assert s.kept_ids() == [8]
    s = sample("ab", "abc")  # one a prefix of the other: the shorter is written first
    assert feed(s, ["x", "abc"]) == ["x"] and s.text == "x"
    s = sample("bca", "c")  # "c" ends first, though "bca" starts first
    assert feed(s, ["b", "ca"]) == ["b"] and s.text == "b"
    s = sample("x")  # at the very first token
    assert feed(s, ["x", "a"]) == [""] and (s.text, s.finish_reason, s.kept_ids()) == ("", "stop", [])
    s = sample("bab", "a")  # a block that completes two overlapping stops cuts where smaller blocks do
    assert feed(s, ["ba", "b"]) == ["b"] and s.text == "b"
    s = sample("ab")  # held back while it may be a stop, given out once at the end-of-text token
    assert feed(s, ["x", "a"], ["<eos>"], ["b"]) == ["x", "a", ""] and (s.text, s.finish_reason) == ("xa", "stop")
    s = SampleText(Bytes(), 100, ("x",), None)  # a character two tokens write, then a stop
    assert s.feed(list("€x".encode())) == "€" and Bytes().decode(s.kept_ids()) == "€"


# ------------------------------------------------------------------ a tiny untrained block run


class Letters:
    """11 ids: 'a' .. 'j', end-of-text 10."""

    eos_id = 10

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 97 for c in text]

    def decode(self, ids) -> str:
        return "".join("|" if i == 10 else chr(97 + i) for i in ids)


def test_a_block_run_writes_one_token_with_no_prompt():
    """A block holds any length from one token: no prompt and ``max_tokens`` 1 is a request."""
    method, model = mdlm(4)
    run = types.SimpleNamespace(**vars(as_run(method, model)), tokenizer=Letters())
    rows = Completion(run, SampleRequest(max_tokens=1, steps=2, ignore_eos=True, progress=False)).rows()
    assert len(rows[0]["ids"]) == 1 and rows[0]["finish_reason"] == "length"
