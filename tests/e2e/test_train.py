"""End-to-end: the real `agentrl train` entry point with a tiny budget, determinism, errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main as cli_main
from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=2", "trainer.test_freq=1",
    "trainer.eval_episodes=2", "trainer.save_freq=1", "trainer.progress=false",
    "trainer.logger=[jsonl,tensorboard]",
]


ROOT = Path(__file__).parents[2]


def _agentrl(*args, cwd=None, env=None):
    """The CLI in a process of its own, importing this checkout's agentrl whatever `cwd` is."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": path, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def cache_dir(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


def test_smoke_run_of_the_cli_writes_the_run_folder(tmp_path, cache_dir, capsys):
    run = tmp_path / "run"
    res = _agentrl("train", "configs/frozen_lake.yaml", *TINY, f"run_dir={run}", f"model.cache_dir={cache_dir}",
                   cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    for key in ("eval_success_before", "eval_success_after", "eval_optimum", "wall_seconds"):
        assert key in summary
    assert summary["eval_optimum"] == 1.0 or summary["eval_optimum"] == 0.0  # 3 steps cannot reach G
    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r["step"] for r in rows if "reward/mean" in r]
    assert steps == [1, 2]
    assert any(k.startswith("loss/") for k in rows[1]) and any(k.startswith("perf/") for k in rows[1])
    lrs = [r["policy/lr"] for r in rows if "policy/lr" in r]
    assert len(lrs) == 2 and lrs[1] == pytest.approx(lrs[0] / 2)  # cosine over 2 steps: 1, then 0.5
    assert (run / "config.yaml").is_file() and (run / "curves.png").stat().st_size > 0
    assert list((run / "tensorboard").glob("events.out.tfevents*"))
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
    assert "eval_success_after" in res.stdout  # the closing summary table
    # agentrl eval evaluates the saved checkpoint (the command's entry point, in this process: the
    # process start is what the train above already proves)
    capsys.readouterr()
    assert cli_main(["eval", str(run), f"model.cache_dir={cache_dir}"]) == 0
    assert "eval/success" in capsys.readouterr().out


def test_same_seed_same_metrics(tmp_path, cache_dir):
    rows = []
    for name in ("a", "b"):
        cfg = load_config("configs/frozen_lake.yaml", [*TINY, f"run_dir={tmp_path / name}",
                                                       f"model.cache_dir={cache_dir}"])
        train(cfg, log=lambda m: None)
        rows.append([{k: v for k, v in r.items() if not k.startswith("perf/")}
                     for r in read_jsonl(tmp_path / name / "metrics.jsonl")])
    assert rows[0] == rows[1]
    assert any("reward/mean" in r for r in rows[0])


def test_ppo_with_critic_and_filters_trains_and_resumes(tmp_path, cache_dir):
    """GAE with a critic, KL in the reward, DAPO/RAGEN filters: every stage runs and logs its counts;
    a resumed run restores the critic and continues where the first stopped."""
    over = [*TINY, "algorithm.adv_estimator=gae", "critic.enable=true", "critic.ppo_mini_batch_size=4",
            "critic.micro_batch_size=2", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
            "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2",
            "rollout.rollout_filter_ratio=0.5", "rollout.batch_size=8", "actor.ppo_mini_batch_size=8",
            "critic.ppo_mini_batch_size=8", f"model.cache_dir={cache_dir}"]
    cfg = load_config("configs/frozen_lake.yaml", [*over, f"run_dir={tmp_path / 'a'}", "trainer.total_steps=3"])
    train(cfg, log=lambda m: None)
    rows = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # 4 groups asked for; the variance filter keeps half of what dynamic sampling let through
        assert r["rollout/kept_groups"] <= 2
        assert 1 <= r["rollout/gen_batches"] <= 2
        if r["rollout/kept_groups"]:
            assert "loss/value" in r and "policy/explained_variance" in r and "reward/kl_coef" in r
    # resume: what a run killed during step 3 leaves (step 2's checkpoint, the rows up to it, no
    # summary), continued from the checkpoint, equals 3 straight
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns("step_000003", "summary.json"))
    metrics = tmp_path / "b" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(line for line in lines if json.loads(line)["step"] <= 2))
    cfg_b3 = load_config("configs/frozen_lake.yaml", [*over, f"run_dir={tmp_path / 'b'}", "trainer.total_steps=3"])
    train(cfg_b3, resume=True, log=lambda m: None)
    rows_b = [r for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if "rollout/kept_groups" in r]
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("perf/")}  # noqa: E731
    assert [strip(r) for r in rows_b if r["step"] == 3] == [strip(rows[-1])]


