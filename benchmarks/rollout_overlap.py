"""Rollout thread or rollout process: which one overlaps generation with training on these cores.

Asynchronous rollout (`rollout.max_staleness >= 1`) generates the next step's episodes while the
trainer updates. Both are torch work, so on a small machine they compete for the same cores.
This measures, for the same work, the wall time of

  serial    generation, then the update, one after the other (what k = 0 does);
  thread    generation in a background thread (what agentrl's RolloutStream does), the update
            in the main thread;
  process   generation in a separate process with its own model copy, the update in the main
            process;

each with torch's default threads per side and with `--split` threads (generation, update).
Generation is LocalEngine serving 64 sampled requests of 8 new tokens per round on prompts of
the default FrozenLake length; the update is forward + backward + AdamW on 32 sequences of 256
ids. The ratio overlap / serial is what async rollout can save at best (0.5 = perfect overlap of
two equal halves). The last line is a JSON summary.

    python benchmarks/rollout_overlap.py
    python benchmarks/rollout_overlap.py --model large --rounds 4 --updates 4
    python benchmarks/rollout_overlap.py --quick                 # one small round and update, once: a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from agentrl.config import TinyModelConfig  # noqa: E402
from agentrl.llm.engine import SamplingParams  # noqa: E402
from agentrl.llm.local.engine import LocalEngine  # noqa: E402
from agentrl.models.tiny import build_model, build_tokenizer  # noqa: E402

LARGE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=1408)
# The work of each share: generation rounds of `groups` groups of 8 requests, updates of `batch`
# sequences of `seq` ids. --quick: a quarter of the requests, a sixteenth of the update's tokens.
FULL = {"groups": 8, "batch": 32, "seq": 256}
QUICK = {"groups": 2, "batch": 8, "seq": 64}


def build(shape: str):
    """(model, tokenizer): the embedded tiny model, or the 512 x 8 shape, random weights."""
    corpus = ["FrozenLake. Move P to G, avoid holes O. <answer>Left</answer> Right Down Up"] * 50
    tok = build_tokenizer(corpus, 300)
    torch.manual_seed(0)
    if shape == "tiny":
        return build_model(TinyModelConfig(), tok, seed=0).eval(), tok
    cfg = Qwen2Config(vocab_size=len(tok), max_position_embeddings=2048, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **LARGE)
    return Qwen2ForCausalLM(cfg).eval(), tok


def generate(model, tok, rounds: int, prompt_len: int = 150, groups: int = 8) -> float:
    """Seconds for `rounds` rounds of `groups` x 8 sampled requests (64 by default) through LocalEngine."""
    engine = LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, seed=0)
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size

    async def one_round(r: int):
        prompts = torch.randint(0, vocab, (groups, prompt_len), generator=gen).tolist()  # groups of 8
        return await asyncio.gather(*(engine.generate(prompts[i // 8], SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=1000 * r + i)) for i in range(8 * groups)))

    t0 = time.perf_counter()
    for r in range(rounds):
        asyncio.run(one_round(r))
    return time.perf_counter() - t0


def update(model, steps: int, batch: int = 32, seq: int = 256) -> float:
    """Seconds for `steps` forward + backward + AdamW steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(2))
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    return time.perf_counter() - t0


def _gen_process(shape: str, state: dict, threads: int, rounds: int, size: dict, ready, go, out) -> None:
    if threads:
        torch.set_num_threads(threads)
    model, tok = build(shape)
    model.load_state_dict(state)
    generate(model, tok, 1, groups=size["groups"])  # warm-up, as the thread mode's engine is warm too
    ready.set()
    go.wait()
    out.put(generate(model, tok, rounds, groups=size["groups"]))


def run(mode: str, shape: str, gen_threads: int, upd_threads: int, rounds: int, updates: int,
        size: dict = FULL) -> dict:
    """Wall seconds of one generation share and one update share in `mode`, of work of `size`."""
    default = torch.get_num_threads()
    model, tok = build(shape)
    trainee, _ = build(shape)
    torch.set_num_threads(upd_threads or default)
    generate(model, tok, 1, groups=size["groups"])
    update(trainee, 1, size["batch"], size["seq"])
    result: dict = {"mode": mode, "threads": [gen_threads or default, upd_threads or default]}
    if mode == "serial":
        torch.set_num_threads(gen_threads or default)
        t0 = time.perf_counter()
        result["gen"] = generate(model, tok, rounds, groups=size["groups"])
        torch.set_num_threads(upd_threads or default)
        result["upd"] = update(trainee, updates, size["batch"], size["seq"])
    elif mode == "thread":
        box = {}

        def work():
            if gen_threads:
                torch.set_num_threads(gen_threads)  # OpenMP's count is per calling thread
            box["gen"] = generate(model, tok, rounds, groups=size["groups"])

        th = threading.Thread(target=work)
        t0 = time.perf_counter()
        th.start()
        result["upd"] = update(trainee, updates, size["batch"], size["seq"])
        th.join()
        result["gen"] = box["gen"]
    else:
        ctx = mp.get_context("spawn")
        ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_gen_process, args=(shape, model.state_dict(), gen_threads, rounds, size, ready, go,
                                                      out))
        proc.start()
        ready.wait()
        t0 = time.perf_counter()
        go.set()
        result["upd"] = update(trainee, updates, size["batch"], size["seq"])
        result["gen"] = out.get()
        proc.join()
    result["wall"] = time.perf_counter() - t0
    torch.set_num_threads(default)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny", "large"], default="tiny")
    p.add_argument("--rounds", type=int, default=24, help="generation rounds of 64 requests")
    p.add_argument("--updates", type=int, default=6, help="update steps")
    p.add_argument("--split", default="1,1", help="generation,update torch threads for the split runs")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="one round of 16 requests, one update step on 8 sequences "
                   "of 64 ids, one repeat (smoke run)")
    args = p.parse_args()
    size = QUICK if args.quick else FULL
    if args.quick:
        args.rounds, args.updates, args.repeats = 1, 1, 1
    split = tuple(int(x) for x in args.split.split(","))
    rows = []
    for rep in range(args.repeats):
        for mode in ("serial", "thread", "process"):
            for threads in ((0, 0), split):
                r = run(mode, args.model, *threads, args.rounds, args.updates, size)
                rows.append(r)
                print(f"run {rep + 1} {mode:8s} threads gen/upd {r['threads'][0]}/{r['threads'][1]}  "
                      f"wall {r['wall']:6.2f} s  (generation {r['gen']:6.2f} s, update {r['upd']:6.2f} s)",
                      flush=True)
    best: dict[tuple, float] = {}
    for r in rows:
        key = (r["mode"], tuple(r["threads"]))
        best[key] = min(best.get(key, float("inf")), r["wall"])
    serial = min(v for (m, _), v in best.items() if m == "serial")
    summary = {f"{m}_{t[0]}x{t[1]}": round(v, 2) for (m, t), v in best.items()}
    summary.update({f"{m}_over_best_serial": round(min(v for (mm, _), v in best.items() if mm == m) / serial, 3)
                    for m in ("thread", "process")})
    summary["cores"] = torch.get_num_threads()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
