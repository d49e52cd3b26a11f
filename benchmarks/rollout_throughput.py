"""Rollout throughput on the real multi-turn FrozenLake workload, four ways.

The workload is what `agentrl train` collects each step, at 64 episodes: 8 groups of 8 episodes
(a group shares its env seed), up to 8 turns, the default env, agent and sampling (temperature
1, 8 new tokens per reply). It is played by

  (a) sequential: one episode after the other, one batch-1 `model.generate` per turn over the
      whole conversation so far;
  (b) lockstep: every live episode advances turn by turn, one left-padded `model.generate` per
      turn over all the conversations, re-encoding their history (seed-003's
      SyncMultiTurnRollout);
  (c) engine: agentrl's LocalEngine (continuous batching, prefix reuse);
  (d) limit: a bare decode loop over a static KV cache, no env, no scheduling, no sampling, with
      (c)'s token counts: per turn, one prefill pass and then decode passes, every row in
      lockstep, (c)'s new prompt and generated tokens of that turn spread evenly over all rows.

(a) and (b) sample with the engine's per-request seeded streams (a logits processor), so the
three play the same episodes up to float ties; the report says how many came out identical.
Reported per method: generated tokens/s over the wall time of the whole rollout (env and
chat-template work included, as `agentrl train` pays it), prefill tokens computed per new
prompt token (padding included), and peak memory (CUDA: peak allocated; CPU: peak RSS growth,
sampled). The last line is a JSON summary.

    python benchmarks/rollout_throughput.py                        # warm-started tiny default, CPU
    python benchmarks/rollout_throughput.py --model large          # hidden 512 x 8 layers, random weights
    python benchmarks/rollout_throughput.py --model qwen2.5-0.5b-shape --device cuda
    python benchmarks/rollout_throughput.py --quick                # small budget smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
import torch
from transformers import LogitsProcessor, LogitsProcessorList, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.config import TinyModelConfig, load_config  # noqa: E402
from agentrl.llm.engine import Completion, SamplingParams  # noqa: E402
from agentrl.llm.local import LocalEngine  # noqa: E402
from agentrl.llm.sampler import sample_next  # noqa: E402
from agentrl.models.tiny import build_model, build_tokenizer  # noqa: E402
from agentrl.rollout.collector import RolloutCollector, make_tasks  # noqa: E402
from agentrl.rollout.demos import corpus  # noqa: E402
from agentrl.runtime.local import load_policy, make_agent, make_env_factory, seed_everything  # noqa: E402

SHAPES = {
    "tiny": None,  # TinyModelConfig() defaults: the embedded model `agentrl train` uses
    "large": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=1408),
    "qwen2.5-0.5b-shape": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
}


# ---------------------------------------------------------------------------- the clients
class SeededSampling(LogitsProcessor):
    """Makes `model.generate` pick each row's token with the engine's per-request seeded sampler."""

    def __init__(self, params: list[SamplingParams]) -> None:
        self.params = params
        self.rngs = [random.Random(p.seed) for p in params]
        self.tokens: list[list[int]] = [[] for _ in params]
        self.logprobs: list[list[float]] = [[] for _ in params]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens, lps = sample_next(scores, self.params, [r.random() for r in self.rngs])
        for i, (t, lp) in enumerate(zip(tokens, lps)):
            self.tokens[i].append(t)
            self.logprobs[i].append(lp)
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(len(tokens)), torch.tensor(tokens, device=scores.device)] = 0.0
        return forced


def generate_rows(model, prompts: list[list[int]], params: list[SamplingParams], pad_id: int,
                  eos_id: int) -> tuple[list[Completion], int]:
    """One left-padded `model.generate` over `prompts`; (completions, prefill positions)."""
    width = max(len(p) for p in prompts)
    dev = next(model.parameters()).device
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    proc = SeededSampling(params)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=max(p.max_new_tokens for p in params),
                       do_sample=False, logits_processor=LogitsProcessorList([proc]), eos_token_id=eos_id,
                       pad_token_id=pad_id)
    out = []
    for p, toks, lps in zip(params, proc.tokens, proc.logprobs):
        stops = {eos_id, *p.stop_token_ids}
        end = next((i + 1 for i, t in enumerate(toks[: p.max_new_tokens]) if t in stops), None)
        n = end or p.max_new_tokens
        out.append(Completion(toks[:n], lps[:n], "stop" if end else "length"))
    return out, width * len(prompts)


class SequentialClient:
    """(a): every request is its own batch-1 `model.generate` over the whole prompt."""

    def __init__(self, model, pad_id: int, eos_id: int) -> None:
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id
        self.prefill_tokens = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        (out,), prefilled = generate_rows(self.model, [prompt_ids], [sampling], self.pad_id, self.eos_id)
        self.prefill_tokens += prefilled
        return out


class LockstepClient:
    """(b): the requests of all live episodes in one left-padded `model.generate` per turn."""

    def __init__(self, model, pad_id: int, eos_id: int) -> None:
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id
        self.prefill_tokens = 0
        self._pending: list = []
        self._task: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((prompt_ids, sampling, fut))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._pending:
            for _ in range(3):  # every live episode reaches its next request first
                await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            outs, prefilled = generate_rows(self.model, [b[0] for b in batch], [b[1] for b in batch],
                                            self.pad_id, self.eos_id)
            self.prefill_tokens += prefilled
            for (_, _, fut), out in zip(batch, outs):
                fut.set_result(out)


class Recorder:
    """Wraps a client and records, per episode, each request's prompt and reply lengths."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: dict[int, list[tuple[int, int]]] = defaultdict(list)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        out = await self.inner.generate(prompt_ids, sampling)
        self.calls[id(asyncio.current_task())].append((len(prompt_ids), len(out.token_ids)))
        return out

    def per_turn(self) -> tuple[list[int], list[int]]:
        """New prompt tokens and generated tokens summed per turn index over all episodes."""
        new, gen = defaultdict(int), defaultdict(int)
        for calls in self.calls.values():
            seen = 0
            for k, (plen, glen) in enumerate(calls):
                new[k] += plen - seen
                gen[k] += glen
                seen = plen + glen
        turns = range(max(new) + 1) if new else range(0)
        return [new[k] for k in turns], [gen[k] for k in turns]


