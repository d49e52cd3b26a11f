"""`look`: what a run folder holds, read once before a run starts or resumes in it (its
checkpoints, the run's step, the config it was trained with and its summary). Through the CLI,
with real runs: tests/e2e/test_run_folder.py."""

import json

from agentrl.config import load_config, save_config
from agentrl.runtime.run_folder import finished_summary, look
from agentrl.train.checkpoint import RUN_CONFIG, write_manifest


def _checkpoint(run_dir, step, config):
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    save_config(config, ckpt / RUN_CONFIG)
    write_manifest(ckpt, step)
    return ckpt


def test_an_empty_folder_holds_no_run(tmp_path):
    folder = look(tmp_path)
    assert (folder.checkpoints, folder.step, folder.run_config, folder.summary) == ((), None, None, None)


def test_a_run_without_a_checkpoint_is_at_step_0_with_its_folder_s_config(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    save_config(load_config(None, []), tmp_path / "config.yaml")
    folder = look(tmp_path)
    assert folder.step == 0 and folder.run_config == tmp_path / "config.yaml"
    assert folder.run_config_source == "config.yaml"


def test_the_newest_checkpoint_gives_the_step_and_the_config_unless_it_is_damaged(tmp_path):
    cfg = load_config(None, [])
    first, newest = _checkpoint(tmp_path, 2, cfg), _checkpoint(tmp_path, 4, cfg)
    folder = look(tmp_path)
    assert folder.checkpoints == (first, newest) and folder.step == 4
    assert folder.run_config == newest / RUN_CONFIG
    assert folder.run_config_source == f"checkpoints/{newest.name}/{RUN_CONFIG}"
    with open(newest / RUN_CONFIG, "a") as f:
        f.write("# edited after it was written\n")
    folder = look(tmp_path)
    assert folder.step == 4 and folder.run_config == first / RUN_CONFIG  # the damaged copy is passed over


def test_a_summary_that_is_not_an_object_is_no_summary(tmp_path):
    (tmp_path / "summary.json").write_text("[1, 2]")
    assert look(tmp_path).summary is None
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 3}))
    assert look(tmp_path).summary == {"steps": 3}


def test_a_run_is_not_finished_without_a_checkpoint_at_its_last_step(tmp_path):
    cfg = load_config(None, ["trainer.total_steps=4"])
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4}))
    assert finished_summary(cfg, look(tmp_path)) is None  # no checkpoint
    _checkpoint(tmp_path, 2, cfg)
    assert finished_summary(cfg, look(tmp_path)) is None  # the summary's step is not the checkpoint's
