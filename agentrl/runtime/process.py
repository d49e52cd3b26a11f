"""torch's CPU threads in the processes of a run: `runtime.num_threads` in every one of them (the
local runtime's process, the Ray driver, each actor), so a config and seed give the same metrics
in both runtimes and on any machine. CPU kernels split their sums between threads, and another
thread count adds them up in another order: other last bits, and a run that drifts apart."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


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
