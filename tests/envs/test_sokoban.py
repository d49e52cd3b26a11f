"""Sokoban: generated rooms are solvable and optimal plans replay, rendering, parsing, rewards, ends."""

from __future__ import annotations

import random
from collections import deque

import pytest

from agentrl.envs.parsing import parse_direction
from agentrl.envs.sokoban import (SYMBOLS, SokobanEnv, best_blind_success, parse_room, position_line,
                                  render_room)
from agentrl.envs.sokoban_room import STEP_NAMES, Room, generate_room, live_cells, reachable, solve
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import ENVS

# A corridor: the player pushes the box right twice onto the target.
CORRIDOR = "# # # # # #\n# P X _ O #\n# # # # # #"
# Two boxes: the right one already on its target.
TWO = "# # # # # # #\n# P X _ O √ #\n# _ _ _ _ _ #\n# # # # # # #"


def bfs_moves(room: Room, limit: int = 200_000) -> int | None:
    """Reference: plain BFS in moves over every (player, boxes) state, no pruning at all."""
    start = (room.player, room.boxes)
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (player, boxes), depth = queue.popleft()
        if boxes == room.targets:
            return depth
        for d in range(4):
            nxt, _ = Room(room.rows, room.cols, room.walls, room.targets, boxes, player).move(d)
            key = (nxt.player, nxt.boxes)
            if key not in seen:
                seen.add(key)
                queue.append((key, depth + 1))
        assert len(seen) < limit, "reference search too big for a test"
    return None


# --- generator and solver --------------------------------------------------------------------


@pytest.mark.parametrize("rows, cols, boxes, max_moves, seeds", [
    (5, 5, 1, 8, 400), (6, 6, 1, 100, 400), (6, 6, 2, 30, 60), (7, 8, 2, 40, 40), (8, 8, 3, 40, 25),
])
def test_generated_rooms_are_solvable_within_the_bound(rows, cols, boxes, max_moves, seeds):
    lengths = set()
    for seed in range(seeds):
        room, solution = generate_room(rows, cols, boxes, random.Random(seed), max_moves=max_moves)
        assert (room.rows, room.cols, len(room.boxes), len(room.targets)) == (rows, cols, boxes, boxes)
        ring = {i for i in range(rows * cols) if i < cols or i >= (rows - 1) * cols or i % cols in (0, cols - 1)}
        assert ring <= room.walls
        assert not (room.boxes | room.targets | {room.player}) & room.walls
        assert room.player not in room.boxes and not room.solved
        assert 1 <= solution.moves <= max_moves
        again = solve(room)  # the solver, unbounded, agrees with what the generator reported
        assert (again.moves, again.pushes) == (solution.moves, solution.pushes)
        lengths.add(solution.moves)
    assert len(lengths) >= 3  # not one fixed kind of room


@pytest.mark.parametrize("seed", range(40))
def test_solver_is_optimal_against_plain_bfs(seed):
    room, solution = generate_room(6, 6, 2 if seed % 2 else 1, random.Random(seed), max_moves=100)
    assert solution.moves == bfs_moves(room)  # dead-cell pruning loses no optimal plan


def test_solver_keeps_fewest_pushes_among_shortest_and_detects_unsolvable():
    # Box in a corner off target: no plan at all.
    stuck = parse_room("# # # # #\n# X _ _ #\n# _ P O #\n# # # # #")
    assert solve(stuck) is None and stuck.boxes - live_cells(stuck)
    corridor = parse_room(CORRIDOR)
    assert solve(corridor) == solve(corridor, max_moves=2)
    assert solve(corridor).plan == (2, 2) and solve(corridor).pushes == 2
    assert solve(corridor, max_moves=1) is None


def test_same_seed_same_room_and_seeds_differ():
    a = generate_room(6, 6, 1, random.Random(7), max_moves=100)
    b = generate_room(6, 6, 1, random.Random(7), max_moves=100)
    assert a == b
    rooms = {render_room(generate_room(6, 6, 1, random.Random(s), max_moves=100)[0]) for s in range(30)}
    assert len(rooms) >= 25


