"""MiniGrid and BabyAI (Farama-Foundation/Minigrid) on agentrl's env contract: `env.type=minigrid`.

## Description
Any MiniGrid or BabyAI level of Gymnasium's registry (`MiniGrid-Empty-5x5-v0`, `MiniGrid-DoorKey-5x5-v0`,
`BabyAI-GoToObj-v0`, `BabyAI-PickupLoc-v0`, ...), made by `gymnasium.make(env_id, **kwargs)`. The
dynamics, rewards, step limit and termination are MiniGrid's own: this module only turns the
agent's partial view into text and the model's reply into one of MiniGrid's actions.

## Action format
The content of the last `<answer>...</answer>` (or of an unclosed `<answer>` tail, or else the
whole reply), case insensitive, naming one of MiniGrid's actions: `left` / `right` (turn in
place), `forward`, `pickup` (also `pick up`), `drop`, `toggle` (open a door or a box), `done`.
A reply naming two different actions, or none, is invalid: it never reaches MiniGrid, costs
`format_penalty`, leaves the state as it was and still uses up one of the episode's steps.

## Observation format
Built from MiniGrid's egocentric view (`obs["image"]`: the 7x7 cells in front of the agent, walls
hiding what lies behind them) and `carrying`, one fact per line at a fixed place, e.g.

    Mission: go to the green key.
    In front: wall 3 steps ahead. Left: empty. Right: wall. Carrying: nothing.
    Seen: green key 2 ahead 1 left; red door 4 ahead 3 right.

`In front` is the first cell straight ahead that is not empty floor (`nothing within 6 steps`
when the view is clear); `Left` and `Right` are the cells beside the agent; `Seen` lists every
visible thing that is neither wall nor floor, nearest first, by its offset from the agent in
steps (ahead, left / right), which is what a policy must act on: a model of a few million
parameters reads an offset at a fixed place far more easily than it finds a thing in a grid
(measured on Sokoban's offsets line, configs/sokoban.yaml). A thing is `<colour> <type>`
(`green key`, `grey box`, `blue ball`), a door also gives its state (`locked yellow door`),
`goal` and `lava` are named as such. `instructions` names the level and the reply format.

## Starting state
MiniGrid's `reset(seed=seed)`: its levels draw from the env's own Gymnasium generator
(`np_random`), never from a global one, so the same seed replays the same episode and concurrent
envs share no random state.

## Rewards
MiniGrid's: `1 - 0.9 * step_count / max_steps` on success (BabyAI's verifier for BabyAI levels,
reaching the goal for MiniGrid's), 0 otherwise (a failed BabyAI mission and MiniGrid's lava end
the episode with 0). An invalid reply pays `format_penalty` and is not a MiniGrid step, so it
does not lower MiniGrid's time-decayed success reward; it still uses up a step of the limit.

## Episode end
Termination is MiniGrid's (the mission done or failed, lava). Truncation: MiniGrid's `max_steps`
(set it with `kwargs: {max_steps: N}`), counted here over every reply, invalid ones included; a
step is never both. `info["success"]` is a terminating step with a positive reward; stepping
after the end is an EnvError.

## Reference
`eval_baselines` on the evaluated seeds: `baseline_random`, a uniform random action of the seven
at every step (`sample_action`), averaged over `baseline_plays` plays per seed; and for BabyAI
levels `baseline_bot`, MiniGrid's scripted solver (`minigrid.utils.baby_ai_bot.BabyAIBot`) under
the same step limit. Both are cached: evaluation plays the same seeds every time.

## Arguments
`env_id` (a MiniGrid or BabyAI id of Gymnasium's registry), `kwargs` (keyword arguments for
`gymnasium.make`, e.g. `{max_steps: 12}`), `format_penalty`, `baseline_plays`.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from agentrl.envs.args import REWARD_MAX, built, check_arg, import_extra, is_count, is_reward
from agentrl.envs.references import PerSeeds
from agentrl.envs.text import answer_content
from agentrl.errors import ConfigError, EnvError, did_you_mean, shown
from agentrl.registry import register_env

ACTIONS = ("left", "right", "forward", "pickup", "drop", "toggle", "done")  # index = MiniGrid's Actions
_ACTION_RE = re.compile(r"\b(left|right|forward|pick ?up|drop|toggle|done)\b")
SCAN_LIMIT = 4096  # an answer longer than this names no action; the cap keeps parsing cheap
PREFIXES = ("MiniGrid-", "BabyAI-")
SEEN_MAX = 8  # things listed on the Seen line (a BabyAI maze room can show a dozen)
_check = functools.partial(check_arg, "minigrid")


def import_minigrid() -> Any:
    """The `minigrid` package (its import registers the MiniGrid and BabyAI ids with Gymnasium)."""
    return import_extra("minigrid", "minigrid", "env type 'minigrid'")


def known_ids() -> list[str]:
    """The MiniGrid and BabyAI ids of Gymnasium's registry."""
    import_minigrid()
    import gymnasium as gym

    return sorted(k for k in gym.registry if k.startswith(PREFIXES))


