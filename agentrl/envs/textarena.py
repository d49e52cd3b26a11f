"""TextArena's single-player games on agentrl's env contract: `env.type=textarena env.args.game=...`.

## Description
Any single-player game of TextArena's registry (textarena 0.7.4), made by `textarena.make(game,
**kwargs)` with the wrappers TextArena registers for that id: Guess the Number, FrozenLake, Tower
of Hanoi, Minesweeper, 2048, Sudoku, Mastermind, Bandit, Blackjack, LightsOut, ... TextArena's
dynamics, rewards and endings are kept; this module makes the calls async, shows player 0's text
one step at a time and keeps TextArena's random numbers to each env. Games of two or more players
are refused in one line: several agents in one episode is the multi-agent issue, not yet built.

## Action format
The model's reply goes to TextArena's `step` as it is, through the id's own action wrapper
(`ActionFormattingWrapper` for most: a reply with no square bracket is wrapped in one, so `7`
becomes `[7]`). The game parses it (its bracket format: `[5]`, `[up]`, `[A C]`, `[3 2]`). A reply
it cannot parse is TextArena's invalid move: the first one is a warning in the next observation
(no turn is spent), a second in a row ends the episode with the game's partial reward. A reply on
which the game itself raises (Guess the Number's `int()` of a bracketed number of 4,301 digits) is
given to the game as an empty move instead, which every game reads as an invalid one, so a reply
never fails the episode.

## Observation format
What TextArena's observation wrapper for the id shows player 0 (`LLMObservationWrapper` for most:
`[GAME] ...` and `[Player] ...` lines; on reset the game's rules and board). That text grows with
the game's log, and the conversation already holds what came before, so each step shows only
the part that is new (a wrapper whose text does not extend the previous one, such as a `-train`
id's board view, is shown whole). The step that ends the episode adds the game's reason (e.g.
`Congratulations! You guessed the correct number.`). `instructions` is one line naming the game
(TextArena puts its rules in the first observation).

## Starting state
TextArena's `reset(num_players=1, seed)`. TextArena seeds Python's global generator at reset and its
games draw from it (secret numbers, holes, mines); here each env owns Python's and NumPy's global
generators' states (`agentrl.envs.gem.OwnRandom`, one lock for every adapter that swaps them),
made afresh from each episode's seed and swapped in around every TextArena call: the same seed
replays the same episode, concurrent envs never share random numbers, and the trainer's own
streams are untouched. Each episode gets a freshly made game, because TextArena's observation
wrappers keep their log across resets.

## Rewards
TextArena's: player 0's reward from `close()` on the step that ends the episode (1 for a win, a
game's completion fraction otherwise, e.g. Guess the Number's 1 - |last guess - secret| / (max -
min)); 0 on every other step.

## Episode end
TextArena says when a game is done (a win, a loss, its own turn limit, a second invalid move in a
row); every such end is `terminated` (the game decided it and paid its reward); `env.max_turns`
truncates, as for every env. `info["success"]` is a final reward >= 1 (TextArena's single-player
games pay 1 for a win and a fraction below 1 otherwise); `info["reason"]` is the game's reason and
`info["metrics"]["invalid_move"]` 1 when an invalid move ended it. Stepping after the end is an
EnvError.

## Reference
`eval_baselines` gives `baseline_random`: a random policy (`sample_action` at every turn) on the
evaluated episodes' seeds, averaged over `baseline_plays` plays per seed (cached: evaluation plays
the same seeds every time); for Guess the Number also `baseline_bisect`, the scripted binary
search (`bisect_action`). `sample_action` draws a uniformly random valid move where this module
knows the game's moves (Guess the Number: an unguessed number in range; FrozenLake: a move that
stays on the grid; Tower of Hanoi: a legal disk move; Minesweeper: an unrevealed cell), else one
of the bracketed moves the game's text has shown this episode (its examples and action lists).

## Demonstration
The warm start plays `demonstration`: Guess the Number's binary search (the hints followed: a
"higher" raises the next guess), so the model is shown reading the hints, not GEM-style random
guesses; for the other games a random valid move (`sample_action`), which teaches the format only.

## Arguments
`game` (a TextArena env id), `kwargs` (keyword arguments for `textarena.make`, e.g.
`{max_number: 10, max_turns: 4}`), `baseline_plays`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from agentrl.envs.args import built, check_arg, import_extra, is_count
from agentrl.envs.gem import OwnRandom
from agentrl.envs.references import PerSeeds
from agentrl.errors import ConfigError, EnvError, did_you_mean, shown
from agentrl.registry import register_env

MULTI_AGENT = "several agents in one episode: the multi-agent issue, not yet built"
# Single-player ids checked to build offline (the nltk word games need nltk's data downloaded).
KNOWN_SINGLE = ("GuessTheNumber-v0", "FrozenLake-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small", "2048-v0-easy",
                "Sudoku-v0-easy", "Mastermind-v0", "Bandit-v0", "Blackjack-v0", "LightsOut-v0")
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,24})\]")  # a move as TextArena's texts write them: [5], [up], [A C]
_ROLE_TAGS = {"GAME", "Player"}  # LLMObservationWrapper's senders, not moves


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
    """A TextArena single-player game with async reset/step, its own random generators and a success flag."""

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
        self._shown, self._text = "", ""  # this episode's text shown so far; the wrapper's text last seen
        self._done = True
        self._references = PerSeeds(self._reference_success)
        self._check_single_player()

    def _check_single_player(self) -> None:
        ta = import_textarena()
        with self._random.active():
            env = make_game(self.game, self.kwargs)
            try:
                env.reset(num_players=1, seed=0)
            except Exception as e:
                if "player" in str(e).lower():
                    raise ConfigError(f"textarena: game={shown(self.game)} is not a single-player game "
                                      f"({type(e).__name__}: {_first_line(e)}); {MULTI_AGENT}") from None
                raise ConfigError(f"textarena: {self.game}: reset(num_players=1) failed: "
                                  f"{type(e).__name__}: {_first_line(e)}") from None
        if not isinstance(getattr(unwrapped(env), "state", None), ta.SinglePlayerState):
            raise ConfigError(f"textarena: game={shown(self.game)} is a game of several players "
                              f"(its state is not a SinglePlayerState); {MULTI_AGENT}")

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
            self._env.reset(num_players=1, seed=seed)
            self._text = self._shown = ""
            obs = self._observe()
        self._done = False
        return obs, {"seed": seed}

    def step_now(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step`, called without an event loop."""
        if self._done:
            raise EnvError("textarena: step() called on a finished episode; call reset() first")
        with self._random.active():
            try:
                done, _ = self._env.step(action if isinstance(action, str) else "")
            except Exception:  # noqa: BLE001 (a game's own parsing failed on the reply: see Action format)
                done, _ = self._env.step("")
            obs = self._observe()
            if not done:
                return obs, 0.0, False, False, {}
            rewards, game_info = self._env.close()
        self._done = True
        reward = float((rewards or {}).get(0, 0.0))
        ending = (game_info or {}).get(0, {})
        reason = str(ending.get("reason", ""))
        invalid = bool(ending.get("invalid_move", False))
        obs = f"{obs}\n{reason}" if obs and reason else obs or reason
        info = {"success": reward >= 1.0, "reason": reason, "metrics": {"invalid_move": float(invalid)}}
        return obs, reward, True, False, info

    def _observe(self) -> str:
        """The part of the wrapper's text for player 0 that is new since the last call."""
        _, text = self._env.get_observation()
        text = text if isinstance(text, str) else str(text)
        new = text[len(self._text):] if text.startswith(self._text) else text
        self._text = text
        self._shown += new
        return new.lstrip("\n")

    def sample_action(self, rng: random.Random) -> str:
        """A uniformly random valid move as a bracketed reply (see Reference), drawn from `rng`."""
        game = unwrapped(self._env) if self._env is not None else None
        moves = _MOVES.get(type(game).__name__, _shown_moves)(game, self._shown) if game is not None else []
        return rng.choice(moves) if moves else "[0]"

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The random policy, and the scripted solver where there is one, on the evaluated seeds."""
        return self._references(trajectories)

    def _reference_success(self, seeds: tuple[int, ...]) -> dict[str, float]:
        env = TextArenaEnv(self.game, self.kwargs)
        refs = {"random": policy_success(env, env.sample_action, seeds, self.baseline_plays)}
        if isinstance(unwrapped(env._env), _bisectable()):
            refs["bisect"] = policy_success(env, env.bisect_action, seeds, 1)
        return refs

    def bisect_action(self, rng: random.Random) -> str:
        """Guess the Number's binary search: the middle of the range the hints leave."""
        game = unwrapped(self._env)
        lo, hi = game.min_number, game.max_number
        for guess, hint in game.state.game_state["guess_history"]:
            lo, hi = (max(lo, guess + 1), hi) if hint == "higher" else (lo, min(hi, guess - 1))
        return f"[{(lo + hi) // 2}]"

    def demonstration(self, rng: random.Random, tools: tuple[str, ...]) -> list[str]:
        """The warm start's reply: Guess the Number's binary search (the hints followed), else a random valid move."""
        if self._env is not None and not self._done and isinstance(unwrapped(self._env), _bisectable()):
            return [self.bisect_action(rng)]
        return [self.sample_action(rng)]

    def close(self) -> None:
        """End the episode (TextArena's single-player games hold nothing to release)."""
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
