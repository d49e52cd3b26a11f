"""The math env: math-verify decides rewards, a hung grading is cut off, datasets load or fail in one line."""

import asyncio
import json
import random

import psutil
import pytest
from helpers import no_new_child_processes

from agentrl.envs.math import MathEnv, arithmetic_problem, evaluate, load_problems
from agentrl.envs.math_grader import Grader, shared_grader, shutdown_grader
from agentrl.errors import ConfigError, EnvError


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    with no_new_child_processes(shutdown_grader, "grader processes"):
        yield


def _dataset(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


EQUIVALENT = [  # (reference, reply): math-verify says equal
    ("1/2", "<answer>0.5</answer>"),
    ("0.5", "<answer>\\boxed{\\frac{1}{2}}</answer>"),
    ("\\frac{\\sqrt{2}}{2}", "<answer>$\\sqrt{2}/2$</answer>"),
    ("42", "The answer is 42."),
    ("3", "<answer>3.0</answer>"),
    ("-7", "<answer>-7</answer>"),
    ("x + 1", "<answer>$1 + x$</answer>"),  # a bare reference is read as one expression, not "1"
    ("(1, 2)", "<answer>$(1,2)$</answer>"),
]
DIFFERENT = [  # (reference, reply): not equal
    ("1/2", "<answer>0.51</answer>"),
    ("4", "<answer>\\boxed{3}</answer>"),
    ("2", "<answer>\\sqrt{2}</answer>"),
    ("7", "<answer>-7</answer>"),
    ("x + 1", "<answer>$x - 1$</answer>"),
]


def _rows():
    return [{"question": f"q{i}", "answer": gold} for i, (gold, _) in enumerate(EQUIVALENT + DIFFERENT)]


def test_rewards_follow_math_verify(tmp_path):
    env = MathEnv(dataset_path=str(_dataset(tmp_path, _rows())), timeout=10.0)

    async def grade_all():
        out = []
        for i, (_, reply) in enumerate(EQUIVALENT + DIFFERENT):
            question, _ = await env.reset(seed=i)
            assert question == f"q{i}"
            out.append(await env.step(reply))
        return out

    results = asyncio.run(grade_all())
    for (gold, reply), (obs, reward, terminated, truncated, info) in zip(EQUIVALENT, results):
        assert (reward, info["success"], obs) == (1.0, True, "Correct."), (gold, reply)
        assert terminated and not truncated
    for (gold, reply), (obs, reward, _, _, info) in zip(DIFFERENT, results[len(EQUIVALENT):]):
        assert (reward, info["success"], obs) == (0.0, False, "Wrong."), (gold, reply)
        assert info["action_valid"]


def test_no_answer_is_a_format_penalty_and_never_raises():
    env = MathEnv(format_penalty=-0.25)

    async def go():
        await env.reset(seed=0)
        return [await env.step(r) for r in ["", "no number here", "<answer></answer>", "\x00" * 10_000, "🙂" * 500]]

    for _, reward, terminated, _, info in asyncio.run(go()):
        assert reward == -0.25 and terminated and not info["action_valid"] and not info["success"]


def _alive(pid):
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_pathological_answer_hits_the_time_limit_and_grading_goes_on():
    grader = Grader()
    try:
        assert asyncio.run(grader.grade("1/2", "0.5", 10.0)).correct
        first = grader.worker_pids()

        async def go():
            # Graded in one batch; sympy alone runs over 20 s on the first answer.
            answers = ["\\boxed{9^{9^{9^{9}}}}", "7", "8"]
            return await asyncio.gather(*(grader.grade("7", a, timeout=2.0) for a in answers))

        hung, right, wrong = asyncio.run(go())
        assert hung.timed_out and not hung.correct
        assert right.correct and not right.timed_out and not wrong.correct and wrong.parsed
        # the batch ran past its limit, then the answers were graded alone: only one timed out
        assert grader.timeouts == 1 and grader.restarts == 2
        now = grader.worker_pids()
        assert now and not any(_alive(p) for p in first)  # the hung worker was killed and replaced
    finally:
        grader.shutdown()
    assert not any(_alive(p) for p in now)


def test_env_reports_a_grader_timeout(tmp_path):
    env = MathEnv(dataset_path=str(_dataset(tmp_path, [{"question": "q", "answer": "7"}])), timeout=0.5)

    async def go():
        await env.reset(seed=0)
        return await env.step("<answer>\\boxed{9^{9^{9^{9}}}}</answer>")

    _, reward, terminated, _, info = asyncio.run(go())
    assert terminated and not info["success"] and info["metrics"]["grader_timeout"] == 1.0


def test_grading_runs_off_the_event_loop():
    """While an answer is graded, other episodes' coroutines keep running: the loop ticks ten
    times while one answer (over 20 s of sympy) is still being graded."""
    grader = Grader()

    async def go():
        await grader.grade("1", "1", 60.0)  # start the worker first
        grading = asyncio.create_task(grader.grade("7", "\\boxed{9^{9^{9^{9}}}}", timeout=600.0))
        ticks = 0
        while ticks < 10:
            ticks += 1
            await asyncio.sleep(0.01)
        still_grading = not grading.done()
        grading.cancel()
        return still_grading

    try:
        assert asyncio.run(go())
    finally:
        grader.shutdown()


def test_synthetic_problems_by_difficulty():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14 and evaluate([10, 3, 2], ["-", "-"]) == 5
    rng = random.Random(0)
    for _ in range(200):
        q, a = arithmetic_problem(rng, 10, 99, 3, "+-*")
        expr = q.removeprefix("What is ").removesuffix("?")
        assert len(expr.split()) == 7 and all(10 <= int(x) <= 99 for x in expr.split()[::2])
        assert int(a) == eval(expr)  # our own generated digits and operators only
    env = MathEnv(max_operand=4, num_ops=2, ops="+-")
    lo, hi = env.answer_range()
    values = {int(env._problem(k)[1]) for k in range(3000)}
    assert (min(values), max(values)) == (lo, hi) == (-8, 12)
    assert all(lo <= int(env.sample_action(random.Random(k))[8:-9]) <= hi for k in range(50))


def test_same_seed_same_question():
    async def question(env, seed):
        return (await env.reset(seed=seed))[0]

    a, b = MathEnv(max_operand=99, num_ops=2, ops="+*"), MathEnv(max_operand=99, num_ops=2, ops="+*")
    assert [asyncio.run(question(a, s)) for s in range(5)] == [asyncio.run(question(b, s)) for s in range(5)]
    assert len({asyncio.run(question(a, s)) for s in range(20)}) > 10


def test_step_before_reset_is_an_env_error():
    with pytest.raises(EnvError, match="reset"):
        asyncio.run(MathEnv().step("<answer>1</answer>"))


def test_jsonl_and_parquet_datasets(tmp_path):
    rows = [{"question": "What is 2 + 2?", "answer": "4", "extra": 1}, {"question": "Half?", "answer": "1/2", "extra": 2}]
    jsonl = _dataset(tmp_path, rows)
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    for path in (jsonl, tmp_path / "rows.parquet"):
        assert load_problems(str(path)) == [("What is 2 + 2?", "4"), ("Half?", "1/2")]
    renamed = _dataset(tmp_path, [{"problem": "p", "solution": "3"}], "renamed.jsonl")
    assert load_problems(str(renamed), "problem", "solution") == [("p", "3")]


@pytest.mark.parametrize("args, match", [
    (dict(dataset_path="missing.jsonl"), "no such file"),
    (dict(dataset_path="rows.csv"), "must end in .jsonl, .json, .parquet"),
    (dict(dataset_path="noq.jsonl"), "has no 'question' column .*columns: prompt, answer.*question_key"),
    (dict(max_operand=-1), "max_operand=-1"),
    (dict(ops="+/"), "ops='\\+/'"),
    (dict(timeout=0), "timeout=0"),
])
def test_bad_arguments_are_one_line_config_errors(tmp_path, monkeypatch, args, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("question,answer\n")
    _dataset(tmp_path, [{"prompt": "p", "answer": "1"}], "noq.jsonl")
    with pytest.raises(ConfigError, match=match) as e:
        MathEnv(**args)
    assert "\n" not in str(e.value)


def test_the_reference_is_the_most_frequent_right_answer():
    class Played:
        def __init__(self, seed):
            self.reset_info = {"question_seed": seed}

    env = MathEnv(min_operand=0, max_operand=2)
    played = [Played(1_000_000 + k) for k in range(50)]
    answers = [env._problem(p.reset_info["question_seed"])[1] for p in played]
    best = max(answers.count(a) for a in set(answers)) / len(answers)
    assert env.eval_baselines(played) == {"most_frequent_answer": best} and 0.2 < best < 0.6  # sums 0..4
