"""Dataset rows as the prompts of seed-style agents (AReaL took the question from its dataset).

A seed-style env whose `reset` returns no question (`(None, {})`, seed 001's
`MathCodeSingleStepEnv`) is built with `args.dataset_path`, as in seed 000's
`EnvServiceAbstraction("math-code-single-step", args=dict(dataset_path=...))`. The env reads
that file itself (its `id2info`); the adapter reads the same file for the prompts: episode seed
`s` plays row `s % len(rows)`, with

- the question: the row's `question`, else `prompt`, else `problem` field;
- the query id `prompt.ids[0]`: its `query_id`, else `qid`, else `id`, else the row's index;
- the answer (used only to demonstrate the reply format in the embedded model's warm start):
  its `answer`, else the first of its `solutions`, else `solution`.

Files: JSONL / JSON / Parquet / CSV, read with Hugging Face `datasets`.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.envs.table import read_table
from agentrl.errors import ConfigError

QUESTION_KEYS = ("question", "prompt", "problem")
ID_KEYS = ("query_id", "qid", "id")
ANSWER_KEYS = ("answer", "solutions", "solution")


@dataclass(frozen=True)
class SeedRow:
    """One dataset row as a seed agent's prompt."""

    qid: str
    question: str
    answer: str | None


def load_rows(path: str, where: str = "env.args.dataset_path") -> tuple[SeedRow, ...]:
    """The rows of `path` (cached per file and modification time); one-line errors name `where`."""
    return _rows(read_table(path, where), where, path)


def _rows(ds, where: str, path: str) -> tuple[SeedRow, ...]:
    columns = ds.column_names
    q_key = next((k for k in QUESTION_KEYS if k in columns), None)
    if q_key is None:
        raise ConfigError(f"{where}: {path!r} has no question column (its columns: {', '.join(columns)}); "
                          f"name it one of {', '.join(QUESTION_KEYS)}")
    id_key = next((k for k in ID_KEYS if k in columns), None)
    a_key = next((k for k in ANSWER_KEYS if k in columns), None)
    rows = []
    for i, row in enumerate(ds):
        answer = row[a_key] if a_key else None
        if isinstance(answer, (list, tuple)):
            answer = answer[0] if answer else None
        rows.append(SeedRow(str(row[id_key]) if id_key else str(i), str(row[q_key]),
                            None if answer is None else str(answer)))
    return tuple(rows)