# ---------------------------------------------------------------------------- the limit
def limit_loop(model, rows: int, new_per_turn: list[int], gen_per_turn: list[int]) -> tuple[int, int]:
    """(d): per turn one prefill pass and decode passes over a static KV cache, every row in
    lockstep; returns (generated tokens, prefill tokens)."""
    from agentrl.llm.kv_cache import SlotKVCache

    chunks = [max(1, round(n / rows)) for n in new_per_turn]
    steps = [max(1, round(g / rows)) for g in gen_per_turn]
    total = sum(chunks) + sum(steps)
    cache = SlotKVCache.for_model(model, total)
    cache.reserve(rows, total)
    dev = cache.device
    length, generated, prefilled = 0, 0, 0
    token = torch.full((rows, 1), 5, device=dev)
    with torch.inference_mode():
        for chunk, n_steps in zip(chunks, steps):
            ids = torch.randint(5, 100, (rows, chunk), device=dev)
            pos = torch.arange(length, length + chunk, device=dev).expand(rows, chunk)
            view = _StaticView(cache, length, chunk)
            causal = torch.arange(length + chunk, device=dev) <= pos[:1].unsqueeze(-1)
            mask = torch.zeros(causal.shape, dtype=cache.dtype, device=dev).masked_fill_(~causal, -1e30)
            out = model(input_ids=ids, position_ids=pos, past_key_values=view, use_cache=True, logits_to_keep=1,
                        attention_mask={"full_attention": mask[None]})
            token = out.logits[:, -1:].argmax(-1)
            length += chunk
            prefilled += rows * chunk
            for _ in range(n_steps - 1):  # the prefill pass gave the first token
                pos = torch.full((rows, 1), length, device=dev)
                out = model(input_ids=token, position_ids=pos, past_key_values=_StaticView(cache, length, 1),
                            use_cache=True, attention_mask={"full_attention": None})
                token = out.logits[:, -1:].argmax(-1)
                length += 1
            generated += rows * n_steps
    return generated, prefilled


