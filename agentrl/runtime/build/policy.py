"""The policy model of a run, built after every model-free check (preflight.py): a local Hugging
Face model (model.path), or the embedded default, whose recipe is here: a tokenizer trained on
every env's text and a tiny model warm-started on demonstrations of every tag, in the proportions
of the training batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.models.embedded import cache_root, check_tokenizer, fingerprint, load_embedded, tokenizer_folder
from agentrl.models.loading import load_pretrained
from agentrl.rollout.collector import check_failed
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.build.envs import agent_texts, check_templates, is_seed_tag, make_budget, make_collector
from agentrl.runtime.build.seeds import demo_factories, seed_texts
from agentrl.runtime.plan import RunPlan, plan
from agentrl.runtime.process import kept_threads, pin_threads


def build_policy(cfg: Config, log: Callable[[str], None], tokenizer: Any = None,
                 run_plan: RunPlan | None = None) -> tuple[Any, Any, RunPlan]:
    """(model, tokenizer, the run's plan), after every check that needs no model (the plan is
    made here unless the caller made it); from here on this process computes with the run's
    torch threads (the warm start included)."""
    pin_threads(cfg.runtime.num_threads)
    if run_plan is None:
        run_plan = plan(cfg, tokenizer)  # every model-free check, before the model is built or warm-started
    model, tokenizer = load_policy(cfg, run_plan, log, tokenizer)
    check_templates(cfg, tokenizer)
    return model, tokenizer, run_plan


def model_context(model: Any) -> int:
    """The longest sequence the model takes."""
    return int(getattr(model.config, "max_position_embeddings", 4096))


def model_vocab(model: Any) -> int:
    """The number of token ids the model embeds (what the engine samples from)."""
    return int(model.config.get_text_config().vocab_size)


def load_policy(cfg: Config, run_plan: RunPlan, log: Callable[[str], None],
                tokenizer: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default
    (whose tokenizer's `name_or_path` is a tokenizer folder, for seed agents' `tokenizer_path`);
    a given `tokenizer` replaces the folder's (and the tiny default is built on it). `run_plan`
    is the plan of `cfg` (runtime/plan.py): its envs demonstrate the warm start."""
    if cfg.model.path:
        model, loaded = load_pretrained(cfg.model.path, cfg.model.dtype)
        if tokenizer is None:
            return model, loaded
        folder = cache_root(cfg) / f"tokenizer-{fingerprint(tokenizer)}"  # for a tokenizer held in memory only
        return model, tokenizer_folder(check_tokenizer(tokenizer, model), folder)
    # The warm start computes on the run's threads, whoever calls (its cache key holds the count).
    with kept_threads(cfg.runtime.num_threads):
        return load_embedded(cfg, lambda folder: build_tiny(cfg, run_plan, log, tokenizer, folder), log, tokenizer)


def build_tiny(cfg: Config, run_plan: RunPlan, log: Callable[[str], None], tokenizer: Any = None,
               tokenizer_dir: Path | None = None) -> tuple[Any, Any]:
    """Train the tokenizer on every env of the run (unless one is given), build the tiny model and
    warm-start it on demonstrations of every tag that can give them, in the proportions of the
    training batches."""
    from agentrl.models.tiny import build_model, build_tokenizer
    from agentrl.rollout.demos import ScriptedClient, corpus
    from agentrl.train.warm_start import warm_start

    turns = {t.tag: t.max_turns for t in run_plan.tags}

    def texts():
        for tag, make_env in run_plan.factories.items():
            yield from corpus(make_env, max_turns=turns[tag], seed=cfg.seed,
                              step=not is_seed_tag(cfg, tag), timeout=cfg.rollout.episode_timeout,
                              max_failed_fraction=cfg.rollout.max_failed_fraction, name=f"tag {tag}")
        yield from agent_texts(cfg)
        yield from seed_texts(cfg)

    if tokenizer is None:
        # Played here, before training starts: tokenizers pulls an iterator from its own threads,
        # where the wait on the envs' random play could not take a Ctrl-C.
        tokenizer = build_tokenizer(list(texts()), cfg.model.tiny.vocab_size)
    if tokenizer_dir is not None:
        tokenizer_folder(tokenizer, tokenizer_dir)  # seed agents load theirs from tokenizer_path
    model = build_model(cfg.model.tiny, tokenizer, seed=cfg.seed)
    shown = demo_factories(cfg, run_plan.factories, log)
    plan = [t for t in run_plan.train_groups if t in shown]
    if not plan:
        log("warm start skipped: no env of this run can demonstrate a reply (no sample_action, no dataset answers)")
        return model.eval(), tokenizer
    client = ScriptedClient(tokenizer)
    budget = make_budget(cfg, model_context(model))
    # Demonstrations play the user's envs as training does: timeouts, retries, failures recorded.
    collector = make_collector(cfg, tokenizer, shown, client, budget, model_vocab(model), wrap=client.wrap)
    ws = cfg.model.warm_start
    demo_tags = [plan[i * len(plan) // ws.batch_size] for i in range(ws.batch_size)]  # the batch's mix

    failed: list[str] = []  # every failed attempt of a demonstration, said once at the end

    def demos(step: int):
        tasks = TaskSource(cfg.seed, 1, ()).demonstrations(step, demo_tags)
        client.reset_entropy()
        result = collector.collect(tasks)
        check_failed(result, cfg.rollout.max_failed_fraction, f"warm start step {step}: demonstrations")
        failed.extend(result.errors)
        # TODO: the entropy floor also counts replies of failed episodes (rare; it only nudges when to stop).
        return result.trajectories, client.reply_entropy

    stats = warm_start(model, demos, ws, tokenizer.pad_token_id, log)
    left_out = f"; {len(failed)} demonstration attempts failed (first: {failed[0]})" if failed else ""
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f}){left_out}")
    return model, tokenizer
