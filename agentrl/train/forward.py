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

The vocabulary's logits are computed a chunk of positions at a time (`actor.logits_chunk_size`,
verl's entropy_from_logits_with_chunking): the model runs up to its final hidden states, and
the output layer, temperature, log-softmax, gathered logprob and entropy run on at most that many
positions at once. In training each chunk is checkpointed: backward recomputes its logits rather
than keeping (tokens, vocab) float32 tensors (the log-softmax, and the probabilities for the
entropy) from forward to backward. Peak memory of an update with and without it:
benchmarks/update_memory.py; logprobs, entropies and gradients equal the whole-logits pass's (tested).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

import torch
from torch.utils.checkpoint import checkpoint

from agentrl.models.lora import is_peft
from agentrl.train.prefix import shared_forward

if TYPE_CHECKING:  # peft is the optional extra `lora`
    from peft import PeftModel
    from transformers import PreTrainedModel

LOGITS_CHUNK = 1024  # positions whose logits exist at once (actor.logits_chunk_size's default)
# Architectures whose logits are the output layer applied to the final hidden states, nothing
# after it. Others (Gemma 2's soft-capping, Granite's or Cohere's logit scaling) take the
# whole-logits pass: chunking them here would skip what their forward does after the layer.
PLAIN_HEADS = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "mixtral"})


@dataclass(frozen=True)
class ForwardOptions:
    """How a role (actor, reference, critic) runs its forward passes over a batch."""

    micro_batch_size: int  # rows per pass, without a token budget
    max_tokens: int = 0  # token budget per pass (0: micro_batch_size rows); see batch.micro_batches
    packed: bool = False  # one packed row per pass (model.use_remove_padding)
    share_prefixes: bool = False  # each prefix rows share computed once per pass (train/prefix.py)
    logits_chunk: int = LOGITS_CHUNK  # positions whose logits exist at once (0: all of a pass's)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True,
                   chunk: int = LOGITS_CHUNK):
    """Logprob of each token given the ones before it, (B, T) with 0 at position 0.

    Logits are divided by `temperature` first: the engine samples from that distribution, so
    the ratio to the behaviour policy is 1 on-policy. With `entropy_grad` off the entropy is a
    statistic only: no graph is kept for it. `chunk`: positions whose logits exist at once (0:
    every position's, as the model's own forward computes them).
    """
    head = output_layer(model) if chunk > 0 else None
    if head is not None:
        hidden = final_states(model, head, input_ids=input_ids, attention_mask=attention_mask)
        outs = chunked_scores(head.layer, hidden[:, :-1], input_ids[:, 1:], temperature, with_entropy, entropy_grad,
                              chunk)
        outs = tuple(torch.nn.functional.pad(o, (1, 0)) for o in outs)
        return outs if with_entropy else outs[0]
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


@dataclass(frozen=True)
class OutputLayer:
    """A causal LM's output layer and the module whose output is the final hidden states it reads."""

    layer: torch.nn.Module  # hidden states (..., D) -> logits (..., vocab)
    body: torch.nn.Module  # the decoder: its first output is the final (normed) hidden states


def output_layer(model: torch.nn.Module) -> OutputLayer | None:
    """The output layer of `model` (a transformers causal LM, maybe peft- or DDP-wrapped) where its
    logits are that layer of the final hidden states and nothing more; None otherwise."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = cast("PeftModel", inner).get_base_model() if is_peft(inner) else inner
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEADS or not hasattr(inner, "get_decoder"):
        return None
    lm = cast("PreTrainedModel", inner)  # a transformers model: one of PLAIN_HEADS' architectures
    layer, body = lm.get_output_embeddings(), lm.get_decoder()
    return None if layer is None or body is None or body is inner else OutputLayer(layer, body)


@contextmanager
def _recorded(body: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """The final hidden states of each pass through `body` while inside, in order."""
    states: list[torch.Tensor] = []
    handle = body.register_forward_hook(lambda _m, _args, out: states.append(out[0]))
    try:
        yield states
    finally:
        handle.remove()


def final_states(model: torch.nn.Module, head: OutputLayer, **inputs: torch.Tensor | bool) -> torch.Tensor:
    """The final hidden states of one pass of `model` over `inputs`.

    The pass goes through `model` itself (not its body): a DDP wrapper must see the forward to
    reduce the gradients, peft to apply its adapters. Only the last position's logits are
    computed there (`logits_to_keep=1`); the scores come from `chunked_scores`.
    """
    with _recorded(head.body) as states:
        model(**inputs, logits_to_keep=1)
    return states[-1]


def _score(layer: torch.nn.Module, hidden: torch.Tensor, nxt: torch.Tensor, temperature: float,
           with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, ...]:
    """(logprob of `nxt`, entropy if `with_entropy`) at each of the states `hidden` (..., D): the
    whole-logits pass's arithmetic (with `layer` the identity, it is that pass)."""
    logp_all = torch.log_softmax(layer(hidden).float() / temperature, dim=-1)
    logp = logp_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
    return (logp, _entropy(logp_all, entropy_grad)) if with_entropy else (logp,)