def test_generator_respects_min_moves_and_fails_clearly():
    for seed in range(20):
        _, solution = generate_room(6, 6, 1, random.Random(seed), max_moves=12, min_moves=5)
        assert 5 <= solution.moves <= 12
    with pytest.raises(EnvError, match="no 4x4 room"):
        generate_room(4, 4, 2, random.Random(0), max_moves=1, min_moves=1, max_tries=5)


@pytest.mark.parametrize("seed", range(25))
async def test_optimal_plan_replayed_as_text_solves_in_exactly_optimal_moves(seed):
    env = SokobanEnv(dim_room=[7, 7], num_boxes=1 + seed % 2, max_steps=60)
    _, info = await env.reset(seed=seed)
    plan = solve(env.room).plan
    assert len(plan) == info["optimal_moves"] and info["optimal_success"] == 1.0
    forms = ["<answer>{}</answer>", "{}", "I will go {} now", "<answer>{}"]
    for n, d in enumerate(plan):
        reply = forms[n % len(forms)].format(STEP_NAMES[d] if n % 3 else STEP_NAMES[d].lower())
        obs, reward, term, trunc, step_info = await env.step(reply)
        assert step_info["action_valid"] and not trunc
        assert term == (n == len(plan) - 1)
    assert step_info["success"] is True and reward >= 10.0 - 0.1
    m = step_info["metrics"]
    assert m["steps"] == info["optimal_moves"] and m["steps_over_optimal"] == 1.0
    assert m["pushes"] == info["optimal_pushes"] and m["boxes_on_target"] == len(env.room.boxes)
    assert "X" not in obs.split("\nP:")[0]  # every box is drawn on its target


# --- rendering and parsing -------------------------------------------------------------------


def test_render_and_parse_room_round_trip_with_every_symbol():
    text = "# # # # # #\n# S X _ X #\n# √ _ O _ #\n# # # # # #"
    room = parse_room(text)
    assert render_room(room) == text
    assert room.player == room.cols + 1 and room.player in room.targets
    assert parse_room(text.replace("\n", "/").replace(" ", "")) == room
    assert position_line(room) == ("P: row 2, column 2. X: row 2, column 3; row 2, column 5; row 3, column 2. "
                                   "O: row 2, column 2; row 3, column 2; row 3, column 4.")
    assert set(SYMBOLS.values()) == set("#_OX√PS")


@pytest.mark.parametrize("text, match", [
    ("# # #\n# P #", "rectangle"), ("# # # #\n# P X #\n# # #", "rectangle"),
    ("# # # #\n# P X O\n# # # #", "outer ring"), ("# # # # #\n# P X ? #\n# # # # #", "unknown symbol"),
    ("# # # # #\n# P X X #\n# O _ _ #\n# # # # #", "as many boxes as targets"),
    ("# # # # #\n# P P X #\n# O _ _ #\n# # # # #", "one player"),
])
def test_bad_rooms_are_clear_errors(text, match):
    with pytest.raises(EnvError, match=match):
        parse_room(text)


async def test_observation_and_info():
    env = SokobanEnv()
    obs, info = await env.reset(options={"room": CORRIDOR})
    assert obs == CORRIDOR + "\nP: row 2, column 2. X: row 2, column 3. O: row 2, column 5."
    assert info == {"optimal_success": 1.0, "optimal_moves": 2, "optimal_pushes": 2,
                    "map": CORRIDOR.replace("\n", "/")}
    assert all(s in env.instructions for s in ("<answer>", "Left", "# wall", "√", "S you on a target"))
    obs, _ = await SokobanEnv(show_position=False).reset(options={"room": CORRIDOR})
    assert obs == CORRIDOR
    env = SokobanEnv(show_position=False, show_neighbours=True)
    obs, _ = await env.reset(options={"room": TWO})
    assert obs.endswith("# # # # # # #\nNext to P: Left #, Down _, Right X, Up #.")
    obs, *_ = await env.step("Right")
    assert obs.endswith("Next to P: Left _, Down _, Right X, Up #.")


@pytest.mark.parametrize("reply, move", [
    ("<answer>Right</answer>", "Right"), ("right", "Right"), ("→", "Right"), ("r", "Right"),
    ("push it <answer>UP</answer>", "Up"), ("<answer>Left", "Left"), ("left or right", None),
    ("", None), ("<answer></answer>", None), ("xyz", None),
])
async def test_replies_become_moves(reply, move):
    env = SokobanEnv()
    await env.reset(options={"room": TWO})
    _, _, _, _, info = await env.step(reply)
    assert info["action"] == move and info["action_valid"] == (move is not None)


