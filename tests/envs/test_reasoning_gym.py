"""reasoning-gym datasets through env.type=reasoning_gym: the contract, the dataset's own scorer, the reference."""

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'agentrl[reasoning-gym]')")

from agentrl.envs.args import import_extra  # noqa: E402
from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.reasoning_gym import ReasoningGymEnv  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402

SUMS = {"min_terms": 2, "max_terms": 2, "max_digits": 1}  # a + b and a - b, one digit each


def test_passes_check_env():
    assert check_env(lambda: ReasoningGymEnv("chain_sum", SUMS))["episodes"] == 9


async def test_the_datasets_scorer_grades_and_the_question_stays_for_retries():
    env = ReasoningGymEnv("chain_sum", SUMS)
    question, info = await env.reset(seed=7)
    assert question == env.entry["question"] and info == {"question_index": 7}
    right = env.entry["answer"]
    obs, reward, terminated, truncated, info = await env.step("<answer>-100</answer>")
    assert (obs, reward, terminated, truncated, info["success"]) == ("Wrong.", 0.0, True, False, False)
    # chain_sum's scorer tolerates a sign, leading zeros and commas: "+0..." is the same number
    obs, reward, _, _, info = await env.step(f"I think <answer> {right}.00</answer>")
    assert (obs, reward, info["success"], info["metrics"]["score"]) == ("Correct.", 1.0, True, 1.0)
    obs, reward, _, _, info = await env.step("<answer></answer>")
    assert (reward, info["action_valid"], info["success"]) == (-0.1, False, False)


async def test_partial_credit_is_the_reward_and_success_needs_the_threshold():
    env = ReasoningGymEnv("letter_counting", success_threshold=1.0)
    await env.reset(seed=3)
    right = env.entry["answer"]
    _, reward, _, _, info = await env.step(f"<answer>{right}{right}</answer>")  # the default scorer's partial credit
    assert 0.0 < reward < 1.0 and not info["success"]


async def test_seeds_index_items_so_eval_questions_are_not_training_questions():
    env = ReasoningGymEnv("chain_sum", SUMS)
    assert (await env.reset(seed=5))[0] == (await ReasoningGymEnv("chain_sum", SUMS).reset(seed=5))[0]
    assert env.index(1_000_005) == 1_000_005
    assert ReasoningGymEnv("chain_sum", SUMS, size=100).index(1_000_005) == 5


async def test_step_before_reset_is_an_env_error():
    with pytest.raises(EnvError, match="before reset"):
        await ReasoningGymEnv("chain_sum", SUMS).step("<answer>1</answer>")


class _Played:
    def __init__(self, index):
        self.reset_info = {"question_index": index}


def test_the_reference_is_the_best_frequent_answer():
    env = ReasoningGymEnv("syllogism")  # Yes / No questions
    played = [_Played(1_000_000 + k) for k in range(40)]
    yes = sum(env._ds[p.reset_info["question_index"]]["answer"] == "Yes" for p in played) / len(played)
    assert env.eval_baselines(played) == {"most_frequent_answer": max(yes, 1 - yes)}


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match="not a reasoning-gym dataset. Did you mean 'chain_sum'"):
        ReasoningGymEnv("chain_sums")
    with pytest.raises(ConfigError, match=r"config.seed.*set args.seed instead"):
        ReasoningGymEnv("chain_sum", {"seed": 3})
    with pytest.raises(ConfigError, match="rejects config"):
        ReasoningGymEnv("chain_sum", {"min_terms": 0})
    with pytest.raises(ConfigError, match="set args.size"):
        ReasoningGymEnv("word_ladder")  # generates items up front: needs a finite size


def test_a_missing_suite_names_the_extra():
    with pytest.raises(ConfigError, match=r"install the extra: pip install 'agentrl\[reasoning-gym\]'"):
        import_extra("reasoning_gym_not_installed", "reasoning-gym", "env type 'reasoning_gym'")
