"""The methods: every one implements :class:`replaid.methods.base.Method`.

:data:`METHODS` maps each registered name (this repository's methods, then the plug-ins of the
entry-point group ``replaid.methods``: :mod:`replaid.registry`) to its class, imported on first use;
:func:`get_method` builds the method a config names. Capabilities (kind, trainable, samplers, bound,
options) are class attributes; nothing outside the methods compares method names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from replaid import registry
from replaid.config import ConfigError, RunConfig
from replaid.methods.base import Kind, Method

__all__ = ["METHODS", "Kind", "Method", "get_method", "method_class"]


def method_class(name: str) -> type[Method[Any]]:
    """The class registered under ``name`` (one ConfigError line: unknown, clashing or broken)."""
    cls: type = registry.load(name)  # a class (the registry checks), perhaps not a Method
    if not issubclass(cls, Method):
        e = registry.entries()[name]
        raise ConfigError(
            f"method '{name}' ({e.target}, from {e.origin}) is not a replaid method: point the entry point "
            f"at a subclass of replaid.methods.Method"
        )
    return cls


class _Registered(Mapping[str, type[Method[Any]]]):
    """Every registered method by name, each imported when it is looked up."""

    def __getitem__(self, name: str) -> type[Method[Any]]:
        if name not in registry.entries():
            raise KeyError(name)
        return method_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(registry.method_names())

    def __len__(self) -> int:
        return len(registry.method_names())


METHODS: Mapping[str, type[Method[Any]]] = _Registered()


def get_method(cfg: RunConfig) -> Method[Any]:
    return method_class(cfg.method)(cfg)
