"""The learning side of the experiment schema: advantage estimation (algorithm), the policy
update (actor) and the value model (critic). Part of `agentrl.config`, which re-exports every
class here; option names follow verl."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


# ---------------------------------------------------------------------------- algorithm
@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward (verl's algorithm.kl_ctrl)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """fixed keeps kl_coef; adaptive moves it towards target_kl (Ziegler et al. 2019)."""
    kl_coef: float = 0.001
    """Initial (or fixed) coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon, in samples."""
    target_kl: float = 0.1
    """Adaptive controller target KL per sequence."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups)."""

    enable: bool = False
    """Drop groups whose episodes all got the same metric value (they carry no group signal)."""
    metric: Literal["reward", "success"] = "reward"
    """What must vary within a group: total reward, or success."""
    max_num_gen_batches: int = 0
    """Collect up to this many batches per step to refill dropped groups; 0 = no refill."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation."""

    adv_estimator: str = "grpo"
    """Registered advantage estimator: grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, gae (needs critic.enable=true), gigpo, and verl's episode-level
    opo, grpo_passk (group_size >= 2), gpg, remax (leave-one-out baseline, no greedy rollout), and
    rae (SPIRAL's role-conditioned baseline for games: a running average per game and role)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's reward std; false gives Dr. GRPO."""
    credit: Literal["outcome", "token", "turn"] = "turn"
    """turn: each turn is credited with its discounted return from that turn on (gamma, lam per
    turn); token: verl's semantics, rewards where the env gave them, gamma and lam per generated
    token; outcome: each episode's summed reward on its last generated token, then as token."""
    gamma: float = 1.0
    """Discount: per agent turn (credit=turn) or per generated token (token/outcome)."""
    lam: float = 1.0
    """GAE lambda (verl's algorithm.lam)."""
    step_adv_weight: float = 1.0
    """GiGPO: weight of the step-level (same-state) advantage added to the episode-level one."""
    episode_adv_weight: float = 1.0
    """GiGPO: weight of the episode-level advantage; 0 leaves only same-state comparisons."""
    rae_alpha: float = 0.95
    """RAE: decay of each (game, role) running baseline, b <- alpha * b + (1 - alpha) * return (SPIRAL's 0.95)."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef * KL(policy || reference) from each generated token's reward."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl"] = "kl"
    """KL estimator for the reward penalty."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Coefficient of the reward penalty."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""


@dataclass
class PolicyLossConfig:
    """The policy loss (verl's actor_rollout_ref.actor.policy_loss)."""

    loss_mode: str = "vanilla"
    """Registered policy loss: vanilla (PPO clip, dual-clip), gspo (sequence-level ratio), cispo
    (clipped IS weight, no token dropped), sapo (soft sigmoid gate), gmpo or geo_mean
    (geometric-mean ratio), gpg (plain policy gradient); see agentrl/algos/policy_losses.py."""
    tau_pos: float = 1.0
    """SAPO: gate temperature for tokens with positive advantage."""
    tau_neg: float = 1.05
    """SAPO: gate temperature for tokens with zero or negative advantage."""


