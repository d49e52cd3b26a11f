"""The estimator contract: an estimator gets the input record (as `compute_advantages` calls a
registered one); one that does not take it is refused in one line. A registered estimator in a
run: tests/e2e/test_train.py."""

import dataclasses

import pytest
import torch

from agentrl.algos.advantages import check_estimator, compute_advantages
from agentrl.algos.estimator import EstimatorInput
from agentrl.config import AlgorithmConfig
from agentrl.errors import ConfigError
from agentrl.registry import ESTIMATORS, register_estimator

MASK = torch.tensor([[0, 1, 1.0], [0, 1, 1.0], [0, 1, 0.0]])
REWARDS = torch.tensor([[0, 0, 1.0], [0, 0, 3.0], [0, 2.0, 0]])
INDEX = torch.tensor([0, 0, 1])


def _inputs(**changes) -> EstimatorInput:
    return EstimatorInput(REWARDS, MASK, INDEX, None, AlgorithmConfig(credit="token"), **changes)


def test_an_estimator_of_one_parameter_gets_the_record(registries_restored):
    seen = []

    def record_form(x):
        seen.append(x)
        return x.token_rewards * x.response_mask, x.token_rewards

    register_estimator("test_record_form", record_form)
    states = torch.full((3, 3), -1)
    adv, ret = compute_advantages("test_record_form", _inputs(state_ids=states))
    assert isinstance(seen[0], EstimatorInput) and seen[0].state_ids is states
    assert torch.equal(adv, REWARDS * MASK) and torch.equal(ret, REWARDS)


def test_an_estimator_in_the_earlier_positional_form_is_refused_in_one_line(registries_restored):
    def positional(token_rewards, response_mask, index, values, config, state_ids=None):
        return token_rewards, token_rewards

    register_estimator("test_positional_form", positional)
    # check_estimator: what `plan()` runs, so the run is refused before it starts (tests/runtime/test_plan.py);
    # compute_advantages: the same for one registered after the run was planned
    for refuse in (lambda: check_estimator("test_positional_form"),
                   lambda: compute_advantages("test_positional_form", _inputs())):
        with pytest.raises(ConfigError) as e:
            refuse()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("algorithm.adv_estimator: estimator 'test_positional_form'")
        assert "EstimatorInput" in msg


def test_check_estimator_names_the_known_ones_for_an_unknown_name():
    with pytest.raises(ConfigError) as e:
        check_estimator("grpoo")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("algorithm.adv_estimator: unknown advantage estimator 'grpoo'")
    assert "Did you mean 'grpo'?" in msg
    check_estimator("grpo")  # a built-in passes


@pytest.mark.parametrize("name", ["grpo", "gigpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                  "gae", "opo", "gpg", "remax", "grpo_passk"])
def test_every_built_in_takes_the_record(name):
    import inspect

    params = list(inspect.signature(ESTIMATORS.get(name)).parameters.values())
    assert len(params) == 1 and params[0].annotation in (EstimatorInput, "EstimatorInput")


def test_the_record_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _inputs().values = torch.zeros(3, 3)
