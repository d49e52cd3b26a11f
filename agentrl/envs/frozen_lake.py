"""FrozenLake as a text game, stepped by Gymnasium's `FrozenLake-v1`.

## Description
The player crosses a frozen lake from the start (top left) to the goal (bottom right) without
falling into a hole. The dynamics are Gymnasium's own: this module only turns the board into
text and the model's reply into an action. With `map_name=None` every reset seed gives a fresh
random map that is guaranteed to have a path (Gymnasium's `generate_random_map`).

## Action format
The model answers in words, read by `agentrl.envs.parsing.parse_direction`: the content of the
last `<answer>...</answer>` (or of an unclosed `<answer>` tail, or else the whole reply), case
insensitive, one of the words Left, Down, Right, Up, an arrow (← ↓ → ↑), or a lone letter
L/D/R/U. A reply naming two different directions, or none, is invalid: it costs
`format_penalty`, leaves the state as it was and still uses up a step.

## Observation format
The board, one line per row, cells separated by single spaces: `P` the player, `_` frozen ice
(the start cell too), `O` a hole, `G` the goal. The player is drawn as `P` wherever it stands.
With `show_position` (the default) a last line names the player's cell, e.g. `P: row 2,
column 1.` (1-based): a model of a few million parameters learns far faster when the state it
must act on sits at a fixed distance from its reply than when it has to find P in the grid.
With `show_neighbours` a further line gives the four cells next to the player, in the board's
symbols (`#` off the board), e.g. `Next to P: Left #, Down O, Right _, Up #.` (see Arguments).

## Starting state
The player stands on the start cell, row 0 column 0.

## Rewards
`success_reward` for reaching the goal, `hole_reward` for falling into a hole, `step_reward`
for any other valid move, `format_penalty` for a reply that cannot be parsed. On top of that,
`progress_reward` shapes each move by the change of the potential -d(s)/d(start), where d is the
shortest-path distance to the goal over ice (Ng et al. 1999). The shaping of an episode sums to
`progress_reward` times the fraction of the way covered. A hole ends the episode and keeps the
progress made: its cost is the goal's reward it can no longer earn, and since every episode's
shaping is below `progress_reward`, reaching the goal still beats any other outcome. Taking the
progress back instead (measured) taught the tiny policy to stay safe in the first row: near the
goal every path runs beside holes, and a still-random policy falls into them. Without shaping a
uniform random policy reaches the goal of the 4x4 map within 8 steps 0.3% of the time, which
leaves RL almost nothing to learn from. Set it to 0 for Gymnasium's sparse reward.

## Episode end
Termination: the player reaches the goal or falls into a hole. Truncation: `max_steps` steps
(invalid replies included) have been taken without termination (a step is never both).
`info["success"]` (reached the goal) is set on the last step; stepping after it is an EnvError.

## Reference
`reset`'s info carries `optimal_success`: the highest probability of reaching the goal within
`max_steps` steps, by value iteration over Gymnasium's transition table `P` (1.0 on a solvable
map that is not slippery; below 1 on slippery ice, where it is the bar for the episode's
horizon). `eval_baselines` gives `baseline_map_blind`: the best single move sequence for all
evaluated maps at once (what a policy that never reads the board can reach).

## Arguments
`size` (map side when `map_name` is None), `map_name` ("4x4", "8x8" or None for random maps),
`frozen_prob` (chance a random cell is ice), `is_slippery`, `max_steps`, `success_reward`,
`step_reward`, `hole_reward`, `format_penalty`, `progress_reward`, `show_position`,
`show_neighbours` (off by default; `configs/frozen_lake_random.yaml` turns it on: on unseen random
maps a policy must see the holes beside P, and the tiny model reads them from a line at a fixed
place far more easily than from the grid, as on Sokoban; measured in the README).
"""

from __future__ import annotations

import functools
import random
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as _GymFrozenLake
from gymnasium.spaces import Discrete

