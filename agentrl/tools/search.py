"""The built-in `search` tool: BM25 over a local corpus of documents (the `bm25s` library).

The corpus is a JSONL file, one document a line: {"text": ...} with an optional "title" and
"id". The index is built once per corpus content and cached on disk, in
`<cache_dir>/search/<sha256 of the corpus file>/`: the same corpus loads it, a changed corpus
builds a new one. In a process the index is loaded once and shared by every call.

The corpus must be a regular file of at most `max_corpus_mb` (a device such as /dev/zero would be
read without end, a FIFO would wait for a writer), and hold at least one document with a word
BM25 can index (not only stopwords). The preflight (`agentrl plan`) checks all that, reading the
file, and builds no index: the run builds it when it builds its agents.

Settings (`agent.args.tool_args.search.<name>`): `corpus` (the JSONL file, required), `top_k`
(documents per answer), `max_chars` (characters of each document shown), `cache_dir` (default:
$AGENTRL_CACHE, else ~/.cache/agentrl), `max_corpus_mb` (the largest corpus read). `bm25s`
comes with the `tools` extra.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.bounded_json import load_json
from agentrl.config.paths import cache_home, user_path
from agentrl.errors import ConfigError
from agentrl.tools.tool import checking_only, tool

INDEX_VERSION = 1  # bump when the tokenisation or the stored files change: older indexes are not read
MAX_CORPUS_MB = 1024  # max_corpus_mb's default: the documents and their index are held in memory, a few times this
FIELDS = '"text" (a string, required), "title" (a string) and "id" (a string or number)'
_LOADED: dict[tuple[str, int, int, str], SearchIndex] = {}  # (corpus, mtime_ns, size, cache root) -> index
_CHECKED: set[tuple[str, int, int, int]] = set()  # (corpus, mtime_ns, size, max bytes) the preflight found good
_LOCK = threading.Lock()
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


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


def corpus_bytes(corpus: str, max_corpus_mb: int = MAX_CORPUS_MB) -> tuple[Path, bytes]:
    """The path and the bytes of the `corpus` file; a one-line ConfigError naming the setting when it
    is not a regular file or holds more than `max_corpus_mb` megabytes."""
    path = user_path(corpus, "tool_args.search.corpus")
    limit = max_corpus_mb * 2**20
    try:
        # stat first (it never blocks), then open without waiting for a FIFO's writer, and look
        # again at what was opened: a file swapped in between is caught too.
        _check_file(os.stat(path), corpus, max_corpus_mb)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            _check_file(os.fstat(fd), corpus, max_corpus_mb)
            data = f.read(limit + 1)  # bounded: a file that grows while it is read stops at the limit
    except OSError as e:
        raise ConfigError(_unreadable(corpus, e)) from None
    if len(data) > limit:
        raise ConfigError(_too_big(corpus, f"grew past {max_corpus_mb} MB as it was read", max_corpus_mb))
    return path, data


def _check_file(st: os.stat_result, corpus: str, max_corpus_mb: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise ConfigError(f"tool_args.search.corpus={corpus!r} is {kind}; give a regular JSONL file of documents, "
                          f"one object a line with {FIELDS}")
    if st.st_size > max_corpus_mb * 2**20:
        raise ConfigError(_too_big(corpus, f"is {st.st_size / 2**20:.1f} MB", max_corpus_mb))


def _too_big(corpus: str, what: str, max_corpus_mb: int) -> str:
    return (f"tool_args.search.corpus={corpus!r} {what}, over tool_args.search.max_corpus_mb={max_corpus_mb}; "
            "raise max_corpus_mb (memory permitting) or give a smaller corpus")


def read_corpus(data: bytes, path: Path) -> list[Document]:
    """The documents of a JSONL corpus (`data`, read from `path`); a one-line ConfigError naming the file
    (and the line) when a line is bad or no document holds a word BM25 can index."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"search corpus {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    documents = []
    for number, line in enumerate(io.StringIO(text, newline=None), 1):  # the lines open() would read
        if line.strip():
            documents.append(_document(line, number, path))
    if not documents:
        raise ConfigError(f"search corpus {path} holds no documents; each line is an object with {FIELDS}")
    _check_words(documents, path)
    return documents


def _document(line: str, number: int, path: Path) -> Document:
    where = f"search corpus {path} line {number}"
    try:
        row = load_json(line)
    except ValueError as e:
        raise ConfigError(f"{where} is not JSON ({e}); each line is an object with {FIELDS}") from None
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise ConfigError(f"{where} has no string \"text\"; each line is an object with {FIELDS}")
    title, ident = row.get("title", ""), row.get("id", number)
    if not isinstance(title, str) or isinstance(ident, bool) or not isinstance(ident, (str, int, float)):
        raise ConfigError(f"{where}: \"title\" must be a string and \"id\" a string or number; "
                          f"each line is an object with {FIELDS}")
    return Document(str(ident), title, row["text"])


def _check_words(documents: list[Document], path: Path) -> None:
    """A ConfigError unless some document has a word BM25 indexes (bm25s fails on none, deep inside)."""
    bm25s = _bm25s()
    for d in documents:  # the first document usually has one: the scan stops there
        if bm25s.tokenize([f"{d.title}\n{d.text}"], stopwords="en", return_ids=False, show_progress=False)[0]:
            return
    raise ConfigError(f"search corpus {path} holds no word to search by: each of its documents holds only "
                      "stopwords (the, of, ...), punctuation or nothing")


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError:
        raise ConfigError("the search tool needs the bm25s library, which is not installed: "
                          "pip install 'agentrl[tools]'") from None
    return bm25s


def check_corpus(corpus: str, max_corpus_mb: int = MAX_CORPUS_MB) -> None:
    """Read and check the `corpus` file as the index would (a one-line ConfigError), building nothing."""
    path = user_path(corpus, "tool_args.search.corpus")
    st = _stat(path, corpus)
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, max_corpus_mb)
    if key in _CHECKED:  # the preflight builds an agent more than once when it looks for a bad argument
        return
    path, data = corpus_bytes(corpus, max_corpus_mb)
    read_corpus(data, path)
    _CHECKED.add(key)