@dataclass
class ActorConfig:
    """Policy optimisation (verl's actor_rollout_ref.actor)."""

    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    lr_scheduler_type: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over trainer.total_steps (verl's warmup_style): cosine decays to
    min_lr_ratio * lr, so a policy that has converged stops taking lr-sized Adam steps on the
    noise of near-zero advantages (measured: a solved FrozenLake run broke on its last step)."""
    lr_warmup_steps_ratio: float = 0.0
    """Fraction of trainer.total_steps over which the learning rate ramps up linearly."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule, as a fraction of lr."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    ppo_mini_batch_size: int = 16
    """Episodes per optimizer step; the batch is split into batch_size / this updates."""
    micro_batch_size: int = 16
    """Episodes per forward/backward (gradient accumulation inside a mini-batch)."""
    max_tokens_per_micro_batch: int = 0
    """Token budget of one forward/backward (verl's ppo_max_token_len_per_gpu with use_dynamic_bsz):
    a mini-batch's episodes, longest first, fill micro-batches up to this many tokens (padded: rows x
    longest; packed: their sum); an episode longer than it gets one of its own. 0 = micro_batch_size."""
    logits_chunk_size: int = 1024
    """Positions whose full-vocabulary logits exist at once in the actor's and the reference's
    passes (verl's entropy_from_logits_with_chunking): the output layer, log-softmax and entropy
    run on this many positions at a time, and backward recomputes each chunk's logits instead of
    keeping (tokens, vocab) float32 tensors (train/forward.py). The same results; 0 = a pass's
    whole logits at once (the model's own forward, and the path of architectures that scale or cap
    their logits after the output layer)."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = 0.2
    """PPO clip range above 1 (ratio <= 1 + clip_ratio_high); DAPO's clip-higher raises it."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound (> 1) for negative advantages, as verl; null turns it off."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm", "dr-grpo"] = "token-mean"
    """How token losses are averaged (verl's modes). seq-mean-token-sum-norm is verl's: all
    summed token losses / loss_scale_factor, no division by the number of episodes; dr-grpo is the
    Dr. GRPO paper's (TRL's dr_grpo): the same, also averaged over the mini-batch's episodes."""
    loss_scale_factor: float | None = None
    """Constant divisor of seq-mean-token-sum-norm and dr-grpo; null = the most tokens an episode
    can generate (rollout.max_new_tokens * env.max_turns), our padded response length."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Which policy loss (verl's actor.policy_loss)."""
    grad_clip: float = 1.0
    """Max global grad norm; 0 turns clipping off."""
    use_kl_loss: bool = False
    """Add a KL-to-reference term to the loss (the reference is the starting policy, frozen)."""
    kl_loss_coef: float = 0.05
    """Weight of the KL loss."""
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl"] = "low_var_kl"
    """KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3, clamped as verl does)."""
    tis_imp_ratio_cap: float = -1.0
    """Truncated importance sampling (verl): weight each token by min(pi_old / pi_behaviour,
    cap), correcting engine/trainer mismatch; <= 0 turns it off."""
    use_decoupled_loss: bool = False
    """AReaL's decoupled PPO: clip against the proximal policy (recomputed before the update)
    and weight by pi_prox / pi_behaviour, for stale samples."""
    behav_imp_weight_cap: float | None = None
    """Decoupled PPO: tokens whose behaviour weight exceeds this are dropped; null = no cap."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (token-mean over generated ids); keeps a policy from
    collapsing onto one action before it has learned which state calls for which."""
    share_prefixes: bool = False
    """Prefix-shared training: rows of a micro-batch that start with the same ids (at least 16; a
    GRPO group's prompt, a history window's instructions) compute them once, forward and backward,
    for the actor and the reference (a KV-cache cascade, train/prefix.py); results equal the
    unshared pass's to float rounding. Not with model.enable_gradient_checkpointing."""


@dataclass
class CriticConfig:
    """The value model for GAE (verl's critic)."""

    enable: bool = False
    """Build and train a critic; adv_estimator=gae requires it."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    ppo_mini_batch_size: int = 16
    """Episodes per optimizer step."""
    micro_batch_size: int = 16
    """Episodes per forward/backward."""
    max_tokens_per_micro_batch: int = 0
    """Token budget of one forward/backward, as actor.max_tokens_per_micro_batch; 0 = micro_batch_size."""
    cliprange_value: float = 0.5
    """Value clipping around the values computed before the update."""
    grad_clip: float = 1.0
    """Max global grad norm; 0 turns clipping off."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm", "dr-grpo"] = "token-mean"
    """How token value losses are averaged (as actor.loss_agg_mode)."""
    share_prefixes: bool = False
    """Compute each prefix the rows of a micro-batch share once, as actor.share_prefixes."""
