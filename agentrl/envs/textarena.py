"""TextArena's one- and two-player games on agentrl's env contract: `env.type=textarena env.args.game=...`.

## Description
Any single-player game of TextArena's registry (textarena 0.7.4), made by `textarena.make(game,
**kwargs)` with the wrappers TextArena registers for that id: Guess the Number, FrozenLake, Tower
of Hanoi, Minesweeper, 2048, Sudoku, Mastermind, Bandit, Blackjack, LightsOut, ... and any of its
two-player games (those whose state is TextArena's `TwoPlayerState`: TicTacToe, Nim, Kuhn Poker,
...; those three checked here). TextArena's dynamics, rewards and endings are kept; this module makes
the calls async, shows each player's text one step at a time and keeps TextArena's random numbers to
each env.
Whether a game is of one or two players is decided at construction (a reset with one player, else
with two); a game of more players (its state an `FFAMultiPlayerState`, e.g. Snake, or one that
asserts three players) is refused in one line.

A two-player game is a game env: `env.roles == ("player_0", "player_1")` (TextArena's player ids 0
and 1; a single-player game has `roles == ()`), and one episode is the whole game, both players'
moves in turn: `reset` returns the observation of the player who acts first (Kuhn Poker opens with
player 1) and `info["role"]`, each `step` takes the move of the player whose turn it is and returns
the observation of the player who acts next, with its role in `info["role"]` (the agent loop gives
each role its own conversation).

## Action format
The model's reply goes to TextArena's `step` as it is, through the id's own action wrapper
(`ActionFormattingWrapper` for most: a reply with no square bracket is wrapped in one, so `7`
becomes `[7]`). The game parses it (its bracket format: `[5]`, `[up]`, `[A C]`, `[3 2]`, `[bet]`).
A reply it cannot parse, or a move its rules forbid, is TextArena's invalid move: the first one is a
warning in the next observation (no turn is spent: in a two-player game the same role acts again),
a second in a row ends the episode (single-player: the game's partial reward; two-player: the
offender loses, -1 against +1). A reply on which the game itself raises (Guess the Number's `int()`
of a bracketed number of 4,301 digits) is given to the game as an empty move instead, which every
game reads as an invalid one, so a reply never fails the episode.

## Observation format
What TextArena's observation wrapper for the id shows the player to act (`LLMObservationWrapper`
for most: `[GAME] ...` and `[Player 0] ...` lines; on a player's first turn the game's rules and
board). That text grows with the game's log, and the player's conversation already holds what came
before, so each step shows only the part that is new for that player since it last saw its text
(in a two-player game: the opponent's move, the game's answer, the new board; a wrapper whose text
does not extend the previous one, such as a `-train` id's board view, is shown whole). The step
that ends the episode shows what is new for the player who made the last move, plus the game's
reason (e.g. `Congratulations! You guessed the correct number.`, `Player 1 has won!`).
`instructions` is one line naming the game (TextArena puts its rules in the first observation).

## Starting state
TextArena's `reset(num_players=1 or 2, seed)`. TextArena seeds Python's global generator at reset
and its games draw from it (secret numbers, holes, mines, Kuhn Poker's cards); here each env owns
Python's and NumPy's global generators' states (`agentrl.envs.gem.OwnRandom`, one lock for every
adapter that swaps them), made afresh from each episode's seed and swapped in around every
TextArena call: the same seed replays the same episode, concurrent envs never share random numbers,
and the trainer's own streams are untouched. Each episode gets a freshly made game, because
TextArena's observation wrappers keep their log across resets.

## Rewards
Single-player: player 0's reward from `close()` on the step that ends the episode (1 for a win, a
game's completion fraction otherwise, e.g. Guess the Number's 1 - |last guess - secret| / (max -
min)); 0 on every other step. Two-player: `info["rewards"] == {"player_0": r0, "player_1": r1}` from
`close()` at the end (+1 / -1 for a win, 0 / 0 for a draw), and the step's `reward` is the entry of
the player who made the last move; 0 on every other step.

## Episode end
TextArena says when a game is done (a win, a loss, a draw, its own turn or round limit, a second
invalid move in a row); every such end is `terminated` (the game decided it and paid its reward);
`env.max_turns` truncates, as for every env. `info["success"]` is a final reward >= 1 in a
single-player game (TextArena's pay 1 for a win and a fraction below 1 otherwise) and the acting
player's reward > 0 in a two-player one; `info["reason"]` is the game's reason and
`info["metrics"]["invalid_move"]` 1 when an invalid move ended it. The last step's info has no
`role`. Stepping after the end is an EnvError.

## Reference
Single-player: `eval_baselines` gives `baseline_random`: a random policy (`sample_action` at every
turn) on the evaluated episodes' seeds, averaged over `baseline_plays` plays per seed (cached:
evaluation plays the same seeds every time); for Guess the Number also `baseline_bisect`, the
scripted binary search (`bisect_action`). `sample_action` draws a uniformly random valid move where
this module knows the game's moves (Guess the Number: an unguessed number in range; FrozenLake: a
move that stays on the grid; Tower of Hanoi: a legal disk move; Minesweeper: an unrevealed cell),
else one of the bracketed moves the game's text has shown this episode (its examples and action
lists).

Two-player: for each role r, `random_win_<r>` (the random player's share of won games in seat r
against the random player) and `demo_win_<r>` (the demonstration's in seat r against the random
player), over `baseline_plays` plays per evaluated seed, cached the same way. `sample_action` is a
uniformly random legal move of the player to act, read from the game's state for TicTacToe (an
empty cell), Nim (`[pile quantity]`, 1 to all of a non-empty pile) and Kuhn Poker (what its betting
tree allows), else from the last `Available Moves/actions: ...` list of that player's text, else
`[0]`. Measured on seeds 0-63, 4 plays each (win rates of seats 0 / 1): TicTacToe random 0.56 /
0.28, demonstration 0.91 / 0.73; Nim (piles 3 4 5) random 0.49 / 0.51, demonstration 1.00 / 0.99;
Kuhn Poker (3 rounds) random 0.43 / 0.57, demonstration 0.74 / 0.83.

## Demonstration
The warm start plays `demonstration`: Guess the Number's binary search (the hints followed: a
"higher" raises the next guess), so the model is shown reading the hints, not GEM-style random
guesses. Two-player games, for the player to act (`textarena_games.py`): TicTacToe completes a line
of its own if it can, else blocks the opponent's, else a random legal move; Nim moves to nim-sum 0
when it can, else a random legal move; Kuhn Poker bets when it can and calls a bet (TextArena 0.7.4
adds no bet or call to the pot, so folding never pays and a bet costs nothing; the textbook card
heuristic loses to a random player there). For the other games a random valid move
(`sample_action`), which teaches the format only.

## Arguments
`game` (a TextArena env id), `kwargs` (keyword arguments for `textarena.make`, e.g.
`{max_number: 10, max_turns: 4}` or Nim's `{piles: [1, 2, 3]}`), `baseline_plays`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.envs.args import built, check_arg, import_extra, is_count
from agentrl.envs.gem import OwnRandom
from agentrl.envs.references import PerSeeds
from agentrl.envs.textarena_games import DEMOS, LEGAL_MOVES, acting_player, available_moves
from agentrl.errors import ConfigError, EnvError, did_you_mean, shown
from agentrl.registry import register_env

PLAYERS = "agentrl plays TextArena's single-player games and its two-player (TwoPlayerState) games"
# Single-player ids checked to build offline (the nltk word games need nltk's data downloaded).
KNOWN_SINGLE = ("GuessTheNumber-v0", "FrozenLake-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small", "2048-v0-easy",
                "Sudoku-v0-easy", "Mastermind-v0", "Bandit-v0", "Blackjack-v0", "LightsOut-v0")
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,24})\]")  # a move as TextArena's texts write them: [5], [up], [A C]
_ROLE_TAGS = {"GAME", "Player"}  # LLMObservationWrapper's senders, not moves
_PLAYERS: dict[tuple[str, str], int] = {}  # (game, its kwargs) -> players, as `_count_players` found


def import_textarena() -> Any:
    """The `textarena` package, imported on first use (it takes a second and a half)."""
    return import_extra("textarena", "textarena", "env type 'textarena'")


def make_game(game: str, kwargs: dict[str, Any]) -> Any:
    """`textarena.make(game, **kwargs)`, with an unknown id or a failed build as one-line ConfigErrors."""
    ta = import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        raise ConfigError(f"textarena: game={shown(game)} is not in TextArena's registry."
                          f"{did_you_mean(game, ENV_REGISTRY)} Single-player games: {', '.join(KNOWN_SINGLE)}")
    return built(f"textarena: textarena.make({shown(game)}, **{shown(kwargs)})", lambda: ta.make(game, **kwargs))


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if any(c.isalnum() for c in line)), "")


def unwrapped(env: Any) -> Any:
    """The game under TextArena's wrappers."""
    ta = import_textarena()
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


