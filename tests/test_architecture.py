"""docs/architecture.md's layer diagram is the import-linter contract of pyproject.toml: the same layers in the
same order (a layer added to one and not the other, or moved, fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def contract_layers() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    return [name.strip().removeprefix("replaid.") for layer in layers for name in layer.split("|")]


def diagram_layers() -> list[str]:
    """The names in the diagram's left column (before each line's description), top to bottom."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    names: list[str] = []
    for line in block.splitlines():
        left = re.split(r"\s{3,}(?=[A-Za-z])", line.strip(), maxsplit=1)[0] if line.strip() else ""
        names += re.findall(r"[a-z_]+", left)
    return names


def test_the_diagram_draws_the_contracts_layers_in_order():
    assert diagram_layers() == contract_layers()


def test_the_check_sees_a_layer_missing_from_the_diagram(monkeypatch):
    """The plant: a layer the contract has and the diagram lacks."""
    real = contract_layers()
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: _without_store(self, *a, **k))
    assert diagram_layers() != real


_read = Path.read_text


def _without_store(path: Path, *a: object, **k: object) -> str:
    text = _read(path, *a, **k)  # type: ignore[arg-type]
    return text.replace("              store  ", "                     ") if path.name == "architecture.md" else text
