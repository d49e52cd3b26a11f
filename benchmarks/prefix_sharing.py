"""Prefix-shared training (actor.share_prefixes): trainer tokens/s and activation memory with and
without it, on episodes the run's own policy plays.

For each workload it builds the run as `agentrl train` does (the embedded tiny model, warm-started
as the config says, cached), plays one training step's groups with the in-process engine, and
then times the trainer's work on that batch, the old logprobs and one PPO update (Actor.update),
with actor.share_prefixes off and on, from the same weights:

  frozen_lake  configs/frozen_lake.yaml: GRPO groups of 8 episodes, one sequence each (the
               group's prompt is shared);
  math_retry   configs/math_retry.yaml: groups of 8, up to 3 answers each;
  window       configs/frozen_lake.yaml with agent.args.history_length=2: every turn is its own
               sequence (instructions, the last two turns, the board), so a group's segments
               share the instructions and those of one turn often share more.

It reports, per workload, the batch's tokens, the ids the model computes per pass with sharing
over without (what sharing saves in principle), trainer tokens/s (the batch's tokens over the
seconds of the logprob pass and the update; median of --repeats after one warm-up) and process
CPU seconds (less disturbed by other work on a shared machine), the peak of the activations held
for backward during the update (saved-tensor bytes, parameters excluded: deterministic on CPU;
on CUDA also torch.cuda.max_memory_allocated), and the largest logprob difference between the
two passes (float rounding). The last line is a JSON summary.

    python benchmarks/prefix_sharing.py                       # the three workloads, CPU or CUDA
    python benchmarks/prefix_sharing.py --workloads window --repeats 5
    python benchmarks/prefix_sharing.py --warm-steps 20 model.use_remove_padding=true
    python benchmarks/prefix_sharing.py --quick                # small batches, short warm start: a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from agentrl.config import load_config  # noqa: E402
from agentrl.runtime.assembly.learners import build_learners  # noqa: E402
from agentrl.runtime.assembly.plan import plan  # noqa: E402
from agentrl.runtime.assembly.trainer import build_parts  # noqa: E402
from agentrl.train.batch import pack  # noqa: E402

WORKLOADS = {
    "frozen_lake": ("frozen_lake.yaml", []),
    "math_retry": ("math_retry.yaml", []),
    "window": ("frozen_lake.yaml", ["agent.args.history_length=2"]),
}
# --quick: two groups of four, a narrower one-layer tiny model warm-started for one step (the
# replies are then less like a trained policy's, the shapes of the batch alike).
QUICK = ["rollout.batch_size=8", "rollout.group_size=4", "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=8",
         "model.warm_start.max_steps=1", "model.warm_start.min_steps=0", "model.tiny.hidden_size=32",
         "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64"]


class SavedActivations:
    """Peak bytes of the tensors autograd holds for backward (parameters excluded), each storage
    counted once, released when autograd drops the last tensor it saved of it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = {p.data_ptr() for p in model.parameters()}
        self.live: dict[int, list[int]] = {}  # storage pointer -> [tensors held, bytes]
        self.now = self.peak = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.params:
            return t
        entry = self.live.setdefault(ptr, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
        entry[0] += 1
        weakref.finalize(t, self._release, ptr)
        return t

    def _release(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[ptr]

    @contextmanager
    def watch(self):
        """Count while the block runs."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


def play(name: str, args, log) -> tuple:
    """(config, policy model, device, the trajectories of one training step) of workload `name`."""
    file, overrides = WORKLOADS[name]
    extra = [f"model.warm_start.max_steps={args.warm_steps}"] if args.warm_steps is not None else []
    cfg = load_config(ROOT / "configs" / file, [f"seed={args.seed}", *overrides, *(QUICK if args.quick else []),
                                                *extra, *args.overrides])
    parts = build_parts(plan(cfg), log)
    try:
        step = parts.rollout.collect(0, parts.rollout.policy_version)
    finally:
        parts.rollout.shutdown()
    model = parts.actor.model
    return cfg, model, next(model.parameters()).device, [t for g in step.groups for t in g]


def measure(cfg, model, device, trajectories, tokenizer_pad: int, share: bool, repeats: int) -> dict:
    """One variant's logprobs, timings, ids computed and activation peak on the batch."""
    variant = copy.deepcopy(cfg)
    variant.actor.share_prefixes = share
    actor, _, _ = build_learners(plan(variant), copy.deepcopy(model), device)
    batch = pack(trajectories, tokenizer_pad)
    batch.advantages = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0))
    ids = []
    hook = actor.model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: ids.append(a[0].numel()))
    batch.old_logprobs = first = actor.compute_logprobs(batch)
    saved = SavedActivations(actor.model)
    with saved.watch():
        loss = actor.update(batch)["loss/policy"]
    computed = sum(ids)
    hook.remove()
    walls, cpus, cuda_peak = [], [], 0
    for i in range(repeats + 1):  # the first: warm-up (allocator, kernels)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        wall, cpu = time.perf_counter(), time.process_time()
        batch.old_logprobs = actor.compute_logprobs(batch)
        actor.update(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
            cuda_peak = max(cuda_peak, torch.cuda.max_memory_allocated())
        if i:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    tokens = int(batch.attention_mask.sum())
    out = {"tokens_per_s": round(tokens / statistics.median(walls), 1),
           "cpu_seconds": round(statistics.median(cpus), 4),
           "ids_computed": computed, "activation_mb": round(saved.peak / 2**20, 2), "loss": loss, "logprobs": first}
    if device.type == "cuda":
        out["cuda_peak_mb"] = round(cuda_peak / 2**20, 1)
    return out


def run(name: str, args, log) -> dict:
    """Both variants on workload `name`, as ratios of shared over plain."""
    cfg, model, device, trajs = play(name, args, log)
    pad = 0  # any id: padding is masked out of every pass and loss
    plain, shared = (measure(cfg, model, device, trajs, pad, share, args.repeats) for share in (False, True))
    real = pack(trajs, pad).attention_mask.bool()
    lengths = [len(t.token_ids) for t in trajs]
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "rows": len(trajs),
           "tokens": int(real.sum()), "mean_row": round(statistics.mean(lengths), 1),
           "max_logprob_diff": float((shared.pop("logprobs") - plain.pop("logprobs"))[real].abs().max()),
           "loss_diff": abs(shared.pop("loss") - plain.pop("loss")), "plain": plain, "shared": shared,
           "ids_ratio": round(shared["ids_computed"] / plain["ids_computed"], 3),
           "speedup": round(shared["tokens_per_s"] / plain["tokens_per_s"], 3),
           "cpu_speedup": round(plain["cpu_seconds"] / shared["cpu_seconds"], 3),
           "activation_ratio": round(shared["activation_mb"] / plain["activation_mb"], 3)}
    if device.type == "cuda":
        res["cuda_memory_ratio"] = round(shared["cuda_peak_mb"] / plain["cuda_peak_mb"], 3)
    return res


