"""Peak memory of one actor update with the vocabulary's logits computed whole or a chunk of
positions at a time (actor.logits_chunk_size), at the 24M shape and a Qwen2.5-0.5B-shaped model.

Each arm runs in a fresh process of its own, so that no peak carries over: it builds the model
(random weights, float32), an Actor with the default config but the batch's size (one micro-batch
of every row) and `actor.logits_chunk_size` set, a batch of synthetic episodes (a quarter of each
row prompt, the rest generated ids, advantages from -1 to 1), computes the old logprobs, then runs
one `Actor.update` (forward, backward, AdamW step; AdamW's state already allocated, as at every
step of a run after its first). Reported per arm: the most bytes torch's CPU allocator held at
once beyond what it held before (every allocation and free as the profiler records them: it
depends on the shapes, not on the machine) in the update's forward and backward passes (where
the logits live), in the whole update (the AdamW step's temporaries over every weight can set it
when the logits are small), and in the old logprobs pass (no graph); and the process's peak RSS
(`ru_maxrss`: everything, model and optimizer included).
Then the ratios chunked / whole, and the update's loss and gradient norm in both arms (the same
computation: they agree to float rounding).

  24m       hidden 512 x 8 layers, the tiny tokenizer's 512-id vocabulary (benchmarks/engine_step.py's
            `24m` shape): logits are a small part of an update there;
  qwen0.5b  Qwen2.5-0.5B's widths and 151,936-id vocabulary (agentrl/models/qwen_shape.py), with
            gradient checkpointing (as a GPU run uses it) and --layers of its 24 layers (default
            2: the logits' memory does not depend on depth, and 24 layers cost minutes per arm on a CPU).

    python benchmarks/update_memory.py                          # both shapes, chunk 1024 vs whole
    python benchmarks/update_memory.py --shapes qwen0.5b --layers 24 --rows 2 --length 512
    python benchmarks/update_memory.py --chunk 256 --entropy-coeff 0.01
    python benchmarks/update_memory.py --quick                  # short rows, chunk 64, narrow: a smoke run

The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.models.qwen_shape import QWEN_COMMON, QWEN_SHAPES  # noqa: E402

SHAPES = {
    "24m": dict(vocab_size=512, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=4, tie_word_embeddings=True, rope_theta=10000.0),
    "qwen0.5b": {**QWEN_COMMON, **QWEN_SHAPES["qwen2.5-0.5b"]},  # num_hidden_layers: --layers
}
ROWS_LENGTH = {"24m": (8, 512), "qwen0.5b": (2, 1024)}  # rows of a micro-batch, ids per row: 4096 and 2048 tokens
QUICK_ROWS_LENGTH = (2, 128)
# --quick: every shape at small widths and one layer, its vocabulary as it is (the logits' memory
# depends on the vocabulary and the tokens, not on the widths): a 151,936-id model of 10M
# parameters, whose optimizer step and weights no longer dwarf a smoke run's logits.
QUICK_WIDTHS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1)


MARK = 7_654_321  # bytes of one allocation made and freed as the optimizer step starts: a mark in the record


def _peaks(run) -> tuple[int, int]:
    """(the most bytes torch's CPU allocator held at once while `run` ran, beyond what it held before;
    the same up to the first MARK-byte allocation), from every allocation and free the profiler records."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    now = peak = 0
    before_mark = None
    for _, nbytes in events:
        if nbytes == MARK and before_mark is None:
            before_mark = peak
        now += nbytes
        peak = max(peak, now)
    return peak, peak if before_mark is None else before_mark


