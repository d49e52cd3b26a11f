"""The recipe of the embedded default policy: a tokenizer trained on every env's text and a tiny
model warm-started on demonstrations of every tag, in the proportions of the training batches;
cached by models/embedded.py under the key of everything it depends on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.models.embedded import load_embedded, tokenizer_folder
from agentrl.models.tiny import build_model, build_tokenizer
from agentrl.rollout.collector import check_failed
from agentrl.rollout.demos import ScriptedClient, corpus
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.assembly.envs import agent_texts, make_budget, make_collector
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.process import kept_threads
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Trajectory
from agentrl.warm_start.fit import warm_start
from agentrl.warm_start.seeds import demo_factories, seed_texts


def embedded_policy(run_plan: RunPlan, log: Callable[[str], None],
                    tokenizer: Tokenizer | None = None) -> tuple[Any, Tokenizer]:
    """(model, tokenizer) of the embedded default: the one cached at the plan's warm_start_cache,
    else built and warm-started here (on `tokenizer` when one is given) and cached first."""
    assert run_plan.warm_start_cache is not None, "a plan without model.path names its warm-start cache"
    # The warm start computes on the run's threads, whoever calls (its cache key holds the count).
    with kept_threads(run_plan.runtime.num_threads):
        return load_embedded(Path(run_plan.warm_start_cache), run_plan.model.dtype,
                             lambda folder: build_tiny(run_plan, log, tokenizer, folder), log, tokenizer)


def build_tiny(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None,
               tokenizer_dir: Path | None = None) -> tuple[Any, Tokenizer]:
    """Train the tokenizer on every env of the run (unless one is given), build the tiny model and
    warm-start it on demonstrations of every tag that can give them, in the proportions of the
    training batches."""
    r, m = run_plan.rollout, run_plan.model

    def texts() -> Iterator[str]:
        for t in run_plan.tags:
            yield from corpus(run_plan.factories[t.tag], max_turns=t.max_turns, seed=run_plan.seed,
                              step=not t.seed_style, timeout=r.episode_timeout,
                              max_failed_fraction=r.max_failed_fraction, name=f"tag {t.tag}")
        yield from agent_texts(run_plan)
        yield from seed_texts(run_plan)

    tok: Any = tokenizer  # a user's (any transformers tokenizer), or the one trained here
    if tok is None:
        # Played here, before training starts: tokenizers pulls an iterator from its own threads,
        # where the wait on the envs' random play could not take a Ctrl-C.
        tok = build_tokenizer(list(texts()), m.tiny.vocab_size)
    if tokenizer_dir is not None:
        tokenizer_folder(tok, tokenizer_dir)  # seed agents load theirs from tokenizer_path
    model = build_model(m.tiny, tok, seed=run_plan.seed)
    shown = demo_factories(run_plan, log)
    mix = [t for t in run_plan.train_groups if t in shown]
    if not mix:
        log("warm start skipped: no env of this run can demonstrate a reply (no sample_action, no dataset answers)")
        return model.eval(), tok
    client = ScriptedClient(tok)
    budget = make_budget(run_plan, int(getattr(model.config, "max_position_embeddings", 4096)))
    # Demonstrations play the user's envs as training does: timeouts, retries, failures recorded.
    # A tag whose agent offers tools is demonstrated calling them, where its env shows how.
    offered = {t.tag: tool_names(t.agent_args) for t in run_plan.tags}
    collector = make_collector(run_plan, tok, client, budget, int(model.config.get_text_config().vocab_size),
                               factories={tag: client.wrap(f, offered[tag]) for tag, f in shown.items()})
    ws = m.warm_start
    demo_tags = [mix[i * len(mix) // ws.batch_size] for i in range(ws.batch_size)]  # the batch's mix

    failed: list[str] = []  # every failed attempt of a demonstration, said once at the end

    played: dict[int, tuple[list[Trajectory], float]] = {}  # the demo_pool's batches, by the step that played them

    def demos(step: int) -> tuple[list[Trajectory], float]:
        if ws.demo_pool and step > ws.demo_pool:
            return played[(step - 1) % ws.demo_pool + 1]
        tasks = TaskSource(run_plan.seed, 1, ()).demonstrations(step, demo_tags)
        client.reset_entropy()
        result = collector.collect(tasks)
        check_failed(result, r.max_failed_fraction, f"warm start step {step}: demonstrations")
        failed.extend(result.errors)
        # TODO: the entropy floor also counts replies of failed episodes (rare; it only nudges when to stop).
        if ws.demo_pool:
            played[step] = (result.trajectories, client.reply_entropy)
        return result.trajectories, client.reply_entropy

    stats = warm_start(model, demos, ws, tok.pad_token_id, log)
    left_out = f"; {len(failed)} demonstration attempts failed (first: {failed[0]})" if failed else ""
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f}){left_out}")
    return model, tok


def tool_names(agent_args: dict[str, Any]) -> tuple[str, ...]:
    """The tools an agent's args offer (`tools`, the tool agent's), or none."""
    tools = agent_args.get("tools")
    return tuple(t for t in tools if isinstance(t, str)) if isinstance(tools, (list, tuple)) else ()
