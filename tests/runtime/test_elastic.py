"""`agentrl scale RUN_DIR engines=N` (elastic rollout, runtime/ray/elastic.py): what it accepts and
refuses, without a cluster. The run it scales: tests/runtime/test_ray_elastic.py."""

import json

import pytest

from agentrl import cli
from agentrl.config import load_config, save_config


def _run_folder(path, kind, *overrides):
    path.mkdir()
    save_config(load_config(None, [f"runtime.kind={kind}", *overrides]), path / "config.yaml")
    return path


@pytest.mark.parametrize("targets, message", [
    (["engines=0"], "engines=0: give a whole number of engine replicas, at least 1"),
    (["engines=two"], "engines=two: give a whole number of engine replicas, at least 1"),
    (["engines=1.5"], "engines=1.5: give a whole number of engine replicas, at least 1"),
    (["gpus=2"], "unknown scale target 'gpus=2': the one accepted is engines=N"),
    (["3"], "unknown scale target '3': the one accepted is engines=N"),
    ([], "give one target, engines=N (the engine replicas the run should have), got nothing"),
    (["engines=2", "engines=3"], "give one target, engines=N"),
], ids=["zero", "word", "fraction", "other-target", "bare-number", "none", "two"])
def test_bad_scale_input_is_one_line_and_writes_nothing(tmp_path, capsys, targets, message):
    run = _run_folder(tmp_path / "run", "ray")
    assert cli.main(["scale", str(run), *targets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentrl: error: ") and message in err[0], err
    assert not (run / "scale.json").exists()


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "is not a run folder (no config.yaml)"),
    (lambda p: _run_folder(p, "local"), "is a runtime.kind=local run: only a Ray run (runtime.kind=ray) has engine"),
    (lambda p: _run_folder(p, "ray", "engine.kind=remote", "engine.urls=[http://127.0.0.1:9]"),
     "generates on engine.kind=remote: only the Ray run's own engine replicas (engine.kind=local) are scaled"),
    (lambda p: _run_folder(p, "ray", "rollout.max_staleness=1"),
     "plays asynchronously (rollout.max_staleness=1): replicas are added and removed between on-policy steps"),
], ids=["no-run", "local-run", "served", "async"])
def test_scale_refuses_a_folder_without_a_ray_run_in_one_line(tmp_path, capsys, make, message):
    run = make(tmp_path / "run")
    assert cli.main(["scale", str(run), "engines=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (run / "scale.json").exists()


def test_scale_writes_the_request_a_ray_run_reads(tmp_path, capsys):
    from agentrl.runtime.ray.scale_file import read_request

    run = _run_folder(tmp_path / "run", "ray")
    assert cli.main(["scale", str(run), "engines=3"]) == 0
    assert "for 3 engine replicas" in capsys.readouterr().out
    first = read_request(run)
    assert first[1] == 3 and json.loads((run / "scale.json").read_text())["engines"] == 3
    assert cli.main(["scale", str(run), "engines=3"]) == 0
    assert read_request(run)[1] == 3 and read_request(run)[0] != first[0]  # asked again: a new request
