"""Supervised warm start: teach a fresh model the reply format, not the best reply.

Demonstrations carry uniformly random valid actions of the state they are played in, so the best
the model can do is to put equal mass on the valid replies of each state: the reply loss has a
floor of the summed entropy of those choices (log of the number of valid replies per turn). Training stops
as soon as the reply loss sits at that floor; anything the policy learns afterwards about which
move is best is learned by RL.

With `observation_loss` the model also learns to predict the env's own text (boards, template,
the position line). Replies alone teach a model to ignore its context (measured: the warm-started
tiny model gave the same action distribution for a FrozenLake board and for "hello world", and
could not then learn state-dependent moves even from oracle labels); predicting observations
builds the attention that reads them, without saying anything about which move is best.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrl.config import WarmStartConfig
from agentrl.train.actor import token_logprobs
from agentrl.train.batch import pack
from agentrl.trajectory import Trajectory


def warm_start(model: torch.nn.Module, demos: Callable[[int], tuple[list[Trajectory], float]],
               cfg: WarmStartConfig, pad_token_id: int,
               log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Fit `model` to demonstration batches until the loss reaches the floor.

    `demos(step)` gives a batch of trajectories and the summed entropy of their replies.
    """
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    model.train()
    at_floor, loss_v, floor, step = 0, float("nan"), float("nan"), 0
    for step in range(1, cfg.max_steps + 1):
        trajs, reply_entropy = demos(step)
        batch = pack(trajs, pad_token_id).to(device)
        n_tokens = batch.loss_mask.sum().clamp(min=1.0)
        floor = float(reply_entropy / n_tokens)
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask)
        reply_loss = -(logp * batch.loss_mask).sum() / n_tokens
        loss = reply_loss
        if cfg.observation_loss:
            lm_mask = batch.attention_mask.float()
            lm_mask[:, 0] = 0.0
            loss = -(logp * lm_mask).sum() / lm_mask.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = float(reply_loss.detach())
        at_floor = at_floor + 1 if loss_v - floor < cfg.floor_tolerance else 0
        if log and step % 20 == 0:
            log(f"warm start step {step}: reply loss {loss_v:.4f} (floor {floor:.4f}), "
                f"all-token loss {float(loss.detach()):.4f}")
        if at_floor >= cfg.patience and step >= cfg.min_steps:
            break
    model.eval()
    return {"steps": step, "loss": loss_v, "floor": floor, "reached_floor": at_floor >= cfg.patience}