def load_index(corpus: str, cache_dir: str | None = None, max_corpus_mb: int = MAX_CORPUS_MB) -> SearchIndex:
    """The index of the `corpus` file: held in this process, read from the cache, or built and cached."""
    path = user_path(corpus, "tool_args.search.corpus")
    st = _stat(path, corpus)
    root = user_path(cache_dir, "tool_args.search.cache_dir") if cache_dir else cache_home()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, str(root))
    with _LOCK:  # one load per corpus, whichever call comes first
        index = _LOADED.get(key)
        if index is None:
            index = _LOADED[key] = _load(corpus, root, max_corpus_mb)
        return index


def _stat(path: Path, corpus: str) -> os.stat_result:
    try:
        return path.stat()
    except OSError as e:
        raise ConfigError(_unreadable(corpus, e)) from None


def _unreadable(corpus: str, e: OSError) -> str:
    return (f"tool_args.search.corpus={corpus!r} cannot be read ({e.strerror}); give a JSONL file of documents, "
            f"one object a line with {FIELDS}")


def _load(corpus: str, root: Path, max_corpus_mb: int) -> SearchIndex:
    bm25s = _bm25s()
    path, data = corpus_bytes(corpus, max_corpus_mb)
    documents = read_corpus(data, path)
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
    """Refuse to start, in one line, without a good corpus, the library or sane numbers; loads the
    index, except in the preflight (`check_only()`), which reads and checks the corpus only."""
    for key in ("top_k", "max_chars", "max_corpus_mb"):
        if not settings[key] > 0:
            raise ConfigError(f"tool_args.search.{key}={settings[key]!r}: expected an int > 0")
    if not settings["corpus"]:
        raise ConfigError(f"tool_args.search.corpus is not set: give a JSONL file of documents, one object a line "
                          f"with {FIELDS}")
    if checking_only():
        check_corpus(settings["corpus"], settings["max_corpus_mb"])
    else:
        load_index(settings["corpus"], settings["cache_dir"], settings["max_corpus_mb"])


@tool(check=check_search)
def search(query: str, *, corpus: str | None = None, top_k: int = 3, max_chars: int = 400,
           cache_dir: str | None = None, max_corpus_mb: int = MAX_CORPUS_MB) -> str:
    """Search the documents for a query and return the best matches, best first.

    Args:
        query: Words to look for, such as a name.
        corpus: The JSONL file of documents.
        top_k: How many documents to return.
        max_chars: Characters of each document shown.
        cache_dir: Where indexes are cached.
        max_corpus_mb: The largest corpus file read, in megabytes.
    """
    hits = load_index(corpus, cache_dir, max_corpus_mb).search(query, top_k) if corpus else []
    if not hits:
        return f"No document matches {query!r}."
    return "\n\n".join(_shown(d, max_chars) for d, _ in hits)


def _shown(document: Document, max_chars: int) -> str:
    text = f"{document.title}: {document.text}" if document.title else document.text
    return text if len(text) <= max_chars else text[:max_chars] + "..."