def make_minigrid(env_id: str, kwargs: dict[str, Any]) -> Any:
    """`gymnasium.make(env_id, **kwargs)`, with an unknown id or a failed build as one-line ConfigErrors."""
    ids = known_ids()
    if env_id not in ids:
        raise ConfigError(f"minigrid: env_id={shown(env_id)} is not a MiniGrid or BabyAI id of Gymnasium's registry."
                          f"{did_you_mean(env_id, ids)} E.g. BabyAI-GoToObj-v0, MiniGrid-Empty-5x5-v0")
    import gymnasium as gym

    return built(f"minigrid: gymnasium.make({shown(env_id)}, **{shown(kwargs)})", lambda: gym.make(env_id, **kwargs))


def parse_action(reply: str) -> int | None:
    """MiniGrid's action id named by `reply` (see Action format), or None."""
    if not isinstance(reply, str):
        return None
    content = answer_content(reply.lower())[:SCAN_LIMIT]
    found = {m.group(1).replace(" ", "") for m in _ACTION_RE.finditer(content)}
    return ACTIONS.index(found.pop()) if len(found) == 1 else None


@functools.cache
def _names() -> tuple[dict[int, str], dict[int, str]]:
    """MiniGrid's tables from an image cell's object and colour indices to their names."""
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    return IDX_TO_OBJECT, IDX_TO_COLOR


def thing(cell: np.ndarray) -> str:
    """One encoded cell `(object, colour, state)` of MiniGrid's image as words."""
    objects, colors = _names()
    kind = objects[int(cell[0])]
    if kind in ("unseen", "empty", "floor", "wall", "goal", "lava"):
        return "empty" if kind == "floor" else kind  # floor is walked over like empty cells
    color = colors[int(cell[1])]
    if kind == "door":  # MiniGrid's door states: 0 open, 1 closed, 2 locked
        return f"{('open', 'closed', 'locked')[int(cell[2])]} {color} door"
    return f"{color} {kind}"


def offset(ahead: int, side: int) -> str:
    """A cell's place relative to the agent, in steps: `2 ahead 1 left`."""
    parts = [f"{ahead} ahead"] if ahead else []
    if side:
        parts.append(f"{abs(side)} {'left' if side < 0 else 'right'}")
    return " ".join(parts) or "here"


def render_view(image: np.ndarray, carrying: Any) -> str:
    """The lines `In front ... Carrying` and `Seen` from MiniGrid's egocentric image `(W, H, 3)`,
    where the agent stands at `(W // 2, H - 1)` facing decreasing H."""
    width, height = image.shape[0], image.shape[1]
    x, y = width // 2, height - 1
    front = f"nothing within {y} steps"
    for steps in range(1, y + 1):
        name = thing(image[x, y - steps])
        if name != "empty":
            front = f"{name} {steps} step{'s' if steps > 1 else ''} ahead"
            break
    held = f"{carrying.color} {carrying.type}" if carrying is not None else "nothing"
    seen = []
    for i in range(width):
        for j in range(height):
            name = thing(image[i, j])
            if name not in ("unseen", "empty", "wall") and (i, j) != (x, y):
                ahead, side = y - j, i - x
                seen.append((ahead + abs(side), ahead, side, name))
    listed = "; ".join(f"{name} {offset(a, s)}" for _, a, s, name in sorted(seen)[:SEEN_MAX])
    return (f"In front: {front}. Left: {thing(image[x - 1, y])}. Right: {thing(image[x + 1, y])}. "
            f"Carrying: {held}.\nSeen: {listed or 'nothing'}.")


