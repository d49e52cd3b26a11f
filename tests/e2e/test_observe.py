"""End-to-end: what a run leaves for people to read. A short FrozenLake run with dumps and W&B on
raises no collapse alarm, its page renders in a real headless Chromium (and over --serve), its
offline W&B run reads back with wandb's own reader; a run driven to collapse by a huge learning
rate raises the alarms within a few steps, and with on_collapse=stop rolls back and resumes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main as cli_main
from agentrl.config import load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.errors import CollapseError
from agentrl.health import ALARMS
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

import browser  # tests/ is on sys.path (conftest.py)

ROOT = Path(__file__).parents[2]
# A tiny model warm-started long enough to answer in the env's format (an untrained one only
# writes invalid replies, whose groups all get one reward), on short 4-turn episodes.
SMALL = [
    "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=60", "model.warm_start.batch_size=4",
    "model.warm_start.lr=1e-2", "rollout.batch_size=16", "rollout.group_size=4", "actor.ppo_mini_batch_size=8",
    "actor.micro_batch_size=8", "env.max_turns=4", "env.args.max_steps=4", "trainer.test_freq=0",
    "trainer.eval_episodes=4", "trainer.progress=false",
]
STEPS = 4


def _agentrl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, **kw)


@pytest.fixture(scope="module")
def cache_dir(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, cache_dir):
    """configs/frozen_lake.yaml, small, with dumps every 2 steps and every logger; alarms can fire
    from step 3 (one warm-up step, patience 2), as in the collapsing run below."""
    run = tmp_path_factory.mktemp("observe") / "default"
    cfg = load_config(ROOT / "configs/frozen_lake.yaml", [
        *SMALL, f"trainer.total_steps={STEPS}", "trainer.save_freq=0", "trainer.dump_trajectories_freq=2",
        "health.warmup_steps=1", "trainer.logger=[jsonl,tensorboard,wandb]", f"run_dir={run}",
        f"model.cache_dir={cache_dir}"])
    lines = []
    train(cfg, log=lines.append)
    return run, lines


def test_the_default_run_raises_no_alarm(default_run):
    run, lines = default_run
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for key in ("health/dead_groups", "health/entropy", "health/reply_repeat", "health/input_dependence"):
        assert any(key in r for r in rows), key  # every signal was computed at least once
    # every signal stays on the healthy side of its threshold (defaults), so no alarm fires
    for r in rows[1:]:
        assert r["health/dead_groups"] < 0.9 and r["health/entropy_ratio"] > 0.1, r
        assert r.get("health/reply_repeat", 0.0) < 0.9, r
    assert all(r["health/alarms"] == 0 and not r["health/alarm_input_dependence"] for r in rows)
    assert not any("collapse alarm" in line for line in lines)


def test_dumps_hold_the_trained_steps(default_run):
    run, _ = default_run
    assert [s for s, _ in list_dumps(run)] == [2, 4]
    d = read_dump(run / "dumps" / "step_000004.json.gz")
    assert len(d["episodes"]) == d["episodes_total"] == 16 and d["estimator"] == "grpo"
    for ep in d["episodes"]:
        n_gen = ep["mask"].count("1")
        assert len(ep["ids"]) == len(ep["mask"]) and len(ep["lp"]) == len(ep["adv"]) == len(ep["ver"]) == n_gen
        assert set(ep["ver"]) == {d["policy_version"]}  # on-policy: every id written by the trained policy
        assert all(str(i) in d["pieces"] for i in ep["ids"])


@pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))
def test_the_page_renders_in_headless_chromium(default_run, tmp_path):
    run, _ = default_run
    res = _agentrl("view", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    page = Path(res.stdout.strip().splitlines()[-1])
    assert page == run / "view.html"
    html = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from elsewhere
    b = browser.Browser()
    try:
        b.open(page.as_uri())
        assert b.wait("return document.querySelectorAll('#episode .tok').length > 0")
        dom = b.js("""const q = (s) => [...document.querySelectorAll(s)];
            return {steps: q('#step-select option').map(o => o.value),
                    step: document.querySelector('#step-select').value,
                    curves: q('.curve').map(c => c.dataset.key), members: q('#group .member').length,
                    tokens: q('#episode .tok').length, generated: q('#episode .tok.gen').length,
                    bars: q('#reward-hist rect.bar').length, head: document.querySelector('#episode-head').textContent,
                    info: document.querySelector('#step-info').textContent}""")
        assert dom["steps"] == ["2", "4"] and dom["step"] == "4"
        assert {"reward/mean", "rollout/success", "policy/entropy", "health/reply_repeat"} <= set(dom["curves"])
        assert dom["members"] == 4 and dom["bars"] > 0  # the GRPO group side by side; a reward histogram
        ep = read_dump(run / "dumps" / "step_000004.json.gz")["episodes"][0]
        assert dom["tokens"] == len(ep["ids"]) and dom["generated"] == ep["mask"].count("1")
        # choosing a step and a group changes what is shown
        b.click('#step-select option[value="2"]')
        assert b.wait("return document.querySelector('#step-info').textContent.startsWith('step 2:')")
        head2 = b.js("return document.querySelector('#episode-head').textContent")
        second = b.js("return document.querySelector('#group-select option:nth-child(2)').value")
        b.click('#group-select option:nth-child(2)')
        after = b.js("return [document.querySelector('#episode-head').textContent, "
                     "document.querySelector('#group-select').value]")
        assert after[0] != head2 and after[1] == second
        # colour by advantage, and hover a generated token for its numbers
        masks = b.js("return [...document.querySelectorAll('#episode .tok.gen')].map(t => t.style.background)")
        b.click('#color-select option[value="advantage"]')
        colours = b.js("return [...document.querySelectorAll('#episode .tok.gen')].map(t => t.style.background)")
        assert colours != masks
        tip = b.js("""const t = document.querySelector('#episode .tok.gen'); const r = t.getBoundingClientRect();
            t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, clientX: r.left + 1, clientY: r.top + 1}));
            return document.querySelector('#tip').textContent""")
        assert "behaviour logprob" in tip and "advantage" in tip and "policy version" in tip
        shot = b.screenshot(tmp_path / "view.png")
        assert shot.stat().st_size > 10_000
    finally:
        b.close()


@pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))
def test_serve_loads_steps_the_page_does_not_inline(default_run):
    run, _ = default_run
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(run), "--serve", "--port", "0",
                             "--max-steps", "1"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    b = None
    try:
        proc.stdout.readline()  # the page's path
        url = re.search(r"http://127\.0\.0\.1:\d+/", proc.stdout.readline()).group(0)
        b = browser.Browser()
        b.open(url)
        assert b.wait("return document.querySelectorAll('#episode .tok').length > 0")
        options = b.js("return [...document.querySelectorAll('#step-select option')].map(o => o.textContent)")
        assert options == ["step 2 (not inlined)", "step 4"]
        b.click('#step-select option[value="2"]')  # fetched from the server on demand
        assert b.wait("return document.querySelector('#step-info').textContent.startsWith('step 2:')")
        assert b.js("return document.querySelectorAll('#episode .tok').length") > 0
    finally:
        if b is not None:
            b.close()
        proc.terminate()
        proc.wait(30)


def test_wandb_offline_run_reads_back_with_the_tensorboard_names(default_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = default_run
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    res = subprocess.run([str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", str(offline[0])],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_SILENT": "true"})
    assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    history = {}
    for r in records:
        if r.get("type") == "history":
            history.setdefault(r["history"]["step"].get("num", 0), {}).update(r["history"]["item"])
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tb_names = set(events.Tags()["scalars"])
    wandb_names = {k for item in history.values() for k in item if not k.startswith("_")}
    assert tb_names == wandb_names and "health/reply_repeat" in wandb_names
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r}
    for step, row in rows.items():
        assert history[step]["reward/mean"] == pytest.approx(row["reward/mean"])


# Deliberate collapse: a learning rate 500x the default, without gradient clipping. Whatever the
# exact floats, Adam then moves every weight by ~0.5 a step: the policy turns deterministic
# (entropy ~0) and every episode of a group plays the same way (one reward, no success: the
# goal is 6 moves away and an episode has 4).
COLLAPSE = [*SMALL, "actor.lr=0.5", "actor.grad_clip=0", "health.warmup_steps=1", "trainer.save_freq=1",
            "trainer.logger=[jsonl]", "rollout.batch_size=8", "trainer.total_steps=5",
            "trainer.dump_trajectories_freq=1"]


def test_a_collapsing_run_raises_alarms_and_on_collapse_stop_rolls_back_and_resumes(tmp_path, cache_dir, capsys):
    over = [*COLLAPSE, "trainer.on_collapse=stop", f"run_dir={tmp_path}", f"model.cache_dir={cache_dir}"]
    lines = []
    with pytest.raises(CollapseError) as e:
        train(load_config(ROOT / "configs/frozen_lake.yaml", over), log=lines.append)
    stopped = max(r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl"))
    assert stopped <= 4 and [line for line in lines if "collapse alarm" in line]  # warned, then stopped
    message = str(e.value)
    assert "trainer.on_collapse=stop" in message and "agentrl resume" in message and "\n" not in message
    # Which alarm crosses first depends on the floats of the machine: any of them stops the run.
    stopping = set(re.search(r"on collapse alarm ([\w, ]+) \(", message).group(1).split(", "))
    assert stopping and stopping <= set(ALARMS), message
    # rolled back: every checkpoint from the first bad step on is moved aside
    kept = [int(p.name[5:]) for p in (tmp_path / "checkpoints").glob("step_*")]
    aside = [int(p.name[len("collapsed_step_"):]) for p in (tmp_path / "checkpoints").glob("collapsed_step_*")]
    assert aside and max(kept, default=0) < min(aside) <= stopped
    assert (f"now step_{max(kept):06d}" if kept else "no checkpoint precedes") in message
    # the folder resumes from the last healthy checkpoint (rows and dumps after it are replayed);
    # with on_collapse=warn the run goes on, one line per alarm (`agentrl resume` through the CLI's
    # entry point, in this process: a process start would prove nothing more here)
    capsys.readouterr()
    code = cli_main(["resume", str(tmp_path), "trainer.on_collapse=warn"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [s for s, _ in list_dumps(tmp_path)] == [1, 2, 3, 4, 5]
    first = {}  # alarm -> first step it was on
    for r in rows:
        for k, v in r.items():
            if k.startswith("health/alarm_") and v:
                first.setdefault(k[len("health/alarm_"):], r["step"])
    # the resumed run replays the steps after the checkpoint as a straight run would: the alarms
    # that stopped it fire again, at the step they stopped it
    assert all(first.get(name) == stopped for name in stopping), (first, stopping, stopped)
    warned = [line for line in err.splitlines() if "collapse alarm" in line]
    assert warned and all("health." in line for line in warned)
    assert {name for name in first} == {re.search(r": (\w+): ", line).group(1) for line in warned}
