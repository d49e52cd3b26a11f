"""In-process inference engine: continuous batching and prefix reuse for multi-turn rollouts.

Episodes call `await engine.generate(prompt_ids, sampling)`. The engine serves them in steps;
between two steps it yields to the event loop, so an episode whose reply just finished steps
its env and sends its next request, which joins the running batch at the next step. One step:

    admit waiting requests (bounded rows and tokens; prefix match: take over a parked sequence
    or copy a shared prefix)  ->  prefill the new ids of joining sequences (chunked to
    max_num_batched_tokens)  ->  decode one token for every running sequence  ->  sample per
    request  ->  finish requests (EOS, stop ids or strings, length) and park their KV.

The KV cache is the slot cache of `kv_cache.py`, so the model stays a transformers model.
`load_weights` takes a lock that every step holds: weights change between two steps, never
inside one, and every generated id records the version that produced it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any, Literal, cast

import torch
from transformers import PreTrainedModel

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.local.decode_graphs import DecodeGraphs, decode_logits
from agentrl.llm.local.kv_cache import SUPPORTED_LAYER_TYPES, SlotKVCache, attention_masks, text_config
from agentrl.llm.local.sampler import sample_next, stop_string_hit
from agentrl.llm.local.scheduler import Request, Scheduler, Sequence, check_context
from agentrl.llm.local.stats import EngineStats
from agentrl.models.lora import is_adapter_state, load_adapter_state, strip_adapters
from agentrl.tokenizer import Tokenizer


class LocalEngine:
    """Continuous-batching generation with a transformers causal LM, in this process."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: tuple[int, ...],
        pad_token_id: int,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_total_tokens: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        kv_on_weight_update: Literal["recompute", "keep"] = "recompute",
        tokenizer: Tokenizer | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
    ) -> None:
        self.model = model.eval()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.tokenizer = tokenizer  # only needed to detect stop strings
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_on_weight_update = kv_on_weight_update
        config = text_config(model)
        model_len: int = getattr(config, "max_position_embeddings", 4096)
        self.max_model_len = max_model_len or model_len
        self.vocab_size = config.vocab_size
        self.layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        self.sliding_window = getattr(config, "sliding_window", None)
        _check_model(model, self.layer_types)
        self.cache = SlotKVCache.for_model(model, self.max_model_len)
        self.graphs = None if enforce_eager or self.cache.device.type != "cuda" else DecodeGraphs(self, capture=True)
        self.sched = Scheduler(self.cache, max_num_seqs=max_num_seqs,
                               max_total_tokens=max_total_tokens or max_num_seqs * self.max_model_len,
                               enable_prefix_caching=enable_prefix_caching)
        self.policy_version = 0
        self.stats = EngineStats()
        self._seed_rng = random.Random(seed)
        self._lock = threading.Lock()
        self._abort = False
        self._closed = False
        self._task: asyncio.Task | None = None

    @classmethod
    def from_config(cls, model: torch.nn.Module, tokenizer: Tokenizer, engine: Any, max_model_len: int,
                    seed: int) -> LocalEngine:
        """An engine for `model` with the knobs of an `EngineConfig` (max_model_len 0: the model's)."""
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        if pad is None:
            raise EngineError("the tokenizer has no pad_token_id; set its pad_token (eos_token is the usual stand-in)")
        return cls(model, eos_token_ids=(eos,) if eos is not None else (), pad_token_id=pad,
                   max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                   max_total_tokens=engine.max_total_tokens, max_model_len=max_model_len,
                   enable_prefix_caching=engine.enable_prefix_caching,
                   kv_on_weight_update=engine.kv_on_weight_update, tokenizer=tokenizer, seed=seed,
                   enforce_eager=engine.enforce_eager)

    @property
    def device(self) -> torch.device:
        """Where the engine's model (and its KV cache) lives."""
        return self.cache.device

    # ------------------------------------------------------------------ public API
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Queue one request; it joins the running batch at the next step. Waits for its completion."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.submit(prompt_ids, sampling, future)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._serve())
        return await future

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, future: asyncio.Future) -> None:
        """Queue one request whose Completion resolves `future`, without starting the serving
        loop: for a host that runs `serve_step` itself (an engine actor driven by its clients)."""
        req = self._make_request(prompt_ids, sampling)
        req.future = future
        self.sched.waiting.append(req)

    def has_work(self) -> bool:
        """Whether requests wait or run."""
        return self.sched.has_work()

    def load_weights(self, state_dict: dict[str, Any]) -> int:
        """Copy new policy weights in between two steps; returns the new policy version.

        `state_dict` is the model's full state dict, or a LoRA adapter state (models/lora.py):
        the first one injects adapter layers into the engine's base model, later ones copy
        only the adapter tensors.

        With kv_on_weight_update=recompute, parked prefix caches are dropped and running
        sequences recompute their KV under the new weights at the next step; with keep, the
        old KV is reused and `Completion.kv_version` reports the oldest version it came from.
        """
        with self._lock:
            if is_adapter_state(state_dict):  # LoRA: only the adapters changed; the base stays
                self.model = load_adapter_state(self.model, state_dict).eval()
                if self.graphs is not None:  # the first push adds modules: capture again
                    self.graphs.invalidate()
            else:
                if hasattr(self.model, "peft_config"):  # whole weights after adapters: the base model again
                    self.model = strip_adapters(self.model)
                    if self.graphs is not None:
                        self.graphs.invalidate()
                self.model.load_state_dict(state_dict)
            self.policy_version += 1
            if self.kv_on_weight_update == "recompute":
                self.sched.drop_parked()
                for seq in self.sched.active:
                    seq.cached, seq.kv_version = 0, self.policy_version
            return self.policy_version

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix and return the KV cache to the state of a new engine (vLLM's
        name); False, and nothing changed, while requests wait or run.

        The trainer calls it after an evaluation and at each checkpoint, so what a step after a
        checkpoint generates never depends on whether the process restarted in between.
        """
        with self._lock:
            return self.sched.reset()

    def pop_metrics(self) -> dict[str, float]:
        """perf/engine_* metrics since the last call (the counters restart)."""
        return self.stats.pop()

    def pop_discarded_tokens(self) -> int:
        """Ids decoded for requests whose caller stopped waiting, since the last call
        (rollout/discarded_tokens/aborted)."""
        n, self.stats.discarded_tokens = self.stats.discarded_tokens, 0
        return n

    def close(self) -> None:
        """Abort what is queued or running (at the next step) and drop cached prefixes when idle;
        later requests fail with EngineError."""
        self._closed = True
        self.abort()
        self.reset_prefix_cache()

    def abort(self) -> None:
        """Finish every queued and running request at the next step with finish_reason 'abort'
        and the ids generated so far (callable from another thread)."""
        self._abort = True

    def reseed(self, seed: int) -> None:
        """Reset the stream that gives seeds to requests that bring none."""
        self._seed_rng = random.Random(seed)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue: policy version and the seed stream."""
        return {"policy_version": self.policy_version, "seed_rng": self._seed_rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.policy_version = int(state["policy_version"])
        self._seed_rng.setstate(state["seed_rng"])

    # ------------------------------------------------------------------ requests
    def _make_request(self, prompt_ids: list[int], sampling: SamplingParams) -> Request:
        if self._closed:
            raise EngineError("the engine is closed")
        if not prompt_ids:
            raise EngineError("generate() needs at least one prompt token")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            bad = next(t for t in prompt_ids if not 0 <= t < self.vocab_size)
            raise EngineError(f"prompt token id {bad} is outside the model's vocabulary (0..{self.vocab_size - 1})")
        if sampling.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens={sampling.max_new_tokens} must be >= 1")
        if not sampling.greedy and sampling.temperature <= 0:
            raise EngineError(f"temperature={sampling.temperature} must be > 0 (or set greedy=True)")
        if not 0.0 < sampling.top_p <= 1.0:
            raise EngineError(f"top_p={sampling.top_p} must be in (0, 1]")
        if sampling.stop and self.tokenizer is None:
            raise EngineError("stop strings need the engine to have a tokenizer (LocalEngine(tokenizer=...))")
        max_new = check_context(len(prompt_ids), sampling, self.max_model_len)
        seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt_ids)
        return Request(list(prompt_ids), sampling, max_new, random.Random(seed))

    async def _serve(self) -> None:
        while self.sched.has_work():
            self.serve_step()
            # Let every episode whose request just finished run up to its next request.
            await asyncio.sleep(0)

    def serve_step(self) -> None:
        """One `step`; a step that raises fails the requests it held instead of hanging them."""
        try:
            self.step()
        except Exception as e:
            err = EngineError(f"generation failed: {type(e).__name__}: {e}")
            for req in self.sched.fail_all():
                _resolve(req, exception=err)

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def step(self) -> None:
        """Admit, prefill, decode one token per running sequence, sample, finish."""
        with self._lock:
            t0 = time.perf_counter()
            self._drop_finished_by_caller()
            for req in self.sched.admit(self.policy_version):
                _resolve(req, exception=EngineError(
                    f"a request of {len(req.prompt)} prompt + {req.max_new} new tokens can never fit the KV "
                    f"budget of {self.sched.max_total_tokens} tokens (engine.max_total_tokens)"))
            self.stats.peak_running = max(self.stats.peak_running, len(self.sched.active))
            self.stats.peak_kv_tokens = max(self.stats.peak_kv_tokens, self.sched.used_tokens())
            ready: list[Sequence] = []
            logits: list[torch.Tensor] = []
            plan = self._prefill_plan()
            if plan:
                done, out = self._prefill(plan)
                ready += done
                logits.append(out)
            for seq in self.sched.active:
                if seq.fork_from is not None:
                    self.sched.resolve_fork(seq)
            decode = [s for s in self.sched.active if not s.waiting_on_source and s.uncached == 1]
            if decode:
                logits.append(self._decode(decode))  # sorts `decode` by row, the order of its logits
                ready += decode
            if ready:
                batch = torch.cat(logits) if len(logits) > 1 else logits[0]
                ready, batch = self._add_twins(ready, batch)
                self._sample_and_finish(ready, batch)
            self.stats.steps += 1
            self.stats.seconds += time.perf_counter() - t0

    def _add_twins(self, ready: list[Sequence], logits: torch.Tensor) -> tuple[list[Sequence], torch.Tensor]:
        """Twins whose source got its logits this step take the same logits (and copy its KV)."""
        twins = [(s, s.twin_of) for s in self.sched.active if s.twin_of is not None]
        if not twins:
            return ready, logits
        where = {seq: i for i, seq in enumerate(ready)}
        rows = []
        for seq, source in twins:
            i = where.get(source)
            if self.sched.resolve_twin(seq, source_ready=i is not None):
                ready.append(seq)
                rows.append(i)
        if rows:
            logits = torch.cat([logits, logits[torch.tensor(rows, device=logits.device)]])
        return ready, logits

    def _prefill_plan(self) -> list[tuple[Sequence, int]]:
        """(sequence, ids to prefill now) in admission order: the left-padded pass, rows times
        its widest chunk, stays within max_num_batched_tokens (the first chunk is cut to fit)."""
        plan: list[tuple[Sequence, int]] = []
        budget, width = self.max_num_batched_tokens, 0
        for seq in sorted((s for s in self.sched.active if not s.waiting_on_source and s.uncached > 1),
                          key=lambda s: s.admitted):
            n = min(seq.uncached, budget)
            if max(width, n) * (len(plan) + 1) > budget:
                continue  # does not fit beside the chunks already planned; it runs at a later step
            plan.append((seq, n))
            width = max(width, n)
        return plan

    def _prefill(self, plan: list[tuple[Sequence, int]]) -> tuple[list[Sequence], torch.Tensor]:
        """Run the chunks of `plan`, left-padded into one pass; logits of the completed ones."""
        width = max(n for _, n in plan)
        ids, pos = [], []
        for seq, n in plan:
            pad = width - n
            ids.append([self.pad_token_id] * pad + seq.tokens[seq.cached:seq.cached + n])
            pos.append([-1] * pad + list(range(seq.cached, seq.cached + n)))
        dev = self.device
        ids_t = torch.tensor(ids, device=dev)
        pos_t = torch.tensor(pos, device=dev)
        kv_len = max(seq.cached + n for seq, n in plan)
        rows = torch.tensor([seq.row for seq, _ in plan], device=dev)
        view = self.cache.prefill_view(rows, pos_t, pos_t >= 0, kv_len)
        masks = attention_masks(pos_t, kv_len, self.cache.dtype, self.layer_types, self.sliding_window)
        out = self.model(input_ids=ids_t, position_ids=pos_t.clamp(min=0), attention_mask=masks,
                         past_key_values=view, use_cache=True, logits_to_keep=1).logits[:, -1]
        done = []
        for i, (seq, n) in enumerate(plan):
            seq.cached += n
            if seq.uncached == 0:
                done.append(i)
        self.stats.prefill_passes += 1
        self.stats.prefill_tokens += sum(n for _, n in plan)
        self.stats.padded_prefill_tokens += width * len(plan)
        return [plan[i][0] for i in done], out[done]

    def _decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One token for each of `seqs` (sorted by row in place); their next-token logits."""
        self.sched.arrange_decode_rows(seqs)
        seqs.sort(key=lambda s: s.row)
        if self.graphs is not None:
            out = self.graphs.decode([s.tokens[-1] for s in seqs], [s.cached for s in seqs], len(self.sched.rows))
        else:
            ids = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.device)
            pos = torch.tensor([s.cached for s in seqs], device=self.device)
            rows = torch.arange(len(seqs), device=self.device)
            out = decode_logits(self, ids, pos, rows, max(s.cached for s in seqs) + 1)
        for s in seqs:
            if s.cached < len(s.active_request.prompt):  # a prompt id: the last one of a prompt served from cache
                self.stats.prefill_tokens += 1
                self.stats.decode_prompt_tokens += 1
            s.cached += 1
        self.stats.decode_passes += 1
        self.stats.decode_rows += len(seqs)
        return out

    def _sample_and_finish(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        reqs = [s.active_request for s in seqs]
        tokens, logprobs = sample_next(logits, [r.sampling for r in reqs], [r.rng.random() for r in reqs])
        version = self.policy_version
        for seq, req, tok, lp in zip(seqs, reqs, tokens, logprobs):
            req.out.append(tok)
            req.logprobs.append(lp)
            req.versions.append(version)
            seq.tokens.append(tok)
            if self.sched.enable_prefix_caching:
                self.sched.index.add(seq)
            self._check_stop(req, tok)
            if req.finish is not None:
                self._finish(seq)
        self.stats.generated_tokens += len(seqs)

    def _check_stop(self, req: Request, tok: int) -> None:
        s = req.sampling
        if tok in self.eos_token_ids:
            req.finish = "stop"
        elif tok in s.stop_token_ids:
            req.finish, req.stop_reason = "stop", tok
        elif s.stop and (hit := stop_string_hit(self.tokenizer, req.out, s.stop)) is not None:
            req.finish, req.stop_reason = "stop", hit
        elif len(req.out) >= req.max_new:
            req.finish = "length"

    def _finish(self, seq: Sequence) -> None:
        req = seq.active_request
        self.stats.cached_prompt_tokens += req.reused
        self.sched.finish(seq)
        _resolve(req, Completion(req.out, req.logprobs, req.finish or "abort",
                                 req.versions[-1] if req.versions else self.policy_version, req.versions,
                                 stop_reason=req.stop_reason, kv_version=seq.kv_version))

    def _drop_finished_by_caller(self) -> None:
        """Apply `abort()`, and forget requests whose caller stopped waiting (cancelled)."""
        abort, self._abort = self._abort, False
        for req in list(self.sched.waiting):
            if abort or req.future.done():
                self.sched.waiting.remove(req)
                req.finish = "abort"
                _resolve(req, Completion([], [], "abort", self.policy_version, []))
        for seq in list(self.sched.active):
            req = seq.active_request
            if abort or req.future.done():
                if req.future.done():  # no one takes its ids: they reach no loss
                    self.stats.discarded_tokens += len(req.out)
                req.finish = "abort"
                self._finish(seq)


def _resolve(req: Request, completion: Completion | None = None, exception: Exception | None = None) -> None:
    fut = req.future
    if fut is None or fut.done():
        return
    if exception is not None:
        fut.set_exception(exception)
    else:
        fut.set_result(completion)


def _check_model(model: torch.nn.Module, layer_types: set[str]) -> None:
    """The engine hands the model 4D additive masks: it needs sdpa or eager attention and
    full or sliding-window attention layers."""
    unsupported = layer_types - set(SUPPORTED_LAYER_TYPES)
    if unsupported:
        raise EngineError(f"the local engine supports {', '.join(SUPPORTED_LAYER_TYPES)} layers; this model "
                          f"has {', '.join(sorted(unsupported))}")
    if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        cast(PreTrainedModel, model).set_attn_implementation("sdpa")  # a transformers model: it has the switch
