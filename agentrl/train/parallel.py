"""Data-parallel training: this process is one rank of a torch.distributed group (gloo on CPU,
NCCL on GPU), and the policy is wrapped in DistributedDataParallel.

Why DDP and not FSDP2: every model this package trains fits one device (the tiny default on a
CPU, 0.5-7B models on one GPU), and DDP keeps a whole replica per rank, so a rank's update is the
single-process update on its rows plus one gradient all-reduce per DDP bucket (run as each
bucket fills, not overlapped with the rest of the backward: see _sum_hook). FSDP2 shards
parameters to fit models that do not fit one device, at the price of an all-gather of every
layer in each forward and backward; that pays only past one device.

Exact equivalence with one worker: each rank takes a contiguous share of every mini-batch and
divides its loss by the counts of the whole mini-batch (Actor.update_stats), and the gradients
are summed across ranks (a comm hook replaces DDP's average), so the summed gradient is the
gradient of the whole mini-batch, up to the order of float additions. Micro-batches before a
rank's last run under `no_sync`: one all-reduce per mini-batch.
"""

from __future__ import annotations

import datetime
from contextlib import AbstractContextManager
from typing import Any

import torch


def init_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout: float) -> None:
    """Join the default torch.distributed group of the trainer ranks (all ranks call it at once)."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def _sum_hook(state, bucket):  # noqa: ANN001 (DDP checks these annotations: none, or torch's own types)
    """All-reduce a gradient bucket as a sum (DDP's default hook averages)."""
    import torch.distributed as dist

    # Synchronous, returned as an already-completed future: a `.then` callback is released on
    # gloo's worker thread, which takes the GIL for it, and when the process group is torn down
    # the main thread joins that thread holding the GIL (measured: a test run hung for good in
    # ProcessGroupGloo's destructor). The cost is the overlap of this all-reduce with the rest
    # of the backward pass.
    buffer = bucket.buffer()
    dist.all_reduce(buffer)
    done = torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda else torch.futures.Future()
    done.set_result(buffer)
    return done


class DataParallel:
    """This process's rank: the DDP-wrapped model and its share of each mini-batch."""

    def __init__(self, model: torch.nn.Module, rank: int, world_size: int) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.rank, self.world_size = rank, world_size
        device = next(model.parameters()).device
        # DDP broadcasts rank 0's parameters here: every rank starts from the same weights.
        # Buffers (rotary tables) are computed identically on every rank: no syncing them per forward.
        self.module = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                              forward_sync_buffers=False)
        self.module.register_comm_hook(None, _sum_hook)

    def rows(self, mini: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a mini-batch's row indices."""
        return torch.tensor_split(mini, self.world_size)[self.rank]

    def no_sync(self) -> AbstractContextManager:
        """Accumulate gradients locally (no all-reduce) inside."""
        return self.module.no_sync()

    def idle_backward(self, batch: Any, temperature: float) -> None:
        """A rank without rows in this mini-batch: a zero-weighted backward, so that it joins the
        gradient all-reduce the other ranks wait in."""
        from agentrl.train.forward import token_logprobs

        logp = token_logprobs(self.module, batch.input_ids, batch.attention_mask, temperature)
        (logp.sum() * 0.0).backward()


def merge_stats(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """One worker's update metrics from every rank's: loss/policy (a mini-batch's loss, split
    between ranks) is summed across ranks, every other statistic averaged over all the values
    the ranks recorded."""
    keys = list(dict.fromkeys(k for stats in per_rank for k in stats))
    out = {}
    for key in keys:
        lists = [stats.get(key, []) for stats in per_rank]
        if key == "loss/policy":
            values = [sum(vals) for vals in zip(*lists)]
        else:
            values = [v for vals in lists for v in vals]
        out[key] = sum(values) / len(values)
    return out