def arm(shape: str, chunk: int, rows: int, length: int, layers: int, entropy_coeff: float,
        quick: bool = False) -> dict:
    """One arm, in this process: the peaks of the old logprobs and of one update (`quick`: at QUICK_WIDTHS)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.config import ActorConfig
    from agentrl.train.actor import Actor
    from agentrl.train.batch import pack
    from agentrl.trajectory import Trajectory

    values = {**SHAPES[shape], **({"num_hidden_layers": layers} if shape == "qwen0.5b" else {}),
              **(QUICK_WIDTHS if quick else {})}
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**values))
    if shape == "qwen0.5b":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = ActorConfig(micro_batch_size=rows, ppo_mini_batch_size=rows, entropy_coeff=entropy_coeff,
                      logits_chunk_size=chunk)
    actor = Actor(model, cfg, temperature=1.0, horizon=float(length))
    gen = torch.Generator().manual_seed(0)
    prompt = length // 4
    trajs = [Trajectory(torch.randint(5, values["vocab_size"], (length,), generator=gen).tolist(),
                        [0] * prompt + [1] * (length - prompt), [0.0] * length, [0] * length, [1.0], [length - 1],
                        i // 2, i) for i in range(rows)]
    batch = pack(trajs, pad_token_id=0)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    # A step of zero gradients first allocates AdamW's state (and moves no weight): the update measured
    # is then any step after a run's first, whose peak the logits' copies set, not the state's allocation.
    for param in actor.master.params:
        param.grad = torch.zeros_like(param)
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)
    old, _ = _peaks(lambda: setattr(batch, "old_logprobs", actor.compute_logprobs(batch)))
    step = actor._clip_and_step

    def marked_step() -> float:  # the forward and backward passes end here (one mini-batch: one step)
        torch.empty(MARK, dtype=torch.uint8)
        return step()

    actor._clip_and_step = marked_step
    stats: dict = {}
    update, passes = _peaks(lambda: stats.update(actor.update(batch)))
    return {"update_peak_mb": round(update / 2**20, 1), "passes_peak_mb": round(passes / 2**20, 1),
            "old_logprobs_peak_mb": round(old / 2**20, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "loss": stats["loss/policy"], "grad_norm": stats["policy/grad_norm"],
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}


def run_arm(shape: str, chunk: int, args, rows: int, length: int) -> dict:
    """`arm` in a fresh process (a peak RSS of its own)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", shape, "--chunk", str(chunk), "--rows", str(rows),
           "--length", str(length), "--layers", str(args.layers), "--entropy-coeff", str(args.entropy_coeff),
           *(["--quick"] if args.quick else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{shape} chunk {chunk}: exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict) -> str:
    """The summary as a Markdown table."""
    lines = ["| shape | params (M) | tokens | vocab | one float32 logits copy MB | forward+backward peak MB, whole "
             "-> chunked (ratio) | update peak MB (with the AdamW step) | old logprobs peak MB | process peak RSS MB "
             "| loss diff | grad norm rel. diff |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape, r in results.items():
        w, c = r["whole"], r["chunked"]
        lines.append(f"| {shape} | {w['params_m']} | {r['tokens']} | {r['vocab']} | {r['logits_copy_mb']} | "
                     f"{w['passes_peak_mb']} -> {c['passes_peak_mb']} ({r['passes_ratio']}) | "
                     f"{w['update_peak_mb']} -> {c['update_peak_mb']} ({r['update_ratio']}) | "
                     f"{w['old_logprobs_peak_mb']} -> {c['old_logprobs_peak_mb']} ({r['old_logprobs_ratio']}) | "
                     f"{w['peak_rss_mb']} -> {c['peak_rss_mb']} ({r['rss_ratio']}) | {r['loss_diff']:.2e} | "
                     f"{r['grad_norm_rel_diff']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    p.add_argument("--chunk", type=int, default=None, help="actor.logits_chunk_size of the chunked arm "
                   "(default: the config's default, 1024; --quick 64)")
    p.add_argument("--rows", type=int, default=None, help="rows of the micro-batch (default per shape)")
    p.add_argument("--length", type=int, default=None, help="ids per row (default per shape)")
    p.add_argument("--layers", type=int, default=2, help="layers of the qwen0.5b shape (24: full depth)")
    p.add_argument("--entropy-coeff", type=float, default=0.0, help="actor.entropy_coeff (0: the default)")
    p.add_argument("--quick", action="store_true",
                   help="2 rows of 128 ids, chunk 64, every shape 64 wide and 1 layer deep: a smoke run")
    p.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # run one arm here: the parent's subprocess
    args = p.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.chunk, args.rows, args.length, args.layers, args.entropy_coeff,
                             args.quick)))
        return
    from agentrl.config import ActorConfig

    chunk = args.chunk if args.chunk is not None else (64 if args.quick else ActorConfig().logits_chunk_size)
    if chunk <= 0:
        p.error(f"--chunk={chunk}: the chunked arm needs a chunk of at least 1 position (the other arm is 0)")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        p.error(f"--shapes: unknown {', '.join(bad)}; known: {', '.join(SHAPES)}")
    results = {}
    for shape in shapes:
        rows, length = QUICK_ROWS_LENGTH if args.quick else ROWS_LENGTH[shape]
        rows, length = args.rows or rows, args.length or length
        print(f"{shape}: {rows} rows x {length} ids, whole logits ...", file=sys.stderr, flush=True)
        whole = run_arm(shape, 0, args, rows, length)
        print(f"{shape}: chunks of {chunk} ...", file=sys.stderr, flush=True)
        chunked = run_arm(shape, chunk, args, rows, length)
        vocab = SHAPES[shape]["vocab_size"]
        results[shape] = {
            "rows": rows, "length": length, "tokens": rows * length, "vocab": vocab, "chunk": chunk,
            "logits_copy_mb": round(rows * length * vocab * 4 / 2**20, 1), "whole": whole, "chunked": chunked,
            "passes_ratio": round(chunked["passes_peak_mb"] / whole["passes_peak_mb"], 3),
            "update_ratio": round(chunked["update_peak_mb"] / whole["update_peak_mb"], 3),
            "old_logprobs_ratio": round(chunked["old_logprobs_peak_mb"] / whole["old_logprobs_peak_mb"], 3),
            "rss_ratio": round(chunked["peak_rss_mb"] / whole["peak_rss_mb"], 3),
            "loss_diff": abs(chunked["loss"] - whole["loss"]),
            "grad_norm_rel_diff": abs(chunked["grad_norm"] - whole["grad_norm"]) / max(whole["grad_norm"], 1e-12)}
        print(table({shape: results[shape]}).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(results), file=sys.stderr)
    import torch

    layers = QUICK_WIDTHS["num_hidden_layers"] if args.quick else args.layers
    print(json.dumps({"quick": args.quick, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "layers_qwen0.5b": layers, "entropy_coeff": args.entropy_coeff, "shapes": results}))


if __name__ == "__main__":
    main()
