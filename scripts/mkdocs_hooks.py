"""MkDocs hook (mkdocs.yml ``hooks:``): each tutorial notebook becomes a page of the site.

The tutorials are jupytext percent-format notebooks, ``docs/tutorials/NAME.py`` (text that diffs;
``jupytext --to ipynb`` makes the ``.ipynb``; ``tests/test_docs.py`` executes them). For every such
file this hook adds the page ``tutorials/NAME.md``: the notebook's Markdown cells as they are, its code
cells as fenced Python, and a first line linking the ``.py`` itself (copied beside the page). The pages
go through the same strict build as the written ones, so a broken link in a tutorial fails it too.
"""

from __future__ import annotations

from pathlib import Path

TUTORIALS = "tutorials"


def notebook_markdown(text: str, name: str) -> str:
    """The page of one percent-format notebook ``text`` whose file is ``name``."""
    import jupytext

    nb = jupytext.reads(text, fmt="py:percent")
    parts = []
    for i, cell in enumerate(nb.cells):
        src = cell.source.strip("\n")
        if not src:
            continue
        if cell.cell_type == "markdown":
            parts.append(src)
            if i == 0:
                parts.append(
                    f"*This page is the notebook [`{name}`]({name}) (jupytext percent format: "
                    f"`jupytext --to ipynb {name}` makes the `.ipynb`); CI executes it.*"
                )
        elif cell.cell_type == "code":
            parts.append(f"```python\n{src}\n```")
    return "\n\n".join(parts) + "\n"


def on_files(files, config):
    """Add ``tutorials/NAME.md`` for every ``docs/tutorials/NAME.py``."""
    from mkdocs.structure.files import File

    docs = Path(config["docs_dir"])
    for py in sorted((docs / TUTORIALS).glob("*.py")):
        uri = f"{TUTORIALS}/{py.stem}.md"
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"docs/{uri} and docs/{TUTORIALS}/{py.name} both exist: keep the notebook only")
        files.append(File.generated(config, uri, content=notebook_markdown(py.read_text(), py.name)))
    return files
