"""The GPU suite: real model shapes, bfloat16, LoRA, on the FrozenLake workload of `agentrl train`.

For each shape (Qwen2.5-0.5B and 1.5B, built locally by agentrl.models.qwen_shape: public config
numbers, random weights, Qwen's chat template; the folder is cached under --model-dir) it
measures

  rollout    tokens/s of the engine (LocalEngine) vs HF `generate` in lockstep per turn vs a bare
             static-KV decode loop over the engine's own token counts (the limit), via
             benchmarks/rollout_throughput.py (targets: engine >= 5x lockstep, >= 0.7 of the limit);
             the engine and lockstep play the episodes once untimed first (warm kernels, allocator
             and the engine's CUDA graphs, as every step of a run but the first finds them);
             `engine.enforce_eager=true` measures the engine without CUDA graphs;
  precision  the engine/trainer logprob gap over the rollout's generated ids, for the trainer on
             bfloat16 weights (what model.dtype=bfloat16 does: float32 master copies in the
             optimizer) and on float32 weights under bfloat16 autocast (the alternative);
  update     trainer tokens/s of one PPO update (Actor.update), full fine-tuning and LoRA, vs a
             plain fwd+bwd+AdamW loop over the same micro-batches (target: >= 0.6), the peak
             memory of each, and the time of one weight sync of each to an engine (the full
             state dict vs the LoRA adapter);
  staleness  the step time of a FrozenLake run on the shape, rollout.max_staleness 0 vs 1.

On a CUDA device timings synchronise the device and memory is torch.cuda.max_memory_allocated.
Without one (or with --quick) it runs a reduced shape with tiny budgets, so CI can smoke it;
its numbers then say nothing about a GPU. The last line is a JSON summary.

    python benchmarks/gpu_suite.py                                   # CUDA: both shapes, bfloat16
    python benchmarks/gpu_suite.py --shapes qwen2.5-0.5b --sections rollout,update
    python benchmarks/gpu_suite.py --quick                           # CPU smoke (reduced shape)
    python benchmarks/gpu_suite.py actor.max_tokens_per_micro_batch=16384   # config overrides
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import gc
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import rollout_throughput as rt  # noqa: E402  (its clients, limit loop, clocks and memory probes)

from agentrl.config import LoraConfig, load_config  # noqa: E402
from agentrl.models.embedded import cache_root  # noqa: E402
from agentrl.models.loading import load_pretrained  # noqa: E402
from agentrl.models.qwen_shape import QWEN_SHAPES, build_qwen_shaped  # noqa: E402
from agentrl.registry import load_builtins  # noqa: E402
from agentrl.rollout.tasks import make_tasks  # noqa: E402
from agentrl.runtime.assembly.envs import make_env_factories  # noqa: E402
from agentrl.runtime.assembly.learners import build_learners  # noqa: E402
from agentrl.runtime.assembly.plan import plan  # noqa: E402
from agentrl.runtime.process import seed_everything  # noqa: E402
from agentrl.train.actor import Actor  # noqa: E402
from agentrl.train.batch import micro_batches, pack  # noqa: E402
from agentrl.train.forward import logprobs, token_logprobs  # noqa: E402

TAG = rt.TAG
# The reduced shape of --quick (CPU): the 0.5B config with small widths, 2 layers, a small vocabulary.
QUICK_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1024)
# What the suite trains with on a GPU unless overridden (verl's dynamic bsz, and its
# use_remove_padding where flash-attention's variable-length kernels are installed).
GPU_OVERRIDES = ["actor.max_tokens_per_micro_batch=8192",
                 *(["model.use_remove_padding=true"] if importlib.util.find_spec("flash_attn") else [])]


# ---------------------------------------------------------------------------- sections
def section_rollout(ctx: dict) -> dict:
    """Engine vs lockstep generate vs the bare loop, on the FrozenLake workload."""
    rows = {}
    for name in ("engine", "lockstep", "limit"):
        workload = rows["engine"]["workload"] if name == "limit" else None
        if name != "limit":  # once untimed: kernels, allocator, captured graphs, as a run's later steps find them
            rt.run_method(name, ctx["model"], ctx["tokenizer"], ctx["cfg"], TAG, ctx["env_factory"], ctx["tasks"],
                          ctx["device"])
        rows[name] = rt.run_method(name, ctx["model"], ctx["tokenizer"], ctx["cfg"], TAG, ctx["env_factory"],
                                   ctx["tasks"], ctx["device"], workload=workload)
    ctx["trajectories"] = rows["engine"]["trajectories"]
    eng = rows["engine"]
    return {"engine_tokens_per_s": round(eng["tokens_per_s"], 1),
            "lockstep_tokens_per_s": round(rows["lockstep"]["tokens_per_s"], 1),
            "limit_tokens_per_s": round(rows["limit"]["tokens_per_s"], 1),
            "speedup_vs_lockstep": round(eng["tokens_per_s"] / rows["lockstep"]["tokens_per_s"], 3),
            "fraction_of_limit": round(eng["tokens_per_s"] / rows["limit"]["tokens_per_s"], 3),
            "generated_tokens": eng["generated"],
            "peak_mem_mb": {k: round(v["peak_mem_mb"], 1) for k, v in rows.items()}}


def section_precision(ctx: dict) -> dict:
    """|engine logprob - trainer logprob| over generated ids, the engine on bfloat16 weights: the
    trainer on the same bfloat16 weights (model.dtype=bfloat16: float32 masters in the optimizer),
    on the float32 weights under bfloat16 autocast (the alternative), and in float32."""
    fp32 = copy.deepcopy(ctx["model"]).float()  # the float32 weights either way keeps
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)  # what the engine (and a bfloat16 trainer) holds
    trajs = rt.run_method("engine", bf16, ctx["tokenizer"], ctx["cfg"], TAG, ctx["env_factory"], ctx["tasks"],
                          ctx["device"])["trajectories"]
    rt.ENGINES.pop(id(bf16), None)
    out = {}
    for name, model, autocast in (("bf16_weights", bf16, False), ("fp32_autocast", fp32, True),
                                  ("fp32", fp32, False)):
        diffs = []
        for t in trajs:
            ids = torch.tensor([t.token_ids], device=ctx["device"])
            region = torch.autocast(ctx["device"].type, dtype=torch.bfloat16) if autocast else nullcontext()
            with torch.no_grad(), region:
                lp = token_logprobs(model, ids, torch.ones_like(ids), ctx["cfg"].rollout.temperature)[0].float().cpu()
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            diffs.append((lp[mask] - torch.tensor(t.logprobs)[mask]).abs())
        d = torch.cat(diffs)
        out[name] = {"max": round(float(d.max()), 6), "mean": round(float(d.mean()), 6)}
    del bf16, fp32
    return {"engine_dtype": "bfloat16", "generated_ids": sum(int(sum(t.loss_mask)) for t in trajs), "gap": out}


def section_update(ctx: dict) -> dict:
    """One PPO update (full, LoRA) vs a plain fwd+bwd+AdamW loop over the same micro-batches, and
    the time of one weight sync of each to an engine (the full state dict, the adapter)."""
    cfg, device = ctx["cfg"], ctx["device"]
    batch = pack(ctx["trajectories"], ctx["tokenizer"].pad_token_id)
    tokens = int(batch.attention_mask.sum())
    out = {"tokens": tokens, "episodes": batch.size, "sync": {}}
    for name in ("plain", "full", "lora"):
        gc.collect()
        variant = copy.deepcopy(cfg)  # plain and full: no LoRA; lora: the configured one, else rank 32
        lora = cfg.model.lora if cfg.model.lora.enabled else LoraConfig(rank=32, alpha=64.0)  # verl: r32 ~ full on 0.5B
        variant.model.lora = lora if name == "lora" else LoraConfig()
        with rt.PeakMemory(device) as mem:  # the variant's weights, optimizer state and activations
            # The learners exactly as a run builds them (LoRA, checkpointing, attention kernels).
            actor, _, _ = build_learners(plan(variant), copy.deepcopy(ctx["model"]), device)
            if name == "plain":
                run = _plain_loop(actor, batch, device)
            else:
                batch.old_logprobs = actor.compute_logprobs(batch)
                batch.advantages = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0))
                run = partial(actor.update, batch)
            run()  # warm-up: kernels, allocator, optimizer state
            with rt.Clock(device) as clock:
                run()
        out[name] = {"seconds": round(clock.wall, 4), "tokens_per_s": round(tokens / clock.wall, 1),
                     "cpu_seconds": round(clock.cpu, 4), "peak_mem_mb": round(mem.peak / 2**20, 1)}
        if name != "plain":
            out["sync"][name] = _sync_seconds(ctx, actor)
        del actor, run
    out["full_vs_plain"] = round(out["full"]["tokens_per_s"] / out["plain"]["tokens_per_s"], 3)
    out["lora_vs_full_time"] = round(out["lora"]["seconds"] / out["full"]["seconds"], 3)
    # process CPU time: on a shared CPU machine far less disturbed by other work than wall time
    out["full_vs_plain_cpu"] = round(out["plain"]["cpu_seconds"] / out["full"]["cpu_seconds"], 3)
    out["lora_vs_full_cpu"] = round(out["lora"]["cpu_seconds"] / out["full"]["cpu_seconds"], 3)
    out["lora_vs_full_memory"] = round(out["lora"]["peak_mem_mb"] / max(out["full"]["peak_mem_mb"], 1e-9), 3)
    return out


def _sync_seconds(ctx: dict, actor: Actor) -> dict:
    """Median time of pushing the actor's weights into an engine (what the trainer's sync does)."""
    from agentrl.llm.local.engine import LocalEngine

    engine = LocalEngine.from_config(copy.deepcopy(ctx["model"]), ctx["tokenizer"], ctx["cfg"].engine,
                                     ctx["cfg"].rollout.max_model_len, seed=0)
    engine.load_weights(actor.engine_weights())  # the first adapter push injects the adapter layers
    times = []
    for _ in range(3):
        with rt.Clock(ctx["device"]) as clock:
            engine.load_weights(actor.engine_weights())
        times.append(clock.wall)
    n = sum(v.numel() for v in actor.engine_weights().values() if torch.is_tensor(v))
    return {"seconds": round(statistics.median(times), 5), "tensor_elements": n}


def section_staleness(ctx: dict, steps: int) -> dict:
    """Mean step time of a FrozenLake run on this shape, max_staleness 0 vs 1 (first step left out)."""
    from agentrl.metrics import read_jsonl
    from agentrl.runtime.local import train

    out = {}
    for k in (0, 1):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", [
                *ctx["overrides"], f"model.path={ctx['folder']}", f"model.dtype={ctx['dtype']}",
                f"trainer.total_steps={steps}", "trainer.test_freq=0", "trainer.save_freq=0",
                f"trainer.eval_episodes={ctx['eval_episodes']}", "trainer.progress=false", "trainer.logger=[jsonl]",
                f"rollout.max_staleness={k}", f"run_dir={tmp}/run", f"device={ctx['device'].type}"])
            train(cfg, log=lambda m: None)
            rows = [r for r in read_jsonl(Path(tmp) / "run" / "metrics.jsonl") if "perf/step_seconds" in r]
        seconds = [r["perf/step_seconds"] for r in rows[1:]] or [rows[0]["perf/step_seconds"]]
        out[f"k{k}_step_seconds"] = round(statistics.mean(seconds), 3)
    out["k1_vs_k0"] = round(out["k1_step_seconds"] / out["k0_step_seconds"], 3)
    return out


def _plain_loop(actor: Actor, batch, device: torch.device):
    """fwd + bwd + AdamW over the actor's own micro-batches, weights and optimizer (float32 masters
    included): next-token cross-entropy on the loss mask, none of PPO's extra work (ratios,
    clipping, entropy, checks, statistics)."""
    model, o = actor.model.train(), actor.options
    groups = micro_batches(batch.attention_mask, torch.arange(batch.size), o.micro_batch_size, o.max_tokens, o.packed)

    def run() -> None:
        actor.optimizer.zero_grad(set_to_none=True)
        for rows in groups:
            mb = batch.select(rows).to(device)
            logp = logprobs(model, mb.input_ids, mb.attention_mask, 1.0, o.packed)  # the same pass, padded or packed
            (-(logp * mb.loss_mask).sum() / mb.loss_mask.sum().clamp(min=1)).backward()
        actor.master.grads_to_master()
        actor.optimizer.step()
        actor.master.master_to_model()
    return run


# ---------------------------------------------------------------------------- driver
def prepare(shape: str, args, device: torch.device) -> dict:
    """The shape's model folder (built once), the model on `device`, the config and the tasks."""
    if args.model_path:  # a folder of your own (a downloaded Qwen2.5-Instruct, a trained run's export)
        folder = Path(args.model_path).expanduser()
    else:
        name = f"{shape}-quick" if args.quick else shape
        root = Path(args.model_dir).expanduser() if args.model_dir else cache_root(load_config()) / "qwen-shapes"
        folder = root / name
        if not (folder / "config.json").is_file():
            print(f"building {name} at {folder}", file=sys.stderr)
            build_qwen_shaped(shape, folder, seed=args.seed, **(QUICK_SHAPE if args.quick else {}))
    over = [f"seed={args.seed}", *([] if args.quick or device.type != "cuda" else GPU_OVERRIDES), *args.overrides]
    if args.max_turns != 8:
        over += [f"env.max_turns={args.max_turns}", f"env.args.max_steps={args.max_turns}"]
    if args.quick:  # the staleness runs' batches too
        over += [f"rollout.batch_size={args.episodes}", f"rollout.group_size={args.group_size}",
                 f"actor.ppo_mini_batch_size={args.episodes}", f"actor.micro_batch_size={args.episodes}"]
    cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", over)
    load_builtins()
    (env_factory,) = make_env_factories(cfg).values()
    model, tokenizer = load_pretrained(folder, args.dtype)
    seed_everything(args.seed)
    tasks = make_tasks(args.seed, 1, args.episodes // args.group_size, args.group_size,
                       tags=[TAG] * (args.episodes // args.group_size))
    return {"cfg": cfg, "model": model.to(device).eval(), "tokenizer": tokenizer, "env_factory": env_factory,
            "tasks": tasks, "device": device, "folder": folder, "dtype": args.dtype, "overrides": over,
            "eval_episodes": args.eval_episodes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(QWEN_SHAPES), help="comma-separated: " + ", ".join(QWEN_SHAPES))
    p.add_argument("--sections", default="rollout,precision,update,staleness")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="training steps of each staleness run")
    p.add_argument("--eval-episodes", type=int, default=8)
    p.add_argument("--model-dir", default=None, help="where the shapes are built once (default: qwen-shapes in "
                   "agentrl's model cache, $AGENTRL_CACHE or ~/.cache/agentrl)")
    p.add_argument("--model-path", default=None, help="measure this Hugging Face folder instead of the shapes")
    p.add_argument("--quick", action="store_true", help="reduced shape, 4 episodes, 2 turns, 2 steps (CPU smoke)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.lora.rank=32")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda" and not args.model_path:
        args.quick = True  # a full shape on CPU takes hours and measures nothing a GPU user needs
    if args.quick:
        args.episodes, args.group_size, args.max_turns, args.steps, args.eval_episodes = 4, 2, 2, 2, 2
        args.shapes = args.shapes.split(",")[0]
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "dtype": args.dtype, "quick": args.quick, "torch": torch.__version__, "shapes": {}}
    if args.model_path:
        args.shapes = Path(args.model_path).name
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        ctx = prepare(shape, args, device)
        res = {"params_m": round(sum(p.numel() for p in ctx["model"].parameters()) / 1e6, 1)}
        t0 = time.perf_counter()
        for name in sections:
            if name in ("precision", "update") and "trajectories" not in ctx:
                res["rollout"] = section_rollout(ctx)  # both need the rollout's episodes
            if name == "staleness":
                res[name] = section_staleness(ctx, args.steps)
            elif name not in res:
                res[name] = globals()[f"section_{name}"](ctx)
            print(f"{shape} {name}: {json.dumps(res[name])}", file=sys.stderr)
        res["suite_seconds"] = round(time.perf_counter() - t0, 1)
        summary["shapes"][shape] = res
        del ctx
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
