"""The trainer's watch (agentrl/train/watch.py): the cross-scoring behind health/input_dependence."""

import pytest
import torch

from agentrl.config import load_config
from agentrl.train.actor import Actor, token_logprobs
from agentrl.train.watch import Watch


@pytest.mark.parametrize("micro_batch_size", [1, 16])  # one context per pass, or all in one
def test_cross_scoring_with_a_shared_cache_equals_scoring_whole_sequences(tiny_model, tiny_tokenizer, tmp_path,
                                                                         micro_batch_size):
    cfg = load_config(None, [f"actor.micro_batch_size={micro_batch_size}"])
    watch = Watch(cfg, tmp_path, tiny_tokenizer, Actor(tiny_model, cfg.actor, temperature=0.7))
    enc = tiny_tokenizer.encode
    pairs = [(enc("user\nP _ _ _\n_ O _ O"), enc("<answer>Left</answer>")),
             (enc("user\nFrozenLake. Move P to G"), enc("<answer>Down")),
             (enc("system\nWhat is 12 + 7?"), enc("19"))]
    got = watch.cross_loglik(pairs)
    for i, (_, reply) in enumerate(pairs):
        for j, (context, _) in enumerate(pairs):
            ids = torch.tensor([context + reply])
            with torch.no_grad():
                logp = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7)
            assert abs(got[i][j] - float(logp[0, len(context):].sum())) < 1e-3
