"""Sampling: one request type, one ``generate``, every method's samplers in one registry.

* :mod:`~replaid.sampling.request`: :class:`SampleRequest` (validated; the one default-length rule);
* :mod:`~replaid.sampling.generate`: :func:`generate` (``replaid sample``, ``replaid sweep``, the playground);
* :mod:`~replaid.sampling.registry`: ``(method kind, name) -> sampler`` and the CLI's choices;
* :mod:`~replaid.sampling.continuous` / :mod:`~replaid.sampling.discrete`: the samplers, plain functions;
* :mod:`~replaid.sampling.infill`: infilling requests in the user's terms; :mod:`~replaid.sampling.sweep`:
  sample-quality sweeps.
"""

from replaid.sampling.generate import generate
from replaid.sampling.registry import REGISTRY, SAMPLER_NAMES, get_sampler
from replaid.sampling.request import SampleRequest

__all__ = ["REGISTRY", "SAMPLER_NAMES", "SampleRequest", "generate", "get_sampler"]
