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
