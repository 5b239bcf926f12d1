"""Make ``--model replaid`` known to the harness's own CLI (``lm_eval``), which discovers no plugins.

``replaid_lmeval.pth`` (one line importing this module when replaid is importable) sits in the
environment's site-packages: an installed wheel carries it (see setup.py); for an editable install or
another environment ``python -m replaid._lmeval_pth`` writes it (``scripts/setup.sh`` does). At
start-up this module only adds an import hook (no ``lm_eval``, no torch import): when the harness
imports ``lm_eval.models`` (its model table, loaded on the first model look-up), ``replaid`` is
registered there as a lazy entry ``replaid.hub.lmeval:ReplaidLM``, imported only when chosen.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this module runs at every interpreter start-up
    import types
    from collections.abc import Sequence

TARGET = "lm_eval.models"
ENTRY = "replaid.hub.lmeval:ReplaidLM"


def _register() -> None:
    from lm_eval.api.registry import model_registry

    if "replaid" not in model_registry:
        model_registry.register("replaid", target=ENTRY)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``lm_eval.models`` so that ``replaid`` is registered after it runs."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        inner = spec.loader
        exec_module = inner.exec_module

        def run(module: types.ModuleType) -> None:
            exec_module(module)
            _register()

        inner.exec_module = run  # type: ignore[method-assign]  # wrap the loader: register once lm_eval is loaded
        return spec


def install() -> None:
    """Add the hook once (registers at once if ``lm_eval.models`` is already imported)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


if __name__ == "__main__":  # the former spelling of ``python -m replaid._lmeval_pth`` (which see)
    from replaid._lmeval_pth import main

    sys.exit(main())
else:
    install()
