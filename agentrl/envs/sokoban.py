"""Sokoban as a text game: push every box onto a target.

## Description
The player walks a walled room and pushes boxes (never pulls them) onto the targets; a box moves
only when the cell behind it is free. Each reset generates a fresh room from the seed
(`agentrl.envs.sokoban_room`: floor carved by a random walk, then boxes pulled backwards from a
solved room, the gym-sokoban / RAGEN approach), so every room is solvable; the same seed gives
the same room. Rooms are kept only when their optimal solution, found by breadth-first search,
fits within `min(max_steps, max_solution_moves)` moves and has at least `min_solution_moves`.

## Action format
The model answers in words, read by `agentrl.envs.parsing.parse_direction`: the content of the
last `<answer>...</answer>` (or of an unclosed `<answer>` tail, or else the whole reply), case
insensitive, one of Left, Down, Right, Up, an arrow (← ↓ → ↑), or a lone letter L/D/R/U. A reply
naming two different directions, or none, is invalid: the room stays as it is, the step is used
up and costs `format_penalty` on top of `step_reward`.

## Observation format
The room, one line per row, cells separated by single spaces (RAGEN's symbols):
`#` wall, `_` floor, `O` target, `X` box, `√` box on a target, `P` player, `S` player on a
target. With `show_position` (the default) a last line names the player, the boxes and the
targets by row and column (1-based), e.g. `P: row 3, column 2. X: row 3, column 3. O: row 4,
column 3.`: a tiny model reads a fixed-position line far more easily than a grid (measured on
FrozenLake, see its docstring). With `show_neighbours` a further line gives the four cells next
to the player, e.g. `Next to P: Left #, Down _, Right X, Up #.` (see Arguments for why). With
`show_offsets` a further line gives each box and target relative to the player in moves, e.g.
`From P: X Right 1; O Down 1, Right 1.` (`X here` would be impossible; `O here`: P stands on it).

## Starting state
The generated room: boxes off their targets, the player on a random cell it can walk to; or
the room given as `reset(options={"room": text})` in the symbols above (rows by newline or `/`).
`reset`'s info carries `optimal_success` (1.0: every room is solvable within `max_steps`),
`optimal_moves`, `optimal_pushes` (the fewest pushes among the shortest plans) and `map` (the
room's rows as text, joined by `/`; the agent keeps it in the trajectory for `eval_baselines`).

## Rewards
gym-sokoban's scheme, each part configurable: `step_reward` (-0.1) on every step, including a
bump into a wall and an invalid reply; `box_on_target_reward` (+1) for each box pushed onto a
target and `box_off_target_reward` (-1) for each pushed off one; `success_reward` (+10) when
every box is on a target; `format_penalty` (-0.1) added for a reply that names no move.
Optionally `progress_reward` shapes each move by the change of the potential
-min(d(s) / d(start), 1), where d is the optimal number of moves left (Ng et al. 1999): the
shaping of an episode sums to `progress_reward` times the fraction of the way covered, and a
room that can no longer be solved has potential -1, so pushing a box into a dead end takes back
the progress made. It needs a search per new state, so it suits small rooms; 0 (the default)
keeps gym-sokoban's rewards.

## Episode end
Termination: every box is on a target. Truncation: `max_steps` steps (invalid replies included)
without termination (a step is never both). The last step's info carries `success` and
`metrics`: `boxes_on_target`, `steps`, `pushes`, `optimal_moves`, `optimal_pushes` and, when
solved, `steps_over_optimal` (steps / optimal moves, 1.0 is a shortest solution). Stepping after
the end is an EnvError.

## Reference
`optimal_success` in `reset`'s info (above), and `eval_baselines`' `baseline_room_blind`: the
best single move sequence (up to 6 moves) for all evaluated rooms at once.

## Arguments
`dim_room` ([rows, cols] including the wall ring), `num_boxes`, `max_steps`,
`max_solution_moves` and `min_solution_moves` (bounds on the optimal solution of generated
rooms), `num_gen_steps` (floor-carving walk length, default 1.7 * (rows + cols)),
`p_change_directions` (chance the carving walk turns), `search_depth` (length of the backward
walk that places the boxes), the rewards above, `show_position`, `show_neighbours` and `show_offsets` (off by
default, which keeps the observation RAGEN's grid plus the position line). Why the neighbour
line exists, measured on 6x6 rooms: warm-started on demonstrations of state-changing moves, the
tiny default model's reply loss stayed at a uniform choice among all four moves (0.35 nats per
reply token against a floor of 0.15) for 240 steps with the grid and position line alone, i.e.
it did not find the walls around P; with the neighbour line it began to drop (0.31 at step 400).
"""