class TextArenaEnv:
    """A TextArena game of one or two players (`roles`): async reset/step, its own random generators, a success flag."""

    def __init__(self, game: str = "GuessTheNumber-v0", kwargs: dict[str, Any] | None = None,
                 baseline_plays: int = 4) -> None:
        check_arg("textarena", isinstance(game, str) and bool(game), "game", game,
                  "a TextArena env id such as 'GuessTheNumber-v0'")
        check_arg("textarena", kwargs is None or isinstance(kwargs, dict), "kwargs", kwargs,
                  "a mapping of textarena.make arguments")
        check_arg("textarena", is_count(baseline_plays, 1, 1000), "baseline_plays", baseline_plays,
                  "an int from 1 to 1000")
        self.game, self.kwargs, self.baseline_plays = game, dict(kwargs or {}), baseline_plays
        self.instructions = f"TextArena {game}."
        self._random = OwnRandom(0)
        self._env: Any = None
        # per player id: this episode's text shown so far; the wrapper's text last seen
        self._shown: dict[int, str] = {}
        self._text: dict[int, str] = {}
        self._done = True
        self._references = PerSeeds(self._reference_success)
        key = (game, repr(sorted(self.kwargs.items())))
        if key not in _PLAYERS:  # one probe per game and arguments, not one per episode's env
            _PLAYERS[key] = self._count_players()
        self.players = _PLAYERS[key]
        self.roles: tuple[str, ...] = tuple(f"player_{p}" for p in range(self.players)) if self.players > 1 else ()

    def _count_players(self) -> int:
        """1 for a single-player game, 2 for a two-player one (TwoPlayerState); anything else is a ConfigError."""
        ta = import_textarena()
        with self._random.active():
            env = make_game(self.game, self.kwargs)
            try:
                env.reset(num_players=1, seed=0)
                if isinstance(getattr(unwrapped(env), "state", None), ta.SinglePlayerState):
                    return 1
            except Exception as e:  # noqa: BLE001 (a game of several players asserts its count: try two)
                if "player" not in str(e).lower():
                    raise ConfigError(f"textarena: {self.game}: reset(num_players=1) failed: "
                                      f"{type(e).__name__}: {_first_line(e)}") from None
            env = make_game(self.game, self.kwargs)
            try:
                env.reset(num_players=2, seed=0)
            except Exception as e:  # noqa: BLE001 (reported in one line)
                raise ConfigError(f"textarena: game={shown(self.game)} is neither a one- nor a two-player game "
                                  f"(reset(num_players=2): {type(e).__name__}: {_first_line(e)}); {PLAYERS}") from None
        state = getattr(unwrapped(env), "state", None)
        if not isinstance(state, ta.TwoPlayerState):
            raise ConfigError(f"textarena: game={shown(self.game)} is a game of several players (its state is a "
                              f"{type(state).__name__}, not a TwoPlayerState); {PLAYERS}")
        return 2

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """A fresh game, reset with this env's own generators; the same seed gives the same episode."""
        return self.reset_now(seed)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """TextArena's step on the raw reply: the new text, the game's reward at its end, a success flag."""
        return self.step_now(action)

    def reset_now(self, seed: int | None = None) -> tuple[str, dict]:
        """`reset`, called without an event loop (TextArena's calls are synchronous)."""
        if seed is not None:
            self._random = OwnRandom(seed)  # NumPy's state too, for games that draw from it
        with self._random.active():
            self._env = make_game(self.game, self.kwargs)
            self._env.reset(num_players=self.players, seed=seed)
            self._text, self._shown = {}, {}
            player, obs = self._observe()
        self._done = False
        return obs, ({"seed": seed, "role": self.roles[player]} if self.roles else {"seed": seed})

    def step_now(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step`, called without an event loop."""
        if self._done:
            raise EnvError("textarena: step() called on a finished episode; call reset() first")
        with self._random.active():
            acting = self._acting()
            try:
                done, _ = self._env.step(action if isinstance(action, str) else "")
            except Exception:  # noqa: BLE001 (a game's own parsing failed on the reply: see Action format)
                done, _ = self._env.step("")
            if done and self.roles:  # show the player who moved, though the game may have moved the turn (Kuhn Poker)
                unwrapped(self._env).state.current_player_id = acting  # harmless: the game is over
            player, obs = self._observe()
            if not done:
                return obs, 0.0, False, False, ({"role": self.roles[player]} if self.roles else {})
            rewards, game_info = self._env.close()
        self._done = True
        rewards, ending = rewards or {}, (game_info or {}).get(acting, {})
        reward = float(rewards.get(acting, 0.0))
        reason = str(ending.get("reason", ""))
        invalid = any(bool(i.get("invalid_move", False)) for i in (game_info or {}).values())
        obs = f"{obs}\n{reason}" if obs and reason else obs or reason
        info: dict[str, Any] = {"success": reward >= 1.0, "reason": reason,
                                "metrics": {"invalid_move": float(invalid)}}
        if self.roles:
            info["rewards"] = {role: float(rewards.get(p, 0.0)) for p, role in enumerate(self.roles)}
            info["success"] = reward > 0
        return obs, reward, True, False, info

    def _acting(self) -> int:
        """TextArena's id of the player to act (0 in a single-player game)."""
        return int(unwrapped(self._env).state.current_player_id) if self.roles else 0

    def _observe(self) -> tuple[int, str]:
        """The player to act and the part of the wrapper's text for that player that is new since it last saw it."""
        player, text = self._env.get_observation()
        player = int(player) if self.roles else 0
        text = text if isinstance(text, str) else str(text)
        last = self._text.get(player, "")
        new = text[len(last):] if text.startswith(last) else text
        self._text[player] = text
        self._shown[player] = self._shown.get(player, "") + new
        return player, new.lstrip("\n")

    def sample_action(self, rng: random.Random) -> str:
        """A uniformly random valid move of the player to act, bracketed (see Reference), drawn from `rng`."""
        game = unwrapped(self._env) if self._env is not None else None
        if game is None:
            return "[0]"
        if self.roles:
            text = self._shown.get(acting_player(game), "")
            moves = LEGAL_MOVES[type(game).__name__](game) if type(game).__name__ in LEGAL_MOVES \
                else available_moves(text)
        else:
            moves = _MOVES.get(type(game).__name__, _shown_moves)(game, self._shown.get(0, ""))
        return rng.choice(moves) if moves else "[0]"

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The random policy, and the scripted solver where there is one, on the evaluated seeds."""
        return self._references(trajectories)

    def _reference_success(self, seeds: tuple[int, ...]) -> dict[str, float]:
        env = TextArenaEnv(self.game, self.kwargs)
        if self.roles:
            return game_references(env, seeds, self.baseline_plays)
        refs = {"random": policy_success(env, env.sample_action, seeds, self.baseline_plays)}
        if isinstance(unwrapped(env._env), _bisectable()):
            refs["bisect"] = policy_success(env, env.bisect_action, seeds, 1)
        return refs

    def demo_move(self, rng: random.Random) -> str:
        """The scripted move of a two-player game's player to act (see Demonstration), else a random valid move."""
        game = unwrapped(self._env) if self._env is not None and not self._done else None
        script = DEMOS.get(type(game).__name__) if game is not None else None
        return (script(game, rng) if script else None) or self.sample_action(rng)

    def bisect_action(self, rng: random.Random) -> str:
        """Guess the Number's binary search: the middle of the range the hints leave."""
        game = unwrapped(self._env)
        lo, hi = game.min_number, game.max_number
        for guess, hint in game.state.game_state["guess_history"]:
            lo, hi = (max(lo, guess + 1), hi) if hint == "higher" else (lo, min(hi, guess - 1))
        return f"[{(lo + hi) // 2}]"

    def demonstration(self, rng: random.Random, tools: tuple[str, ...]) -> list[str]:
        """The warm start's reply: Guess the Number's binary search, a two-player game's script, else a random move."""
        if self._env is not None and not self._done and isinstance(unwrapped(self._env), _bisectable()):
            return [self.bisect_action(rng)]
        return [self.demo_move(rng) if self.roles else self.sample_action(rng)]

    def close(self) -> None:
        """End the episode (TextArena's games hold nothing to release)."""
        self._done = True


def policy_success(env: TextArenaEnv, policy: Callable[[random.Random], str], seeds: tuple[int, ...],
                   plays: int, turn_cap: int = 1000) -> float:
    """Mean success of `policy` over `plays` episodes of each seed (the game's own turn limit ends them)."""
    wins = 0
    for seed in seeds:
        for k in range(plays):
            rng = random.Random(seed * 7919 + k)
            env.reset_now(seed)
            for _ in range(turn_cap):
                _, _, terminated, truncated, info = env.step_now(policy(rng))
                if terminated or truncated:
                    wins += info["success"]
                    break
    return wins / (len(seeds) * plays)


def play_game(env: TextArenaEnv, policies: Mapping[str, Callable[[random.Random], str]], seed: int,
              rng: random.Random, turn_cap: int = 1000) -> dict[str, float]:
    """One game of `env` (two roles) on `seed`, each role's move from its policy; the final rewards ({} if capped)."""
    _, info = env.reset_now(seed)
    for _ in range(turn_cap):
        _, _, terminated, truncated, info = env.step_now(policies[info["role"]](rng))
        if terminated or truncated:
            return dict(info.get("rewards", {}))
    return {}


def win_rates(env: TextArenaEnv, policies: Mapping[str, Callable[[random.Random], str]], seeds: tuple[int, ...],
              plays: int) -> dict[str, float]:
    """Each role's share of won games (reward > 0) over `plays` games of each seed."""
    wins = dict.fromkeys(env.roles, 0)
    for seed in seeds:
        for k in range(plays):
            rewards = play_game(env, policies, seed, random.Random(seed * 7919 + k))
            for role in env.roles:
                wins[role] += rewards.get(role, 0.0) > 0
    return {role: n / (len(seeds) * plays) for role, n in wins.items()}


def game_references(env: TextArenaEnv, seeds: tuple[int, ...], plays: int) -> dict[str, float]:
    """`random_win_<role>`: a random player's win rate in that seat against a random player;
    `demo_win_<role>`: the demonstration's against a random player."""
    rand = dict.fromkeys(env.roles, env.sample_action)
    refs = {f"random_win_{role}": rate for role, rate in win_rates(env, rand, seeds, plays).items()}
    for role in env.roles:
        refs[f"demo_win_{role}"] = win_rates(env, {**rand, role: env.demo_move}, seeds, plays)[role]
    return refs


def _bisectable() -> type:
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    return GuessTheNumberEnv


# The valid moves of the games this module knows, read from the game's state: {class name: moves(game, text)}.
def _guess_moves(game: Any, _: str) -> list[str]:
    return [f"[{n}]" for n in range(game.min_number, game.max_number + 1) if n not in game.guessed_numbers]


def _lake_moves(game: Any, _: str) -> list[str]:
    r, c = game.player_pos
    steps = {"up": (r - 1, c), "down": (r + 1, c), "left": (r, c - 1), "right": (r, c + 1)}
    return [f"[{name}]" for name, (nr, nc) in steps.items() if 0 <= nr < game.size and 0 <= nc < game.size]


def _hanoi_moves(game: Any, _: str) -> list[str]:
    towers = game.state.game_state["towers"]
    return [f"[{a} {b}]" for a in towers for b in towers
            if a != b and towers[a] and (not towers[b] or towers[b][-1] > towers[a][-1])]


def _mine_moves(game: Any, _: str) -> list[str]:
    return [f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols) if not game.revealed[r][c]]


def _shown_moves(game: Any, text: str) -> list[str]:
    """The distinct bracketed moves the game's text has shown (its examples, its action lists)."""
    game_lines = "\n".join(line for line in text.splitlines() if not line.startswith("[Player"))  # not our replies
    found = {m for m in _BRACKETED.findall(game_lines) if m.strip() and m not in _ROLE_TAGS}
    return [f"[{m}]" for m in sorted(found)]


_MOVES: dict[str, Callable[[Any, str], list[str]]] = {
    "GuessTheNumberEnv": _guess_moves, "FrozenLakeEnv": _lake_moves, "TowerOfHanoiEnv": _hanoi_moves,
    "MinesweeperEnv": _mine_moves,
}


register_env("textarena", TextArenaEnv)
