"""GEM's environments (axon-rl/gem) on agentrl's env contract: `env.type=gem env.args.env_id=...`.

## Description
Any env of GEM's registry, made by `gem.make(env_id, **kwargs)`: its games (`game:Sokoban-v0-easy`,
`game:GuessTheNumber-v0-easy`, Wordle, Minesweeper, Sudoku, 2048, Mastermind, Hangman, ...),
and its math, code, QA and reasoning-gym tasks (those that load a dataset from the Hugging Face
hub need it in the local cache: nothing is downloaded here). GEM's own dynamics, rewards and
termination are kept; this module only makes the calls async, joins GEM's text the way GEM's
`concat` observation wrapper does, and keeps GEM's random numbers to each env.

## Action format
The model's reply goes to GEM's `step` as it is: GEM parses it (its games read the last
`\\boxed{...}`, e.g. `\\boxed{up}` or `\\boxed{7}`; a reply GEM cannot parse is GEM's format error,
which ends the episode with reward -0.1).

## Observation format
What GEM's `concat` wrapper shows for the latest step: GEM's observation (on reset the game's
instructions; after a step its feedback, e.g. `At turn 1, you moved up.`) and, on a new line,
GEM's `info["suffix"]` (the board and `Enter your move.`). The conversation keeps the history,
so earlier turns are not repeated. `instructions` is one line naming the game (GEM puts its
rules in the first observation).

## Starting state
GEM's `reset(seed)`. GEM seeds Python's and NumPy's global generators and draws from them (rooms,
secret numbers, 2048's new tiles, the example move in its instructions); here each env owns its
generators' states and swaps them in around each GEM call, so episodes of concurrent envs never
share random numbers and the same seed replays the same episode, whatever runs beside it.

## Rewards
`reward="gem"` (the default): GEM's (`gem.utils.constants.LanguageGameReward`: 1 for a win, -0.1
for a format error, partial rewards as each game defines them). `reward="success"`: 1 on the step
that ends a successful episode, GEM's penalties (its negative rewards: a format error's -0.1) as
GEM gives them, 0 on every other step. Why offer it: some of GEM's partial rewards
pay for something other than winning. Guess the Number pays a game lost at its turn limit
1 - |last guess - secret| / (max - min) and a repeated guess nothing less than a new one, so on
1..10 "always guess 5" earns 0.72 a game (it wins 0.10) against uniform random play's 0.73 (it
wins 0.34): collapsing onto one guess costs almost no reward. (Measured there: `success` alone did
not make the tiny model learn; docs/envs-and-agents.md, "Guess the Number: what was tried".)

## Episode end
GEM ends every episode with `terminated=True`, and also sets `truncated=True` when its turn limit
is reached. Here a step is one or the other: GEM's turn limit is a truncation (Gymnasium's
convention), except for GEM's single-answer tasks (observation `TERMINAL_STATE`), which are
graded answers and terminate. GEM has no success flag; `info["success"]` is: GEM's
`info["correct"]` where it gives one (math, QA); else, for games (`game:` ids), a win, which every
GEM game (gem-llm 0.1.0) announces, and only then, with an observation starting
`Congratulations`, on a terminating step that is not the turn limit; else a final reward >= 1.
Stepping after the end is an EnvError.

## Reference
`eval_baselines` gives GEM's own random policy (`sample_random_action` at every turn, GEM's turn
limit) on the evaluated episodes' seeds: `baseline_random`, averaged over `baseline_plays`
plays per seed (cached: evaluation plays the same seeds every time).

## Arguments
`env_id` (a GEM registry id), `kwargs` (keyword arguments for `gem.make`, e.g. `{max_turns: 6}`),
`baseline_plays`, `reward` (`gem` or `success`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from agentrl.envs.args import check_arg, import_extra, is_count
from agentrl.envs.references import PerSeeds
from agentrl.errors import ConfigError, EnvError, did_you_mean, shown
from agentrl.registry import register_env

REWARDS = ("gem", "success")  # see Rewards above
TERMINAL_STATE = "<｜TERMINAL_STATE｜>"  # gem.utils.constants: the observation after a graded answer
WIN_PREFIX = "Congratulations"  # every GEM game's win message starts so (checked in gem-llm 0.1.0)
_SWAP = threading.Lock()  # one env at a time holds the global generators (the stream thread too)


def import_gem() -> Any:
    """The `gem` package, imported on first use (it takes a second: it imports reasoning-gym);
    GEM's `logging.basicConfig` at import is undone, so agentrl's console stays as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    gem = import_extra("gem", "gem", "env type 'gem'")
    for handler in root.handlers[len(handlers):] if root.handlers[:len(handlers)] == handlers else []:
        root.removeHandler(handler)
    root.setLevel(level)
    return gem


