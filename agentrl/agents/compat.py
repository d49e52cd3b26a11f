"""Seed-style agents (AReaL's legacy API) run unchanged by our collector and trainer.

A seed-style agent is a class with

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue): ...

registered with `register_agent`. Per turn it puts `(qid, token_ids, gconfig)` on `obs_queue`
and reads the engine's answer, a `GenerationOutput` (AReaL's `BundledGenerationOutputs`: `seqs`,
`output_ids`, `logprobs`, `no_eos`, `prompt_ids`, `prompt_len`, `seqlens`, `version_start`,
`version_end`), from `act_queue`. It steps its env itself, the seeds' way:
`await env.step((qid, answers))` returns `(obs, rewards, terminated, truncated, info)` with one
reward per answer (the seeds' math env returns 1/0 success values). The env is registered with
`register_env` (or `register_environment`) and needs only `reset` and `step`. Its
`reset(seed=None, options=None)` returns the question text as the observation (and may put a
`qid` in its info), or `None` when the question comes from the dataset, as in AReaL: the env is
then built with `args.dataset_path`, and episode seed `s` plays row `s % len(rows)` of that file
(agents/seed_data.py says which fields are read).

A class is seed-style when it subclasses the seeds' `Agent` (`agentrl.Agent`), or has
`collect_trajectory` and no `run_episode` of its own (our contract's Protocol stub does not count).
The seeds' names (agents/seed_api.py) exist here and at the package top: `Agent`,
`SequenceSample`, `BundledGenerationOutputs`, `GenerationHyperparameters` (and
`EnvironmentService`, `math_verify_call` in envs/service.py).

`SeedAgentAdapter` is an ordinary agent of ours that runs such a class:
1. it resets the env once with the task's seed and renders the question (the observation, or
   the dataset row's) as the first user message (after the env's `instructions`, if it has
   any): that is `prompt`, a `SequenceSample` with `ids=[qid]`, `bs=1` and
   `data["packed_prompts"]` (a list of ids, not a tensor);
2. the agent's own `env.reset()` returns that same first observation without resetting again
   (AReaL's math agent resets "just to make it like multi-step environments");
3. each `(qid, token_ids, gconfig)` becomes one `llm.generate`; the trajectory is one growing
   sequence, so turn k's `token_ids` must extend turn k-1's `seqs[0]` (append feedback to it,
   as the seeds do): the ids in between get loss mask 0, the generated ones mask 1 and their
   logprobs, exactly as the engine produced them;
4. turn k's reward is the sum of the first rewards of the env steps taken after its
   generation. `collect_trajectory` may return None; AReaL's own return value, a list of
   samples with one per turn (`SequenceSample`s or dicts, each with `rewards`: its reward after
   the agent's shaping), whose rewards replace the turns'; or a dict with any of `rewards` (one
   per turn, replacing those), `success` (bool) and `info` (merged into the trajectory's info).
   Anything else it returns is dropped with a one-line warning (once per process) saying so.
`success` is otherwise the last step's `info["success"]`, else whether its reward was > 0.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agents.loop import TurnAgent, turn_sampling
from agentrl.agents.seed_api import (  # noqa: F401  (re-exported)
    Agent,
    BundledGenerationOutputs,
    GenerationConfig,
    GenerationHyperparameters,
    GenerationOutput,
    SeedPrompt,
    SequenceSample,
    is_seed_agent,
)
from agentrl.agents.seed_data import SeedRow
from agentrl.envs.base import Env
from agentrl.envs.contract import is_finite_number
from agentrl.errors import ConfigError, EnvError, contained
from agentrl.llm.conversation import Conversation, TokenBudget, completion_versions
from agentrl.llm.engine import Completion, LLMClient, SamplingParams
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Task, TokenRecord, Trajectory


@dataclass
class _Record:
    """A seed-style episode: its token record, the context each turn acted on, the last step."""

    tokens: TokenRecord = field(default_factory=TokenRecord)
    states: list[str] = field(default_factory=list)
    last_step: tuple[float, dict] | None = None

    @property
    def rewards(self) -> list[float]:
        return self.tokens.rewards

    def add_turn(self, prompt: list[int], completion: Completion) -> None:
        n = len(self.tokens.token_ids)
        if prompt[:n] != self.tokens.token_ids:
            raise EnvError(f"seed-style agent: turn {len(self.rewards)}'s token_ids do not extend the previous "
                           "turn's act.seqs[0]; an episode is one growing sequence (append feedback to it)")
        self.tokens.append_prompt(prompt[n:])
        self.tokens.append_generated(list(completion.token_ids), completion.logprobs, completion_versions(completion))
        self.states.append(",".join(map(str, prompt)))  # the exact context the turn acted on


class _EnvView:
    """The env as the seed agent sees it: `reset` returns the first observation again, `step`
    is the env's own, with its rewards recorded for the latest turn."""

    def __init__(self, env: Env, first: tuple[Any, dict], record: _Record) -> None:
        self._env, self._first, self._record = env, first, record

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self._first

    async def step(self, action: Any) -> tuple:
        out = await self._env.step(action)
        if not self._record.rewards:
            raise EnvError("seed-style agent stepped its env before generating anything")
        rewards, info = out[1], (out[4] if len(out) > 4 and isinstance(out[4], dict) else {})
        first = rewards[0] if isinstance(rewards, (list, tuple)) else rewards
        self._record.tokens.add_turn_reward(float(first))
        self._record.last_step = (float(first), info)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class SeedAgentAdapter(TurnAgent):
    """Our agent contract around a seed-style agent: queues in, a token-exact Trajectory out."""

    per_answer_rewards = True  # its env's step returns one reward per answer (the collector checks that)

    def __init__(self, agent: Any, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 rows: Sequence[SeedRow] = (), dataset_hint: str = "env.args.dataset_path") -> None:
        super().__init__(tokenizer, sampling, max_turns, system_prompt, budget)
        self.agent = agent
        self.rows = tuple(rows)  # the dataset's prompts, for envs whose reset gives no question
        self.dataset_hint = dataset_hint  # the setting that names the dataset, for the error message

    @classmethod
    def from_class(cls, agent_cls: type, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                   system_prompt: str | None = None, budget: TokenBudget | None = None,
                   args: dict | None = None, where: str = "agent", rows: Sequence[SeedRow] = (),
                   dataset_hint: str = "env.args.dataset_path") -> SeedAgentAdapter:
        """Build the user's class with the arguments its constructor names among `gconfig`,
        `tokenizer`, `tokenizer_path` (a folder `AutoTokenizer.from_pretrained` loads),
        `num_turns`, plus `args`."""
        params = inspect.signature(agent_cls).parameters
        offered = {"gconfig": gconfig_of(sampling), "tokenizer": tokenizer,
                   "tokenizer_path": getattr(tokenizer, "name_or_path", None), "num_turns": max_turns}
        kwargs = {k: v for k, v in offered.items() if k in params}
        kwargs.update(args or {})
        missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            raise ConfigError(f"{where}: {agent_cls.__name__} needs argument '{missing[0]}'; set {where}.args."
                              f"{missing[0]} (offered: {', '.join(offered)})")
        try:
            agent = agent_cls(**kwargs)
        except Exception as e:  # the user's constructor: one line naming the class and the cause
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"{where}: building {agent_cls.__name__}({', '.join(kwargs)}) raised "
                              f"{type(e).__name__}: {first}") from None
        return cls(agent, tokenizer, sampling, max_turns, system_prompt, budget, rows, dataset_hint)

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory:
        """Run the seed agent's `collect_trajectory`, serving its queue requests with `llm`."""
        obs, reset_info = await env.reset(seed=task.env_seed)
        reset_info = reset_info if isinstance(reset_info, dict) else {}
        if obs is None and self.rows:  # AReaL's way: the question comes from the dataset
            row = self.rows[task.env_seed % len(self.rows)]
            question, qid = row.question, str(reset_info.get("qid", row.qid))
        elif isinstance(obs, str):
            question, qid = obs, str(reset_info.get("qid", task.env_seed))
        elif obs is None:
            raise EnvError(f"seed-style env {type(getattr(env, '_env', env)).__name__}.reset() gave no question "
                           f"(None) and there is no dataset: set {self.dataset_hint} to a JSONL/Parquet/CSV file "
                           "with a question (or prompt) column, or return the question text from reset()")
        else:
            raise EnvError(f"seed-style env reset() must return the question text (or None, with a dataset) as "
                           f"its observation, got {type(obs).__name__}")
        conv = Conversation(self.tokenizer)
        if self.system_prompt:
            conv.add_message("system", self.system_prompt)
        instructions = getattr(env, "instructions", "")
        conv.add_message("user", f"{instructions}\n{question}" if instructions else question)
        record = _Record()
        prompt = SequenceSample.prompt(qid, conv.prompt_ids(), question)
        obs_queue: asyncio.Queue = asyncio.Queue()
        act_queue: asyncio.Queue = asyncio.Queue()
        # The agent runs in a task of its own: its sys.exit must fail the episode, not leave the loop.
        runner = asyncio.ensure_future(contained(self.agent.collect_trajectory(
            prompt, _EnvView(env, (obs, reset_info), record), obs_queue, act_queue)))
        reason: str | None = None
        try:
            reason = await self._serve(task, llm, runner, obs_queue, act_queue, record)
            result = runner.result() if reason is None else None
        finally:
            if not runner.done():
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
        return self._trajectory(task, record, result, reason)

    async def _serve(self, task: Task, llm: LLMClient, runner: asyncio.Future, obs_queue: asyncio.Queue,
                     act_queue: asyncio.Queue, record: _Record) -> str | None:
        """Answer the agent's requests until it returns (None) or a limit stops it (the reason)."""
        while True:
            request = asyncio.ensure_future(obs_queue.get())
            await asyncio.wait({runner, request}, return_when=asyncio.FIRST_COMPLETED)
            if runner.done():
                request.cancel()
                return None
            item = request.result()
            if not (isinstance(item, (tuple, list)) and len(item) == 3
                    and isinstance(item[1], (list, tuple)) and all(isinstance(t, int) for t in item[1])):
                raise EnvError(f"seed-style agent put {type(item).__name__} {str(item)[:60]!r} on obs_queue; "
                               "expected a (qid, token_ids: list of ints, gconfig) tuple")
            qid, token_ids, gconfig = item
            turn = len(record.rewards)
            if turn >= self.max_turns:
                return "max_turns"
            if getattr(gconfig, "n", 1) != 1:
                raise EnvError(f"seed-style agent asked for gconfig.n={gconfig.n}; one answer per request is "
                               "supported (run a group of episodes instead)")
            token_ids = list(token_ids)
            max_new, stop = self.budget.allowance(len(token_ids), record.tokens.num_generated,
                                                  getattr(gconfig, "max_new_tokens", self.sampling.max_new_tokens))
            if stop:
                return stop
            completion = await llm.generate(token_ids, self._sampling(gconfig, task, turn, max_new))
            record.add_turn(token_ids, completion)
            versions = completion.versions or [completion.policy_version]
            await act_queue.put(GenerationOutput(
                qid=qid, prompt_ids=token_ids, output_ids=[list(completion.token_ids)],
                seqs=[token_ids + list(completion.token_ids)], logprobs=[list(completion.logprobs)],
                no_eos=[completion.finish_reason != "stop"], version_start=[min(versions)],
                version_end=[max(versions)]))

    def _sampling(self, gconfig: Any, task: Task, turn: int, max_new: int) -> SamplingParams:
        base = replace(self.sampling, temperature=getattr(gconfig, "temperature", self.sampling.temperature),
                       top_p=getattr(gconfig, "top_p", self.sampling.top_p),
                       top_k=getattr(gconfig, "top_k", self.sampling.top_k),
                       greedy=bool(getattr(gconfig, "greedy", False)) or self.sampling.greedy)
        return turn_sampling(base, task, turn, max_new)

    def _trajectory(self, task: Task, record: _Record, result: Any, reason: str | None) -> Trajectory:
        if not record.rewards:
            raise EnvError("seed-style agent finished without asking for a single generation")
        info: dict = {}
        if isinstance(result, dict):
            if "rewards" in result:
                bad = [r for r in result["rewards"] if not is_finite_number(r)]
                if bad:  # float("1.0") or a NaN would pass silently into the advantages
                    raise EnvError(f"seed-style agent returned rewards {result['rewards']!r}; expected finite numbers, "
                                   f"got {bad[0]!r}")
                rewards = [float(r) for r in result["rewards"]]
                if len(rewards) != len(record.rewards):
                    raise EnvError(f"seed-style agent returned {len(rewards)} rewards for {len(record.rewards)} turns")
                record.tokens.set_rewards(rewards)
            info.update(result.get("info") or {})
        elif isinstance(result, (list, tuple)) and result:
            sampled = [_sample_reward(x) for x in result]
            found = [r for r in sampled if r is not None]
            if len(found) == len(sampled) == len(record.rewards):
                record.tokens.set_rewards(found)  # AReaL's samples, one per turn, carry the agent's reward shaping
            else:
                reason_text = (f"{len(result)} samples for {len(record.rewards)} turns" if len(found) == len(sampled)
                               else "samples without a 'rewards' entry")
                warn_once(f"{type(self.agent).__name__}.collect_trajectory returned {reason_text}: their rewards "
                          "are dropped and the env steps' rewards are used; return one sample per turn with "
                          "'rewards', or a dict {'rewards': [one per turn]}")
        elif result is not None and not isinstance(result, (list, tuple)):
            warn_once(f"{type(self.agent).__name__}.collect_trajectory returned a {type(result).__name__}, which "
                      "is dropped (the env steps' rewards are used); return None, a list of samples with "
                      "'rewards' (one per turn) or a dict with 'rewards'/'success'/'info'")
        if isinstance(result, dict) and "success" in result:
            success = bool(result["success"])
        elif record.last_step is not None:
            reward, step_info = record.last_step
            success = bool(step_info["success"]) if "success" in step_info else reward > 0
        else:
            success = False
        return Trajectory.from_record(record.tokens, task, record.states, success=success,
                                      terminated=reason is None, truncation_reason=reason, info=info)


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Print `agentrl: warning: message` on stderr, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"agentrl: warning: {message}", file=sys.stderr, flush=True)


def _sample_reward(sample: Any) -> float | None:
    """The (first) reward of one returned sample: a SequenceSample's data['rewards'], a dict's
    'rewards' (or 'reward'), or a `rewards` attribute; None when it carries none."""
    if isinstance(sample, Mapping):
        value = sample.get("rewards", sample.get("reward"))
    elif isinstance(getattr(sample, "data", None), Mapping):
        value = sample.data.get("rewards", sample.data.get("reward"))
    else:
        value = getattr(sample, "rewards", None)
    if hasattr(value, "tolist"):  # a tensor or an array
        value = value.tolist()
    while isinstance(value, (list, tuple)):
        if not value:
            return None
        value = value[0]
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def gconfig_of(sampling: SamplingParams) -> GenerationConfig:
    """The GenerationConfig a seed agent is built with, from the run's sampling settings."""
    return GenerationConfig(max_new_tokens=sampling.max_new_tokens, greedy=sampling.greedy,
                            top_p=sampling.top_p, top_k=sampling.top_k, temperature=sampling.temperature)
