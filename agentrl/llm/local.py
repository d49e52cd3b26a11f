"""In-process inference engine: batches the pending requests of many concurrent episodes.

Episodes call `await engine.generate(prompt_ids, sampling)`. Requests that arrive while the
event loop runs one round of episode code are decoded together: one left-padded prefill,
then a KV-cached decode loop until every row has stopped. Sampling is per request and
reproducible: each request draws from its own seeded stream (inverse-CDF sampling on one
uniform per token), so the same prompt and seed give the same ids whatever else is batched.

Logprobs are those of the temperature-scaled, unfiltered distribution (top-k/top-p only
restrict what is sampled), which is what the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    rng: random.Random
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


@dataclass
class EngineStats:
    """Counters for perf metrics."""

    requests: int = 0
    batches: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # tokens actually run through prefill (padding included)
    generated_tokens: int = 0
    seconds: float = 0.0

    def pop(self) -> dict[str, float]:
        """Return perf/* metrics and reset."""
        out = {
            "perf/engine_requests": float(self.requests),
            "perf/engine_batches": float(self.batches),
            "perf/engine_generated_tokens": float(self.generated_tokens),
            "perf/engine_tokens_per_s": self.generated_tokens / self.seconds if self.seconds else 0.0,
        }
        self.__init__()
        return out


class LocalEngine:
    """Batched KV-cached generation with a transformers causal LM, in this process."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: tuple[int, ...],
        pad_token_id: int,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model.eval()
        self.eos_token_ids = tuple(eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", 4096)
        self.policy_version = 0
        self.stats = EngineStats()
        self._seed_rng = random.Random(seed)
        self._pending: list[_Request] = []
        self._task: asyncio.Task | None = None

    @property
    def device(self) -> torch.device:
        """Where the engine's model lives."""
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ public API
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Queue one request and wait for its completion."""
        if not prompt_ids:
            raise EngineError("generate() needs at least one prompt token")
        if len(prompt_ids) + sampling.max_new_tokens > self.max_model_len:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens + max_new_tokens={sampling.max_new_tokens} "
                f"exceeds the model's context of {self.max_model_len} tokens"
            )
        seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), sampling, loop.create_future(), random.Random(seed))
        self._pending.append(req)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._serve())
        return await req.future

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy new policy weights in (between batches); returns the new policy version."""
        self.model.load_state_dict(state_dict)
        self.policy_version += 1
        return self.policy_version

    def reseed(self, seed: int) -> None:
        """Reset the stream that gives seeds to requests that bring none."""
        self._seed_rng = random.Random(seed)

    # ------------------------------------------------------------------ scheduling
    async def _serve(self) -> None:
        while self._pending:
            # Let every episode that is ready run up to its next generate() call, so that
            # they share one batch.
            for _ in range(3):
                await asyncio.sleep(0)
            batch = self._pending[: self.max_num_seqs]
            del self._pending[: len(batch)]
            try:
                self._run_batch(batch)
            except Exception as e:  # one bad batch must fail its requests, not hang them
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(EngineError(f"generation failed: {type(e).__name__}: {e}"))
                continue
            for r in batch:
                if not r.future.done():
                    r.future.set_result(
                        Completion(r.out, r.logprobs, r.finish or "length", self.policy_version,
                                   [self.policy_version] * len(r.out))
                    )

    # ------------------------------------------------------------------ decoding
    @torch.inference_mode()
    def _run_batch(self, reqs: list[_Request]) -> None:
        t0 = time.perf_counter()
        dev = self.device
        lens = [len(r.prompt) for r in reqs]
        width = max(lens)
        ids = torch.full((len(reqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding: every row's next token is at column -1
            ids[i, width - lens[i]:] = torch.tensor(r.prompt)
            mask[i, width - lens[i]:] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         past_key_values=DynamicCache(), use_cache=True)
        last = pos[:, -1:]
        live = list(range(len(reqs)))
        for _ in range(max(r.sampling.max_new_tokens for r in reqs)):
            tokens = self._sample(out.logits[:, -1].float(), reqs)
            for i in list(live):
                r = reqs[i]
                tok = int(tokens[i])
                r.out.append(tok)
                if tok in self.eos_token_ids or tok in r.sampling.stop_token_ids:
                    r.finish = "stop"
                elif len(r.out) >= r.sampling.max_new_tokens:
                    r.finish = "length"
                if r.finish:
                    live.remove(i)
            if not live:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            last = last + 1
            out = self.model(input_ids=tokens.view(-1, 1).to(dev), attention_mask=mask, position_ids=last,
                             past_key_values=out.past_key_values, use_cache=True)
        self.stats.requests += len(reqs)
        self.stats.batches += 1
        self.stats.prompt_tokens += sum(lens)
        self.stats.prefill_tokens += width * len(reqs)
        self.stats.generated_tokens += sum(len(r.out) for r in reqs)
        self.stats.seconds += time.perf_counter() - t0

    def _sample(self, logits: torch.Tensor, reqs: list[_Request]) -> torch.Tensor:
        """Pick one token per row (B, V) -> (B,), appending each row's logprob to its request."""
        temps = torch.tensor([1.0 if r.sampling.greedy else r.sampling.temperature for r in reqs],
                             device=logits.device).unsqueeze(1)
        scaled = logits / temps
        logp = torch.log_softmax(scaled, dim=-1)
        filtered = _filter_top_k_top_p(scaled, reqs)
        probs = torch.softmax(filtered, dim=-1).double()
        u = torch.tensor([r.rng.random() for r in reqs], dtype=torch.float64, device=logits.device)
        cdf = probs.cumsum(-1)
        sampled = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        sampled = sampled.clamp(max=logits.shape[-1] - 1)
        greedy = torch.tensor([r.sampling.greedy for r in reqs], device=logits.device)
        tokens = torch.where(greedy, logits.argmax(-1), sampled)
        chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        for r, lp in zip(reqs, chosen):
            if r.finish is None:
                r.logprobs.append(float(lp))
        return tokens.cpu()


def _filter_top_k_top_p(scaled: torch.Tensor, reqs: list[_Request]) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p set with -inf."""
    top_k = [r.sampling.top_k if r.sampling.top_k and r.sampling.top_k > 0 else 0 for r in reqs]
    top_p = [r.sampling.top_p for r in reqs]
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
