"""The model-training side of the experiment schema: LoRA adapters (model.lora) and the checks
of the knobs that shape the trainer's forward passes. Part of `agentrl.config`, which re-exports
`LoraConfig`; option names follow verl (lora_rank -> rank, lora_alpha -> alpha, target_modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentrl.errors import ConfigError

if TYPE_CHECKING:  # config.py calls check_model_section; the types only are needed here
    from agentrl.config import Config


@dataclass
class LoraConfig:
    """LoRA adapters trained with peft instead of the full weights (install the extra lora)."""

    rank: int = 0
    """Rank of every adapter; 0 trains every weight of the model (no LoRA)."""
    alpha: float = 16.0
    """Scale numerator: an adapter's update is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (0 keeps the update deterministic)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Names of the linear layers that get adapters (module-name suffixes, e.g. [q_proj, v_proj]);
    [all-linear] is every linear layer but the output head (peft's all-linear)."""

    @property
    def enabled(self) -> bool:
        """Whether adapters are trained instead of the full weights."""
        return self.rank > 0


def check_model_section(cfg: Config) -> None:
    """model.lora and the token budgets: one line naming the field, before anything is built."""
    lora = cfg.model.lora
    if lora.rank < 0:
        raise ConfigError(f"model.lora.rank={lora.rank} must be >= 0 (0 turns LoRA off)")
    if lora.enabled:
        if not lora.alpha > 0:
            raise ConfigError(f"model.lora.alpha={lora.alpha} must be > 0")
        if not 0.0 <= lora.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={lora.dropout} must be in [0, 1)")
        names = lora.target_modules
        if not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(f"model.lora.target_modules={names} must name at least one linear layer "
                              "(e.g. [q_proj, v_proj]) or be [all-linear]")
        if "all-linear" in names and len(names) > 1:
            raise ConfigError(f"model.lora.target_modules={names}: all-linear already names every linear "
                              "layer; give it alone or list the layers")
    for section in ("actor", "critic"):
        budget = getattr(cfg, section).max_tokens_per_micro_batch
        if budget < 0:
            raise ConfigError(f"{section}.max_tokens_per_micro_batch={budget} must be >= 0 (0 = size "
                              f"micro-batches by {section}.micro_batch_size)")