class MiniGridTextEnv:
    """A MiniGrid or BabyAI level with its partial view as text and a text reply as action."""

    def __init__(self, env_id: str = "BabyAI-GoToObj-v0", kwargs: dict[str, Any] | None = None,
                 format_penalty: float = -0.1, baseline_plays: int = 4) -> None:
        _check(isinstance(env_id, str) and bool(env_id), "env_id", env_id,
               "a MiniGrid or BabyAI id such as 'BabyAI-GoToObj-v0'")
        _check(kwargs is None or isinstance(kwargs, dict), "kwargs", kwargs, "a mapping of gymnasium.make arguments")
        _check(is_reward(format_penalty), "format_penalty", format_penalty,
               f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        _check(is_count(baseline_plays, 1, 1000), "baseline_plays", baseline_plays, "an int from 1 to 1000")
        self.env_id, self.kwargs = env_id, dict(kwargs or {})
        self.format_penalty, self.baseline_plays = float(format_penalty), baseline_plays
        self._gym = make_minigrid(env_id, self.kwargs)
        self.instructions = (
            f"MiniGrid {env_id}. You see the cells in front of you; places are in steps ahead and "
            "to your left or right. Reply with one action: left or right (turn), forward, pickup, drop, "
            "toggle (open) or done, as <answer>action</answer>.")
        self._obs: dict[str, Any] | None = None
        self._steps, self._done = 0, True
        self._references = PerSeeds(lambda seeds: reference_success(self.env_id, self.kwargs, seeds,
                                                                    self.baseline_plays))

    @property
    def unwrapped(self) -> Any:
        """MiniGrid's own env (its grid, agent, carrying, step_count and max_steps)."""
        return self._gym.unwrapped

    @property
    def is_babyai(self) -> bool:
        """Whether the level has BabyAI's instructions, which MiniGrid's scripted bot solves."""
        return hasattr(self.unwrapped, "instrs")

    def _text(self) -> str:
        assert self._obs is not None  # set by reset(), which every caller runs first
        return f"Mission: {self._obs['mission']}.\n{render_view(self._obs['image'], self.unwrapped.carrying)}"

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """MiniGrid's reset; the same seed gives the same episode."""
        return self.reset_now(seed)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's reply; an unparseable one is a penalised no-op step."""
        return self.step_now(action)

    def reset_now(self, seed: int | None = None) -> tuple[str, dict]:
        """`reset`, called without an event loop (MiniGrid's calls are synchronous)."""
        self._obs, _ = self._gym.reset(seed=seed)
        self._steps, self._done = 0, False
        return self._text(), {"seed": seed, "mission": str(self._obs["mission"])}

    def step_now(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step`, called without an event loop."""
        if self._done:
            raise EnvError("minigrid: step() called on a finished episode; call reset() first")
        move = parse_action(action)
        self._steps += 1
        terminated = truncated = False
        if move is None:
            reward = self.format_penalty
        else:
            self._obs, reward, terminated, truncated, _ = self._gym.step(move)
        terminated = bool(terminated)
        # MiniGrid counts only its own steps; invalid replies use up the limit too. MiniGrid also
        # says truncated on a last step that succeeds: a step here is one or the other.
        truncated = not terminated and bool(truncated or self._steps >= self.unwrapped.max_steps)
        info: dict[str, Any] = {"action_valid": move is not None, "action": None if move is None else ACTIONS[move]}
        if terminated or truncated:
            self._done = True
            info["success"] = terminated and reward > 0
        return self._text(), float(reward), terminated, truncated, info

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a uniformly random action of the seven."""
        return f"<answer>{rng.choice(ACTIONS)}</answer>"

    def demonstration(self, rng: random.Random, tools: tuple[str, ...]) -> list[str]:
        """The scripted bot's action in the current state on BabyAI levels, else a random one."""
        if self._done or not self.is_babyai:
            return [self.sample_action(rng)]
        try:
            return [f"<answer>{ACTIONS[bot_action(self._gym)]}</answer>"]
        except Exception:  # the bot gives up (raises) on the few levels it cannot solve
            return [self.sample_action(rng)]

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The random policy's and (BabyAI) the scripted bot's success on the evaluated seeds."""
        return self._references(trajectories)

    def close(self) -> None:
        """End the episode and close MiniGrid's env."""
        self._gym.close()
        self._done = True


def bot_action(gym_env: Any) -> int:
    """The action a fresh BabyAIBot suggests in `gym_env`'s current state (it reads, never changes, the env)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    return int(BabyAIBot(gym_env).replan())


def reference_success(env_id: str, kwargs: dict[str, Any], seeds: tuple[int, ...], plays: int) -> dict[str, float]:
    """`random`: mean success of a uniform random action of the seven (as `sample_action` draws)
    over `plays` episodes of each seed; for BabyAI levels `bot`: the success of MiniGrid's
    BabyAIBot (deterministic: one play per seed). Both drive MiniGrid directly: no text is built."""
    gym_env, wins = make_minigrid(env_id, kwargs), 0
    for seed in seeds:
        for k in range(plays):
            rng = random.Random(seed * 7919 + k)
            gym_env.reset(seed=seed)
            wins += play(gym_env, functools.partial(rng.randrange, len(ACTIONS)))
    out = {"random": wins / (len(seeds) * plays)}
    if hasattr(gym_env.unwrapped, "instrs"):
        out["bot"] = sum(bot_episode(gym_env, seed) for seed in seeds) / len(seeds)
    gym_env.close()
    return out


def play(gym_env: Any, policy: Callable[[], int]) -> bool:
    """Whether the episode `gym_env` has just been reset to succeeds with `policy`'s actions."""
    while True:
        _, reward, terminated, truncated, _ = gym_env.step(policy())
        if terminated or truncated:
            return bool(terminated) and reward > 0


def bot_episode(gym_env: Any, seed: int) -> bool:
    """Whether MiniGrid's BabyAIBot, replanning after each of its actions, succeeds on `seed`
    (a bot that gives up, raising, as it may on the few levels it cannot solve, fails)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    gym_env.reset(seed=seed)
    bot = BabyAIBot(gym_env)
    try:
        return play(gym_env, lambda: int(bot.replan()))
    except Exception:  # the bot's own errors (DisappearedBoxError, its asserts): it failed that episode
        return False


register_env("minigrid", MiniGridTextEnv)