from agentrl.envs.args import REWARD_MAX, STEPS_MAX, check_arg, is_count, is_int, is_number, is_reward
from agentrl.envs.parsing import DIRECTIONS, parse_direction
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import register_env

ACTION_NAMES = DIRECTIONS  # index = Gymnasium's action id
_SYMBOLS = {"S": "_", "F": "_", "H": "O", "G": "G"}


def _rows(desc: Any) -> list[str]:
    """The map as a list of letter rows, from Gymnasium's bytes array or a list of strings."""
    return ["".join(c.decode() if isinstance(c, bytes) else str(c) for c in row) for row in desc]


def render_board(desc: Any, pos: int) -> str:
    """The board as text, with the player `P` at cell index `pos`."""
    rows = _rows(desc)
    lines = []
    for r, row in enumerate(rows):
        cells = ["P" if r * len(row) + c == pos else _SYMBOLS[ch] for c, ch in enumerate(row)]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def neighbour_line(desc: list[str], row: int, col: int) -> str:
    """The board's symbols of the four cells next to (row, col), `#` off the board."""
    cells = []
    for name, (dr, dc) in zip(DIRECTIONS, ((0, -1), (1, 0), (0, 1), (-1, 0))):
        r, c = row + dr, col + dc
        inside = 0 <= r < len(desc) and 0 <= c < len(desc[0])
        cells.append(f"{name} {_SYMBOLS[desc[r][c]] if inside else '#'}")
    return f"Next to P: {', '.join(cells)}."


def parse_action(reply: str) -> int | None:
    """Gymnasium's action id named by `reply`, or None when it names no single direction."""
    return parse_direction(reply)


def _tables(P: dict, n_states: int) -> tuple[np.ndarray, np.ndarray]:
    """Split Gymnasium's P into goal probabilities G[a, s] and continue probabilities T[a, s, s']."""
    n_actions = len(P[0])
    goal = np.zeros((n_actions, n_states))
    cont = np.zeros((n_actions, n_states, n_states))
    for s in range(n_states):
        for a in range(n_actions):
            for prob, nxt, reward, terminated in P[s][a]:
                if reward > 0:  # only the goal pays under Gymnasium's default schedule
                    goal[a, s] += prob
                elif not terminated:
                    cont[a, s, nxt] += prob
    return goal, cont


def optimal_success(P: dict, n_states: int, horizon: int, start: int = 0) -> float:
    """The highest probability of reaching the goal from `start` within `horizon` steps."""
    goal, cont = _tables(P, n_states)
    value = np.zeros(n_states)
    for _ in range(horizon):
        new = (goal + cont @ value).max(axis=0)
        if np.array_equal(new, value):  # a fixed point: every later step gives it again
            break
        value = new
    return float(value[start])


def best_blind_success(
    descs: list, horizon: int, is_slippery: bool = False
) -> tuple[float, list[int]]:
    """The best single action sequence for all `descs` at once and its mean success.

    Exhaustive over the 4**horizon sequences but with merged joint states, so horizon 8 on 64
    random 4x4 maps takes well under a second; long horizons on big maps still grow fast.
    """
    # A map evaluated k times is searched once with weight k: an eval of 256 episodes on the
    # fixed map held 256 copies of every belief (measured: 12.6 GB and two minutes at each eval).
    counts: dict[tuple[str, ...], int] = {}
    for d in descs:
        key = tuple(_rows(d))
        counts[key] = counts.get(key, 0) + 1
    tables = [_tables(e.P, _n_states(e)) for e in _lakes(list(counts), is_slippery)]
    if len({t[0].shape for t in tables}) != 1:
        raise ConfigError("best_blind_success needs one or more maps, all of one size")
    goal = np.stack([t[0] for t in tables])  # (maps, actions, states)
    cont = np.stack([t[1] for t in tables])  # (maps, actions, states, states)
    belief = np.zeros(goal.shape[::2])
    belief[:, 0] = list(counts.values())  # every map starts on cell 0, with its number of episodes
    memo: dict[tuple[bytes, int], tuple[float, tuple[int, ...]]] = {}

    def best(b: np.ndarray, depth: int) -> tuple[float, tuple[int, ...]]:
        # Sequences reaching the same joint state (every map's position and alive-mass) share
        # their future, so each joint state is solved once per remaining depth.
        if depth == 0 or not b.any():
            return 0.0, (0,) * depth
        key = (b.tobytes(), depth)
        if key not in memo:
            gained = np.einsum("ms,mas->a", b, goal)
            nxt = np.einsum("ms,mast->amt", b, cont)
            options = []
            for a in range(goal.shape[1]):
                value, seq = best(nxt[a], depth - 1)
                options.append((gained[a] + value, (a, *seq)))
            memo[key] = max(options, key=lambda o: o[0])
        return memo[key]

    total, seq = best(belief, horizon)
    return float(total / len(descs)), list(seq)


