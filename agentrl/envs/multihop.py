"""Multi-hop questions over a synthetic corpus: facts no model can know, found with the `search` tool.

## Description
A world drawn from `world_seed`: invented companies, people and cities. Each company has a
founder; each person a manager and a birthplace. A question takes two hops:
`Who is the manager of the founder of Quillmor?` (the founder is in Quillmor's document, the
manager in the founder's) or `Where was the founder of Quillmor born?`. The world's documents
are written to `corpus_path` as JSONL ({"id", "title", "text"}), the corpus the `search` tool
indexes (`agent.args.tool_args.search.corpus`, the same path): searching the company's name,
then the founder's, finds the answer. Without search the answer is a guess.

## Action format
The content of the reply's last `<answer>...</answer>`, compared with the right name after
folding case and spaces.

## Observation format
The question; after the step, `Correct.` or `Wrong.`.

## Starting state
`reset(seed)` picks the question from `random.Random(seed)`: a company and one of the two kinds.

## Rewards
1 for the right name, 0 for a wrong one, -0.1 for a reply without an answer.

## Episode end
Every step ends the episode (`info["success"]`: the answer was right).

## Demonstrations
Offered the `search` tool, the warm start demonstrates a search for the company, one for the
founder the first answer names, then the answer; offered none, a random name of the right kind
(`sample_action`).

## Reference
The no-tool baseline (configs/tool_search.yaml with `agent.args.tools=[]`), and
`eval_baselines`' `random_answer`: the success of a uniformly random name of the right kind
(a person or a city).

## Arguments
`world_seed`, `n_companies`, `n_people`, `n_cities` (the world's size); `corpus_path` (where
its documents are written, when they differ from what is there; null: not written).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.atomic import write_atomic
from agentrl.config.paths import user_path
from agentrl.envs.text import question_step
from agentrl.errors import ConfigError, shown
from agentrl.registry import register_env

SYLLABLES = ("ka", "lo", "mir", "ven", "tas", "dor", "qui", "bel", "nor", "sul", "ra", "fen", "tor", "vi", "gal",
             "pem", "zu", "ho", "ler", "cam", "dri", "os", "mun", "tev", "ish", "par", "gro", "nel", "vak", "ju")
CITY_ENDS = ("ford", "holm", "mere", "gate", "wick", "stead")
KINDS = ("manager", "birthplace")
SIZE_MAX = 5_000  # the invented names run out beyond (27,000 three-syllable words)
_WRITTEN: set[tuple] = set()  # (corpus path, content digest, file stamp) this process wrote or found in place
_WRITE_LOCK = threading.Lock()


@dataclass(frozen=True)
class World:
    """The invented facts, and the documents that state them."""

    companies: tuple[str, ...]
    people: tuple[str, ...]
    cities: tuple[str, ...]
    founder: dict[str, str]  # company -> person
    manager: dict[str, str]  # person -> person
    born: dict[str, str]  # person -> city

    def documents(self) -> list[dict[str, str]]:
        """One document per company and person: {"id", "title", "text"}."""
        docs = [{"id": f"company-{k}", "title": c, "text": f"{c} is a company founded by {self.founder[c]}."}
                for k, c in enumerate(self.companies)]
        docs += [{"id": f"person-{k}", "title": p,
                  "text": f"{p} reports to the manager {self.manager[p]}. {p} was born in {self.born[p]}."}
                 for k, p in enumerate(self.people)]
        return docs

    def corpus_text(self) -> str:
        """The documents as JSONL."""
        return "".join(json.dumps(d) + "\n" for d in self.documents())


@functools.lru_cache(maxsize=8)
def make_world(seed: int, n_companies: int, n_people: int, n_cities: int) -> World:
    """The world of `seed` (the same seed and sizes, the same world)."""
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh(make) -> str:
        while True:
            name = make()
            if name.lower() not in used:
                used.add(name.lower())
                return name

    def word(parts: int) -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()

    cities = tuple(fresh(lambda: word(2) + rng.choice(CITY_ENDS)) for _ in range(n_cities))
    companies = tuple(fresh(lambda: word(3)) for _ in range(n_companies))
    people = tuple(fresh(lambda: f"{word(2)} {word(2)}") for _ in range(n_people))
    founder = {c: rng.choice(people) for c in companies}
    manager = {p: rng.choice([q for q in people if q != p]) for p in people}
    born = {p: rng.choice(cities) for p in people}
    return World(companies, people, cities, founder, manager, born)


def write_corpus(world: World, path: Path) -> None:
    """Write the world's documents to `path` unless they are there already (read once per
    process while the file keeps its size and time: an env is built per episode)."""
    text = world.corpus_text()
    with _WRITE_LOCK:
        key = (str(path.resolve()), hashlib.sha256(text.encode()).hexdigest(), _stamp(path))
        if key in _WRITTEN:
            return
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, text)
            except OSError as e:
                raise ConfigError(f"multihop: corpus_path={str(path)!r} cannot be written ({e.strerror})") from None
        _WRITTEN.add((*key[:2], _stamp(path)))


def _stamp(path: Path) -> tuple[int, int] | None:
    """The file's modification time and size, None when it is missing."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class MultihopEnv:
    """One two-hop question about an invented world per episode; its answer is a name."""

    needs_tools = True  # facts the model cannot know: the reward_without_tools alarm watches it

    def __init__(self, world_seed: int = 0, n_companies: int = 200, n_people: int = 300, n_cities: int = 20,
                 corpus_path: str | None = None) -> None:
        limits = dict(world_seed=(world_seed, 0, 2**31), n_companies=(n_companies, 1, SIZE_MAX),
                      n_people=(n_people, 2, SIZE_MAX), n_cities=(n_cities, 1, SIZE_MAX))
        for name, (value, low, high) in limits.items():
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"multihop: {name}={shown(value)} must be an integer from {low} to {high}")
        self.world = make_world(world_seed, n_companies, n_people, n_cities)
        if corpus_path is not None:
            if not isinstance(corpus_path, str):
                raise ConfigError(f"multihop: corpus_path={shown(corpus_path)} must be a path (or null)")
            write_corpus(self.world, user_path(corpus_path, "multihop: corpus_path"))
        self.instructions = ("Answer the question about the documents. Answer with the name only, as "
                             "<answer>name</answer>.")
        self._rng = random.Random()
        self.question: str | None = None
        self.answer: str | None = None
        self._chain: tuple[str, str, str] | None = None  # (company, founder, kind)

    def _problem(self, seed: int) -> tuple[str, str, str, str]:
        """(question, answer, company, kind) of `seed`."""
        rng = random.Random(seed)
        company, kind = rng.choice(self.world.companies), rng.choice(KINDS)
        founder = self.world.founder[company]
        if kind == "manager":
            return f"Who is the manager of the founder of {company}?", self.world.manager[founder], company, kind
        return f"Where was the founder of {company} born?", self.world.born[founder], company, kind

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Pick the question of `seed` (a random one without a seed)."""
        if seed is None:
            seed = self._rng.randrange(2**31)
        self.question, self.answer, company, kind = self._problem(seed)
        self._chain = (company, self.world.founder[company], kind)
        return self.question, {"question_seed": seed}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade the answer; always ends the episode."""
        answer, reply, content = question_step("multihop", self.answer, action)
        valid = content != reply
        correct = valid and _fold(content) == _fold(answer)
        reward = 1.0 if correct else (0.0 if valid else -0.1)
        return ("Correct." if correct else "Wrong."), reward, True, False, {"success": correct, "action_valid": valid}

    def _candidates(self, kind: str) -> tuple[str, ...]:
        return self.world.people if kind == "manager" else self.world.cities

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed answer: a uniformly random name of the kind the question asks for."""
        kind = self._chain[2] if self._chain else "manager"
        return f"<answer>{rng.choice(self._candidates(kind))}</answer>"

    def demonstration(self, rng: random.Random, tools: Sequence[str]) -> list[Any]:
        """Offered `search`: search the company, then its founder, then answer; else a random answer."""
        if "search" not in tools or self._chain is None:
            return [self.sample_action(rng)]
        company, founder, _ = self._chain
        return [{"name": "search", "arguments": {"query": company}},
                {"name": "search", "arguments": {"query": founder}}, f"<answer>{self.answer}</answer>"]

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The success of a uniformly random name of the right kind, over the evaluated questions."""
        chances = [1 / len(self._candidates(self._problem(t.reset_info["question_seed"])[3])) for t in trajectories
                   if "question_seed" in t.reset_info]
        return {"random_answer": sum(chances) / len(chances)} if chances else {}

    def close(self) -> None:
        """Nothing to release."""


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


register_env("multihop", MultihopEnv)
