"""Per-request sampling of the next token, and the stop conditions of a request.

Every request draws from its own seeded stream, one uniform per token, and picks the token by
inverse CDF over its filtered distribution: the same prompt and seed give the same ids
whatever else shares the batch. Logprobs are those of the temperature-scaled, unfiltered
distribution (top-k/top-p only restrict what is sampled): that is what the trainer recomputes
(`agentrl.train.actor.token_logprobs` divides by the same temperature). A greedy request
takes the argmax and reports logprobs at temperature 1.
"""

from __future__ import annotations

import torch

from agentrl.llm.engine import SamplingParams


def sample_next(logits: torch.Tensor, params: list[SamplingParams],
                uniforms: list[float]) -> tuple[list[int], list[float]]:
    """Pick one token per row of `logits` (B, V); return the ids and their logprobs."""
    device = logits.device
    logits = logits.float()
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device).unsqueeze(1)
    scaled = logits / temps
    logp = torch.log_softmax(scaled, dim=-1)
    greedy = [p.greedy for p in params]
    if all(greedy):
        tokens = logits.argmax(-1)
    else:
        filtered = filter_top_k_top_p(scaled, [p.top_k for p in params], [p.top_p for p in params])
        probs = torch.softmax(filtered, dim=-1).double()
        cdf = probs.cumsum(-1)
        u = torch.tensor(uniforms, dtype=torch.float64, device=device)
        sampled = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        sampled = sampled.clamp(max=logits.shape[-1] - 1)
        tokens = torch.where(torch.tensor(greedy, device=device), logits.argmax(-1), sampled)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()


def filter_top_k_top_p(scaled: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask logits (B, V) outside each row's top-k / top-p set with -inf."""
    top_k = [k if k and k > 0 else 0 for k in top_k]
    if not any(top_k) and all(p >= 1.0 for p in top_p):
        return scaled
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device).unsqueeze(0)
    k = torch.tensor([k if k else vocab for k in top_k], device=scaled.device).unsqueeze(1)
    drop = ranks >= k
    p = torch.tensor(top_p, device=scaled.device, dtype=torch.float32).unsqueeze(1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays in).
    drop |= (probs.cumsum(-1) - probs) >= p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter(1, order, sorted_logits)


def stop_string_hit(tokenizer, generated: list[int], stops: tuple[str, ...]) -> str | None:
    """The stop string that the latest generated id completes, or None.

    Only the tail of the reply is decoded: a stop string of n characters lies within the last
    n + 2 ids (an id decodes to at least one character, or to part of one for byte-level
    tokens). Earlier occurrences would have stopped generation before.
    """
    width = max(len(s) for s in stops) + 2
    tail = tokenizer.decode(generated[-width:], skip_special_tokens=False)
    before = tokenizer.decode(generated[-width:-1], skip_special_tokens=False)
    for s in stops:
        if s in tail and s not in before:
            return s
    return None
