"""`agentrl plan` and the run plan a run writes: every shipped config checked and described
without building a model, a bad key in one line, and plan.json equal to what `agentrl plan`
prints for the run's config (fresh and resumed)."""

import asyncio
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import load_config

from helpers import SUITE_MODULES, without_plan

ROOT = Path(__file__).parents[2]
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
        "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
        "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=2", "trainer.test_freq=1",
        "trainer.eval_episodes=2", "trainer.save_freq=1", "trainer.progress=false", "trainer.logger=[jsonl]"]


def _config_param(path: Path):
    """A shipped config as a param, skipped when the suite its env wraps is not installed."""
    import importlib.util

    text = path.read_text()
    missing = [m for name, m in SUITE_MODULES.items()
               if f"type: {name}" in text and importlib.util.find_spec(m) is None]
    return pytest.param(path, id=path.stem, marks=pytest.mark.skipif(bool(missing), reason=f"{missing} not installed"))


def _agentrl(*args, env=None):
    """The CLI in a process of its own, importing this checkout's agentrl."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})}, timeout=600)


def _in_process(capfd, *args):
    """The CLI in this process, from the checkout (where the configs' paths start), its output caught
    at the file descriptors (a log handler's or a library's writes too): a finished process's
    (returncode, stdout, stderr). A process of its own costs seconds of imports; one `train` of
    those below runs so, to show that nothing, not even an import's warning, comes before the plan."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(list(args))
    finally:
        os.chdir(here)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


@pytest.mark.parametrize("config", [_config_param(p) for p in sorted((ROOT / "configs").glob("*.yaml"))])
def test_plan_of_every_shipped_config_says_what_the_run_is_made_of_and_builds_nothing(config, tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.chdir(tmp_path)  # the run folder the plan names (runs/<exp_name>) is not made here
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    assert main(["plan", str(config)]) == 0
    out, err = capsys.readouterr()
    cfg = load_config(config)
    groups = cfg.rollout.batch_size // cfg.rollout.group_size
    assert f"{groups} groups of {cfg.rollout.group_size} episodes" in out, out
    for tag, n in Counter(cfg.group_tags("train")).items():
        definition = cfg.env_definitions()[tag]
        assert f"env {definition.type}," in out and f"at most {definition.max_turns} turns" in out
        assert f"{tag} x{n}" in out
    assert re.search(rf"^  runtime +{cfg.runtime.kind},", out, re.M)
    assert f"{cfg.algorithm.adv_estimator}, loss mode" in out
    # Nothing built: no model cached or warm-started, no run folder made. An env that writes its
    # data when built and a tool that indexes it do: multihop's corpus, the search tool's index.
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    data = [p for p in made if p == "runs/multihop/corpus-0.jsonl" or p.startswith("cache/search/")]
    assert (made == data) if config.stem == "tool_search" else made == [], made
    assert "warm start" not in err and "building" not in err, err


def test_plan_takes_overrides_and_the_hydra_style_options_and_prints_json(capsys):
    assert main(["plan", "--config-path", str(ROOT / "configs"), "--config-name", "mixed", "runtime.kind=ray",
                 "rollout.batch_size=48", "train_env_manager.n_groups=[3,2,1]", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["groups"]["per_step"] == 6 and plan["groups"]["train"] == {"frozen_lake": 3, "sokoban": 2, "math": 1}
    assert plan["horizon"]["max_turns"] == 10 and plan["budgets"]["max_new_tokens"] == 8
    assert plan["tags"]["math"]["agent_type"] == "math_retry" and plan["tags"]["sokoban"]["env_type"] == "sokoban"
    assert plan["runtime"]["kind"] == "ray"
    roles = Counter(w["role"] for w in plan["runtime"]["placement"]["workers"])
    assert roles == {"actor_train": 1, "actor_infer": 1, "env_manager": 1}


@pytest.mark.parametrize("args, expected", [
    (["trainer.totl_steps=5"], "Did you mean 'trainer.total_steps'?"),
    (["env.type=frozen_lak"], "unknown env type 'frozen_lak'. Did you mean 'frozen_lake'?"),
    (["model.path=/nonexistent/model/dir"], "model.path='/nonexistent/model/dir': no such directory"),
])
def test_a_bad_config_is_one_line_and_exit_2(args, expected, tmp_path, capfd):
    res = _in_process(capfd, "plan", "configs/frozen_lake.yaml", *args, f"model.cache_dir={tmp_path / 'cache'}")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], res.stderr[-2000:]
    assert res.stdout == "" and not (tmp_path / "cache").exists()


def test_an_estimator_of_the_earlier_positional_form_is_refused_when_the_run_is_planned(tmp_path):
    """An imported file registers an estimator taking the old positional arguments: `agentrl plan`
    refuses it in one line (exit 2), before any model is built or step is played."""
    user = tmp_path / "old_form_estimator.py"
    user.write_text(
        "from agentrl.registry import register_estimator\n"
        "@register_estimator('old_form')\n"
        "def old_form(token_rewards, response_mask, index, values, config, state_ids=None):\n"
        "    return token_rewards, token_rewards\n")
    res = _agentrl("plan", "configs/frozen_lake.yaml", f"imports=[{user}]", "algorithm.adv_estimator=old_form",
                   f"model.cache_dir={tmp_path / 'cache'}")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "algorithm.adv_estimator: estimator 'old_form'" in lines[0] and "EstimatorInput" in lines[0]
    assert res.stdout == "" and not (tmp_path / "cache").exists()


def test_a_run_writes_the_plan_agentrl_plan_prints_and_logs_it_at_its_start(tmp_path, capfd):
    """plan.json beside config.yaml equals `agentrl plan --json` of the same config, the run's
    log (a process of its own) opens with `agentrl plan`'s text, and a resume that changes the
    run's length rewrites it."""
    run = tmp_path / "run"
    args = ["configs/frozen_lake.yaml", *TINY, f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"]
    res = _agentrl("train", *args)
    assert res.returncode == 0, res.stderr[-2000:]
    shown = _in_process(capfd, "plan", *args)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert res.stderr.startswith(shown.stdout)  # logged first, before the warm start
    assert without_plan(res.stderr).strip().splitlines()[0].startswith("building the embedded tiny model")
    as_json = _in_process(capfd, "plan", *args, "--json")
    written = json.loads((run / "plan.json").read_text())
    assert written == json.loads(as_json.stdout) and written["schedule"]["total_steps"] == 2
    assert written["tags"]["frozen_lake"]["env_args"]["max_steps"] == 3
    assert _in_process(capfd, "resume", str(run), "trainer.total_steps=3").returncode == 0
    again = json.loads(_in_process(capfd, "plan", *args, "trainer.total_steps=3", "--json").stdout)
    assert json.loads((run / "plan.json").read_text()) == again and again["schedule"]["total_steps"] == 3


# Every build step reads the plan: the functions that build a run's parts take a RunPlan (or one
# of its sections), never the whole Config; only making the plan (preflight) reads the config.
BUILD_STEPS = {
    "agentrl.runtime.assembly.trainer": ["build_parts"],
    "agentrl.runtime.assembly.policy": ["build_policy", "load_policy"],
    "agentrl.warm_start.recipe": ["embedded_policy", "build_tiny"],
    "agentrl.runtime.assembly.rollout": ["build_rollout", "task_source"],
    "agentrl.runtime.assembly.engines": ["make_engine"],
    "agentrl.runtime.assembly.envs": ["bind", "make_sampling", "make_budget", "make_agent", "make_collector",
                                   "check_templates", "agent_texts"],
    "agentrl.warm_start.seeds": ["seed_texts", "demo_factories"],
    "agentrl.runtime.assembly.learners": ["build_learners", "build_reference", "build_critic"],
}


@pytest.mark.parametrize("module", sorted(BUILD_STEPS))
def test_every_build_step_reads_the_plan_not_the_config(module):
    import importlib
    import inspect

    mod = importlib.import_module(module)
    for name in BUILD_STEPS[module]:
        hints = {k: str(v.annotation) for k, v in inspect.signature(getattr(mod, name)).parameters.items()}
        assert not [k for k, h in hints.items() if re.search(r"\bConfig\b", h)], f"{module}.{name} takes a Config: {hints}"


def test_a_plan_keeps_its_own_sections_when_the_config_changes_afterwards():
    from agentrl.runtime.assembly.plan import plan

    cfg = load_config(None, TINY)
    run_plan = plan(cfg)
    cfg.rollout.temperature, cfg.model.tiny.hidden_size, cfg.engine.kind = 0.5, 64, "remote"
    assert (run_plan.rollout.temperature, run_plan.model.tiny.hidden_size, run_plan.engine.kind) == (1.0, 32, "local")
    assert run_plan.to_dict() == plan(load_config(None, TINY)).to_dict()


def test_a_plan_sent_to_another_process_binds_env_factories_there(tmp_path):
    import pickle

    from agentrl.runtime.assembly.envs import bind
    from agentrl.runtime.assembly.plan import plan

    run_plan = plan(load_config(None, TINY))
    sent = pickle.loads(pickle.dumps(run_plan.portable()))  # what a Ray actor receives
    assert sent.factories == {} and sent.to_dict() == run_plan.to_dict()
    bound = bind(sent)
    assert list(bound.factories) == list(run_plan.factories)
    for tag, make_env in bound.factories.items():
        mine, theirs = make_env(), run_plan.factories[tag]()
        assert type(mine) is type(theirs) and vars(mine).keys() == vars(theirs).keys()
        assert asyncio.run(mine.reset(seed=3)) == asyncio.run(theirs.reset(seed=3))
