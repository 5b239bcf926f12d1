"""Every figure on the results pages is in the JSON they declare (issue 33; scripts/pagecheck.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
COVERED = [
    "ablations/README.md",
    "ablations/plaid-gap.md",
    "scaling/README.md",
    "distillation/README.md",
    "control/README.md",
    "lmeval/README.md",
    "trend/gap/README.md",
    "trend/gap2/README.md",
    "trend/overtrain/README.md",
    "blocks/distill.md",
    "blocks/bsize/README.md",
    "blocks/service/README.md",
    "blocks/speed-cpu/README.md",
    "blocks/speed-gpu/README.md",
    "blocks/length/README.md",
    "demo/first-run/README.md",
    "README.md",  # the summary block (issue 50): docs/results/README.md, methods.md and the repository's README
    "methods.md",
    "../../README.md",
    "../guides/getting-started.md",  # the README's sections moved to the guides (issue 54)
    "../guides/reproducibility.md",
]
MIN_FIGURES = {
    "trend/gap/README.md": 50,
    "trend/gap2/README.md": 50,
    "trend/overtrain/README.md": 50,
    "blocks/distill.md": 50,
    "blocks/bsize/README.md": 100,
    "blocks/service/README.md": 40,
    "blocks/speed-cpu/README.md": 30,
    "blocks/speed-gpu/README.md": 30,
    "blocks/length/README.md": 100,
    "demo/first-run/README.md": 30,
    "README.md": 30,
    "../../README.md": 1,  # two figures since issue 54 (a README of about 120 lines); the rest in the guides
    "../guides/getting-started.md": 5,
    "../guides/reproducibility.md": 15,
    "lmeval/README.md": 20,  # the first measurement removed (issue 50: no committed data)
}  # shorter pages


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


pagecheck = _load("pagecheck")


@pytest.mark.parametrize("page", COVERED)
def test_every_figure_on_the_page_is_in_its_data(page):
    path = RESULTS / page
    assert pagecheck.DATA.search(path.read_text()), f"{page} declares no data (<!-- data: ... -->)"
    n, errors = pagecheck.check_page(path)
    assert n > MIN_FIGURES.get(page, 100), f"{page}: only {n} figures found; is the parser broken?"
    assert not errors, "\n".join(errors)


def test_page_figures_json_is_up_to_date():
    assert _load("page_figures").main(["--check"]) == 0, "rerun scripts/page_figures.py and commit"


def test_a_planted_stale_number_fails_naming_page_line_and_figure():
    page = RESULTS / "distillation" / "README.md"
    text = page.read_text()
    good = "x1.126 [1.062, 1.195] (730 against 647)"
    assert good in text
    stale = text.replace(good, "x1.126 [1.062, 1.185] (730 against 647)")
    line = text[: text.index(good)].count("\n") + 1
    _, errors = pagecheck.check_page(page, stale)
    names = "(../ablations/grid/report.json, frontier.json, page_figures.json)"
    assert errors == [
        f"{page}:{line}: 1.185 is in none of its data {names}",
        f"{page}:{line}: [1.062, 1.185] is no interval of its data {names}",
    ]


def test_an_interval_whose_ends_exist_apart_fails(tmp_path):
    (tmp_path / "a.json").write_text('{"r": {"lo": -0.107, "hi": -0.004}, "s": {"m": 0.014}}')
    page = tmp_path / "p.md"
    text = "# P\n<!-- data: a.json -->\n[-0.107, -0.004] and [0.004, 0.107] hold; [-0.107, -0.014] does not.\n"
    assert pagecheck.check_page(page, text)[1] == [f"{page}:3: [-0.107, -0.014] is no interval of its data (a.json)"]


def test_rules_sections_and_allow_list(tmp_path):
    (tmp_path / "a.json").write_text(
        '{"x": 0.12345, "raw": [' + ", ".join(["7.77"] * 20) + "], 'n': null}".replace("'", '"')
    )
    (tmp_path / "b.json").write_text('{"y": 2.5, "note": "sd 0.0056"}')
    page = tmp_path / "p.md"
    text = "\n".join(
        [
            "# P",
            "<!-- data: a.json -->",
            "<!-- not-in-data (the paper): 22.1 -->",
            "x0.123 and -0.12 and 12.3% and 22.1, `9.99` in code, torch 2.13.0, [link](v1.5.md), 1,600 steps.",
            "## Section with its own data",
            "<!-- data: b.json -->",
            "2.50 and 0.0056 and 0.12.",
            "## Another",
            "2.5 is not in this section's data; 7.77 is a raw sample.",
        ]
    )
    n, errors = pagecheck.check_page(page, text)
    assert n == 9
    assert errors == [
        f"{page}:9: 2.5 is in none of its data (a.json)",
        f"{page}:9: 7.77 is in none of its data (a.json)",
    ]
    _, errors = pagecheck.check_page(page, text.replace("and 22.1,", "and"))
    assert errors[-1] == f"{page}:1: not-in-data entry 22.1 (the paper) no longer appears on the page"


def test_summary_pages_are_checked_and_a_stale_readme_number_fails():
    """The summary block (README, docs/results/README.md, methods.md) is checked like every page (issue 50)."""
    summary = [REPO / "README.md", RESULTS / "README.md", RESULTS / "methods.md"]
    assert set(summary) <= set(pagecheck.pages())
    page = REPO / "README.md"
    text = page.read_text()
    good = "469.58 vs unigram 703.80"
    assert good in text
    _, errors = pagecheck.check_page(page, text.replace(good, "469.58 vs unigram 703.90"))
    line = text[: text.index(good)].count("\n") + 1
    run = "docs/results/demo/first-run/"
    names = ", ".join(
        run + f for f in ("measure-seed1.json", "measure-seed2.json", "measure.json", "page_figures.json")
    )
    assert [e for e in errors if "703.90" in e] == [f"{page}:{line}: 703.90 is in none of its data ({names})"]
    assert not pagecheck.check_page(page, text)[1]


def _words(tmp_path, body: str, data: str = '{"d": {"m": 0.52, "lo": 0.46, "hi": 0.58}}') -> list[str]:
    (tmp_path / "a.json").write_text(data)
    page = tmp_path / "p.md"
    return pagecheck.check_page(page, "# P\n<!-- data: a.json -->\n" + body)[1]


def test_several_interval_verdicts_need_a_correction_statement(tmp_path):
    two = "A is lower by 0.52 [0.46, 0.58].\n\nB is higher by 0.52 [0.46, 0.58].\n"
    errors = _words(tmp_path, two)
    assert len(errors) == 1 and "2 interval-based verdicts (lines 3, 5) and no correction statement" in errors[0]
    assert _words(tmp_path, "A is lower by 0.52 [0.46, 0.58].\n") == []  # one verdict: nothing to correct
    assert _words(tmp_path, two + "\nThe intervals are 95% and uncorrected.\n") == []
    assert _words(tmp_path, two + "\nWith Holm's correction over the two.\n") == []


def test_a_run_on_the_plateau_is_not_interpreted(tmp_path):
    data = '{"runs": [{"bound": 6.12, "unigram": 6.30}, {"bound": 5.90, "unigram": 6.30}]}'
    sec = "## S\n<!-- plateau: a.json runs.0.bound runs.0.unigram -->\n"
    errors = _words(tmp_path, sec + "The teacher is 6.12; its students are better.\n", data)
    assert [e.split(": ", 1)[1] for e in errors] == [
        "a.json runs.0.bound is 0.180 below its unigram bound (< 0.3) and its section does not say it is not interpreted",
        "verdict word 'better' in a section resting on a plateau run "
        "(a.json runs.0.bound is 0.180 below its unigram bound (< 0.3))",
    ]
    assert _words(tmp_path, sec + "The teacher is 6.12, on the plateau: not interpreted.\n", data) == []
    # a run off the plateau may be read; a later section is not covered
    off = "## S\n<!-- plateau: a.json runs.1.bound runs.1.unigram -->\nIts students are better.\n"
    assert _words(tmp_path, off, data) == []
    assert _words(tmp_path, sec + "Not interpreted.\n## T\nThe other is better.\n", data) == []
    bad = _words(tmp_path, "## S\n<!-- plateau: a.json runs.5.bound runs.5.unigram -->\n", data)
    assert len(bad) == 1 and "cannot be read (IndexError" in bad[0]


def test_causal_words_need_an_intervention_with_an_interval(tmp_path):
    errors = _words(tmp_path, "The plateau is long because of the schedule.\n")
    assert len(errors) == 1 and "causal word 'because' and no intervention with an interval" in errors[0]
    assert "p.md:3:" in errors[0]
    assert _words(tmp_path, "Holding the ends lengthens it, 0.52 [0.46, 0.58],\nbecause of the schedule.\n") == []
    opt = "<!-- causal: the swapped init (plaid-gap.md) -->\nThe plateau is long because of the init.\n"
    assert _words(tmp_path, opt) == []
    # the interval must be in the same paragraph
    assert len(_words(tmp_path, "0.52 [0.46, 0.58].\n\nThis depends on the corpus.\n")) == 1
    assert _words(tmp_path, "`because` in code, and <!-- a cause in a comment -->.\n") == []
