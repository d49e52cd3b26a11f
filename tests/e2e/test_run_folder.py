"""The run folder under misuse and faults, through the real CLI: another run in the same folder,
resumes with changed configs, two processes at once, corrupt checkpoints and caches, folders that
are files or read-only, a full disk, interrupts and signals. Each ends in one line, and leaves the
folder as a later `resume` or `eval` can use it.

A refusal, a fault or a signal is met by `agentrl` in a process of its own (its whole stderr is the
one line, its exit code the process's). The runs and evals around them (the run they damage, the
resume or eval that must cope) go through the CLI's entry point, `main`, in this process: what they
prove is the folder, and the model stack's imports (most of a short run's CPU) are paid once."""

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.metrics import read_jsonl

from helpers import without_plan
from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).parents[2]
STEPS = 4
# Runs the real CLI with one fault injected at a chosen point: `torch.save` of the optimizer of
# checkpoint N raises (`enospc`: a full disk; `sigint`: Ctrl-C), or the actor update of step N
# sends the process a signal (`SIGTERM` / `SIGINT`), as a user or a scheduler would.
FAULT = """
import errno, os, signal, sys, torch
from agentrl.cli import console
from agentrl.train.actor import Actor
where, n = sys.argv[1], int(sys.argv[2])
update, save, calls = Actor.update, torch.save, [0]
def faulty_save(obj, f, *a, **k):
    if str(f).endswith(f".tmp_step_{n:06d}/optimizer.pt"):
        if where == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if where == "sigint":
            raise KeyboardInterrupt
    return save(obj, f, *a, **k)
def signalling_update(self, batch):
    calls[0] += 1
    if where.startswith("SIG") and calls[0] == n:
        os.kill(os.getpid(), getattr(signal, where))
    return update(self, batch)
Actor.update, torch.save = signalling_update, faulty_save
# Env faults in FrozenLake's step, first call only: `block` blocks the event loop's thread in
# synchronous code (`block_train`: in the first training episode, `block_always`: in every step),
# `block_sigint` does so after a Ctrl-C, `async_hang` awaits until the collector has warned that
# the collection may hang.
import asyncio, time
import agentrl.rollout.loop_thread as collector
from agentrl.envs.frozen_lake import FrozenLakeEnv
lake_reset, lake_step, warned = FrozenLakeEnv.reset, FrozenLakeEnv.step, []
async def seen_reset(self, seed=None, options=None):
    self.seen_seed = seed
    return await lake_reset(self, seed=seed, options=options)
async def faulty_step(self, action):
    calls[0] += 1
    if where == "block_sigint" and calls[0] == 1:
        os.kill(os.getpid(), signal.SIGINT)
    if where == "block_train" and self.seen_seed < 1_000_000 and not warned:  # a training episode's, once
        warned.append("blocked")
        time.sleep(3600)
    if where in ("block", "block_sigint") and calls[0] == 1 or where == "block_always":
        time.sleep(3600)
    if where == "async_hang" and calls[0] == 1:
        while not warned:
            await asyncio.sleep(0.01)
    return await lake_step(self, action)
def warn_hang(message):
    warned.append(message)
    print("warning: " + message, file=sys.stderr)
if where in ("block", "block_always", "block_train", "block_sigint", "async_hang"):
    FrozenLakeEnv.reset, FrozenLakeEnv.step = seen_reset, faulty_step
# `engine_SIGTERM` / `engine_SIGINT`: the signal comes from the episodes' thread while it is inside
# torch (the first engine step after the first update); `warm_SIGTERM`: from the warm start's
# first demonstration. A thread still in torch when the interpreter shuts down aborts (SIGABRT).
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.demos import ScriptedClient
engine_step, scripted, sent = LocalEngine.step, ScriptedClient.generate, []
def signalling_step(self):
    if where.startswith("engine_") and calls[0] >= 1 and not sent:
        sent.append(os.kill(os.getpid(), getattr(signal, where[len("engine_"):])))
        x = torch.randn(256, 256)
        for _ in range(100):
            x = torch.tanh(x @ x)
    return engine_step(self)
async def signalling_generate(self, prompt_ids, sampling):
    if where == "warm_SIGTERM" and not sent:
        sent.append(os.kill(os.getpid(), signal.SIGTERM))
    return await scripted(self, prompt_ids, sampling)
LocalEngine.step, ScriptedClient.generate = signalling_step, signalling_generate
if where == "async_hang":
    collector.warn_hang, collector.HANG_WARN_SECONDS = warn_hang, 0.0
console(sys.argv[3:])  # the console script's entry, as `agentrl` runs
"""


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def _fault(where: str, n: int, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FAULT, where, str(n), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def _main(*args: str) -> subprocess.CompletedProcess:
    """`agentrl ARGS` through the CLI's entry point in this process: its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["agentrl", *args], code, out.getvalue(), err.getvalue())


def _train_args(run: Path, cache: Path, *more: str) -> list[str]:
    return [str(ROOT / "configs" / "frozen_lake.yaml"), *TINY, f"run_dir={run}", f"model.cache_dir={cache}", *more]


def _one_line(res: subprocess.CompletedProcess, code: int = 2) -> str:
    assert res.returncode == code, res.stderr[-2000:]
    lines = without_plan(res.stderr).strip().splitlines()  # a run logs its plan first
    assert len(lines) == 1, res.stderr[-2000:]
    return lines[0]


def _steps(run: Path) -> list[int]:
    """The steps of the run's checkpoints, in order."""
    return sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))


