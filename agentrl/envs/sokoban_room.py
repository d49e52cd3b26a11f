"""Sokoban rooms: the state, the push rule, a generator of solvable rooms and an optimal solver.

A room is a grid whose outer ring is wall. Cells are numbered `row * cols + col`, so a move is
adding one of `STEP[...]` (-1, +cols, +1, -cols for Left, Down, Right, Up) and never leaves the
grid: every move from an inner cell stays inside the ring.

Generation follows the approach of gym-sokoban (Schrader 2018, after Taylor & Parberry 2011)
and RAGEN, in our own code: (1) floor is carved by a random walk inside the ring; (2) targets
and the player are placed on floor, with every box on its target (a solved room); (3) the player
walks backwards from there at random, pulling a box whenever it steps away from one (a pull is a
push played backwards). Every state of that walk can be solved by replaying the walk forwards,
so a room taken from it is solvable in at most as many moves as the walk took to reach it. Of
the states reached within `max_moves` moves (the bound the env asks for, so rooms are solvable
within the episode's steps), the one whose boxes stand farthest from the targets is kept
(gym-sokoban's criterion; later states win ties), and the player is then moved to a random cell
it can walk to without pushing (it could walk back, so the room stays solvable; if that makes the
plan longer than `max_moves` it stays where the walk left it). The solver gives the exact optimum.

The solver is a breadth-first search over (player, boxes) states in moves, which also keeps the
fewest pushes among the shortest plans. A push onto a dead cell (a non-target cell from which
no sequence of pushes can bring a box to any target, even alone in the room) is pruned.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from agentrl.errors import EnvError

STEP_NAMES = ("Left", "Down", "Right", "Up")  # the order of agentrl.envs.parsing.DIRECTIONS


@dataclass(frozen=True)
class Room:
    """A Sokoban state: walls and targets are fixed, boxes and player move."""

    rows: int
    cols: int
    walls: frozenset[int]
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int

    def steps(self) -> tuple[int, int, int, int]:
        """Index offsets of Left, Down, Right, Up."""
        return (-1, self.cols, 1, -self.cols)

    def move(self, direction: int) -> tuple[Room, bool]:
        """The room after the player tries `direction` (index into STEP_NAMES) and whether a
        box was pushed; a move into a wall or an unpushable box leaves the room as it is."""
        d = self.steps()[direction]
        nxt = self.player + d
        if nxt in self.walls:
            return self, False
        if nxt in self.boxes:
            beyond = nxt + d
            if beyond in self.walls or beyond in self.boxes:
                return self, False
            boxes = (self.boxes - {nxt}) | {beyond}
            return Room(self.rows, self.cols, self.walls, self.targets, boxes, nxt), True
        return Room(self.rows, self.cols, self.walls, self.targets, self.boxes, nxt), False

    @property
    def on_target(self) -> int:
        """Boxes standing on a target."""
        return len(self.boxes & self.targets)

    @property
    def solved(self) -> bool:
        """Every box is on a target."""
        return self.boxes == self.targets


@dataclass(frozen=True)
class Solution:
    """An optimal plan: fewest moves, and the fewest pushes among plans of that length."""

    moves: int
    pushes: int
    plan: tuple[int, ...]  # directions, indices into STEP_NAMES


# ---------------------------------------------------------------------------- solver
def live_cells(room: Room) -> frozenset[int]:
    """Cells from which a box alone in the room can be pushed onto some target.

    Found backwards from the targets: a box at b can have come from b + d when the pusher had
    room to stand behind it, i.e. when b + d and b + 2d are both floor.
    """
    live = set(room.targets)
    frontier = list(room.targets)
    while frontier:
        b = frontier.pop()
        for d in room.steps():
            src, stand = b + d, b + 2 * d
            if src not in live and src not in room.walls and stand not in room.walls \
                    and 0 <= stand < room.rows * room.cols:
                live.add(src)
                frontier.append(src)
    return frozenset(live)


def solve(room: Room, max_moves: int | None = None, max_states: int = 2_000_000) -> Solution | None:
    """The optimal plan for `room`, or None when none has at most `max_moves` moves.

    Raises EnvError when the search would visit more than `max_states` states (rooms too big
    or with too many boxes for an exhaustive search).
    """
    if room.solved:
        return Solution(0, 0, ())
    live = live_cells(room)
    steps = room.steps()
    start = (room.player, room.boxes)
    # parent[state] = (previous state, direction, pushes so far); BFS layers keep moves minimal,
    # and within a layer the parent with the fewest pushes wins.
    parent: dict[tuple, tuple] = {start: (None, -1, 0)}
    layer = [start]
    depth = 0
    while layer and (max_moves is None or depth < max_moves):
        depth += 1
        nxt_layer: dict[tuple, tuple] = {}
        for state in layer:
            player, boxes = state
            pushes = parent[state][2]
            for direction, d in enumerate(steps):
                to = player + d
                if to in room.walls:
                    continue
                pushed = to in boxes
                if pushed:
                    beyond = to + d
                    if beyond in room.walls or beyond in boxes or beyond not in live:
                        continue
                    new = (to, (boxes - {to}) | {beyond})
                else:
                    new = (to, boxes)
                if new in parent:
                    continue
                cost = pushes + pushed
                if new not in nxt_layer or cost < nxt_layer[new][2]:
                    nxt_layer[new] = (state, direction, cost)
        parent.update(nxt_layer)
        if len(parent) > max_states:
            raise EnvError(f"sokoban: solving a {room.rows}x{room.cols} room with {len(room.boxes)} "
                           f"boxes visited over {max_states} states; use a smaller room or fewer boxes")
        for state, (_, _, cost) in nxt_layer.items():
            if state[1] == room.targets:
                return Solution(depth, cost, _plan(parent, state))
        layer = list(nxt_layer)
    return None


def _plan(parent: dict, state: tuple) -> tuple[int, ...]:
    """The directions that lead from the start to `state`."""
    plan = []
    while parent[state][0] is not None:
        state, direction, _ = parent[state]
        plan.append(direction)
    return tuple(reversed(plan))


# ---------------------------------------------------------------------------- generator
def carve_floor(rows: int, cols: int, walk_steps: int, p_change_direction: float,
                rng: random.Random) -> frozenset[int]:
    """Floor cells carved by a random walk inside the outer wall ring.

    The walker carves the cell it stands on and, half the time, one neighbour (so that rooms get
    open areas, not only corridors); it keeps its direction with probability
    1 - `p_change_direction` and stays inside the ring.
    """
    r, c = rng.randrange(1, rows - 1), rng.randrange(1, cols - 1)
    dr, dc = rng.choice(((0, -1), (1, 0), (0, 1), (-1, 0)))
    floor = {r * cols + c}
    for _ in range(walk_steps):
        if rng.random() < p_change_direction:
            dr, dc = rng.choice(((0, -1), (1, 0), (0, 1), (-1, 0)))
        r = min(max(r + dr, 1), rows - 2)
        c = min(max(c + dc, 1), cols - 2)
        floor.add(r * cols + c)
        if rng.random() < 0.5:
            nr, nc = rng.choice(((r, c - 1), (r + 1, c), (r, c + 1), (r - 1, c)))
            if 1 <= nr <= rows - 2 and 1 <= nc <= cols - 2:
                floor.add(nr * cols + nc)
    return frozenset(floor)


def pull_walk(solved: Room, walk_steps: int, max_moves: int, rng: random.Random) -> Room | None:
    """Walk the player backwards from a solved room, pulling boxes; return the reached state,
    within `max_moves` moves, whose boxes lie farthest from the targets (None if all are home)."""
    room, moves = solved, 0
    best, best_score = None, 0
    for _ in range(walk_steps):
        if moves >= max_moves:
            break
        d = room.steps()[rng.randrange(4)]
        to = room.player + d
        if to in room.walls or to in room.boxes:
            continue  # no move: the walk does not count it
        behind = room.player - d
        boxes = room.boxes
        if behind in boxes:  # stepping away from a box pulls it along
            boxes = (boxes - {behind}) | {room.player}
        room = Room(room.rows, room.cols, room.walls, room.targets, boxes, to)
        moves += 1
        score = _displacement(room)
        if score >= best_score and score > 0:
            best, best_score = room, score
    return best


def reachable(room: Room) -> frozenset[int]:
    """Cells the player can walk to without pushing a box."""
    seen = {room.player}
    frontier = [room.player]
    while frontier:
        cell = frontier.pop()
        for d in room.steps():
            to = cell + d
            if to not in seen and to not in room.walls and to not in room.boxes:
                seen.add(to)
                frontier.append(to)
    return frozenset(seen)


def _displacement(room: Room) -> int:
    """Sum over boxes of the Manhattan distance to the nearest target."""
    total = 0
    for b in room.boxes:
        br, bc = divmod(b, room.cols)
        total += min(abs(br - t // room.cols) + abs(bc - t % room.cols) for t in room.targets)
    return total


def generate_room(rows: int, cols: int, num_boxes: int, rng: random.Random, *, max_moves: int,
                  min_moves: int = 1, walk_steps: int | None = None, p_change_direction: float = 0.35,
                  search_depth: int = 100, max_tries: int = 200) -> tuple[Room, Solution]:
    """A room whose optimal solution has between `min_moves` and `max_moves` moves, and that plan.

    `walk_steps` (default 1.7 * (rows + cols), gym-sokoban's) carves the floor; `search_depth`
    bounds the backward walk. Raises EnvError when `max_tries` rooms all miss the bounds.
    """
    walk_steps = walk_steps if walk_steps is not None else int(1.7 * (rows + cols))
    ring = frozenset(i for i in range(rows * cols)
                     if i < cols or i >= (rows - 1) * cols or i % cols in (0, cols - 1))
    for _ in range(max_tries):
        floor = carve_floor(rows, cols, walk_steps, p_change_direction, rng)
        if len(floor) < num_boxes + 1:
            continue
        cells = sorted(floor)
        targets = frozenset(rng.sample(cells, num_boxes))
        player = rng.choice([c for c in cells if c not in targets])
        walls = frozenset(range(rows * cols)) - floor | ring
        solved = Room(rows, cols, walls, targets, targets, player)
        pulled = pull_walk(solved, search_depth, max_moves, rng)
        if pulled is None:
            continue
        # The walk leaves the player next to a box it just pulled; moving it to any cell it can
        # walk to keeps the room solvable (it can walk back) and varies the start.
        room = replace(pulled, player=rng.choice(sorted(reachable(pulled))))
        solution = solve(room, max_moves=max_moves)
        if solution is None:  # the detour made the plan too long: keep the walk's own state
            room, solution = pulled, solve(pulled, max_moves=max_moves)
        assert solution is not None, "a room reached by pulls is solvable within the walk's moves"
        if solution.moves >= min_moves:
            return room, solution
    raise EnvError(f"sokoban: no {rows}x{cols} room with {num_boxes} boxes and an optimal solution of "
                   f"{min_moves} to {max_moves} moves in {max_tries} tries; raise max_steps or "
                   f"max_solution_moves, lower min_solution_moves, or raise search_depth")
