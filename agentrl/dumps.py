"""Trajectory dumps: a chosen step's training batch, token by token, in the run folder.

`trainer.dump_trajectories_freq=N` writes `dumps/step_<N>.json.gz` every N steps (and at the
last one): per episode the ids exactly as trained, the loss mask, and on the generated ids the
behaviour / proximal (trainer) / reference logprobs, advantage, return, critic value and the
policy version that wrote each id; turn ends and rewards; group, tag and outcome; and where the
agent recorded them (`info["tool_spans"]`, the tool agent's), the spans of its tool calls and
their answers. Each file also holds the decoded piece of every id it uses, from the run's
tokenizer, for display only.

Bounded: whole groups are kept, in batch order, while the step's tokens stay within
`trainer.dump_max_tokens`; a group that would cross the bound is left out (the first one is cut
to it). Numbers are rounded to 4 decimals and the JSON is gzipped. Files are written atomically
(temporary name, then rename); a resumed run removes the dumps past the step it resumes from,
and rewrites the ones it replays under the same names.

It imports nothing of torch: tensors are read through `.tolist()`, so `agentrl view` stays light.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.atomic import write_atomic
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Trajectory

if TYPE_CHECKING:
    from agentrl.train.batch import Batch

DUMPS_DIR = "dumps"
FORMAT = 1
_NAME = re.compile(r"^step_(\d+)\.json\.gz$")


def dump_path(run_dir: str | Path, step: int) -> Path:
    """Where the dump of `step` lives."""
    return Path(run_dir) / DUMPS_DIR / f"step_{step:06d}.json.gz"


def list_dumps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete dump of a run, oldest step first."""
    folder = Path(run_dir) / DUMPS_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def read_dump(path: str | Path) -> dict[str, Any]:
    """The content of one dump file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def cut_dumps(run_dir: str | Path, after_step: int) -> int:
    """Remove dumps of steps past `after_step` (a resume replays them); returns how many."""
    removed = 0
    for step, path in list_dumps(run_dir):
        if step > after_step:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _r(values: Iterable[float]) -> list[float | None]:
    """Rounded to 4 decimals (logprob gaps of 1e-3 stay visible; more digits only cost bytes);
    a non-finite number becomes null (strict JSON has no NaN)."""
    return [round(float(v), 4) if math.isfinite(v) else None for v in values]


def select_groups(trajs: Sequence[Trajectory], max_tokens: int) -> list[int]:
    """Indices of the episodes kept: whole groups in batch order while their tokens fit
    `max_tokens` (the first group always, its episodes cut to the bound by the writer)."""
    order: dict[int, list[int]] = {}
    for i, t in enumerate(trajs):
        order.setdefault(t.group_id, []).append(i)
    kept: list[int] = []
    used = 0
    for members in order.values():
        size = sum(len(trajs[i].token_ids) for i in members)
        if kept and used + size > max_tokens:
            break
        kept.extend(members)
        used += size
    return kept


class TrajectoryDumper:
    """Writes the dumps of one run (keeps the decoded piece of each id seen, for later steps)."""

    def __init__(self, run_dir: str | Path, tokenizer: Tokenizer, max_tokens: int) -> None:
        self.folder = Path(run_dir) / DUMPS_DIR
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._pieces: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        """The text of one id, decoded alone (display only: training never re-encodes it)."""
        if token_id not in self._pieces:
            self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._pieces[token_id]

    def write(self, step: int, trajs: Sequence[Trajectory], batch: Batch, policy_version: int,
              estimator: str) -> Path:
        """Dump `trajs` (the rows of `batch`, in order) as trained at `step`; returns the file."""
        assert batch.size == len(trajs), "the batch rows must be the trajectories, in order"
        kept = select_groups(trajs, self.max_tokens)
        columns = {name: getattr(batch, attr).tolist() if getattr(batch, attr) is not None else None
                   for name, attr in (("lp", "behaviour_logprobs"), ("old", "old_logprobs"),
                                      ("ref", "ref_logprobs"), ("adv", "advantages"), ("ret", "returns"),
                                      ("val", "values"))}
        episodes, used = [], 0
        for i in kept:
            room = self.max_tokens - used
            if room <= 0:
                break
            episodes.append(self._episode(trajs[i], i, columns, room))
            used += len(episodes[-1]["ids"])
        ids = sorted({x for e in episodes for x in e["ids"]})
        record = {"format": FORMAT, "step": step, "policy_version": policy_version, "estimator": estimator,
                  "episodes_total": len(trajs), "groups_total": len({t.group_id for t in trajs}),
                  "tokens_total": sum(len(t.token_ids) for t in trajs), "tokens_kept": used,
                  "max_tokens": self.max_tokens, "pieces": {str(x): self.piece(x) for x in ids},
                  "episodes": episodes}
        path = dump_path(self.folder.parent, step)
        _atomic_write_gz(path, json.dumps(record, separators=(",", ":"), allow_nan=False))
        return path

    def _episode(self, t: Trajectory, row: int, columns: dict[str, list | None], room: int) -> dict[str, Any]:
        n = min(len(t.token_ids), room)
        gen = [k for k in range(n) if t.loss_mask[k]]
        ep: dict[str, Any] = {
            "group": t.group_id, "env_seed": t.env_seed, "tag": t.tag, "success": bool(t.success),
            "terminated": bool(t.terminated), "truncation_reason": t.truncation_reason,
            "reward": _r([t.total_reward])[0], "rewards": _r(t.rewards), "reward_positions": list(t.reward_positions),
            "invalid_actions": t.invalid_actions, "truncated_replies": t.truncated_replies,
            "ids": list(t.token_ids[:n]), "mask": "".join("1" if m else "0" for m in t.loss_mask[:n]),
            "ver": [t.versions[k] for k in gen],
        }
        if t.role:
            ep["role"] = t.role  # the seat of a game this sequence played (agents/game.py)
        if n < len(t.token_ids):
            ep["cut_at"] = n  # the episode was longer than the step's bound
        tools = tool_spans(t.info.get("tool_spans"), n)
        if tools:
            ep["tools"] = tools
        for name, rows in columns.items():
            if rows is not None:
                values = rows[row]
                ep[name] = _r(values[k] for k in gen)  # per generated id only: the rest carry nothing
        return ep


def tool_spans(spans: Any, n: int) -> list[list]:
    """The well-formed `[start, end, kind, name]` entries of an agent's `info["tool_spans"]` (kind
    `call` or `answer`) that begin within the first `n` ids, cut at `n`: display only, so an
    agent's odd entry is left out rather than failing the dump."""
    out = []
    for span in spans if isinstance(spans, list) else []:
        if (isinstance(span, (list, tuple)) and len(span) == 4 and all(type(x) is int for x in span[:2])
                and span[2] in ("call", "answer") and isinstance(span[3], str) and 0 <= span[0] < min(span[1], n)):
            out.append([span[0], min(span[1], n), span[2], span[3]])
    return out


def _atomic_write_gz(path: Path, text: str) -> None:
    """Write gzipped `text` so that readers see a whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as f:  # mtime 0: the same step, the same bytes
        f.write(text.encode("utf-8"))
    write_atomic(path, buf.getvalue())
