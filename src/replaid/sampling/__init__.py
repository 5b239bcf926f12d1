"""Sampling: one request type, one ``generate``, every method's samplers in one registry.

* :mod:`~replaid.sampling.request`: :class:`SampleRequest` (validated; the one default-length rule);
* :mod:`~replaid.sampling.generate`: :func:`generate` (``replaid sample``, ``replaid sweep``, the playground);
* :mod:`~replaid.sampling.contract`: the one sampler signature ``fn(net, state, grid, *, generator,
  callback, **options) -> SampleResult`` and the callback's ``StepInfo``;
* :mod:`~replaid.sampling.registry`: ``(method kind, name) -> sampler`` (function, NFE) and the CLI's choices;
* :mod:`~replaid.sampling.starts`: how each kind starts its samplers (initial state, grid, generator, options);
* :mod:`~replaid.sampling.continuous` / :mod:`~replaid.sampling.discrete`: the samplers, plain functions;
* :mod:`~replaid.sampling.infill`: infilling requests in the user's terms; :mod:`~replaid.sampling.sweep`:
  sample-quality sweeps.

The package itself imports no torch (the CLI's ``--sampler`` choices come from the torch-free
:mod:`~replaid.sampling.names`): ``REGISTRY``, ``get_sampler`` and ``SampleRequest`` are loaded from
their modules on first use. ``generate`` is imported from :mod:`replaid.sampling.generate` (a lazy
package attribute of that name would be shadowed by the submodule once it is imported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from replaid.sampling.names import SAMPLER_NAMES

if TYPE_CHECKING:
    from replaid.sampling.registry import REGISTRY, get_sampler
    from replaid.sampling.request import SampleRequest

_LAZY = {
    "REGISTRY": "replaid.sampling.registry",
    "get_sampler": "replaid.sampling.registry",
    "SampleRequest": "replaid.sampling.request",
}

__all__ = ["REGISTRY", "SAMPLER_NAMES", "SampleRequest", "get_sampler"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
