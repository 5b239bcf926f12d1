"""Several calls' ``gpu_check.json`` merged into one, and the rendered table recorded in
``docs/benchmarks.md`` between the gpu_check markers (``--merge A.json B.json --out DIR --record``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import UsageError


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; give the gpu_check.json that a run wrote under --out") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e.msg} at line {e.lineno}); give a gpu_check.json") from None


def merge(paths: list[str]) -> dict:
    doc: dict = {"runs": [], "steps": {}}
    for p in paths:
        d = load_json(Path(p))
        if not isinstance(d, dict) or "steps" not in d:
            raise UsageError(f"{p}: not a gpu_check.json (no 'steps'); give the file a run wrote under --out")
        doc["runs"] += d.get("runs", [])
        for k, v in d["steps"].items():  # a later file wins, unless its step was only skipped
            if v.get("status") != "skipped" or k not in doc["steps"]:
                doc["steps"][k] = v
    return doc


BEGIN, END = "<!-- gpu_check:begin -->", "<!-- gpu_check:end -->"


def record(md: str, docs: Path) -> None:
    """Put ``md`` between the gpu_check markers of ``docs`` (docs/benchmarks.md)."""
    text = docs.read_text()
    if BEGIN not in text or END not in text:
        raise UsageError(f"{docs} has no '{BEGIN}' ... '{END}' block; restore the GPU acceptance section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    docs.write_text(f"{head}{BEGIN}\n{md.rstrip()}\n{END}{tail}")
