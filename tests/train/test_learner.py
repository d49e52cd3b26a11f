"""The Learner protocol (agentrl/train/learner.py): the one-process Actor and Ray's ShardedActor
both are one, so the trainer and its health checks run unchanged over several trainer ranks."""

import torch

from agentrl.config import load_config
from agentrl.runtime.ray.train_actors import ShardedActor
from agentrl.train.actor import Actor
from agentrl.train.learner import Learner
from agentrl.train.watch import Watch


def test_the_actor_and_the_sharded_actor_are_learners(tiny_model):
    actor = Actor(tiny_model, load_config(None, []).actor, temperature=0.7)
    assert isinstance(actor, Learner)
    sharded = ShardedActor(actor, workers=[])
    assert isinstance(sharded, Learner)
    assert (sharded.model, sharded.optimizer, sharded.master) == (actor.model, actor.optimizer, actor.master)


def test_health_scores_replies_the_same_through_several_ranks(tiny_model, tiny_tokenizer, tmp_path):
    """health/input_dependence cross-scores replies with the trainer's learner: over Ray's ranks it
    gives what one process gives (it read an attribute ShardedActor lacked, and was switched off)."""
    cfg = load_config(None, [])
    actor = Actor(tiny_model, cfg.actor, temperature=0.7)
    enc = tiny_tokenizer.encode
    pairs = [(enc("user\nP _ _ _\n_ O _ O"), enc("<answer>Left</answer>")), (enc("user\nWhat is 12 + 7?"), enc("19"))]
    one = Watch(cfg, tmp_path, tiny_tokenizer, actor).cross_loglik(pairs)
    ranks = Watch(cfg, tmp_path, tiny_tokenizer, ShardedActor(actor, workers=[])).cross_loglik(pairs)
    assert ranks == one and all(torch.isfinite(torch.tensor(row)).all() for row in one)
