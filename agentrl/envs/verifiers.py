"""prime-rl's verifiers environments on agentrl's env contract: `env.type=verifiers env.args.load=module:function`.

## Description
Any environment of verifiers 0.4.0 (`verifiers.v1`): a `vf.Taskset` (its tasks: rows with a prompt,
a system prompt and the fields its rewards read), or a `vf.Env` over a taskset whose `run(task,
agents)` holds the exchange with the policy (multi-turn: the env speaks the user's turns through
`agents.<seat>.interaction(task)`). `env.args.load` names it: `module:function` (called with no
arguments, returning the Env or Taskset) or an installed taskset id (`vf.load_environment`).

verifiers 0.4.0 does not install beside agentrl (it pins mcp==2.0.0 and requires openai<3), so it
runs in an environment of its own, `.venv-verifiers` (`make verifiers`), in a worker process of ours
(`agentrl/envs/verifiers_worker.py`, JSON lines over stdio). One worker serves every env of this
process with the same arguments (an env manager's envs); it is stopped when the process exits.

Generation stays agentrl's and token-exact: the worker runs no harness, runtime or model client of
verifiers. The env's `run()` gets agents whose turns wait on agentrl's replies (the reply text, as
the engine's ids decode; the trajectory keeps the ids). One seat only: an env that runs a second
agent (verifiers' user-sim, whose user is a model) fails that episode in one line. Tools of
verifiers' Toolsets are not offered to the model (not built).

## Action format
The reply text, given to the env as the policy's assistant message.

## Observation format
The task's prompt (its user messages, joined by a blank line) on reset; each user turn the env
sends after a reply on step. `instructions` is the task's system prompt (set on each reset), or
`verifiers <its class name>.` for a task without one.

## Starting state
The row `seed % rows` of the taskset, the env's `run()` started on it. Seeds of evaluation (at or
above `EVAL_SEED_BASE`) are played by `eval_load`'s environment (its taskset, and its `run()` where
it is an Env) where it is given, else by the same one.

## Rewards
The task's own scoring (`Task.score`: its `@vf.reward`s, weighted, summed as `Trace.reward`; its
`@vf.metric`s into `info["metrics"]`) and the env's `finalize`, on the step that ends the episode;
0 on every other step (verifiers 0.4.0 scores whole traces, not turns).

## Episode end
The env's `run()` returning (terminated), a `@vf.stop` predicate over the trace, or `env.max_turns`
(truncated, as for every env). `info["success"]` is a reward at least `success_reward`. An env that
raises fails the episode with its line (recorded and skipped by the collector).

## Reference
`eval_baselines` gives `baseline_random`: `sample_action` (one of the taskset's answers, uniformly)
at every turn, once per evaluated seed, on the worker in an episode of its own; cached per set of
seeds (evaluation plays the same seeds every time).

## Arguments
`load` (`module:function` or a taskset id), `eval_load` (the same, for evaluation seeds), `paths`
(folders put first on the worker's import path, relative to the working directory), `python` (the
interpreter of an environment with verifiers; default: $AGENTRL_VERIFIERS_PYTHON, else this
checkout's .venv-verifiers), `max_rows`, `success_reward`, `timeout` (seconds a worker may take to
answer).
"""

from __future__ import annotations

import atexit
import json
import os
import random
import select
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from agentrl.envs.args import check_arg, is_count, is_number, is_reward
from agentrl.envs.references import PerSeeds, policy_success, run_apart
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import register_env

EVAL_SEED_BASE = 1_000_000  # the rollout's evaluation seeds start here (agentrl/rollout/tasks.py)
WORKER = Path(__file__).with_name("verifiers_worker.py")
VENV = "verifiers 0.4.0 runs in an environment of its own: run `make verifiers` (builds .venv-verifiers)"


def verifiers_python(configured: str | None = None) -> str:
    """The interpreter of the verifiers environment: the argument, $AGENTRL_VERIFIERS_PYTHON, or .venv-verifiers."""
    if configured:
        return configured
    if os.environ.get("AGENTRL_VERIFIERS_PYTHON"):
        return os.environ["AGENTRL_VERIFIERS_PYTHON"]
    # not resolved: a venv's python is a link whose own path selects the venv
    return str(WORKER.resolve().parent.parent.parent / ".venv-verifiers" / "bin" / "python")