def goal_distances(desc: list[str]) -> np.ndarray:
    """Shortest number of moves from each cell to the goal over non-hole cells (BFS)."""
    n_rows, n_cols = len(desc), len(desc[0])
    far = n_rows * n_cols
    dist = np.full(n_rows * n_cols, far, dtype=np.int64)
    goal = next(r * n_cols + c for r in range(n_rows) for c in range(n_cols) if desc[r][c] == "G")
    dist[goal] = 0
    frontier = [goal]
    while frontier:
        nxt = []
        for cell in frontier:
            r, c = divmod(cell, n_cols)
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                k = rr * n_cols + cc
                if 0 <= rr < n_rows and 0 <= cc < n_cols and desc[rr][cc] != "H" and dist[k] == far:
                    dist[k] = dist[cell] + 1
                    nxt.append(k)
        frontier = nxt
    return dist


def _n_states(lake: _GymFrozenLake) -> int:
    """The number of cells of `lake` (its observation space is a Discrete of them)."""
    return int(cast(Discrete, lake.observation_space).n)


def _lakes(descs: list, is_slippery: bool) -> list[_GymFrozenLake]:
    """Unwrapped Gymnasium lakes for `descs` (only their transition tables are used)."""
    return [_GymFrozenLake(desc=_rows(d), is_slippery=is_slippery) for d in descs]


_check = functools.partial(check_arg, "frozen_lake")


