"""Policy weights on the wire and on disk: safetensors bytes and files, and HF model folders
for servers that reload from disk (vLLM, SGLang); the checks a server runs on weights it is sent
(from a trusted folder only, fitting its model whole); plus the scoring pass behind top_logprobs.

A LoRA adapter state (models/lora.py: adapter tensors plus the `ADAPTER_CONFIG` entry, a dict)
travels as one safetensors buffer too: the tensors, and the peft config as JSON in the file's
metadata under ADAPTER_METADATA, as peft's own adapter folder keeps it beside the tensors."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save, save_file

from agentrl.atomic import replacing


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors, none sharing storage (safetensors refuses tied weights as one buffer)."""
    out, seen = {}, set()
    for name, t in state.items():
        t = t.detach().to("cpu").contiguous()
        ptr = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def to_bytes(state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """A state dict as one safetensors buffer (with string `metadata` in its header)."""
    return save(_unshared(state), metadata=metadata)


ADAPTER_METADATA = "agentrl.peft_lora_config"  # the header key of an adapter buffer's peft config (JSON)


def adapter_to_bytes(state: dict[str, Any], marker: str) -> bytes:
    """An adapter state (its tensors, and its config under `marker`) as one safetensors buffer."""
    tensors = {k: v for k, v in state.items() if k != marker}
    return to_bytes(tensors, {ADAPTER_METADATA: json.dumps(state[marker])})


def adapter_from_bytes(data: bytes, marker: str) -> dict[str, Any]:
    """The adapter state in a safetensors buffer written by `adapter_to_bytes` (its config back
    under `marker`); ValueError (one line) if it is not one."""
    tensors = from_bytes(data)
    meta = header_metadata(data).get(ADAPTER_METADATA)
    if meta is None:
        raise ValueError(f"the body is not an adapter: its safetensors header has no {ADAPTER_METADATA!r} metadata "
                         "(the peft LoraConfig as JSON)")
    try:
        config = json.loads(meta)
    except ValueError:
        raise ValueError(f"the adapter's {ADAPTER_METADATA!r} metadata is not JSON") from None
    if not isinstance(config, dict):
        raise ValueError(f"the adapter's {ADAPTER_METADATA!r} metadata is {type(config).__name__}; expected an object")
    return {**tensors, marker: config}


def header_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors buffer's header ({} when it has none)."""
    if len(data) < 8:
        raise ValueError("the body is not a safetensors buffer (shorter than its header length)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("the body is not a safetensors buffer (its header runs past its end)")
    try:
        header = json.loads(data[8:8 + size])
    except ValueError:
        raise ValueError("the body is not a safetensors buffer (its header is not JSON)") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The state dict in a safetensors buffer (ValueError if it is not one)."""
    try:
        return load_bytes(bytes(data))
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error types)
        raise ValueError(f"the body is not a safetensors buffer ({type(e).__name__}: {e})") from None


Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]  # tensor name -> (shape, dtype)


def served_layout(model: torch.nn.Module) -> Layout:
    """Name -> (shape, dtype) of every tensor of the served model's state dict: of its base model
    when LoRA layers are injected (whole weights replace the base; the adapters then go)."""
    return {k.replace(".base_layer.", "."): (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()
            if "lora_" not in k}


def body_limit(layout: Layout) -> int:
    """The most bytes a safetensors file of `layout` can take: each tensor in its dtype or float32,
    plus a header (a generous 1 KiB per tensor and 64 KiB)."""
    def itemsize(dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return max(size, 4) if dtype.is_floating_point else size
    return sum(math.prod(shape) * itemsize(dtype) for shape, dtype in layout.values()) + 1024 * len(layout) + 65536


def check_fits(layout: Layout, tensors: dict[str, torch.Tensor]) -> None:
    """ValueError (one line, the first problem) unless `tensors` is a whole state dict of `layout`:
    the same names, the same shapes, each dtype the served one (or float32 for a floating tensor,
    converted on copy), every value finite. Nothing is copied here: a push is checked whole first."""
    missing, extra = sorted(set(layout) - set(tensors)), sorted(set(tensors) - set(layout))
    if missing:
        raise ValueError(f"the weights lack {len(missing)} tensor(s) of the served model, e.g. {missing[0]!r}")
    if extra:
        raise ValueError(f"the weights hold {len(extra)} tensor(s) the served model does not have, e.g. {extra[0]!r}")
    for name, (shape, dtype) in layout.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {list(t.shape)}; the served model's is {list(shape)}")
        if t.dtype != dtype and not (dtype.is_floating_point and t.dtype == torch.float32):
            raise ValueError(f"{name} is {str(t.dtype).removeprefix('torch.')}; the served model's is "
                             f"{str(dtype).removeprefix('torch.')}")
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} holds NaN or infinite values")


def from_weights_dir(path: str, folder: str | Path, limit: int) -> dict[str, torch.Tensor]:
    """The state dict of the safetensors file `path` (absolute, or relative to `folder`) inside
    `folder` (see `weights_file`)."""
    real = weights_file(path, folder, limit)
    try:
        return load_file(str(real))
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error types)
        raise ValueError(f"{path!r} is not a safetensors file ({type(e).__name__}: {e})") from None


def weights_file(path: str, folder: str | Path, limit: int) -> Path:
    """The file `path` (absolute, or relative to `folder`) names inside `folder`, at most `limit`
    bytes. A path outside it, a link leading out, or a missing file get one message, so that no
    answer tells what exists outside; a path outside is never even looked at."""
    root = Path(folder).resolve()
    given = Path(path)
    lexical = Path(os.path.normpath(given if given.is_absolute() else root / given))
    refused = ValueError(f"{path!r} is not a weights file in this server's serve.weights_dir")
    if "\x00" in path or not lexical.is_relative_to(root):
        raise refused
    try:
        real = lexical.resolve(strict=True)
    except (OSError, RuntimeError):
        raise refused from None
    if not real.is_relative_to(root) or not real.is_file():
        raise refused
    size = real.stat().st_size
    if size > limit:
        raise ValueError(f"{path!r} holds {size} bytes, more than weights of the served model can ({limit})")
    return real


def save_file_atomic(state: dict[str, torch.Tensor], path: Path) -> Path:
    """Write `state` as a safetensors file (via a temporary name, so a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        save_file(_unshared(state), str(tmp))
    return path


def save_model_folder(state: dict[str, torch.Tensor], folder: Path, model_config: Any) -> Path:
    """An HF model folder (config.json + model.safetensors) that vLLM / SGLang reload from."""
    folder.mkdir(parents=True, exist_ok=True)
    if model_config is not None:
        model_config.save_pretrained(folder)
    save_file_atomic(state, folder / "model.safetensors")
    return folder


@torch.inference_mode()
def top_logprobs(model: torch.nn.Module, prompt: list[int], generated: list[int], k: int,
                 temperature: float) -> list[list[tuple[int, float]]]:
    """The k most likely ids (and logprobs, temperature-scaled as the engine's) at each position
    of `generated`, from one forward pass over prompt + generated."""
    if not generated or k <= 0:
        return [[] for _ in generated]
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + generated[:-1]], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:].float() / max(temperature, 1e-6)
    values, index = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    return [list(zip(i.tolist(), v.tolist())) for i, v in zip(index, values)]
