"""The declared schema of every JSON file replaid writes into a run, checkpoint or grid folder, and the
one reader that checks a file against it. A file that does not match is one
:class:`SchemaError` line naming the file, the field and what to do; nothing is written."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

HEX64 = re.compile(r"[0-9a-f]{64}")


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by None, in dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON (RFC 8259): ``json.dumps`` with ``allow_nan=False``, a not-a-number or infinite value
    written as ``null`` (Python's default writes bare ``NaN``/``Infinity``, which no strict reader
    accepts). The one JSON writer of replaid."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kw)


class SchemaError(ValueError):
    """A run-folder file that is missing, unreadable or does not match its schema (one line)."""


@dataclass(frozen=True)
class Field:
    """One top-level field: its JSON type, whether it must be there, its range (numbers) or a check."""

    kind: str  # int | number | str | bool | dict | list
    required: bool = True
    lo: float | None = None
    hi: float | None = None
    check: Callable[[Any], str] | None = None  # returns what is wrong, "" when fine


Schema = dict[str, Field]

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int, float),
    "str": (str,),
    "bool": (bool,),
    "dict": (dict,),
    "list": (list,),
}
_NAMES = {"int": "a whole number", "number": "a number", "str": "a string", "bool": "true or false"}
_NAMES.update(dict="a JSON object", list="a JSON list")


def describe(v: Any) -> str:
    """A JSON value's kind, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    for kind, types in _TYPES.items():
        if isinstance(v, types) and kind != "number":
            return _NAMES[kind]
    return "a number" if isinstance(v, float) else type(v).__name__


def problem(v: Any, f: Field) -> str:
    """What is wrong with value ``v`` of field ``f`` ("" when nothing)."""
    if isinstance(v, bool) and f.kind != "bool" or not isinstance(v, _TYPES[f.kind]):
        return f"is {describe(v)}, not {_NAMES[f.kind]}"
    if f.kind in ("int", "number"):
        if v != v or v in (float("inf"), float("-inf")):
            return f"is {v}, not a finite number"
        x = cast(float, v)  # an int or a float: checked above
        if f.lo is not None and x < f.lo:
            return f"is {v}, below {f.lo:g}"
        if f.hi is not None and x > f.hi:
            return f"is {v}, above {f.hi:g}"
    return f.check(v) if f.check is not None else ""


