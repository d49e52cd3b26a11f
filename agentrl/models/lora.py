"""LoRA adapters through peft: wrapping the policy, the adapter state that travels to an engine,
checking target names before a model is built, and merging for export.

What travels to the engine after an update is the adapter, never the base: a state dict of the
adapter tensors under peft's saved names (`base_model.model.<module>.lora_A.weight`, as in
`adapter_model.safetensors`) plus one marker entry, `ADAPTER_CONFIG`, holding the peft
`LoraConfig` as a plain dict (as in `adapter_config.json`). So an engine elsewhere (HTTP, Ray)
can write it out as a peft adapter folder, and `LocalEngine` injects the adapter layers into
its own copy of the base model the first time one arrives and only copies tensors after that.
peft is the optional extra `lora`; it is imported only when LoRA is used.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from agentrl.config.model import LoraConfig
from agentrl.errors import ConfigError

if TYPE_CHECKING:  # peft is the optional extra `lora`, imported where LoRA is used
    from peft import PeftModel

ADAPTER_CONFIG = "__peft_lora_config__"  # the marker key of an adapter state (its value is a dict)
ALL_LINEAR = "all-linear"


def require_peft() -> Any:
    """The peft module, or a one-line error saying which extra to install."""
    # peft 0.21 asks transformers 5 a deprecated question on every wrap: noise for our users
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora.rank > 0 needs peft: install the extra lora "
                          "(pip install 'agentrl[lora]')") from None
    return peft


def peft_config(lora: LoraConfig) -> Any:
    """peft's LoraConfig for `model.lora` (a causal LM, no bias training)."""
    peft = require_peft()
    targets: str | list[str] = ALL_LINEAR if lora.target_modules == [ALL_LINEAR] else list(lora.target_modules)
    return peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                           bias="none", task_type="CAUSAL_LM")


def apply_lora(model: torch.nn.Module, lora: LoraConfig, seed: int) -> torch.nn.Module:
    """Wrap `model` as a peft model whose adapters alone train (the base is frozen in place).

    The adapters' random initialisation draws from its own generator seeded by `seed`, so
    turning LoRA on moves no other random stream of the run. Adapters are kept in float32
    whatever the base dtype (peft's autocast_adapter_dtype): their updates are small.
    """
    peft = require_peft()
    check_targets(model, lora.target_modules)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, peft_config(lora), autocast_adapter_dtype=True)


def is_peft(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft-wrapped model (LoRA)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights of a model with LoRA layers injected, under the names of the model without
    them (what a server loads as its base); a model without adapters: its state dict."""
    # is_peft: peft's PeftModel (nn.Module's own typing reads an unknown attribute as a Tensor)
    inner = cast("PeftModel", model).get_base_model() if is_peft(model) else model
    return {k.replace(".base_layer.", "."): t.detach() for k, t in inner.state_dict().items() if "lora_" not in k}


def strip_adapters(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (changed in place) without the LoRA layers injected into it, each back to its base
    layer: an engine given whole weights after adapters serves the base model again."""
    if not hasattr(model, "peft_config"):
        return model
    for name, module in list(model.named_modules()):
        base = getattr(module, "base_layer", None)
        if name and isinstance(base, torch.nn.Module):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, base)
    del model.peft_config
    return model


def linear_names(model: torch.nn.Module) -> set[str]:
    """The last name part of every linear layer but the output head (what target_modules match)."""
    output_embeddings = getattr(model, "get_output_embeddings", None)  # transformers models have it
    head = output_embeddings() if output_embeddings is not None else None
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head}


def check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Every name in model.lora.target_modules must match a linear layer of `model`."""
    if targets == [ALL_LINEAR]:
        return
    names = linear_names(model)
    missing = [t for t in targets if t not in names]
    if missing:
        raise ConfigError(f"model.lora.target_modules: {', '.join(repr(m) for m in missing)} matches no linear "
                          f"layer of the model; its linear layers are {', '.join(sorted(names))} (or use [all-linear])")


def skeleton(config: Any) -> torch.nn.Module:
    """The model a transformers config describes, on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


