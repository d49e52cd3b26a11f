"""Exact resume: a run killed with SIGKILL (mid-step or mid-checkpoint) and resumed with
`agentrl resume` ends with the same metrics and the same weights as a run never stopped.

Only what needs a process of its own runs in one: the killed runs, one resume as a user starts it
(a fresh `agentrl resume` process, which finds nothing the killed run left in memory) and the CLI's
own refusal. The run never stopped and the other resumes call the CLI's entry point in this process
(`agentrl.cli.main`, what the console script runs): starting a process costs more than a 3-step run."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.cli import main as cli_main
from agentrl.metrics import read_jsonl
from agentrl.train.checkpoint import latest_checkpoint, load_state

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).parents[2]
STEPS = 3  # a kill in step 3 or in checkpoint 2 leaves steps to replay after the checkpoint
# Runs the real CLI in a process that SIGKILLs itself at a chosen point: during the actor update
# of step N ("update N"), or while writing the optimizer state of checkpoint N ("checkpoint N").
KILLER = """
import os, signal, sys, torch
from agentrl.cli import main
from agentrl.train.actor import Actor
where, n = sys.argv[1], int(sys.argv[2])
update, save, calls = Actor.update, torch.save, [0]
def killing_update(self, batch):
    calls[0] += 1
    if where == "update" and calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return update(self, batch)
def killing_save(obj, f, *a, **k):
    if where == "checkpoint" and str(f).endswith(f".tmp_step_{n:06d}/optimizer.pt"):
        os.kill(os.getpid(), signal.SIGKILL)
    return save(obj, f, *a, **k)
Actor.update, torch.save = killing_update, killing_save
sys.exit(main(sys.argv[3:]))
"""


def _args(run: Path, cache: Path) -> list[str]:
    return ["configs/frozen_lake.yaml", *TINY, f"run_dir={run}", f"model.cache_dir={cache}",
            f"trainer.total_steps={STEPS}", "trainer.save_freq=1", "trainer.max_checkpoints=3"]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=600)


def _rows(run: Path) -> list[dict]:
    """Every metric of every row but the clocks: the engine's counters (requests, prefill and
    cached prompt ids, decode batches) must match too, whatever the CPU's kernels."""
    return [{k: v for k, v in r.items() if not _clock(k)} for r in read_jsonl(run / "metrics.jsonl")]


def _clock(key: str) -> bool:
    return key.startswith("perf/") and not key.startswith("perf/engine_") or key == "perf/engine_tokens_per_s"


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run / "checkpoints") / "model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, run_model_cache):
    """A run never stopped, and the model cache every run here shares."""
    cache = run_model_cache  # the test run's: its warm start is shared with other modules
    run = tmp_path_factory.mktemp("straight")
    assert cli_main(["train", *_args(run, cache)]) == 0
    return run, cache


def _resume(capsys, run: Path, *overrides: str) -> tuple[int, str]:
    """`agentrl resume RUN OVERRIDES` through the CLI's entry point in this process: its exit code
    and what it wrote on stderr."""
    capsys.readouterr()  # only what the resume writes
    code = cli_main(["resume", str(run), *overrides])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("where, n, resumes_from, fresh", [("update", 3, 2, True), ("checkpoint", 2, 1, False)])
def test_killed_run_resumes_exactly(tmp_path, straight, capsys, where, n, resumes_from, fresh):
    """`fresh`: resumed by `agentrl resume` in a process of its own, as a user does; else through
    the CLI's entry point in this process (the same command, without a second process start)."""
    ref, cache = straight
    run = tmp_path / "run"
    res = _run("-c", KILLER, where, str(n), "train", *_args(run, cache))
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    ckpt = latest_checkpoint(run / "checkpoints")
    assert ckpt.name == f"step_{resumes_from:06d}"  # a half-written checkpoint never counts
    assert load_state(ckpt)["step"] == resumes_from
    if fresh:
        res = _run("-m", "agentrl.cli", "resume", str(run))
        assert res.returncode == 0, res.stderr[-2000:]
    else:
        code, err = _resume(capsys, run)
        assert code == 0, err[-2000:]
    assert _rows(run) == _rows(ref)
    mine, theirs = _weights(run), _weights(ref)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not list((run / "checkpoints").glob(".tmp_*"))  # the torn write was cleared


def test_resume_of_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    res = _run("-m", "agentrl.cli", "resume", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "not a run folder" in res.stderr
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- what a resume reads
def _copy(straight, tmp_path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(straight[0], run)
    return run


def test_a_checkpoint_changed_after_it_was_written_is_named_and_skipped(tmp_path, straight, capsys):
    """Bytes flipped inside the newest checkpoint's weights: the file fails its sha256, the resume
    says so in one warning naming the file and continues from the previous checkpoint, ending as
    the straight run did."""
    run = _copy(straight, tmp_path)
    weights = run / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64] ^= 0xFF  # inside a tensor: safetensors alone would load it without a word
    weights.write_bytes(bytes(data))
    code, err = _resume(capsys, run)
    assert code == 0, err[-2000:]
    warnings = [line for line in err.splitlines() if line.startswith("warning: checkpoint")]
    assert len(warnings) == 1 and "model.safetensors does not match the sha256" in warnings[0], err[-2000:]
    assert _rows(run) == _rows(straight[0])
    mine, theirs = _weights(run), _weights(straight[0])
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_no_intact_checkpoint_is_one_line_naming_the_file(tmp_path, straight, capsys):
    run = _copy(straight, tmp_path)
    for ckpt in (run / "checkpoints").glob("step_*"):
        state = ckpt / "state.pt"
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0x01
        state.write_bytes(bytes(data))
    code, err = _resume(capsys, run, f"trainer.total_steps={STEPS + 1}")
    assert code == 2, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"agentrl: error: no checkpoint in {run / 'checkpoints'} loads") and "state.pt" in last
    assert "Traceback" not in err  # in this process, an exception escaping the CLI would fail the test itself


def test_a_config_yaml_edited_after_the_run_started_is_refused_naming_the_field(tmp_path, straight, capsys):
    """The resume rule holds against the config saved with the checkpoint, not only against
    overrides: an edited learning rate is refused in one line, and the folder is left as it was."""
    run = _copy(straight, tmp_path)
    config = run / "config.yaml"
    text = config.read_text()
    assert "\n  lr: 0.001\n" in text
    config.write_text(text.replace("\n  lr: 0.001\n", "\n  lr: 0.0005\n", 1))
    code, err = _resume(capsys, run, f"trainer.total_steps={STEPS + 1}")
    assert code == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrl: error: resume cannot change actor.lr "), err
    assert "0.001" in lines[0] and "0.0005" in lines[0] and "trainer.total_steps" in lines[0]
    assert latest_checkpoint(run / "checkpoints").name == f"step_{STEPS:06d}"