@pytest.mark.parametrize("args, expected", [
    ([str(ROOT / "configs/frozen_lake.yaml"), "trainer.totl_steps=5"], "Did you mean 'trainer.total_steps'?"),
    (["model.path=/nonexistent/model/dir"], "model.path='/nonexistent/model/dir': no such directory"),
    (["env.type=frozen_lak"], "unknown env type 'frozen_lak'. Did you mean 'frozen_lake'?"),
    (["rollout.batch_size=30"], "not a multiple of rollout.group_size=8"),
    (["algorithm.adv_estimator=gea"], "unknown advantage estimator 'gea'. Did you mean 'gae'?"),
    (["algorithm.adv_estimator=gae"], "needs a value model: set critic.enable=true"),
])
def test_cli_errors_are_one_line(args, expected, tmp_path):
    # In a folder of its own: the default run folder (runs/frozen_lake) may hold a user's run in
    # the checkout, and a config error must not depend on it, nor leave a folder behind.
    res = _agentrl("train", *args, cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["json", "tabnanny"])  # a module already imported; one only on the import path
def test_an_imported_file_named_like_another_module_is_refused_in_one_line(tmp_path, name):
    """A .py file in `imports` becomes the module of its own name: one that would replace
    another is refused, naming both, before it runs."""
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / f"{name}.py"
    path.write_text("raise RuntimeError('this file must not run')\n")
    res = _agentrl("train", f"imports=[{path}]", cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert f"{path} would be module '{name}', the name of " in lines[0] and "rename the file" in lines[0]
    assert "must not run" not in lines[0]


def test_yaml_syntax_error_and_config_name(tmp_path):
    (tmp_path / "broken.yaml").write_text("trainer:\n  total_steps: [3\n")
    res = _agentrl("train", "--config-path", str(tmp_path), "--config-name", "broken", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "YAML syntax error" in res.stderr and "broken.yaml" in res.stderr


def test_help_lists_documented_fields():
    res = _agentrl("train", "--help")
    assert res.returncode == 0
    assert "trainer.total_steps" in res.stdout and "Training steps" in res.stdout
    assert "algorithm.adv_estimator" in res.stdout


def test_an_estimator_registered_in_an_imported_file_trains(tmp_path, cache_dir):
    """`imports=[my_estimator.py] algorithm.adv_estimator=NAME`: the user's file registers the
    estimator before the run checks that the name exists, and the run trains with it."""
    marker = tmp_path / "called"
    user = tmp_path / "my_estimator.py"
    user.write_text(
        "from agentrl.algos.advantages import grpo\n"
        "from agentrl.registry import register_estimator\n"
        f"MARKER = {str(marker)!r}\n"
        "@register_estimator('halved_grpo')\n"
        "def halved_grpo(inputs):\n"
        "    open(MARKER, 'a').write('x')\n"
        "    adv, ret = grpo(inputs)\n"
        "    return adv * 0.5, ret * 0.5\n")
    run = tmp_path / "run"
    # The CLI's entry point in this process (its process start is the smoke test's): the file is
    # imported by the command, before the config's checks, as in `agentrl train`.
    assert cli_main(["train", str(ROOT / "configs/frozen_lake.yaml"), *TINY, f"run_dir={run}",
                     f"model.cache_dir={cache_dir}", f"imports=[{user}]", "algorithm.adv_estimator=halved_grpo"]) == 0
    assert marker.read_text() == "xx"  # once per training step
    assert (run / "metrics.jsonl").read_text().count("\n") >= 2
