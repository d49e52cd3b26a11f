"""How every process of a run computes (the local runtime's process, the Ray driver, each actor):
on which device, from which seeds, on how many torch threads, so that a config and seed give the
same metrics in both runtimes and on any machine.

Threads: `runtime.num_threads` in every process. CPU kernels split their sums between threads,
and another thread count adds them up in another order: other last bits, and a run that drifts
apart."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from agentrl.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA device is available; use device=auto or cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pin_threads(num_threads: int) -> None:
    """Run this process's torch on `num_threads` intra-op threads (threads started later follow)."""
    torch.set_num_threads(num_threads)


@contextmanager
def kept_threads(num_threads: int | None = None) -> Iterator[None]:
    """Inside: torch on `num_threads` threads (None: as it is); after: the caller's count again."""
    before = torch.get_num_threads()
    try:
        if num_threads is not None:
            pin_threads(num_threads)
        yield
    finally:
        torch.set_num_threads(before)