def _loads(ckpt: Path) -> int:
    """The step of a checkpoint whose weights and state both load."""
    import torch
    from safetensors.torch import load_file

    load_file(str(ckpt / "model.safetensors"))
    return torch.load(ckpt / "state.pt", weights_only=False)["step"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, run_model_cache):
    """A finished 4-step run (checkpoints at steps 2 and 4) and the model cache every run here shares
    (the test run's: its warm start is the one of every TINY FrozenLake run of the suite)."""
    cache = run_model_cache
    run = tmp_path_factory.mktemp("finished") / "run"
    res = _main("train", *_train_args(run, cache, f"trainer.total_steps={STEPS}", "trainer.save_freq=2"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _steps(run) == [2, 4]
    return run, cache


@pytest.fixture
def run_copy(finished, tmp_path):
    """A copy of the finished run that a test may change."""
    run, cache = finished
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst, cache


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run folder but its lock, by relative path."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---------------------------------------------------------------------------- 5.1 another run in the folder
def test_train_into_a_folder_holding_a_run_refuses_and_changes_nothing(run_copy):
    run, cache = run_copy
    before = _snapshot(run)
    line = _one_line(_cli("train", *_train_args(run, cache, "trainer.total_steps=2")))
    assert f"{run} already holds a run (step 4)" in line and f"agentrl resume {run}" in line and "--overwrite" in line
    assert _snapshot(run) == before  # metrics, checkpoints, config: all as they were


@pytest.mark.parametrize("override, expected", [
    ("env.type=frozen_lak", "env.type: unknown env type 'frozen_lak'. Did you mean 'frozen_lake'?"),
    ("algorithm.adv_estimator=gea", "unknown advantage estimator 'gea'. Did you mean 'gae'?"),
])
def test_a_wrong_config_into_a_folder_holding_a_run_names_the_config_first(run_copy, tmp_path, override, expected):
    """Two mistakes at once: the config's is the one to fix first (the folder's would only lead
    to a second error after --overwrite), and neither folder changes."""
    run, cache = run_copy
    before = _snapshot(run)
    # In this process: a refusal of `train` in a process of its own is the test above.
    line = _one_line(_main("train", *_train_args(run, cache, override)))
    assert expected in line and "already holds a run" not in line
    assert _snapshot(run) == before
    fresh = tmp_path / "fresh"
    assert expected in _one_line(_main("train", *_train_args(fresh, cache, override)))
    assert not fresh.exists()  # a config error leaves no run folder behind


def test_train_with_overwrite_starts_over_and_keeps_its_own_checkpoints(run_copy):
    run, cache = run_copy
    res = _main("train", "--overwrite", *_train_args(run, cache, "trainer.total_steps=2", "trainer.save_freq=1"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _steps(run) == [1, 2]  # the old run's step 4 is gone, the new ones survive pruning
    assert max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) == 2
    res = _main("eval", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step_000002" in res.stdout


def test_pruning_keeps_the_newest_steps_of_this_run_not_the_newest_names(tmp_path, tiny_model, tiny_tokenizer):
    import torch

    from agentrl.train.checkpoint import save_checkpoint

    opt = torch.optim.AdamW(tiny_model.parameters())
    root = tmp_path / "checkpoints"
    (root / "step_000008").mkdir(parents=True)  # left by an older, longer run
    (root / "step_1000000").mkdir()  # a name that sorts before step_000008 as a string
    for step in (2, 4):
        save_checkpoint(root, step, tiny_model, tiny_tokenizer, opt, {}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000004"]


# ---------------------------------------------------------------------------- 5.4 resume with overrides
@pytest.mark.parametrize("override, field", [
    ("rollout.batch_size=8", "rollout.batch_size"), ("seed=3", "seed"), ("env.type=sokoban", "env.type"),
    ("model.dtype=bfloat16", "model.dtype"), ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator"),
    ("rollout.max_staleness=1", "rollout.max_staleness"), ("model.path={run}/checkpoints/step_000002", "model.path")])
def test_resume_refuses_a_change_of_the_runs_meaning_and_keeps_the_folder(run_copy, override, field):
    """Each field by the CLI's entry point here: a resume's refusal in a process of its own, its
    stderr one line, is the test of a folder in use by another process, below."""
    run, _ = run_copy
    before = _snapshot(run)
    line = _one_line(_main("resume", str(run), override.format(run=run), "trainer.total_steps=6"))
    assert line.startswith("agentrl: error: resume cannot change ") and field in line and "trainer.total_steps" in line
    assert _snapshot(run) == before  # config.yaml is not rewritten by a refused resume


def test_resume_with_a_checkpoint_that_does_not_fit_the_model_is_one_line_and_harmless(run_copy):
    from safetensors.torch import load_file, save_file

    from agentrl.train.checkpoint import write_manifest

    run, _ = run_copy
    ckpt = run / "checkpoints" / "step_000004"
    weights = load_file(str(ckpt / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name][:1].clone().contiguous()  # the weights of a model of another shape
    save_file(weights, str(ckpt / "model.safetensors"))
    write_manifest(ckpt, 4)  # a whole checkpoint of another model, not a damaged one
    before = _snapshot(run)
    line = _one_line(_cli("resume", str(run), "trainer.total_steps=6"))
    assert f"checkpoint {ckpt} does not fit this run's model" in line
    assert _snapshot(run) == before


def test_resume_with_an_allowed_change_records_it_and_writes_the_config(run_copy):
    run, _ = run_copy
    res = _main("resume", str(run), "trainer.total_steps=5", "trainer.save_freq=0")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "total_steps: 5" in (run / "config.yaml").read_text()
    (row,) = read_jsonl(run / "resumes.jsonl")
    assert row["step"] == 4 and row["changes"] == {"trainer.total_steps": [4, 5], "trainer.save_freq": [2, 0]}
    assert _steps(run)[-1] == 5


# ---------------------------------------------------------------------------- 5.5 one process per folder
@pytest.mark.parametrize("command", ["train", "resume"])
def test_a_run_folder_in_use_by_another_process_is_refused(tmp_path, finished, command):
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    with open(run / ".lock", "w") as held:  # this test process plays the other agentrl run
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(str(os.getpid()))
        held.flush()
        args = [str(run)] if command == "resume" else _train_args(run, finished[1], "--overwrite")
        line = _one_line(_cli(command, *args))
    assert f"run_dir {run} is in use by another agentrl process (pid {os.getpid()})" in line
    assert _steps(run) == [2, 4]


# ---------------------------------------------------------------------------- 5.6 corrupt files
@pytest.mark.parametrize("damaged", ["model.safetensors", "state.pt"])
def test_a_corrupt_latest_checkpoint_falls_back_to_the_older_one(run_copy, damaged):
    run, _ = run_copy
    path = run / "checkpoints" / "step_000004" / damaged
    path.write_bytes(path.read_bytes()[:100])  # truncated
    res = _main("eval", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step_000002" in res.stdout and "warning: checkpoint" in res.stderr and "step_000004" in res.stderr
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _steps(run)[-1] == 4 and _loads(run / "checkpoints" / "step_000004") == 4


def test_no_loadable_checkpoint_is_one_line(run_copy):
    run, _ = run_copy
    for ckpt in (run / "checkpoints").glob("step_*"):
        (ckpt / "state.pt").write_bytes(b"garbage")
    for command in ("eval", "resume"):
        res = _main(command, str(run))  # a traceback out of `main` would be an exception here
        assert res.returncode == 2, res.stderr[-2000:]
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith(f"agentrl: error: no checkpoint in {run / 'checkpoints'} loads")
        assert "Traceback" not in res.stderr  # nor one printed by a thread of it


def test_a_cached_model_with_missing_weights_is_rebuilt(finished, tmp_path):
    cache = tmp_path / "cache"
    entry = Path(json.loads((finished[0] / "plan.json").read_text())["warm_start"]["cache"])  # this config's model
    shutil.copytree(entry, cache / entry.name)
    for weights in cache.glob("tiny-*/model.safetensors"):
        weights.unlink()
    res = _main("train", *_train_args(tmp_path / "run", cache, "trainer.total_steps=1"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "does not load" in res.stderr and "rebuilding it" in res.stderr and "model.path" not in res.stderr


# ---------------------------------------------------------------------------- 5.8 folder faults
def test_a_run_dir_or_output_dir_that_is_a_file_is_one_line_before_any_model(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    cache = tmp_path / "cache"
    # By the CLI's entry point here; the read-only folder below is refused in a process of its own.
    for setting in (f"run_dir={a_file}", f"output_dir={a_file}", f"run_dir={a_file / 'run'}"):
        line = _one_line(_main("train", str(ROOT / "configs" / "frozen_lake.yaml"), *TINY, setting,
                               f"model.cache_dir={cache}"))
        assert "is a file, not a folder" in line and setting.split("=")[0] in line
    assert not cache.exists()  # nothing was built


def test_a_read_only_run_dir_is_one_line_before_any_model(tmp_path):
    if os.geteuid() == 0:  # root writes anywhere a mode bit forbids: use a folder the kernel keeps read-only
        run = Path("/proc/self")
    else:
        run = tmp_path / "ro"
        run.mkdir()
        run.chmod(0o555)
    cache = tmp_path / "cache"
    line = _one_line(_cli("train", "configs/frozen_lake.yaml", *TINY, f"run_dir={run}", f"model.cache_dir={cache}"))
    assert f"run_dir={run}" in line and "not writable" in line
    assert not cache.exists()


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path, finished):
    run = tmp_path / "run"
    line = _one_line(_fault("enospc", 2, "train", *_train_args(run, finished[1])))
    assert "could not write checkpoint step 2" in line and os.strerror(errno.ENOSPC) in line
    assert "step_000001 is intact" in line
    assert _steps(run) == [1] and not list((run / "checkpoints").glob(".tmp_*"))
    assert _loads(run / "checkpoints" / "step_000001") == 1


# ---------------------------------------------------------------------------- 5.12
def test_resuming_a_finished_run_changes_nothing(run_copy):
    run, _ = run_copy
    before = _snapshot(run)
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"run {run} is already finished at step 4" in res.stderr
    assert _snapshot(run) == before  # no second final-eval row, wall_seconds kept


def test_eval_tags_its_samples_with_the_checkpoints_step(run_copy):
    run, _ = run_copy
    n = len(read_jsonl(run / "samples.jsonl"))
    res = _main("eval", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    new = read_jsonl(run / "samples.jsonl")[n:]
    assert new and {r["step"] for r in new} == {4}


def test_eval_holds_the_checkpoint_it_picked_while_a_trainer_prunes_it(run_copy, monkeypatch):
    import agentrl.runtime.assembly.trainer as build

    run, _ = run_copy
    real = build.build_trainer

    def build_trainer(*args, **kwargs):
        # A trainer still writing the run prunes every checkpoint `agentrl eval` could have picked,
        # between its picking one and loading the model from it (where a real trainer beside it may do so).
        for ckpt in (run / "checkpoints").glob("step_*"):
            shutil.rmtree(ckpt)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "build_trainer", build_trainer)
    res = _main("eval", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step_000004" in res.stdout and "eval/success" in res.stdout
    assert not list(run.glob(".held-*"))  # the held copy is gone with the eval


def test_resuming_a_folder_without_a_checkpoint_says_it_starts_at_step_0(tmp_path, finished):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(finished[0] / "config.yaml", run / "config.yaml")  # a run killed before its first save
    res = _main("resume", str(run), "trainer.total_steps=2")  # 2 of its 4 steps show it starts at 0
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"agentrl: {run} holds no checkpoint to resume from" in res.stderr and "starts at step 0" in res.stderr
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r] == [1, 2]


@pytest.mark.parametrize("make_args, expected", [
    (lambda run, tmp: ["view", str(run), "--serve", "--port", "70000"], "--port=70000 must be in [0, 65535]"),
    (lambda run, tmp: ["view", str(run), "--serve", "--port", "-1"], "--port=-1 must be in [0, 65535]"),
    (lambda run, tmp: ["export", str(run), "--out", str(tmp / "a_file")], "is a file; give a new or empty folder"),
    (lambda run, tmp: ["export", str(run), "--out", str(tmp / "a_file" / "model")], "a_file is a file"),
    (lambda run, tmp: ["export", str(run), "--out", str(tmp / ("x" * 300))], "is 300 bytes long"),
    (lambda run, tmp: ["export", str(run), "--out", "~no_such_user_xyz/model"], "names no user's home folder"),
    (lambda run, tmp: ["eval", str(tmp / ("x" * 300))], "is 300 bytes long"),
    (lambda run, tmp: ["resume", str(tmp / ("x" * 300))], "is 300 bytes long"),
    (lambda run, tmp: ["view", str(tmp / ("x" * 300))], "is 300 bytes long"),
    (lambda run, tmp: ["eval", "~no_such_user_xyz/run"], "names no user's home folder"),
    (lambda run, tmp: ["train", "configs/frozen_lake.yaml", f"run_dir={tmp / ('x' * 300)}"], "is 300 bytes long"),
    (lambda run, tmp: ["train", "configs/frozen_lake.yaml", "engine.api_key=ключ"], "engine.api_key holds 'к'"),
    (lambda run, tmp: ["train", str(tmp / ("x" * 300 + ".yaml"))], "is 305 bytes long"),
    (lambda run, tmp: ["serve", str(tmp / ("x" * 300 + ".yaml"))], "is 305 bytes long"),
    (lambda run, tmp: ["train", "~no_such_user_xyz/c.yaml"], "names no user's home folder"),
    (lambda run, tmp: ["train", "configs/frozen_lake.yaml", f"model.cache_dir={tmp / 'a_file'}"], "is a file; give a"),
])
def test_every_commands_paths_and_ports_are_checked_in_one_line(make_args, expected, finished, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    before = _snapshot(finished[0])
    line = _one_line(_cli(*make_args(finished[0], tmp_path)))
    assert expected in line and len(line) < 1000, line
    assert _snapshot(finished[0]) == before


def test_ctrl_c_during_a_checkpoint_write_leaves_no_partial_folder(tmp_path, finished):
    run = tmp_path / "run"
    line = _one_line(_fault("sigint", 2, "train", *_train_args(run, finished[1])), code=128 + signal.SIGINT)
    assert line == f"agentrl: interrupted; resume with `agentrl resume {run}`"
    assert _steps(run) == [1] and not list((run / "checkpoints").glob(".tmp_*"))


def test_a_partial_checkpoint_left_by_a_kill_is_cleared_at_the_next_start(run_copy):
    run, _ = run_copy
    (run / "checkpoints" / ".tmp_step_000006").mkdir()  # as a SIGKILL mid-write leaves it
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert not list((run / "checkpoints").glob(".tmp_*"))


def test_a_user_module_that_exits_is_one_line_naming_it(tmp_path, finished):
    module = tmp_path / "quits.py"
    module.write_text("import sys\nsys.exit(3)\n")
    line = _one_line(_cli("train", *_train_args(tmp_path / "run", finished[1], f"imports=[{module}]")))
    assert f"imports: module '{module}' called sys.exit(3)" in line


# ---------------------------------------------------------------------------- 5.7 signals
@pytest.mark.parametrize("sig, what", [("SIGTERM", "terminated (SIGTERM)"), ("SIGINT", "interrupted")])
def test_a_signal_stops_the_run_with_one_line_saying_how_to_resume(tmp_path, finished, sig, what):
    run = tmp_path / "run"
    res = _fault(sig, 2, "train", *_train_args(run, finished[1]))
    line = _one_line(res, code=128 + getattr(signal, sig))
    assert line == f"agentrl: {what}; resume with `agentrl resume {run}`"
    assert _steps(run) == [1]
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _steps(run) == [1, 2]


# ---------------------------------------------------------------------------- 5.7 hangs
def test_ctrl_c_stops_a_run_whose_env_blocks_the_event_loop(tmp_path, finished):
    run = tmp_path / "run"
    res = _fault("block_sigint", 0, "train", *_train_args(run, finished[1]), timeout=300)
    line = _one_line(res, code=128 + signal.SIGINT)  # the first Ctrl-C, no traceback
    assert line == f"agentrl: interrupted; resume with `agentrl resume {run}`"


def test_an_env_blocking_the_event_loop_once_fails_that_episode_and_the_run_goes_on(tmp_path, finished):
    """On-policy, the blocked loop is left behind: the episode that blocked it fails as a timeout
    (and is retried), the others replay in a fresh loop."""
    run = tmp_path / "run"
    # The timeout is far above an episode's time on a busy machine: only the blocked one may reach it.
    res = _fault("block", 0, "train", *_train_args(run, finished[1], "rollout.episode_timeout=10"), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    errors = read_jsonl(run / "errors.jsonl")
    assert len(errors) == 1 and errors[0]["kind"] == "timeout" and "blocked the event loop" in errors[0]["error"]
    assert "asyncio.to_thread" in errors[0]["error"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize("where, staleness", [("block_always", 0), ("block_train", 1)])
def test_an_env_blocking_the_event_loop_past_the_episode_timeout_is_one_line(tmp_path, finished, where, staleness):
    """An env that blocks its loop every time (on-policy: after max_retries + 1 loops left behind),
    or once in the rollout stream's thread (max_staleness >= 1): the run stops in one line."""
    res = _fault(where, 0, "train", *_train_args(tmp_path / "run", finished[1], "rollout.episode_timeout=10",
                                                 f"rollout.max_staleness={staleness}"), timeout=300)
    line = _one_line(res)
    assert "rollout.episode_timeout=10.0s" in line and "blocks it" in line and "asyncio.to_thread" in line


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_collection_that_may_hang_without_a_timeout_is_warned_about(tmp_path, finished, staleness):
    res = _fault("async_hang", 0, "train", *_train_args(tmp_path / "run", finished[1], "rollout.episode_timeout=null",
                                                        f"rollout.max_staleness={staleness}"), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "set rollout.episode_timeout" in res.stderr


# ---------------------------------------------------------------------------- signals from the episodes' thread
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_episodes_thread_is_in_torch_exits_cleanly_and_resumes(tmp_path, finished, sig):
    """Not SIGABRT ("terminate called without an active exception"): the episodes' thread is
    stopped before the interpreter shuts down."""
    run = tmp_path / "run"
    res = _fault(f"engine_{sig}", 0, "train", *_train_args(run, finished[1]))
    what = "terminated (SIGTERM)" if sig == "SIGTERM" else "interrupted"
    assert _one_line(res, code=128 + getattr(signal, sig)) == f"agentrl: {what}; resume with `agentrl resume {run}`"
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_sigterm_during_the_warm_start_exits_cleanly_and_the_run_starts_again(tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"  # a cache of its own: the warm start is played
    # One supervised step is a warm start as much as TINY's 4 (the resume below plays it whole).
    res = _fault("warm_SIGTERM", 0, "train", *_train_args(run, cache, "model.warm_start.max_steps=1"))
    assert res.returncode == 128 + signal.SIGTERM, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == f"agentrl: terminated (SIGTERM); resume with `agentrl resume {run}`"
    assert "Traceback" not in res.stderr
    res = _main("resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


# ---------------------------------------------------------------------------- a disk that fills up
def test_a_disk_that_fills_up_during_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path, finished):
    """A real full disk (a tmpfs with room for one checkpoint), not an injected error: torch reports
    it as a RuntimeError, which must still be one line naming the folder and the space."""
    run, cache = finished
    size = sum(p.stat().st_size for p in (run / "checkpoints" / "step_000004").iterdir())
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2 + 65536}", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        target = disk / "run"
        line = _one_line(_cli("train", *_train_args(target, cache)))
        assert line.startswith(f"agentrl: error: could not write checkpoint step 2 in {target / 'checkpoints'}: ")
        assert "MB free there, a checkpoint needs about" in line and "step_000001 is intact" in line, line
        assert f"agentrl resume {target}" in line
        assert _steps(target) == [1] and not list((target / "checkpoints").glob(".tmp_*"))
        assert _loads(target / "checkpoints" / "step_000001") == 1
        subprocess.run(["mount", "-o", f"remount,size={size * 8}", str(disk)], check=True)  # space freed
        res = _main("resume", str(target))
        assert res.returncode == 0, res.stderr[-2000:]
        assert _steps(target) == [1, 2]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
