"""The method registry: every method implements :class:`replaid.methods.base.Method`.

``METHODS`` maps each name to its class (the trainable ones and the evaluation-only ones of
converted peer checkpoints); :func:`get_method` builds the method a config names. Capabilities
(kind, trainable, samplers, bound) are class attributes; nothing outside this registry compares
method names.
"""

from __future__ import annotations

from typing import Any

from replaid.config import EVAL_ONLY_METHODS, METHOD_NAMES, ConfigError, RunConfig
from replaid.methods.ar import ARMethod
from replaid.methods.base import Kind, Method
from replaid.methods.duo import DuoMethod
from replaid.methods.langflow import LangFlowMethod
from replaid.methods.mdlm import MDLMMethod
from replaid.methods.plaid import PlaidMethod
from replaid.methods.replaid import RePlaidMethod

METHODS: dict[str, type[Method[Any]]] = {
    c.name: c for c in (RePlaidMethod, PlaidMethod, ARMethod, MDLMMethod, DuoMethod, LangFlowMethod)
}
assert tuple(n for n, c in METHODS.items() if c.trainable) == METHOD_NAMES, "keep config.METHOD_NAMES in step"
assert tuple(n for n, c in METHODS.items() if not c.trainable) == EVAL_ONLY_METHODS, "keep config.EVAL_ONLY_METHODS"

__all__ = ["METHODS", "Kind", "Method", "get_method", "method_class"]


def method_class(name: str) -> type[Method[Any]]:
    """The class registered under ``name`` (ConfigError naming the choices otherwise)."""
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def get_method(cfg: RunConfig) -> Method[Any]:
    return method_class(cfg.method)(cfg)
