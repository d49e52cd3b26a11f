"""The trainer's forward passes over one micro-batch: padded rows, or packed into one row.

Padded (the default): the micro-batch's right-padded rows go through the model as they are;
padding ids are computed and thrown away. Packed (`model.use_remove_padding`, verl's name):
the real ids of every row are concatenated into one row of N ids, with position ids that restart
at 0 for each sequence and no attention mask, so transformers keeps the sequences apart (a
block-diagonal causal mask for sdpa/eager, variable-length kernels for flash attention) and no
padding id is computed. Either way the results come back in the padded (B, T) layout that
losses, advantages and metrics use: position t holds what predicts token t from the ids before
it, and 0 at each sequence's first position. With `share_prefixes` (actor.share_prefixes,
critic.share_prefixes), rows that start with the same ids compute them once (train/prefix.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.train.prefix import shared_forward


@dataclass(frozen=True)
class ForwardOptions:
    """How a role (actor, reference, critic) runs its forward passes over a batch."""

    micro_batch_size: int  # rows per pass, without a token budget
    max_tokens: int = 0  # token budget per pass (0: micro_batch_size rows); see batch.micro_batches
    packed: bool = False  # one packed row per pass (model.use_remove_padding)
    share_prefixes: bool = False  # each prefix rows share computed once per pass (train/prefix.py)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True):
    """Logprob of each token given the ones before it, (B, T) with 0 at position 0.

    Logits are divided by `temperature` first: the engine samples from that distribution, so
    the ratio to the behaviour policy is 1 on-policy. With `entropy_grad` off the entropy is a
    statistic only: no graph is kept for it (two (B, T, vocab) tensors less to hold).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logp = torch.nn.functional.pad(logp, (1, 0))
    if not with_entropy:
        return logp
    return logp, torch.nn.functional.pad(_entropy(logp_all, entropy_grad), (1, 0))


def _entropy(logp_all: torch.Tensor, grad: bool) -> torch.Tensor:
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return -(logp_all.exp() * logp_all).sum(-1)


def logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
             packed: bool, with_entropy: bool = False, entropy_grad: bool = True, share_prefixes: bool = False):
    """`token_logprobs` of a right-padded micro-batch, through the padded or the packed pass,
    each shared prefix computed once with `share_prefixes`."""
    def unshared(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        run = packed_logprobs if packed else token_logprobs
        out = run(model, ids, mask, temperature, with_entropy, entropy_grad)
        return out if with_entropy else (out,)

    def score(logits: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        logp = logp_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
        return (logp, _entropy(logp_all, entropy_grad)) if with_entropy else (logp,)

    if share_prefixes:
        out = shared_forward(model, input_ids, attention_mask, lambda o: o.logits, score, unshared)
    else:
        out = unshared(input_ids, attention_mask)
    return out if with_entropy else out[0]


def packed_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (1, N), position ids (1, N), where (B, T) bool): the real ids of right-padded rows,
    concatenated row after row, each sequence's positions counting from 0."""
    where = attention_mask > 0
    positions = attention_mask.long().cumsum(-1) - 1
    return input_ids[where].unsqueeze(0), positions[where].unsqueeze(0), where


def unpack_shifted(flat: torch.Tensor, positions: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Values computed at each packed id (N,) -> (B, T), each at the position of the id after it
    (what predicts token t sits at t), 0 at every sequence's first position."""
    shifted = torch.nn.functional.pad(flat[:-1], (1, 0))  # id j gets what position j - 1 computed
    shifted = torch.where(positions[0] > 0, shifted, torch.zeros_like(shifted))
    out = torch.zeros(where.shape, dtype=flat.dtype, device=flat.device)
    out[where] = shifted
    return out


def packed_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True):
    """`token_logprobs` of a right-padded micro-batch (B, T), computed in one packed row."""
    ids, positions, where = packed_rows(input_ids, attention_mask)
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)  # (N, V): the distribution of the id after each
    nxt = torch.nn.functional.pad(ids[0, 1:], (0, 1))  # the last row of logits predicts nothing here
    logp = logp_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
    out = unpack_shifted(logp, positions, where)
    if not with_entropy:
        return out
    return out, unpack_shifted(_entropy(logp_all, entropy_grad), positions, where)


def packed_hidden(body: torch.nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(last hidden states (N, H), position ids (1, N), where (B, T)) of a transformer body over
    the packed micro-batch, for heads that read the state before each id (the critic)."""
    ids, positions, where = packed_rows(input_ids, attention_mask)
    hidden = body(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state[0]
    return hidden, positions, where
