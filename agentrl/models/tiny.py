"""The embedded default: a byte-level BPE tokenizer and a tiny Qwen2 causal LM, built locally.

Nothing is downloaded: the tokenizer is trained on text the env itself produces, wrapped as a
transformers fast tokenizer with a ChatML template, and the model is a `Qwen2ForCausalLM`
built from a small config. Both save and load through `save_pretrained` / `from_pretrained`,
so the rest of the code treats them exactly like a real checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentrl.config import TinyModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Reply tags are ordinary (non-special) added tokens: decode(skip_special_tokens=True) keeps them.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
# ChatML. With `tools=` (apply_chat_template's), Qwen2.5's tool block opens the conversation as a
# system message (merged with the conversation's own system message, if it has one): the tools'
# JSON schemas and how to call them. Without tools it renders exactly as it always has.
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '" + TOOLS_HEADER + "' }}"
    "{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '" + TOOLS_FOOTER + "' + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Generic text so that words outside the env's corpus still tokenize into sensible pieces.
_GENERIC = (
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) . , ? ! "
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ answer correct wrong try again"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int, chat_template: str = CHAT_TEMPLATE,
                    pad_token: str = "<|pad|>") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it as a chat tokenizer (EOS = <|im_end|>)."""
    tok = Tokenizer(models.BPE())
    # Qwen2's split rule: every digit its own token, words keep a leading space, punctuation runs
    # keep their line break. Coordinates and numbers then read digit by digit, as they do for
    # the real models users move on to.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_with_generic(corpus), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token=pad_token,
        unk_token=None,
        padding_side="left",  # must be a constructor argument: the attribute is not saved
        model_max_length=4096,
    )
    hf.chat_template = chat_template
    return hf


def _with_generic(corpus: Iterable[str]) -> Iterable[str]:
    yield _GENERIC
    yield from corpus


def tiny_config(cfg: TinyModelConfig, vocab_size: int, eos_token_id: int | None = None,
                pad_token_id: int | None = None) -> Qwen2Config:
    """The transformers config of the tiny model."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},  # what rope_theta=10000.0 becomes
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def build_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialised tiny Qwen2 causal LM sized for `tokenizer` (float32)."""
    config = tiny_config(cfg, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
