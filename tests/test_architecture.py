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


def _import_counts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_counts", ROOT / "scripts" / "import_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_import_graph_has_no_upward_arrow_no_cycle_and_no_path_to_the_trainer():
    """scripts/import_counts.py on the package (issue 51, acceptance 1), and its planted graphs: an arrow from
    the model up to sampling, two sibling modules importing each other, two packages importing each other."""
    import grimp

    ic = _import_counts()
    g = grimp.build_graph("replaid")
    edges = {(m, i) for m in g.modules for i in g.find_modules_directly_imported_by(m)}
    c = ic.counts(edges, set(g.modules), [])
    assert c["upward"] == [] and c["cycles"] == [] and c["layer_arrows"] > 50
    assert ic.main([]) == 0
    up = ic.counts(edges | {("replaid.model.dit", "replaid.sampling.loop")}, set(g.modules), [])
    assert up["upward"] == ["replaid.model.dit -> replaid.sampling.loop"]
    sib = ic.counts(edges | {("replaid.sampling.request", "replaid.sampling.loop")}, set(g.modules), [])
    assert any({"replaid.sampling.loop", "replaid.sampling.request"} <= set(x) for x in sib["cycles"])
    pkg = ic.counts(
        edges | {("replaid.scaling.plan", "replaid.sampling.loop"), ("replaid.sampling.loop", "replaid.scaling.plan")},
        set(g.modules),
        [],
    )
    assert ["replaid.sampling", "replaid.scaling"] in pkg["cycles"]
