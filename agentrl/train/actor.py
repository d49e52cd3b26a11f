"""The policy being trained: logprob recomputation and PPO updates over micro-batches."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

import torch

from agentrl.algos.losses import PolicyLossInput, aggregate, behaviour_weights, kl_penalty, masked_mean
from agentrl.algos.policy_losses import get_policy_loss
from agentrl.config import ActorConfig
from agentrl.models.lora import adapter_state, is_peft, load_adapter_state
from agentrl.train.batch import Batch, micro_batches, mini_batches, need
from agentrl.train.forward import ForwardOptions, logprobs, token_logprobs  # noqa: F401  (token_logprobs: re-exported)
from agentrl.train.numerics import check_grad_norm, check_loss
from agentrl.train.parallel import DataParallel
from agentrl.train.precision import MasterWeights

if TYPE_CHECKING:  # peft is the optional extra `lora`
    from peft import PeftModel


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: Batch, options: ForwardOptions,
                   temperature: float) -> torch.Tensor:
    """`model`'s logprobs of every token of `batch`, (B, T), computed in micro-batches."""
    model.eval()
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.behaviour_logprobs)
    for rows in micro_batches(batch.attention_mask, torch.arange(batch.size), options.micro_batch_size,
                              options.max_tokens, options.packed):
        mb = batch.select(rows).to(device)
        lp = logprobs(model, mb.input_ids, mb.attention_mask, temperature, options.packed,
                      share_prefixes=options.share_prefixes, chunk=options.logits_chunk)
        out[rows, : lp.shape[1]] = lp.float().cpu()
    return out


class Reference:
    """The starting policy, frozen, for KL terms: a copy of it, or (LoRA) the trained model itself
    with its adapters switched off, which costs no memory (verl's ref_in_actor)."""

    def __init__(self, model: torch.nn.Module, options: ForwardOptions, temperature: float) -> None:
        self.adapters_off = is_peft(model)
        self.model = model if self.adapters_off else model.eval().requires_grad_(False)
        self.options = options
        self.temperature = temperature

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The reference policy's logprobs, (B, T)."""
        # adapters_off: is_peft(model), a PeftModel
        with cast("PeftModel", self.model).disable_adapter() if self.adapters_off else nullcontext():
            return batch_logprobs(self.model, batch, self.options, self.temperature)


