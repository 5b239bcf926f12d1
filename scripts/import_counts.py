"""The import graph's counts (issue 51): arrows between the layers of pyproject.toml's import-linter contract,
how many point upward, the cycles between sibling modules and between the layers' packages, and which modules of sampling, eval, web and hub
reach the training loop (``replaid.training.train``), directly or through others. Read with grimp, the
library import-linter checks with (typing-only imports included, as the contract counts them).

    python scripts/import_counts.py           # one line of counts; exit 1 unless upward, cycles and trainer are 0
    python scripts/import_counts.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
TRAINER = "replaid.training.train"
INFERENCE = ("replaid.sampling", "replaid.eval", "replaid.web", "replaid.hub")


def layers() -> list[list[str]]:
    """The contract's layers, top to bottom, each a list of packages (``a | b`` shares a layer)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    spec = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    return [[p.strip() for p in layer.split("|")] for layer in spec]


def package_of(module: str, packages: list[str]) -> str | None:
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    nodes = sorted({x for e in edges for x in e})
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


def counts(edges: set[tuple[str, str]], modules: set[str], reaches_trainer: list[str]) -> dict[str, Any]:
    """The counts from the module import arrows ``edges`` (importer, imported)."""
    spec = layers()
    packages = [p for layer in spec for p in layer]
    rank = {p: i for i, layer in enumerate(spec) for p in layer}  # 0: the top layer
    arrows, upward = set(), []
    sibling_edges: set[tuple[str, str]] = set()
    for a, b in edges:
        pa, pb = package_of(a, packages), package_of(b, packages)
        if pa is None or pb is None or pa == pb:
            continue
        arrows.add((pa, pb))
        if rank[pb] < rank[pa]:
            upward.append(f"{a} -> {b}")
    for a, b in edges:  # cycles between siblings at every depth: the parent packages of both ends
        pa, pb = a.rsplit(".", 1)[0], b.rsplit(".", 1)[0]
        if pa == pb and a != b:
            sibling_edges.add((a, b))
    return {
        "modules": len(modules),
        "layer_arrows": len(arrows),
        "upward": sorted(upward),
        "cycles": cycles(sibling_edges) + cycles(arrows),
        "inference_reaching_trainer": reaches_trainer,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    import grimp

    g = grimp.build_graph("replaid")
    edges = {(m, i) for m in g.modules for i in g.find_modules_directly_imported_by(m)}
    reach = sorted(m for m in g.modules if m.startswith(INFERENCE) and g.chain_exists(importer=m, imported=TRAINER))
    c = counts(edges, set(g.modules), reach)
    if a.json:
        print(json.dumps(c))
    else:
        print(
            f"{c['modules']} modules, {c['layer_arrows']} arrows between layers: {len(c['upward'])} upward, "
            f"{len(c['cycles'])} cycles, {len(reach)} inference modules reaching {TRAINER}"
        )
        for x in c["upward"] + [" <-> ".join(x) for x in c["cycles"]] + reach:
            print(f"  {x}")
    return 0 if not (c["upward"] or c["cycles"] or reach) else 1


if __name__ == "__main__":
    sys.exit(main())
