"""Prefix-shared forward passes (actor.share_prefixes): each prefix that rows of a micro-batch
share is computed once, forward and backward.

A GRPO group's episodes start with the same prompt, and an agent's segments under a history
window start with the same instructions. Rows whose first `min_prefix` ids are equal form a group
(split again where parts of it share a longer prefix and that saves more ids); the group's
longest common prefix (at most all but the last id of its shortest row) runs once
through the model with its KV cache kept, the cache is copied out to the group's rows
(`index_select`: autograd sums the rows' gradients back into the one prefix computation), and
every row's remaining ids (the suffix) run on it in a second pass, positions continuing after the
prefix and an attention mask that covers the group's prefix and the row's own ids. The prefix
pass's last state predicts each row's first suffix id. Rows that share nothing take the unshared pass.

The results come back in the padded (B, T) layout of train/forward.py and equal the unshared
pass up to float rounding (the same operations on the same numbers, in matrices of other
shapes). Both passes are padded ones: in a packed micro-batch (model.use_remove_padding) only the
rows that share nothing are packed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a second pass: no sharing

# What a pass returns for each position: the model's output (logits, hidden states), read off it.
Read = Callable[[Any], torch.Tensor]
# The per-position results of states (..., D) and the id after each (...): a tuple of (...) tensors.
Score = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class PrefixPlan:
    """Where each row of a micro-batch reads its shared prefix, and where its results go."""

    prefix_ids: torch.Tensor  # (G, P) each group's shared prefix, right-padded
    prefix_mask: torch.Tensor  # (G, P)
    suffix_ids: torch.Tensor  # (B, S) each row's ids after its group's prefix, right-padded
    attention_mask: torch.Tensor  # (B, P + S) of the suffix pass: the row's group's prefix, then its own ids
    positions: torch.Tensor  # (B, S) position ids of the suffix pass
    group: torch.Tensor  # (B,) the group of each row: whose KV it reads
    shared: torch.Tensor  # (B,) the length of its group's prefix
    next_ids: torch.Tensor  # (B,) its first id after the prefix (the prefix's last state predicts it)
    index: torch.Tensor  # (B, T) each output's place in the flat results (see `assemble`)


def prefix_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  min_prefix: int = MIN_SHARED_PREFIX) -> list[tuple[list[int], int]]:
    """(rows, shared prefix length) of each group of two or more right-padded rows that share
    their first `min_prefix` ids or more. A group's length is its rows' longest common prefix, but
    leaves every row at least one id of its own; rows that share a longer prefix among themselves
    (segments of the same turn in a history window) form groups of their own where that saves
    more ids."""
    lengths = attention_mask.sum(-1).tolist()
    by_start: dict[tuple[int, ...], list[int]] = {}
    for r, n in enumerate(lengths):
        if n > min_prefix:
            by_start.setdefault(tuple(input_ids[r, :min_prefix].tolist()), []).append(r)
    groups: list[tuple[list[int], int]] = []
    for rows in by_start.values():
        if len(rows) > 1:
            groups += _best_split(input_ids, lengths, rows)[0]
    return groups


def _best_split(input_ids: torch.Tensor, lengths: list[int],
                rows: list[int]) -> tuple[list[tuple[list[int], int]], int]:
    """The groups of `rows` (which share a prefix) that save the most ids, and how many they save:
    the rows as one group, or split where they part, each part split again the same way."""
    cap = min(lengths[r] for r in rows) - 1
    same = (input_ids[rows, :cap] == input_ids[rows[0], :cap]).all(0)
    shared = int(same.long().cumprod(0).sum())
    whole = ([(rows, shared)], (len(rows) - 1) * shared)
    parts: dict[int, list[int]] = {}
    for r in rows:  # by the id where they part (shared < every row's length)
        parts.setdefault(int(input_ids[r, shared]), []).append(r)
    if len(parts) == 1:  # the shortest row ends here: no longer prefix to share
        return whole
    groups: list[tuple[list[int], int]] = []
    saved = 0
    for part in parts.values():
        if len(part) > 1:
            g, s = _best_split(input_ids, lengths, part)
            groups, saved = groups + g, saved + s
    return (groups, saved) if saved > whole[1] else whole


def plan_prefixes(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  groups: list[tuple[list[int], int]]) -> PrefixPlan:
    """The cascade of a right-padded micro-batch (B, T) whose every row is in one of `groups`."""
    device = input_ids.device
    batch, width = input_ids.shape
    lengths = attention_mask.sum(-1).tolist()
    n_groups, prefix = len(groups), max(p for _, p in groups)
    group_of, shared = [0] * batch, [0] * batch
    prefix_ids = torch.zeros((n_groups, prefix), dtype=torch.long, device=device)
    prefix_mask = torch.zeros((n_groups, prefix), dtype=torch.long, device=device)
    for g, (rows, p) in enumerate(groups):
        prefix_ids[g, :p] = input_ids[rows[0], :p]
        prefix_mask[g, :p] = 1
        for r in rows:
            group_of[r], shared[r] = g, p
    suffix = max(n - p for n, p in zip(lengths, shared))
    suffix_ids = torch.zeros((batch, suffix), dtype=torch.long, device=device)
    mask = torch.zeros((batch, prefix + suffix), dtype=torch.long, device=device)
    positions = torch.zeros((batch, suffix), dtype=torch.long, device=device)
    # Flat results: the prefixes' own predictions (G x (P - 1)), each row's first suffix id (B),
    # the suffixes' own (B x (S - 1)), and a 0 for positions nothing predicts.
    suffix_base = n_groups * (prefix - 1) + batch
    index = torch.full((batch, width), suffix_base + batch * (suffix - 1), dtype=torch.long, device=device)
    for r, (n, p, g) in enumerate(zip(lengths, shared, group_of)):
        suffix_ids[r, :n - p] = input_ids[r, p:n]
        mask[r, :p] = 1
        mask[r, prefix:prefix + n - p] = 1
        positions[r] = torch.arange(p, p + suffix, device=device)
        index[r, 1:p] = g * (prefix - 1) + torch.arange(p - 1, device=device)
        index[r, p] = n_groups * (prefix - 1) + r
        index[r, p + 1:n] = suffix_base + r * (suffix - 1) + torch.arange(n - p - 1, device=device)  # s -> s + 1
    group, shared_t = torch.tensor(group_of, device=device), torch.tensor(shared, device=device)
    return PrefixPlan(prefix_ids, prefix_mask, suffix_ids, mask, positions, group, shared_t,
                      input_ids[torch.arange(batch, device=device), shared_t], index)


def cascade(model: torch.nn.Module, plan: PrefixPlan, read: Read,
            extra: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix states (G, P, D), suffix states (B, S, D)): the prefixes once, with their KV cache,
    then every row's suffix on its group's cache; `extra`: keyword arguments of both passes."""
    if model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        # transformers drops the KV cache of checkpointed layers in training: the suffixes would see no prefix.
        raise ValueError("actor.share_prefixes (critic.share_prefixes) needs the KV cache, which gradient "
                         "checkpointing drops in training: turn off model.enable_gradient_checkpointing or it")
    extra = extra or {}
    out = model(input_ids=plan.prefix_ids, attention_mask=plan.prefix_mask, use_cache=True, **extra)
    prefix = read(out)  # read at once: a reader may take what the pass left elsewhere (train/forward.py)
    cache = out.past_key_values
    cache.reorder_cache(plan.group)  # each row's copy of its group's keys and values
    rest = model(input_ids=plan.suffix_ids, attention_mask=plan.attention_mask, position_ids=plan.positions,
                 past_key_values=cache, use_cache=True, **extra)
    return prefix, read(rest)


