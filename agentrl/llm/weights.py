"""Policy weights on the wire and on disk: safetensors bytes and files, and HF model folders
for servers that reload from disk (vLLM, SGLang); the checks a server runs on weights it is sent
(from a trusted folder only, fitting its model whole); plus the scoring pass behind top_logprobs."""

from __future__ import annotations

import math
import os
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


def to_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """A state dict as one safetensors buffer."""
    return save(_unshared(state))


def from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The state dict in a safetensors buffer (ValueError if it is not one)."""
    try:
        return load_bytes(bytes(data))
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error types)
        raise ValueError(f"the body is not a safetensors buffer ({type(e).__name__}: {e})") from None


Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]  # tensor name -> (shape, dtype)


def served_layout(model: torch.nn.Module) -> Layout:
    """Name -> (shape, dtype) of every tensor of the served model's state dict."""
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


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
    `folder`. A path outside it, a link leading out, or a missing file get one message, so that
    no answer tells what exists outside; a path outside is never even looked at."""
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
    try:
        return load_file(str(real))
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error types)
        raise ValueError(f"{path!r} is not a safetensors file ({type(e).__name__}: {e})") from None


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
