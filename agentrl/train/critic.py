"""The value model for GAE: the policy's transformer body with a scalar head, trained by PPO's
clipped value loss.

The critic starts as a copy of the policy's body (verl initialises its critic from the actor's
weights too) with a zero-initialised head, so its first values are 0 and its first update
moves only the head. values[:, t] is the value of the state before token t, aligned with
`token_logprobs`: position t reads the hidden state at t - 1.
"""

from __future__ import annotations

import copy
import math

import torch

from agentrl.algos.losses import explained_variance, masked_mean, value_loss
from agentrl.config import CriticConfig
from agentrl.train.batch import Batch
from agentrl.train.numerics import check_grad_norm, check_loss


class ValueModel(torch.nn.Module):
    """A causal LM's body plus a linear value head."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.body = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values (B, T): the value of the prefix before each token (0 at position 0)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        v = self.head(hidden.float()).squeeze(-1)[:, :-1]
        return torch.nn.functional.pad(v, (1, 0))


class Critic:
    """Holds the value model and its optimizer."""

    def __init__(self, model: ValueModel, cfg: CriticConfig, horizon: float) -> None:
        self.model = model
        self.cfg = cfg
        self.horizon = horizon
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    @property
    def device(self) -> torch.device:
        """Where the model lives."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values of every position of the batch, (B, T), zero off the loss mask."""
        self.model.eval()
        out = torch.zeros_like(batch.loss_mask)
        for start in range(0, batch.size, self.cfg.micro_batch_size):
            rows = torch.arange(start, min(start + self.cfg.micro_batch_size, batch.size))
            mb = batch.select(rows).to(self.device)
            v = self.model(mb.input_ids, mb.attention_mask)
            out[rows, : v.shape[1]] = (v * mb.loss_mask).cpu()
        return out

    def update(self, batch: Batch) -> dict[str, float]:
        """Clipped value-loss epochs over mini-batches of micro-batches."""
        assert batch.values is not None and batch.returns is not None, "compute values and returns first"
        self.model.train()
        cfg = self.cfg
        stats: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            for mstart in range(0, batch.size, cfg.ppo_mini_batch_size):
                mini = torch.arange(mstart, min(mstart + cfg.ppo_mini_batch_size, batch.size))
                mask = batch.loss_mask[mini]
                n_tokens = float(mask.sum().clamp(min=1.0))
                n_seqs = float((mask.sum(-1) > 0).sum().clamp(min=1))
                self.optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(mini), cfg.micro_batch_size):
                    mb = batch.select(mini[start:start + cfg.micro_batch_size]).to(self.device)
                    v = self.model(mb.input_ids, mb.attention_mask)
                    loss, vs = value_loss(v, mb.values, mb.returns, mb.loss_mask, cfg.cliprange_value,
                                          cfg.loss_agg_mode, n_tokens, n_seqs, self.horizon)
                    value = float(loss.detach())
                    check_loss("critic update", value, {"value loss (loss/value)": loss},
                               {"returns": mb.returns, "old values": mb.values, "current values": v.detach()},
                               mb.loss_mask)
                    loss.backward()
                    stats.setdefault("loss/value", []).append(value)
                    stats.setdefault("policy/vf_clipfrac", []).append(float(vs["vf_clipfrac"]))
                    stats.setdefault("policy/vpred_mean", []).append(float(masked_mean(v.detach(), mb.loss_mask)))
                params = [p for p in self.model.parameters() if p.grad is not None]
                norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf))
                check_grad_norm("critic update", norm)
                self.optimizer.step()
                stats.setdefault("policy/critic_grad_norm", []).append(norm)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        # loss/value is summed over micro-batches within a mini-batch: report per mini-batch.
        n_mini = cfg.ppo_epochs * math.ceil(batch.size / cfg.ppo_mini_batch_size)
        out["loss/value"] = sum(stats["loss/value"]) / n_mini
        out["policy/explained_variance"] = explained_variance(batch.values, batch.returns, batch.loss_mask)
        return out

    def state_dict(self) -> dict:
        """Weights and optimizer state, for checkpoints."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore weights and optimizer state."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])



