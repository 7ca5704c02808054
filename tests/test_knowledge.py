"""KnowledgeBase: files and texts split into a Chroma collection of their own.

Real embedded Chroma (``PersistentClient`` in tmp folders, or the session's shared
client with a collection per test) and a real ``chroma run`` server for the host
case; ``HashEmbeddings`` where retrieval quality is not under test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import chromadb
import pytest
from chromadb.api.models.Collection import Collection
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_tiered_memory import EmbeddingDimensionError, KnowledgeBase, MySQLBackup
from langchain_tiered_memory.integrations import knowledge
from langchain_tiered_memory.integrations.knowledge import KnowledgeRetriever
from langchain_tiered_memory.text.embeddings import model_name
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory, digest

from .conftest import chroma_settings
from .fakes import HashEmbeddings, SaltedHashEmbeddings, WideHashEmbeddings
from .scripts import run_python

MakeKB = Callable[..., KnowledgeBase]

AR_DOC = """# Receivables

## The AR table
The ar_invoice table holds invoice_no, customer_id, amount and due_date.
Invoices are due thirty days after issue.

## Reminders
Overdue invoices trigger a reminder email on the first business day of the week.
"""


@pytest.fixture
def make_kb(chroma_client: Any) -> Iterator[MakeKB]:
    """Knowledge bases on the session's embedded client, a collection each; dropped after."""
    made: list[KnowledgeBase] = []

    def make(**kwargs: Any) -> KnowledgeBase:
        kwargs.setdefault("client", chroma_client)
        kwargs.setdefault("embedding", HashEmbeddings())
        kwargs.setdefault("collection_name", f"kb_{uuid.uuid4().hex[:12]}")
        kb = KnowledgeBase(**kwargs)
        made.append(kb)
        return kb

    yield make
    for name in {kb.collection.name for kb in made}:
        chroma_client.delete_collection(name)


def all_chunks(kb: KnowledgeBase) -> dict[str, tuple[str, dict[str, Any]]]:
    found = kb.collection.get(include=["documents", "metadatas"])
    return {
        chunk_id: (text, metadata)
        for chunk_id, text, metadata in zip(
            found["ids"], found["documents"], found["metadatas"], strict=True
        )
    }


# -- construction ------------------------------------------------------------------


def test_client_wins_over_persist_directory_and_host(tmp_path: Path, chroma_client: Any) -> None:
    name = f"kb_{uuid.uuid4().hex[:12]}"
    kb = KnowledgeBase(
        client=chroma_client,
        persist_directory=tmp_path / "unused",
        host="chroma.invalid",
        port=1,
        collection_name=name,
        embedding=HashEmbeddings(),
    )
    try:
        assert kb.client is chroma_client
        assert kb.collection.name == name
        assert kb.collection.metadata["hnsw:space"] == "cosine"
        assert not (tmp_path / "unused").exists()
    finally:
        chroma_client.delete_collection(name)


def test_persist_directory_wins_over_host_with_telemetry_off(tmp_path: Path) -> None:
    kb = KnowledgeBase(
        persist_directory=tmp_path / "here",
        host="chroma.invalid",
        port=1,
        embedding=HashEmbeddings(),
    )
    settings = kb.client.get_settings()
    assert settings.is_persistent is True
    assert Path(settings.persist_directory) == tmp_path / "here"
    assert settings.anonymized_telemetry is False
    assert kb.collection.name == "knowledge"
    kb.add_texts(["persisted text"])
    assert kb.count() == 1


def test_default_location_is_under_tiered_memory_home(_home: Path) -> None:
    kb = KnowledgeBase(embedding=HashEmbeddings())
    assert Path(kb.client.get_settings().persist_directory) == _home / "chroma"


def test_host_alone_gives_an_http_client(chroma_server: tuple[str, int]) -> None:
    host, port = chroma_server
    name = f"kb_{uuid.uuid4().hex[:12]}"
    kb = KnowledgeBase(host=host, port=port, collection_name=name, embedding=HashEmbeddings())
    try:
        settings = kb.client.get_settings()
        assert settings.is_persistent is False
        assert settings.chroma_server_host == host
        assert int(settings.chroma_server_http_port) == port
        assert settings.anonymized_telemetry is False
        kb.add_texts(["served text about invoices"])
        assert [d.page_content for d in kb.search("invoices", k=1)] == [
            "served text about invoices"
        ]
    finally:
        kb.client.delete_collection(name)


def test_from_long_memory_shares_client_and_embedding(tmp_path: Path, chroma_client: Any) -> None:
    archive = MySQLBackup(f"sqlite:///{tmp_path / 'a.sqlite3'}")
    memories = f"lm_{uuid.uuid4().hex[:12]}"
    knowledge = f"kb_{uuid.uuid4().hex[:12]}"
    embedding = HashEmbeddings()
    long_memory = ChromaLongMemory(
        client=chroma_client,
        collection_name=memories,
        embedding=embedding,
        backup=archive,
        start_worker=False,
    )
    try:
        kb = KnowledgeBase.from_long_memory(long_memory, collection_name=knowledge, chunk_size=50)
        assert kb.client is chroma_client
        assert kb.embedding is embedding
        assert kb.collection.name == knowledge
        assert (kb.chunk_size, kb.chunk_overlap) == (50, 10)  # overlap follows the size
        kb.add_texts(["knowledge is not memory"])
        assert long_memory.collection.count() == 0  # a separate collection
        with pytest.raises(ValueError, match="collection of its own"):
            KnowledgeBase.from_long_memory(long_memory, collection_name=memories)
    finally:
        long_memory.close()
        archive.dispose()
        for name in (memories, knowledge):
            chroma_client.delete_collection(name)


def test_bad_settings_are_value_errors(chroma_client: Any) -> None:
    for kwargs in (
        {"chunk_size": 0},
        {"chunk_size": 100, "chunk_overlap": 100},
        {"chunk_overlap": -1},
        {"collection_name": ""},
        {"collection_name": "k2"},  # refused by Chroma (under 3 characters)
    ):
        with pytest.raises(ValueError, match=r"chunk_size|chunk_overlap|collection_name"):
            KnowledgeBase(client=chroma_client, embedding=HashEmbeddings(), **kwargs)


