"""``KnowledgeBase``: documents split into a Chroma collection of their own, for RAG.

The v3 design keeps the knowledge base beside the long-term memory: the same Chroma
(client and embedding model), another collection. Files and texts are split with
langchain-text-splitters' ``RecursiveCharacterTextSplitter`` (Markdown-aware for
``.md`` files, with Chinese sentence ends as separators); chunk ids are
deterministic, so adding a file again replaces its chunks instead of duplicating
them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
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

from langchain_tiered_memory.core.extras import import_extra
from langchain_tiered_memory.core.validation import check_int
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

#: Chinese sentence and clause ends, tried before spaces (Chinese has none). Zero-width
#: regexes, so the punctuation stays at the end of its sentence.
CJK_SEPARATORS = ["(?<=。)", "(?<=！)", "(?<=？)", "(?<=；)", "(?<=，)"]
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
UPSERT_BATCH = 512
#: The chunk metadata naming the embedding model of its vector (``model_name``);
#: kept out of the metadata ``search`` returns.
MODEL_KEY = "embedding_model"
#: Writers of one source in this process take turns: two versions written at once
#: would otherwise leave the first chunks of one and delete the rest (each deletes
#: what is beyond its own end). Striped by collection and source, so the set stays small.
SOURCE_LOCKS = tuple(threading.Lock() for _ in range(64))


def _separators(base: Sequence[str]) -> list[str]:
    """``base`` with the CJK separators inserted before the space separator."""
    base = list(base)
    at = base.index(" ") if " " in base else max(len(base) - 1, 0)
    return [*base[:at], *CJK_SEPARATORS, *base[at:]]


def _source_of(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


def chunk_ids(key: str, count: int) -> list[str]:
    """The ids of a document's chunks: its key and each chunk's position."""
    return [digest(key, str(index))[:32] for index in range(count)]


class KnowledgeBase:
    """Documents for retrieval-augmented answers, in a Chroma collection of their own.

    Location arguments take precedence like ``langchain-chroma`` and
    :class:`~langchain_tiered_memory.ChromaLongMemory`: ``client`` over
    ``persist_directory`` over ``host``; with none of them, an embedded client in
    ``$TIERED_MEMORY_HOME/chroma`` (telemetry off). Use :meth:`from_long_memory`
    to share the long-term memory's client and embedding model.

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
            self.collection = self.client.get_or_create_collection(
                collection_name, embedding_function=None, metadata={"hnsw:space": "cosine"}
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
        self._other_models = OtherModelWarning("add their files or texts again")
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
    def _writing(self, sources: Iterable[Any]) -> Iterator[None]:
        """Hold the locks of ``sources`` in this collection (in one order: no deadlock)."""
        collection = str(self.collection.id)
        stripes = sorted({hash((collection, str(s))) % len(SOURCE_LOCKS) for s in sources})
        with ExitStack() as held:
            for stripe in stripes:
                held.enter_context(SOURCE_LOCKS[stripe])
            yield

    def _upsert(self, ids: list[str], chunks: list[str], metadatas: list[dict[str, Any]]) -> None:
        model = model_name(self.embedding)
        for start in range(0, len(ids), UPSERT_BATCH):
            end = start + UPSERT_BATCH
            self.collection.upsert(
                ids=ids[start:end],
                embeddings=self.embedding.embed_documents(chunks[start:end]),
                documents=chunks[start:end],
                metadatas=[{**m, MODEL_KEY: model} for m in metadatas[start:end]],
            )

    def add_texts(
        self, texts: Iterable[str], metadatas: Sequence[dict[str, Any]] | None = None
    ) -> list[str]:
        """Split texts into chunks and store them.

        The texts of one ``source`` (metadata) are one document: its chunks are
        numbered across them, and adding that source again replaces its chunks, as
        :meth:`add_files` does a file's (chunks beyond the new end are deleted
        after the new ones are stored). A text without a source is keyed by its
        text: adding it again, or twice in one call, stores it once.

        Args:
            texts: The texts.
            metadatas: One metadata dict per text (str, int, float or bool values,
                as Chroma requires); ``source`` is the key :meth:`delete_source`
                uses.

        Returns:
            The ids of the stored chunks.

        Raises:
            TypeError: If a text is not a str.
            ValueError: If ``metadatas`` does not match ``texts`` in length.
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
        # One document per source (its texts' chunks numbered across them), or per
        # distinct text without a source (the same text twice is stored once).
        documents: dict[str, tuple[Any, list[str], list[dict[str, Any]]]] = {}
        for position, text in enumerate(texts):
            metadata = dict(metadatas[position]) if metadatas is not None else {}
            has_source = "source" in metadata
            key = str(metadata["source"]) if has_source else f"text:{digest(text)}"
            if key in documents and not has_source:
                continue
            source = metadata["source"] if has_source else None
            _, chunks, chunk_metadatas = documents.setdefault(key, (source, [], []))
            for chunk in self._text_splitter.split_text(text):
                chunk_metadatas.append({**metadata, "chunk": len(chunks)})
                chunks.append(chunk)
        ids: list[str] = []
        all_chunks: list[str] = []
        all_metadatas: list[dict[str, Any]] = []
        for key, (_, chunks, chunk_metadatas) in documents.items():
            ids += chunk_ids(key, len(chunks))
            all_chunks += chunks
            all_metadatas += chunk_metadatas
        sources = [source for source, _, _ in documents.values() if source is not None]
        with self._writing(sources):
            self._upsert(ids, all_chunks, all_metadatas)  # one batch: embedded together
            for source in sources:  # after the new chunks are stored: never a moment with none
                self._delete_where({"source": source}, keep=set(ids))
        return ids

    def add_files(
        self, paths: str | Path | Iterable[str | Path], encoding: str = "utf-8"
    ) -> list[str]:
        """Split text or Markdown files into chunks and store them.

        Each chunk's metadata holds ``source`` (the file's absolute path),
        ``filename`` and ``chunk`` (its position). Adding a file again replaces its
        chunks: changed chunks are overwritten, and chunks beyond its new end are
        deleted after the new ones are stored.

        Args:
            paths: One path or several.
            encoding: The files' encoding.

        Returns:
            The ids of the stored chunks.

        Raises:
            FileNotFoundError: If a path is not a file.
            ValueError: If a file cannot be decoded with ``encoding``.
        """
        if isinstance(paths, (str, Path)):
            paths = [paths]
        files = [Path(path).expanduser().resolve() for path in paths]
        for file in files:  # check them all before writing anything
            if not file.is_file():
                msg = f"no such file: {file}"
                raise FileNotFoundError(msg)
        all_ids: list[str] = []
        for file in files:
            try:
                text = file.read_text(encoding=encoding)
            except UnicodeDecodeError as exc:
                msg = f"{file} is not a {encoding} text file: {exc.reason} at byte {exc.start}"
                raise ValueError(msg) from exc
            text = text.removeprefix("\ufeff")
            source = str(file)
            splitter = (
                self._markdown_splitter
                if file.suffix.lower() in MARKDOWN_SUFFIXES
                else self._text_splitter
            )
            chunks = splitter.split_text(text)
            metadatas = [
                {"source": source, "filename": file.name, "chunk": index}
                for index in range(len(chunks))
            ]
            ids = chunk_ids(source, len(chunks))
            with self._writing([source]):
                self._upsert(ids, chunks, metadatas)
                self._delete_where({"source": source}, keep=set(ids))  # after: never none
            all_ids += ids
        return all_ids

    def _delete_where(self, where: dict[str, Any], keep: set[str] | None = None) -> int:
        keep = keep or set()
        deleted = 0
        offset = 0
        while True:
            page = self.collection.get(where=where, limit=PAGE, offset=offset, include=[])["ids"]
            if not page:
                return deleted
            doomed = [chunk_id for chunk_id in page if chunk_id not in keep]
            if doomed:
                self.collection.delete(ids=doomed)
                deleted += len(doomed)
            offset += len(page) - len(doomed)  # kept ids stay in the result set

    def delete_source(self, path: str | Path) -> int:
        """Delete every chunk of a file (or of texts added with that ``source``).

        Args:
            path: The file's path, absolute or relative to the current folder, or
                the ``source`` given to :meth:`add_texts`.

        Returns:
            How many chunks were deleted.
        """
        sources = sorted({str(path), _source_of(path)})
        with self._writing(sources):
            return self._delete_where({"source": {"$in": sources}})

    # -- reading -----------------------------------------------------------------

    def _query(
        self, vector: Sequence[float], k: int, where: dict[str, Any] | None
    ) -> list[Document]:
        model = model_name(self.embedding)
        wanted = k
        while True:
            found = self.collection.query(
                query_embeddings=[list(vector)],
                n_results=wanted,
                where=where,
                include=["documents", "metadatas", "distances"],
            )
            metadatas = [dict(metadata or {}) for metadata in found["metadatas"][0]]
            # A chunk of no recorded model was stored by an earlier version: compared as is.
            made = [m.pop(MODEL_KEY, None) for m in metadatas]
            foreign = [name for name in made if name not in (model, None)]
            # Another model's chunks take places of this model's: ask for more.
            if not foreign or len(made) < wanted or len(made) - len(foreign) >= k:
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
            for chunk_id, text, metadata, distance, name in zip(
                found["ids"][0],
                found["documents"][0],
                metadatas,
                found["distances"][0],
                made,
                strict=True,
            )
            if name in (model, None)
        ][:k]

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
        is noise), with a warning, until their files or texts are added again.
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