# --- rewards ---------------------------------------------------------------------------------


async def test_rewards_follow_gym_sokoban_defaults():
    env = SokobanEnv()
    await env.reset(options={"room": TWO})
    steps = [await env.step(m) for m in ("Up", "Right", "???")]
    assert [s[1] for s in steps] == pytest.approx([-0.1, -0.1, -0.2])  # wall bump, push, invalid
    assert steps[1][4]["pushed"] and not steps[0][4]["pushed"]
    assert steps[2][0] == steps[1][0]  # an invalid reply changes nothing
    _, r, term, _, info = await env.step("Right")  # box onto the target next to the other one
    assert (r, term, info["success"]) == (pytest.approx(-0.1 + 1.0 + 10.0), True, True)
    assert info["metrics"] == {"boxes_on_target": 2.0, "steps": 4.0, "pushes": 2.0, "optimal_moves": 2.0,
                               "optimal_pushes": 2.0, "steps_over_optimal": 2.0}


async def test_pushing_a_box_off_its_target_costs():
    room = "# # # # # #\n# P √ _ O #\n# _ X _ _ #\n# # # # # #"
    env = SokobanEnv(step_reward=0.0, box_off_target_reward=-2.5, box_on_target_reward=3.0)
    await env.reset(options={"room": room})
    assert (await env.step("Right"))[1] == -2.5
    assert (await env.step("Right"))[1] == 3.0


async def test_progress_shaping_sums_to_the_way_covered_and_dead_ends_take_it_back():
    room = "# # # # # #\n# _ _ _ _ #\n# _ X _ O #\n# P _ _ _ #\n# # # # # #"
    env = SokobanEnv(step_reward=0.0, success_reward=0.0, box_on_target_reward=0.0, progress_reward=1.0)
    _, info = await env.reset(options={"room": room})
    assert info["optimal_moves"] == 3  # Up, Right, Right
    rewards = [(await env.step(m))[1] for m in ("Up", "Right", "Right")]
    assert rewards == pytest.approx([1 / 3] * 3)  # the whole way: progress_reward in total
    await env.reset(options={"room": room})
    rewards = [(await env.step(m))[1] for m in ("Up", "Right", "Up", "Right", "Down")]
    assert rewards[:2] == pytest.approx([1 / 3, 1 / 3])
    assert solve(env.room) is None  # the last move pushed the box against the bottom wall
    assert sum(rewards) == pytest.approx(0.0)  # a dead end takes back all progress made
    await env.reset(options={"room": room})
    assert (await env.step("Left"))[1] == 0.0  # a bump changes nothing, so shapes nothing


def test_room_blind_baseline_is_the_best_single_move_sequence():
    import itertools
    from types import SimpleNamespace

    rooms = [generate_room(6, 6, 1, random.Random(s), max_moves=3)[0] for s in range(24)]

    def solved_by(seq):
        count = 0
        for room in rooms:
            for d in seq:
                room = room.move(d)[0]
                if room.solved:
                    count += 1
                    break
        return count / len(rooms)

    brute = max(solved_by(seq) for seq in itertools.product(range(4), repeat=3))
    assert best_blind_success(rooms, 3) == pytest.approx(brute)
    assert 0.0 < brute < 1.0  # rooms differ: no sequence solves them all
    trajs = [SimpleNamespace(reset_info={"map": render_room(r).replace("\n", "/")}) for r in rooms]
    assert SokobanEnv(max_steps=3).eval_baselines(trajs) == {"room_blind": pytest.approx(brute)}
    assert SokobanEnv().eval_baselines([]) == {}


# --- episode end -----------------------------------------------------------------------------


