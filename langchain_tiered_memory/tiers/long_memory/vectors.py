"""The vector index behind the long-term tier: a small protocol, Chroma or any VectorStore.

The catalog (SQL) is the record of every memory; the vector index is what dense
search asks for a large scope's nearest memories. Every call carries ids or a
scope, never an unscoped query, and search re-checks what it gets back against
the scope's catalog rows: ids coming out of an index are not trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore

from langchain_tiered_memory.tiers.long_memory.chroma import (
    chroma_where,
    delete_where,
    is_damaged,
    is_gone,
)

T = TypeVar("T")


@runtime_checkable
class VectorIndex(Protocol):
    """What the long-term tier needs of a vector store.

    Metadata hold at least ``session_id`` and ``user_id`` (``""`` for none), which
    :meth:`query` filters on.
    """

    def upsert(
        self,
        ids: Sequence[str],
        vectors: Sequence[Sequence[float]],
        texts: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
    ) -> None:
        """Write (or overwrite) memories by id."""
        ...

    def update_metadata(self, ids: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        """Merge new metadata values into stored memories."""
        ...

    def delete(self, ids: Sequence[str]) -> None:
        """Remove memories by id (unknown ids are ignored, a repeated id is one)."""
        ...

    def delete_scope(self, session_id: str | None, user_id: str | None) -> None:
        """Remove every memory of a scope the index can find by its metadata."""
        ...

    def query(
        self, vector: Sequence[float], n: int, session_id: str | None, user_id: str | None
    ) -> list[tuple[str, float]]:
        """The ``n`` memories of a scope nearest to ``vector``: ``(id, cosine similarity)``."""
        ...


class ChromaVectorIndex:
    """A :class:`VectorIndex` over a Chroma collection (its HNSW, filtered by ``where``).

    Args:
        collection: A callable returning the collection, read at each call so the
            owner may connect late or swap it.
        repair: Called with the collection when Chroma says it is damaged
            (:func:`~langchain_tiered_memory.tiers.long_memory.chroma.is_damaged`);
            it replaces the collection, and the call is made once more on the new one.
        reconnect: Called with the collection when Chroma says it no longer exists
            (another process's ``reindex`` replaced it); the owner forgets it, and
            the call is made once more on the collection of that name now.
    """

    def __init__(
        self,
        collection: Callable[[], Any],
        repair: Callable[[Any], None] | None = None,
        reconnect: Callable[[Any], None] | None = None,
    ) -> None:
        self._collection = collection
        self._repair = repair
        self._reconnect = reconnect

    @property
    def collection(self) -> Any:
        """The Chroma collection."""
        return self._collection()

    def _run(self, call: Callable[[Any], T]) -> T:
        collection = self.collection
        try:
            return call(collection)
        except Exception as exc:
            if self._reconnect is not None and is_gone(exc):
                self._reconnect(collection)
            elif self._repair is not None and is_damaged(exc):
                self._repair(collection)
            else:
                raise
            return call(self.collection)

    def upsert(
        self,
        ids: Sequence[str],
        vectors: Sequence[Sequence[float]],
        texts: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
    ) -> None:
        """Write (or overwrite) memories by id."""
        self._run(
            lambda collection: collection.upsert(
                ids=list(ids),
                embeddings=list(vectors),
                documents=list(texts),
                metadatas=list(metadatas),
            )
        )

    def stored_size(self) -> int | None:
        """The size of the collection's vectors (``None``: it holds none)."""
        found = self._run(lambda collection: collection.get(limit=1, include=["embeddings"]))
        stored = found["embeddings"]
        return None if stored is None or len(stored) == 0 else len(stored[0])

    def update_metadata(self, ids: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        """Merge new metadata values into stored memories."""
        self._run(lambda collection: collection.update(ids=list(ids), metadatas=list(metadatas)))

    def delete(self, ids: Sequence[str]) -> None:
        """Remove memories by id (an id given twice is removed once: Chroma refuses repeats)."""
        if ids:
            self._run(lambda collection: collection.delete(ids=list(dict.fromkeys(ids))))

    def delete_scope(self, session_id: str | None, user_id: str | None) -> None:
        """Remove every vector of a scope, page by page."""
        self._run(lambda collection: delete_where(collection, chroma_where(session_id, user_id)))

    def query(
        self, vector: Sequence[float], n: int, session_id: str | None, user_id: str | None
    ) -> list[tuple[str, float]]:
        """The ``n`` nearest memories of a scope (cosine space: similarity = 1 - distance)."""
        found = self._run(
            lambda collection: collection.query(
                query_embeddings=[list(vector)],
                n_results=n,
                where=chroma_where(session_id, user_id),
                include=["distances"],
            )
        )
        return [
            (doc_id, 1.0 - float(distance))
            for doc_id, distance in zip(found["ids"][0], found["distances"][0], strict=True)
        ]


def _in_scope(metadata: dict[str, Any], session_id: str | None, user_id: str | None) -> bool:
    return (session_id is None or metadata.get("session_id") == session_id) and (
        user_id is None or metadata.get("user_id") == user_id
    )


class VectorStoreIndex:
    """A :class:`VectorIndex` over any LangChain ``VectorStore``.

    The store embeds texts with its own embedding, which must be the model the
    long-term tier embeds queries with. Its search must accept an embedding and
    return ``(Document, score)`` pairs (``similarity_search_with_score_by_vector``);
    results are filtered by scope again here, whatever the store's filter did.

    Args:
        store: The vector store, e.g. ``InMemoryVectorStore(embedding)``.
        scope_filter: Builds the store's ``filter`` argument from
            ``(session_id, user_id)``; the default is a predicate over a
            ``Document``'s metadata, as ``InMemoryVectorStore`` takes.
        to_similarity: Maps the store's score to a cosine similarity (identity by
            default; for a store returning a cosine distance use ``1 - score``).
        oversample: How many more results than asked are fetched when the store
            cannot filter, so that the scope's own still fill ``n``.
    """

    def __init__(
        self,
        store: VectorStore,
        *,
        scope_filter: Callable[[str | None, str | None], Any] | None = None,
        to_similarity: Callable[[float], float] | None = None,
        oversample: int = 1,
    ) -> None:
        self.store = store
        self.scope_filter = scope_filter or (
            lambda session_id, user_id: lambda doc: _in_scope(doc.metadata, session_id, user_id)
        )
        self.to_similarity = to_similarity or float
        self.oversample = oversample

    def upsert(
        self,
        ids: Sequence[str],
        vectors: Sequence[Sequence[float]],
        texts: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
    ) -> None:
        """Write memories by id (the store embeds the texts itself)."""
        self.store.add_texts(list(texts), metadatas=list(metadatas), ids=list(ids))

    def update_metadata(self, ids: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        """Re-write stored memories with their metadata updated."""
        new = dict(zip(ids, metadatas, strict=True))
        docs = [
            doc for doc in self.store.get_by_ids(list(ids)) if doc.id is not None and doc.id in new
        ]
        if docs:
            self.store.add_documents(
                [
                    Document(
                        doc.page_content, id=doc.id, metadata={**doc.metadata, **new[str(doc.id)]}
                    )
                    for doc in docs
                ],
                ids=[doc.id for doc in docs],
            )

    def delete(self, ids: Sequence[str]) -> None:
        """Remove memories by id (a repeated id is one)."""
        if ids:
            self.store.delete(list(dict.fromkeys(ids)))

    def delete_scope(self, session_id: str | None, user_id: str | None) -> None:
        """Nothing: a ``VectorStore`` cannot list by metadata; forget deletes by id."""

    def query(
        self, vector: Sequence[float], n: int, session_id: str | None, user_id: str | None
    ) -> list[tuple[str, float]]:
        """The ``n`` nearest memories of a scope."""
        found = self.store.similarity_search_with_score_by_vector(  # type: ignore[attr-defined]
            list(vector), k=n * self.oversample, filter=self.scope_filter(session_id, user_id)
        )
        return [
            (doc.id, self.to_similarity(score))
            for doc, score in found
            if doc.id is not None and _in_scope(doc.metadata, session_id, user_id)
        ][:n]


def as_vector_index(vectors: VectorIndex | VectorStore) -> VectorIndex:
    """A :class:`VectorIndex` as it is, or a ``VectorStore`` wrapped in one."""
    if isinstance(vectors, VectorStore):
        return VectorStoreIndex(vectors)
    return vectors