class OwnRandom:
    """A private state of Python's and NumPy's global generators, swapped in around calls into
    code that uses the globals (GEM), and out again afterwards."""

    def __init__(self, seed: int) -> None:
        with _SWAP:
            saved = _capture()
            random.seed(seed)
            np.random.seed(seed % 2**32)
            self.state = _capture()
            _restore(saved)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the globals draw from this state; afterwards they are as before."""
        with _SWAP:
            saved = _capture()
            _restore(self.state)
            try:
                yield
            finally:
                self.state = _capture()
                _restore(saved)


@contextlib.contextmanager
def seeded_globals(seed: int) -> Iterator[None]:
    """Within the block the global generators are freshly seeded with `seed`; afterwards as before."""
    with _SWAP:
        saved = _capture()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            _restore(saved)


def _capture() -> tuple:
    return random.getstate(), np.random.get_state()


def _restore(state: tuple) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])


def make_gem(env_id: str, kwargs: dict[str, Any]) -> Any:
    """`gem.make(env_id, **kwargs)`, with an unknown id or a failed build as one-line ConfigErrors."""
    gem = import_gem()
    from gem.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        games = ", ".join(sorted(k for k in ENV_REGISTRY if k.startswith("game:") and k.endswith("-easy")))
        raise ConfigError(f"gem: env_id={shown(env_id)} is not in GEM's registry.{did_you_mean(env_id, ENV_REGISTRY)} "
                          f"Easy games: {games}")
    try:
        return gem.make(env_id, **kwargs)
    except Exception as e:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # nltk colours its messages
        first = next((line.strip() for line in text.splitlines() if any(c.isalnum() for c in line)), "")
        raise ConfigError(f"gem: gem.make({shown(env_id)}, **{shown(kwargs)}) failed: "
                          f"{type(e).__name__}: {first}") from None


def join(observation: str, info: dict[str, Any]) -> str:
    """GEM's `concat` wrapper for one step: prefix, observation (on a line of its own), suffix."""
    text = observation if isinstance(observation, str) else str(observation)
    if text and not text.endswith("\n") and info.get("suffix"):
        text += "\n"
    return f"{info.get('prefix', '')}{text}{info.get('suffix', '')}"


class GemEnv:
    """A GEM env with async reset/step, its own random generators and a success flag."""

    def __init__(self, env_id: str = "game:GuessTheNumber-v0-easy", kwargs: dict[str, Any] | None = None,
                 baseline_plays: int = 4, reward: str = "gem") -> None:
        check_arg("gem", isinstance(env_id, str) and bool(env_id), "env_id", env_id,
                  "a GEM registry id such as 'game:Sokoban-v0-easy'")
        check_arg("gem", kwargs is None or isinstance(kwargs, dict), "kwargs", kwargs,
                  "a mapping of gem.make arguments")
        check_arg("gem", is_count(baseline_plays, 1, 1000), "baseline_plays", baseline_plays, "an int from 1 to 1000")
        check_arg("gem", reward in REWARDS, "reward", reward,
                  "'gem' (GEM's own rewards) or 'success' (1 for a successful episode, GEM's penalties, else 0)")
        self.env_id, self.kwargs, self.baseline_plays, self.reward = env_id, dict(kwargs or {}), baseline_plays, reward
        self.instructions = f"GEM {env_id}."
        self._random = OwnRandom(0)
        with self._random.active():  # GEM's constructor resets, drawing from the globals
            self._gem = make_gem(env_id, self.kwargs)
        self._done = True
        self._references = PerSeeds(lambda seeds: {
            "random": random_policy_success(self.env_id, self.kwargs, seeds, self.baseline_plays)})

    @property
    def max_turns(self) -> int | None:
        """GEM's turn limit for this env (None when GEM draws it per episode)."""
        return getattr(self._gem, "max_turns", None)

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """GEM's reset with this env's own generators; the same seed gives the same episode."""
        return self.reset_now(seed)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """GEM's step on the raw reply; one of terminated / truncated, and a success flag."""
        return self.step_now(action)

    def reset_now(self, seed: int | None = None) -> tuple[str, dict]:
        """`reset`, called without an event loop (GEM's calls are synchronous)."""
        with self._random.active():
            obs, info = self._gem.reset(seed=seed)
        self._done = False
        return join(obs, info), {"seed": seed}

    def step_now(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step`, called without an event loop."""
        if self._done:
            raise EnvError("gem: step() called on a finished episode; call reset() first")
        with self._random.active():
            obs, reward, terminated, truncated, info = self._gem.step(action if isinstance(action, str) else "")
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        if terminated and truncated and obs != TERMINAL_STATE:
            terminated = False  # GEM's turn limit: a truncation
        truncated = truncated and not terminated
        out = {k: v for k, v in (info or {}).items() if k not in ("suffix", "prefix")}
        if terminated or truncated:
            self._done = True
            out["success"] = self._success(obs, reward, terminated, info or {})
        if self.reward == "success" and reward >= 0:  # GEM's penalties (a format error's -0.1) stay
            reward = float(out.get("success", False))
        return join(obs, info or {}), reward, terminated, truncated, out

    def _success(self, obs: Any, reward: float, terminated: bool, info: dict[str, Any]) -> bool:
        if "correct" in info:
            return bool(info["correct"])
        if self.env_id.startswith("game:"):
            return terminated and isinstance(obs, str) and obs.startswith(WIN_PREFIX)
        return reward >= 1.0

    def sample_action(self, rng: random.Random) -> str:
        """GEM's `sample_random_action`, drawn from `rng` (the env's own generators are left alone)."""
        with seeded_globals(rng.getrandbits(32)):
            return str(self._gem.sample_random_action())

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """GEM's random policy on the evaluated seeds (see Reference in the module docstring)."""
        return self._references(trajectories)

    def close(self) -> None:
        """End the episode (GEM's games hold nothing to release)."""
        self._done = True


def random_policy_success(env_id: str, kwargs: dict[str, Any], seeds: tuple[int, ...], plays: int,
                          turn_cap: int = 1000) -> float:
    """Mean success of GEM's `sample_random_action` policy over `plays` episodes of each seed."""
    env, wins = GemEnv(env_id, kwargs), 0
    for seed in seeds:
        for k in range(plays):
            rng = random.Random(seed * 7919 + k)
            env.reset_now(seed)
            for _ in range(turn_cap):
                _, _, terminated, truncated, info = env.step_now(env.sample_action(rng))
                if terminated or truncated:
                    wins += info["success"]
                    break
    return wins / (len(seeds) * plays)


register_env("gem", GemEnv)
