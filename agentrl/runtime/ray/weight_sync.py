"""Moving policy weights from trainer rank 0 to engine replicas, by one of four transports.

    object_store  the tensors as numpy arrays in Ray's object store (zero-copy reads on a node,
                  Ray moves them between nodes)
    shm           one POSIX shared-memory segment on the node, read in place by each engine
    broadcast     a torch.distributed group of rank 0 and the engines: NCCL between GPUs
                  (runtime.weight_sync=nccl), gloo on CPU (what the tests run)
    file          one safetensors file in a folder every engine can read (the run folder)

Rank 0 calls `send(weights, version)` and hands the returned `WeightPayload` to each engine,
which reads it with `receive(payload)` (a context: the weights are valid inside it); rank 0 then
calls `release(payload)`. The policy version travels in the payload, so an engine always knows
which policy it serves. The broadcast transport moves the data while the engines are inside
`receive`: rank 0 calls `transport.broadcast(weights)` after submitting the engines' calls.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.atomic import replacing

BUCKET_BYTES = 256 * 2**20  # broadcast buckets: bounded extra memory for large models
_NUMPY_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}  # dtypes numpy cannot hold


@dataclass
class WeightPayload:
    """What an engine needs to read one set of weights: the version, the tensors' layout and
    where the bytes are (an object ref, a segment name, a file, or a broadcast to join)."""

    version: int
    transport: str
    layout: list[tuple[str, str, tuple[int, ...]]]  # (name, dtype name, shape), in send order
    nbytes: int
    refs: list[Any] = field(default_factory=list)  # object_store: [ObjectRef] (nested: not resolved on a call)
    location: str = ""  # shm: segment name; file: path
    meta: dict[str, Any] = field(default_factory=dict)  # entries that are not tensors (a LoRA adapter's config)


def split_meta(weights: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the tensors, the other entries) of a weights dict: a LoRA adapter state carries its peft
    config under a marker key (models/lora.py), which travels in the payload, not a transport."""
    tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in weights.items() if k not in tensors}


def layout_of(weights: dict[str, torch.Tensor]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype name, shape) of each tensor, in a fixed order (sorted names)."""
    return [(k, str(weights[k].dtype).removeprefix("torch."), tuple(weights[k].shape)) for k in sorted(weights)]


def nbytes_of(weights: dict[str, torch.Tensor]) -> int:
    """Bytes of every tensor."""
    return sum(t.numel() * t.element_size() for t in weights.values())


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class ObjectStoreTransport:
    """The tensors as numpy arrays in Ray's object store."""

    name = "object_store"

    def send(self, weights: dict[str, torch.Tensor], version: int) -> WeightPayload:
        """Put the weights in the object store."""
        import ray

        arrays = {}
        for k, t in weights.items():
            t = t.detach().cpu().contiguous()
            arrays[k] = t.view(_NUMPY_VIEW.get(t.dtype, t.dtype)).numpy()
        return WeightPayload(version, self.name, layout_of(weights), nbytes_of(weights), refs=[ray.put(arrays)])

    @contextlib.contextmanager
    def receive(self, payload: WeightPayload) -> Iterator[dict[str, torch.Tensor]]:
        """The weights, read in place from the object store (no copy on the node)."""
        import ray

        arrays = ray.get(payload.refs[0])
        with warnings.catch_warnings():  # the arrays are read-only; loading copies them out
            warnings.simplefilter("ignore", UserWarning)
            yield {name: torch.from_numpy(arrays[name]).view(_dtype(dtype)) for name, dtype, _ in payload.layout}

    def release(self, payload: WeightPayload) -> None:
        """Drop the reference (Ray frees the object once no engine holds it)."""
        payload.refs.clear()


class SharedMemoryTransport:
    """One POSIX shared-memory segment on the node; engines read it in place."""

    name = "shm"

    def __init__(self) -> None:
        self._segments: dict[str, Any] = {}

    def send(self, weights: dict[str, torch.Tensor], version: int) -> WeightPayload:
        """Copy the weights into a new segment."""
        from multiprocessing import shared_memory

        layout, total = layout_of(weights), nbytes_of(weights)
        shm = shared_memory.SharedMemory(create=True, size=max(1, total), name=f"agentrl_w_{uuid.uuid4().hex[:16]}")
        buf = shm.buf
        assert buf is not None  # None only once the segment is closed; this one was just created
        offset = 0
        for name, _, _ in layout:
            flat = weights[name].detach().cpu().contiguous().view(-1).view(torch.uint8)
            np.frombuffer(buf, np.uint8, flat.numel(), offset)[:] = flat.numpy()
            offset += flat.numel()
        self._segments[shm.name] = shm
        return WeightPayload(version, self.name, layout, total, location=shm.name)

    @contextlib.contextmanager
    def receive(self, payload: WeightPayload) -> Iterator[dict[str, torch.Tensor]]:
        """Views into the segment (valid inside the context)."""
        from multiprocessing import resource_tracker, shared_memory

        shm = shared_memory.SharedMemory(name=payload.location)
        # Python < 3.13 registers an attached segment as if this process owned it, and would
        # unlink it at exit: only the sender owns it.
        with contextlib.suppress(Exception):
            # the private name (with its leading slash) is what the tracker registered; typeshed omits it
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # noqa: SLF001
        weights, offset = {}, 0
        for name, dtype, shape in payload.layout:
            dt = _dtype(dtype)
            n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
            weights[name] = torch.frombuffer(shm.buf, dtype=torch.uint8, count=n, offset=offset).view(dt).view(shape) \
                if n else torch.empty(shape, dtype=dt)
            offset += n
        try:
            yield weights
        finally:
            weights.clear()
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with the process
                shm.close()

    def release(self, payload: WeightPayload) -> None:
        """Unlink the segment (engines have copied it)."""
        shm = self._segments.pop(payload.location, None)
        if shm is not None:
            shm.close()
            shm.unlink()