class FrozenLakeEnv:
    """Gymnasium's FrozenLake with a text board as observation and a text reply as action."""

    def __init__(
        self,
        size: int = 4,
        map_name: str | None = "4x4",
        frozen_prob: float = 0.8,
        is_slippery: bool = False,
        max_steps: int = 8,
        success_reward: float = 1.0,
        step_reward: float = 0.0,
        hole_reward: float = 0.0,
        format_penalty: float = -0.1,
        progress_reward: float = 0.5,
        show_position: bool = True,
        show_neighbours: bool = False,
    ) -> None:
        # Bounds keep generate_random_map quick: it retries until a map is solvable.
        _check(is_int(size) and 2 <= size <= 16, "size", size, "an int from 2 to 16")
        _check(map_name is None or map_name in MAPS, "map_name", map_name, '"4x4", "8x8" or None')
        _check(is_number(frozen_prob) and 0.5 <= frozen_prob <= 1.0,
               "frozen_prob", frozen_prob, "a number from 0.5 to 1.0")
        _check(isinstance(is_slippery, bool), "is_slippery", is_slippery, "True or False")
        _check(is_count(max_steps, 1, STEPS_MAX), "max_steps", max_steps, f"an int from 1 to {STEPS_MAX}")
        rewards = dict(success_reward=success_reward, step_reward=step_reward,
                       hole_reward=hole_reward, format_penalty=format_penalty,
                       progress_reward=progress_reward)
        for name, value in rewards.items():
            _check(is_reward(value), name, value, f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        self.size, self.map_name, self.frozen_prob = size, map_name, float(frozen_prob)
        self.is_slippery, self.max_steps = is_slippery, max_steps
        self.success_reward, self.step_reward = float(success_reward), float(step_reward)
        self.hole_reward, self.format_penalty = float(hole_reward), float(format_penalty)
        self.progress_reward = float(progress_reward)
        _check(isinstance(show_position, bool), "show_position", show_position, "True or False")
        self.show_position = show_position
        _check(isinstance(show_neighbours, bool), "show_neighbours", show_neighbours, "True or False")
        self.show_neighbours = show_neighbours
        self._dist: np.ndarray | None = None
        self.instructions = (
            "FrozenLake. Move P to G, avoid holes O. Answer with one move: Left, Down, Right "
            "or Up, as <answer>Move</answer>.\nSymbols: P you, _ ice, O hole, G goal."
            + ("\nThe ice is slippery: you may slide sideways." if is_slippery else "")
            + ("\n# is off the board." if show_neighbours else "")
        )
        self._rng = random.Random()
        self._gym: gym.Env | None = None
        self._fixed_optimal: float | None = None
        if map_name is not None:
            self._gym = self._make(MAPS[map_name])
            self._fixed_optimal = self._optimal()
        self._pos = 0
        self._steps = 0
        self._done = True

    def _make(self, desc: list[str]) -> gym.Env:
        """A Gymnasium FrozenLake on `desc` with our step limit."""
        return gym.make(
            "FrozenLake-v1", desc=desc, is_slippery=self.is_slippery,
            max_episode_steps=self.max_steps,
        )

    def _optimal(self) -> float:
        lake = self._lake
        return optimal_success(lake.P, _n_states(lake), self.max_steps)

    @property
    def _env(self) -> gym.Env:
        """The Gymnasium env of the current map (set by reset, or at init for a fixed map)."""
        if self._gym is None:
            raise EnvError("frozen_lake: call reset() before reading the map")
        return self._gym

    @property
    def _lake(self) -> _GymFrozenLake:
        """The unwrapped Gymnasium lake of the current map (its P, desc, nrow and ncol)."""
        # gym.make("FrozenLake-v1") wraps Gymnasium's FrozenLakeEnv; its stubs type unwrapped as Env.
        return cast(_GymFrozenLake, self._env.unwrapped)

    @property
    def desc(self) -> list[str]:
        """The current map as letter rows (S start, F ice, H hole, G goal)."""
        return _rows(self._lake.desc)

    @property
    def position(self) -> int:
        """The player's cell index, row * side + column."""
        return self._pos

    def _cell(self) -> str:
        """The letter of the cell the player stands on."""
        lake = self._lake
        side = lake.ncol
        # Gymnasium keeps desc as a bytes array (np.asarray(desc, dtype="c")), typed as its list argument.
        desc = cast(np.ndarray, lake.desc)
        return desc[self._pos // side, self._pos % side].decode()

    def _board(self) -> str:
        lake = self._lake
        lines = [render_board(lake.desc, self._pos)]
        row, col = divmod(self._pos, lake.ncol)
        if self.show_position:
            lines.append(f"P: row {row + 1}, column {col + 1}.")
        if self.show_neighbours:
            lines.append(neighbour_line(self.desc, row, col))
        return "\n".join(lines)

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode (a fresh random map per seed when map_name is None)."""
        if self.map_name is None:
            if seed is None:
                seed = self._rng.randrange(2**31)  # drawn so one number replays map and slips
            if self._gym is not None:
                self._gym.close()
            self._gym = self._make(generate_random_map(size=self.size, p=self.frozen_prob, seed=seed))
        self._pos, _ = self._env.reset(seed=seed)
        self._dist = goal_distances(self.desc)
        self._steps = 0
        self._done = False
        optimal = self._fixed_optimal if self._fixed_optimal is not None else self._optimal()
        return self._board(), {"optimal_success": optimal, "map": "/".join(self.desc)}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's reply; an unparseable one is a penalised no-op step."""
        if self._done:
            raise EnvError("frozen_lake: step() called on a finished episode; call reset() first")
        move = parse_action(action)
        self._steps += 1
        terminated = truncated = False
        if move is None:
            reward = self.format_penalty
        else:
            before = self._potential(self._pos)
            self._pos, _, terminated, truncated, _ = self._env.step(move)
            cell = self._cell()
            reward = {"G": self.success_reward, "H": self.hole_reward}.get(cell, self.step_reward)
            if cell != "H":  # a hole ends the episode and keeps the progress made (see Rewards)
                reward += self.progress_reward * (self._potential(self._pos) - before)
        # Gymnasium's TimeLimit only sees valid moves; invalid replies use up steps too. Unlike
        # TimeLimit, a step that terminates is never also truncated (the outcome is final).
        truncated = not terminated and bool(truncated or self._steps >= self.max_steps)
        info: dict[str, Any] = {
            "action_valid": move is not None,
            "action": None if move is None else ACTION_NAMES[move],
        }
        if terminated or truncated:
            self._done = True
            info["success"] = bool(terminated) and self._cell() == "G"
        return self._board(), float(reward), bool(terminated), truncated, info

    def _potential(self, pos: int) -> float:
        dist = self._dist
        assert dist is not None  # set by reset(); step(), the only caller, refuses to run before it
        start = dist[0]
        return -float(dist[pos]) / start if start > 0 else 0.0

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The best map-blind policy (one action sequence for every map) on the evaluated maps."""
        maps = [t.reset_info["map"].split("/") for t in trajectories if "map" in t.reset_info]
        if not maps or len({len(m) for m in maps}) != 1:
            return {}
        # The search grows with the horizon; past 10 moves it is too slow to run at every eval.
        return {"map_blind": best_blind_success(maps, min(self.max_steps, 10), self.is_slippery)[0]}

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a uniformly random move that keeps the rules: on firm ice one
        that stays on the board, on slippery ice one that cannot slide into a hole.

        On firm ice a move into the edge is a no-op; leaving it out of demonstrations makes the
        warm-started policy read its position (the rules of the board, not the way to the goal).
        On slippery ice a move goes its way or to either side, so the rule is a move none of whose
        three outcomes is a hole (where every move risks one, those that risk the fewest). It
        knows the ice, not the goal: drawn uniformly, it reaches the goal 0.111 of the time in 20
        steps on the 4x4 map (a uniform move 0.012), and picking among its moves still ranges from
        0 (Up on the start row forever) to 0.197 (the optimum is 0.199): that choice is left to RL.
        Before reset, any of the four moves.
        """
        return f"<answer>{rng.choice(self.valid_moves())}</answer>"

    def valid_moves(self) -> list[str]:
        """The moves that keep the rules, which demonstrations draw from (see sample_action); all four before reset."""
        if self._gym is None or self._done:
            return list(ACTION_NAMES)
        if self.is_slippery:  # Gymnasium's transition table: (probability, next cell, reward, done)
            cells = "".join(self.desc)
            risk = [sum(p for p, nxt, _, _ in outcomes if cells[nxt] == "H")
                    for outcomes in self._lake.P[self._pos].values()]
            return [name for name, r in zip(ACTION_NAMES, risk) if r <= min(risk) + 1e-9]
        side, rows = self._lake.ncol, self._lake.nrow
        row, col = divmod(self._pos, side)
        targets = ((row, col - 1), (row + 1, col), (row, col + 1), (row - 1, col))  # L, D, R, U
        return [name for name, (r, c) in zip(ACTION_NAMES, targets) if 0 <= r < rows and 0 <= c < side]

    def close(self) -> None:
        """Close the underlying Gymnasium env."""
        if self._gym is not None:
            self._gym.close()
            self._gym = None
        self._done = True


register_env("frozen_lake", FrozenLakeEnv)