def assemble(plan: PrefixPlan, prefix: torch.Tensor, suffix: torch.Tensor, score: Score) -> tuple[torch.Tensor, ...]:
    """`score`'s results in the (B, T) layout: position t holds what the state before id t gives
    (the prefix's, the boundary's or the suffix's), 0 where nothing predicts an id."""
    parts = (score(prefix[:, :-1], plan.prefix_ids[:, 1:]), score(prefix[plan.group, plan.shared - 1], plan.next_ids),
             score(suffix[:, :-1], plan.suffix_ids[:, 1:]))
    outs = []
    for own, first, rest in zip(*parts):
        flat = torch.cat([own.reshape(-1), first.reshape(-1), rest.reshape(-1), own.new_zeros(1)])
        outs.append(flat[plan.index])
    return tuple(outs)


def shared_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, read: Read,
                   score: Score, unshared: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
                   min_prefix: int = MIN_SHARED_PREFIX,
                   extra: dict[str, Any] | None = None) -> tuple[torch.Tensor, ...]:
    """`score`'s (B, T) results of a right-padded micro-batch with each shared prefix computed once;
    `unshared(ids, mask)` gives them for rows that share nothing (all of them when none do);
    `extra`: keyword arguments of the model's passes."""
    groups = prefix_groups(input_ids, attention_mask, min_prefix)
    if not groups:
        return unshared(input_ids, attention_mask)
    grouped = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    grouped[[r for rows, _ in groups for r in rows]] = True
    if bool(grouped.all()):
        plan = plan_prefixes(input_ids, attention_mask, groups)
        return assemble(plan, *cascade(model, plan, read, extra), score)
    # The groups through the cascade, the others through the unshared pass (packed or padded): in
    # the suffix pass a row that shares nothing would widen every row's suffix to its whole length.
    rows, alone = grouped.nonzero(as_tuple=True)[0], (~grouped).nonzero(as_tuple=True)[0]
    new = {int(r): i for i, r in enumerate(rows)}  # a row's place among the grouped ones
    ids, mask = _trimmed(input_ids, attention_mask, rows)
    plan = plan_prefixes(ids, mask, [([new[r] for r in members], p) for members, p in groups])
    outs = []
    for shared, own in zip(assemble(plan, *cascade(model, plan, read, extra), score),
                           unshared(*_trimmed(input_ids, attention_mask, alone))):
        out = shared.new_zeros(input_ids.shape)
        out[rows.to(out.device), :shared.shape[1]] = shared
        out[alone.to(out.device), :own.shape[1]] = own
        outs.append(out)
    return tuple(outs)


def _trimmed(input_ids: torch.Tensor, attention_mask: torch.Tensor,
             rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = rows.to(input_ids.device)
    width = int(attention_mask[rows].sum(-1).max())
    return input_ids[rows, :width], attention_mask[rows, :width]