def table(results: dict) -> str:
    """The summary as a Markdown table."""
    lines = ["| workload | rows | tokens | ids computed (shared/plain) | tokens/s plain | tokens/s shared | speedup "
             "(wall) | speedup (CPU s) | activations MB plain | shared | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        p, s = r["plain"], r["shared"]
        lines.append(f"| {name} | {r['rows']} | {r['tokens']} | {r['ids_ratio']} | {p['tokens_per_s']} | "
                     f"{s['tokens_per_s']} | {r['speedup']} | {r['cpu_speedup']} | {p['activation_mb']} | "
                     f"{s['activation_mb']} | {r['activation_ratio']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-steps", type=int, default=None,
                   help="cap the tiny model's warm start (default: the config's)")
    p.add_argument("--quick", action="store_true", help="small batches, a short warm start, one repeat (a smoke run)")
    p.add_argument("overrides", nargs="*", help="config overrides for every workload, e.g. actor.micro_batch_size=8")
    args = p.parse_args()
    if args.quick:
        args.repeats = 1
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    results = {name.strip(): run(name.strip(), args, log) for name in args.workloads.split(",") if name.strip()}
    print(table(results), file=sys.stderr)
    print(json.dumps({"quick": args.quick, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "workloads": results}))


if __name__ == "__main__":
    main()
