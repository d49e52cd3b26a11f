"""The built-in `search` tool: BM25 over a local corpus of documents (the `bm25s` library).

The corpus is a JSONL file, one document a line: {"text": ...} with an optional "title" and
"id". The index is built once per corpus content and cached on disk, in
`<cache_dir>/search/<sha256 of the corpus file>/`: the same corpus loads it, a changed corpus
builds a new one. In a process the index is loaded once and shared by every call.

Settings (`agent.args.tool_args.search.<name>`): `corpus` (the JSONL file, required), `top_k`
(documents per answer), `max_chars` (characters of each document shown), `cache_dir` (default:
$AGENTRL_CACHE, else ~/.cache/agentrl). `bm25s` comes with the `tools` extra.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config.paths import cache_home, user_path
from agentrl.errors import ConfigError
from agentrl.tools.tool import tool

INDEX_VERSION = 1  # bump when the tokenisation or the stored files change: older indexes are not read
FIELDS = '"text" (a string, required), "title" (a string) and "id" (a string or number)'
_LOADED: dict[tuple[str, int, int, str], SearchIndex] = {}  # (corpus, mtime_ns, size, cache root) -> index
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Document:
    """One line of the corpus."""

    id: str
    title: str
    text: str


@dataclass
class SearchIndex:
    """A corpus and its BM25 index; `built` says whether this load built it (False: read from the cache)."""

    documents: list[Document]
    retriever: Any  # bm25s.BM25
    folder: Path
    built: bool

    def search(self, query: str, top_k: int) -> list[tuple[Document, float]]:
        """The `top_k` best documents for `query` with their scores, best first (only those sharing a word with it)."""
        import bm25s

        words = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        known = [[w for w in words[0] if w in self.retriever.vocab_dict]]
        if not known[0] or not self.documents:
            return []
        ids, scores = self.retriever.retrieve(known, k=min(top_k, len(self.documents)), show_progress=False,
                                              n_threads=1)
        return [(self.documents[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


def read_corpus(path: Path) -> list[Document]:
    """The documents of a JSONL corpus; a bad line is a one-line ConfigError naming the file, the line and the fields."""
    documents = []
    with path.open(encoding="utf-8", errors="strict") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"search corpus {path} line {number}"
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{where} is not JSON ({e}); each line is an object with {FIELDS}") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ConfigError(f"{where} has no string \"text\"; each line is an object with {FIELDS}")
            title, ident = row.get("title", ""), row.get("id", number)
            if not isinstance(title, str) or isinstance(ident, bool) or not isinstance(ident, (str, int, float)):
                raise ConfigError(f"{where}: \"title\" must be a string and \"id\" a string or number; "
                                  f"each line is an object with {FIELDS}")
            documents.append(Document(str(ident), title, row["text"]))
    return documents


def load_index(corpus: str, cache_dir: str | None = None) -> SearchIndex:
    """The index of the `corpus` file: held in this process, read from the cache, or built and cached."""
    path = user_path(corpus, "tool_args.search.corpus")
    try:
        stat = path.stat()
    except OSError as e:
        raise ConfigError(f"tool_args.search.corpus={corpus!r} cannot be read ({e.strerror}); give a JSONL file "
                          f"of documents, one object a line with {FIELDS}") from None
    root = user_path(cache_dir, "tool_args.search.cache_dir") if cache_dir else cache_home()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, str(root))
    with _LOCK:  # one load per corpus, whichever call comes first
        index = _LOADED.get(key)
        if index is None:
            index = _LOADED[key] = _load(path, root)
        return index


def _load(path: Path, root: Path) -> SearchIndex:
    try:
        import bm25s
    except ImportError:
        raise ConfigError("the search tool needs the bm25s library, which is not installed: "
                          "pip install 'agentrl[tools]'") from None
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"search corpus {path} cannot be read ({e.strerror})") from None
    try:
        documents = read_corpus(path)
    except UnicodeDecodeError as e:
        raise ConfigError(f"search corpus {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    digest = hashlib.sha256(data + f"\0v{INDEX_VERSION} bm25s {bm25s.__version__}".encode()).hexdigest()[:32]
    folder = root / "search" / digest
    if folder.is_dir():
        try:
            return SearchIndex(documents, bm25s.BM25.load(str(folder)), folder, built=False)
        except Exception:  # noqa: BLE001 (a damaged entry, whatever bm25s raises for it: built again below)
            shutil.rmtree(folder, ignore_errors=True)
    tokens = bm25s.tokenize([f"{d.title}\n{d.text}" for d in documents], stopwords="en", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    # Written beside its place and renamed into it: a reader never sees half an index.
    folder.parent.mkdir(parents=True, exist_ok=True)
    part = folder.with_name(f".{digest}.{threading.get_ident()}.part")
    shutil.rmtree(part, ignore_errors=True)
    retriever.save(str(part))
    try:
        part.rename(folder)
    except OSError:  # another process cached the same corpus first: theirs is as good
        shutil.rmtree(part, ignore_errors=True)
    return SearchIndex(documents, retriever, folder, built=True)


def check_search(settings: dict[str, Any]) -> None:
    """Refuse to start, in one line, without a readable corpus, the library or sane numbers; loads the index."""
    for key in ("top_k", "max_chars"):
        if not settings[key] > 0:
            raise ConfigError(f"tool_args.search.{key}={settings[key]!r}: expected an int > 0")
    if not settings["corpus"]:
        raise ConfigError(f"tool_args.search.corpus is not set: give a JSONL file of documents, one object a line "
                          f"with {FIELDS}")
    load_index(settings["corpus"], settings["cache_dir"])


@tool(check=check_search)
def search(query: str, *, corpus: str | None = None, top_k: int = 3, max_chars: int = 400,
           cache_dir: str | None = None) -> str:
    """Search the documents for a query and return the best matches, best first.

    Args:
        query: Words to look for, such as a name.
        corpus: The JSONL file of documents.
        top_k: How many documents to return.
        max_chars: Characters of each document shown.
        cache_dir: Where indexes are cached.
    """
    hits = load_index(corpus, cache_dir).search(query, top_k) if corpus else []
    if not hits:
        return f"No document matches {query!r}."
    return "\n\n".join(_shown(d, max_chars) for d, _ in hits)


def _shown(document: Document, max_chars: int) -> str:
    text = f"{document.title}: {document.text}" if document.title else document.text
    return text if len(text) <= max_chars else text[:max_chars] + "..."
