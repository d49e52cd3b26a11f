"""What the embedded default model needs to serve seed-style (AReaL legacy) agents.

- A tokenizer folder: seed agents load their own tokenizer from `tokenizer_path` (seed 001
  passes `tokenizer_path=self.actor.path`), so the tokenizer the run uses is saved to a folder
  holding only the tokenizer (`AutoTokenizer.from_pretrained` then keeps the file's pipeline
  exactly; a model folder's config.json could make it pick another class), and its
  `name_or_path` names that folder.
- Text for the tokenizer: the questions and answers of a seed tag's dataset.
- Warm-start demonstrations: the warm start answers each turn with the env's `sample_action`.
  A seed env without one, whose tag has a dataset, demonstrates with a random answer of that
  dataset as the reply (as `MathEnv.sample_action` does with a file's rows); a tag with neither
  gets no demonstrations (and when no tag has any, the warm start is skipped), said in the log.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.runtime.envs import is_seed_tag, seed_rows

MAX_CORPUS_ROWS = 2000  # dataset rows read into the tiny tokenizer's corpus per tag


def tokenizer_folder(tokenizer: Any, folder: Path, keep_own: bool = True) -> Any:
    """Give `tokenizer` a folder `AutoTokenizer.from_pretrained` loads (saved there once) unless
    `keep_own` and its `name_or_path` already is one; returns the tokenizer."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if keep_own and name and Path(name).is_dir():
        return tokenizer
    if not (folder / "tokenizer_config.json").is_file():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote it first: theirs is the same tokenizer
            shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.name_or_path = str(folder)
    return tokenizer


def fingerprint(tokenizer: Any) -> str:
    """A short hash of a tokenizer's vocabulary, special tokens and chat template (cache keys)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    text += repr(getattr(tokenizer, "chat_template", None)) + repr(tokenizer.all_special_tokens)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_tokenizer(tokenizer: Any, model: Any) -> Any:
    """A user-given tokenizer must fit the model's embedding; pad falls back to EOS."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ConfigError(f"tokenizer= has {len(tokenizer)} tokens but the model's embedding has {rows} rows; "
                          "pass the tokenizer of model.path (or none)")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("tokenizer= has no chat template; agents need one (set tokenizer.chat_template)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def seed_texts(cfg: Config) -> list[str]:
    """Questions and answers of the seed tags' datasets, as corpus lines."""
    out = []
    for tag in cfg.env_definitions():
        if is_seed_tag(cfg, tag):
            for row in seed_rows(cfg, tag)[:MAX_CORPUS_ROWS]:
                out += [f"user\n{row.question}", "assistant"] + ([row.answer] if row.answer else [])
    return out


class _Demonstrating:
    """A seed env with a `sample_action` drawn from its dataset's answers (warm start only)."""

    def __init__(self, env: Any, answers: list[str]) -> None:
        self._env, self._answers = env, answers

    def sample_action(self, rng: random.Random) -> str:
        return rng.choice(self._answers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def demo_factories(cfg: Config, factories: dict[str, Callable[[], Any]],
                   log: Callable[[str], None]) -> dict[str, Callable[[], Any]]:
    """The tags that can be demonstrated in the warm start, with env factories whose envs all
    have `sample_action`; the others are named in the log."""
    out = {}
    for tag, make_env in factories.items():
        env = make_env()
        has_sample = callable(getattr(env, "sample_action", None))
        close = getattr(env, "close", None)
        if callable(close):
            close()
        if has_sample:
            out[tag] = make_env
            continue
        answers = sorted({r.answer for r in seed_rows(cfg, tag) if r.answer}) if is_seed_tag(cfg, tag) else []
        if answers:
            log(f"warm start: tag {tag}: the env has no sample_action; replies are random answers of its dataset")
            out[tag] = (lambda f=make_env, a=answers: _Demonstrating(f(), a))
        else:
            log(f"warm start: tag {tag} is not demonstrated (its env has no sample_action and no dataset answers)")
    return out
