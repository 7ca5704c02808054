"""``KnowledgeBase``: documents split into a Chroma collection of their own, for RAG.

The v3 design keeps the knowledge base beside the long-term memory: the same Chroma
(client and embedding model), another collection. Files and texts are split with
langchain-text-splitters' ``RecursiveCharacterTextSplitter`` (Markdown-aware for
``.md`` files, with Chinese sentence ends as separators); chunk ids are
deterministic, so adding a file again replaces its chunks instead of duplicating
them. Chroma has no transactions: a new version of a document is stored beside the old
one (chunk ids name their content and version), its first chunk last, and the old one
is deleted afterwards. Searches show each document's latest version whose first chunk
is stored (the commit, one record), so a write failing or killed at any point leaves
one version whole in searches; the next add or delete of the document removes the rest.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor

from langchain_tiered_memory.core.encoding import well_formed
from langchain_tiered_memory.core.extras import import_extra
from langchain_tiered_memory.core.validation import EmbeddingDimensionError, check_int
from langchain_tiered_memory.text.embeddings import OtherModelWarning, model_name
from langchain_tiered_memory.tiers.long_memory import (
    PAGE,
    ChromaLongMemory,
    digest,
    make_chroma_client,
)
from langchain_tiered_memory.tiers.long_memory.chroma import refused_name

if TYPE_CHECKING:
    from langchain_text_splitters import TextSplitter

logger = logging.getLogger(__name__)

#: Chinese sentence and clause ends, tried before spaces (Chinese has none). Zero-width
#: regexes, so the punctuation stays at the end of its sentence.
CJK_SEPARATORS = ["(?<=。)", "(?<=！)", "(?<=？)", "(?<=；)", "(?<=，)"]
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
UPSERT_BATCH = 512
#: The settings of the collections a knowledge base creates.
COLLECTION_METADATA = {"hnsw:space": "cosine"}
#: The chunk metadata naming the embedding model of its vector (``model_name``);
#: kept out of the metadata ``search`` returns.
MODEL_KEY = "embedding_model"
#: The chunk metadata naming its document (a source's key, or a text's) and the version
#: of the document it belongs to (a digest of the whole version); the first chunk of a
#: version (``chunk`` 0, stored last) also holds when it was stored. Kept out of the
#: metadata ``search`` returns.
DOCUMENT_KEY = "kb_document"
VERSION_KEY = "kb_version"
STORED_AT_KEY = "kb_stored_at"
#: Metadata keys the knowledge base writes (a chunk's position, its model, its version)
#: or adds to a search result: a caller's value under one would be lost.
RESERVED_KEYS = frozenset({"chunk", MODEL_KEY, DOCUMENT_KEY, VERSION_KEY, STORED_AT_KEY, "score"})
#: What a search leaves out of a result's metadata.
HIDDEN_KEYS = (MODEL_KEY, DOCUMENT_KEY, VERSION_KEY, STORED_AT_KEY)
#: The ints Chroma stores as ints.
INT64 = (-(2**63), 2**63 - 1)
#: Writers of one source in this process take turns: two versions written at once
#: would otherwise delete each other's chunks (each deletes the source's chunks that
#: are not its own). Striped by collection and source, so the set stays small.
SOURCE_LOCKS = tuple(threading.Lock() for _ in range(64))
#: What the size errors advise: Chroma fixes a collection's vector size at its first vector.
REINDEX = "use that model, or call reindex() to embed the chunks again with this one"
#: ``reindex`` to another size writes a new collection (``kb-reindex-<token>``, its
#: metadata naming the knowledge base and the token), renames the old one
#: ``kb-retired-<token>``, gives the new one the name, then deletes the old one.
REINDEX_PREFIX = "kb-reindex-"
RETIRED_PREFIX = "kb-retired-"
REINDEX_OF = "kb_reindex_of"
REINDEX_TOKEN = "kb_reindex_token"


def _separators(base: Sequence[str]) -> list[str]:
    """``base`` with the CJK separators inserted before the space separator."""
    base = list(base)
    at = base.index(" ") if " " in base else max(len(base) - 1, 0)
    return [*base[:at], *CJK_SEPARATORS, *base[at:]]


def _source_of(path: str | os.PathLike[str]) -> str:
    """A file's ``source``: its absolute path."""
    return str(Path(path).expanduser().resolve())


