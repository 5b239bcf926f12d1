"""The method registry: a method's name -> ``module:Class``, imported on first use (torchtitan style).

The methods of this repository are listed in :data:`BUILTIN_METHODS`; a package of one's own adds a
method through the entry-point group :data:`GROUP` (``replaid.methods``), with no change here::

    # the plug-in's pyproject.toml
    [project.entry-points."replaid.methods"]
    mymethod = "my_package.my_method:MyMethod"

Listing the names (:func:`method_names`, the CLI's ``--method`` choices) reads package metadata only:
no method module, no torch. :func:`load` imports the one class named. Both fail with one
:class:`ConfigError` line: a name registered twice (by this repository and a plug-in, or by two
plug-ins), an unknown name, and a plug-in that does not import or is not a method.

What the config takes from a loaded class (:func:`options_of`, :func:`section_of`, ``model_keys``)
is declared on the class by :class:`replaid.methods.base.Method`; the registry sits below the config
(it imports no other ``replaid`` module), so :class:`ConfigError` is defined here and re-exported by
:mod:`replaid.config`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from importlib import metadata
from typing import Any

GROUP = "replaid.methods"

# this repository's methods, in the order the CLI lists them (the trainable ones, then the others)
BUILTIN_METHODS: dict[str, str] = {
    "replaid": "replaid.methods.replaid:RePlaidMethod",
    "plaid": "replaid.methods.plaid:PlaidMethod",
    "ar": "replaid.methods.ar:ARMethod",
    "mdlm": "replaid.methods.mdlm:MDLMMethod",
    "duo": "replaid.methods.duo:DuoMethod",
    "langflow": "replaid.methods.langflow:LangFlowMethod",
}


class ConfigError(ValueError):
    """A bad configuration key or value (one-line message naming the key and the fix)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "module:Class"
    origin: str  # "replaid" or "plug-in DIST (VERSION)"


def _plugins(path: tuple[str, ...]) -> list[Entry]:
    out = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"plug-in {dist.name} {dist.version}" if dist is not None else f"plug-in {ep.value}"
        out.append(Entry(ep.name, ep.value, origin))
    return out


@functools.lru_cache(maxsize=8)
def _entries(path: tuple[str, ...]) -> dict[str, Entry]:
    found = {n: Entry(n, t, "replaid") for n, t in BUILTIN_METHODS.items()}
    for e in _plugins(path):
        prev = found.get(e.name)
        if prev is not None and prev != e:
            raise ConfigError(
                f"method '{e.name}' is registered twice: {prev.target} by {prev.origin} and {e.target} by "
                f"{e.origin}; rename one of them or uninstall one package (entry-point group {GROUP})"
            )
        found[e.name] = e
    return found


def entries() -> dict[str, Entry]:
    """Every registered method (this repository's first), by name; one ConfigError line on a clash."""
    return _entries(tuple(sys.path))


def method_names() -> tuple[str, ...]:
    """The registered method names (no method module is imported)."""
    return tuple(entries())


def load(name: str) -> Any:
    """The method class registered under ``name``, imported now (one ConfigError line if it cannot be)."""
    found = entries()
    e = found.get(name)
    if e is None:
        raise ConfigError(f"unknown method '{name}'; choose one of {', '.join(found)}")
    mod, _, attr = e.target.partition(":")
    try:
        cls = getattr(importlib.import_module(mod), attr) if attr else None
    except Exception as exc:  # a broken plug-in: name it, and its error, on one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"method '{name}' ({e.target}, from {e.origin}) cannot be loaded: {type(exc).__name__}: {first}"
        ) from None
    missing = [k for k in ("build_model", "eval_bound", "kind", "samplers") if not hasattr(cls, k)]
    if not isinstance(cls, type) or missing:
        raise ConfigError(
            f"method '{name}' ({e.target}, from {e.origin}) is not a replaid method: point the entry point "
            f"at a subclass of replaid.methods.Method"
        )
    if getattr(cls, "name", None) != name:
        raise ConfigError(
            f"method '{name}' ({e.target}, from {e.origin}) declares name = {getattr(cls, 'name', None)!r}; "
            f"register it under its own name"
        )
    opts = getattr(cls, "options", None)
    if opts is not None and not (isinstance(opts, type) and dataclasses.is_dataclass(opts)):
        raise ConfigError(f"method '{name}' ({e.target}, from {e.origin}): options must be a dataclass, got {opts!r}")
    return cls


def options_of(cls: Any) -> type | None:
    """The options dataclass a method class declares (None: it has no section)."""
    return getattr(cls, "options", None)


def section_of(cls: Any) -> str | None:
    """The config section of a method's options (None: it has none): ``section``, else its name."""
    if options_of(cls) is None:
        return None
    return getattr(cls, "section", "") or cls.name
