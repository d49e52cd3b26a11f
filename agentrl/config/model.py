"""The model section of the experiment schema (model.*: the policy's folder or the embedded tiny
default and its warm start, dtype, LoRA adapters, forward-pass knobs). Part of `agentrl.config`,
which exports its classes; option names follow verl (lora_rank -> rank, lora_alpha -> alpha,
target_modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


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


@dataclass
class TinyModelConfig:
    """Shape of the embedded default model (a transformers Qwen2 causal LM)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Number of transformer blocks."""
    num_attention_heads: int = 4
    """Query heads per block."""
    num_key_value_heads: int = 2
    """Key/value heads per block (grouped-query attention)."""
    intermediate_size: int = 512
    """Width of the MLP."""
    vocab_size: int = 512
    """Size of the byte-level BPE vocabulary trained locally on the env's text."""
    max_position_embeddings: int = 2048
    """Longest sequence the model accepts (prompt plus every turn)."""


@dataclass
class WarmStartConfig:
    """Supervised warm start of the tiny model on the env's reply format."""

    max_steps: int = 400
    """Upper bound on SFT steps; training stops earlier once the loss reaches the floor."""
    batch_size: int = 16
    """Demonstration episodes per SFT step."""
    lr: float = 3e-3
    """AdamW learning rate of the warm start."""
    floor_tolerance: float = 0.02
    """Stop when the loss is within this (nats per reply token) of the uniform-action floor."""
    patience: int = 3
    """Consecutive steps at the floor needed to stop."""
    min_steps: int = 0
    """Train at least this many steps, floor or not."""
    demo_pool: int = 0
    """Distinct demonstration batches played (0: a fresh batch every step); later steps train on
    them again in turn. Where playing a demonstration is dear (a tool runs in a sandbox per call),
    a pool of a few hundred batches lets a long warm start cost a short one's play."""
    observation_loss: bool = True
    """Also learn to predict the env's own text (observations, template); this builds the
    attention that reads observations, which reply-only demonstrations teach the model to ignore."""


@dataclass
class ModelConfig:
    """The policy model: a local Hugging Face directory, or the embedded tiny default."""

    path: str | None = None
    """Local directory in Hugging Face layout; None builds and warm-starts the embedded tiny model."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights of trainer and engine. bfloat16: both compute in it, the optimizer steps float32 master
    copies (engine/trainer logprob gap: see README); float32 keeps the two equal to ~1e-6."""
    cache_dir: str | None = None
    """Where warm-started tiny models are cached by config hash (default ~/.cache/agentrl)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the embedded default model."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Warm start of the embedded default model."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (peft): with rank > 0 only they train, travel to the engine and are checkpointed."""
    use_remove_padding: bool = False
    """Trainer forward passes pack a micro-batch's sequences into one row, no padding (verl's name);
    pays with flash-attention on CUDA (variable-length kernels), not with sdpa's block-diagonal mask."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
