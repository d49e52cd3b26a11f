"""TextArena's two-player games: the legal moves of the player to act and the scripted players of the
warm start, read from the game's state (TicTacToe, Nim, Kuhn Poker), or from its text for other games."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

_AVAILABLE = re.compile(r"available (?:moves|actions)\b[^\n]*", re.IGNORECASE)
_QUOTED_MOVE = re.compile(r"\[([^\[\]\n]{1,24})\]")
_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def acting_player(game: Any) -> int:
    """TextArena's id of the player whose turn it is."""
    return int(game.state.current_player_id)


def _cells(game: Any) -> list[str]:
    return [mark for row in game.state.game_state["board"] for mark in row]


def tictactoe_moves(game: Any) -> list[str]:
    """The empty cells, bracketed."""
    return [f"[{i}]" for i, mark in enumerate(_cells(game)) if mark == ""]


def nim_moves(game: Any) -> list[str]:
    """Every `[pile quantity]` that removes 1 to all of a non-empty pile."""
    piles = game.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


def kuhn_moves(game: Any) -> list[str]:
    """The actions Kuhn Poker's betting tree allows now (`[check]`/`[bet]`, or `[call]`/`[fold]` facing a bet)."""
    tree = game.state.game_state["current_legal_action_tree"]
    return [f"[{move}]" for move in tree] if isinstance(tree, dict) else []


def available_moves(text: str) -> list[str]:
    """The bracketed moves of the last `Available moves/actions: ...` line of a player's text."""
    lists = _AVAILABLE.findall(text)
    return [f"[{m}]" for m in _QUOTED_MOVE.findall(lists[-1])] if lists else []


def tictactoe_demo(game: Any, rng: random.Random) -> str | None:
    """Complete a line of one's own, else block the opponent's, else None (the caller plays a random legal move)."""
    cells = _cells(game)
    mine = "X" if acting_player(game) == 1 else "O"  # TextArena's marks: player 1 is X
    for owner in (mine, "O" if mine == "X" else "X"):
        wins = sorted({i for line in _LINES for i in line if cells[i] == ""
                       and sum(cells[j] == owner for j in line) == 2})
        if wins:
            return f"[{rng.choice(wins)}]"
    return None


def nim_demo(game: Any, rng: random.Random) -> str | None:
    """A move that leaves nim-sum 0 (the winning strategy when one exists), else None."""
    piles = game.state.game_state["piles"]
    total = 0
    for n in piles:
        total ^= n
    if total == 0:
        return None
    return rng.choice([f"[{i} {n - (n ^ total)}]" for i, n in enumerate(piles) if n ^ total < n])


def kuhn_demo(game: Any, rng: random.Random) -> str | None:
    """Bet when one can, call a bet: the dominant play of TextArena's Kuhn Poker, whose bets are free.

    TextArena 0.7.4 never adds a bet or a call to the pot (it stays at the two antes), so a fold
    loses the ante for sure where a call loses at most the same, and a bet costs nothing and makes
    the opponent fold sometimes. The textbook card heuristic (King: bet or call; Queen: check, call
    a third of the time; Jack: check or fold) loses to a random player there: 0.41 and 0.39 of
    games won in seats 0 and 1 on seeds 0-63, against random's 0.43 and 0.57; this wins 0.74 and 0.83.
    """
    legal = set(kuhn_moves(game))
    move = "[bet]" if "[bet]" in legal else "[call]"
    return move if move in legal else None


# {game class name: legal moves(game)} and {game class name: scripted move(game, rng) or None}
LEGAL_MOVES: dict[str, Callable[[Any], list[str]]] = {
    "TicTacToeEnv": tictactoe_moves, "NimEnv": nim_moves, "KuhnPokerEnv": kuhn_moves,
}
DEMOS: dict[str, Callable[[Any, random.Random], str | None]] = {
    "TicTacToeEnv": tictactoe_demo, "NimEnv": nim_demo, "KuhnPokerEnv": kuhn_demo,
}