def lr_factor(step: int, total: int, kind: str, warmup_ratio: float = 0.0, min_ratio: float = 0.0) -> float:
    """Multiplier of the base learning rate at training step `step` (0-based) of `total`."""
    warmup = int(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Actor:
    """Holds the policy model and its optimizer (over the trainable weights only: with LoRA, the
    adapters; with bfloat16 weights, float32 master copies of them); the trainer's `Learner` in
    one process."""

    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, temperature: float,
                 horizon: float | None = None, packed: bool = False, parallel: DataParallel | None = None) -> None:
        self.model = model
        self.parallel = parallel  # a data-parallel rank: updates on its share, gradients summed
        self.cfg = cfg
        self.temperature = temperature
        self.options = ForwardOptions(cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, packed, cfg.share_prefixes,
                                      cfg.logits_chunk_size)
        # seq-mean-token-sum-norm and dr-grpo divide by a constant: the configured one or the longest reply.
        self.horizon = cfg.loss_scale_factor or horizon
        self.master = MasterWeights([p for p in model.parameters() if p.requires_grad])
        self.optimizer = torch.optim.AdamW(self.master.params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                                           weight_decay=cfg.weight_decay)

    @property
    def device(self) -> torch.device:
        """Where the model lives."""
        return next(self.model.parameters()).device

    def schedule(self, step: int, total: int) -> float:
        """Set the learning rate for training step `step` (0-based) of `total`; returns it."""
        c = self.cfg
        lr = c.lr * lr_factor(step, total, c.lr_scheduler_type, c.lr_warmup_steps_ratio, c.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The current policy's logprobs for the whole batch, (B, T)."""
        return batch_logprobs(self.model, batch, self.options, self.temperature)

    # ------------------------------------------------------------------ weights
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What an engine needs to serve the current policy: the adapter state with LoRA (see
        models/lora.py), else the full state dict."""
        if is_peft(self.model):
            return adapter_state(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Restore the trained weights read from a checkpoint (the adapter tensors with LoRA)."""
        if is_peft(self.model):
            load_adapter_state(self.model, weights)
        else:
            self.model.load_state_dict(weights, strict=False)

    # ------------------------------------------------------------------ the update
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) of micro-batches."""
        return {k: sum(v) / len(v) for k, v in self.update_stats(batch).items()}

    def update_stats(self, batch: Batch) -> dict[str, list[float]]:
        """`update`, with every value each statistic took (per micro-batch or mini-batch): a
        data-parallel rank updates on its share of each mini-batch, and the stats of every rank
        are merged before averaging (train/parallel.py)."""
        assert batch.old_logprobs is not None and batch.advantages is not None, "score the batch first"
        self.model.train()
        cfg, opt, dp = self.cfg, self.options, self.parallel
        stats: dict[str, list[float]] = {}
        weights = self._off_policy_weights(batch, stats)
        for _ in range(cfg.ppo_epochs):
            for mini in mini_batches(batch, cfg.ppo_mini_batch_size):
                mask = batch.loss_mask[mini]
                # Counts of the whole mini-batch: each micro-batch's (and each rank's) loss is
                # its share of the mini-batch loss, so the gradients add up to the whole one's.
                agg = {"num_tokens": float(mask.sum().clamp(min=1.0)),
                       "num_seqs": float((mask.sum(-1) > 0).sum().clamp(min=1)), "horizon": self.horizon}
                self.optimizer.zero_grad(set_to_none=True)
                rows = mini if dp is None else dp.rows(mini)
                mini_loss = 0.0
                parts = micro_batches(batch.attention_mask, rows, opt.micro_batch_size, opt.max_tokens, opt.packed)
                for i, part in enumerate(parts):
                    # A rank's gradients are all-reduced on its last micro-batch only.
                    with dp.no_sync() if dp is not None and i < len(parts) - 1 else nullcontext():
                        mini_loss += self._backward(batch, part, weights, agg, stats)
                if dp is not None and not parts:  # no rows here: still take part in the all-reduce
                    dp.idle_backward(batch.select(mini[:1]).to(self.device), self.temperature)
                _append(stats, "loss/policy", mini_loss)
                grad_norm = self._clip_and_step()
                _append(stats, "policy/grad_norm", grad_norm)
        return stats

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                   master: dict[int, torch.Tensor] | None = None) -> None:
        """Continue from a checkpoint: its trained weights, optimizer state and float32 master copies."""
        self.load_weights(weights)
        self.optimizer.load_state_dict(optimizer_state)
        self.master.load_state_dict(master)

    def _backward(self, batch: Batch, rows: torch.Tensor, weights: torch.Tensor | None, agg: dict[str, Any],
                  stats: dict[str, list[float]]) -> float:
        """Forward and backward of one micro-batch; its share of the mini-batch's loss."""
        cfg = self.cfg
        mb = batch.select(rows).to(self.device)
        w = weights[rows, : mb.input_ids.shape[1]].to(self.device) if weights is not None else None
        forward = self.parallel.module if self.parallel is not None else self.model
        logp, entropy = logprobs(forward, mb.input_ids, mb.attention_mask, self.temperature,
                                 self.options.packed, with_entropy=True, entropy_grad=bool(cfg.entropy_coeff),
                                 share_prefixes=self.options.share_prefixes, chunk=self.options.logits_chunk)
        loss, pg = get_policy_loss(cfg.policy_loss.loss_mode)(PolicyLossInput(
            logp, need(mb.old_logprobs, "old_logprobs"), need(mb.advantages, "advantages"), mb.loss_mask,
            cfg.clip_ratio_low, cfg.clip_ratio_high,
            cfg.loss_agg_mode, clip_ratio_c=cfg.clip_ratio_c, weights=w, config=cfg.policy_loss, **agg))
        terms = {f"{cfg.policy_loss.loss_mode} policy loss (loss/policy)": loss}
        if cfg.use_kl_loss:
            kl = kl_penalty(logp, need(mb.ref_logprobs, "ref_logprobs"), cfg.kl_loss_type)
            terms["KL loss (actor.use_kl_loss)"] = kl_term = aggregate(kl, mb.loss_mask, cfg.loss_agg_mode, **agg)
            loss = loss + cfg.kl_loss_coef * kl_term
            _append(stats, "loss/kl", float(masked_mean(kl.detach(), mb.loss_mask)))
        if cfg.entropy_coeff:
            terms["entropy bonus (actor.entropy_coeff)"] = ent_term = aggregate(
                entropy, mb.loss_mask, cfg.loss_agg_mode, **agg)
            loss = loss - cfg.entropy_coeff * ent_term
        value = float(loss.detach())
        check_loss("policy update", value, terms, {
            "advantages": mb.advantages, "behaviour logprobs": mb.old_logprobs,
            "current logprobs": logp.detach(), "reference logprobs": mb.ref_logprobs,
            "importance weights": w}, mb.loss_mask)
        loss.backward()
        _append(stats, "policy/pg_clipfrac", float(pg["pg_clipfrac"]))
        _append(stats, "policy/pg_clipfrac_lower", float(pg["pg_clipfrac_lower"]))
        _append(stats, "policy/ppo_kl", float(pg["ppo_kl"]))
        _append(stats, "policy/entropy", float(masked_mean(entropy.detach(), mb.loss_mask)))
        return value

    def _off_policy_weights(self, batch: Batch, stats: dict[str, list[float]]) -> torch.Tensor | None:
        """pi_old / pi_behaviour per token (TIS or decoupled PPO), or None when both are off."""
        cfg = self.cfg
        if cfg.use_decoupled_loss:
            mode, cap = "decoupled", cfg.behav_imp_weight_cap
        elif cfg.tis_imp_ratio_cap > 0:
            mode, cap = "tis", cfg.tis_imp_ratio_cap
        else:
            return None
        w, s = behaviour_weights(need(batch.old_logprobs, "old_logprobs"), batch.behaviour_logprobs, batch.loss_mask,
                                 mode, cap)
        for k, v in s.items():
            _append(stats, f"policy/{k}", v)
        return w

    def _clip_and_step(self) -> float:
        self.master.grads_to_master()
        params = [p for p in self.master.params if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        check_grad_norm("policy update", norm)  # a non-finite gradient would poison the weights
        self.optimizer.step()
        self.master.master_to_model()
        return norm


def _append(stats: dict[str, list[float]], key: str, value: float) -> None:
    stats.setdefault(key, []).append(value)