def source_key(source: Any) -> str:
    """The key of a ``source``: its chunk ids and its writers' turn are by it.

    Aware of the type, so ``5`` and ``"5"`` are two sources; ``5`` and ``5.0`` are
    one, as for Chroma's filters (which also tell ``True`` from ``1``).

    Raises:
        ValueError: If ``source`` is ``None`` (Chroma drops a ``None`` value, so
            its chunks could never be found again), not a str, int, float or bool,
            a float that is not finite, an int Chroma cannot hold (64 bits), or a
            str with a lone surrogate (which no filter can name).
    """
    if source is None:
        msg = (
            "source must not be None: Chroma drops None values, so its chunks could never "
            "be replaced or deleted; leave 'source' out for a text of its own"
        )
        raise ValueError(msg)
    if isinstance(source, bool):
        return f"bool:{source}"
    if isinstance(source, int):
        if not INT64[0] <= source <= INT64[1]:
            msg = f"source must be an int of 64 bits (Chroma's), got {source}"
            raise ValueError(msg)
        return f"number:{source}"
    if isinstance(source, float) and math.isfinite(source):
        return f"number:{int(source)}" if source.is_integer() else f"number:{source!r}"
    if isinstance(source, str):
        if well_formed(source) != source:
            msg = f"source must not hold a lone surrogate, got {source!r}"
            raise ValueError(msg)
        return f"str:{source}"
    msg = f"source must be a str, int, float or bool (a finite one), got {source!r}"
    raise ValueError(msg)


def check_metadata(metadata: Mapping[Any, Any], where: str) -> None:
    """Refuse, naming the key, a metadata entry Chroma would refuse, before anything is written.

    The values are checked by the installed ``chromadb``'s own rule (str, int,
    float, bool or ``None``, and lists in recent versions); the keys also by its
    server's (not empty, not starting with ``#`` or ``$``), which its client does not check.

    Raises:
        ValueError: If a key or value would be refused, or ``source`` is not one
            :func:`source_key` takes.
    """
    from chromadb.api.types import validate_metadata

    for key, value in metadata.items():
        problem = None
        values = value if isinstance(value, list) else [value]
        if not isinstance(key, str) or not key or key[0] in "#$":
            problem = "keys must be non-empty str not starting with '#' or '$'"
        elif key in RESERVED_KEYS:
            problem = f"the knowledge base writes {', '.join(sorted(RESERVED_KEYS))} itself"
        elif well_formed(key) != key or any(
            isinstance(item, str) and well_formed(item) != item for item in values
        ):
            problem = "a lone surrogate cannot be stored (UTF-8 cannot encode it)"
        elif any(isinstance(item, float) and not math.isfinite(item) for item in values):
            problem = "Chroma drops a value that is not finite"
        elif any(isinstance(item, int) and not INT64[0] <= item <= INT64[1] for item in values):
            problem = "Chroma keeps ints of 64 bits (a larger one comes back a float)"
        else:
            try:
                validate_metadata({key: value})
                if key == "source":
                    source_key(value)
            except (TypeError, ValueError) as exc:
                problem = str(exc)
        if problem is not None:
            msg = f"{where}: metadata key {key!r} is refused: {problem}"
            raise ValueError(msg)


@dataclass
class _Document:
    """The chunks of one source (its texts' chunks numbered across them), or of one text."""

    key: str
    source: Any = None  # None: a text without a source, keyed by its text
    chunks: list[str] = field(default_factory=list)
    metadatas: list[dict[str, Any]] = field(default_factory=list)

    def add(self, chunks: Iterable[str], metadata: Mapping[str, Any]) -> None:
        """Append chunks with ``metadata`` and each one's position."""
        for chunk in chunks:
            self.metadatas.append({**metadata, "chunk": len(self.chunks)})
            self.chunks.append(chunk)

    def position_id(self, index: int) -> str:
        """The id an earlier version of the package gave a sourceless text's chunk at ``index``."""
        return digest(self.key, str(index))[:32]

    def stored(self, model: str) -> tuple[list[str], list[dict[str, Any]]]:
        """The chunk ids and the metadata each chunk is stored with (by ``model``).

        Each chunk names its document and the version, a digest of the whole
        document: two versions never share a chunk, so the old one stays whole until
        the new one is stored, and adding the same version again gives the same ids
        (it is overwritten in place).
        """
        metadatas = [
            {**metadata, MODEL_KEY: model, DOCUMENT_KEY: self.key} for metadata in self.metadatas
        ]
        contents = [
            (chunk, json.dumps(metadata, sort_keys=True, default=repr))
            for chunk, metadata in zip(self.chunks, metadatas, strict=True)
        ]
        version = digest(self.key, *(part for content in contents for part in content))[:32]
        ids = [
            digest(self.key, version, str(index), *content)[:32]
            for index, content in enumerate(contents)
        ]
        return ids, [{**metadata, VERSION_KEY: version} for metadata in metadatas]


