"""Bounds on every number of a config, checked before anything is built from it.

`agentrl.config.validate` calls `check_limits` first. `RANGES` gives every numeric field its
accepted interval (one table: a new numeric field without an entry fails every config load, and
tests/test_config_fuzz.py tries each one far outside its range). A size is only ever used after
it has been bounded here, so `rollout.batch_size=18446744073709551616` fails in one line instead
of materialising a list of 2^61 group tags, and `critic.lr=-1` fails before a model is built
instead of in torch. The bounds are generous (far beyond what a run on one machine uses); each
message names the field, its value and the accepted range. The tiny model is also bounded as a
whole: every size within its bound can still multiply to terabytes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NamedTuple

from agentrl.errors import ConfigError, shown

SEED_MAX = 2**64 - 1  # torch.manual_seed takes 0 .. 2^64-1; numpy gets seed % 2^32
MIN_VOCAB = 300  # the tiny tokenizer holds 256 byte symbols, 4 special and 4 tag tokens
MAX_WORKERS = 4096  # per Ray role: far beyond any cluster this runs on, small enough to build lists of
SECONDS_MAX = 1e6  # about 11 days: beyond it a timeout is a typo (and threading waits overflow near 9e9)
# The embedded tiny model is for CPUs and quick runs: 1e9 parameters are already ~16 GB of float32
# weights, gradients and Adam state; a larger model comes from a folder (model.path).
TINY_PARAMS_MAX = 10**9


class Range(NamedTuple):
    """An accepted interval: [lo, hi], with an open end where said; `note` says what values mean."""

    lo: float
    hi: float
    note: str = ""
    lo_open: bool = False
    hi_open: bool = False
    unit: str = ""


UNIT = Range(0.0, 1.0)
STEPS = Range(0, 1_000_000)
SECONDS = Range(0.0, SECONDS_MAX, lo_open=True, unit=" seconds")

# Every numeric field, by dotted key ("[]" for the items of a list; named sections by their generic
# key: custom_envs.<name>.max_turns is env.max_turns, runtime.<role>.x is runtime.role.x).
RANGES: dict[str, Range] = {
    "seed": Range(0, SEED_MAX),
    # model
    "model.tiny.hidden_size": Range(1, 2**14),
    "model.tiny.num_hidden_layers": Range(1, 2**8),
    "model.tiny.num_attention_heads": Range(1, 2**10),
    "model.tiny.num_key_value_heads": Range(1, 2**10),
    "model.tiny.intermediate_size": Range(1, 2**16),
    "model.tiny.vocab_size": Range(MIN_VOCAB, 2**18, "256 byte symbols plus special tokens"),
    "model.tiny.max_position_embeddings": Range(1, 2**24),
    "model.warm_start.max_steps": STEPS,
    "model.warm_start.batch_size": Range(1, 2**16),
    "model.warm_start.lr": Range(0.0, 10.0),
    "model.warm_start.floor_tolerance": Range(0.0, 100.0, "nats per reply token"),
    "model.warm_start.patience": Range(1, 1_000_000),
    "model.warm_start.min_steps": STEPS,
    "model.warm_start.demo_pool": Range(0, 1_000_000, "0 plays a fresh batch every step"),
    "model.lora.rank": Range(0, 2**16, "0 turns LoRA off"),
    "model.lora.alpha": Range(0.0, 1e6, lo_open=True),
    "model.lora.dropout": Range(0.0, 1.0, hi_open=True),
    # envs
    "env.max_turns": Range(1, 2**14),  # per-turn metrics (success_at_k) are built for every turn
    "train_env_manager.n_groups[]": Range(1, 2**20, "leave a tag out instead of 0"),
    "val_env_manager.n_groups[]": Range(1, 2**20, "leave a tag out instead of 0"),
    # rollout
    "rollout.batch_size": Range(1, 2**20),
    "rollout.group_size": Range(1, 2**20),
    "rollout.temperature": Range(0.0, 100.0, "eval decodes greedily", lo_open=True),
    "rollout.top_p": Range(0.0, 1.0, lo_open=True),
    "rollout.top_k": Range(-1, 2**20, "-1 or 0 turns it off"),
    "rollout.max_new_tokens": Range(1, 2**24),
    "rollout.rollout_filter_ratio": Range(0.0, 1.0, lo_open=True),
    "rollout.max_episode_tokens": Range(0, 2**30, "0 = no limit"),
    "rollout.max_model_len": Range(0, 2**24, "0 = the model's context"),
    "rollout.max_staleness": Range(0, 2**10, "0 = on-policy"),
    "rollout.episode_timeout": SECONDS,
    "rollout.max_retries": Range(0, 2**10),
    "rollout.max_failed_fraction": UNIT,
    "rollout.curriculum.pool_size": Range(1, 100_000, "tasks per env tag"),
    "rollout.curriculum.ema": Range(0.0, 1.0, lo_open=True),
    "rollout.curriculum.hard_threshold": UNIT,
    "rollout.curriculum.easy_threshold": UNIT,
    "rollout.curriculum.uniform_ratio": UNIT,
    # engine and serve
    "engine.request_timeout": SECONDS,
    "engine.max_retries": Range(0, 100),
    "engine.max_num_seqs": Range(1, 2**20),
    "engine.max_num_batched_tokens": Range(1, 2**30),
    "engine.max_total_tokens": Range(2, 2**40, "tokens, or null for the default"),
    "engine.vllm.replicas": Range(1, 64),
    "engine.vllm.startup_timeout": SECONDS,
    "engine.vllm.probe_tolerance": Range(0.0, 100.0, "nats", lo_open=True),
    "serve.port": Range(0, 65535, "0 picks a free port"),
    "serve.max_tokens": Range(1, 2**24),
    "serve.max_n": Range(1, 1024),
    "serve.max_request_bytes": Range(1024, 2**31),
    "serve.max_weights_bytes": Range(1024, 2**50),
    "serve.max_inflight": Range(1, 2**20),
    "serve.idle_timeout": Range(0.0, 3600.0, lo_open=True, unit=" seconds"),
    # algorithm
    "algorithm.gamma": UNIT,
    "algorithm.lam": UNIT,
    "algorithm.step_adv_weight": Range(0.0, 1000.0),
    "algorithm.rae_alpha": Range(0.0, 0.9999),
    "algorithm.episode_adv_weight": Range(0.0, 1000.0),
    "algorithm.kl_ctrl.kl_coef": Range(0.0, 1000.0),
    "algorithm.kl_ctrl.horizon": Range(1, 2**40, "samples"),
    "algorithm.kl_ctrl.target_kl": Range(0.0, 1000.0, lo_open=True),
    "algorithm.filter_groups.max_num_gen_batches": Range(0, 2**10, "0 = no refill"),
    # actor
    "actor.lr": Range(0.0, 10.0),
    "actor.weight_decay": Range(0.0, 100.0),
    "actor.betas[]": Range(0.0, 1.0, hi_open=True),
    "actor.lr_warmup_steps_ratio": Range(0.0, 1.0, hi_open=True),
    "actor.min_lr_ratio": UNIT,
    "actor.ppo_epochs": Range(1, 2**14),
    "actor.ppo_mini_batch_size": Range(1, 2**20),
    "actor.micro_batch_size": Range(1, 2**20),
    "actor.max_tokens_per_micro_batch": Range(0, 2**30, "0 = size micro-batches by micro_batch_size"),
    "actor.logits_chunk_size": Range(0, 2**30, "0 = a pass's whole logits at once"),
    "actor.clip_ratio_low": UNIT,  # the ratio's floor 1 - clip_ratio_low stays >= 0
    "actor.clip_ratio_high": Range(0.0, 100.0),
    "actor.clip_ratio_c": Range(1.0, 1e6, "or null to turn dual-clip off", lo_open=True),
    "actor.loss_scale_factor": Range(0.0, 1e12, "or null", lo_open=True),
    "actor.policy_loss.tau_pos": Range(0.0, 1000.0, lo_open=True),
    "actor.policy_loss.tau_neg": Range(0.0, 1000.0, lo_open=True),
    "actor.grad_clip": Range(0.0, 1e6, "0 turns clipping off"),
    "actor.kl_loss_coef": Range(0.0, 1000.0),
    "actor.tis_imp_ratio_cap": Range(-1e6, 1e6, "<= 0 turns it off"),
    "actor.behav_imp_weight_cap": Range(1.0, 1e6, "or null for no cap", lo_open=True),
    "actor.entropy_coeff": Range(0.0, 100.0),
    # critic
    "critic.lr": Range(0.0, 10.0),
    "critic.weight_decay": Range(0.0, 100.0),
    "critic.ppo_epochs": Range(1, 2**14),
    "critic.ppo_mini_batch_size": Range(1, 2**20),
    "critic.micro_batch_size": Range(1, 2**20),
    "critic.max_tokens_per_micro_batch": Range(0, 2**30, "0 = size micro-batches by micro_batch_size"),
    "critic.cliprange_value": Range(0.0, 1e6),
    "critic.grad_clip": Range(0.0, 1e6, "0 turns clipping off"),
    # trainer
    "trainer.total_steps": Range(1, 1_000_000),  # step seeds stay below the extra-batch stride and the eval step
    "trainer.test_freq": Range(0, 1_000_000, "0 = only before and after training"),
    "trainer.eval_episodes": Range(1, 2**20),
    "trainer.save_freq": Range(0, 1_000_000, "0 = only at the end"),
    "trainer.max_checkpoints": Range(1, 2**20),
    "trainer.dump_trajectories_freq": Range(0, 1_000_000, "0 = off"),
    "trainer.dump_max_tokens": Range(1, 2**30),
    # health
    "health.warmup_steps": STEPS,
    "health.patience": Range(1, 1000, "steps"),
    "health.dead_groups": UNIT,
    "health.entropy_drop": UNIT,
    "health.solved_success": UNIT,
    "health.reply_repeat": UNIT,
    "health.input_dependence_drop": UNIT,
    "health.input_dependence_min_peak": UNIT,
    "health.mi_inputs": Range(0, 64, "0 turns it off"),
    "health.malformed_calls_rise": Range(0.0, 1.0, "a share of the calls", lo_open=True),
    "health.reward_without_tools_rise": Range(0.0, 1e9, "in the env's reward units", lo_open=True),
    "health.reward_without_tools_use": UNIT,
    # runtime
    "runtime.num_threads": Range(1, 1024, "torch threads per process"),  # beyond any machine's cores
    "runtime.num_cpus": Range(1, 2**20, "or null: this machine's count"),
    "runtime.num_gpus": Range(0, MAX_WORKERS, "or null: the ones Ray detects"),
    "runtime.role.world_size": Range(1, MAX_WORKERS),
    "runtime.role.device_mapping[]": Range(0, MAX_WORKERS - 1, "global GPU indices"),
    "runtime.role.num_cpus": Range(0.0, 4096.0),
    "runtime.env_managers": Range(1, MAX_WORKERS),
    "runtime.env_manager_num_cpus": Range(0.0, 4096.0),
    "runtime.placement_timeout": SECONDS,
    "runtime.max_restarts": Range(0, 1000),
    "runtime.restart_timeout": SECONDS,
    "runtime.collective_timeout": SECONDS,
}
_ROLE = re.compile(r"^runtime\.(actor_train|actor_infer|reference|critic)\.")
_NAMED = re.compile(r"^custom_envs\.[^\n]*\.max_turns$")


def check_limits(cfg: Any) -> None:
    """Raise a one-line ConfigError for a number outside its field's range, or a tiny model
    whose sizes together are beyond what the embedded default is for."""
    for key, value in numbers(cfg, ""):
        bound = RANGES.get(generic(key))
        if bound is None:
            raise AssertionError(f"config field {key} has no range in agentrl.config.limits.RANGES")
        problem = out_of_range(value, bound)
        if problem:
            raise ConfigError(f"{key}={shown(value)} {problem}")
    check_tiny_size(cfg.model)


def out_of_range(value: float, r: Range) -> str | None:
    """Why `value` is outside `r` (the rest of the error line after 'key=value'), or None."""
    low = value <= r.lo if r.lo_open else value < r.lo
    high = value >= r.hi if r.hi_open else value > r.hi
    if not (low or high):
        return None
    note, lo, hi = f" ({r.note})" if r.note else "", _num(r.lo) + r.unit, _num(r.hi) + r.unit
    if high:
        return f"must be below {hi}{note}" if r.hi_open else f"is too large; at most {hi} is accepted{note}"
    if r.lo_open:
        return f"must be > {lo} (at most {hi}){note}"
    if isinstance(value, int) and r.lo == 1:
        return f"must be a positive integer (at most {hi}){note}"
    return f"is out of range; it must be in [{_num(r.lo)}, {_num(r.hi)}{')' if r.hi_open else ']'}{r.unit}{note}"


def tiny_parameters(tiny: Any) -> int:
    """Parameters of the embedded Qwen2 model of shape `tiny` (tied embeddings, q/k/v biases)."""
    h, n, inter = tiny.hidden_size, tiny.num_hidden_layers, tiny.intermediate_size
    kv = tiny.num_key_value_heads * (h // max(1, tiny.num_attention_heads))
    attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q (bias), k and v (bias), o
    block = attention + 3 * h * inter + 2 * h  # gate, up, down; two RMS norms
    return tiny.vocab_size * h + n * block + h


def check_tiny_size(model: Any) -> None:
    """The embedded model's shape as a whole: heads that divide evenly, at most TINY_PARAMS_MAX
    parameters."""
    tiny = model.tiny
    if tiny.hidden_size % tiny.num_attention_heads:
        raise ConfigError(f"model.tiny.num_attention_heads={tiny.num_attention_heads} must divide "
                          f"model.tiny.hidden_size={tiny.hidden_size}")
    if (tiny.hidden_size // tiny.num_attention_heads) % 2:
        raise ConfigError(f"model.tiny.hidden_size={tiny.hidden_size} / num_attention_heads="
                          f"{tiny.num_attention_heads} gives an odd head size; rotary embeddings need an even one")
    if tiny.num_attention_heads % tiny.num_key_value_heads:
        raise ConfigError(f"model.tiny.num_key_value_heads={tiny.num_key_value_heads} must divide "
                          f"model.tiny.num_attention_heads={tiny.num_attention_heads}")
    if model.path is not None:
        return
    params = tiny_parameters(model.tiny)
    if params > TINY_PARAMS_MAX:
        t = model.tiny
        gb = params * 16 / 1e9  # float32 weights, gradients and two Adam moments
        raise ConfigError(
            f"model.tiny.hidden_size={t.hidden_size}, num_hidden_layers={t.num_hidden_layers}, intermediate_size="
            f"{t.intermediate_size}, vocab_size={t.vocab_size} make a model of {params:.3g} parameters (about "
            f"{gb:,.0f} GB to train); the embedded tiny model takes at most {TINY_PARAMS_MAX:.0e}: shrink them, "
            "or train a real model with model.path")


def generic(key: str) -> str:
    """The RANGES key of a dotted key: list items end in [], named sections by their generic name."""
    key = re.sub(r"\[\d+\]$", "[]", key)
    if _NAMED.match(key):
        return "env.max_turns"
    return _ROLE.sub("runtime.role.", key)


def numbers(obj: Any, key: str):
    """(dotted key, value) of every int and float in the config tree (lists and named sections
    included; free-form args are the env's or agent's to check)."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from numbers(getattr(obj, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, dict) and not key.endswith("args"):
        for name, value in obj.items():
            if dataclasses.is_dataclass(value):
                yield from numbers(value, f"{key}.{name}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            if _is_number(value):
                yield f"{key}[{i}]", value
    elif _is_number(obj):
        yield key, obj


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _num(x: float) -> str:
    """A bound as a user would type it: 1048576, 0.5, 1e+06."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) <= 1e6):
        return str(int(x))
    return f"{x:g}" if math.isfinite(x) else str(x)
