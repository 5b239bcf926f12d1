"""The documentation site (issue 37 §2-3): ``mkdocs build --strict`` passes, and fails on a broken link,
a broken anchor, a missing API reference or a page left out of the navigation; every tutorial notebook
(``docs/tutorials/*.py``, jupytext percent format) executes from top to bottom, and a failing cell fails.

Needs the ``docs`` extra (mkdocs-material, mkdocstrings[python], jupytext, nbclient, ipykernel), which
``scripts/setup.sh`` installs with ``[all]``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")
jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.py"))
SLOW_TUTORIALS = {"quickstart", "grid", "distill", "peers", "slurm"}  # over 30 s each on a loaded 2-core machine


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def site_config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for v in item.values() if isinstance(item, dict) else [item]:
            out += nav_pages(v) if isinstance(v, list) else [v]
    return out


def test_the_site_builds_in_strict_mode(tmp_path):
    r = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    for nb in TUTORIALS:  # each notebook became a page, with its .py beside it
        page = (site / "tutorials" / nb.stem / "index.html").read_text()
        assert f"{nb.stem}.py" in page and (site / "tutorials" / nb.name).is_file()
    api = (site / "api" / "sampling" / "index.html").read_text()
    assert "SampleRequest" in api and "row per sample" in api  # rendered from generate()'s docstring
    assert (site / "results" / "ablations" / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()


def test_every_page_module_and_notebook_is_in_the_site():
    """The navigation names every Markdown page and notebook of docs/ (the strict build refuses the
    rest), and the API reference names every public module of the library below the commands."""
    nav = set(nav_pages(site_config()["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    pages |= {f"tutorials/{p.stem}.md" for p in TUTORIALS}
    assert pages == nav, (pages - nav, nav - pages)
    api = "".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    skip = ("replaid.commands", "replaid.web", "replaid.cli", "replaid.dist", "replaid.__main__")
    mods = []
    for p in sorted((REPO / "src" / "replaid").rglob("*.py")):
        name = ".".join(p.relative_to(REPO / "src").with_suffix("").parts).removesuffix(".__init__")
        if (
            name != "replaid"
            and not any(name == s or name.startswith(s + ".") for s in skip)
            and not any(part.startswith("_") for part in name.split("."))
        ):
            mods.append(name)
    missing = [m for m in mods if f"::: {m}\n" not in api]
    assert not missing, f"modules without an API reference page entry (docs/api/*.md): {missing}"


def planted_site(tmp_path: Path, files: dict[str, str], nav: list) -> Path:
    """A small site under the real mkdocs.yml's settings (strict, validation, hook, mkdocstrings)."""
    docs = tmp_path / "docs"
    for name, text in {"index.md": "# Home\n\n[Page](page.md)\n", **files}.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    cfg = site_config()
    cfg.update(docs_dir=str(docs), nav=["index.md", *nav], hooks=[str(REPO / h) for h in cfg["hooks"]])
    for plugin in cfg["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            py = plugin["mkdocstrings"]["handlers"]["python"]
            py["paths"] = [str(REPO / p) for p in py["paths"]]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


GOOD = "# Page\n\n[Home](index.md#home)\n\n::: replaid.fileio\n"
NOTEBOOK = '# %% [markdown]\n# # A tutorial\n#\n# See [the page]({link}).\n\n# %%\nprint("hi")\n'


@pytest.mark.parametrize(
    "plant, files, nav, expect",
    [
        ("nothing", {"page.md": GOOD}, ["page.md"], None),
        ("a link to a missing page", {"page.md": GOOD + "\n[gone](missing.md)\n"}, ["page.md"], "missing.md"),
        ("a missing anchor", {"page.md": GOOD + "\n[gone](index.md#nowhere)\n"}, ["page.md"], "nowhere"),
        (
            "a missing API reference",
            {"page.md": GOOD + "\n::: replaid.no_such_module\n"},
            ["page.md"],
            "no_such_module",
        ),
        ("a page left out of the navigation", {"page.md": GOOD, "stray.md": "# Stray\n"}, ["page.md"], "stray.md"),
        (
            "a broken link in a notebook",
            {"page.md": GOOD, "tutorials/nb.py": NOTEBOOK.format(link="../missing.md")},
            ["page.md", "tutorials/nb.md"],
            "missing.md",
        ),
        (
            "nothing, in a notebook",
            {"page.md": GOOD, "tutorials/nb.py": NOTEBOOK.format(link="../page.md")},
            ["page.md", "tutorials/nb.md"],
            None,
        ),
    ],
)
def test_the_strict_build_fails_on_a_planted_fault(tmp_path, plant, files, nav, expect):
    r = mkdocs_build(planted_site(tmp_path, files, nav), tmp_path / "site")
    if expect is None:
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        assert r.returncode != 0, f"{plant}: the strict build passed"
        assert expect in r.stdout + r.stderr, r.stdout + r.stderr


def execute(notebook_text: str, timeout: int = 600):
    """Run a percent-format notebook in a fresh kernel, from the repository's root (as a user of a clone);
    a cell that raises raises ``nbclient.exceptions.CellExecutionError``."""
    nb = jupytext.reads(notebook_text, fmt="py:percent")
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()
    return nb


def outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "".join(text)


@pytest.mark.parametrize(
    "notebook",
    [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW_TUTORIALS else []) for p in TUTORIALS],
)
def test_the_tutorial_runs(notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAID_TUTORIAL_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = outputs(execute(notebook.read_text()))
    assert "Traceback" not in out
    if notebook.stem == "quickstart":
        assert (tmp_path / "quickstart" / "quickstart.png").stat().st_size > 0
        assert "NELBO perplexity" in out and "[ddpm, 32 steps]" in out


def test_a_failing_cell_fails_the_notebook(tmp_path):
    planted = '# %%\nx = 1\n\n# %%\nraise ValueError("planted fault")\n\n# %%\nprint("not reached")\n'
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="planted fault"):
        execute(planted, timeout=120)


def test_the_tutorials_are_the_issue_s_list():
    assert {p.stem for p in TUTORIALS} >= {"quickstart", "grid", "distill", "slurm", "peers"}
