"""reasoning-gym's procedural datasets as a question-answer env: `env.type=reasoning_gym env.args.dataset=...`.

## Description
One question of a reasoning-gym dataset per episode (`reasoning_gym.create_dataset(dataset,
**config)`: arithmetic, algorithmic, logic, games, graphs, ... over a hundred generators), graded
by that dataset's own `score_answer(answer, entry)`. Single-turn with the chat agent
(`env.max_turns: 1`), or multi-turn with the retry agent (`agent.type=math_retry`): a step always
ends the episode, and the env keeps its question until the next reset, so the agent may step
again with another answer after "wrong, try again".

## Action format
The content of the reply's last `<answer>...</answer>` (or of an unclosed `<answer>` tail, or else
the whole reply), stripped: reasoning-gym's own answer convention. An empty answer, or one longer
than 4096 characters, is invalid.

## Observation format
The dataset's question text; after a step `Correct.` or `Wrong.` (never the answer).

## Starting state
`reset(seed)` asks item `seed` of the dataset (item `seed % size` when `size` is given). Items are
generated from (dataset seed, index), so the same seed always asks the same question, and since
agentrl's evaluation seeds lie above every training seed, evaluation asks questions training
never saw (unless `size` folds them together).

## Rewards
The dataset's score of the answer (in [0, 1]; partial credit where the dataset gives it), or
`format_penalty` for an invalid answer. A scorer that raises scores 0 and counts
`info["metrics"]["scorer_error"]`.

## Episode end
Every step terminates; `info["success"]` is a score of at least `success_threshold`.
`info["metrics"]["score"]` is the raw score.

## Reference
`eval_baselines` gives `baseline_most_frequent_answer`: the success of answering every evaluated
question with one fixed answer, the best of the five most frequent right answers among them
(scored by the dataset's scorer).

## Arguments
`dataset` (a reasoning-gym dataset name), `config` (its config fields, e.g. `{min_terms: 2,
max_terms: 2, max_digits: 1}`), `seed` (the dataset's seed), `size` (null: item = episode seed;
an int folds the seeds onto that many items; datasets that generate every item up front, such
as `acre`, need one), `success_threshold`, `format_penalty`.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

from agentrl.envs.args import REWARD_MAX, check_arg, import_extra, is_count, is_number, is_reward
from agentrl.envs.text import answer_content
from agentrl.errors import ConfigError, EnvError, did_you_mean, shown
from agentrl.registry import register_env

MAX_ANSWER_CHARS = 4096  # longer answers are invalid: some scorers are slow on huge strings
UNBOUNDED = 2**31 - 1  # the dataset size passed when items are indexed by the seed itself
_DATASETS: dict[str, Any] = {}  # one dataset object per (name, config, seed, size): envs are built per episode
_POOLS: dict[str, list[str]] = {}


def load_dataset(name: str, config: dict[str, Any], seed: int, size: int | None) -> tuple[str, Any]:
    """(cache key, dataset) for `reasoning_gym.create_dataset(name, **config, seed=, size=)`."""
    key = json.dumps([name, config, seed, size], sort_keys=True, default=str)
    if key not in _DATASETS:
        rg = import_extra("reasoning_gym", "reasoning-gym", "env type 'reasoning_gym'")
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            raise ConfigError(f"reasoning_gym: dataset={shown(name)} is not a reasoning-gym dataset."
                              f"{did_you_mean(name, DATASETS)} Known: {', '.join(sorted(DATASETS))}")
        try:
            _DATASETS[key] = rg.create_dataset(name, **{**config, "seed": seed, "size": size or UNBOUNDED})
        except (TypeError, ValueError, AssertionError) as e:
            hint = (f" (with args.size null it is asked for {UNBOUNDED} items; set args.size to the number of "
                    "questions it should hold)" if size is None else "")
            raise ConfigError(f"reasoning_gym: dataset {shown(name)} rejects config {shown(config)}: "
                              f"{type(e).__name__}: {e}{hint}") from None
    return key, _DATASETS[key]


class ReasoningGymEnv:
    """One reasoning-gym question per episode, graded by the dataset's scorer."""

    def __init__(self, dataset: str = "chain_sum", config: dict[str, Any] | None = None, seed: int = 0,
                 size: int | None = None, success_threshold: float = 1.0, format_penalty: float = -0.1) -> None:
        check_arg("reasoning_gym", isinstance(dataset, str) and bool(dataset), "dataset", dataset,
                  "a reasoning-gym dataset name such as 'chain_sum'")
        check_arg("reasoning_gym", config is None or isinstance(config, dict), "config", config,
                  "a mapping of the dataset's config fields")
        check_arg("reasoning_gym", is_count(seed, 0, 2**63 - 1), "seed", seed, "an int from 0 to 2^63 - 1")
        # Some datasets generate every item up front: a size is a loop of that length before any work.
        check_arg("reasoning_gym", size is None or is_count(size, 1, 10**6), "size", size,
                  "null or an int from 1 to 10^6")
        check_arg("reasoning_gym", is_number(success_threshold) and 0 < success_threshold <= 1,
                  "success_threshold", success_threshold, "a number in (0, 1]")
        check_arg("reasoning_gym", is_reward(format_penalty), "format_penalty", format_penalty,
                  f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        config = dict(config or {})
        for reserved in ("seed", "size"):
            check_arg("reasoning_gym", reserved not in config, f"config.{reserved}", config.get(reserved),
                      f"left out: set args.{reserved} instead")
        self.dataset, self.size = dataset, size
        self.success_threshold, self.format_penalty = float(success_threshold), float(format_penalty)
        self._key, self._ds = load_dataset(dataset, config, seed, size)
        self.instructions = "Answer the question. Give only the final answer, as <answer>answer</answer>."
        self._rng = random.Random()
        self.entry: dict[str, Any] | None = None

    def index(self, seed: int) -> int:
        """The dataset item episode seed `seed` asks."""
        return seed % self.size if self.size else seed

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Ask the question of `seed` (a random one without a seed)."""
        if seed is None:
            seed = self._rng.randrange(2**31)
        self.entry = self._ds[self.index(seed)]
        return str(self.entry["question"]), {"question_index": self.index(seed)}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score `action`'s answer to the current question; always ends the episode."""
        if self.entry is None:
            raise EnvError("reasoning_gym: step() before reset(); call reset() first")
        answer = answer_content(action if isinstance(action, str) else "").strip()
        valid = 0 < len(answer) <= MAX_ANSWER_CHARS
        score, error = self.score(answer, self.entry) if valid else (0.0, False)
        success = score >= self.success_threshold
        info = {"success": success, "action_valid": valid,
                "metrics": {"score": score, "scorer_error": float(error)}}
        return ("Correct." if success else "Wrong."), (score if valid else self.format_penalty), True, False, info

    def score(self, answer: str, entry: dict[str, Any]) -> tuple[float, bool]:
        """(the dataset's score of `answer`, whether its scorer raised); non-finite scores are 0."""
        try:
            value = float(self._ds.score_answer(answer, entry))
        except Exception:  # a third-party scorer on an arbitrary string: scored 0, counted
            return 0.0, True
        return (value if math.isfinite(value) else 0.0), False

    def answer_pool(self) -> list[str]:
        """The right answers of the first 256 items (what `sample_action` draws from)."""
        if self._key not in _POOLS:
            answers = [self._ds[self.index(i)].get("answer") for i in range(256)]
            _POOLS[self._key] = [str(a) for a in answers if a is not None] or ["0"]
        return _POOLS[self._key]

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a random answer: the right answer of a random item."""
        return f"<answer>{rng.choice(self.answer_pool())}</answer>"

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The best fixed answer among the five most frequent right answers of the evaluated questions."""
        entries = [self._ds[t.reset_info["question_index"]] for t in trajectories if "question_index" in t.reset_info]
        golds = Counter(str(e["answer"]) for e in entries if e.get("answer") is not None)
        if not golds:
            return {}
        best = max(sum(self.score(answer, e)[0] >= self.success_threshold for e in entries)
                   for answer, _ in golds.most_common(5))
        return {"most_frequent_answer": best / len(entries)}

    def close(self) -> None:
        """Nothing to release: datasets are shared by every env of the process."""


register_env("reasoning_gym", ReasoningGymEnv)