def chunked_scores(layer: torch.nn.Module, hidden: torch.Tensor, nxt: torch.Tensor, temperature: float,
                   with_entropy: bool, entropy_grad: bool, chunk: int) -> tuple[torch.Tensor, ...]:
    """(logprobs, entropies if `with_entropy`), each shaped as `nxt` (...): of each id of `nxt`
    under the output `layer` of the states `hidden` (..., D) before it, `chunk` positions at a time."""
    shape = nxt.shape
    flat, ids = hidden.reshape(-1, hidden.shape[-1]), nxt.reshape(-1)
    # With a graph, backward recomputes each chunk's logits instead of keeping them.
    keep = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in layer.parameters()))
    score = partial(_score, layer, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
    parts = []
    for start in range(0, max(ids.numel(), 1), chunk):  # an empty input: one empty chunk
        h, n = flat[start:start + chunk], ids[start:start + chunk]
        parts.append(checkpoint(score, h, n, use_reentrant=False) if keep else score(h, n))
    return tuple(torch.cat(p).reshape(shape) for p in zip(*parts))


def logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
             packed: bool, with_entropy: bool = False, entropy_grad: bool = True, share_prefixes: bool = False,
             chunk: int = LOGITS_CHUNK):
    """`token_logprobs` of a right-padded micro-batch, through the padded or the packed pass,
    each shared prefix computed once with `share_prefixes`, `chunk` positions' logits at a time."""
    def unshared(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        run = packed_logprobs if packed else token_logprobs
        out = run(model, ids, mask, temperature, with_entropy, entropy_grad, chunk)
        return out if with_entropy else (out,)

    if not share_prefixes:
        out = unshared(input_ids, attention_mask)
        return out if with_entropy else out[0]
    head = output_layer(model) if chunk > 0 else None
    if head is None:  # the whole logits of each pass
        score = partial(_score, torch.nn.Identity(), temperature=temperature, with_entropy=with_entropy,
                        entropy_grad=entropy_grad)
        out = shared_forward(model, input_ids, attention_mask, lambda o: o.logits, score, unshared)
    else:
        score = partial(chunked_scores, head.layer, temperature=temperature, with_entropy=with_entropy,
                        entropy_grad=entropy_grad, chunk=chunk)
        with _recorded(head.body) as states:  # the cascade reads each pass's states right after it
            out = shared_forward(model, input_ids, attention_mask, lambda _o: states[-1], score, unshared,
                                 extra={"logits_to_keep": 1})
    return out if with_entropy else out[0]


def packed_rows(input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
                    temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True,
                    chunk: int = LOGITS_CHUNK):
    """`token_logprobs` of a right-padded micro-batch (B, T), computed in one packed row."""
    ids, positions, where = packed_rows(input_ids, attention_mask)
    head = output_layer(model) if chunk > 0 else None
    if head is not None:
        hidden = final_states(model, head, input_ids=ids, position_ids=positions, use_cache=False)[0]
        nxt = torch.nn.functional.pad(ids[0, 1:], (0, 1))  # the last state predicts nothing here
        outs = chunked_scores(head.layer, hidden, nxt, temperature, with_entropy, entropy_grad, chunk)
        outs = tuple(unpack_shifted(o, positions, where) for o in outs)
        return outs if with_entropy else outs[0]
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
