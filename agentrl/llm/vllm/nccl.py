"""The trainer's end of vLLM's NCCL weight transfer (engine.vllm.weight_transfer=nccl, GPUs only).

vLLM's servers start with `--weight-transfer-config '{"backend": "nccl"}'`; their workers join
one NCCL group with the trainer, which broadcasts every tensor from its GPU (rank 0) straight
into theirs: no file, no host copy. Written from vLLM 0.32's own code
(`vllm/distributed/weight_transfer/nccl_engine.py`, `nccl_common.py`), with torch alone on our
side (vLLM's trainer helpers would need vLLM in agentrl's environment, whose transformers pin
differs):

- The group forms by NCCL unique id, the rendezvous vLLM offers trainers without its own
  process-group code: `/init_weight_transfer_engine {"init_info": {"nccl_unique_id_b64",
  "rank_offset", "world_size", "packed": false}}` on every server, while this process joins as
  rank 0. The HTTP call returns only once the workers have joined, so the calls run in threads
  while we join; every rank then runs a one-element float32 all_reduce (vLLM's warm-up), ours too.
- A push: `/start_weight_update` on every server; `/update_weights {"update_info": {"names",
  "dtype_names", "shapes"}}` on every server, in threads, while we broadcast each tensor in that
  order (one by one: `packed: false`, so no wire format of vLLM's to mirror); then
  `/finish_weight_update {"weight_version": N}`.
- The group cannot grow: after a server restarts, the group is formed again with every server.

Not run in this project: its machines cannot install vLLM's CUDA wheel (the CPU build has no
NCCL). What the tests check on a CPU: the payloads parse with vLLM's own dataclasses.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from agentrl.errors import EngineError

UNIQUE_ID_BYTES = 128  # ncclUniqueId, what vLLM's init info must decode to


def init_payloads(unique_id: bytes, workers: Sequence[int]) -> list[dict[str, Any]]:
    """Each server's `/init_weight_transfer_engine` init_info: the trainer is rank 0, server i's
    `workers[i]` workers (tensor x pipeline parallel size) take the ranks after the servers before it."""
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise EngineError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
    uid = base64.b64encode(unique_id).decode("ascii")  # standard base64: vLLM refuses the URL-safe kind
    world = 1 + sum(workers)
    offsets = [1 + sum(workers[:i]) for i in range(len(workers))]
    return [{"nccl_unique_id_b64": uid, "rank_offset": off, "world_size": world, "packed": False} for off in offsets]


def update_info(state: dict[str, torch.Tensor]) -> dict[str, list]:
    """`/update_weights`'s update_info for `state`: names, dtypes and shapes in broadcast order."""
    return {"names": list(state), "dtype_names": [str(t.dtype).split(".")[-1] for t in state.values()],
            "shapes": [list(t.shape) for t in state.values()]}


class NcclSender:
    """Rank 0 of the NCCL group with every server's workers: forms it, broadcasts pushes."""

    def __init__(self, controls: Sequence[Any], workers: Sequence[int] | None = None) -> None:
        # The engine's own list of VllmControl: a restarted server's control replaces its entry there
        self.controls = controls
        self.workers = list(workers or [1] * len(controls))
        self.comm: Any = None

    @property
    def calls(self) -> list[Callable[..., Any]]:
        """Each server's `call(method, path, **kwargs)` on its RL routes, as they are now."""
        return [c.call for c in self.controls]

    def connect(self) -> None:
        """Form the group with every server (again, after a restart: the old one is dropped)."""
        if not torch.cuda.is_available():
            raise EngineError("engine.vllm.weight_transfer=nccl needs CUDA in the trainer's process; use file")
        self.close()
        uid = torch.cuda.nccl.unique_id()
        payloads = init_payloads(uid, self.workers)
        with ThreadPoolExecutor(len(self.calls)) as pool:
            joined = [pool.submit(call, "POST", "/init_weight_transfer_engine", json={"init_info": p})
                      for call, p in zip(self.calls, payloads)]
            _fail_early(joined)
            self.comm = torch.cuda.nccl.init_rank(payloads[0]["world_size"], uid, 0)
            warm = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
            torch.cuda.nccl.all_reduce([warm], comms=[self.comm])  # vLLM's warm-up, matched
            torch.cuda.current_stream().synchronize()
            for f in joined:
                f.result()

    def send(self, state: dict[str, torch.Tensor], version: str) -> None:
        """Broadcast `state` (CUDA tensors) into every server and label it `version`; generation is paused."""
        if self.comm is None:
            self.connect()
        device = torch.device("cuda", torch.cuda.current_device())
        for call in self.calls:
            call("POST", "/start_weight_update")
        info = update_info(state)
        pool = ThreadPoolExecutor(len(self.calls))
        try:
            received = [pool.submit(call, "POST", "/update_weights", json={"update_info": info}) for call in self.calls]
            _fail_early(received)
            for tensor in state.values():
                # NCCL sends numel elements from data_ptr(): a view must be made contiguous first
                send = tensor.detach().to(device).contiguous()
                torch.cuda.nccl.broadcast([send], root=0, comms=[self.comm])
            torch.cuda.current_stream().synchronize()
            for f in received:
                f.result()
        except BaseException:
            self.comm = None  # a broadcast that failed leaves the group unusable: form it again next time
            raise
        finally:
            pool.shutdown(wait=False)  # a worker stuck in a collective would hang a join forever
        for call in self.calls:
            call("POST", "/finish_weight_update", json={"weight_version": str(version)})

    def close(self) -> None:
        """Release the group on every server that still answers (a new one can then form)."""
        if self.comm is None:
            return
        self.comm = None
        for call in self.calls:
            try:
                call("POST", "/shutdown_weight_transfer_engine")
            except EngineError:
                pass  # a dead server holds nothing


def _fail_early(futures: list[Future]) -> None:
    """Raise now if a server already refused (before any collective): else we would wait in NCCL forever."""
    for f in futures:
        if f.done():
            f.result()