class FileTransport:
    """One safetensors file per version in `folder` (shared by every node that reads it)."""

    name = "file"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def send(self, weights: dict[str, torch.Tensor], version: int) -> WeightPayload:
        """Write the weights to a file (atomically: a reader never sees half of one)."""
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"weights-v{version}-{uuid.uuid4().hex[:8]}.safetensors"
        seen: set[int] = set()
        tensors = {}
        for k in sorted(weights):  # tied weights share storage; safetensors wants each stored once
            t = weights[k].detach().cpu().contiguous()
            ptr = t.untyped_storage().data_ptr()
            tensors[k] = t.clone() if ptr in seen else t
            seen.add(ptr)
        with replacing(path) as tmp:
            save_file(tensors, str(tmp), metadata={"policy_version": str(version)})
        return WeightPayload(version, self.name, layout_of(weights), nbytes_of(weights), location=str(path))

    @contextlib.contextmanager
    def receive(self, payload: WeightPayload) -> Iterator[dict[str, torch.Tensor]]:
        """The file's tensors."""
        from safetensors.torch import load_file

        yield load_file(payload.location)

    def release(self, payload: WeightPayload) -> None:
        """Delete the file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(payload.location)


class BroadcastTransport:
    """A torch.distributed group of rank 0 (rank 0 of the group) and the engines (1..n):
    NCCL between GPUs, gloo on CPU. The group is its own (a TCPStore of its own), apart from
    the trainer ranks' default group."""

    name = "broadcast"

    def __init__(self, backend: str = "nccl", bucket_bytes: int = BUCKET_BYTES) -> None:
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.group: Any = None
        self.device = torch.device("cpu")

    def join(self, host: str, port: int, rank: int, world_size: int, timeout: float,
             device: torch.device | None = None) -> None:
        """Join the group (every member calls this at once; rank 0 hosts the store)."""
        import torch.distributed as dist

        delta = datetime.timedelta(seconds=timeout)
        store = dist.PrefixStore("agentrl-weights", dist.TCPStore(host, port, world_size, rank == 0, timeout=delta))
        if self.backend == "gloo":
            self.group = dist.ProcessGroupGloo(store, rank, world_size, delta)
        else:  # written for GPUs; not run on the CPU machines this was built on
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = delta  # noqa: SLF001 (the public constructor takes no timeout)
            self.group = dist.ProcessGroupNCCL(store, rank, world_size, options)
        self.device = device or (torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
                                 else torch.device("cpu"))

    def send(self, weights: dict[str, torch.Tensor], version: int) -> WeightPayload:
        """The layout only: the bytes move in `broadcast`, while the engines are in `receive`."""
        return WeightPayload(version, self.name, layout_of(weights), nbytes_of(weights))

    def broadcast(self, weights: dict[str, torch.Tensor]) -> None:
        """Rank 0's side: send every bucket."""
        for bucket in self._buckets(layout_of(weights)):
            flat = torch.cat([weights[name].detach().to(self.device).reshape(-1) for name, _, _ in bucket])
            self._bcast(flat)

    @contextlib.contextmanager
    def receive(self, payload: WeightPayload) -> Iterator[dict[str, torch.Tensor]]:
        """An engine's side: receive every bucket and split it into the named tensors."""
        out = {}
        for bucket in self._buckets(payload.layout):
            sizes = [int(np.prod(shape, dtype=np.int64)) for _, _, shape in bucket]
            flat = torch.empty(sum(sizes), dtype=_dtype(bucket[0][1]), device=self.device)
            self._bcast(flat)
            for (name, _, shape), part in zip(bucket, torch.split(flat, sizes)):
                out[name] = part.view(shape)
        yield out

    def release(self, payload: WeightPayload) -> None:
        """Nothing is kept between broadcasts."""

    def _bcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def _buckets(self, layout: list[tuple[str, str, tuple[int, ...]]]) -> list[list[tuple[str, str, tuple[int, ...]]]]:
        """Consecutive tensors of one dtype, up to bucket_bytes each (the same split on both sides)."""
        buckets: list[list[tuple[str, str, tuple[int, ...]]]] = []
        size = 0
        for entry in layout:
            n = int(np.prod(entry[2], dtype=np.int64)) * torch.empty((), dtype=_dtype(entry[1])).element_size()
            if not buckets or buckets[-1][0][1] != entry[1] or size + n > self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(entry)
            size += n
        return buckets


Transport = ObjectStoreTransport | SharedMemoryTransport | FileTransport | BroadcastTransport


def make_transport(name: str, folder: str | Path = ".") -> Transport:
    """The transport a runtime.weight_sync value names (nccl: the broadcast over NCCL)."""
    if name == "object_store":
        return ObjectStoreTransport()
    if name == "shm":
        return SharedMemoryTransport()
    if name == "file":
        return FileTransport(folder)
    if name in ("nccl", "gloo"):
        return BroadcastTransport(backend=name)
    raise ValueError(f"unknown weight transport '{name}'")