def validate(
    obj: Any, schema: Schema, where: str | Path, fix: str, optional: tuple[str, ...] = (), need: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``obj`` if it is a JSON object whose fields match ``schema``, else :class:`SchemaError`
    (``optional``: required fields that may be absent this time; ``need``: fields that must be there)."""
    if not isinstance(obj, dict):
        raise SchemaError(f"{where} holds {describe(obj)}, not a JSON object; {fix}")
    for name in need:
        if name not in obj:
            raise SchemaError(f'{where}: field "{name}" is missing; {fix}')
    for name, f in schema.items():
        if name not in obj:
            if f.required and name not in optional:
                raise SchemaError(f'{where}: field "{name}" is missing; {fix}')
            continue
        why = problem(obj[name], f)
        if why:
            raise SchemaError(f'{where}: field "{name}" {why}; {fix}')
    return obj


def read_json(
    path: str | Path, schema: Schema | None, fix: str, optional: tuple[str, ...] = (), need: tuple[str, ...] = ()
) -> Any:
    """The JSON in ``path``, checked against ``schema`` (None: any JSON object)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SchemaError(f"{p} is missing; {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SchemaError(f"{p} cannot be read ({e.__class__.__name__}); {fix}") from None
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise SchemaError(f"{p} is not JSON ({str(e)[:60]}); {fix}") from None
    return validate(obj, schema or {}, p, fix, optional, need)


def jsonl_rows(path: str | Path, schema: Schema) -> Iterator[dict[str, Any]]:
    """The rows of an append-only JSONL log that match ``schema``; other lines (a torn last line, a
    stray edit) are skipped with one warning naming the file and the first of them."""
    p = Path(path)
    if not p.is_file():
        return
    bad: list[str] = []
    for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield validate(json.loads(line), schema, f"line {n}", "")
        except (ValueError, SchemaError) as e:
            bad.append(str(e).rstrip("; ") if isinstance(e, SchemaError) else f"line {n}: not JSON")
    if bad:
        print(f"replaid: warning: {p}: skipped {len(bad)} line(s) that are not rows ({bad[0]})", file=sys.stderr)


def sha256_record(v: dict[str, Any]) -> str:
    bad = [k for k, h in v.items() if not isinstance(h, str) or not HEX64.fullmatch(h)]
    return f"holds {bad[0]!r} without a sha256 (64 hex digits)" if bad else ""


def plain_name(v: str) -> str:
    """A file name inside the folder (no path)."""
    return "" if v and "/" not in v and "\\" not in v and v not in (".", "..") else f"is {v[:60]!r}, not a file name"


# RUN/checkpoints/step_N/state.json (and an exported or converted folder's)
STATE: Schema = {
    "step": Field("int", lo=0),
    "config": Field("dict"),
    "method": Field("str", required=False),
    "vocab_size": Field("int", lo=2),
    "method_state": Field("dict", required=False),
    "data_state": Field("dict", required=False),
    "sha256": Field("dict", check=sha256_record),
    "binding": Field("dict", required=False),
    "weights": Field("str", required=False),
    "history_tail": Field("list", required=False),
    "world_size": Field("int", required=False, lo=1),
    "nonfinite_steps": Field("int", required=False, lo=0),
    "nonfinite_in_row": Field("int", required=False, lo=0),
    "distill": Field("dict", required=False),
    "final_eval": Field("dict", required=False),
    "exported_from": Field("str", required=False),
    "converted_from": Field("str", required=False),
    "format": Field("str", required=False),  # "dcp": the weights are DCP shards in sharded/
}
# RUN/tokenizer/tokenizer_spec.json
TOKENIZER_SPEC: Schema = {
    "kind": Field("str"),
    "name": Field("str"),
    "vocab_size": Field("int", lo=2),
    "file": Field("str", required=False, check=plain_name),
    "path": Field("str", required=False),
}
# RUN/final_eval.json
FINAL_EVAL: Schema = {"step": Field("int", lo=0), "eval": Field("dict")}
# RUN/metrics.jsonl, one row a line
METRICS_ROW: Schema = {"step": Field("int", lo=0), "time": Field("number", required=False)}
# STUDENT/distill.json
DISTILL: Schema = {"config": Field("dict"), "teacher": Field("str")}
# GRID/manifest.json and SWEEP/manifest.json: the file, then each of its runs
MANIFEST: Schema = {"kind": Field("str", required=False), "runs": Field("list")}
GRID_RUN: Schema = {
    "id": Field("str"),
    "cell": Field("str"),
    "seed": Field("int", lo=0),
    "overrides": Field("list"),
    "run_dir": Field("str"),
    "config": Field("str"),
    "steps": Field("int", lo=1),
    "flops": Field("number", lo=0),
}
# SWEEP/manifest.json's runs (replaid scaling plan)
PLAN_RUN: Schema = {
    "id": Field("str"),
    "method": Field("str"),
    "budget": Field("number", lo=0),
    "size": Field("str"),
    "hidden": Field("int", lo=1),
    "n_layers": Field("int", lo=1),
    "n_heads": Field("int", lo=1),
    "params": Field("int", lo=0),
    "flops_per_token": Field("number", lo=0),
    "tokens_per_step": Field("int", lo=1),
    "steps": Field("int", lo=1),
    "tokens": Field("int", lo=0),
    "flops": Field("number", lo=0),
    "config": Field("str"),
    "run_dir": Field("str"),
}
# files written by replaid with a declared schema, as the corruption test reads them
SCHEMAS: dict[str, Schema] = {
    "state.json": STATE,
    "tokenizer_spec.json": TOKENIZER_SPEC,
    "final_eval.json": FINAL_EVAL,
    "distill.json": DISTILL,
    "manifest.json": MANIFEST,
}