class Worker:
    """One worker process and the lock that keeps its requests and answers in order."""

    def __init__(self, python: str, load: dict[str, Any], timeout: float) -> None:
        if not Path(python).is_file():
            raise ConfigError(f"verifiers: no python at {python}; {VENV}, or set env.args.python")
        self.timeout = timeout
        self._lock = threading.Lock()
        self._log: IO[bytes] = tempfile.TemporaryFile()  # the worker's stderr, read when it dies
        self.python = python
        self.process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, text=True, bufsize=1)
        try:
            self.info = self.call(load, error=ConfigError)
        except ConfigError:
            self.stop()
            raise

    def call(self, request: dict[str, Any], error: type[Exception] = EnvError) -> dict[str, Any]:
        """Send one request and wait for its answer; an `error` of one line when the worker refuses or dies."""
        with self._lock:
            proc = self.process
            if proc.poll() is None:
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(json.dumps(request) + "\n")
                    proc.stdin.flush()
                    ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
                    line = proc.stdout.readline() if ready else None
                except (BrokenPipeError, OSError):
                    line = ""
                if line is None:  # its answer may still come: out of step with us, so it goes
                    proc.kill()
                    raise error(f"verifiers: the worker did not answer {request.get('op')!r} "
                                f"in {self.timeout:g} s (env.args.timeout)")
                if line:
                    answer = json.loads(line)
                    if "error" in answer:
                        raise error(f"verifiers: {answer['error']}")
                    return dict(answer["ok"])
            raise error(f"verifiers: the worker ({self.python}) exited: {self._last_line()}")

    def _last_line(self) -> str:
        self.process.wait(timeout=10)
        self._log.seek(0)
        lines = [x for x in self._log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1] if lines else f"exit status {self.process.returncode}"

    def hang_up(self) -> None:
        """Close the worker's stdin: its loop ends and it exits."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass

    def stop(self) -> None:
        """End the worker: hang up, then wait for it (killed after 10 s)."""
        self.hang_up()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_WORKERS: dict[str, Worker] = {}
_WORKERS_LOCK = threading.Lock()
_KEY_LOCKS: dict[str, threading.Lock] = {}  # one per arguments: workers of other arguments start side by side


def shared_worker(python: str, load: dict[str, Any], timeout: float) -> Worker:
    """This process's worker for these arguments, started on first use (and again after it died)."""
    key = json.dumps([python, load], sort_keys=True)
    with _WORKERS_LOCK:
        if not _KEY_LOCKS:
            atexit.register(stop_workers)
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        worker = _WORKERS.get(key)
        if worker is None or worker.process.poll() is not None:
            worker = Worker(python, load, timeout)
            with _WORKERS_LOCK:
                _WORKERS[key] = worker
        return worker