async def test_max_steps_truncates_and_later_steps_raise():
    env = SokobanEnv(max_steps=3)
    await env.reset(options={"room": CORRIDOR})
    assert (await env.step("Up"))[2:4] == (False, False)
    assert (await env.step("nonsense"))[2:4] == (False, False)
    _, r, term, trunc, info = await env.step("Left")
    assert (term, trunc, info["success"]) == (False, True, False)
    assert info["metrics"] == {"boxes_on_target": 0.0, "steps": 3.0, "pushes": 0.0, "optimal_moves": 2.0,
                               "optimal_pushes": 2.0}  # no steps_over_optimal without a solution
    with pytest.raises(EnvError, match="finished episode"):
        await env.step("Right")
    with pytest.raises(EnvError, match="reset"):
        await SokobanEnv().step("Right")


async def test_user_room_without_a_plan_within_max_steps():
    env = SokobanEnv(max_steps=1)
    _, info = await env.reset(options={"room": CORRIDOR})
    assert info["optimal_success"] == 0.0 and "optimal_moves" not in info
    *_, info = await env.step("Right")
    assert info["metrics"] == {"boxes_on_target": 0.0, "steps": 1.0, "pushes": 1.0}


async def test_reset_seeds():
    env = SokobanEnv(dim_room=[7, 7], num_boxes=2, max_steps=30, max_solution_moves=10)
    first = await env.reset(seed=3)
    await env.step("Up")
    assert await env.reset(seed=3) == first and await SokobanEnv(
        dim_room=[7, 7], num_boxes=2, max_steps=30, max_solution_moves=10).reset(seed=3) == first
    infos = [(await env.reset(seed=s))[1] for s in range(30)]
    assert all(1 <= i["optimal_moves"] <= 10 for i in infos)
    assert len({(await env.reset())[0] for _ in range(5)}) > 1  # seed None draws fresh rooms


# --- sample_action and arguments ---------------------------------------------------------------


async def test_sample_action_draws_among_moves_that_change_the_room():
    env = SokobanEnv()
    await env.reset(options={"room": TWO})
    rng = random.Random(0)
    samples = [env.sample_action(rng) for _ in range(100)]
    assert {parse_direction(s) for s in samples} == {1, 2}  # Down, Right: Left and Up are walls
    assert all(s.startswith("<answer>") and s.endswith("</answer>") for s in samples)
    await env.reset(options={"room": "# # # # # # #\n# P X √ O _ #\n# _ _ _ _ _ #\n# # # # # # #"})
    assert env.valid_moves() == ["Down"]  # Right would push a box into a box
    # Nothing can move (both boxes have a wall behind them): any of the four.
    _, info = await env.reset(options={"room": "# # # # #\n# X P X #\n# # # # #\n# O _ O #\n# # # # #"})
    assert env.valid_moves() == ["Left", "Down", "Right", "Up"] and info["optimal_success"] == 0.0


def test_registered():
    assert ENVS.get("sokoban") is SokobanEnv


@pytest.mark.parametrize("kwargs, name", [
    ({"dim_room": 6}, "dim_room"), ({"dim_room": [3, 6]}, "dim_room"), ({"dim_room": [6, 6, 6]}, "dim_room"),
    ({"dim_room": [6, 17]}, "dim_room"), ({"dim_room": [6.0, 6]}, "dim_room"),
    ({"num_boxes": 0}, "num_boxes"), ({"num_boxes": 5}, "num_boxes"), ({"num_boxes": True}, "num_boxes"),
    ({"max_steps": 0}, "max_steps"), ({"max_solution_moves": 0}, "max_solution_moves"),
    ({"min_solution_moves": 0}, "min_solution_moves"),
    ({"max_steps": 5, "min_solution_moves": 6}, "min_solution_moves"),
    ({"num_gen_steps": -1}, "num_gen_steps"), ({"p_change_directions": 1.5}, "p_change_directions"),
    ({"search_depth": 0}, "search_depth"), ({"step_reward": "x"}, "step_reward"),
    ({"success_reward": float("nan")}, "success_reward"), ({"format_penalty": None}, "format_penalty"),
    ({"progress_reward": float("inf")}, "progress_reward"), ({"show_position": 1}, "show_position"),
    ({"show_neighbours": "yes"}, "show_neighbours"),
])
def test_bad_args(kwargs, name):
    with pytest.raises(ConfigError, match=f"sokoban: {name}="):
        SokobanEnv(**kwargs)


def test_reachable_cells():
    room = parse_room("# # # # # #\n# P X _ O #\n# # # # # #")
    assert reachable(room) == {room.player}
