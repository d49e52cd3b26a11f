"""Policy weights on the wire and on disk: safetensors bytes and files, and HF model folders
for servers that reload from disk (vLLM, SGLang); plus the scoring pass behind top_logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save, save_file


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


def from_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of a safetensors file (ValueError naming the path if it cannot be read)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"no such file {p} on the server")
    try:
        return load_file(str(p))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{p} is not a safetensors file ({type(e).__name__}: {e})") from None


def save_file_atomic(state: dict[str, torch.Tensor], path: Path) -> Path:
    """Write `state` as a safetensors file (via a temporary name, so a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(_unshared(state), str(tmp))
    tmp.replace(path)
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
