"""A game of several roles in one episode: each role plays its own conversation and yields its own
token-exact trajectory.

An env whose `roles` names two or more roles is a game (envs/base.py): its reset and every step
that does not end it say in `info["role"]` which role acts next, and the observation they return
is that role's (what is new for it since it last acted). The step that ends the game gives every
role's reward in `info["rewards"]` (+1 / -1 / 0 in a zero-sum game).

Each role the policy plays is a `seat`: an `Episode` of the agent's own kind (agents/loop.py, its
hooks, token budget and conversation policy, a history window included) whose env step goes
through the game. A seat sees only its own observations and its own replies; its turns are
sampled with a seed of its own. When the game ends, every seat gets its role's final reward on
its last turn (the loser's arrives on the winner's step), `success` = a reward above 0, and
`info["metrics"]` `win`, `draw` and `loss` (a game cut short by `max_turns` or a budget has
none). Who plays which role is the task's `opponent` (trajectory.py): "" the policy in every role
(self-play: one trajectory per role, each tagged with its `role`); "random" the env's random
legal player (`sample_action`) in every role but one, `roles[group_id % len(roles)]`, the
policy's (evaluation against a fixed opponent). `max_turns` counts the env steps of all roles.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, cast

from agentrl.agents.loop import Episode, TurnAgent
from agentrl.envs.base import Env
from agentrl.errors import EnvError
from agentrl.llm.engine import LLMClient
from agentrl.trajectory import Task, Trajectory

OPPONENTS = ("", "random")  # Task.opponent's values: the policy itself (self-play), the env's random legal player


def is_game(env: Any) -> bool:
    """Whether `env` declares two or more roles (a game: agents/game.py plays it)."""
    roles = getattr(env, "roles", ())
    return isinstance(roles, (tuple, list)) and len(roles) >= 2


async def play_episode(agent: TurnAgent, episode: type[Episode], task: Task, env: Env,
                       llm: LLMClient) -> Trajectory | list[Trajectory]:
    """Reset `env` for `task` and play it with `episode`'s kind: one episode, or a game's seats."""
    obs, info = await env.reset(seed=task.env_seed)
    if is_game(env):
        return await Game(agent, episode, task, env, llm, obs, info).play()
    return await episode(agent, task, env, llm, obs).play()


def seat_task(task: Task, index: int) -> Task:
    """The task as role `index` samples it: seat 0 keeps its seeds, each other seat gets its own."""
    return task if index == 0 else replace(task, sampling_seed=(task.sampling_seed + index * 0x9E3779B97F4A7C15)
                                           % (1 << 63))


class Game:
    """One game in play: whose turn it is, each seat's conversation, the env stepped for them."""

    def __init__(self, agent: TurnAgent, episode: type[Episode], task: Task, env: Env, llm: LLMClient,
                 obs: str, info: dict) -> None:
        if task.opponent not in OPPONENTS:
            raise ValueError(f"task.opponent={task.opponent!r}: expected one of {OPPONENTS}")
        self.agent, self.episode, self.task, self.env, self.llm = agent, episode, task, env, llm
        self.roles: tuple[str, ...] = tuple(getattr(env, "roles", ()))
        self.policy_roles = self.roles if not task.opponent else (self.roles[task.group_id % len(self.roles)],)
        self.rng = random.Random(task.sampling_seed)  # the random opponent's moves
        self.seats: dict[str, Seat] = {}
        self.told: dict[str, int] = {}  # the env step after which each seat was last told its observation
        self.role, self.obs = self._role_of(info, "reset"), obs
        self.steps = 0
        self.over = False

    def _role_of(self, info: dict, where: str) -> str:
        role = info.get("role")
        if role not in self.roles:
            raise EnvError(f"{type(self.env).__name__}.{where}() gave info['role']={role!r}; a game's reset and "
                           f"every step that does not end it name the role that acts next, one of {self.roles}")
        return str(role)

    async def play(self) -> list[Trajectory]:
        """Turns until the game ends, a seat runs out of budget, or `max_turns` env steps are taken."""
        while not self.over and self.steps < self.agent.max_turns:
            if self.role not in self.policy_roles:
                await self.step(self.role, self.env.sample_action(self.rng))
                continue
            seat = self.seats.get(self.role)
            if seat is None:
                index = self.roles.index(self.role)
                seat = self.seats[self.role] = seat_kind(self.episode)(
                    self.agent, seat_task(self.task, index), cast(Env, _SeatEnv(self, self.role)), self.llm, self.obs)
            elif self.told[self.role] != self.steps:  # not after a reply that took no env step (a tool call)
                seat.observe(self.obs)
            self.told[self.role] = self.steps
            await seat.play_turn()
            if seat.over and not self.over:  # no room for the seat's reply: the game stops there
                self._cut(seat.reason)
        if not self.over:
            self._cut("max_turns")
        return self.finish()

    async def step(self, role: str, action: str) -> tuple[str, float, bool, bool, dict]:
        """The env's step on `role`'s action; what the acting seat learns of it (its next observation
        comes when it acts again)."""
        obs, reward, terminated, truncated, info = await self.env.step(action)
        self.steps += 1
        if not (terminated or truncated):
            self.role, self.obs = self._role_of(info, "step"), obs
            return "", float(reward), False, False, {}
        self.over = True
        rewards = info.get("rewards") or {role: float(reward)}
        for other, seat in self.seats.items():
            if other != role:  # the acting seat's own ending comes back through its step
                seat.conv.record.add_turn_reward(float(rewards.get(other, 0.0)))
                seat.ends(bool(terminated), bool(truncated), self._ending(info, rewards, other, bool(terminated)))
                seat.over = True
        return "", float(rewards.get(role, reward)), bool(terminated), bool(truncated), self._ending(
            info, rewards, role, bool(terminated))

    def _ending(self, info: dict, rewards: dict, role: str, terminated: bool) -> dict:
        """The ending step's info as `role`'s seat records it: its success and its win, draw or loss."""
        out = {k: v for k, v in info.items() if k not in ("rewards", "role", "success")}
        reward = float(rewards.get(role, 0.0))
        out["success"] = reward > 0
        metrics = dict(out.get("metrics") or {})
        if terminated:
            metrics.update(win=float(reward > 0), draw=float(reward == 0), loss=float(reward < 0))
        out["metrics"] = metrics
        return out

    def _cut(self, reason: str | None) -> None:
        """End the game unfinished, every seat truncated for `reason`."""
        self.over = True
        for seat in self.seats.values():
            if not seat.over:
                seat.reason, seat.over = reason, True

    def finish(self) -> list[Trajectory]:
        """One trajectory per seat that replied (a seat's windowed segments included), in role order."""
        out: list[Trajectory] = []
        for role in self.roles:
            seat = self.seats.get(role)
            if seat is None:
                continue
            trajs = seat.finish()
            for t in trajs if isinstance(trajs, list) else [trajs]:
                t.role = role
                out.append(t)
        if not out:
            raise EnvError(f"{type(self.env).__name__}: the game ended before any role the policy plays "
                           f"({', '.join(self.policy_roles)}) acted")
        return out


