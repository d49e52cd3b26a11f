"""What watching a run costs: bytes of a trajectory dump per 1k tokens, and the time of the
health/input_dependence cross-scoring against the score stage it sits next to.

(a) Dump size: a batch of `--episodes` episodes (groups of 4), each `--prompt` ids we wrote then
    `--reply` generated ids with random logprobs, advantages and returns (random numbers do not
    compress: a worst case), written by the real TrajectoryDumper; and, given `--run RUN_DIR`, the
    dumps a real run wrote.
(b) Cross-scoring: `Watch.cross_loglik` on 8 distinct (context, reply) pairs against
    `Actor.compute_logprobs` (the score stage) on the same batch, with the tiny policy model,
    interleaved, median of `--repeats`; a ratio, so it holds on a busy machine.

    python benchmarks/observe_cost.py
    python benchmarks/observe_cost.py --run runs/frozen_lake     # also that run's dumps
    python benchmarks/observe_cost.py --quick                    # 8 short episodes, once: a smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrl.config import ActorConfig, TinyModelConfig, load_config
from agentrl.dumps import TrajectoryDumper, list_dumps, read_dump
from agentrl.health import cross_inputs
from agentrl.models.tiny import build_model, build_tokenizer
from agentrl.train.actor import Actor
from agentrl.train.batch import pack
from agentrl.train.watch import Watch
from agentrl.trajectory import Trajectory

CORPUS = ["user\nFrozenLake. Move P to G.\nP _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G",
          "<answer>Left</answer> Right Up Down"] * 40


def episodes(n: int, prompt: int, reply: int, vocab: int, turns: int = 4) -> list[Trajectory]:
    """`n` episodes of `turns` turns, each a prompt of distinct ids then a generated reply."""
    rng = random.Random(0)
    out = []
    for e in range(n):
        ids, mask, positions, states = [], [], [], []
        for k in range(turns):
            ids += [rng.randrange(4, vocab) for _ in range(prompt // turns)]
            mask += [0] * (prompt // turns)
            ids += [rng.randrange(4, vocab) for _ in range(reply // turns)]
            mask += [1] * (reply // turns)
            positions.append(len(ids) - 1)
            states.append(f"{e}-{k}")
        logp = [-rng.random() * 3 if m else 0.0 for m in mask]
        out.append(Trajectory(ids, mask, logp, [7 if m else -1 for m in mask], [rng.random() for _ in range(turns)],
                              positions, e // 4, e, turn_states=states))
    return out


def dump_bytes(trajs: list[Trajectory], tokenizer) -> dict[str, float]:
    """Bytes per 1k tokens (and per 1k generated tokens) of one dump of `trajs`."""
    batch = pack(trajs, 0)
    noise = torch.randn_like(batch.behaviour_logprobs)
    batch.old_logprobs = batch.behaviour_logprobs + 0.01 * noise * batch.loss_mask
    batch.advantages = torch.randn_like(batch.behaviour_logprobs) * batch.loss_mask
    batch.returns = torch.randn_like(batch.behaviour_logprobs) * batch.loss_mask
    with tempfile.TemporaryDirectory() as d:
        size = TrajectoryDumper(d, tokenizer, 10**9).write(1, trajs, batch, 7, "grpo").stat().st_size
    tokens = sum(len(t.token_ids) for t in trajs)
    generated = sum(t.num_generated for t in trajs)
    return {"bytes_per_1k_tokens": round(1000 * size / tokens),
            "bytes_per_1k_generated": round(1000 * size / generated)}


def run_dumps(run: Path) -> dict[str, float]:
    """Bytes per 1k tokens over the dumps a run wrote."""
    size = tokens = generated = 0
    for _, path in list_dumps(run):
        d = read_dump(path)
        size += path.stat().st_size
        tokens += d["tokens_kept"]
        generated += sum(e["mask"].count("1") for e in d["episodes"])
    return {"dumps": len(list_dumps(run)), "bytes_per_1k_tokens": round(1000 * size / max(tokens, 1)),
            "bytes_per_1k_generated": round(1000 * size / max(generated, 1))}


def main() -> None:
    """Measure, print a table, then the JSON summary line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--prompt", type=int, default=400, help="prompt ids per episode (all turns)")
    p.add_argument("--reply", type=int, default=400, help="generated ids per episode (all turns)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--run", type=Path, help="a run folder whose dumps to measure too")
    p.add_argument("--quick", action="store_true", help="8 episodes of 40 + 40 ids, one repeat, for a smoke run")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.prompt, args.reply, args.repeats = 8, 40, 40, 1
    torch.manual_seed(0)
    tokenizer = build_tokenizer(CORPUS, vocab_size=384)
    model = build_model(TinyModelConfig(), tokenizer, seed=0).eval()
    summary = {"dump_worst_case": dump_bytes(episodes(args.episodes, args.prompt, args.reply, len(tokenizer)),
                                             tokenizer)}
    if args.run:
        summary["dump_run"] = run_dumps(args.run)
    trajs = episodes(args.episodes, args.prompt, 32, len(tokenizer))  # action-sized replies, as in FrozenLake
    actor = Actor(model, ActorConfig(), temperature=1.0)
    watch = Watch(load_config(None, []), Path(tempfile.gettempdir()), tokenizer, actor)
    pairs, batch = cross_inputs(trajs, 8), pack(trajs, 0)
    ratios = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        actor.compute_logprobs(batch)
        t1 = time.perf_counter()
        watch.cross_loglik(pairs)
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    summary["cross_scoring_over_score_stage"] = round(statistics.median(ratios), 3)
    summary["setting"] = {"episodes": args.episodes, "prompt_ids": args.prompt, "inputs_cross_scored": len(pairs)}
    for key, value in summary.items():
        print(f"{key:32s} {value}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
