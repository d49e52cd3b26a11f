"""The policy model of a run, built after every model-free check (preflight.py): a local Hugging
Face model (model.path), or the embedded default, whose recipe is here: a tokenizer trained on
every env's text and a tiny model warm-started on demonstrations of every tag, in the proportions
of the training batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.models.embedded import check_tokenizer, fingerprint, load_embedded, tokenizer_folder
from agentrl.models.loading import load_pretrained
from agentrl.rollout.collector import check_failed
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.build.envs import agent_texts, check_templates, make_budget, make_collector
from agentrl.runtime.build.plan_types import RunPlan
from agentrl.runtime.build.seeds import demo_factories, seed_texts
from agentrl.runtime.process import kept_threads, pin_threads
from agentrl.tokenizer import Tokenizer


def build_policy(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the run whose plan (every model-free check passed) is `run_plan`;
    from here on this process computes with the run's torch threads (the warm start included)."""
    pin_threads(run_plan.runtime.num_threads)
    model, tokenizer = load_policy(run_plan, log, tokenizer)
    check_templates(run_plan, tokenizer)
    return model, tokenizer


def model_context(model: Any) -> int:
    """The longest sequence the model takes."""
    return int(getattr(model.config, "max_position_embeddings", 4096))


def model_vocab(model: Any) -> int:
    """The number of token ids the model embeds (what the engine samples from)."""
    return int(model.config.get_text_config().vocab_size)


def load_policy(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default
    (whose tokenizer's `name_or_path` is a tokenizer folder, for seed agents' `tokenizer_path`);
    a given `tokenizer` replaces the folder's (and the tiny default is built on it). The plan's
    envs demonstrate the warm start."""
    m = run_plan.model
    if m.path:
        model, loaded = load_pretrained(m.path, m.dtype)
        if tokenizer is None:
            return model, loaded
        folder = Path(run_plan.cache_dir) / f"tokenizer-{fingerprint(tokenizer)}"  # a tokenizer held in memory only
        return model, tokenizer_folder(check_tokenizer(tokenizer, model), folder)
    # The warm start computes on the run's threads, whoever calls (its cache key holds the count).
    with kept_threads(run_plan.runtime.num_threads):
        return load_embedded(Path(run_plan.warm_start_cache), m.dtype,
                             lambda folder: build_tiny(run_plan, log, tokenizer, folder), log, tokenizer)


def build_tiny(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None,
               tokenizer_dir: Path | None = None) -> tuple[Any, Any]:
    """Train the tokenizer on every env of the run (unless one is given), build the tiny model and
    warm-start it on demonstrations of every tag that can give them, in the proportions of the
    training batches."""
    from agentrl.models.tiny import build_model, build_tokenizer
    from agentrl.rollout.demos import ScriptedClient, corpus
    from agentrl.train.warm_start import warm_start

    r, m = run_plan.rollout, run_plan.model

    def texts():
        for t in run_plan.tags:
            yield from corpus(run_plan.factories[t.tag], max_turns=t.max_turns, seed=run_plan.seed,
                              step=not t.seed_style, timeout=r.episode_timeout,
                              max_failed_fraction=r.max_failed_fraction, name=f"tag {t.tag}")
        yield from agent_texts(run_plan)
        yield from seed_texts(run_plan)

    if tokenizer is None:
        # Played here, before training starts: tokenizers pulls an iterator from its own threads,
        # where the wait on the envs' random play could not take a Ctrl-C.
        tokenizer = build_tokenizer(list(texts()), m.tiny.vocab_size)
    if tokenizer_dir is not None:
        tokenizer_folder(tokenizer, tokenizer_dir)  # seed agents load theirs from tokenizer_path
    model = build_model(m.tiny, tokenizer, seed=run_plan.seed)
    shown = demo_factories(run_plan, log)
    mix = [t for t in run_plan.train_groups if t in shown]
    if not mix:
        log("warm start skipped: no env of this run can demonstrate a reply (no sample_action, no dataset answers)")
        return model.eval(), tokenizer
    client = ScriptedClient(tokenizer)
    budget = make_budget(run_plan, model_context(model))
    # Demonstrations play the user's envs as training does: timeouts, retries, failures recorded.
    # A tag whose agent offers tools is demonstrated calling them, where its env shows how.
    offered = {t.tag: tool_names(t.agent_args) for t in run_plan.tags}
    collector = make_collector(run_plan, tokenizer, client, budget, model_vocab(model),
                               factories={tag: client.wrap(f, offered[tag]) for tag, f in shown.items()})
    ws = m.warm_start
    demo_tags = [mix[i * len(mix) // ws.batch_size] for i in range(ws.batch_size)]  # the batch's mix

    failed: list[str] = []  # every failed attempt of a demonstration, said once at the end

    played: dict[int, tuple[list, float]] = {}  # the demo_pool's batches, by the step that played them

    def demos(step: int):
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

    stats = warm_start(model, demos, ws, tokenizer.pad_token_id, log)
    left_out = f"; {len(failed)} demonstration attempts failed (first: {failed[0]})" if failed else ""
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f}){left_out}")
    return model, tokenizer


def tool_names(agent_args: dict[str, Any]) -> tuple[str, ...]:
    """The tools an agent's args offer (`tools`, the tool agent's), or none."""
    tools = agent_args.get("tools")
    return tuple(t for t in tools if isinstance(t, str)) if isinstance(tools, (list, tuple)) else ()
