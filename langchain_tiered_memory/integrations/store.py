"""``TieredStore``: a LangGraph ``BaseStore`` in the archive database.

LangChain's long-term memory convention is LangGraph's store: ``create_agent(...,
store=...)`` hands it to tools as ``runtime.store``, and LangMem's memory tools
read and write it. ``TieredStore`` keeps it beside the chat archive (SQLite
embedded, MySQL in production), and answers ``search(query=...)`` with the
package's hybrid ranking: CJK-aware BM25, blended with vector similarity when an
embedding is configured.

Every call is a batch of LangGraph ops; validation, planning and ranking are
written once (:class:`~langchain_tiered_memory.storage.store.StorePlanner`), and only
the embedding call and the driver differ between ``batch`` and ``abatch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from langchain_core.embeddings import Embeddings
from langgraph.store.base import BaseStore, IndexConfig, Op, Result, TTLConfig, ensure_embeddings
from sqlalchemy import Engine, MetaData
from sqlalchemy.engine import URL

from langchain_tiered_memory.core.lifecycle import Lifecycle
from langchain_tiered_memory.core.validation import check_number
from langchain_tiered_memory.storage.archive import MySQLBackup, default_backup
from langchain_tiered_memory.storage.store import (
    InvalidFilterError,
    InvalidKeyError,
    PreparedBatch,
    StorePlanner,
    ValueTooLargeError,
    build_store_tables,
    validate_ttl,
)
from langchain_tiered_memory.text.embeddings import model_name

__all__ = ["InvalidFilterError", "InvalidKeyError", "TieredStore", "ValueTooLargeError"]


class TieredStore(Lifecycle, BaseStore):
    """A LangGraph store in the archive database, with hybrid CJK-aware search.

    Items are namespaced JSON documents (``put``/``get``/``delete``/``search``/
    ``list_namespaces``, sync and async). ``search`` filters with LangGraph's filter
    semantics (exact match, nested dicts, ``$eq``, ``$ne``, ``$gt``, ``$gte``,
    ``$lt``, ``$lte``) and pages with ``limit``/``offset``; with ``query=`` it ranks
    by BM25 over the indexed fields (Chinese is indexed by characters and bigrams),
    blended with cosine similarity when ``index`` has an ``embed``. Items may expire
    (``ttl`` in minutes, LangGraph's :class:`TTLConfig`); expired items are never
    returned, and :meth:`sweep_ttl` deletes them. ``with`` / ``async with`` close the
    archive's pooled connections at the end (:meth:`shutdown`). An item (its value, and
    the tokens and vectors of its indexed texts) takes at most about 8 MB; a larger one
    is refused with :class:`~langchain_tiered_memory.storage.store.ValueTooLargeError`
    before anything of its batch is written, and before anything of it is embedded
    when ``index`` gives ``dims``.

    Args:
        backup: The archive to live beside: a :class:`~langchain_tiered_memory.MySQLBackup`,
            a SQLAlchemy URL or ``Engine``; ``None``: the embedded default (a SQLite
            file under ``$TIERED_MEMORY_HOME``).
        index: LangGraph's index config: ``{"embed": Embeddings | callable | "provider:model",
            "fields": ["text", ...], "dims": 1536}``. ``dims``, the size of the model's
            vectors, lets an item too large with its vectors be refused before its
            batch is embedded (without it, after embedding, before anything is
            written). Without ``index``, ``query=`` is ranked by BM25 alone over the
            whole value.
        ttl: LangGraph's TTL config: ``default_ttl`` (minutes) for puts that give none,
            ``refresh_on_read`` (default ``True``).
        dense_weight: Weight of vector similarity against BM25 when ``index`` embeds,
            in [0, 1]; ``1`` ranks by cosine similarity alone, as ``InMemoryStore``.
        table_name: Base name of the archive's tables when ``backup`` is a URL; the
            store's are ``<table_name>_store`` and ``<table_name>_store_ns``.

    Example:
        .. code-block:: python

            with TieredStore("mysql+pymysql://app:secret@db:3306/chat") as store:
                store.put(("users", "u1", "memories"), "m1", {"text": "喜欢乌龙茶"})
                store.search(("users", "u1"), query="乌龙茶", limit=5)
                agent = create_agent(llm, tools, store=store)

    """

    supports_ttl: bool = True

    def __init__(
        self,
        backup: MySQLBackup | str | URL | Engine | None = None,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        dense_weight: float = 0.6,
        table_name: str = "chat_messages",
    ) -> None:
        if backup is None:
            backup = default_backup()
        elif not isinstance(backup, MySQLBackup):
            backup = MySQLBackup(backup, table_name=table_name)
        self.backup = backup
        self.index_config = dict(index) if index else None
        self.embeddings: Embeddings | None = None
        fields: Sequence[str] = ("$",)
        dims = None
        if index:
            self.embeddings = ensure_embeddings(index.get("embed"))
            fields = list(index.get("fields") or ["$"])
            dims = index.get("dims")
        self.ttl_config = ttl
        validate_ttl((ttl or {}).get("default_ttl"))
        weight = check_number("dense_weight", dense_weight, 0.0, 1.0)
        base_name = backup.tables.messages.name
        self.metadata = MetaData()
        self.tables = build_store_tables(self.metadata, base_name)
        self.planner = StorePlanner(
            self.tables,
            backup.dialect,
            fields=fields,
            model=None if self.embeddings is None else model_name(self.embeddings),
            dims=dims,
            dense_weight=weight,
        )
        self.backup.create_all(self.metadata)

    def __repr__(self) -> str:
        return f"TieredStore({self.backup!r})"

    def _prepare(self, ops: Iterable[Op]) -> PreparedBatch:
        # Named at each batch: ``embeddings`` may have been replaced since.
        self.planner.model = None if self.embeddings is None else model_name(self.embeddings)
        return self.planner.prepare(ops)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run LangGraph store ops in one transaction; results in the order of ``ops``."""
        batch = self._prepare(ops)
        vectors: dict[str, Sequence[float]] = {}
        queries: dict[str, Sequence[float]] = {}
        if self.embeddings is not None:
            if batch.to_embed:
                embedded = self.embeddings.embed_documents(batch.to_embed)
                vectors = dict(zip(batch.to_embed, embedded, strict=True))
            queries = {query: self.embeddings.embed_query(query) for query in batch.queries}
        outcome = self.backup.run(
            partial(self.planner.plan, batch, vectors, queries), **_mode(batch)
        )
        if outcome.refresh:
            self.backup.run(partial(self.planner.refresh_plan, outcome.refresh))
        return outcome.results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`."""
        batch = self._prepare(ops)
        vectors: dict[str, Sequence[float]] = {}
        queries: dict[str, Sequence[float]] = {}
        if self.embeddings is not None:
            if batch.to_embed:
                embedded = await self.embeddings.aembed_documents(batch.to_embed)
                vectors = dict(zip(batch.to_embed, embedded, strict=True))
            found = await asyncio.gather(*map(self.embeddings.aembed_query, batch.queries))
            queries = dict(zip(batch.queries, found, strict=True))
        plan = partial(self.planner.plan, batch, vectors, queries)
        outcome = await self.backup.arun(plan, **_mode(batch))
        if outcome.refresh:
            await self.backup.arun(partial(self.planner.refresh_plan, outcome.refresh))
        return outcome.results

    def shutdown(self) -> None:
        """Close the archive's pooled connections; a later call connects again."""
        self.backup.shutdown()

    async def ashutdown(self) -> None:
        """Async :meth:`shutdown` (the running loop's connections too)."""
        await self.backup.ashutdown()

    def sweep_ttl(self) -> int:
        """Delete the items whose TTL has passed; returns how many."""
        return int(self.backup.run(self.planner.sweep_plan, write=True))

    async def asweep_ttl(self) -> int:
        """Async :meth:`sweep_ttl`."""
        return int(await self.backup.arun(self.planner.sweep_plan, write=True))


def _mode(batch: PreparedBatch) -> dict[str, Any]:
    """How the archive runs ``batch``'s plan (given as a function: a deadlock reruns it).

    Puts write after reading; reads are one snapshot either way (the archive runs
    every plan so).
    """
    return {"write": True} if batch.writes else {"read_only": True}
