"""The sampler names the CLI offers (``--sampler`` choices), in a module that imports nothing.

:data:`replaid.sampling.registry.REGISTRY` holds the samplers themselves (and torch); building the
parser reads only these names, so ``replaid --help`` needs no torch. The registry checks at import
that its names are these, in this order.
"""

from __future__ import annotations

SAMPLER_NAMES: tuple[str, ...] = ("ddpm", "ddim", "dpmpp2m", "heun", "consistency", "ancestral")
