"""The HTTP tax: generated tokens/s of `agentrl serve` under concurrent multi-turn sessions, against
the in-process engine on the same workload.

Workload: `--sessions` conversations at once (64), each `--turns` turns (6) of a user message and
a sampled reply of up to `--max-tokens` ids (8), every request seeded (session i, turn k), so
both ways generate the same ids. In-process: each conversation is a `Conversation` whose
prompt ids go straight to a `LocalEngine` (as the chat agent does), in a worker thread as in a
run. Server: a child process serves the same model (`start_server`, as `agentrl serve` does);
this process plays each conversation as an `openai.AsyncOpenAI` client of a session
(`/sessions/<id>/v1/chat/completions`). The ratio server / in-process is the HTTP tax (1.0: none).
The two ways alternate `--repeats` times and the medians are compared; on a shared machine the
load of other work moves both.

    python benchmarks/serve_throughput.py                      # tiny model (h=64, 2 layers)
    python benchmarks/serve_throughput.py --hidden 256 --layers 4
    python benchmarks/serve_throughput.py --client httpx           # without the openai SDK's own cost
    python benchmarks/serve_throughput.py --quick                  # 4 sessions x 2 turns, once: a smoke run
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time

CORPUS = ["user\nFrozenLake. Move P to G, avoid holes O.\nP _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G",
          "assistant\n<answer>Left</answer> <answer>Right</answer> <answer>Up</answer> <answer>Down</answer>"] * 20
KEY = "bench"


def build(hidden: int, layers: int):
    """The tokenizer and model both ways serve (same seed: the same weights)."""
    from agentrl.config import TinyModelConfig
    from agentrl.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(CORPUS, vocab_size=384)
    heads = max(2, hidden // 32)
    cfg = TinyModelConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
                          num_attention_heads=heads, num_key_value_heads=max(1, heads // 2))
    return tok, build_model(cfg, tok, seed=0).eval()


def engine(tok, model):
    from agentrl.llm.local.engine import LocalEngine

    return LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, tokenizer=tok)


def seed(i: int, k: int) -> int:
    return 1000 * i + k


def first_message(i: int) -> str:
    return f"Session {i}. P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G"


async def in_process(tok, eng, sessions: int, turns: int, max_tokens: int) -> int:
    """Every conversation through a Conversation and the engine; the ids generated."""
    from agentrl.llm.conversation import Conversation
    from agentrl.llm.engine import SamplingParams

    async def one(i: int) -> int:
        conv = Conversation(tok)
        conv.add_message("user", first_message(i))
        n = 0
        for k in range(turns):
            sp = SamplingParams(max_new_tokens=max_tokens, seed=seed(i, k), stop_token_ids=(tok.eos_token_id,))
            out = await eng.generate(conv.prompt_ids(), sp)
            conv.add_completion(out, (tok.eos_token_id,))
            conv.add_message("user", f"Turn {k}.")
            n += len(out.token_ids)
        return n
    return sum(await asyncio.gather(*(one(i) for i in range(sessions))))


async def over_http(url: str, sessions: int, turns: int, max_tokens: int, client_kind: str) -> int:
    """Every conversation as a client of a session of the server (the `openai` SDK, or plain
    httpx posting the same JSON, which leaves out the SDK's own cost); the ids generated."""
    import httpx
    import openai

    context = ssl.create_default_context()
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(headers=headers) as http:
        opened = [(await http.post(url + "/sessions")).json()["base_url"] for _ in range(sessions)]

    async def one(i: int, base: str) -> int:
        async with httpx.AsyncClient(verify=context, headers=headers, timeout=None) as transport:
            client = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0, http_client=transport)
            messages = [{"role": "user", "content": first_message(i)}]
            n = 0
            for k in range(turns):
                if client_kind == "openai":
                    r = await client.chat.completions.create(model="agentrl", messages=messages,
                                                             max_tokens=max_tokens, seed=seed(i, k))
                    ids, content = r.choices[0].token_ids, r.choices[0].message.content
                else:
                    body = {"model": "agentrl", "messages": messages, "max_tokens": max_tokens, "seed": seed(i, k)}
                    choice = (await transport.post(base + "/chat/completions", json=body)).json()["choices"][0]
                    ids, content = choice["token_ids"], choice["message"]["content"]
                n += len(ids)
                messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"Turn {k}."}]
            return n
    return sum(await asyncio.gather(*(one(i, b) for i, b in enumerate(opened))))


def in_thread(coro) -> tuple[int, float]:
    """Run `coro` on a worker thread's loop (as a run's collector does); (result, seconds)."""
    box = {}

    def run() -> None:
        t0 = time.perf_counter()
        box["out"] = asyncio.run(coro)
        box["seconds"] = time.perf_counter() - t0
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return box["out"], box["seconds"]


def child(args: argparse.Namespace) -> None:
    """Serve the model until stdin closes; print the URL."""
    from agentrl.config.serve import ServeConfig
    from agentrl.llm.server.app import start_server

    tok, model = build(args.hidden, args.layers)
    handle = start_server(engine(tok, model), tok, ServeConfig(port=0, api_key=KEY, max_tokens=1024, max_n=4))
    print(handle.url, flush=True)
    sys.stdin.read()
    handle.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--client", choices=["openai", "httpx"], default="openai",
                   help="the sessions' client: the openai SDK (what agents use) or plain httpx (the server alone)")
    p.add_argument("--quick", action="store_true", help="4 sessions of 2 turns, one repeat (smoke run)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.sessions, args.turns, args.repeats = 4, 2, 1
    if args.child:
        return child(args)
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--hidden", str(args.hidden), "--layers",
                             str(args.layers)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = proc.stdout.readline().strip()
    tok, model = build(args.hidden, args.layers)
    eng = engine(tok, model)
    work = (args.sessions, args.turns, args.max_tokens)
    in_thread(in_process(tok, eng, 4, 2, args.max_tokens))  # warm both up
    in_thread(over_http(url, 4, 2, args.max_tokens, args.client))
    rows = {"in_process": [], "server": []}
    tokens = {}
    try:
        for r in range(args.repeats):
            eng.reset_prefix_cache()
            n, s = in_thread(in_process(tok, eng, *work))
            rows["in_process"].append(n / s)
            tokens["in_process"] = n
            n, s = in_thread(over_http(url, *work, args.client))
            rows["server"].append(n / s)
            tokens["server"] = n
            print(f"repeat {r + 1}: in-process {rows['in_process'][-1]:.0f} tok/s, server {rows['server'][-1]:.0f} tok/s",
                  flush=True)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    local, served = statistics.median(rows["in_process"]), statistics.median(rows["server"])
    print(f"{args.sessions} sessions x {args.turns} turns ({args.client} client), model h={args.hidden} x "
          f"{args.layers} layers: in-process "
          f"{local:.0f} tok/s, server {served:.0f} tok/s, server / in-process = {served / local:.3f}")
    print(json.dumps({"sessions": args.sessions, "turns": args.turns, "max_tokens": args.max_tokens, "client": args.client,
                      "hidden": args.hidden, "layers": args.layers, "repeats": args.repeats,
                      "generated_tokens": tokens, "same_tokens": tokens["server"] == tokens["in_process"],
                      "in_process_tokens_per_s": round(local, 1), "server_tokens_per_s": round(served, 1),
                      "http_tax_ratio": round(served / local, 3)}))


if __name__ == "__main__":
    main()
