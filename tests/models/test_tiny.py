"""The embedded tiny model and tokenizer round-trip through from_pretrained from a local folder."""

import torch

from agentrl.models.loading import load_pretrained, save_pretrained


def test_save_load_round_trip(tmp_path, tiny_model, tiny_tokenizer):
    path = save_pretrained(tiny_model, tiny_tokenizer, tmp_path / "tiny")
    model, tok = load_pretrained(path)
    for (k, a), (k2, b) in zip(tiny_model.state_dict().items(), model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    # Digits, words after spaces and line breaks: where transformers' Qwen2Tokenizer class would
    # re-split the text (it replaced our pipeline on load once, and warm-started models then
    # read tokenizations they had never seen).
    text = ("<|im_start|>user\nP _ _ _\n_ O _ G\nP: row 12, column 3.<|im_end|>\n"
            "<|im_start|>assistant\n<answer>Left</answer><|im_end|>\n 2024 x=10.5 ok")
    assert tok.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tok.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.padding_side == "left"
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok.encode("P _ _ G", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny_model(ids).logits)


def test_tags_survive_decoding_without_specials(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<think>x</think><answer>Right</answer>", add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think><answer>Right</answer>"
    assert tiny_tokenizer.decode(ids + [tiny_tokenizer.eos_token_id], skip_special_tokens=True).endswith("</answer>")
