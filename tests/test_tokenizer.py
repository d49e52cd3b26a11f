"""The Tokenizer type (agentrl/tokenizer.py) is what the tokenizers agentrl builds and loads are."""

from agentrl.models.loading import load_pretrained, save_pretrained
from agentrl.tokenizer import Tokenizer


def test_the_embedded_tokenizer_and_a_loaded_one_are_tokenizers(tiny_tokenizer, tiny_model, tmp_path):
    assert isinstance(tiny_tokenizer, Tokenizer)
    _, loaded = load_pretrained(save_pretrained(tiny_model, tiny_tokenizer, tmp_path / "model"))
    assert isinstance(loaded, Tokenizer)
    ids = loaded.encode("Hello", add_special_tokens=False)
    assert loaded.decode(ids) == "Hello" and loaded.eos_token_id is not None


def test_an_object_without_a_chat_template_is_not_one():
    class Plain:
        eos_token_id = pad_token_id = 0

        def encode(self, text, add_special_tokens=True):
            return [0]

        def decode(self, token_ids, skip_special_tokens=False):
            return ""

    assert not isinstance(Plain(), Tokenizer)
