"""Random streams on the device where the noise is used.

A step's randomness is seeded by a CPU ``torch.Generator`` (cheap to derive per step and rank);
large noise is drawn from a generator *on the tensors' device*, so a GPU neither copies noise
from the host nor waits for it. Scalars (one ``u`` per batch) may be drawn on the CPU generator as
Python floats, which never touches the device.
"""

from __future__ import annotations

import torch


def device_generator(generator: torch.Generator | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on ``device`` seeded from ``generator`` (itself when already there; ``None``
    for ``meta`` tensors, which hold no values, or when no generator is given)."""
    device = torch.device(device)
    if generator is None or device.type == "meta":
        return None
    if generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))  # a CPU tensor: no device sync
    return torch.Generator(device=device).manual_seed(seed)


def host_uniform(generator: torch.Generator | None) -> float:
    """One ``u ~ U[0, 1)`` as a Python float from a CPU generator (no device work)."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))
