"""End-to-end: one run mixing FrozenLake and math, a seed-style agent under the trainer, and
start-up errors that stop a run before any work, each as one line."""

import copy
import json
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.envs.math_grader import shutdown_grader
from agentrl.metrics import read_jsonl
from agentrl.models.loading import save_pretrained
from agentrl.runtime.local import train
from helpers import without_plan
from test_train import TINY, _agentrl

ROOT = Path(__file__).parents[2]
SMALL = [o for o in TINY if not o.startswith(("env.", "trainer.total_steps", "trainer.eval_episodes"))]
MIXED = [
    "custom_envs={lake: {type: frozen_lake, max_turns: 3, args: {max_steps: 3}}, "
    "sums: {type: math, max_turns: 2, args: {max_operand: 4}, agent: {type: math_retry, args: {turn_discount: 0.5}}}}",
    "rollout.batch_size=6", "actor.ppo_mini_batch_size=6", "actor.micro_batch_size=3",
    "train_env_manager.tags=[lake, sums]", "train_env_manager.n_groups=[1, 2]",
    "val_env_manager.n_groups=[1, 3]", "trainer.eval_episodes=4", "trainer.total_steps=2",
]


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    yield
    shutdown_grader()


def test_one_run_mixes_frozen_lake_and_math(tmp_path):
    cfg = load_config(None, [*SMALL, *MIXED, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # 1 group of 2 FrozenLake episodes and 2 groups of 2 math episodes per step
        assert r["env/lake/episodes"] == 2 and r["env/sums/episodes"] == 4 and r["rollout/errors"] == 0
        assert {"env/lake/success", "env/lake/return", "env/lake/turns", "env/lake/optimal_success",
                "env/sums/success", "env/sums/success_at_1", "env/sums/success_at_2",
                "env/sums/grader_timeout", "rollout/truncated_max_turns"} <= set(r)
        assert "env/lake/success_at_1" not in r and r["env/sums/turns"] <= 2
        assert r["env/sums/success_at_1"] <= r["env/sums/success_at_2"] == r["env/sums/success"]
    evals = [r for r in rows if "eval/success" in r]
    assert len(evals) == 3  # before training, after step 1 (test_freq=1), and the final one
    for r in evals:  # val_env_manager: 1 FrozenLake and 3 math episodes
        assert r["eval/lake/episodes"] == 1 and r["eval/sums/episodes"] == 3
        assert r["eval/success"] == pytest.approx((r["eval/lake/success"] + 3 * r["eval/sums/success"]) / 4)
    for tag in ("lake", "sums"):
        assert f"eval_{tag}_success_before" in summary and f"eval_{tag}_success_after" in summary
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["eval_sums_success_after"] == \
        summary["eval_sums_success_after"]
    saved = load_config(tmp_path / "run" / "config.yaml")  # the resolved config round-trips
    assert saved.custom_envs == cfg.custom_envs and saved.group_tags("train") == cfg.group_tags("train")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_model, tiny_tokenizer):
    path = tmp_path_factory.mktemp("tiny") / "model"
    save_pretrained(copy.deepcopy(tiny_model), tiny_tokenizer, path)
    return path


def test_seed_style_agent_trains_under_the_trainer(tmp_path, tiny_model_dir):
    cfg = load_config(None, [*SMALL, f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}",
                             f"imports=[{ROOT / 'examples' / 'seed_math_agent.py'}]",
                             "env.type=math-code-single-step", "env.max_turns=2", "env.args={max_operand: 4}",
                             "agent.type=math-multi-turn", "agent.args={turn_level_discount: 0.5}",
                             "trainer.total_steps=2", "trainer.eval_episodes=2"])
    summary = train(cfg, log=lambda m: None)
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/errors"] == 0 and r["env/math-code-single-step/episodes"] == 4
        assert "loss/pg" in r or any(k.startswith("loss/") for k in r)
    assert "eval_success_after" in summary


@pytest.fixture(scope="module")
def bad_template_dir(tmp_path_factory, tiny_model, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # drops every assistant turn but the last: turn k+1 no longer extends turn k (as Qwen3 does with <think>)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                         "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    path = tmp_path_factory.mktemp("bad") / "model"
    save_pretrained(copy.deepcopy(tiny_model), tok, path)
    return path


@pytest.mark.parametrize("case", ["unknown_tag", "group_size", "no_question_column", "template", "agent_type",
                                  "agent_arg"])
def test_start_up_errors_are_one_line(case, tmp_path, bad_template_dir, capsys):
    """Each fails before any model is built or warm-started, with one line on stderr (the CLI's
    own entry point, in this process; test_train.py runs it as a subprocess)."""
    from agentrl.cli import main

    (tmp_path / "noq.jsonl").write_text('{"prompt": "1 + 1?", "answer": "2"}\n')
    args, expected = {
        "unknown_tag": (["custom_envs={lake: {type: frozen_lake}, sums: {type: math}}",
                         "train_env_manager.tags=[lake, sumz]"],
                        "train_env_manager.tags: unknown tag 'sumz'. Did you mean 'sums'?"),
        "group_size": (["rollout.group_size=3"], "rollout.batch_size=32 is not a multiple of rollout.group_size=3"),
        "no_question_column": (["env.type=math", f"env.args.dataset_path={tmp_path / 'noq.jsonl'}"],
                               "has no 'question' column (its columns: prompt, answer); set args.question_key"),
        "template": ([f"model.path={bad_template_dir}"], "chat template is not prefix-preserving"),
        "agent_type": (["custom_envs={m: {type: math, agent: {type: math_retyr}}}"],
                       "custom_envs.m.agent.type: unknown agent type 'math_retyr'. Did you mean 'math_retry'?"),
        "agent_arg": (["env.type=math", "agent.type=math_retry", "agent.args={turn_discont: 0.5}"],
                      "agent.args.turn_discont is not an argument of agent type 'math_retry'"),
    }[case]
    code = main(["train", *args, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}",
                 "trainer.progress=false"])
    lines = without_plan(capsys.readouterr().err).strip().splitlines()  # a run logs its plan first
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "cache").exists()  # stopped before building or warm-starting any model


def test_unknown_tag_through_the_cli_process(tmp_path):
    res = _agentrl("train", "custom_envs={lake: {type: frozen_lake}, sums: {type: math}}",
                   "val_env_manager.tags=[lake, sumz]", cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and lines == ["agentrl: error: val_env_manager.tags: unknown tag 'sumz'. "
                                             "Did you mean 'sums'? Defined: lake, sums"]