class _StaticView:
    """All rows at the same length: new keys/values go into one slice, no mask needed to decode."""

    def __init__(self, cache, start: int, n: int) -> None:
        self.cache, self.start, self.end = cache, start, start + n

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        buf = self.cache.buf[layer_idx]
        buf[0, : k.shape[0], :, self.start:self.end] = k
        buf[1, : v.shape[0], :, self.start:self.end] = v
        return buf[0, : k.shape[0], :, : self.end], buf[1, : v.shape[0], :, : self.end]


# ---------------------------------------------------------------------------- measuring
class PeakMemory:
    """Peak memory while the block runs: CUDA allocated, or process RSS sampled every 2 ms."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peak = 0

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.proc, self.base, self._stop = psutil.Process(), psutil.Process().memory_info().rss, False
            self.rss = self.base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop:
            self.rss = max(self.rss, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop = True
            self._thread.join()
            self.peak = self.rss - self.base


def run_method(name: str, model, tokenizer, cfg, env_factory, tasks, device, workload=None) -> dict:
    """Play `tasks` with method `name`; returns its measurements."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    agent = make_agent(cfg, tokenizer)
    engine = None
    if name == "sequential":
        client = SequentialClient(model, pad, eos)
    elif name == "lockstep":
        client = LockstepClient(model, pad, eos)
    else:
        engine = LocalEngine.from_config(model, tokenizer, cfg.rollout, seed=cfg.seed)
        client = engine
    rec = Recorder(client)
    collector = RolloutCollector(env_factory, agent, rec)
    _sync(device)
    with PeakMemory(device) as mem:
        t0 = time.perf_counter()
        if name == "limit":
            generated, prefilled = limit_loop(model, len(tasks), *workload)
            trajs = []
        elif name == "sequential":
            trajs = [t for task in tasks for t in collector.collect([task]).trajectories]
        else:
            trajs = collector.collect(tasks).trajectories
        _sync(device)
        seconds = time.perf_counter() - t0
    if name != "limit":
        new, gen = rec.per_turn()
        generated = sum(gen)
        prefilled = engine.stats.padded_prefill_tokens + engine.stats.decode_prompt_tokens if engine else \
            client.prefill_tokens
        workload = (new, gen)
    else:
        new = workload[0]
    row = {"method": name, "seconds": seconds, "generated": generated, "tokens_per_s": generated / seconds,
           "prefill_tokens": prefilled, "new_prompt_tokens": sum(new),
           "prefill_per_new_token": prefilled / max(1, sum(new)), "peak_mem_mb": mem.peak / 2**20,
           "trajectories": trajs, "workload": workload}
    if engine is not None:
        s = engine.stats
        row.update(engine_seconds=s.seconds, real_prefill_tokens=s.prefill_tokens,
                   kv_cache_mb=engine.cache.peak_bytes / 2**20,
                   mean_decode_batch=s.decode_rows / max(1, s.decode_passes), steps=s.steps)
    return row


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- setup
def build(args, cfg, env_factory):
    """(model, tokenizer) for the requested shape and weights."""
    if args.weights == "warm":
        if args.model != "tiny":
            raise SystemExit("--weights warm exists only for --model tiny (the warm-started default)")
        model, tokenizer = load_policy(cfg, env_factory, log=lambda m: print(m, file=sys.stderr))
    else:
        tokenizer = build_tokenizer(corpus(env_factory, max_turns=cfg.env.max_turns, seed=cfg.seed),
                                    cfg.model.tiny.vocab_size)
        shape = SHAPES[args.model]
        if shape is None:
            model = build_model(TinyModelConfig(), tokenizer, seed=cfg.seed)
        else:
            qcfg = Qwen2Config(**{"vocab_size": len(tokenizer), **shape}, max_position_embeddings=4096,
                               tie_word_embeddings=True, rope_theta=10000.0, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
            torch.manual_seed(cfg.seed)
            model = Qwen2ForCausalLM(qcfg)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    return model.to(device=args.device, dtype=dtype).eval(), tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=list(SHAPES), default="tiny")
    p.add_argument("--weights", choices=["warm", "random"], default=None,
                   help="warm: the warm-started default of `agentrl train` (tiny only, cached); "
                        "random: freshly initialised (default for the other shapes)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--episodes", type=int, default=64, help="a multiple of --group-size")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--methods", default="sequential,lockstep,engine,limit")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per method (the fastest counts); "
                   "sequential runs once")
    p.add_argument("--quick", action="store_true", help="16 episodes, 3 turns, one run each, random weights")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.quick:
        args.episodes, args.max_turns, args.repeats = 16, 3, 1
    if args.weights is None:
        args.weights = "warm" if args.model == "tiny" and not args.quick else "random"
    args.device = torch.device(args.device)
    cfg = load_config(None, [f"seed={args.seed}", f"env.max_turns={args.max_turns}",
                             f"env.args.max_steps={args.max_turns}"])
    env_factory = make_env_factory(cfg)
    model, tokenizer = build(args, cfg, env_factory)
    seed_everything(args.seed)
    tasks = make_tasks(args.seed, 1, args.episodes // args.group_size, args.group_size)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    order = [m for m in ("engine", "lockstep", "sequential", "limit") if m in methods]  # limit needs engine
    if "limit" in order and "engine" not in order:
        raise SystemExit("--methods limit needs engine (it replays the engine's token counts)")
    best: dict[str, dict] = {}
    for r in range(args.repeats):
        for name in order:
            if name == "sequential" and r > 0:
                continue
            row = run_method(name, model, tokenizer, cfg, env_factory, tasks, args.device,
                             workload=best["engine"]["workload"] if name == "limit" else None)
            print(f"  run {r + 1} {name:10s} {row['seconds']:7.2f} s  {row['tokens_per_s']:8.0f} tok/s",
                  file=sys.stderr)
            if name not in best or row["seconds"] < best[name]["seconds"]:
                best[name] = row
    report(args, model, best)


def report(args, model, best: dict[str, dict]) -> None:
    """Print the table and the JSON summary."""
    params = sum(p.numel() for p in model.parameters())
    print(f"\nmodel {args.model} ({params / 1e6:.1f}M params, {args.weights} weights, {args.dtype}) on "
          f"{args.device}; {args.episodes} episodes, up to {args.max_turns} turns; torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'method':12s} {'seconds':>8s} {'gen tok':>8s} {'tok/s':>9s} {'prefill/new':>12s} {'peak MB':>8s}")
    for name, row in best.items():
        print(f"{name:12s} {row['seconds']:8.2f} {row['generated']:8d} {row['tokens_per_s']:9.0f} "
              f"{row['prefill_per_new_token']:12.2f} {row['peak_mem_mb']:8.0f}")
    eng = best.get("engine")
    summary = {"model": args.model, "weights": args.weights, "device": str(args.device), "dtype": args.dtype,
               "episodes": args.episodes, "max_turns": args.max_turns,
               "tokens_per_s": {k: round(v["tokens_per_s"], 1) for k, v in best.items()},
               "prefill_per_new_token_by_method": {k: round(v["prefill_per_new_token"], 3) for k, v in best.items()},
               "peak_mem_mb": {k: round(v["peak_mem_mb"], 1) for k, v in best.items()}}
    if eng:
        print(f"engine: {eng['steps']} steps, mean decode batch {eng['mean_decode_batch']:.1f}, busy "
              f"{eng['engine_seconds']:.2f} s of {eng['seconds']:.2f} s (the rest is env, agent and chat "
              f"template), KV cache {eng['kv_cache_mb']:.1f} MB; real prefill tokens / new prompt tokens "
              f"{eng['real_prefill_tokens'] / max(1, eng['new_prompt_tokens']):.3f}")
        summary.update(prefill_per_new_token=round(eng["prefill_per_new_token"], 3),
                       engine_busy_seconds=round(eng["engine_seconds"], 3), engine_seconds=round(eng["seconds"], 3))
        for other, key in (("lockstep", "speedup_vs_lockstep"), ("sequential", "speedup_vs_sequential"),
                           ("limit", "fraction_of_limit")):
            if other in best:
                ratio = eng["tokens_per_s"] / best[other]["tokens_per_s"]
                summary[key] = round(ratio, 3)
        if "limit" in best:
            summary["fraction_of_limit_engine_busy"] = round(
                eng["generated"] / eng["engine_seconds"] / best["limit"]["tokens_per_s"], 3)
        for other in ("lockstep", "sequential"):
            if other in best:
                same = sum(a.token_ids == b.token_ids for a, b in zip(eng["trajectories"], best[other]["trajectories"]))
                summary[f"identical_episodes_vs_{other}"] = f"{same}/{len(eng['trajectories'])}"
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