def stop_workers() -> None:
    """Stop every verifiers worker of this process."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    for worker in workers:  # all hung up first: they exit side by side
        worker.hang_up()
    for worker in workers:
        worker.stop()


def _check_load(name: str, value: Any, optional: bool = False) -> None:
    ok = (optional and value is None) or (isinstance(value, str) and bool(value.strip())
                                           and value.count(":") <= 1 and not value.startswith(":")
                                           and not value.endswith(":"))
    check_arg("verifiers", ok, name, value, "'module:function' (returning a verifiers.v1 Env or Taskset) "
              "or an installed taskset id" + (", or null" if optional else ""))


class VerifiersEnv:
    """A verifiers.v1 environment played through the worker: its tasks, its turns and its rewards."""

    def __init__(self, load: str = "", eval_load: str | None = None, paths: list[str] | None = None,
                 python: str | None = None, max_rows: int = 100_000, success_reward: float = 1.0,
                 timeout: float = 120.0) -> None:
        _check_load("load", load)
        _check_load("eval_load", eval_load, optional=True)
        check_arg("verifiers", paths is None or (isinstance(paths, list) and all(isinstance(p, str) for p in paths)),
                  "paths", paths, "a list of folders")
        check_arg("verifiers", python is None or (isinstance(python, str) and bool(python)), "python", python,
                  "the path of a python with verifiers 0.4.0")
        check_arg("verifiers", is_count(max_rows, 1, 10_000_000), "max_rows", max_rows, "an int from 1 to 10000000")
        check_arg("verifiers", is_reward(success_reward), "success_reward", success_reward, "a finite number")
        check_arg("verifiers", is_number(timeout) and 0 < timeout <= 3600, "timeout", timeout,
                  "seconds, > 0 and at most 3600")
        request = {"op": "load", "load": load, "eval_load": eval_load, "max_rows": max_rows,
                   "paths": [str(Path(p).resolve()) for p in paths or []]}
        self._start = (verifiers_python(python), request, float(timeout))
        self.worker = shared_worker(*self._start)
        self.load, self.success_reward = load, float(success_reward)
        self.rows = {"train": int(self.worker.info["train"]), "eval": int(self.worker.info["eval"])}
        self.default_instructions = f"verifiers {self.worker.info['name']}."  # for a task without a system prompt
        self.instructions = self.default_instructions
        self._episode = f"{os.getpid()}-{id(self)}"
        self._answers: list[str] | None = None
        self._live = False
        self.baseline_plays = 1
        self._references = PerSeeds(self._random_success)

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """The task of `seed`'s row, the env's run started on it: its system prompt and first user turn."""
        if self.worker.process.poll() is not None:  # the worker died (its episode failed): a fresh one
            self.worker = shared_worker(*self._start)
        seed = random.randrange(2**31) if seed is None else seed
        split = "eval" if seed >= EVAL_SEED_BASE else "train"
        row = seed % self.rows[split]
        answer = self.worker.call({"op": "reset", "episode": self._episode, "split": split, "row": row})
        if answer["done"]:
            self._live = False
            raise EnvError(f"verifiers: {self.load}: the episode of row {row} ended before the first reply: "
                           f"{answer.get('error', 'no turn')}")
        self._live = True
        self.instructions = answer.get("system") or self.default_instructions
        return "\n\n".join(answer["messages"]), {"split": split, "row": row}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The reply to the env: its next user turn, or the task's rewards at the end."""
        if not self._live:
            raise EnvError("verifiers: step() called on a finished episode; call reset() first")
        answer = self.worker.call({"op": "step", "episode": self._episode, "reply": str(action)})
        if not answer["done"]:
            return "\n\n".join(answer["messages"]), 0.0, False, False, {}
        self._live = False
        if "error" in answer:
            raise EnvError(f"verifiers: {self.load}: {answer['error']}")
        reward = float(answer["reward"])
        metrics = {k: float(v) for k, v in answer["metrics"].items()}
        metrics.update({f"reward_{k}": float(v) for k, v in answer["rewards"].items() if v is not None})
        info = {"success": reward >= self.success_reward, "metrics": metrics, "stop": answer["stop"]}
        return "", reward, True, False, info

    def score(self, split: str, row: int, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The task's rewards for a finished conversation (`{reward, rewards, weights, metrics}`)."""
        return self.worker.call({"op": "score", "split": split, "row": row, "messages": messages})

    def sample_action(self, rng: random.Random) -> str:
        """A reply drawn from the taskset's answers (its rows' `answer` field), else an empty reply."""
        if self._answers is None:
            rows = self.worker.call({"op": "rows", "split": "train"})["rows"]
            self._answers = [str(r["answer"]) for r in rows if "answer" in r]
        return rng.choice(self._answers) if self._answers else ""

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The random policy's success on the evaluated seeds: `sample_action` at every turn."""
        return self._references(trajectories)

    def _random_success(self, seeds: tuple[int, ...]) -> dict[str, float]:
        env = object.__new__(VerifiersEnv)
        env.__dict__.update(self.__dict__)  # the same worker, an episode of its own
        env._episode, env._live = f"{self._episode}-reference", False
        try:
            return {"random": run_apart(policy_success(env, env.sample_action, seeds, self.baseline_plays, 100))}
        finally:
            env.close()

    def close(self) -> None:
        """Drop the episode in the worker (a truncated one is still waiting for a reply)."""
        if self._live and self.worker.process.poll() is None:
            self._live = False
            try:
                self.worker.call({"op": "close", "episode": self._episode})
            except EnvError:
                pass  # the worker is gone: nothing is left to drop


register_env("verifiers", VerifiersEnv)