class _SeatEnv:
    """The env as one seat sees it: its steps go through the game."""

    def __init__(self, game: Game, role: str) -> None:
        self.game, self.role = game, role
        self.instructions = getattr(game.env, "instructions", "")

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """The game's step on this seat's action (the seat's next observation comes when it acts again)."""
        return await self.game.step(self.role, action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.game.env, name)


class Seat(Episode):
    """What the game asks of a seat beyond its `Episode`: `observe`, its observation when it acts again."""

    def observe(self, obs: str) -> None:
        """Tell the seat what is new for it (the opponents' moves), as its kind tells an observation."""


_SEAT_KINDS: dict[type[Episode], type[Seat]] = {}


def seat_kind(episode: type[Episode]) -> type[Seat]:
    """`episode`'s kind as a seat: its observation is told when the game gives it (`observe`), not
    after its own step (the next role acts then)."""
    if episode not in _SEAT_KINDS:
        class KindSeat(Seat, episode):  # type: ignore[valid-type,misc]
            def tell(self, obs: Any) -> None:
                pass  # after the seat's own step: nothing is new for it until its next turn

            def observe(self, obs: str) -> None:
                self.obs = obs
                episode.tell(self, obs)

        KindSeat.__name__ = KindSeat.__qualname__ = f"Seat{episode.__name__}"
        _SEAT_KINDS[episode] = KindSeat
    return _SEAT_KINDS[episode]
