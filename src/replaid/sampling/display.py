"""Decoded text as shown to a person: undecodable byte pieces and control characters made visible.

An undertrained byte-level BPE samples tokens holding part of a UTF-8 character; decoded, they give
U+FFFD, and bytes such as 0x13 decode to control characters that a terminal acts on or hides. The CLI
(``replaid sample``, ``replaid edit``), the playground and ``POST /v1/completions`` show each as an
escape (``\\x13``, ``\\ufffd``); ``--raw`` (``replaid serve --raw``) keeps the decoded text as it is.
``replaid sample --json`` rows keep the raw text (``replaid quality`` retokenises it)."""

from __future__ import annotations

import re

# every C0/C1 control character but newline and tab, and the replacement character U+FFFD
HIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str, raw: bool = False) -> str:
    """``text`` with control characters (not newline, tab) and U+FFFD as escapes; unchanged if ``raw``."""
    return text if raw else HIDDEN.sub(_escape, text)