# -- texts -------------------------------------------------------------------------


def test_add_texts_splits_and_retrieves_the_right_chunk(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    ids = kb.add_texts([AR_DOC, "Deployments happen on Fridays."], [{"source": "ar"}, {}])
    assert len(ids) == len(set(ids)) == kb.count() > 2
    chunks = all_chunks(kb)
    assert all(len(text) <= 120 for text, _ in chunks.values())
    ar = sorted((m["chunk"], t) for t, m in chunks.values() if m.get("source") == "ar")
    assert [index for index, _ in ar] == list(range(len(ar)))
    assert "reminder email" in " ".join(text for _, text in ar)
    top = kb.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content
    assert top.metadata["source"] == "ar"
    assert 0 < top.metadata["score"] <= 1
    assert top.id in ids
    assert set(top.metadata) == {"source", "chunk", "score"}  # what it keeps to itself left out


def moved_model(kb: KnowledgeBase, client: Any) -> KnowledgeBase:
    """``kb``'s collection, with another embedding model of the same size."""
    return KnowledgeBase(
        client=client,
        collection_name=kb.collection.name,
        embedding=SaltedHashEmbeddings(),
        chunk_size=kb.chunk_size,
        chunk_overlap=kb.chunk_overlap,
    )


def test_chunks_of_another_embedding_model_are_left_out_until_added_again(
    make_kb: MakeKB, chroma_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    kb.add_texts([AR_DOC], [{"source": "ar"}])
    assert "embedding_model" not in kb.search("reminder email", k=1)[0].metadata
    # The same collection with another model of the same size (as a knowledge base
    # sharing a Chinese tier's model gets once the multilingual extra is installed).
    moved = moved_model(kb, chroma_client)

    with caplog.at_level(logging.WARNING):
        assert moved.search("which day is the reminder email sent", k=2) == []

    assert f"were made by {model_name(HashEmbeddings())!r}" in caplog.text
    assert "add their files or texts again" in caplog.text
    moved.add_texts([AR_DOC], [{"source": "ar"}])  # the source's chunks, replaced
    top = moved.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content


def test_another_models_chunks_do_not_take_the_places_of_this_models(
    make_kb: MakeKB, chroma_client: Any
) -> None:
    kb = make_kb(chunk_size=40, chunk_overlap=0)
    kb.add_texts([f"invoice rule {i} for the ledger" for i in range(6)])
    moved = moved_model(kb, chroma_client)
    moved.add_texts(["coffee is roasted", "tea is brewed", "water is boiled"])

    found = moved.search("invoice rule for the ledger", k=3)

    assert sorted(doc.page_content for doc in found) == [
        "coffee is roasted",
        "tea is brewed",
        "water is boiled",
    ]


def test_adding_the_same_texts_again_does_not_duplicate(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    first = kb.add_texts([AR_DOC, "another text"])
    second = kb.add_texts([AR_DOC, "another text"])
    assert first == second
    assert kb.count() == len(first)


def test_texts_of_one_source_are_one_document_and_re_adding_it_replaces_it(
    make_kb: MakeKB,
) -> None:
    kb = make_kb(chunk_size=60, chunk_overlap=0)
    paragraphs = [AR_DOC, "Deployments happen on Fridays.", "keep me"]
    ids = kb.add_texts(paragraphs, [{"source": "wiki/ar"}, {"source": "wiki/ar"}, {}])
    assert len(ids) == len(set(ids)) == kb.count()
    wiki = sorted(m["chunk"] for _, m in all_chunks(kb).values() if m.get("source") == "wiki/ar")
    assert wiki == list(range(len(ids) - 1))  # numbered across the source's texts

    kb.add_texts(["New policy: pay within 10 days."], [{"source": "wiki/ar"}])
    texts = sorted(text for text, _ in all_chunks(kb).values())
    assert texts == ["New policy: pay within 10 days.", "keep me"]


def test_the_same_text_twice_in_one_call_is_stored_once(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    ids = kb.add_texts(["same words", "same words", "other words"])
    assert len(ids) == kb.count() == 2


def test_chinese_text_is_split_at_sentence_ends(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=20, chunk_overlap=0)
    kb.add_texts(
        ["应收账款表记录了客户的发票。每张发票有一个编号，还有金额和到期日。付款后状态变为已结清。"]
    )
    texts = sorted(text for text, _ in all_chunks(kb).values())
    assert texts == sorted(
        [
            "应收账款表记录了客户的发票。",
            "每张发票有一个编号，还有金额和到期日。",
            "付款后状态变为已结清。",
        ]
    )


def test_add_texts_input_errors(make_kb: MakeKB) -> None:
    kb = make_kb()
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        kb.add_texts(["ok", 42])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 metadatas for 1 texts"):
        kb.add_texts(["one"], [{}, {}])
    assert kb.count() == 0
    kb.add_texts("a single string is one text")
    assert kb.count() == 1
    with pytest.raises(TypeError, match="query must be a str"):
        kb.search(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be a positive int"):
        kb.as_retriever(k=0)


# -- files -------------------------------------------------------------------------


def test_add_files_records_the_source_and_replaces_on_re_add(
    make_kb: MakeKB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ar.md").write_text(AR_DOC, encoding="utf-8")
    (docs / "faq.txt").write_text("Deployments happen on Fridays.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    ids = kb.add_files(["docs/ar.md", docs / "faq.txt"])
    chunks = all_chunks(kb)
    assert set(chunks) == set(ids)
    sources = {metadata["source"] for _, metadata in chunks.values()}
    assert sources == {str(docs / "ar.md"), str(docs / "faq.txt")}
    md_chunks = [t for t, m in chunks.values() if m["filename"] == "ar.md"]
    assert len(md_chunks) > 1
    assert any(text.startswith("## The AR table") for text in md_chunks)  # split at headings

    assert kb.add_files(docs / "ar.md") == [i for i in ids if chunks[i][1]["filename"] == "ar.md"]
    assert kb.count() == len(ids)  # re-adding does not duplicate

    (docs / "ar.md").write_text("# Receivables\nShorter now: only the AR table.", encoding="utf-8")
    kb.add_files("docs/ar.md")
    md_now = [t for t, m in all_chunks(kb).values() if m["filename"] == "ar.md"]
    assert md_now == ["# Receivables\nShorter now: only the AR table."]  # stale chunks gone

    assert kb.delete_source("docs/ar.md") == 1
    assert [m["filename"] for _, m in all_chunks(kb).values()] == ["faq.txt"]
    assert kb.delete_source(docs / "missing.md") == 0


def test_delete_source_of_texts_added_with_a_source(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=60, chunk_overlap=0)
    kb.add_texts([AR_DOC, "keep me"], [{"source": "wiki/ar"}, {"source": "wiki/other"}])
    removed = kb.delete_source("wiki/ar")
    assert removed > 1
    assert [text for text, _ in all_chunks(kb).values()] == ["keep me"]


def test_file_errors_name_the_file_and_store_nothing(make_kb: MakeKB, tmp_path: Path) -> None:
    kb = make_kb()
    good = tmp_path / "good.txt"
    good.write_text("fine", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"nope\.md"):
        kb.add_files([good, tmp_path / "nope.md"])
    assert kb.count() == 0
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not a utf-8 text file"):
        kb.add_files(latin)
    assert kb.add_files(latin, encoding="latin-1")
    bom = tmp_path / "bom.md"
    bom.write_bytes("\ufeff# Title".encode())
    kb.add_files(bom)
    assert "# Title" in [text for text, _ in all_chunks(kb).values()]


def test_empty_file_removes_its_old_chunks(make_kb: MakeKB, tmp_path: Path) -> None:
    kb = make_kb()
    path = tmp_path / "notes.txt"
    path.write_text("something", encoding="utf-8")
    kb.add_files(path)
    path.write_text("", encoding="utf-8")
    assert kb.add_files(path) == []
    assert kb.count() == 0


# -- retrieval ---------------------------------------------------------------------


async def test_retriever_invoke_ainvoke_k_and_filter(make_kb: MakeKB, tmp_path: Path) -> None:
    kb = make_kb(chunk_size=80, chunk_overlap=0)
    kb.add_texts(
        [f"note {i} about invoices and reminders" for i in range(6)],
        [{"source": f"n{i}", "team": "ar" if i % 2 else "ap"} for i in range(6)],
    )
    retriever = kb.as_retriever(k=3)
    assert isinstance(retriever, BaseRetriever)
    assert len(retriever.invoke("invoices")) == 3
    assert len(retriever.invoke("invoices", k=5)) == 5
    docs = await retriever.ainvoke("invoices", k=2)
    assert len(docs) == 2 and all("invoices" in d.page_content for d in docs)
    filtered = kb.as_retriever(k=6, where={"team": "ar"}).invoke("invoices")
    assert sorted(d.metadata["source"] for d in filtered) == ["n1", "n3", "n5"]
    assert await kb.asearch("invoices", k=1) == kb.search("invoices", k=1)


def test_search_on_an_empty_base_is_empty(make_kb: MakeKB) -> None:
    assert make_kb().search("anything") == []


class TestKnowledgeRetrieverStandard(RetrieversIntegrationTests):
    """``KnowledgeRetriever`` against langchain-tests' integration suite."""

    kb: ClassVar[KnowledgeBase]

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _kb(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
        folder = tmp_path_factory.mktemp("kb-standard")
        cls.kb = KnowledgeBase(persist_directory=folder, embedding=HashEmbeddings())
        cls.kb.add_texts(
            [
                "The AR table has invoice number, amount and due date",
                "Invoices are due thirty days after issue",
                "The AP table lists vendors and amounts",
                "Deployments happen on Fridays",
                "The dashboard has a dark mode",
                "Overdue invoices trigger a reminder email",
            ]
        )
        yield

    @property
    def retriever_constructor(self) -> type[KnowledgeRetriever]:
        return KnowledgeRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"knowledge_base": type(self).kb, "k": 4}

    @property
    def retriever_query_example(self) -> str:
        return "invoice due date"


def test_importing_the_package_does_not_import_the_splitters() -> None:
    # The extra is optional: only KnowledgeBase needs it (checked in a fresh interpreter).
    import subprocess
    import sys

    code = (
        "import sys, langchain_tiered_memory as m; "
        "assert 'langchain_text_splitters' not in sys.modules; "
        "m.create_tiered_chain; m.FinishReasonHandler; "
        "assert 'langchain_text_splitters' not in sys.modules, 'chain imported the splitters'"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


class _Watched:
    """A collection whose upserts announce themselves and whose reads can be held back."""

    def __init__(
        self,
        inner: Any,
        stored: threading.Event,
        hold_reads_until: threading.Event | None = None,
        hold_reads_after_upsert_until: threading.Event | None = None,
    ) -> None:
        self._inner = inner
        self._stored = stored
        self._hold = hold_reads_until
        self._hold_after = hold_reads_after_upsert_until

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def upsert(self, **kwargs: Any) -> None:
        self._inner.upsert(**kwargs)
        self._stored.set()

    def get(self, **kwargs: Any) -> Any:
        if self._hold is not None:
            self._hold.wait(2.0)
        if self._hold_after is not None and self._stored.is_set():
            self._hold_after.wait(2.0)
        return self._inner.get(**kwargs)


class _Gated(HashEmbeddings):
    """Embeds only once ``gate`` is set (or 2 s have passed)."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self._gate = gate

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self._gate.wait(2.0)
        return super().embed_documents(texts)


def stored_texts(kb: KnowledgeBase) -> list[str]:
    """The texts of the collection's chunks, in chunk order."""
    chunks = sorted(all_chunks(kb).values(), key=lambda chunk: chunk[1]["chunk"])
    return [text for text, _ in chunks]


@pytest.mark.parametrize("long_by", ["add_texts", "add_files"])
def test_two_versions_of_one_source_written_at_once_leave_one_whole(
    make_kb: MakeKB, tmp_path: Path, long_by: str
) -> None:
    """Two knowledge bases on one collection write a short and a long version of one
    source at once. Without turns, each writer's delete (of the source's chunks that are
    not its own) ran after the other's upsert: nothing of either version was left."""
    path = tmp_path / "policy.txt"
    short = "Invoices are due in 30 days. Pay by bank transfer."
    long = " ".join(f"Clause {n}: reminders go out on day {n * 7}." for n in range(1, 11))
    path.write_text(long, encoding="utf-8")
    versions = []
    for text in (short, long):
        alone = make_kb(chunk_size=40, chunk_overlap=0)
        alone.add_texts([text], [{"source": "alone"}])
        versions.append(stored_texts(alone))
    assert len(versions[1]) > len(versions[0]) > 1

    short_stored, long_stored = threading.Event(), threading.Event()
    kb_short = make_kb(chunk_size=40, chunk_overlap=0)
    kb_long = make_kb(
        chunk_size=40,
        chunk_overlap=0,
        collection_name=kb_short.collection.name,
        embedding=_Gated(short_stored),  # the long version is stored after the short one
    )
    # ... and the short writer looks for chunks to delete after the long one's upsert.
    kb_short.collection = _Watched(kb_short.collection, short_stored, long_stored)
    kb_long.collection = _Watched(kb_long.collection, long_stored)
    source = str(path.resolve())

    def write_long() -> None:
        if long_by == "add_files":
            kb_long.add_files([path])
        else:
            kb_long.add_texts([long], [{"source": source}])

    writers = [
        threading.Thread(target=kb_short.add_texts, args=([short], [{"source": source}])),
        threading.Thread(target=write_long),
    ]
    for writer in writers:
        writer.start()
        time.sleep(0.05)
    for writer in writers:
        writer.join(10)
    assert stored_texts(kb_short) in versions


# -- failed writes, other models, source keys --------------------------------------


class _FailsOnSecondBatch(HashEmbeddings):
    """An embedding service that refuses its second request (a 429, a timeout...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("429 rate limited")
        return super().embed_documents(texts)


class _Fails:
    """A collection whose ``method`` fails at its ``at``-th call, and after it if ``on``
    (Chroma gone away mid-write)."""

    def __init__(self, inner: Any, method: str, at: int, on: bool = False) -> None:
        self._inner = inner
        self._method = method
        self._at = at
        self._on = on
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        if name != self._method:
            return getattr(self._inner, name)

        def call(**kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self._at or (self._on and self.calls > self._at):
                raise ConnectionError("Chroma went away")
            return getattr(self._inner, name)(**kwargs)

        return call


def words(prefix: str, count: int) -> str:
    """``count`` numbered words: ``prefix-0000 prefix-0001 ...``."""
    return " ".join(f"{prefix}-{n:04d}" for n in range(count))


def texts_of(kb: KnowledgeBase, source: Any) -> list[str]:
    """The texts of the chunks of ``source``, sorted."""
    return sorted(kb.collection.get(where={"source": source}, include=["documents"])["documents"])


def versions_of(kb: KnowledgeBase, source: Any) -> set[str]:
    """Which versions ("old", "new") the chunks of ``source`` come from."""
    return {text.split("-")[0] for text in texts_of(kb, source)}


def test_an_embedding_error_in_a_later_batch_of_a_re_add_leaves_the_old_file_whole(
    make_kb: MakeKB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(knowledge, "UPSERT_BATCH", 4)
    path = tmp_path / "manual.txt"
    path.write_text(words("old", 28), encoding="utf-8")
    kb = make_kb(chunk_size=20, chunk_overlap=0)
    kb.add_files(path)
    before = stored_texts(kb)
    assert len(before) > 8  # several batches

    path.write_text(words("new", 24), encoding="utf-8")
    flaky = make_kb(
        chunk_size=20,
        chunk_overlap=0,
        collection_name=kb.collection.name,
        embedding=_FailsOnSecondBatch(),
    )
    with pytest.raises(ConnectionError, match="429"):
        flaky.add_files(path)

    assert stored_texts(kb) == before  # the old version, whole and alone


def test_a_chroma_error_in_a_later_batch_leaves_the_old_version_and_no_new_chunk(
    make_kb: MakeKB, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(knowledge, "UPSERT_BATCH", 4)
    kb = make_kb(chunk_size=20, chunk_overlap=0)
    kb.add_texts([words("old", 28)], [{"source": "manual"}])
    before = stored_texts(kb)

    failing = _Fails(kb.collection, "upsert", at=2)
    kb.collection = failing
    with pytest.raises(ConnectionError, match="went away"):
        kb.add_texts([words("new", 24)], [{"source": "manual"}])
    failing.calls = 0
    with pytest.raises(ConnectionError, match="went away"):  # a first add stores nothing
        kb.add_texts([words("new", 24)], [{"source": "another manual"}])
    kb.collection = failing._inner

    assert stored_texts(kb) == before
    assert versions_of(kb, "manual") == {"old"}
    assert versions_of(kb, "another manual") == set()
    kb.add_texts([words("new", 24)], [{"source": "manual"}])  # and trying again works
    assert versions_of(kb, "manual") == {"new"}


@pytest.mark.parametrize(
    ("metadata", "key"),
    [
        ({"tags": {"x": 1}}, "'tags'"),
        ({"$team": "ar"}, "'\\$team'"),
        # Each failed in Chroma's upsert, after every chunk was embedded, or was lost.
        ({"title": "t\udc80"}, "'title'"),
        ({"t\udc80": "x"}, "'t\\\\udc80'"),
        ({"tags": ["ok", "\ud800"]}, "'tags'"),
        ({"x": float("nan")}, "'x'"),
        ({"x": 2**70}, "'x'"),
        ({"chunk": 3}, "'chunk'"),
        ({"embedding_model": "mine"}, "'embedding_model'"),
        ({"score": 0.5}, "'score'"),
        ({"kb_version": "mine"}, "'kb_version'"),
    ],
)
def test_a_metadata_entry_chroma_refuses_stores_nothing_and_is_named(
    make_kb: MakeKB, monkeypatch: pytest.MonkeyPatch, metadata: dict[str, Any], key: str
) -> None:
    monkeypatch.setattr(knowledge, "UPSERT_BATCH", 4)
    kb = make_kb(chunk_size=20, chunk_overlap=0)
    with pytest.raises(ValueError, match=rf"metadatas\[1\]: metadata key {key} is refused"):
        kb.add_texts([words("big", 20), "small note"], [{"source": "big"}, metadata])
    assert kb.count() == 0


@pytest.mark.parametrize("source", ["~draft", "~team/notes", "wiki\x00ar", 5, 2.5, True])
def test_delete_source_deletes_every_source_add_texts_takes(make_kb: MakeKB, source: Any) -> None:
    kb = make_kb()
    kb.add_texts(["Invoices are due in 30 days."], [{"source": source}])
    kb.add_texts(["keep me"], [{"source": "other"}])

    assert kb.delete_source(source) == 1
    assert stored_texts(kb) == ["keep me"]


@pytest.mark.parametrize("source", ["doc\ud800", 2**63, -(2**63) - 1])
def test_a_source_no_filter_can_name_is_refused(make_kb: MakeKB, source: Any) -> None:
    # Chroma's where clause refused them with its own error (not a ValueError).
    kb = make_kb()
    kb.add_texts(["keep me"], [{"source": "other"}])
    with pytest.raises(ValueError, match="metadata key 'source' is refused"):
        kb.add_texts(["a note"], [{"source": source}])
    with pytest.raises(ValueError, match="source must"):
        kb.delete_source(source)
    assert stored_texts(kb) == ["keep me"]


def test_a_lone_surrogate_in_a_text_is_stored_as_the_replacement_character(
    make_kb: MakeKB,
) -> None:
    kb = make_kb()
    kb.add_texts(["an emoji cut in half: \ud83d here"], [{"source": "s"}])
    assert stored_texts(kb) == ["an emoji cut in half: \ufffd here"]


def test_a_text_without_a_source_split_anew_leaves_no_old_chunk(make_kb: MakeKB) -> None:
    # Stored again with a larger chunk_size, its old chunks past the new ones stayed
    # beside it and came back in searches.
    name = f"kb_{uuid.uuid4().hex[:12]}"
    text = words("plain", 60)
    make_kb(collection_name=name, chunk_size=60, chunk_overlap=0).add_texts([text])
    bigger = make_kb(collection_name=name, chunk_size=4000, chunk_overlap=0)
    assert bigger.count() > 1
    bigger.add_texts([text])
    assert stored_texts(bigger) == [text]


def test_a_source_of_none_is_refused(make_kb: MakeKB) -> None:
    # Chroma drops a None value: the chunks would have no source, never replaced nor deleted.
    kb = make_kb()
    with pytest.raises(ValueError, match="source must not be None"):
        kb.add_texts(["a note without a real source"], [{"source": None}])
    with pytest.raises(ValueError, match="source must not be None"):
        kb.delete_source(None)  # type: ignore[arg-type]
    assert kb.count() == 0


def test_sources_of_other_types_are_other_documents(make_kb: MakeKB) -> None:
    kb = make_kb(chunk_size=20, chunk_overlap=0)
    kb.add_texts(["alpha beta gamma delta epsilon zeta"], [{"source": 5}])
    kb.add_texts(["Pay within 10 days."], [{"source": "5"}])  # another document
    assert texts_of(kb, 5) == ["alpha beta gamma", "delta epsilon zeta"]
    assert texts_of(kb, "5") == ["Pay within 10 days."]

    assert kb.delete_source(5) == 2
    assert stored_texts(kb) == ["Pay within 10 days."]


async def test_a_model_of_another_size_is_named_until_reindex_moves_the_chunks(
    make_kb: MakeKB, chroma_client: Any
) -> None:
    kb = make_kb(chunk_size=60, chunk_overlap=0)
    kb.add_texts([AR_DOC, "Deployments happen on Fridays."], [{"source": "wiki/ar"}, {}])
    count = kb.count()
    bigger = make_kb(
        chunk_size=60,
        chunk_overlap=0,
        collection_name=kb.collection.name,
        embedding=WideHashEmbeddings(),
    )

    with pytest.raises(EmbeddingDimensionError, match=r"reindex\(\)") as refused:
        bigger.search("when are invoices due")
    assert (refused.value.stored, refused.value.model) == ((256,), 384)
    with pytest.raises(EmbeddingDimensionError):
        await bigger.asearch("when are invoices due")
    with pytest.raises(EmbeddingDimensionError):
        bigger.add_texts(["New policy: pay within 10 days."], [{"source": "wiki/ar"}])
    assert kb.count() == count  # nothing lost, nothing added

    assert bigger.reindex() == count
    top = bigger.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content
    assert bigger.collection.name == kb.collection.name
    assert bigger.collection.metadata["hnsw:space"] == "cosine"
    assert chroma_client.get_collection(kb.collection.name).count() == count
    bigger.add_texts(["New policy: pay within 10 days."], [{"source": "wiki/ar"}])
    assert sorted(stored_texts(bigger)) == [
        "Deployments happen on Fridays.",
        "New policy: pay within 10 days.",
    ]


KILLED_REINDEX = """
import os
from chromadb.api.models.Collection import Collection
from langchain_tiered_memory import KnowledgeBase
from tests.fakes import HashEmbeddings, WideHashEmbeddings

texts = [{doc!r}, "Deployments happen on Fridays."]
kb = KnowledgeBase(persist_directory="chroma", collection_name="kb-ar", chunk_size=60,
                   chunk_overlap=0, embedding=HashEmbeddings())
kb.add_texts(texts, [{{"source": "wiki/ar"}}, {{}}])
print(kb.count(), flush=True)
modify, renames = Collection.modify, []

def killed(self, *args, **kwargs):  # the process dies after {kill_after} renames
    if len(renames) == {kill_after}:
        os._exit(9)
    modify(self, *args, **kwargs)
    renames.append(kwargs)
    if len(renames) == {kill_after}:
        os._exit(9)

Collection.modify = killed
KnowledgeBase(persist_directory="chroma", collection_name="kb-ar", chunk_size=60,
              chunk_overlap=0, embedding=WideHashEmbeddings()).reindex()
"""


@pytest.mark.parametrize(
    ("kill_after", "opened_between"), [(0, False), (1, False), (1, True), (2, False)]
)
def test_a_reindex_killed_at_any_step_loses_no_chunk(
    tmp_path: Path, kill_after: int, opened_between: bool
) -> None:
    """A process killed while ``reindex`` swaps collections (before, between or after
    its renames) leaves every chunk; the next knowledge base of the name finishes,
    also when one opened between the renames created an empty collection of the name."""
    code = KILLED_REINDEX.format(doc=AR_DOC, kill_after=kill_after)
    count = int(run_python(code, tmp_path, returncode=9).stdout.split()[0])
    if opened_between:
        client = chromadb.PersistentClient(
            path=str(tmp_path / "chroma"), settings=chroma_settings()
        )
        client.create_collection("kb-ar", metadata=knowledge.COLLECTION_METADATA)

    kb = KnowledgeBase(
        persist_directory=tmp_path / "chroma",
        collection_name="kb-ar",
        chunk_size=60,
        chunk_overlap=0,
        embedding=WideHashEmbeddings(),
    )
    if kill_after == 0:  # killed before the old chunks lost their name: reindex again
        with pytest.raises(EmbeddingDimensionError):
            kb.search("reminder email")
        assert kb.reindex() == count
    assert kb.count() == count
    top = kb.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content
    names = [collection.name for collection in kb.client.list_collections()]
    assert not [name for name in names if name.startswith("kb-retired-")], names


def test_a_knowledge_base_opened_during_a_reindex_leaves_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened between the reindex's two renames, a knowledge base finds the name free
    and creates an empty collection under it: the reindex's new collection still
    takes the name (it used to fail, and every later knowledge base saw no chunk)."""
    folder = tmp_path / "chroma"
    settings: dict[str, Any] = {"chunk_size": 60, "chunk_overlap": 0}
    kb = KnowledgeBase(
        persist_directory=folder, collection_name="docs", embedding=HashEmbeddings(), **settings
    )
    kb.add_texts([AR_DOC, "Deployments happen on Fridays."])
    count = kb.count()
    modify = Collection.modify

    def open_between(self: Any, *args: Any, **kwargs: Any) -> None:
        modify(self, *args, **kwargs)
        if str(kwargs.get("name", "")).startswith(knowledge.RETIRED_PREFIX):
            # The opener looked for a half-done move before this rename (none), and
            # gets or creates its collection after it: the name is free.
            bigger.client.get_or_create_collection("docs", metadata=knowledge.COLLECTION_METADATA)

    monkeypatch.setattr(Collection, "modify", open_between)
    bigger = KnowledgeBase(
        persist_directory=folder, collection_name="docs", embedding=WideHashEmbeddings(), **settings
    )
    assert bigger.reindex() == count
    monkeypatch.undo()
    again = KnowledgeBase(
        persist_directory=folder, collection_name="docs", embedding=WideHashEmbeddings(), **settings
    )
    assert again.count() == count
    assert [c.name for c in again.client.list_collections()] == ["docs"]
    top = again.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content


def test_an_emptied_collection_keeps_its_size_until_reindex(make_kb: MakeKB) -> None:
    kb = make_kb()
    kb.add_texts(["Invoices are due in 30 days."], [{"source": "wiki/ar"}])
    kb.delete_source("wiki/ar")
    bigger = make_kb(collection_name=kb.collection.name, embedding=WideHashEmbeddings())

    with pytest.raises(EmbeddingDimensionError, match="256 dimensions"):
        bigger.add_texts(["Invoices are due in 30 days."], [{"source": "wiki/ar"}])

    assert bigger.reindex() == 0
    bigger.add_texts(["Invoices are due in 30 days."], [{"source": "wiki/ar"}])
    assert [d.page_content for d in bigger.search("invoices due")] == [
        "Invoices are due in 30 days."
    ]


def test_reindex_moves_the_chunks_of_a_model_of_the_same_size(
    make_kb: MakeKB, chroma_client: Any
) -> None:
    kb = make_kb(chunk_size=120, chunk_overlap=0)
    kb.add_texts([AR_DOC], [{"source": "ar"}])
    moved = moved_model(kb, chroma_client)
    assert moved.search("which day is the reminder email sent", k=2) == []

    assert moved.reindex() == kb.count()

    top = moved.search("which day is the reminder email sent for overdue invoices", k=1)[0]
    assert "reminder email" in top.page_content
    assert moved.collection.id == kb.collection.id  # the same size: in place


def test_writers_no_lock_reaches_never_leave_a_source_with_no_chunks(
    make_kb: MakeKB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes (no lock of this one reaches the other) re-add one source at once:
    A stores its version, B stores its own, then each deletes. Deleting every chunk of
    the source but its own, each deleted the other's version: nothing was left."""
    monkeypatch.setattr(KnowledgeBase, "_writing", lambda self, sources: contextlib.nullcontext())
    kb_a = make_kb(chunk_size=40, chunk_overlap=0)
    kb_b = make_kb(chunk_size=40, chunk_overlap=0, collection_name=kb_a.collection.name)
    kb_a.add_texts(["Version zero. Paid within sixty days of the invoice."], [{"source": "p"}])
    a_stored, b_stored = threading.Event(), threading.Event()
    # A reads the source again after B has stored; B reads it after A has stored.
    kb_a.collection = _Watched(kb_a.collection, a_stored, hold_reads_after_upsert_until=b_stored)
    kb_b.collection = _Watched(kb_b.collection, b_stored, hold_reads_until=a_stored)
    versions = {
        "a": "Version A. Invoices are due in 30 days.",
        "b": "Version B. Invoices are due in 45 days, by transfer.",
    }
    writers = [
        threading.Thread(target=kb.add_texts, args=([versions[name]], [{"source": "p"}]))
        for name, kb in (("a", kb_a), ("b", kb_b))
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(10)
    stored = " ".join(stored_texts(kb_a))
    assert "Version zero" not in stored
    assert "Version A" in stored or "Version B" in stored


# -- a re-add or a delete failing or killed between its steps ----------------------


def shown(kb: KnowledgeBase) -> list[str]:
    """The texts every search can show (all of them: k past the count), sorted."""
    return sorted(doc.page_content for doc in kb.search("old new plain", k=500))


#: Each case: what is stored first, and what replaces it (``None``: the file emptied);
#: ``sourceless``: a text without a source, split anew with another chunk_size.
REPLACED = {
    "add_texts": (words("old", 28), words("new", 24)),
    "add_files": (words("old", 28), words("new", 24)),
    "emptied file": (words("old", 28), None),
    "sourceless": (words("plain", 60), words("plain", 60)),
    "delete_source": (words("old", 28), None),
}


def replace(kb: KnowledgeBase, case: str, path: Path) -> None:
    """Store the case's second version (or delete the first) with ``kb``."""
    new = REPLACED[case][1]
    if case == "add_texts":
        kb.add_texts([new], [{"source": "manual"}])
    elif case == "sourceless":
        kb.add_texts([new])
    elif case == "delete_source":
        kb.delete_source("manual")
    else:
        path.write_text(new or "", encoding="utf-8")
        kb.add_files(path)


@pytest.mark.parametrize("case", list(REPLACED))
@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_failed_delete_of_the_old_version_leaves_one_version_in_searches(
    make_kb: MakeKB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, fail_at: int
) -> None:
    """The old version's chunks are deleted after the new ones are stored: when that
    delete failed (at its first page or a later one), both versions, or the new one and
    part of the old, came back in searches. Now searches show one version whole (the
    new one once it is stored), and adding or deleting again removes the rest."""
    monkeypatch.setattr(knowledge, "PAGE", 2)  # a delete of several pages
    name, path = f"kb_{uuid.uuid4().hex[:12]}", tmp_path / "manual.txt"
    old, new = REPLACED[case]
    first = make_kb(collection_name=name, chunk_size=20, chunk_overlap=0)
    if case in ("add_files", "emptied file"):
        path.write_text(old, encoding="utf-8")
        first.add_files(path)
    else:
        first.add_texts([old], [{}] if case == "sourceless" else [{"source": "manual"}])
    before = shown(first)
    assert len(before) > 8
    size = 4000 if case == "sourceless" else 20
    expected = [new] if case == "sourceless" else []
    if new is not None and case != "sourceless":
        alone = make_kb(chunk_size=20, chunk_overlap=0)
        alone.add_texts([new])
        expected = shown(alone)

    kb = make_kb(collection_name=name, chunk_size=size, chunk_overlap=0)
    failing = _Fails(kb.collection, "delete", at=fail_at, on=True)
    kb.collection = failing
    with pytest.raises(ConnectionError, match="went away"):
        replace(kb, case, path)
    kb.collection = failing._inner

    # The new version once stored, else the old one (an emptied file's delete failed
    # before its first page: nothing was deleted).
    assert shown(kb) == (before if new is None and fail_at == 1 else expected)
    replace(kb, case, path)  # trying again leaves the new version alone
    assert shown(kb) == expected
    assert sorted(text for text, _ in all_chunks(kb).values()) == expected


KILLED_WRITE = """
import os, signal
from chromadb.api.models.Collection import Collection
from langchain_tiered_memory import KnowledgeBase
from langchain_tiered_memory.integrations import knowledge
from tests.fakes import HashEmbeddings

knowledge.UPSERT_BATCH = 4
knowledge.PAGE = 2
kb = KnowledgeBase(persist_directory="chroma", collection_name="kb-manual", chunk_size=20,
                   chunk_overlap=0, embedding=HashEmbeddings())
kb.add_texts([{old!r}], [{{"source": "manual"}}])
calls = {{"upsert": 0, "delete": 0}}

def dying(name):
    real = getattr(Collection, name)
    def call(self, *args, **kwargs):
        calls[name] += 1
        if name == {kill_in!r} and calls[name] == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args, **kwargs)
    return call

Collection.upsert, Collection.delete = dying("upsert"), dying("delete")
new = {new!r}
if new is None:
    kb.delete_source("manual")
else:
    kb.add_texts([new], [{{"source": "manual"}}])
"""


@pytest.mark.parametrize(
    ("kill_in", "kill_at", "new", "left"),
    [
        ("upsert", 2, words("new", 24), "old"),  # while the new version is stored
        ("upsert", 3, words("new", 24), "old"),  # the last, with its first chunk
        ("delete", 1, words("new", 24), "new"),  # between the two steps
        ("delete", 2, words("new", 24), "new"),  # part of the old version deleted
        ("delete", 2, None, "none"),  # delete_source part-way
    ],
)
def test_a_process_killed_while_replacing_a_source_leaves_one_version_whole(
    tmp_path: Path, kill_in: str, kill_at: int, new: str | None, left: str
) -> None:
    """A real SIGKILL at each step of a re-add (or a delete_source): the next knowledge
    base of the folder shows one version whole, and adding the source again leaves only
    the new one."""
    old = words("old", 28)
    run_python(
        KILLED_WRITE.format(old=old, new=new, kill_in=kill_in, kill_at=kill_at),
        tmp_path,
        returncode=-9,
    )
    settings: dict[str, Any] = {"chunk_size": 20, "chunk_overlap": 0}
    kb = KnowledgeBase(
        persist_directory=tmp_path / "chroma",
        collection_name="kb-manual",
        embedding=HashEmbeddings(),
        **settings,
    )
    versions = {"none": []}
    for label, text in (("old", old), ("new", words("new", 24))):
        alone = KnowledgeBase(
            client=kb.client,
            collection_name=f"alone-{label}",
            embedding=HashEmbeddings(),
            **settings,
        )
        alone.add_texts([text])
        versions[label] = shown(alone)
    assert kb.count() > len(versions[left])  # the killed write left chunks behind
    assert shown(kb) == versions[left]
    kb.add_texts([words("new", 24)], [{"source": "manual"}])
    assert sorted(text for text, _ in all_chunks(kb).values()) == versions["new"]


def store_as_an_earlier_version(
    kb: KnowledgeBase, scratch: KnowledgeBase, text: str, metadata: dict[str, Any]
) -> None:
    """Store a sourceless text as the package did before chunks named their document:
    ids by the text's key and position, metadata of the chunk's position and model
    (the chunks as ``scratch``, of the same settings, splits it)."""
    scratch.add_texts([text])
    chunks = stored_texts(scratch)
    scratch.collection.delete(ids=scratch.collection.get(include=[])["ids"])
    key = f"text:{digest(text)}"
    kb.collection.upsert(
        ids=[digest(key, str(index))[:32] for index in range(len(chunks))],
        embeddings=kb.embedding.embed_documents(chunks),
        documents=chunks,
        metadatas=[
            {**metadata, "chunk": index, "embedding_model": model_name(kb.embedding)}
            for index in range(len(chunks))
        ],
    )


@pytest.mark.parametrize("metadata", [{}, {"lang": "en"}])
@pytest.mark.parametrize(("before", "after"), [(60, 60), (60, 250), (250, 60)])
@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_text_an_earlier_version_stored_is_shown_once_when_its_re_add_fails(
    make_kb: MakeKB,
    monkeypatch: pytest.MonkeyPatch,
    metadata: dict[str, Any],
    before: int,
    after: int,
    fail_at: int,
) -> None:
    """A text without a source stored by the previous version of the package (its chunks
    name no document) is added again and the delete of its old chunks fails: searches
    showed the old chunks beside the new version. Now the new version alone, and the
    next add leaves only it; another such text is untouched."""
    monkeypatch.setattr(knowledge, "PAGE", 2)
    name = f"kb_{uuid.uuid4().hex[:12]}"
    text, other = words("plain", 60), words("other", 30)
    legacy = make_kb(collection_name=name, chunk_size=before, chunk_overlap=0)
    scratch = make_kb(chunk_size=before, chunk_overlap=0)
    store_as_an_earlier_version(legacy, scratch, text, metadata)
    store_as_an_earlier_version(legacy, scratch, other, metadata)
    others = sorted(t for t, _ in all_chunks(legacy).values() if t.startswith("other"))
    alone = make_kb(chunk_size=after, chunk_overlap=0)
    alone.add_texts([text], [metadata])
    expected = sorted([*shown(alone), *others])

    kb = make_kb(collection_name=name, chunk_size=after, chunk_overlap=0)
    failing = _Fails(kb.collection, "delete", at=fail_at, on=True)
    kb.collection = failing
    with pytest.raises(ConnectionError, match="went away"):
        kb.add_texts([text], [metadata])
    kb.collection = failing._inner
    assert shown(kb) == expected
    assert all(doc.metadata.keys() == {*metadata, "chunk", "score"} for doc in kb.search("plain"))
    kb.add_texts([text], [metadata])
    assert shown(kb) == expected
    assert sorted(t for t, _ in all_chunks(kb).values()) == expected


class _AfterUpsert:
    """A collection that runs ``then`` once, after its first upsert."""

    def __init__(self, inner: Any, then: Callable[[], Any]) -> None:
        self._inner = inner
        self._then: Callable[[], Any] | None = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def upsert(self, **kwargs: Any) -> None:
        self._inner.upsert(**kwargs)
        then, self._then = self._then, None
        if then is not None:
            then()


@pytest.mark.parametrize("deleted", ["s0", "s1", "s3"])
def test_a_delete_source_in_another_process_during_a_write_never_leaves_part_of_a_version(
    make_kb: MakeKB, monkeypatch: pytest.MonkeyPatch, deleted: str
) -> None:
    """One add_texts writes new versions of four sources, more chunks than one upsert
    holds; another process (no lock reaches it) deletes one source after the first
    upsert. The chunks were batched with every version's first chunk at the end, so the
    delete took the stored part of a version whose first chunk came after: searches
    showed that first chunk alone. Now each version is stored by one upsert when it fits
    one: the deleted source shows its new version whole or nothing, the others whole."""
    monkeypatch.setattr(knowledge, "UPSERT_BATCH", 8)
    monkeypatch.setattr(KnowledgeBase, "_writing", lambda self, sources: contextlib.nullcontext())
    sources = [f"s{n}" for n in range(4)]
    writer = make_kb(chunk_size=20, chunk_overlap=0)
    other = make_kb(chunk_size=20, chunk_overlap=0, collection_name=writer.collection.name)
    writer.add_texts([words(f"old{n}", 8) for n in range(4)], [{"source": s} for s in sources])
    new = [words(f"new{n}", 10) for n in range(4)]
    alone = make_kb(chunk_size=20, chunk_overlap=0)
    alone.add_texts(new, [{"source": s} for s in sources])

    def of(kb: KnowledgeBase, source: str) -> list[str]:
        return sorted(d.page_content for d in kb.search("new", k=500, where={"source": source}))

    assert all(len(of(alone, source)) == 5 for source in sources)
    writer.collection = _AfterUpsert(writer.collection, lambda: other.delete_source(deleted))
    writer.add_texts(new, [{"source": s} for s in sources])
    for source in sources:
        shown_now = of(other, source)
        assert shown_now == of(alone, source) or (source == deleted and shown_now == [])
