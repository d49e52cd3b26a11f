"""The policy being trained: logprob recomputation and PPO updates over micro-batches."""

from __future__ import annotations

import contextlib
import math

import torch

from agentrl.algos.losses import aggregate, behaviour_weights, kl_penalty, masked_mean
from agentrl.algos.policy_losses import policy_loss
from agentrl.config import ActorConfig
from agentrl.train.batch import Batch
from agentrl.train.numerics import check_grad_norm, check_loss
from agentrl.train.parallel import DataParallel


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False):
    """Logprob of each token given the ones before it, (B, T) with 0 at position 0.

    Logits are divided by `temperature` first: the engine samples from that distribution, so
    the ratio to the behaviour policy is 1 on-policy.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logp = torch.nn.functional.pad(logp, (1, 0))
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, torch.nn.functional.pad(entropy, (1, 0))


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: Batch, micro_batch_size: int,
                   temperature: float) -> torch.Tensor:
    """`model`'s logprobs of every token of `batch`, (B, T), computed in micro-batches."""
    model.eval()
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.behaviour_logprobs)
    for start in range(0, batch.size, micro_batch_size):
        rows = torch.arange(start, min(start + micro_batch_size, batch.size))
        mb = batch.select(rows).to(device)
        lp = token_logprobs(model, mb.input_ids, mb.attention_mask, temperature)
        out[rows, : lp.shape[1]] = lp.cpu()
    return out


class Reference:
    """A frozen copy of the starting policy, for KL terms."""

    def __init__(self, model: torch.nn.Module, micro_batch_size: int, temperature: float) -> None:
        self.model = model.eval().requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The reference policy's logprobs, (B, T)."""
        return batch_logprobs(self.model, batch, self.micro_batch_size, self.temperature)


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
    """Holds the policy model and its optimizer."""

    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, temperature: float,
                 horizon: float | None = None, parallel: DataParallel | None = None) -> None:
        self.model = model
        self.parallel = parallel  # a data-parallel rank: updates on its share, gradients summed
        self.cfg = cfg
        self.temperature = temperature
        # the *-token-sum-norm modes divide by a constant: the configured one or the longest reply.
        self.horizon = cfg.loss_scale_factor or horizon
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
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
        return batch_logprobs(self.model, batch, self.cfg.micro_batch_size, self.temperature)

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) of micro-batches."""
        return {k: sum(v) / len(v) for k, v in self.update_stats(batch).items()}

    def update_stats(self, batch: Batch) -> dict[str, list[float]]:
        """`update`, with every value each statistic took (per micro-batch or mini-batch): a
        data-parallel rank updates on its share of each mini-batch, and the stats of every rank
        are merged before averaging (train/parallel.py)."""
        assert batch.old_logprobs is not None and batch.advantages is not None, "score the batch first"
        self.model.train()
        cfg, dp = self.cfg, self.parallel
        stats: dict[str, list[float]] = {}
        weights = self._off_policy_weights(batch, stats)
        for _ in range(cfg.ppo_epochs):
            for mstart in range(0, batch.size, cfg.ppo_mini_batch_size):
                mini = torch.arange(mstart, min(mstart + cfg.ppo_mini_batch_size, batch.size))
                mask = batch.loss_mask[mini]
                # Counts of the whole mini-batch: each micro-batch's (and each rank's) loss is
                # its share of the mini-batch loss, so the gradients add up to the whole one's.
                agg = {"num_tokens": float(mask.sum().clamp(min=1.0)),
                       "num_seqs": float((mask.sum(-1) > 0).sum().clamp(min=1)), "horizon": self.horizon}
                self.optimizer.zero_grad(set_to_none=True)
                rows = mini if dp is None else dp.rows(mini)
                starts = list(range(0, len(rows), cfg.micro_batch_size))
                mini_loss = 0.0
                for i, start in enumerate(starts):
                    # A rank's gradients are all-reduced on its last micro-batch only.
                    with dp.no_sync() if dp is not None and i < len(starts) - 1 else contextlib.nullcontext():
                        mini_loss += self._micro_step(batch, rows[start:start + cfg.micro_batch_size], weights,
                                                      agg, stats)
                if dp is not None and not starts:  # no rows here: still take part in the all-reduce
                    dp.idle_backward(batch.select(mini[:1]).to(self.device), self.temperature)
                _append(stats, "loss/policy", mini_loss)
                grad_norm = self._clip_and_step()
                _append(stats, "policy/grad_norm", grad_norm)
        return stats

    def _micro_step(self, batch: Batch, rows: torch.Tensor, weights: torch.Tensor | None, agg: dict[str, float],
                    stats: dict[str, list[float]]) -> float:
        """Forward and backward of one micro-batch; returns its loss."""
        cfg = self.cfg
        mb = batch.select(rows).to(self.device)
        w = weights[rows, : mb.input_ids.shape[1]].to(self.device) if weights is not None else None
        forward = self.parallel.module if self.parallel is not None else self.model
        logp, entropy = token_logprobs(forward, mb.input_ids, mb.attention_mask, self.temperature, with_entropy=True)
        loss, pg = policy_loss(cfg.policy_loss.loss_mode, logp, mb.old_logprobs, mb.advantages,
                               mb.loss_mask, cfg.clip_ratio_low, cfg.clip_ratio_high,
                               cfg.loss_agg_mode, clip_ratio_c=cfg.clip_ratio_c, weights=w,
                               config=cfg.policy_loss, **agg)
        terms = {f"{cfg.policy_loss.loss_mode} policy loss (loss/policy)": loss}
        if cfg.use_kl_loss:
            kl = kl_penalty(logp, mb.ref_logprobs, cfg.kl_loss_type)
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

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
        """Continue from a checkpoint's weights and optimizer state."""
        self.model.load_state_dict(weights, strict=False)
        self.optimizer.load_state_dict(optimizer_state)

    def _off_policy_weights(self, batch: Batch, stats: dict[str, list[float]]) -> torch.Tensor | None:
        """pi_old / pi_behaviour per token (TIS or decoupled PPO), or None when both are off."""
        cfg = self.cfg
        if cfg.use_decoupled_loss:
            mode, cap = "decoupled", cfg.behav_imp_weight_cap
        elif cfg.tis_imp_ratio_cap > 0:
            mode, cap = "tis", cfg.tis_imp_ratio_cap
        else:
            return None
        w, s = behaviour_weights(batch.old_logprobs, batch.behaviour_logprobs, batch.loss_mask, mode, cap)
        for k, v in s.items():
            _append(stats, f"policy/{k}", v)
        return w

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        check_grad_norm("policy update", norm)  # a non-finite gradient would poison the weights
        self.optimizer.step()
        return norm


def _append(stats: dict[str, list[float]], key: str, value: float) -> None:
    stats.setdefault(key, []).append(value)