def _is_first(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a chunk is the first of its version: the one whose storing commits it."""
    return (metadata or {}).get("chunk") == 0


def _document_of(metadata: Mapping[str, Any]) -> str | None:
    """The key of a stored chunk's document.

    ``None`` for a sourceless text's chunk an earlier version of the package stored
    (it named no document).
    """
    key = metadata.get(DOCUMENT_KEY)
    if isinstance(key, str):
        return key
    if "source" in metadata:  # stored by an earlier version: its source names it
        try:
            return source_key(metadata["source"])
        except ValueError:
            return None
    return None


class KnowledgeBase:
    """Documents for retrieval-augmented answers, in a Chroma collection of their own.

    Location arguments take precedence like ``langchain-chroma`` and
    :class:`~langchain_tiered_memory.ChromaLongMemory`: ``client`` over
    ``persist_directory`` over ``host``; with none of them, an embedded client in
    ``$TIERED_MEMORY_HOME/chroma`` (telemetry off). Use :meth:`from_long_memory`
    to share the long-term memory's client and embedding model.

    After a change of embedding model, chunks the old one made are left out of
    :meth:`search` (with a warning) if its vectors are of the same size; if they
    are of another size, Chroma refuses the new ones, and :meth:`search` and the
    ``add_*`` methods raise :class:`~langchain_tiered_memory.EmbeddingDimensionError`.
    Either way :meth:`reindex` embeds every stored chunk again with the new model
    (adding a file or text again moves that one, when the size is the same).

    Args:
        embedding: Any LangChain ``Embeddings``; ``None`` loads all-MiniLM-L6-v2
            offline (as ``ChromaLongMemory`` does).
        client: A ready ``chromadb`` client.
        persist_directory: Folder of an embedded ``PersistentClient``.
        host: A Chroma server (``chroma run``).
        port: The server's port.
        collection_name: The collection of chunks.
        chunk_size: Maximum characters per chunk.
        chunk_overlap: Characters shared by neighbouring chunks; default a fifth
            of ``chunk_size``, at most 200.
        text_splitter: A splitter to use instead of the default ones (then
            ``chunk_size`` and ``chunk_overlap`` are ignored).

    Example:
        .. code-block:: python

            kb = KnowledgeBase.from_long_memory(long_memory)
            kb.add_files(["docs/ar_tables.md", "docs/faq.txt"])
            chain = create_tiered_chain(llm, backup=backup, long_memory=long_memory,
                                        knowledge=kb.as_retriever(k=4))
    """

    def __init__(
        self,
        *,
        embedding: Embeddings | None = None,
        client: Any = None,
        persist_directory: str | Path | None = None,
        host: str | None = None,
        port: int = 8000,
        collection_name: str = "knowledge",
        chunk_size: int = 1000,
        chunk_overlap: int | None = None,
        text_splitter: TextSplitter | None = None,
    ) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            msg = f"chunk_size must be a positive int, got {chunk_size!r}"
            raise ValueError(msg)
        if chunk_overlap is None:
            chunk_overlap = min(200, chunk_size // 5)
        if (
            isinstance(chunk_overlap, bool)
            or not isinstance(chunk_overlap, int)
            or not 0 <= chunk_overlap < chunk_size
        ):
            msg = f"chunk_overlap must be an int in [0, chunk_size), got {chunk_overlap!r}"
            raise ValueError(msg)
        if not isinstance(collection_name, str) or not collection_name:
            msg = f"collection_name must be a non-empty str, got {collection_name!r}"
            raise ValueError(msg)
        # Fail early, before any client is made.
        splitters = import_extra("langchain_text_splitters", "knowledge", "KnowledgeBase")
        self.client = make_chroma_client(
            client, persist_directory, host, port, feature="KnowledgeBase"
        )
        try:
            self._finish_reindex(collection_name)
            self.collection = self.client.get_or_create_collection(
                collection_name, embedding_function=None, metadata=COLLECTION_METADATA
            )
        except Exception as exc:
            refused = refused_name(exc, collection_name)
            if refused is None:
                raise
            raise refused from exc
        if embedding is None:
            from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

            embedding = MiniLMEmbeddings()
        self.embedding = embedding
        self._other_models = OtherModelWarning("call reindex() or add their files or texts again")
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        splitter_class = splitters.RecursiveCharacterTextSplitter
        self._text_splitter = text_splitter or splitter_class(
            separators=_separators(["\n\n", "\n", " ", ""]),
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            is_separator_regex=True,
        )
        markdown = splitter_class.get_separators_for_language(splitters.Language.MARKDOWN)
        self._markdown_splitter = text_splitter or splitter_class(
            separators=_separators(markdown),
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            is_separator_regex=True,
        )

    @classmethod
    def from_long_memory(
        cls, long_memory: ChromaLongMemory, collection_name: str = "knowledge", **kwargs: Any
    ) -> KnowledgeBase:
        """A knowledge base on the long-term memory's Chroma client and embedding model.

        Args:
            long_memory: The long-term tier whose client and embedding to share.
            collection_name: The knowledge collection; must differ from the
                memories' collection.
            **kwargs: ``chunk_size``, ``chunk_overlap`` or ``text_splitter``.

        Raises:
            ValueError: If ``collection_name`` is the memories' collection.
        """
        if collection_name == long_memory.collection.name:
            msg = (
                f"collection_name {collection_name!r} is the long-term memory's collection; "
                "the knowledge base needs a collection of its own"
            )
            raise ValueError(msg)
        return cls(
            client=long_memory.client,
            embedding=long_memory.embedding,
            collection_name=collection_name,
            **kwargs,
        )

    def __repr__(self) -> str:
        collection = getattr(self, "collection", None)
        return f"KnowledgeBase(collection={getattr(collection, 'name', None)!r})"

    def count(self) -> int:
        """How many chunks the collection holds."""
        return int(self.collection.count())

    # -- writing -----------------------------------------------------------------

    @contextmanager
    def _writing(self, sources: Iterable[Any] | None) -> Iterator[None]:
        """Hold the locks of ``sources`` in this collection (``None``: of every source).

        Taken in one order: no deadlock.
        """
        collection = str(self.collection.id)
        stripes = (
            range(len(SOURCE_LOCKS))
            if sources is None
            else sorted({hash((collection, source_key(s))) % len(SOURCE_LOCKS) for s in sources})
        )
        with ExitStack() as held:
            for stripe in stripes:
                held.enter_context(SOURCE_LOCKS[stripe])
            yield

    def _embed(self, chunks: Sequence[str]) -> list[list[float]]:
        """Every chunk's vector, in batches, before anything is written."""
        vectors: list[list[float]] = []
        for start in range(0, len(chunks), UPSERT_BATCH):
            vectors += self.embedding.embed_documents(list(chunks[start : start + UPSERT_BATCH]))
        return vectors

    def _store(
        self,
        collection: Any,
        ids: list[str],
        chunks: list[str],
        vectors: list[list[float]],
        metadatas: list[dict[str, Any]],
        batches: Sequence[slice] | None = None,
    ) -> None:
        """Upsert in batches; if one fails, delete the chunks this call created and raise.

        ``batches``: the slices of the lists to upsert each at once (default: of
        :data:`UPSERT_BATCH` chunks).

        Chroma has no transactions, so a failure after some batches were stored
        is undone by hand: what existed before is kept (a source's old version,
        which the new chunks never overwrite), what is new is deleted.

        Raises:
            EmbeddingDimensionError: If the collection holds vectors of another size.
        """
        created: list[str] = []
        try:
            if batches is None:
                batches = [slice(at, at + UPSERT_BATCH) for at in range(0, len(ids), UPSERT_BATCH)]
            for batch in batches:
                existing = set(collection.get(ids=ids[batch], include=[])["ids"])
                created += [chunk_id for chunk_id in ids[batch] if chunk_id not in existing]
                collection.upsert(
                    ids=ids[batch],
                    embeddings=vectors[batch],
                    documents=chunks[batch],
                    metadatas=metadatas[batch],
                )
        except Exception as exc:
            created.reverse()  # a version's first chunk, stored last, is deleted first
            try:
                for start in range(0, len(created), PAGE):
                    collection.delete(ids=created[start : start + PAGE])
            except Exception:
                logger.exception(
                    "a failed write to the knowledge base %r left %d chunks it could not delete",
                    collection.name,
                    len(created),
                )
            refused = self._size_error(exc, len(vectors[0]) if vectors else 0)
            if refused is not None:
                raise refused from exc
            raise

    def _claim_by_position(self, document: _Document) -> list[str]:
        """Name the document in the chunks an earlier version of the package stored by position.

        Those chunks of a sourceless text name no document, so searches could not
        tell them from another text's and showed them beside the new version until
        they were deleted. Named (without a version), they show only until a version
        of the text is committed, as an earlier version's chunks of a source do.

        Returns:
            Their ids.
        """
        found: list[str] = []
        while True:
            page = [document.position_id(i) for i in range(len(found), len(found) + PAGE)]
            stored = self.collection.get(ids=page, include=["metadatas"])
            if not stored["ids"]:
                return found
            self.collection.update(
                ids=stored["ids"],
                metadatas=[
                    {**(metadata or {}), DOCUMENT_KEY: document.key}
                    for metadata in stored["metadatas"]
                ],
            )
            found += stored["ids"]

    def _stored_at(self, keys: Sequence[str]) -> int:
        """When this write is stored: now, but after every stored version of ``keys``.

        What orders two versions of a document in searches; never before a stored
        one, so a clock set back does not hide the new version behind the old.
        """
        latest = max((at for _, at, _ in self._commits(keys)), default=0)
        return max(time.time_ns(), latest + 1)

    def _commits(self, keys: Iterable[str]) -> list[tuple[str, int, str]]:
        """The stored versions of the documents of ``keys``: (document, when stored, version).

        Read from each version's first chunk, stored last with its time: the record
        that commits the version.
        """
        ordered = sorted(set(keys))
        found: list[tuple[str, int, str]] = []
        for start in range(0, len(ordered), PAGE):
            where = {"$and": [{DOCUMENT_KEY: {"$in": ordered[start : start + PAGE]}}, {"chunk": 0}]}
            for metadata in self.collection.get(where=where, include=["metadatas"])["metadatas"]:
                key, version = (metadata or {}).get(DOCUMENT_KEY), (metadata or {}).get(VERSION_KEY)
                at = (metadata or {}).get(STORED_AT_KEY)
                if isinstance(key, str) and isinstance(version, str) and type(at) is int:
                    found.append((key, at, version))
        return found

    def _write(self, documents: Sequence[_Document]) -> list[str]:
        """Store documents, each replacing its old chunks; the ids of the chunks.

        Each new version is stored beside the old one, its first chunk last (with
        when it was stored): once that one is stored, searches show the new version
        (:meth:`_current_versions`), and the old one is deleted. A failure or a kill
        at any point leaves one version whole in searches.
        """
        model = model_name(self.embedding)
        ids: list[str] = []
        chunks: list[str] = []
        metadatas: list[dict[str, Any]] = []
        firsts: list[int] = []  # where each version's first chunk is, its last
        batches: list[slice] = []
        for document in documents:
            document_ids, stored = document.stored(model)
            # Each version by one upsert when it fits one: a delete_source in another
            # process (no lock reaches it) sees all of it or none, never a stored part
            # that its first chunk, stored after the delete, would commit.
            if not batches or len(ids) + len(document_ids) - batches[-1].start > UPSERT_BATCH:
                batches.append(slice(len(ids), len(ids)))
            order = sorted(range(len(document_ids)), key=lambda i: _is_first(stored[i]))
            for index in order:
                if _is_first(stored[index]):
                    firsts.append(len(ids))
                ids.append(document_ids[index])
                chunks.append(document.chunks[index])
                metadatas.append(stored[index])
            while len(ids) - batches[-1].start > UPSERT_BATCH:  # a version of many batches
                batches[-1] = slice(batches[-1].start, batches[-1].start + UPSERT_BATCH)
                batches.append(slice(batches[-1].stop, batches[-1].stop))
            batches[-1] = slice(batches[-1].start, len(ids))
        # Embedded before the first write: an embedding error (a 429...) stores nothing.
        vectors = self._embed(chunks)
        sources = [document.source for document in documents if document.source is not None]
        sourceless = [document for document in documents if document.source is None]
        with self._writing(sources):
            # Only the chunks stored before this write are replaced: a writer in another
            # process storing the source meanwhile (no lock reaches it) loses nothing.
            old: dict[str, bool] = {}
            for source in sources:
                old.update(self._chunks_where({"source": source}))
            keys = [document.key for document in sourceless]
            for start in range(0, len(keys), PAGE):
                old.update(self._chunks_where({DOCUMENT_KEY: {"$in": keys[start : start + PAGE]}}))
            # Stored by position: named first, so the new version hides them once committed.
            old.update(
                dict.fromkeys(
                    (i for document in sourceless for i in self._claim_by_position(document)),
                    False,
                )
            )
            stored_at = self._stored_at([document.key for document in documents])
            for at in firsts:  # each its version's last: storing it commits the version
                metadatas[at] = {**metadatas[at], STORED_AT_KEY: stored_at}
            batches = [batch for batch in batches if batch.stop > batch.start]
            self._store(self.collection, ids, chunks, vectors, metadatas, batches)
            new = set(ids)
            self._delete_chunks({i: first for i, first in old.items() if i not in new})
        return ids

    def add_texts(
        self, texts: Iterable[str], metadatas: Sequence[dict[str, Any]] | None = None
    ) -> list[str]:
        """Split texts into chunks and store them.

        The texts of one ``source`` (metadata) are one document: its chunks are
        numbered across them, and adding that source again replaces its chunks, as
        :meth:`add_files` does a file's. The new chunks are stored beside the old
        ones, which are deleted afterwards: if a write fails part-way, the chunks
        it stored are deleted and the old ones are left whole. Every chunk is
        checked and embedded before the first is written, so a refused metadata
        value or an embedding error stores nothing. A text without a source is
        keyed by its text: adding it again, or twice in one call, stores it once.

        Args:
            texts: The texts.
            metadatas: One metadata dict per text, of values Chroma accepts (str,
                int, float, bool or ``None``; lists in recent versions);
                ``source`` (a str, int, float or bool: ``5`` and ``"5"`` are two
                sources) is the key :meth:`delete_source` uses.

        Returns:
            The ids of the stored chunks.

        Raises:
            TypeError: If a text is not a str, or a metadata not a dict.
            ValueError: If ``metadatas`` does not match ``texts`` in length, or a
                metadata key or value would be refused by Chroma (the error names
                it), or a ``source`` is ``None``.
            EmbeddingDimensionError: If the collection holds vectors of another
                size (another model's): see :meth:`reindex`.
        """
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                msg = f"texts[{position}] must be a str, got {type(text).__name__}"
                raise TypeError(msg)
        if metadatas is not None and len(metadatas) != len(texts):
            msg = f"got {len(metadatas)} metadatas for {len(texts)} texts"
            raise ValueError(msg)
        if metadatas is not None:  # all of them before any splitting or embedding
            for position, metadata in enumerate(metadatas):
                if not isinstance(metadata, Mapping):
                    msg = f"metadatas[{position}] must be a dict, got {type(metadata).__name__}"
                    raise TypeError(msg)
                check_metadata(metadata, f"metadatas[{position}]")
        documents: dict[str, _Document] = {}
        for position, text in enumerate(texts):
            metadata = dict(metadatas[position]) if metadatas is not None else {}
            if "source" in metadata:
                document = _Document(source_key(metadata["source"]), metadata["source"])
            else:
                document = _Document(f"text:{digest(text)}")
                if document.key in documents:  # the same text twice is stored once
                    continue
            # A lone surrogate (an emoji cut in half) is stored as U+FFFD, as memories are.
            documents.setdefault(document.key, document).add(
                self._text_splitter.split_text(well_formed(text)), metadata
            )
        return self._write(list(documents.values()))

    def add_files(
        self, paths: str | Path | Iterable[str | Path], encoding: str = "utf-8"
    ) -> list[str]:
        """Split text or Markdown files into chunks and store them.

        Each chunk's metadata holds ``source`` (the file's absolute path),
        ``filename`` and ``chunk`` (its position). Adding a file again replaces its
        chunks: the new ones are stored, then the old ones deleted; a write that
        fails part-way leaves the file's old chunks whole. Every file is read
        before any is written; each is then embedded and stored in turn, so an
        error leaves the files before it new and the others as they were.

        Args:
            paths: One path or several.
            encoding: The files' encoding.

        Returns:
            The ids of the stored chunks.

        Raises:
            FileNotFoundError: If a path is not a file.
            ValueError: If a file cannot be decoded with ``encoding``.
            EmbeddingDimensionError: If the collection holds vectors of another
                size (another model's): see :meth:`reindex`.
        """
        if isinstance(paths, (str, Path)):
            paths = [paths]
        files = [Path(_source_of(path)) for path in paths]
        for file in files:  # check them all before writing anything
            if not file.is_file():
                msg = f"no such file: {file}"
                raise FileNotFoundError(msg)
        documents: list[_Document] = []
        for file in files:
            try:
                text = file.read_text(encoding=encoding)
            except UnicodeDecodeError as exc:
                msg = f"{file} is not a {encoding} text file: {exc.reason} at byte {exc.start}"
                raise ValueError(msg) from exc
            text = text.removeprefix("\ufeff")
            splitter = (
                self._markdown_splitter
                if file.suffix.lower() in MARKDOWN_SUFFIXES
                else self._text_splitter
            )
            document = _Document(source_key(str(file)), str(file))
            document.add(splitter.split_text(text), {"source": str(file), "filename": file.name})
            documents.append(document)
        all_ids: list[str] = []
        for document in documents:  # one at a time: the vectors of one file in memory
            all_ids += self._write([document])
        return all_ids

    def _chunks_where(self, where: dict[str, Any]) -> dict[str, bool]:
        """The chunks ``where`` matches, a page at a time: id to whether it is a version's first."""
        found: dict[str, bool] = {}
        while True:
            page = self.collection.get(
                where=where, limit=PAGE, offset=len(found), include=["metadatas"]
            )
            if not page["ids"]:
                return found
            for chunk_id, metadata in zip(page["ids"], page["metadatas"], strict=True):
                found[chunk_id] = _is_first(metadata)

    def _delete_chunks(self, doomed: Mapping[str, bool]) -> None:
        """Delete chunks (id to whether it is a version's first), the firsts first.

        A version whose first chunk is gone is left out of searches: one deleted
        part-way never shows part of itself.
        """
        ordered = sorted(doomed, key=lambda chunk_id: not doomed[chunk_id])
        for start in range(0, len(ordered), PAGE):
            self.collection.delete(ids=ordered[start : start + PAGE])

    def _delete_where(self, where: dict[str, Any]) -> int:
        doomed = self._chunks_where(where)
        self._delete_chunks(doomed)
        return len(doomed)

    def delete_source(self, path: str | int | float | os.PathLike[str]) -> int:
        """Delete every chunk of a file (or of texts added with that ``source``).

        Args:
            path: The ``source`` given to :meth:`add_texts` (any str, int, float
                or bool), or a file's path, absolute or relative to the current
                folder: a str matches both as given and as a path resolved
                (when it is one).

        Returns:
            How many chunks were deleted.

        Raises:
            ValueError: If ``path`` is ``None`` or of another type.
        """
        raw = os.fspath(path) if isinstance(path, os.PathLike) else path
        source_key(raw)  # refuses what no source can be
        sources = [raw]
        if isinstance(raw, str):
            try:
                resolved = _source_of(raw)
            except (OSError, RuntimeError, ValueError):
                pass  # not a path ("~draft": no such user; a null byte): the source alone
            else:
                sources = sorted({raw, resolved})
        with self._writing(sources):
            return self._delete_where({"source": {"$in": sources}})

    def reindex(self) -> int:
        """Embed every stored chunk again with this knowledge base's embedding model.

        What moves a knowledge base to a new model without its files and texts:
        until then, chunks of a model of the same size are left out of
        :meth:`search`, and those of another size make :meth:`search` and the
        ``add_*`` methods raise :class:`~langchain_tiered_memory.EmbeddingDimensionError`.
        Every chunk is embedded before anything is written (an embedding error
        changes nothing). Of the same size, the chunks are overwritten in place;
        of another size, they are written to a new collection, which then takes
        the old one's name (Chroma fixes a collection's vector size at its first
        vector): other ``KnowledgeBase`` objects on that collection, in other
        processes too, must then be made again.

        Returns:
            How many chunks were embedded again.
        """
        # Every stripe (those of other collections too, for this rare call): no writer meanwhile.
        with self._writing(None):
            ids: list[str] = []
            chunks: list[str] = []
            metadatas: list[dict[str, Any]] = []
            while True:
                found = self.collection.get(
                    limit=UPSERT_BATCH, offset=len(ids), include=["documents", "metadatas"]
                )
                if not found["ids"]:
                    break
                ids += found["ids"]
                chunks += found["documents"]
                metadatas += [dict(metadata or {}) for metadata in found["metadatas"]]
            model = model_name(self.embedding)
            metadatas = [{**metadata, MODEL_KEY: model} for metadata in metadatas]
            vectors = self._embed(chunks)
            stored = self._stored_size()
            if stored is not None and vectors and stored == len(vectors[0]):
                self._store(self.collection, ids, chunks, vectors, metadatas)
                return len(ids)
            # Another size, or none stored (an emptied collection keeps its size).
            name = self.collection.name
            token = uuid.uuid4().hex
            metadata = dict(self.collection.metadata or COLLECTION_METADATA)
            fresh = self.client.create_collection(
                f"{REINDEX_PREFIX}{token}",
                embedding_function=None,
                metadata={**metadata, REINDEX_OF: name, REINDEX_TOKEN: token},
            )
            try:
                self._store(fresh, ids, chunks, vectors, metadatas)
            except Exception:
                self.client.delete_collection(fresh.name)
                raise
            # The old chunks keep a name until the new ones have this one: killed at
            # any point, the process leaves one whole set, and the next KnowledgeBase
            # of this name finishes the move (_finish_reindex).
            self.collection.modify(name=f"{RETIRED_PREFIX}{token}")
            try:
                self._take_name(fresh, name)
            except Exception:
                logger.error("the reindexed chunks of %r are in collection %r", name, fresh.name)
                raise
            self._delete_if_there(f"{RETIRED_PREFIX}{token}")
            self.collection = fresh
            return len(ids)

    def _finish_reindex(self, name: str) -> None:
        """Finish a :meth:`reindex` of ``name`` that a killed process left half done.

        Between its two renames the old chunks are ``kb-retired-<token>`` and the new
        ones, whole, ``kb-reindex-<token>``: the new ones take the name (from an
        empty collection a knowledge base opened meanwhile may have created under
        it). After both, the retired collection is deleted. A ``kb-reindex-``
        collection with no retired twin is a reindex still writing (or one killed
        while writing, whose old chunks kept the name): it is left alone.
        """
        collections = {collection.name: collection for collection in self.client.list_collections()}
        for collection in list(collections.values()):
            metadata = collection.metadata or {}
            retired = f"{RETIRED_PREFIX}{metadata.get(REINDEX_TOKEN)}"
            if metadata.get(REINDEX_OF) != name or retired not in collections:
                continue
            holder = collections.get(name)
            if collection.name != name and (holder is None or holder.count() == 0):
                logger.warning("finishing an interrupted reindex of the knowledge base %r", name)
                self._take_name(collection, name)
                collections[name] = collection
            if collections.get(name) is collection or self._holds_name(collection, name):
                self._delete_if_there(retired)

    def _take_name(self, collection: Any, name: str) -> None:
        """Give a reindex's whole new collection the name.

        An empty collection under the name gives way: a knowledge base opened
        between the reindex's two renames found the name free and created it. One
        holding chunks does not (the rename fails).
        """
        for last in (False, True):
            try:
                collection.modify(name=name)
                return
            except Exception:
                holder = self._named(name)
                if holder is not None and holder.id == collection.id:
                    return  # another process finished the move
                if last or holder is None or holder.count() > 0:
                    raise
                self._delete_if_there(name)

    def _named(self, name: str) -> Any:
        """The collection called ``name``, ``None`` if there is none."""
        try:
            return self.client.get_collection(name)
        except Exception:  # no collection of that name
            return None

    def _holds_name(self, collection: Any, name: str) -> bool:
        """Whether the collection called ``name`` now is ``collection``."""
        holder = self._named(name)
        return holder is not None and holder.id == collection.id

    def _delete_if_there(self, name: str) -> None:
        """Delete a collection that another process may have deleted already."""
        try:
            self.client.delete_collection(name)
        except Exception as exc:
            logger.debug("deleting the collection %r failed: %s", name, exc)

    # -- reading -----------------------------------------------------------------

    def _query(
        self, vector: Sequence[float], k: int, where: dict[str, Any] | None
    ) -> list[Document]:
        model = model_name(self.embedding)
        wanted = k
        while True:
            try:
                found = self.collection.query(
                    query_embeddings=[list(vector)],
                    n_results=wanted,
                    where=where,
                    include=["documents", "metadatas", "distances"],
                )
            except Exception as exc:
                refused = self._size_error(exc, len(vector))
                if refused is not None:
                    raise refused from exc
                raise
            metadatas = [dict(metadata or {}) for metadata in found["metadatas"][0]]
            current = self._current_versions(
                {key for m in metadatas if (key := _document_of(m)) is not None}
            )
            # A version another is replacing or replaced (its write or delete failed
            # or was killed): left out, one version of each document shows.
            shown = [
                (key := _document_of(m)) is None or m.get(VERSION_KEY) == current.get(key)
                for m in metadatas
            ]
            for m in metadatas:
                for hidden in HIDDEN_KEYS[1:]:
                    m.pop(hidden, None)
            # A chunk of no recorded model was stored by an earlier version: compared as is.
            made = [m.pop(MODEL_KEY, None) for m in metadatas]
            foreign = [
                name
                for name, show in zip(made, shown, strict=True)
                if show and name not in (model, None)
            ]
            kept = sum(
                show and name in (model, None) for name, show in zip(made, shown, strict=True)
            )
            # Another model's or version's chunks take places of these: ask for more.
            if kept == len(made) or len(made) < wanted or kept >= k:
                break
            wanted *= 2
        if foreign:  # their similarity is noise: left out
            base = f"the knowledge base {self.collection.name!r}"
            self._other_models(len(foreign), base, foreign, model)
        return [
            Document(
                page_content=text,
                id=chunk_id,
                metadata={**metadata, "score": 1.0 - distance},
            )
            for chunk_id, text, metadata, distance, name, show in zip(
                found["ids"][0],
                found["documents"][0],
                metadatas,
                found["distances"][0],
                made,
                shown,
                strict=True,
            )
            if show and name in (model, None)
        ][:k]

    def _current_versions(self, keys: set[str]) -> dict[str, str]:
        """The version searches show of each document of ``keys``.

        Of its versions whose first chunk (stored last) is stored, the one stored
        last. A document with none has no current version: only chunks an earlier
        version of the package stored (which name no version) show then.
        """
        latest: dict[str, tuple[int, str]] = {}
        for key, at, version in self._commits(keys):
            latest[key] = max(latest.get(key, (at, version)), (at, version))
        return {key: version for key, (_, version) in latest.items()}

    def _stored_size(self, refusal: Exception | None = None) -> int | None:
        """The size of the collection's vectors (``None``: not known).

        A stored chunk's, else the one Chroma names in ``refusal``: an emptied
        collection keeps the size of its first vector.
        """
        found = self.collection.get(limit=1, include=["embeddings"])["embeddings"]
        if found is not None and len(found) > 0:
            return len(found[0])
        named = re.search(r"dimension of (\d+)", str(refusal or ""))
        return int(named.group(1)) if named else None

    def _size_error(self, exc: Exception, size: int) -> EmbeddingDimensionError | None:
        """The package's error for Chroma's refusal of vectors of ``size``; else ``None``."""
        if type(exc).__name__ != "InvalidArgumentError" or "dimension" not in str(exc):
            return None
        try:
            stored = self._stored_size(exc)
        except Exception:  # the refusal is what the caller raises then
            return None
        if stored is None or stored == size:
            return None
        return EmbeddingDimensionError([stored], size, remedy=REINDEX)

    @staticmethod
    def _check_k(k: int) -> None:
        check_int("k", k)

    def search(self, query: str, k: int = 4, where: dict[str, Any] | None = None) -> list[Document]:
        """The ``k`` chunks most similar to ``query``.

        Args:
            query: What to look for.
            k: How many chunks.
            where: A Chroma metadata filter, e.g. ``{"filename": "faq.md"}``.

        Returns:
            Documents with the chunk's metadata and ``score`` (cosine similarity).

        Chunks another embedding model made are left out (their similarity
        is noise), with a warning, until :meth:`reindex` or until their files
        or texts are added again.

        Raises:
            EmbeddingDimensionError: If the collection holds vectors of another
                size (another model's): see :meth:`reindex`.
        """
        if not isinstance(query, str):
            msg = f"query must be a str, got {type(query).__name__}"
            raise TypeError(msg)
        self._check_k(k)
        return self._query(self.embedding.embed_query(query), k, where)

    async def asearch(
        self, query: str, k: int = 4, where: dict[str, Any] | None = None
    ) -> list[Document]:
        """Async :meth:`search`: the embedding's async path, then Chroma's query."""
        if not isinstance(query, str):
            msg = f"query must be a str, got {type(query).__name__}"
            raise TypeError(msg)
        self._check_k(k)
        vector = await self.embedding.aembed_query(query)
        # The chromadb client given here is synchronous.
        return await run_in_executor(None, self._query, vector, k, where)

    def as_retriever(self, k: int = 4, where: dict[str, Any] | None = None) -> KnowledgeRetriever:
        """A LangChain retriever; ``k`` may also be passed per call."""
        self._check_k(k)
        return KnowledgeRetriever(knowledge_base=self, k=k, where=where)


class KnowledgeRetriever(BaseRetriever):
    """A retriever over a :class:`KnowledgeBase`: ``retriever.invoke(query, k=2)``."""

    knowledge_base: Any
    k: int = 4
    where: dict[str, Any] | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return self.knowledge_base.search(query, k=kwargs.get("k", self.k), where=self.where)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return await self.knowledge_base.asearch(query, k=kwargs.get("k", self.k), where=self.where)
