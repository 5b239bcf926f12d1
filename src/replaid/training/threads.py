"""CPU threads for a training process: the cores that are free now, unless the user chose.

On a machine other processes also use, torch's default (every core) makes each step wait for threads
that cannot run: the demo went 2.1-3.7 s/step at 2 threads beside two CPU-bound jobs, against about
1 step/s at 1 thread. ``train.num_threads=0`` (the default) therefore takes the cores that are free
now, ``round(cores - load)`` from the CPU affinity and the 1-minute load average, at least 1 and at
most torch's own default; ``train.num_threads=N`` or ``OMP_NUM_THREADS`` pins the count."""

from __future__ import annotations

import os
import sys

import torch

_chosen: int | None = None  # the choice of this process: made once, so that every run in it agrees
_message: str | None = None  # its line, said by announce_threads once training starts


def free_threads(ceiling: int, cores: int, load: float) -> int:
    """The threads to use with ``cores`` usable CPUs under 1-minute ``load``: at least 1, at most ``ceiling``."""
    return max(1, min(ceiling, cores, round(cores - load)))


def machine() -> tuple[int, float | None]:
    """This process's usable CPUs and the 1-minute load average (None where the system has none)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return cores, load


def set_threads(num_threads: int, announce: bool = True) -> int:
    """Apply ``train.num_threads``: N > 0 as given; 0 the free cores (once per process, one line on stderr).

    ``OMP_NUM_THREADS`` in the environment counts as the user's choice (torch's default already follows it)."""
    global _chosen, _message
    if num_threads:
        torch.set_num_threads(num_threads)
        return num_threads
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    if _chosen is None:
        ceiling = torch.get_num_threads()
        cores, load = machine()
        _chosen = free_threads(ceiling, cores, load) if load is not None else ceiling
        torch.set_num_threads(_chosen)
        if announce:
            seen = "load unknown" if load is None else f"load {load:.1f}"
            _message = f"replaid: using {_chosen} of {ceiling} CPU threads ({seen}; train.num_threads=N to choose)"
    return torch.get_num_threads()


def announce_threads() -> None:
    """Say :func:`set_threads`' choice on stderr, once: called when training starts, after the input was
    checked, so that a refused input stays one ``replaid: error:`` line."""
    global _message
    if _message is not None:
        print(_message, file=sys.stderr)
        _message = None