from __future__ import annotations

import functools
import random
from typing import Any

from agentrl.envs.args import REWARD_MAX, STEPS_MAX, check_arg, is_count, is_int, is_number, is_reward
from agentrl.envs.parsing import DIRECTIONS, parse_direction
from agentrl.envs.sokoban_room import Room, Solution, generate_room, solve
from agentrl.errors import EnvError
from agentrl.registry import register_env

SYMBOLS = {"wall": "#", "floor": "_", "target": "O", "box": "X", "box_on_target": "√",
           "player": "P", "player_on_target": "S"}
_SOLVE_STATES = 200_000  # per-step search budget of progress shaping


def render_room(room: Room) -> str:
    """The room as text rows of RAGEN's symbols, cells separated by spaces."""
    return "\n".join(" ".join(_symbol(room, r * room.cols + c) for c in range(room.cols))
                     for r in range(room.rows))


def parse_room(text: str) -> Room:
    """The Room drawn by `text` in render_room's symbols (rows by newline or `/`, spaces optional)."""
    rows = [line.replace(" ", "") for line in text.replace("/", "\n").strip().splitlines()]
    by_symbol = {v: k for k, v in SYMBOLS.items()}
    cols = len(rows[0]) if rows else 0
    if len(rows) < 3 or cols < 3 or any(len(r) != cols for r in rows):
        raise EnvError(f"sokoban: a room must be a rectangle of at least 3x3 cells, got {text!r}")
    walls, targets, boxes, players = set(), set(), set(), []
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            kind, i = by_symbol.get(ch), r * cols + c
            if kind is None:
                raise EnvError(f"sokoban: unknown symbol {ch!r} in room; known: {' '.join(SYMBOLS.values())}")
            edge = r in (0, len(rows) - 1) or c in (0, cols - 1)
            if edge and kind != "wall":
                raise EnvError(f"sokoban: the outer ring of a room must be wall '#', got {ch!r} at row {r + 1}, "
                               f"column {c + 1}")
            walls.update([i] if kind == "wall" else [])
            targets.update([i] if kind in ("target", "box_on_target", "player_on_target") else [])
            boxes.update([i] if kind in ("box", "box_on_target") else [])
            players.extend([i] if kind in ("player", "player_on_target") else [])
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise EnvError(f"sokoban: a room needs one player and as many boxes as targets (at least one), got "
                       f"{len(players)} players, {len(boxes)} boxes, {len(targets)} targets")
    return Room(len(rows), cols, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


def position_line(room: Room) -> str:
    """The player, boxes and targets by 1-based row and column, in reading order."""
    def where(cells) -> str:
        return "; ".join(f"row {i // room.cols + 1}, column {i % room.cols + 1}" for i in sorted(cells))

    return f"P: {where([room.player])}. X: {where(room.boxes)}. O: {where(room.targets)}."


def neighbour_line(room: Room) -> str:
    """The symbols of the four cells next to the player, e.g. `Next to P: Left #, Down _, ...`."""
    cells = [f"{name} {_symbol(room, room.player + d)}" for name, d in zip(DIRECTIONS, room.steps())]
    return f"Next to P: {', '.join(cells)}."


def offset_line(room: Room) -> str:
    """Each box and target relative to the player in moves, e.g. `From P: X Right 1; O Down 1, Right 1.`"""
    def offset(cell: int) -> str:
        dr = cell // room.cols - room.player // room.cols
        dc = cell % room.cols - room.player % room.cols
        parts = [f"{'Down' if dr > 0 else 'Up'} {abs(dr)}"] if dr else []
        parts += [f"{'Right' if dc > 0 else 'Left'} {abs(dc)}"] if dc else []
        return ", ".join(parts) or "here"

    cells = [f"X {offset(c)}" for c in sorted(room.boxes)] + [f"O {offset(c)}" for c in sorted(room.targets)]
    return f"From P: {'; '.join(cells)}."


def _symbol(room: Room, i: int) -> str:
    """The symbol drawn at cell `i`."""
    on_target = i in room.targets
    if i in room.walls:
        return SYMBOLS["wall"]
    if i == room.player:
        return SYMBOLS["player_on_target" if on_target else "player"]
    if i in room.boxes:
        return SYMBOLS["box_on_target" if on_target else "box"]
    return SYMBOLS["target" if on_target else "floor"]


def best_blind_success(rooms: list[Room], horizon: int) -> float:
    """The highest fraction of `rooms` that one fixed sequence of `horizon` moves solves."""
    def best(states: list[Room], depth: int) -> int:
        if depth == 0 or not states:
            return 0
        scores = []
        for d in range(len(DIRECTIONS)):
            moved = [room.move(d)[0] for room in states]
            left = [room for room in moved if not room.solved]
            scores.append(len(moved) - len(left) + best(left, depth - 1))
        return max(scores)

    return best(list(rooms), horizon) / len(rooms) if rooms else 0.0


_check = functools.partial(check_arg, "sokoban")


class SokobanEnv:
    """Generated Sokoban rooms with a text room as observation and a text reply as action."""

    def __init__(
        self,
        dim_room: list[int] | tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        max_solution_moves: int | None = None,
        min_solution_moves: int = 1,
        num_gen_steps: int | None = None,
        p_change_directions: float = 0.35,
        search_depth: int = 100,
        step_reward: float = -0.1,
        box_on_target_reward: float = 1.0,
        box_off_target_reward: float = -1.0,
        success_reward: float = 10.0,
        format_penalty: float = -0.1,
        progress_reward: float = 0.0,
        show_position: bool = True,
        show_neighbours: bool = False,
        show_offsets: bool = False,
        show_grid: bool = True,
    ) -> None:
        ok = (isinstance(dim_room, (list, tuple)) and len(dim_room) == 2
              and all(is_int(n) and 4 <= n <= 16 for n in dim_room))
        _check(ok, "dim_room", dim_room, "[rows, cols], two ints from 4 to 16 (the wall ring included)")
        rows, cols = dim_room
        _check(is_int(num_boxes) and 1 <= num_boxes <= 4, "num_boxes", num_boxes, "an int from 1 to 4")
        _check(is_count(max_steps, 1, STEPS_MAX), "max_steps", max_steps, f"an int from 1 to {STEPS_MAX}")
        _check(max_solution_moves is None or is_count(max_solution_moves, 1, STEPS_MAX),
               "max_solution_moves", max_solution_moves, f"null or an int from 1 to {STEPS_MAX}")
        self.max_moves = min(max_steps, max_solution_moves or max_steps)
        _check(is_int(min_solution_moves) and 1 <= min_solution_moves <= self.max_moves,
               "min_solution_moves", min_solution_moves,
               f"an int from 1 to min(max_steps, max_solution_moves) = {self.max_moves}")
        _check(num_gen_steps is None or is_count(num_gen_steps, 1, STEPS_MAX),
               "num_gen_steps", num_gen_steps, f"null or an int from 1 to {STEPS_MAX}")
        _check(is_number(p_change_directions) and 0.0 <= p_change_directions <= 1.0,
               "p_change_directions", p_change_directions, "a number from 0 to 1")
        _check(is_count(search_depth, 1, STEPS_MAX), "search_depth", search_depth, f"an int from 1 to {STEPS_MAX}")
        rewards = dict(step_reward=step_reward, box_on_target_reward=box_on_target_reward,
                       box_off_target_reward=box_off_target_reward, success_reward=success_reward,
                       format_penalty=format_penalty, progress_reward=progress_reward)
        for name, value in rewards.items():
            _check(is_reward(value), name, value, f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        _check(isinstance(show_position, bool), "show_position", show_position, "True or False")
        _check(isinstance(show_neighbours, bool), "show_neighbours", show_neighbours, "True or False")
        _check(isinstance(show_offsets, bool), "show_offsets", show_offsets, "True or False")
        _check(isinstance(show_grid, bool), "show_grid", show_grid, "True or False")
        _check(show_grid or show_position or show_neighbours or show_offsets, "show_grid", show_grid,
               "True unless another show_* line is on (the observation would be empty)")
        self.rows, self.cols, self.num_boxes, self.max_steps = rows, cols, num_boxes, max_steps
        self.min_moves = min_solution_moves
        self.num_gen_steps, self.p_change_directions = num_gen_steps, float(p_change_directions)
        self.search_depth = search_depth
        self.step_reward, self.success_reward = float(step_reward), float(success_reward)
        self.box_on_target_reward = float(box_on_target_reward)
        self.box_off_target_reward = float(box_off_target_reward)
        self.format_penalty, self.progress_reward = float(format_penalty), float(progress_reward)
        self.show_position, self.show_neighbours = show_position, show_neighbours
        self.show_offsets, self.show_grid = show_offsets, show_grid
        self.instructions = (
            "Sokoban. Push every box X onto a target O. You push boxes, never pull them. Answer with "
            "one move: Left, Down, Right or Up, as <answer>Move</answer>.\nSymbols: # wall, _ floor, "
            "O target, X box, √ box on target, P you, S you on a target."
        )
        self._rng = random.Random()
        self._room: Room | None = None
        self._solution: Solution | None = None
        self._steps = self._pushes = 0
        self._potentials: dict[tuple, float] = {}
        self._done = True

    @property
    def room(self) -> Room:
        """The current room state."""
        if self._room is None:
            raise EnvError("sokoban: call reset() before reading the room")
        return self._room

    def _observation(self) -> str:
        room = self.room
        lines = [render_room(room)] if self.show_grid else []
        lines += [position_line(room)] if self.show_position else []
        lines += [neighbour_line(room)] if self.show_neighbours else []
        lines += [offset_line(room)] if self.show_offsets else []
        return "\n".join(lines)

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Generate the room of `seed` (a fresh random one when None) and start an episode.

        `options={"room": text}` plays the given room instead (render_room's symbols); its
        optimum is searched within `max_steps` moves, and `optimal_success` is 0.0 without one.
        """
        if options and "room" in options:
            room = parse_room(options["room"])
            solution = solve(room, max_moves=self.max_steps)
        else:
            if seed is None:
                seed = self._rng.randrange(2**31)
            room, solution = generate_room(
                self.rows, self.cols, self.num_boxes, random.Random(seed), max_moves=self.max_moves,
                min_moves=self.min_moves, walk_steps=self.num_gen_steps,
                p_change_direction=self.p_change_directions, search_depth=self.search_depth)
        self._room, self._solution = room, solution
        self._potentials = {}
        self._steps = self._pushes = 0
        self._done = False
        info: dict[str, Any] = {"optimal_success": float(solution is not None),
                                "map": render_room(room).replace("\n", "/")}
        if solution is not None:
            info.update(optimal_moves=solution.moves, optimal_pushes=solution.pushes)
        return self._observation(), info

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's reply; an unparseable one is a penalised step that changes nothing."""
        if self._done:
            raise EnvError("sokoban: step() called on a finished episode; call reset() first")
        direction = parse_direction(action)
        self._steps += 1
        reward = self.step_reward
        before = after = self.room
        pushed = False
        if direction is None:
            reward += self.format_penalty
        else:
            after, pushed = before.move(direction)
            self._room = after
            self._pushes += pushed
            gained = after.on_target - before.on_target
            reward += gained * (self.box_on_target_reward if gained > 0 else -self.box_off_target_reward)
            if self.progress_reward and after is not before:
                reward += self._shaping(before, after)
        terminated = after.solved
        if terminated:
            reward += self.success_reward
        truncated = not terminated and self._steps >= self.max_steps
        info: dict[str, Any] = {"action_valid": direction is not None,
                                "action": None if direction is None else DIRECTIONS[direction],
                                "pushed": pushed}
        if terminated or truncated:
            self._done = True
            info["success"] = terminated
            info["metrics"] = self._metrics(terminated)
        return self._observation(), float(reward), terminated, truncated, info

    def _shaping(self, before: Room, after: Room) -> float:
        """progress_reward times the change of potential; 0 when a room is too big to search."""
        try:
            return self.progress_reward * (self._potential(after) - self._potential(before))
        except EnvError:  # over the search budget: no shaping rather than a crashed episode
            return 0.0

    def _potential(self, room: Room) -> float:
        """-min(d(room) / d(start), 1), d the optimal moves left: 0 when solved, -1 at the start,
        farther away, and in rooms that can no longer be solved."""
        start = self._solution.moves if self._solution is not None else 0
        if start == 0:
            return 0.0  # no known plan from the start: nothing to measure progress against
        key = (room.player, room.boxes)
        if key not in self._potentials:
            solution = solve(room, max_moves=start, max_states=_SOLVE_STATES)
            self._potentials[key] = -1.0 if solution is None else -solution.moves / start
        return self._potentials[key]

    def _metrics(self, solved: bool) -> dict[str, float]:
        metrics = {"boxes_on_target": float(self.room.on_target), "steps": float(self._steps),
                   "pushes": float(self._pushes)}
        if self._solution is not None:
            metrics.update(optimal_moves=float(self._solution.moves),
                           optimal_pushes=float(self._solution.pushes))
            if solved and self._solution.moves:
                metrics["steps_over_optimal"] = self._steps / self._solution.moves
        return metrics

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The best room-blind policy (one move sequence for every room) on the evaluated rooms.

        A policy that does not beat it has not learned to read the room. The search is exhaustive
        over 4**horizon sequences, so the horizon is capped at 6 moves.
        """
        rooms = [parse_room(t.reset_info["map"]) for t in trajectories if "map" in t.reset_info]
        if not rooms:
            return {}
        return {"room_blind": best_blind_success(rooms, min(self.max_steps, 6))}

    def valid_moves(self) -> list[str]:
        """Names of the moves that change the room (all four before reset or after the end)."""
        if self._room is None or self._done:
            return list(DIRECTIONS)
        moves = [name for d, name in enumerate(DIRECTIONS) if self._room.move(d)[0] is not self._room]
        return moves or list(DIRECTIONS)

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a uniformly random move among those that change the room.

        Bumping into a wall or an unpushable box is legal but does nothing; leaving it out of the
        warm-start demonstrations teaches the model to read the cells around P (the rules of the
        room), while the choice among real moves stays uniform: which move solves the room is
        left to RL. A player boxed in on all sides may use any of the four.
        """
        return f"<answer>{rng.choice(self.valid_moves())}</answer>"

    def close(self) -> None:
        """Nothing to release; the episode ends."""
        self._done = True


register_env("sokoban", SokobanEnv)
