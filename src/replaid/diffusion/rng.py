"""Random streams on the device where the noise is used.

A step's randomness is seeded by a CPU ``torch.Generator`` (cheap to derive per step and rank);
large noise is drawn from a generator *on the tensors' device*, so a GPU neither copies noise
from the host nor waits for it. Scalars (one ``u`` per batch) may be drawn on the CPU generator as
Python floats, which never touches the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import torch


@overload
def device_generator(generator: torch.Generator | None, device: torch.device | str) -> torch.Generator | None: ...
@overload
def device_generator(generator: RowGenerators, device: torch.device | str) -> RowGenerators: ...
@overload
def device_generator(generator: Gen | None, device: torch.device | str) -> Gen | None: ...
def device_generator(generator: Gen | None, device: torch.device | str) -> Gen | None:
    """A generator on ``device`` seeded from ``generator`` (itself when already there; ``None``
    for ``meta`` tensors, which hold no values, or when no generator is given; per-row streams
    each moved so)."""
    device = torch.device(device)
    if isinstance(generator, RowGenerators):
        return generator.to(device)
    if generator is None or device.type == "meta":
        return None
    if generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))  # a CPU tensor: no device sync
    return torch.Generator(device=device).manual_seed(seed)


def host_uniform(generator: torch.Generator | None) -> float:
    """One ``u ~ U[0, 1)`` as a Python float from a CPU generator (no device work)."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))


class RowGenerators:
    """Per-row random streams for a batch that joins independent requests (continuous batching): rows
    ``[lo, lo + n)`` of every draw come from their own generator, so a request draws exactly what it would
    draw alone, whatever else shares its batch. ``streams``: (rows, generator) per request, in row order.
    A stream marked ``skip`` draws nothing (its rows are zeros): a draw only some requests make alone
    (:meth:`only`)."""

    def __init__(self, streams: list[tuple[int, torch.Generator | None]], skip: list[bool] | None = None):
        self.streams = streams
        self.skip = skip if skip is not None else [False] * len(streams)

    @property
    def rows(self) -> int:
        return sum(n for n, _ in self.streams)

    def to(self, device: torch.device | str) -> RowGenerators:
        """Each stream on ``device`` (:func:`device_generator`)."""
        return RowGenerators([(n, device_generator(g, device)) for n, g in self.streams], self.skip)

    def only(self, rows: torch.Tensor) -> RowGenerators:
        """The streams with a row in ``rows`` (B,) bool; the others skip."""
        hit, lo = [], 0
        for n, _ in self.streams:
            hit.append(bool(rows[lo : lo + n].any()))
            lo += n
        return RowGenerators(self.streams, [s or not h for s, h in zip(self.skip, hit, strict=True)])

    def draw(
        self,
        shape: tuple[int, ...],
        one: Callable[[tuple[int, ...], torch.Generator | None], torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """``one(shape with n rows, generator)`` per stream (zeros for a stream that skips: it draws
        nothing), concatenated along rows (dim 0)."""
        if shape[0] != self.rows:
            raise ValueError(f"a draw of {shape[0]} rows from streams of {self.rows}")
        parts = [
            torch.zeros((n, *shape[1:]), device=device, dtype=dtype) if skip else one((n, *shape[1:]), g)
            for (n, g), skip in zip(self.streams, self.skip, strict=True)
        ]
        return torch.cat(parts)


Gen = torch.Generator | RowGenerators  # what a sampler draws from


def randn(shape: tuple[int, ...], generator: Gen | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.randn`` from ``generator`` (a :class:`RowGenerators`: each row from its own stream)."""
    if isinstance(generator, RowGenerators):
        return generator.draw(tuple(shape), lambda s, g: randn(s, g, device, dtype), device, dtype)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)


def rand(shape: tuple[int, ...], generator: Gen | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.rand`` from ``generator`` (as :func:`randn`)."""
    if isinstance(generator, RowGenerators):
        return generator.draw(tuple(shape), lambda s, g: rand(s, g, device, dtype), device, dtype)
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)


def exponential(
    shape: tuple[int, ...], generator: Gen | None, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """``Exp(1)`` draws from ``generator`` (as :func:`randn`)."""
    if isinstance(generator, RowGenerators):
        return generator.draw(tuple(shape), lambda s, g: exponential(s, g, device, dtype), device, dtype)
    return torch.empty(shape, dtype=dtype, device=device).exponential_(generator=generator)
