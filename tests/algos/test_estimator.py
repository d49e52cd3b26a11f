"""The estimator contract: an estimator gets the input record, or, written in the earlier positional
form, the record's fields (as `compute_advantages` calls a registered one); the built-ins answer
both forms with the same numbers. A registered estimator in a run: tests/e2e/test_train.py."""

import dataclasses

import pytest
import torch

from agentrl.algos.advantages import compute_advantages, grpo
from agentrl.algos.estimator import EstimatorInput, call_estimator
from agentrl.config import AlgorithmConfig
from agentrl.registry import ESTIMATORS

MASK = torch.tensor([[0, 1, 1.0], [0, 1, 1.0], [0, 1, 0.0]])
REWARDS = torch.tensor([[0, 0, 1.0], [0, 0, 3.0], [0, 2.0, 0]])
INDEX = torch.tensor([0, 0, 1])


def _inputs(**changes) -> EstimatorInput:
    return EstimatorInput(REWARDS, MASK, INDEX, None, AlgorithmConfig(credit="token"), **changes)


def test_an_estimator_of_one_parameter_gets_the_record():
    seen = []

    def record_form(x):
        seen.append(x)
        return x.token_rewards * x.response_mask, x.token_rewards

    states = torch.full((3, 3), -1)
    adv, ret = call_estimator(record_form, _inputs(state_ids=states))
    assert isinstance(seen[0], EstimatorInput) and seen[0].state_ids is states
    assert torch.equal(adv, REWARDS * MASK) and torch.equal(ret, REWARDS)


def test_an_estimator_in_the_positional_form_gets_the_fields_in_order():
    seen = []

    def positional(token_rewards, response_mask, index, values, config, state_ids=None):
        seen.append((token_rewards, response_mask, index, values, config, state_ids))
        return grpo(token_rewards, response_mask, index, values, config, state_ids)

    inputs = _inputs()
    adv, _ = call_estimator(positional, inputs)
    assert len(seen) == 1 and all(a is b for a, b in zip(seen[0], (REWARDS, MASK, INDEX, None, inputs.config, None)))
    assert torch.equal(adv, compute_advantages("grpo", inputs)[0])


def test_a_positional_estimator_with_a_greedy_baseline_gets_it_as_a_keyword():
    seen = {}

    def positional(token_rewards, response_mask, index, values, config, state_ids=None, reward_baselines=None):
        seen["baselines"] = reward_baselines
        return token_rewards, token_rewards

    positional.greedy_baseline = True
    baselines = torch.tensor([1.0, 1.0, float("nan")])
    call_estimator(positional, _inputs(reward_baselines=baselines))
    assert seen["baselines"] is baselines


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                                  "gpg", "remax", "grpo_passk"])
def test_built_ins_give_the_same_numbers_called_either_way(name):
    fn = ESTIMATORS.get(name)
    inputs = _inputs() if name != "grpo_passk" else _inputs().replace(index=torch.tensor([0, 0, 0]))
    by_record = fn(inputs)
    by_position = fn(*(getattr(inputs, f.name) for f in dataclasses.fields(EstimatorInput)))
    for a, b in zip(by_record, by_position):
        assert torch.equal(a, b)


def test_the_record_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _inputs().values = torch.zeros(3, 3)
