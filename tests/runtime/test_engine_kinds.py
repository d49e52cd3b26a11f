"""Engine kinds are a registry: a kind a user registers from a file of `imports` is planned,
described and trains as a built-in one does, and an unknown engine.kind fails in one line naming
the registered kinds."""

import json
import sys
import textwrap

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.registry import FILE_MODULES

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
        "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
        "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=1", "trainer.test_freq=0",
        "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]"]

# A user's engine kind: the in-process engine under another name, which counts the engines it makes
# and says so in the plan.
KIND_FILE = textwrap.dedent('''
    """A user's engine kind: the local engine, counted."""
    from agentrl.registry import register_engine_kind
    from agentrl.runtime.assembly.engine_kinds import LocalKind

    MADE = []


    @register_engine_kind("counted_local")
    class CountedLocal(LocalKind):
        """The in-process engine, each one it makes counted."""

        def make(self, run_plan, model, tokenizer, device):
            engine = super().make(run_plan, model, tokenizer, device)
            MADE.append(type(engine).__name__)
            return engine

        def describe(self, run_plan):
            return [("engine", "counted_local (the in-process engine, counted)")]
''')


@pytest.fixture
def kind_file(tmp_path, registries_restored):
    """The user's kind file, and afterwards no trace of it in this process's registry or modules."""
    path = tmp_path / "counted_engine_kind.py"
    path.write_text(KIND_FILE)
    yield path
    sys.modules.pop(path.stem, None)
    FILE_MODULES.discard(path.stem)


def test_a_user_registered_engine_kind_trains_a_step_from_an_imports_file(kind_file, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["configs/frozen_lake.yaml", *TINY, f"imports=[{kind_file}]", "engine.kind=counted_local",
            f"model.cache_dir={tmp_path / 'cache'}", f"run_dir={run}"]
    assert main(["plan", *args]) == 0
    shown = capsys.readouterr().out
    assert "counted_local (the in-process engine, counted)" in shown, shown
    assert main(["train", *args]) == 0
    assert sys.modules[kind_file.stem].MADE == ["LocalEngine"]  # the run's engine came from the user's kind
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]  # one step trained
    assert json.loads((run / "plan.json").read_text())["engine"]["kind"] == "counted_local"


def test_an_unknown_engine_kind_fails_in_one_line_naming_the_registered_kinds(kind_file):
    with pytest.raises(ConfigError) as err:
        load_config("configs/frozen_lake.yaml", ["engine.kind=lokal"])
    assert str(err.value) == ("engine.kind='lokal' is not allowed; choose one of 'local', 'remote', 'vllm'. "
                              "Did you mean 'local'?")
    from agentrl.runtime.assembly.plan import plan

    cfg = load_config("configs/frozen_lake.yaml", [*TINY, f"imports=[{kind_file}]", "engine.kind=counted_lokal"])
    with pytest.raises(ConfigError) as err:  # checked once the user's modules are imported
        plan(cfg)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("engine.kind='counted_lokal' is not allowed; choose one of 'local', 'remote', "
                                     "'vllm', 'counted_local'.")