# ---------------------------------------------------------------------------- adapter state
def adapter_state(model: torch.nn.Module) -> dict[str, Any]:
    """The adapter tensors of a peft model under peft's saved names, plus the ADAPTER_CONFIG marker."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}
    return {**tensors, ADAPTER_CONFIG: config_dict(cast("PeftModel", model).peft_config["default"])}


def config_dict(config: Any) -> dict[str, Any]:
    """A peft config as JSON-safe plain data (sets become sorted lists), as adapter_config.json."""
    return json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def is_adapter_state(state: dict[str, Any]) -> bool:
    """Whether a weights dict is an adapter state (see the module docstring)."""
    return ADAPTER_CONFIG in state


def load_adapter_state(model: torch.nn.Module, state: dict[str, Any]) -> torch.nn.Module:
    """Copy an adapter state into `model` (a plain transformers model or a peft one), injecting
    the adapter layers first if it has none; returns the model (changed in place)."""
    peft = require_peft()
    tensors = {k: v for k, v in state.items() if k != ADAPTER_CONFIG}
    targets = _adapter_params(model, tensors)
    if targets is not None:  # every push after the first: plain copies, no peft key remapping
        with torch.no_grad():
            for key, value in tensors.items():
                targets[key].copy_(value)
        return model
    if not hasattr(model, "peft_config"):
        config = {k: v for k, v in state[ADAPTER_CONFIG].items() if k in _LORA_FIELDS}
        # Injection draws random initial adapters that the copy below overwrites: keep the
        # caller's random streams where they were.
        with torch.random.fork_rng(devices=[]):
            model = peft.inject_adapter_in_model(peft.LoraConfig(**config), model)
        for name, p in model.named_parameters():  # float32 adapters, as the trainer's (apply_lora)
            if "lora_" in name and p.dtype != torch.float32:
                p.data = p.data.float()
    result = peft.set_peft_model_state_dict(model, tensors)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"adapter state does not fit the model: missing {missing[:3]}, "
                         f"unexpected {list(result.unexpected_keys)[:3]}")
    return model


def _adapter_params(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """{saved key: the model's parameter} when every key names an adapter weight `model` already
    has under peft's in-memory name (`<module>.lora_A.default.weight`), else None."""
    if not hasattr(model, "peft_config"):
        return None
    params = dict(model.named_parameters())
    found: dict[str, torch.Tensor] = {}
    for key in tensors:
        stem, dot, leaf = key.rpartition(".")
        name = f"{stem}.default{dot}{leaf}"
        for candidate in (name, name.removeprefix("base_model.model.")):
            if candidate in params and params[candidate].shape == tensors[key].shape:
                found[key] = params[candidate]
                break
        else:
            return None
    return found


def check_adapter(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """ValueError (one line, the first problem) unless adapter state `state` fits `model` whole:
    a peft LoRA config, exactly the adapter tensors that config gives this model (or, once the
    model holds adapters, the ones it holds), their shapes, every value finite. Nothing is
    changed here: an engine that takes adapters from elsewhere checks a push before copying any."""
    config = state.get(ADAPTER_CONFIG)
    if not isinstance(config, dict):
        raise ValueError("the adapter state has no peft config")
    tensors = {k: v for k, v in state.items() if k != ADAPTER_CONFIG}
    if not all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in tensors.values()):
        raise ValueError("every adapter tensor must be a floating-point tensor")
    expected = _adapter_shapes(model, config)
    given = {_saved_stem(k): tuple(v.shape) for k, v in tensors.items()}
    missing, extra = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing:
        raise ValueError(f"the adapter lacks {len(missing)} tensor(s) of its config on this model, e.g. {missing[0]!r}")
    if extra:
        raise ValueError(f"the adapter holds {len(extra)} tensor(s) this model has no place for, e.g. {extra[0]!r}")
    for name, shape in given.items():
        if shape != expected[name]:
            raise ValueError(f"{name} has shape {list(shape)}; this model's adapter takes {list(expected[name])}")
    for name, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} holds NaN or infinite values")


def _saved_stem(key: str) -> str:
    """An adapter tensor's name without peft's wrapper prefix and adapter name (as saved either way)."""
    return key.removeprefix("base_model.model.").replace(".default.", ".")


def _adapter_shapes(model: torch.nn.Module, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """{adapter tensor name (see _saved_stem): shape} that `config` gives `model`: the adapters it
    holds once it has some (a later push replaces them), else those injected into a copy of its
    skeleton on the meta device (no memory, no weights)."""
    if hasattr(model, "peft_config"):
        return {_saved_stem(n): tuple(p.shape) for n, p in model.named_parameters() if "lora_" in n}
    peft = require_peft()
    try:
        lora = peft.LoraConfig(**{k: v for k, v in config.items() if k in _LORA_FIELDS})
        with torch.random.fork_rng(devices=[]):
            probe = peft.inject_adapter_in_model(lora, skeleton(model.config))
    except (TypeError, ValueError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"the adapter's peft config does not fit this model: {first}") from None
    return {_saved_stem(n): tuple(p.shape) for n, p in probe.named_parameters() if "lora_" in n}


_LORA_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora", "fan_in_fan_out",
                "init_lora_weights", "layers_to_transform", "rank_pattern", "alpha_pattern", "task_type")


# ---------------------------------------------------------------------------- folders
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_folder(path: str | Path) -> bool:
    """Whether a checkpoint folder holds a peft adapter (not full weights)."""
    return (Path(path) / ADAPTER_WEIGHTS).is_file() and (Path(path) / "adapter_config.json").is_file()


def merged(base: torch.nn.Module, adapter_dir: str | Path) -> torch.nn.Module:
    """`base` with the adapter saved in `adapter_dir` merged into its weights (a plain model)."""
    peft = require_peft()
    model = peft.PeftModel.from_pretrained(base, str(adapter_dir))
    return model.merge_and_unload()
