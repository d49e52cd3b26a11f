"""Stand-ins for real checkpoints: Qwen2.5-0.5B- and 1.5B-shaped models built on this machine.

No weights can be downloaded here, so benchmarks and the `model.path` tests use a model with
the public config numbers of Qwen2.5 (hidden size, layers, heads, KV heads, MLP width, the
151,936-row vocabulary, RoPE theta 1e6, tied embeddings), random weights, and a byte-level BPE
tokenizer trained locally with Qwen's special tokens (<|endoftext|> pad, <|im_end|> EOS) and
Qwen2.5's chat template (its default system message included), saved in Hugging Face layout:
`model.path=<folder>` loads it exactly as it would load a downloaded Qwen2.5-Instruct folder.
The tokenizer is small (its ids are a prefix of the vocabulary); what costs compute and memory,
the shape, is the real one.

    python -m agentrl.models.qwen_shape qwen2.5-0.5b models/qwen0.5b-shape            # full depth
    python -m agentrl.models.qwen_shape qwen2.5-0.5b /tmp/q --num-hidden-layers 2     # for CI
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import torch

from agentrl.tokenizer import Tokenizer

# Public config.json numbers of Qwen/Qwen2.5-0.5B(-Instruct) and Qwen/Qwen2.5-1.5B(-Instruct).
QWEN_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
}
QWEN_COMMON: dict[str, Any] = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                                   use_sliding_window=False, attention_dropout=0.0)

# Qwen2.5-Instruct's template without its tool-calling branches.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
GENERIC_CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "FrozenLake. Move P to G without falling into a hole O. Reply with <answer>Left</answer>, "
    "<answer>Right</answer>, <answer>Up</answer> or <answer>Down</answer>.",
    "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G",
    "What is 12 + 7? Think step by step, then give the answer as \\boxed{19}.",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9",
]


def qwen_config(shape: str, tokenizer: Tokenizer, **overrides: Any):
    """The transformers Qwen2Config of `shape` (a key of QWEN_SHAPES), with `overrides` applied."""
    from transformers import Qwen2Config

    if shape not in QWEN_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(QWEN_SHAPES)}")
    values = {**QWEN_COMMON, **QWEN_SHAPES[shape], **overrides}
    values["vocab_size"] = max(values["vocab_size"], len(tokenizer))
    return Qwen2Config(**values, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=None)


def build_qwen_shaped(shape: str, path: str | Path, *, seed: int = 0, corpus: Iterable[str] = (),
                      tokenizer_vocab: int = 1024, dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Path:
    """Build and save a `shape` model (random weights, saved in `dtype`) and its tokenizer in
    Hugging Face layout at `path`; `overrides` change config fields (e.g. num_hidden_layers=2)."""
    from transformers import Qwen2ForCausalLM

    from agentrl.models.loading import save_pretrained
    from agentrl.models.tiny import build_tokenizer

    texts = [*GENERIC_CORPUS, *corpus] * 4
    # A transformers tokenizer is a Tokenizer at run time; its stubs' decode takes and returns wider types.
    tokenizer = cast(Tokenizer, build_tokenizer(texts, tokenizer_vocab, chat_template=QWEN_CHAT_TEMPLATE,
                                                pad_token="<|endoftext|>"))
    config = qwen_config(shape, tokenizer, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # transformers wraps to() in functools.wraps(nn.Module.to), typed with the unbound self first
        model = Qwen2ForCausalLM(config).to(dtype)  # type: ignore[arg-type]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return save_pretrained(model, tokenizer, path)


def main(argv: list[str] | None = None) -> None:
    """Command line: build one shape into a folder."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shape", choices=list(QWEN_SHAPES))
    p.add_argument("out")
    p.add_argument("--num-hidden-layers", type=int, default=None, help="fewer layers than the real model (CI)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    overrides = {} if args.num_hidden_layers is None else {"num_hidden_layers": args.num_hidden_layers}
    out = build_qwen_shaped(args.shape, args.out, seed=args.seed, dtype=getattr(torch, args.dtype), **overrides)
    print(out)


if __name__ == "__main__":
    main()
