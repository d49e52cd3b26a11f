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
from typing import TYPE_CHECKING, cast

import torch

from agentrl.algos.losses import explained_variance, masked_mean, value_loss
from agentrl.config import CriticConfig
from agentrl.models.lora import is_peft
from agentrl.train.batch import Batch, micro_batches, mini_batches, need
from agentrl.train.forward import ForwardOptions, packed_hidden, unpack_shifted
from agentrl.train.numerics import check_grad_norm, check_loss
from agentrl.train.precision import MasterWeights
from agentrl.train.prefix import shared_forward

if TYPE_CHECKING:  # peft is the optional extra `lora`
    from peft import PeftModel
    from transformers import PreTrainedModel


class ValueModel(torch.nn.Module):
    """A causal LM's body plus a linear value head (float32). With LoRA the body keeps the
    policy's adapter layers: the critic trains its own adapters and head, its base stays frozen."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        # a transformers causal LM, maybe peft-wrapped (LoRA)
        lm = cast("PreTrainedModel", cast("PeftModel", policy).get_base_model() if is_peft(policy) else policy)
        self.body: torch.nn.Module = copy.deepcopy(lm.base_model)
        hidden = lm.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: bool = False,
                share_prefixes: bool = False) -> torch.Tensor:
        """Values (B, T): the value of the prefix before each token (0 at position 0); `packed`
        runs the body over one packed row, `share_prefixes` computes each prefix rows share once
        (see train/forward.py)."""
        if share_prefixes:
            return shared_forward(self.body, input_ids, attention_mask, lambda o: o.last_hidden_state,
                                  lambda hidden, _: (self._head(hidden),),
                                  lambda ids, mask: (self(ids, mask, packed),))[0]
        if packed:
            hidden, positions, where = packed_hidden(self.body, input_ids, attention_mask)
            return unpack_shifted(self._head(hidden), positions, where)
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return torch.nn.functional.pad(self._head(hidden)[:, :-1], (1, 0))

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.float()).squeeze(-1)


class Critic:
    """Holds the value model and its optimizer."""

    def __init__(self, model: ValueModel, cfg: CriticConfig, horizon: float, packed: bool = False) -> None:
        self.model = model
        self.cfg = cfg
        self.horizon = horizon
        self.options = ForwardOptions(cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, packed, cfg.share_prefixes)
        self.master = MasterWeights([p for p in model.parameters() if p.requires_grad])  # as the actor's
        self.optimizer = torch.optim.AdamW(self.master.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    @property
    def device(self) -> torch.device:
        """Where the model lives."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values of every position of the batch, (B, T), zero off the loss mask."""
        self.model.eval()
        out = torch.zeros_like(batch.loss_mask)
        for rows in self._micro_batches(batch, torch.arange(batch.size)):
            mb = batch.select(rows).to(self.device)
            v = self.model(mb.input_ids, mb.attention_mask, self.options.packed, self.options.share_prefixes)
            out[rows, : v.shape[1]] = (v * mb.loss_mask).cpu()
        return out

    def _micro_batches(self, batch: Batch, rows: torch.Tensor) -> list[torch.Tensor]:
        o = self.options
        return micro_batches(batch.attention_mask, rows, o.micro_batch_size, o.max_tokens, o.packed)

    def update(self, batch: Batch) -> dict[str, float]:
        """Clipped value-loss epochs over mini-batches of micro-batches."""
        assert batch.values is not None and batch.returns is not None, "compute values and returns first"
        self.model.train()
        cfg = self.cfg
        stats: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            for mini in mini_batches(batch, cfg.ppo_mini_batch_size):
                mask = batch.loss_mask[mini]
                n_tokens = float(mask.sum().clamp(min=1.0))
                n_seqs = float((mask.sum(-1) > 0).sum().clamp(min=1))
                self.optimizer.zero_grad(set_to_none=True)
                for rows in self._micro_batches(batch, mini):
                    mb = batch.select(rows).to(self.device)
                    v = self.model(mb.input_ids, mb.attention_mask, self.options.packed, self.options.share_prefixes)
                    loss, vs = value_loss(v, need(mb.values, "values"), need(mb.returns, "returns"), mb.loss_mask,
                                          cfg.cliprange_value, cfg.loss_agg_mode, n_tokens, n_seqs, self.horizon)
                    value = float(loss.detach())
                    check_loss("critic update", value, {"value loss (loss/value)": loss},
                               {"returns": mb.returns, "old values": mb.values, "current values": v.detach()},
                               mb.loss_mask)
                    loss.backward()
                    stats.setdefault("loss/value", []).append(value)
                    stats.setdefault("policy/vf_clipfrac", []).append(float(vs["vf_clipfrac"]))
                    stats.setdefault("policy/vpred_mean", []).append(float(masked_mean(v.detach(), mb.loss_mask)))
                self.master.grads_to_master()
                params = [p for p in self.master.params if p.grad is not None]
                norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf))
                check_grad_norm("critic update", norm)
                self.optimizer.step()
                self.master.master_to_model()
                stats.setdefault("policy/critic_grad_norm", []).append(norm)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        # loss/value is summed over micro-batches within a mini-batch: report per mini-batch.
        n_mini = cfg.ppo_epochs * len(mini_batches(batch, cfg.ppo_mini_batch_size))
        out["loss/value"] = sum(stats["loss/value"]) / n_mini
        out["policy/explained_variance"] = explained_variance(batch.values, batch.returns, batch.loss_mask)
        return out

    def state_dict(self) -> dict:
        """Weights and optimizer state, for checkpoints."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "master": self.master.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore weights and optimizer state."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.master.load_state_dict(state.get("master"))
