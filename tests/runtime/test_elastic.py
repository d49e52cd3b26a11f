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
], ids=["no-run", "local-run", "served"])
def test_scale_refuses_a_folder_without_a_ray_run_in_one_line(tmp_path, capsys, make, message):
    run = make(tmp_path / "run")
    assert cli.main(["scale", str(run), "engines=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (run / "scale.json").exists()


@pytest.mark.parametrize("extra", [[], ["rollout.max_staleness=1"]], ids=["on-policy", "async"])
def test_scale_writes_the_request_a_ray_run_reads(tmp_path, capsys, extra):
    from agentrl.runtime.ray.scale_file import read_request

    run = _run_folder(tmp_path / "run", "ray", *extra)
    assert cli.main(["scale", str(run), "engines=3"]) == 0
    assert "for 3 engine replicas" in capsys.readouterr().out
    first = read_request(run)
    assert first[1] == 3 and json.loads((run / "scale.json").read_text())["engines"] == 3
    assert cli.main(["scale", str(run), "engines=3"]) == 0
    assert read_request(run)[1] == 3 and read_request(run)[0] != first[0]  # asked again: a new request


@pytest.mark.parametrize("value", ["1000000000", "1" + "0" * 38, "10**38", "\uff13", "1_000", "+3", " 3", "3 ",
                                   "1025", "-1", "0x10", "9" * 5000])
def test_a_count_that_is_not_plain_digits_or_past_the_maximum_is_refused_in_one_line(tmp_path, capsys, value):
    """int() takes "1_000", full-width digits and any size: the count is plain ASCII digits, 1..1024."""
    run = _run_folder(tmp_path / "run", "ray")
    assert cli.main(["scale", str(run), f"engines={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give a whole number of engine replicas, at least 1 and at most 1024, in plain digits" \
        in err[0], err
    assert len(err[0]) < 400  # a 5,000-digit value is not echoed whole
    assert not (run / "scale.json").exists()


def test_replicas_that_would_reserve_nothing_are_refused_beyond_the_placed_ones(tmp_path, capsys):
    """runtime.actor_infer.num_cpus=0 (valid) on CPU: a replica beyond the placed ones reserves
    nothing, so the cluster could never say no; asking for one is refused, the placed count is not."""
    run = _run_folder(tmp_path / "run", "ray", "runtime.actor_infer.num_cpus=0")
    assert cli.main(["scale", str(run), "engines=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.actor_infer.num_cpus=0" in err[0] and "ask at most engines=1" in err[0], err
    assert not (run / "scale.json").exists()
    assert cli.main(["scale", str(run), "engines=1"]) == 0


def test_a_run_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    run = _run_folder(tmp_path / "run", "ray")
    (run / "scale.json").mkdir()  # the request cannot be written there (chmod would not stop root)
    assert cli.main(["scale", str(run), "engines=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentrl: error: cannot write the scale request"), err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "scale.json"]  # no temporary file left


# ---------------------------------------------------------------- the loop on rank 0, without a cluster
def test_growth_stops_where_a_replica_would_reserve_nothing():
    from agentrl.runtime.ray.elastic import growth, replica_bundle

    cpu, free = replica_bundle(1.0, False), replica_bundle(0.0, False)
    assert cpu == {"CPU": 1.0} and free == {} and replica_bundle(0.0, True) == {"GPU": 1.0}
    assert growth(1, 5, 1, cpu) == (5, None)  # the cluster bounds it: each waits for its bundle
    assert growth(1, 10**9, 1, cpu) == (1024, None)  # a hand-edited request past the maximum
    reach, why = growth(1, 1000, 1, free)
    assert reach == 1 and "engine-1 would reserve no resources" in why and "\n" not in why
    assert growth(1, 3, 3, free) == (3, None)  # the run's own bundles hold those (one removed earlier)
    assert growth(2, 5, 3, free)[0] == 3
    assert growth(3, 2, 1, free) == (2, None)  # shrinking is never stopped


class _StandInActor:
    """What `ray.remote(EngineActor).options(...).remote(...)` returns, counted."""

    def __init__(self, made):
        made.append(self)
        self.info = type("Method", (), {"remote": staticmethod(lambda: {"node": "n"})})()


def test_the_loop_starts_no_replica_that_would_reserve_nothing_and_logs_it_once(tmp_path, monkeypatch):
    """A request for 1,000 replicas with num_cpus=0 on CPU (the run placed 1): rank 0's loop used
    to start replicas without end; it starts none, says why once, and keeps its one replica."""
    import types

    ray = pytest.importorskip("ray")
    from agentrl.runtime.ray.elastic import ElasticEngines, ElasticSpec
    from agentrl.runtime.ray.placement import Worker

    made = []

    class _Remote:
        def options(self, **kwargs):
            return self

        def remote(self, *args):
            return _StandInActor(made)
    monkeypatch.setattr(ray, "remote", lambda cls: _Remote())  # a stand-in cluster: no Ray started here
    monkeypatch.setattr(ray, "get", lambda ref, **kwargs: ref)
    (tmp_path / "scale.json").write_text(json.dumps({"engines": 1000, "id": "a"}))
    source = types.SimpleNamespace(engines=["engine-0"], engine_names=["engine-0"], managers=[], most_engines=1,
                                   restart_timeout=1.0,
                                   transport=types.SimpleNamespace(name="object_store"),
                                   bring_up_to_date=lambda indices: None)
    spec = ElasticSpec(None, None, [Worker("actor_infer", 0, 0.0)], "t-", 0, None, 0, str(tmp_path), 1.0, False)
    logs = []
    loop = ElasticEngines(spec, source, logs.append)
    for _ in range(3):  # three step boundaries
        loop.at_boundary()
    assert made == [] and source.engines == ["engine-0"]
    assert len(logs) == 2 and "would reserve no resources" in logs[0] and logs[1] == \
        "elastic: 1 -> 1 engine replicas (asked 1000)", logs
