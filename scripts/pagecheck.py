"""Check that every figure on a results page is in the data the page declares (issue 33).

A page names its data in HTML comments, which Markdown does not render::

    <!-- data: grid/report.json, page_figures.json -->
    <!-- not-in-data (gradient norms from a hook log, not stored): 0.30 0.80 -->

Paths are relative to the page (JSON, YAML or CSV). A comment placed before the page's first ``##``
heading covers the whole page; one placed inside a section covers that section and its subsections, so
a section can name its own JSON (e.g. a re-run's report). ``not-in-data`` lists figures that are not
in any data file (paper figures, probes whose logs are not kept, closed forms), each list with its
reason; an entry that no longer appears on the page is itself an error, so the list cannot rot.

Checked: every number written with a decimal point (``5.090``, ``+0.018``, ``x0.951``, ``12.6%``,
``4.74e4``) in prose and tables. Not checked, by rule: integers (counts, steps, seeds, dates, sizes),
numbers in code spans, fenced blocks, comments and link targets, version strings (``2.13.0``). A
figure matches a data value when it is that value rounded to the printed decimals (a percentage may
also be the value x 100); signs are not compared, since prose writes a difference either way round
("lower by 0.26"); an interval ``[lo, hi]`` must also be a pair of values side by side in one data
object (two fields of one dict, or a list of two), so that an end cannot match an unrelated value;
``1.67M`` and ``2.5k`` are 1.67e6 and 2.5e3. Numbers in the data's strings count as values; arrays of more than
``RAW_ARRAY`` numbers (per-sample values) do not, so that a figure cannot match a raw sample by
chance. Derived figures belong in a JSON beside the page (``scripts/page_figures.py``).

Three rules on the words (issue 50), on the same pages:

* **multiplicity**: a page with more than one interval-based verdict (a line holding a ``[lo, hi]`` of
  figures and a verdict word: holds, reversed, determined, lower, higher, ...) says how it treats the
  family: Holm, Bonferroni, or "uncorrected";
* **plateau**: ``<!-- plateau: FILE BOUND UNIGRAM -->`` names a run the section rests on (FILE relative
  to the page, BOUND and UNIGRAM dotted keys into it, list items by index); a run less than
  ``PLATEAU_NATS`` below its unigram bound is not interpreted: its section must say "not interpreted"
  and may hold no verdict word;
* **causal words** (cause, route, because, depends on) need an intervention with an interval in the same
  paragraph (a ``[lo, hi]`` of figures), or ``<!-- causal: THE INTERVENTION -->`` in it naming one.

The summary block (the repository's README, ``docs/results/README.md``, ``methods.md``) is checked like
every other page.

    python scripts/pagecheck.py            # every page with a data comment: figures checked, failures
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
# pages outside docs/results checked too: the summary block, and the guides the README's sections moved to (issue 54)
SUMMARY = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
RAW_ARRAY = 16
PLATEAU_NATS = 0.3  # the project's rule: a run less than this below its unigram bound is not interpreted

DATA = re.compile(r"<!--\s*data:\s*(.*?)\s*-->")
NOT_IN_DATA = re.compile(r"<!--\s*not-in-data\s*\((.+?)\)\s*:\s*(.*?)\s*-->")
HEADING = re.compile(r"^(#{1,6})\s")
# a number with a decimal point; an "x" may lead (a ratio, x0.951) or trail it (1.8x)
NUMBER = re.compile(r"(?<![A-Za-wyz0-9_.])([+\-\u2212]?)(\d+\.\d+)(?:e([+\-]?\d+))?([%kM]?)(?!(?!x\b)\w|\.\d)")
INTERVAL = re.compile(r"\[\s*([^\[\],]+?)\s*,\s*([^\[\],]+?)\s*\]")
SUFFIX = {"": 1.0, "%": 1.0, "k": 1e3, "M": 1e6}
PLATEAU = re.compile(r"<!--\s*plateau:\s*(\S+)\s+(\S+)\s+(\S+)\s*-->")
CAUSAL_OK = re.compile(r"<!--\s*causal:\s*(\S.*?)\s*-->")
VERDICT = re.compile(
    r"\b(holds?|reversed|determined|lower|higher|earlier|later|better|worse|faster|slower|beats?)\b", re.I
)
CORRECTION = re.compile(r"\b(Holm|Bonferroni|uncorrected)\b", re.I)
CAUSAL = re.compile(r"\b(caus(?:e|es|ed|ing)|routes?|because|depends? on)\b", re.I)
STRIP = [
    re.compile(r"<!--.*?-->"),  # comments (directives included)
    re.compile(r"`[^`]*`"),  # code spans
    re.compile(r"\]\([^)]*\)"),  # link and image targets
    re.compile(r"https?://\S+"),
]


@dataclass
class Figure:
    line: int
    text: str
    value: float  # absolute value as printed
    tol: float
    percent: bool


@dataclass
class Scope:
    start: int  # first line (1-based, inclusive)
    end: int  # last line (inclusive)
    sources: list[Path] = field(default_factory=list)
    allowed: dict[str, str] = field(default_factory=dict)  # printed figure -> reason


def _numbers(obj: Any) -> Iterator[float]:
    """Numeric leaves of parsed JSON/YAML, numbers inside strings, skipping raw per-sample arrays."""
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        if math.isfinite(obj):
            yield abs(float(obj))
    elif isinstance(obj, str):
        for m in re.finditer(r"\d+(?:\.\d+)?(?:e[+\-]?\d+)?", obj):
            with contextlib.suppress(ValueError):
                yield float(m.group())
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        if len(obj) > RAW_ARRAY and all(isinstance(v, (int, float)) for v in obj):
            return
        for v in obj:
            yield from _numbers(v)


def _pairs(obj: Any) -> Iterator[tuple[float, float]]:
    """Both orders of every two numbers that sit side by side: in one object, or a list of two."""
    if isinstance(obj, dict):
        nums = [abs(float(v)) for v in obj.values() if _num(v)]
        for i, u in enumerate(nums):
            for v in nums[i + 1 :]:
                yield u, v
                yield v, u
        for v in obj.values():
            yield from _pairs(v)
    elif isinstance(obj, list):
        if len(obj) == 2 and all(_num(v) for v in obj):
            u, v = abs(float(obj[0])), abs(float(obj[1]))
            yield u, v
            yield v, u
        elif len(obj) <= RAW_ARRAY or not all(_num(v) for v in obj):
            for v in obj:
                yield from _pairs(v)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_pairs(path: Path) -> list[tuple[float, float]]:
    """The side-by-side number pairs of a data file (an interval's ends are such a pair)."""
    if path.suffix == ".csv":
        return []
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return list(_pairs(yaml.safe_load(path.read_text())))
    return list(_pairs(json.loads(path.read_text())))


def load_values(path: Path) -> list[float]:
    """Every number a data file holds (absolute values)."""
    if path.suffix == ".csv":
        with path.open() as f:
            return [v for row in csv.reader(f) for cell in row for v in _numbers(_cell(cell))]
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return list(_numbers(yaml.safe_load(path.read_text())))
    return list(_numbers(json.loads(path.read_text())))


def _cell(cell: str) -> Any:
    try:
        return float(cell)
    except ValueError:
        return cell


def figures(line: str, lineno: int) -> list[Figure]:
    """The figures of one line of prose or table (code spans, comments and link targets removed)."""
    for rx in STRIP:
        line = rx.sub(" ", line)
    out = []
    for m in NUMBER.finditer(line):
        mant, exp, pct = m.group(2), m.group(3), m.group(4) == "%"
        decimals = len(mant.split(".")[1])
        scale = (10.0 ** int(exp) if exp else 1.0) * SUFFIX[m.group(4)]
        out.append(Figure(lineno, m.group(0), float(mant) * scale, 0.5 * 10.0**-decimals * scale, pct))
    return out


def _bare(text: str) -> str:
    return text.lstrip("+-\u2212x").rstrip("%x")


def intervals(line: str, lineno: int) -> list[tuple[Figure, Figure]]:
    """The ``[lo, hi]`` intervals of a line: both ends must sit side by side in one data object."""
    for rx in STRIP:
        line = rx.sub(" ", line)
    out = []
    for m in INTERVAL.finditer(line):
        ends = figures(m.group(1), lineno) + figures(m.group(2), lineno)
        if len(ends) == 2:
            out.append((ends[0], ends[1]))
    return out


def _heads(lines: list[str]) -> list[tuple[int, int]]:
    """(line, level) of every heading outside fenced blocks."""
    heads, fenced = [], False
    for i, ln in enumerate(lines, 1):
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (h := HEADING.match(ln)):
            heads.append((i, len(h.group(1))))
    return heads


def _span(heads: list[tuple[int, int]], i: int, n: int) -> tuple[int, int]:
    """The lines a directive on line ``i`` covers: its section and subsections, or the page before any ``##``."""
    owner = [(hl, lv) for hl, lv in heads if hl <= i and lv >= 2]
    if not owner:
        return 1, n
    hl, lv = owner[-1]
    return hl, next((h2 - 1 for h2, lv2 in heads if h2 > hl and lv2 <= lv), n)


def scopes(page: Path, lines: list[str]) -> list[Scope]:
    """The page's directives with the line ranges they cover."""
    heads = _heads(lines)
    out = []
    for i, ln in enumerate(lines, 1):
        d, a = DATA.search(ln), NOT_IN_DATA.search(ln)
        if not d and not a:
            continue
        sc = Scope(*_span(heads, i, len(lines)))
        if d:
            sc.sources = [(page.parent / p.strip()).resolve() for p in d.group(1).split(",") if p.strip()]
        if a:
            sc.allowed = {tok: a.group(1) for tok in a.group(2).split()}
        out.append(sc)
    return out


class Pool:
    """Sorted absolute values (and side-by-side pairs) of a set of data files, for rounding-aware lookup."""

    def __init__(self, values: list[float], pairs: list[tuple[float, float]]):
        self.values = sorted(values)
        self.pairs = sorted(pairs)
        self.firsts = [p[0] for p in self.pairs]

    def has_pair(self, a: Figure, b: Figure) -> bool:
        ta, tb = a.tol * (1 + 1e-9) + 1e-12, b.tol * (1 + 1e-9) + 1e-12
        i = bisect.bisect_left(self.firsts, a.value - ta)
        while i < len(self.pairs) and self.pairs[i][0] <= a.value + ta:
            if abs(self.pairs[i][1] - b.value) <= tb:
                return True
            i += 1
        return False

    def has(self, x: float, tol: float) -> bool:
        tol = tol * (1 + 1e-9) + 1e-12
        i = bisect.bisect_left(self.values, x - tol)
        return i < len(self.values) and self.values[i] <= x + tol


def check_page(page: Path, text: str | None = None) -> tuple[int, list[str]]:
    """(figures checked, errors) of one page (or of ``text`` read as that page); an error names the
    page, the line and the figure."""
    lines = (page.read_text() if text is None else text).splitlines()
    scs = scopes(page, lines)
    cache: dict[Path, list[float]] = {}
    pcache: dict[Path, list[tuple[float, float]]] = {}
    errors = []
    for sc in scs:
        for src in sc.sources:
            if not src.exists():
                errors.append(f"{page}:{sc.start}: data file {src} does not exist")
            elif src not in cache:
                cache[src], pcache[src] = load_values(src), load_pairs(src)
    used: set[tuple[int, str]] = set()
    pools: dict[tuple[Path, ...], Pool] = {}
    n, fenced = 0, False
    for i, ln in enumerate(lines, 1):
        if ln.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        here = [s for s in scs if s.start <= i <= s.end]
        srcs = tuple(sorted({p for s in here for p in s.sources if p in cache}))
        if srcs not in pools:
            pools[srcs] = Pool([v for p in srcs for v in cache[p]], [q for p in srcs for q in pcache[p]])
        pool = pools[srcs]
        names = ", ".join(os.path.relpath(p, page.parent.resolve()) for p in srcs) or "none"
        allowed_here = set()
        for f in figures(ln, i):
            n += 1
            bare = _bare(f.text)
            allow = [k for k, s in enumerate(here) if bare in s.allowed]
            if allow:
                used.add((id(here[allow[0]]), bare))
                allowed_here.add(bare)
                continue
            if pool.has(f.value, f.tol) or (f.percent and pool.has(f.value / 100, f.tol / 100)):
                continue
            errors.append(f"{page}:{i}: {f.text} is in none of its data ({names})")
        for lo, hi in intervals(ln, i):
            if {_bare(lo.text), _bare(hi.text)} & allowed_here or pool.has_pair(lo, hi):
                continue
            errors.append(f"{page}:{i}: [{lo.text}, {hi.text}] is no interval of its data ({names})")
    for sc in scs:
        for tok, why in sc.allowed.items():
            if (id(sc), tok) not in used:
                errors.append(f"{page}:{sc.start}: not-in-data entry {tok} ({why}) no longer appears on the page")
    return n, errors + check_words(page, lines)


def _prose(lines: list[str]) -> Iterator[tuple[int, str, str]]:
    """(line number, raw line, line without comments, code spans and link targets) outside fenced blocks."""
    fenced = False
    for i, ln in enumerate(lines, 1):
        if ln.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            bare = ln
            for rx in STRIP:
                bare = rx.sub(" ", bare)
            yield i, ln, bare


def _lookup(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def check_words(page: Path, lines: list[str]) -> list[str]:
    """The rules on the words: multiplicity statement, plateau runs not interpreted, causal words."""
    errors = []
    prose = list(_prose(lines))
    # multiplicity: more than one interval-based verdict needs a correction statement on the page
    verdicts = [i for i, _, bare in prose if intervals(bare, i) and VERDICT.search(bare)]
    if len(verdicts) > 1 and not any(CORRECTION.search(bare) for _, _, bare in prose):
        shown = ", ".join(map(str, verdicts[:5])) + (", ..." if len(verdicts) > 5 else "")
        errors.append(
            f"{page}:{verdicts[0]}: {len(verdicts)} interval-based verdicts (lines {shown}) and no correction "
            "statement (Holm, Bonferroni, or 'uncorrected')"
        )
    # plateau: a declared run less than PLATEAU_NATS below its unigram bound is not interpreted
    heads = _heads(lines)
    for i, ln, _ in prose:
        if not (m := PLATEAU.search(ln)):
            continue
        path, bkey, ukey = (page.parent / m.group(1)).resolve(), m.group(2), m.group(3)
        try:
            obj = json.loads(path.read_text()) if path.suffix == ".json" else _yaml(path)
            bound, unigram = float(_lookup(obj, bkey)), float(_lookup(obj, ukey))
        except (OSError, KeyError, IndexError, ValueError, TypeError) as e:
            errors.append(
                f"{page}:{i}: plateau run {m.group(1)} {bkey} {ukey} cannot be read ({type(e).__name__}: {e})"
            )
            continue
        if unigram - bound >= PLATEAU_NATS:
            continue
        start, end = _span(heads, i, len(lines))
        part = [(k, bare) for k, _, bare in prose if start <= k <= end]
        what = f"{m.group(1)} {bkey} is {unigram - bound:.3f} below its unigram bound (< {PLATEAU_NATS})"
        if not any("not interpreted" in bare.lower() for _, bare in part):
            errors.append(f"{page}:{i}: {what} and its section does not say it is not interpreted")
        for k, bare in part:
            if w := VERDICT.search(bare):
                errors.append(f"{page}:{k}: verdict word '{w.group()}' in a section resting on a plateau run ({what})")
    # causal words: an interval (an intervention's) in the same paragraph, or an opt-out naming the intervention
    para: list[tuple[int, str, str]] = []
    for item in [*prose, (0, "", "")]:
        if item[1].strip():
            para.append(item)
            continue
        if any(CAUSAL_OK.search(raw) for _, raw, _ in para) or any(intervals(b, k) for k, _, b in para):
            para = []
            continue
        for k, _, bare in para:
            if w := CAUSAL.search(bare):
                errors.append(
                    f"{page}:{k}: causal word '{w.group()}' and no intervention with an interval in its paragraph "
                    "(a [lo, hi], or <!-- causal: THE INTERVENTION -->)"
                )
        para = []
    return errors


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


def pages(root: Path = RESULTS) -> list[Path]:
    """Every results page with a data comment, and the summary pages outside ``docs/results``."""
    found = sorted(p for p in root.rglob("*.md") if DATA.search(p.read_text()))
    return found + [p for p in SUMMARY if root == RESULTS and p.exists() and DATA.search(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    bad = 0
    for page in pages():
        n, errors = check_page(page)
        print(f"{os.path.relpath(page, RESULTS)}: {n} figures checked, {len(errors)} errors")
        for e in errors:
            print("  " + e)
        bad += len(errors)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
