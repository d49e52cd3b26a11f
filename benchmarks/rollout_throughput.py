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
      (c)'s token counts: per turn, one prefill pass and then decode passes over the episodes
      still playing, all in lockstep with the turn's mean chunk and reply length. Only what a
      perfect prefix cache computes is prefilled (each distinct prefix once: a group's shared
      first prompt once; the other rows get a copy of its keys/values);
  (e) replay: the episodes again, every request answered at once with (c)'s completion: the
      env, agent and chat-template work alone, which no engine can remove from a rollout;
  (f) vllm: a vLLM server (engine.kind=vllm's: `make vllm` on a CPU, --enforce-eager there),
      started once on the same model and sent the same episodes' requests over HTTP, its weights
      pushed before each collect as in training. Its generation time is not separable from the
      rollout's (it runs in other processes): its "gen" columns are the whole rollout's, its cpu
      columns count agentrl's process only, and its prefill is vLLM's own (not reported).

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
    python benchmarks/rollout_throughput.py --methods lockstep,engine,vllm   # vLLM beside ours
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
import torch
from transformers import LogitsProcessor, LogitsProcessorList, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.config import TinyModelConfig, load_config  # noqa: E402
from agentrl.llm.engine import Completion, SamplingParams  # noqa: E402
from agentrl.llm.local.engine import LocalEngine  # noqa: E402
from agentrl.llm.local.sampler import sample_next  # noqa: E402
from agentrl.models.tiny import build_model, build_tokenizer  # noqa: E402
from agentrl.rollout.collector import RolloutCollector  # noqa: E402
from agentrl.rollout.demos import corpus  # noqa: E402
from agentrl.rollout.tasks import make_tasks  # noqa: E402
from agentrl.runtime.assembly.envs import make_agent, make_env_factories, tag_plans  # noqa: E402
from agentrl.runtime.assembly.policy import load_policy  # noqa: E402
from agentrl.runtime.process import seed_everything  # noqa: E402
from agentrl.runtime.assembly.plan import plan  # noqa: E402

TAG = "frozen_lake"  # the default config's one env, tagged by its type

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
        forced[torch.arange(len(tokens), device=scores.device), torch.tensor(tokens, device=scores.device)] = 0.0
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
        self.clock = Clock()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        with self.clock:
            (out,), prefilled = generate_rows(self.model, [prompt_ids], [sampling], self.pad_id, self.eos_id)
        self.prefill_tokens += prefilled
        return out


class LockstepClient:
    """(b): the requests of all live episodes in one left-padded `model.generate` per turn."""

    def __init__(self, model, pad_id: int, eos_id: int) -> None:
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id
        self.prefill_tokens = 0
        self.clock = Clock()
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
            with self.clock:
                outs, prefilled = generate_rows(self.model, [b[0] for b in batch], [b[1] for b in batch],
                                                self.pad_id, self.eos_id)
            self.prefill_tokens += prefilled
            for (_, _, fut), out in zip(batch, outs):
                fut.set_result(out)


class ReplayClient:
    """(e) replay: answers every request at once with the completion the engine gave it, so that
    a rollout measures the env, agent and chat-template work alone (a floor for any engine)."""

    def __init__(self, replies: dict) -> None:
        self.replies = replies
        self.clock = Clock()
        self.prefill_tokens = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return self.replies[(tuple(prompt_ids), sampling.seed)]


class Recorder:
    """Wraps a client and records every episode's requests: prompt ids and generated ids."""

    def __init__(self, inner) -> None:
        self.inner = inner
        # Keyed by the episode's task object (kept alive here, so that no later episode reuses its id).
        self.calls: dict[asyncio.Task, list[tuple[list[int], list[int]]]] = defaultdict(list)
        self.replies: dict[tuple, Completion] = {}  # (prompt, seed) -> completion, for the replay

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        out = await self.inner.generate(prompt_ids, sampling)
        self.calls[asyncio.current_task()].append((list(prompt_ids), list(out.token_ids)))
        self.replies[(tuple(prompt_ids), sampling.seed)] = out
        return out

    def per_turn(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Per turn index, summed over episodes: new prompt ids (neither in an earlier prompt nor
        generated), generated ids, and the prompt ids a perfect prefix cache must still compute
        (the new ids and the turn's first id, the previous reply's last one, once per distinct
        prefix: a group's shared first prompt counts once), and the episodes still playing."""
        new, gen, ideal, rows = defaultdict(int), defaultdict(int), defaultdict(int), defaultdict(int)
        episodes = list(self.calls.values())
        seen: set[int] = set()
        chains = [[0] for _ in episodes]  # chained hash of every prefix of each conversation
        for k in range(max((len(c) for c in episodes), default=0)):
            for calls, chain in zip(episodes, chains):
                if k >= len(calls):
                    continue
                prompt, out = calls[k]
                start = len(chain) - 1  # ids of this conversation hashed so far
                new[k] += len(prompt) - start
                for t in prompt[start:]:
                    chain.append(hash((chain[-1], t)))
                for i in range(max(0, start - 1), len(prompt)):
                    if chain[i + 1] not in seen:  # chain[i + 1] ends with id i
                        seen.add(chain[i + 1])
                        ideal[k] += 1
                gen[k] += len(out)
                rows[k] += 1
                for t in out:
                    chain.append(hash((chain[-1], t)))
        turns = range(len(new))
        return ([new[k] for k in turns], [gen[k] for k in turns], [ideal[k] for k in turns],
                [rows[k] for k in turns])


# ---------------------------------------------------------------------------- the limit
def limit_loop(model, workload: dict) -> tuple[int, int]:
    """(d): the engine's workload replayed turn by turn as a bare loop over a static KV cache:
    the turn's live rows in lockstep, each growing by the turn's mean chunk and reply length.
    Only the distinct prompt ids are prefilled (as a perfect prefix cache would: those rows run,
    the other rows get a copy of their keys/values); returns (generated, prefilled)."""
    from agentrl.llm.local.kv_cache import SlotKVCache

    plan = []
    for k, (n, new, ideal, gen) in enumerate(zip(workload["rows"], workload["new"], workload["ideal"],
                                                  workload["gen"])):
        chunk = max(1, round((new + (n if k else 0)) / n))  # ids each row adds (with the last reply id)
        plan.append((n, chunk, min(n, max(1, round(ideal / chunk))), max(1, round(gen / n))))
    total = sum(chunk + steps for _, chunk, _, steps in plan)
    cache = SlotKVCache.for_model(model, total)
    cache.reserve(plan[0][0], total)
    dev = cache.device
    length, generated, prefilled = 0, 0, 0
    with torch.inference_mode():
        for rows, chunk, distinct, n_steps in plan:
            ids = torch.randint(5, 100, (distinct, chunk), device=dev)
            pos = torch.arange(length, length + chunk, device=dev).expand(distinct, chunk)
            causal = torch.arange(length + chunk, device=dev) <= pos[:1].unsqueeze(-1)
            mask = torch.zeros(causal.shape, dtype=cache.dtype, device=dev).masked_fill_(~causal, -1e30)
            out = model(input_ids=ids, position_ids=pos, past_key_values=_StaticView(cache, length, chunk),
                        use_cache=True, logits_to_keep=1, attention_mask={"full_attention": mask[None]})
            cache.buf[:, :, distinct:rows, :, length:length + chunk] = cache.buf[:, :, :1, :, length:length + chunk]
            token = out.logits[:1, -1:].argmax(-1).expand(rows, 1)
            length += chunk
            prefilled += distinct * chunk
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
class Clock:
    """Accumulates wall and process CPU seconds over the blocks it times (CPU time is far less
    disturbed by other processes on a shared machine)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "Clock":
        _sync(self.device)
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        _sync(self.device)
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


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


def run_method(name: str, model, tokenizer, cfg, tag, env_factory, tasks, device, workload=None) -> dict:
    """Play `tasks` with method `name`; returns its measurements."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    agent = make_agent(next(t for t in tag_plans(cfg) if t.tag == tag), cfg.rollout, tokenizer)
    engine = None
    if name == "sequential":
        client = SequentialClient(model, pad, eos)
    elif name == "lockstep":
        client = LockstepClient(model, pad, eos)
    elif name in ("limit", "replay"):
        client = ReplayClient(workload["replies"] if workload else {})
    elif name == "vllm":
        client = VLLM.get(id(model)) or VLLM.setdefault(id(model), vllm_engine(model, tokenizer, cfg, device))
        client.load_weights(model.state_dict())  # as in training: a push (and prefix reset) before each collect
        client.pop_metrics()
    else:
        engine = client = ENGINES.get(id(model)) or ENGINES.setdefault(id(model), timed_engine(model, tokenizer, cfg))
        # As in training: a weight update before each collect (drops the prefix caches of the
        # previous one); the engine, its buffers and its rows stay.
        engine.load_weights(model.state_dict())
        engine.stats.pop()
        engine.clock = Clock(device)
    rec = Recorder(client)
    collector = RolloutCollector.single(env_factory, agent, rec, tag=tag)
    total = Clock(device)
    with PeakMemory(device) as mem, total:
        if name == "limit":
            generated, prefilled = limit_loop(model, workload)
            trajs = []
        elif name == "sequential":
            trajs = [t for task in tasks for t in collector.collect([task]).trajectories]
        else:
            trajs = collector.collect(tasks).trajectories
    gen_clock = total if name in ("limit", "vllm") else client.clock
    if name != "limit":
        new, gen, ideal, rows = rec.per_turn()
        generated = sum(gen)
        prefilled = engine.stats.padded_prefill_tokens + engine.stats.decode_prompt_tokens if engine else \
            getattr(client, "prefill_tokens", 0)
        workload = {"new": new, "gen": gen, "ideal": ideal, "rows": rows, "replies": dict(rec.replies)}
    else:
        new = workload["new"]
    row = {"method": name, "seconds": total.wall, "cpu_seconds": total.cpu, "gen_seconds": gen_clock.wall,
           "gen_cpu_seconds": gen_clock.cpu, "generated": generated, "prefill_tokens": prefilled,
           "new_prompt_tokens": sum(new), "prefill_per_new_token": prefilled / max(1, sum(new)),
           "peak_mem_mb": mem.peak / 2**20, "trajectories": trajs, "workload": workload}
    for key in ("seconds", "cpu_seconds", "gen_seconds", "gen_cpu_seconds"):
        # replay generates nothing itself (its gen clock reads 0): report 0, not a huge rate
        row[key.replace("seconds", "tokens_per_s")] = generated / row[key] if row[key] > 1e-6 else 0.0
    if engine is not None:
        s = engine.stats
        row.update(real_prefill_tokens=s.prefill_tokens, kv_cache_mb=engine.cache.peak_bytes / 2**20,
                   mean_decode_batch=s.decode_rows / max(1, s.decode_passes), steps=s.steps,
                   passes=s.prefill_passes + s.decode_passes)
    return row


ENGINES: dict[int, LocalEngine] = {}
VLLM: dict[int, object] = {}  # the vLLM engine of a model, started once


def vllm_engine(model, tokenizer, cfg, device):
    """A VllmEngine on `model` (written to a temporary folder), as engine.kind=vllm starts it."""
    import atexit
    import tempfile

    from agentrl.llm.vllm.engine import VllmEngine
    from agentrl.llm.vllm.launch import vllm_python
    from agentrl.models.loading import save_pretrained

    work = Path(tempfile.mkdtemp(prefix="agentrl-bench-vllm-"))
    folder = save_pretrained(model, tokenizer, work / "model")
    python, source = vllm_python(None)
    print(f"  starting a vLLM server with {python} ({source})", file=sys.stderr)
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[next(model.parameters()).dtype]
    engine = VllmEngine.launch(folder, work, python=python, dtype=dtype, seed=cfg.seed,
                               args=["--enforce-eager"] if device.type == "cpu" else [], pause_mode="wait")
    atexit.register(engine.close)
    return engine


def timed_engine(model, tokenizer, cfg) -> LocalEngine:
    """A LocalEngine whose steps are timed by its `clock` attribute."""
    engine = LocalEngine.from_config(model, tokenizer, cfg.engine, cfg.rollout.max_model_len, seed=cfg.seed)
    step = engine.step

    def timed_step() -> None:
        with engine.clock:
            step()
    engine.step = timed_step
    return engine


def logprob_gap(model, trajs, temperature: float) -> tuple[float, float]:
    """(max, mean) |engine logprob - float32 recomputation| over generated ids: the trainer's
    `token_logprobs` on a float32 copy of `model`, over each whole episode."""
    from agentrl.train.actor import token_logprobs

    ref = copy.deepcopy(model).float()
    diffs = []
    with torch.inference_mode():
        for t in trajs:
            ids = torch.tensor([t.token_ids], device=next(ref.parameters()).device)
            lp = token_logprobs(ref, ids, torch.ones_like(ids), temperature=temperature)[0].cpu()
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            diffs.append((lp[mask] - torch.tensor(t.logprobs)[mask]).abs())
    d = torch.cat(diffs)
    return float(d.max()), float(d.mean())


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- setup
def build(args, cfg, env_factory):
    """(model, tokenizer) for the requested shape and weights."""
    if args.weights == "warm":
        if args.model != "tiny":
            raise SystemExit("--weights warm exists only for --model tiny (the warm-started default)")
        model, tokenizer = load_policy(plan(cfg), log=lambda m: print(m, file=sys.stderr))
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
    p.add_argument("--methods", default="sequential,lockstep,engine,limit,replay",
                   help="any of sequential, lockstep, engine, limit, replay, vllm")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method; ratios are medians over "
                   "repeats (sequential runs once)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="16 episodes, 3 turns, one run each, random weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="config overrides for the engine, e.g. engine.max_num_seqs=32")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.max_turns, args.repeats = 16, 3, 1
    if args.weights is None:
        args.weights = "warm" if args.model == "tiny" and not args.quick else "random"
    args.device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    # The default experiment's config, so that --weights warm reuses `agentrl train`'s cached model.
    over = [f"seed={args.seed}", *args.overrides]
    if args.max_turns != 8:
        over += [f"env.max_turns={args.max_turns}", f"env.args.max_steps={args.max_turns}"]
    cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", over)
    args.temperature = cfg.rollout.temperature
    (env_factory,) = make_env_factories(cfg).values()
    model, tokenizer = build(args, cfg, env_factory)
    seed_everything(args.seed)
    tasks = make_tasks(args.seed, 1, args.episodes // args.group_size, args.group_size,
                       tags=[TAG] * (args.episodes // args.group_size))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    order = [m for m in ("engine", "vllm", "lockstep", "sequential", "limit", "replay") if m in methods]
    if {"limit", "replay"} & set(order) and "engine" not in order:
        raise SystemExit("--methods limit and replay need engine (they replay its workload)")
    runs: list[dict[str, dict]] = []
    for r in range(args.repeats):
        rows: dict[str, dict] = {}
        for name in order:
            if name == "sequential" and r > 0:  # slow, and its ratio is far from any target
                rows[name] = runs[0][name]
                continue
            rows[name] = run_method(name, model, tokenizer, cfg, TAG, env_factory, tasks, args.device,
                                    workload=rows["engine"]["workload"] if name in ("limit", "replay") else None)
            print(f"  run {r + 1} {name:10s} wall {rows[name]['seconds']:7.2f} s  cpu "
                  f"{rows[name]['cpu_seconds']:7.2f} s", file=sys.stderr)
        runs.append(rows)
    report(args, model, runs)


RATIOS = {  # summary key: (method, baseline, rate); rates: tokens / wall or cpu seconds of the whole
    # rollout (env and agent included) or of generation only (engine steps, generate calls)
    "speedup_vs_lockstep": ("engine", "lockstep", "tokens_per_s"),
    "speedup_vs_lockstep_cpu": ("engine", "lockstep", "cpu_tokens_per_s"),
    "speedup_vs_lockstep_generation": ("engine", "lockstep", "gen_tokens_per_s"),
    "speedup_vs_sequential": ("engine", "sequential", "tokens_per_s"),
    "fraction_of_limit": ("engine", "limit", "tokens_per_s"),
    "fraction_of_limit_cpu": ("engine", "limit", "cpu_tokens_per_s"),
    "fraction_of_limit_generation": ("engine", "limit", "gen_tokens_per_s"),
    "fraction_of_limit_generation_cpu": ("engine", "limit", "gen_cpu_tokens_per_s"),
    "vllm_vs_engine": ("vllm", "engine", "tokens_per_s"),
    "vllm_vs_lockstep": ("vllm", "lockstep", "tokens_per_s"),
}


def report(args, model, runs: list[dict[str, dict]]) -> None:
    """Print the table (the median run of each method) and the JSON summary (median over
    repeats of each ratio, each computed between runs of the same repeat)."""
    params = sum(p.numel() for p in model.parameters())
    print(f"\nmodel {args.model} ({params / 1e6:.1f}M params, {args.weights} weights, {args.dtype}) on "
          f"{args.device}; {args.episodes} episodes, up to {args.max_turns} turns; torch threads "
          f"{torch.get_num_threads()}; {args.repeats} repeats, medians")
    print(f"{'method':11s} {'wall s':>7s} {'cpu s':>7s} {'gen s':>7s} {'gen tok':>8s} {'tok/s':>8s} "
          f"{'tok/cpu-s':>9s} {'gen tok/s':>9s} {'prefill/new':>11s} {'peak MB':>8s}")
    median = {}
    for name in runs[0]:
        rows = sorted((r[name] for r in runs), key=lambda row: row["seconds"])
        median[name] = row = rows[len(rows) // 2]
        print(f"{name:11s} {row['seconds']:7.2f} {row['cpu_seconds']:7.2f} {row['gen_seconds']:7.2f} "
              f"{row['generated']:8d} {row['tokens_per_s']:8.0f} {row['cpu_tokens_per_s']:9.0f} "
              f"{row['gen_tokens_per_s']:9.0f} {row['prefill_per_new_token']:11.2f} "
              f"{max(r[name]['peak_mem_mb'] for r in runs):8.0f}")
    summary = {"model": args.model, "weights": args.weights, "device": str(args.device), "dtype": args.dtype,
               "episodes": args.episodes, "max_turns": args.max_turns, "threads": torch.get_num_threads(),
               "tokens_per_s": {k: round(v["tokens_per_s"], 1) for k, v in median.items()},
               "generation_tokens_per_s": {k: round(v["gen_tokens_per_s"], 1) for k, v in median.items()},
               "prefill_per_new_token_by_method": {k: round(v["prefill_per_new_token"], 3) for k, v in median.items()},
               "peak_mem_mb": {k: round(max(r[k]["peak_mem_mb"] for r in runs), 1) for k in median}}
    for key, (method, base, rate) in RATIOS.items():
        if method in median and base in median:
            summary[key] = round(statistics.median(r[method][rate] / r[base][rate] for r in runs), 3)
    eng = median.get("engine")
    if eng:
        print(f"engine: {eng['steps']} steps, {eng['passes']} forward passes, mean decode batch "
              f"{eng['mean_decode_batch']:.1f}, KV cache {eng['kv_cache_mb']:.1f} MB; generation "
              f"{eng['gen_seconds']:.2f} s of {eng['seconds']:.2f} s (the rest is env, agent, chat template)")
        summary["prefill_per_new_token"] = round(eng["prefill_per_new_token"], 3)
        gap_max, gap_mean = logprob_gap(model, eng["trajectories"], args.temperature)
        print(f"engine logprobs vs float32 recomputation: max |diff| {gap_max:.2e}, mean {gap_mean:.2e}")
        summary.update(logprob_gap_max=gap_max, logprob_gap_mean=gap_mean)
        summary["engine_passes"] = eng["passes"]
        if "replay" in median and "limit" in median:
            # The env, agent and chat template run on the same cores as the model: even a
            # generation as fast as the limit leaves the rollout this fraction of the limit.
            bound = statistics.median(r["limit"]["seconds"] / (r["limit"]["seconds"] + r["replay"]["seconds"])
                                      for r in runs)
            summary["fraction_of_limit_bound_by_agent_env"] = round(bound, 3)
            summary["agent_env_seconds"] = round(median["replay"]["seconds"], 3)
        for other in ("lockstep", "sequential"):
            if other in median:
                same = sum(a.token_ids == b.token_ids for a, b in zip(eng["trajectories"], median[other]["trajectories"]))
                summary[f"identical_episodes_vs_{other}"] = f"{same}/{len(eng['trajectories'])}"
    vllm = median.get("vllm")
    if vllm:
        gap_max, gap_mean = logprob_gap(model, vllm["trajectories"], args.temperature)
        print(f"vllm logprobs vs float32 recomputation: max |diff| {gap_max:.2e}, mean {gap_mean:.2e}")
        summary.update(vllm_logprob_gap_max=gap_max, vllm_logprob_gap_mean=gap_mean)
        summary["prefill_per_new_token_by_method"].pop("vllm", None)  # vLLM's prefill is its own
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
