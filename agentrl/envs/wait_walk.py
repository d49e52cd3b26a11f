"""WaitWalk: a crossing where waiting adds a turn and nothing else (the turn-credit experiment).

## Description
The player stands between the goal and a hole, one step from each; the goal's side (Left or
Right) is drawn from the reset seed. Stepping towards the goal wins, towards the hole loses, and
`Wait` passes a turn and changes nothing. The policy thus decides how long an episode lasts
without changing what it can earn: the success probability of a policy is the share of its
direction moves that go the right way, whatever its wait rate. The right policy gradient is
indifferent to waiting; an advantage estimator that teaches the policy to wait (or not to) is
biased by episode length. `benchmarks/turn_credit.py` trains on it; the exact expected update of
every estimator on its tabular form is `agentrl/algos/wait_gradient.py`.

## Action format
The content of the last `<answer>...</answer>` (or of an unclosed `<answer>` tail, or else the
whole reply), case insensitive, stripped: `Left`, `Right` or `Wait`. Anything else is invalid:
it costs `format_penalty`, changes nothing and uses up a step.

## Observation format
`Goal: Left.` (or `Right.`). A wait leaves the observation as it was, so a wait's turn starts
from the same env state as the one before it (GiGPO's anchor states). On the last step the line
`Last step: waiting ends the episode.` follows.

## Starting state
Between the goal and the hole; the goal's side is the seed's.

## Rewards
`success_reward` for stepping onto the goal, 0 for the hole, 0 for a wait, `format_penalty` for
an invalid reply. No discount and no step cost: a wait costs nothing unless it is the last step.

## Episode end
Termination: a Left or Right move (the goal or the hole). Truncation: `max_steps` steps taken
without one (0 reward). `info["success"]` is set on the last step, and `info["metrics"]` holds
`waits` (the episode's wait moves) and `wait_share` (waits per step).

## Arguments
`max_steps` (horizon; the episode is truncated after it), `success_reward`, `format_penalty`.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.envs.args import REWARD_MAX, STEPS_MAX, check_arg, is_count, is_reward
from agentrl.envs.text import answer_content
from agentrl.errors import EnvError
from agentrl.registry import register_env

MOVES = ("Left", "Right", "Wait")


def parse_move(reply: str) -> str | None:
    """The move `reply` names (one of MOVES), or None."""
    if not isinstance(reply, str):
        return None
    content = answer_content(reply.lower())[:64].strip().rstrip(".!")
    return next((m for m in MOVES if m.lower() == content), None)


class WaitWalkEnv:
    """Step towards the goal's side, or wait a turn; waiting changes nothing but the length."""

    def __init__(self, max_steps: int = 6, success_reward: float = 1.0, format_penalty: float = -0.1) -> None:
        check_arg("wait_walk", is_count(max_steps, 1, STEPS_MAX), "max_steps", max_steps,
                  f"an int from 1 to {STEPS_MAX}")
        for name, value in (("success_reward", success_reward), ("format_penalty", format_penalty)):
            check_arg("wait_walk", is_reward(value), name, value, f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        self.max_steps = max_steps
        self.success_reward, self.format_penalty = float(success_reward), float(format_penalty)
        self.instructions = ("Step onto the goal: answer <answer>Left</answer> or <answer>Right</answer>; "
                             "<answer>Wait</answer> passes a turn.")
        self._goal = "Left"
        self._steps = self._waits = 0
        self._done = True

    def _observation(self) -> str:
        last = "\nLast step: waiting ends the episode." if self._steps == self.max_steps - 1 else ""
        return f"Goal: {self._goal}.{last}"

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode; the seed picks the goal's side."""
        self._goal = random.Random(seed).choice(("Left", "Right"))
        self._steps = self._waits = 0
        self._done = False
        return self._observation(), {"optimal_success": 1.0}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the reply: a direction ends the episode, a wait or an invalid reply passes a step."""
        if self._done:
            raise EnvError("wait_walk: step() called on a finished episode; call reset() first")
        move = parse_move(action)
        self._steps += 1
        self._waits += move == "Wait"
        terminated = move in ("Left", "Right")
        reward = self.format_penalty if move is None else float(move == self._goal) * self.success_reward
        truncated = not terminated and self._steps >= self.max_steps
        info: dict[str, Any] = {"action_valid": move is not None, "action": move}
        if terminated or truncated:
            self._done = True
            info["success"] = move == self._goal
            info["metrics"] = {"waits": self._waits, "wait_share": self._waits / self._steps}
        return self._observation(), reward, terminated, truncated, info

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a uniformly random move: Left, Right, or (before the last step) Wait."""
        moves = MOVES if self._done or self._steps < self.max_steps - 1 else MOVES[:2]
        return f"<answer>{rng.choice(moves)}</answer>"

    def close(self) -> None:
        """Nothing to release."""
        self._done = True


register_env("wait_walk", WaitWalkEnv)
