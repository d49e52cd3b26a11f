"""Weight transports (runtime/ray/weight_sync.py): what an engine reads is what rank 0 sent, with
its version, in every dtype; the sender's resources are gone after release. The object-store
transport needs a cluster: it is tested in test_ray_runtime.py."""

import socket

import pytest
import torch
import torch.multiprocessing as mp
from helpers import leave_rank, watch_rank

from agentrl.runtime.ray.weight_sync import (BroadcastTransport, FileTransport, SharedMemoryTransport, layout_of,
                                         nbytes_of)


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(11, 4, generator=g)
    return {"embed.weight": embed, "lm_head.weight": embed,  # tied: one storage, two names
            "layer.bias": torch.randn(4, generator=g).to(torch.bfloat16),
            "layer.weight": torch.randn(3, 4, generator=g)[:, :2],  # not contiguous
            "scale": torch.tensor(2.5), "empty": torch.zeros(0, 3)}


def _same(got: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> bool:
    return set(got) == set(sent) and all(got[k].dtype == sent[k].dtype and torch.equal(got[k], sent[k]) for k in sent)


@pytest.mark.parametrize("kind", ["shm", "file"])
def test_a_round_trip_reads_what_was_sent(kind, tmp_path):
    transport = SharedMemoryTransport() if kind == "shm" else FileTransport(tmp_path)
    sent = _weights()
    payload = transport.send(sent, version=3)
    assert payload.version == 3 and payload.nbytes == nbytes_of(sent) and payload.layout == layout_of(sent)
    reader = type(transport)() if isinstance(transport, SharedMemoryTransport) else transport  # another process's view
    with reader.receive(payload) as got:
        assert _same(got, sent)
        model = {k: torch.zeros_like(v) for k, v in sent.items()}
        for k, v in got.items():
            model[k].copy_(v)  # what load_state_dict does
    assert _same(model, sent)
    transport.release(payload)
    if isinstance(transport, SharedMemoryTransport):
        with pytest.raises(FileNotFoundError):
            reader.receive(payload).__enter__()
    else:
        assert not list(tmp_path.glob("*.safetensors"))


def _member(rank: int, port: int, out: str) -> None:
    watch_rank()
    torch.set_num_threads(1)
    transport = BroadcastTransport(backend="gloo", bucket_bytes=64)  # tiny buckets: several per dtype
    transport.join("127.0.0.1", port, rank, 3, timeout=60)
    sent = _weights()
    payload = transport.send(sent, version=5)
    if rank == 0:
        transport.broadcast(sent)
    else:
        with transport.receive(payload) as got:
            torch.save({k: v.clone() for k, v in got.items()}, f"{out}/got{rank}.pt")
    leave_rank()


def test_a_broadcast_reaches_every_engine(tmp_path):
    """Rank 0 and two engines over gloo: the code path runtime.weight_sync=nccl runs on GPUs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_member, args=(port, str(tmp_path)), nprocs=3)
    for rank in (1, 2):
        assert _same(torch.load(tmp_path / f"got{rank}.pt"), _weights())
