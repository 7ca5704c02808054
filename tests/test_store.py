"""TieredStore on both databases: hybrid CJK search, TTL, hostile input, persistence."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore
from sqlalchemy import event, select

from langchain_tiered_memory import (
    ArchiveUnavailableError,
    EmbeddingDimensionError,
    MySQLBackup,
    TieredStore,
)
from langchain_tiered_memory.core.validation import MAX_NESTING
from langchain_tiered_memory.integrations.store import (
    InvalidFilterError,
    InvalidKeyError,
    ValueTooLargeError,
)
from langchain_tiered_memory.storage import archive
from langchain_tiered_memory.storage.store import matches_filter
from langchain_tiered_memory.text.embeddings import model_name

from .conftest import MYSQL_URL, require_mysql
from .fakes import HashEmbeddings, SaltedHashEmbeddings

MEMORIES = {
    "tea": {"text": "用户喜欢喝乌龙茶，不加糖", "kind": "preference"},
    "ar": {"text": "AR 表结构: ar_invoice 存放应收账款发票", "kind": "schema"},
    "cat": {"text": "My cat is called Miso and she is 7 years old", "kind": "fact"},
    "ledger": {"text": "The general ledger closes on the 5th of each month", "kind": "fact"},
}


@pytest.fixture
def store(backup: MySQLBackup) -> Iterator[TieredStore]:
    tiered = TieredStore(backup)
    yield tiered
    tiered.metadata.drop_all(backup.engine)


@pytest.fixture
def hybrid(backup: MySQLBackup) -> Iterator[TieredStore]:
    tiered = TieredStore(backup, index={"embed": HashEmbeddings(), "fields": ["text"]})
    yield tiered
    tiered.metadata.drop_all(backup.engine)


def fill(store: TieredStore, user: str = "u1") -> None:
    for key, value in MEMORIES.items():
        store.put(("users", user, "memories"), key, value)


def keys(items: list[Any]) -> list[str]:
    return [item.key for item in items]


# -- search: BM25 without an embedding, hybrid with one --------------------------


@pytest.mark.parametrize(
    ("query", "best"),
    [("乌龙茶", "tea"), ("应收账款", "ar"), ("what is my cat called", "cat"), ("ledger", "ledger")],
)
def test_a_query_ranks_the_matching_memory_first(store: TieredStore, query: str, best: str) -> None:
    fill(store)
    fill(store, "u2")  # another user's memories are outside the prefix

    hits = store.search(("users", "u1"), query=query, limit=10)

    assert keys(hits)[0] == best
    assert hits[0].score is not None and hits[0].score > 0
    assert {hit.namespace for hit in hits} == {("users", "u1", "memories")}
    # What does not match follows, unscored, in store order, so a page is still full.
    assert [hit.score for hit in hits[1:]] == [None] * (len(MEMORIES) - 1)
    assert keys(hits[1:]) == [key for key in MEMORIES if key != best]


def test_hybrid_search_blends_vectors_with_bm25(hybrid: TieredStore) -> None:
    fill(hybrid)

    hits = hybrid.search(("users",), query="乌龙茶 不加糖", limit=2)

    assert keys(hits)[0] == "tea"
    assert all(hit.score is not None for hit in hits)  # every indexed item has a vector
    assert hits[0].score >= hits[1].score  # type: ignore[operator]


def test_a_query_after_a_change_of_model_size_names_both_sizes(backup: MySQLBackup) -> None:
    old = TieredStore(
        backup, index={"embed": DeterministicFakeEmbedding(size=384), "fields": ["text"]}
    )
    old.put(("u1",), "tea", {"text": "likes oolong tea"})
    new = TieredStore(
        backup, index={"embed": DeterministicFakeEmbedding(size=768), "fields": ["text"]}
    )
    try:
        new.put(("u1",), "coffee", {"text": "hates coffee"})

        with pytest.raises(EmbeddingDimensionError) as refused:
            new.search(("u1",), query="tea")

        assert isinstance(refused.value, ValueError)
        assert (refused.value.stored, refused.value.model) == ((384,), 768)
        assert "384 dimensions" in str(refused.value) and "768" in str(refused.value)
        # What compares no vectors still works: nothing is lost.
        assert new.get(("u1",), "tea").value == {"text": "likes oolong tea"}  # type: ignore[union-attr]
        assert keys(new.search(("u1",))) == ["tea", "coffee"]
    finally:
        old.metadata.drop_all(backup.engine)


def test_items_of_another_model_of_the_same_size_are_ranked_by_their_words(
    backup: MySQLBackup, caplog: pytest.LogCaptureFixture
) -> None:
    old = TieredStore(backup, index={"embed": HashEmbeddings(), "fields": ["text"]})
    for key, text in [("tea", "likes oolong tea"), ("cat", "the cat is called Miso")]:
        old.put(("u1",), key, {"text": text})
    new = TieredStore(backup, index={"embed": SaltedHashEmbeddings(), "fields": ["text"]})
    words = TieredStore(backup, index={"embed": SaltedHashEmbeddings(), "fields": ["text"]})
    words.planner.dense_weight = 0.0  # BM25 alone
    try:
        with caplog.at_level(logging.WARNING):
            hits = new.search(("u1",), query="oolong tea")
        lexical = words.search(("u1",), query="oolong tea")
        assert [(h.key, h.score) for h in hits] == [(h.key, h.score) for h in lexical]
        assert f"2 vectors of the store's items were made by {model_name(HashEmbeddings())!r}" in (
            caplog.text
        )
        assert "put them again" in caplog.text
        # Put again, the items are the new model's: the query compares vectors.
        for item in new.search(("u1",)):
            new.put(("u1",), item.key, item.value)
        hits = new.search(("u1",), query="oolong tea")
        assert hits[0].key == "tea"
        assert [h.score for h in hits] != [h.score for h in lexical]
    finally:
        old.metadata.drop_all(backup.engine)


def test_items_of_another_model_rank_by_their_words_at_full_dense_weight(
    backup: MySQLBackup,
) -> None:
    old = TieredStore(backup, index={"embed": HashEmbeddings(), "fields": ["text"]})
    old.put(("u1",), "tea", {"text": "likes oolong tea"})
    cosine = TieredStore(
        backup, index={"embed": SaltedHashEmbeddings(), "fields": ["text"]}, dense_weight=1.0
    )
    try:
        cosine.put(("u1",), "cat", {"text": "the cat is called Miso"})
        hits = cosine.search(("u1",), query="oolong tea")
        assert (hits[0].key, hits[0].score) == ("tea", pytest.approx(1.0))
    finally:
        old.metadata.drop_all(backup.engine)


def test_a_store_names_the_model_it_embeds_with_now(backup: MySQLBackup) -> None:
    store = TieredStore(backup, index={"embed": HashEmbeddings(), "fields": ["text"]})
    try:
        store.embeddings = SaltedHashEmbeddings()  # replaced after construction
        store.put(("u1",), "tea", {"text": "likes oolong tea"})
        with backup.engine.connect() as connection:
            stored = connection.execute(select(store.tables.items.c.model)).scalars().all()
        assert stored == [model_name(SaltedHashEmbeddings())]
    finally:
        store.metadata.drop_all(backup.engine)


def test_a_query_respects_the_filter_and_the_page(store: TieredStore) -> None:
    fill(store)

    facts = store.search(("users",), query="cat ledger", filter={"kind": "fact"}, limit=10)
    second = store.search(("users",), query="cat ledger", filter={"kind": "fact"}, offset=1)

    assert sorted(keys(facts)) == ["cat", "ledger"]
    assert keys(second) == keys(facts)[1:]


async def test_async_and_sync_see_the_same_store(hybrid: TieredStore) -> None:
    try:
        await hybrid.aput(("docs",), "d1", {"text": "应收账款 ar_invoice"})
        await hybrid.aput(("docs",), "d2", {"text": "tea ceremony"})
        sync_hits = hybrid.search(("docs",), query="ar_invoice")
        async_hits = await hybrid.asearch(("docs",), query="ar_invoice")
        assert [(h.key, h.score) for h in sync_hits] == [(h.key, h.score) for h in async_hits]
        assert sync_hits[0].key == "d1"
        assert (await hybrid.aget(("docs",), "d2")).value == {"text": "tea ceremony"}  # type: ignore[union-attr]
        assert await hybrid.alist_namespaces() == [("docs",)]
    finally:
        await hybrid.backup.adispose()


# -- a batch: one transaction, reads before writes --------------------------------


def test_a_batch_reads_before_it_writes_and_the_last_put_wins(store: TieredStore) -> None:
    results = store.batch(
        [
            PutOp(("n",), "k", {"v": 1}),
            GetOp(("n",), "k"),
            PutOp(("n",), "k", {"v": 2}),
            SearchOp(("n",)),
        ]
    )

    assert results == [None, None, None, []]  # as LangGraph's stores: reads see the old state
    assert store.get(("n",), "k").value == {"v": 2}  # type: ignore[union-attr]


def test_an_update_keeps_created_at_and_its_place(store: TieredStore) -> None:
    store.put(("n",), "a", {"v": 1})
    store.put(("n",), "b", {"v": 1})
    first = store.get(("n",), "a")
    time.sleep(0.01)
    store.put(("n",), "a", {"v": 2})
    again = store.get(("n",), "a")

    assert first is not None and again is not None
    assert again.created_at == first.created_at < again.updated_at
    assert keys(store.search(("n",))) == ["a", "b"]


@pytest.fixture
def other_process(store: TieredStore) -> Iterator[TieredStore]:
    """A second store on the same tables, with connections of its own (another process)."""
    backup = store.backup
    other = TieredStore(MySQLBackup(backup.url, table_name=backup.tables.messages.name))
    yield other
    other.backup.dispose()


def test_a_batch_of_reads_sees_one_state(store: TieredStore, other_process: TieredStore) -> None:
    # The other process moves an item from "a" to "b" in one batch, between the two
    # reads of ours: the batch must see it under one key, never both (nor neither).
    namespace = ("users", "u1")
    store.put(namespace, "a", {"text": "the memory"})
    selects: list[str] = []

    def move_between_the_reads(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)
            if len(selects) == 2:
                other_process.batch(
                    [PutOp(namespace, "b", {"text": "the memory"}), PutOp(namespace, "a", None)]
                )

    event.listen(store.backup.engine, "before_cursor_execute", move_between_the_reads)
    try:
        got_a, got_b = store.batch([GetOp(namespace, "a"), GetOp(namespace, "b")])
    finally:
        event.remove(store.backup.engine, "before_cursor_execute", move_between_the_reads)

    assert len(selects) == 2
    assert got_a is not None and got_b is None  # the state before the move
    assert [item.key for item in store.search(namespace)] == ["b"]  # the move landed


def test_concurrent_batches_over_the_same_keys_all_land_whole(store: TieredStore) -> None:
    # Writers put the same 20 keys in opposite orders: on MariaDB that deadlocked and
    # lost batches (ArchiveUnavailableError). Every batch must land, whole: the last
    # one to commit holds every key.
    keys = [f"m{i}" for i in range(20)]
    writers, rounds = 4, 15
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        ordered = keys[::-1] if writer % 2 else keys
        for round_ in range(rounds):
            value = {"text": f"writer {writer} round {round_}"}
            try:
                store.batch([PutOp(("users", "u1"), key, value) for key in ordered])
            except Exception as exc:  # every failure is counted
                errors.append(exc)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    values = {item.key: item.value["text"] for item in store.search(("users", "u1"), limit=50)}
    assert sorted(values) == sorted(keys)
    assert len(set(values.values())) == 1  # one batch's values, not a mix
    last_rounds = {f"writer {writer} round {rounds - 1}" for writer in range(writers)}
    assert set(values.values()) <= last_rounds


@pytest.fixture
def mysql_store(table_name: str) -> Iterator[TieredStore]:
    """A store on the MySQL server only (SQLite serializes writers: no deadlock)."""
    require_mysql()
    tiered = TieredStore(MySQLBackup(MYSQL_URL, table_name=table_name))
    yield tiered
    tiered.metadata.drop_all(tiered.backup.engine)
    tiered.backup.dispose()


@pytest.mark.mysql
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_batch_the_server_rolls_back_on_a_deadlock_runs_again(
    mysql_store: TieredStore, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    store = mysql_store
    store.put(("n",), "kept", {"v": "old"})
    reported: list[str] = []
    every_time = False

    def deadlock_the_first_upsert(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        upsert = statement.startswith("INSERT INTO") and "_store " in statement
        if upsert and (every_time or not reported):
            reported.append(statement)
            raise conn.dialect.loaded_dbapi.OperationalError(
                1213, "Deadlock found when trying to get lock; try restarting transaction"
            )

    async def batch(ops: list[PutOp]) -> None:
        if mode == "sync":
            store.batch(ops)
        else:
            await store.abatch(ops)

    async def main() -> None:
        nonlocal every_time
        backup = store.backup
        engine = backup.engine if mode == "sync" else backup.async_engine().sync_engine
        event.listen(engine, "before_cursor_execute", deadlock_the_first_upsert)
        try:
            await batch([PutOp(("n",), "kept", {"v": "new"}), PutOp(("n",), "added", {"v": 1})])
            assert len(reported) == 1  # the first run failed, the second landed
            assert store.get(("n",), "kept").value == {"v": "new"}  # type: ignore[union-attr]
            assert store.get(("n",), "added").value == {"v": 1}  # type: ignore[union-attr]

            # A deadlock every time: after the reruns the caller sees the outage, and
            # nothing of the batch is stored.
            monkeypatch.setattr(archive, "RERUN_DELAYS", (0.0, 0.0))
            reported.clear()
            every_time = True
            with pytest.raises(ArchiveUnavailableError, match="Deadlock"):
                await batch([PutOp(("n",), "kept", {"v": "lost"})])
            assert len(reported) == 3  # the run and its two reruns
            assert store.get(("n",), "kept").value == {"v": "new"}  # type: ignore[union-attr]
        finally:
            event.remove(engine, "before_cursor_execute", deadlock_the_first_upsert)
            await backup.adispose()

    asyncio.run(main())


# -- TTL -----------------------------------------------------------------------


def _expiry(store: TieredStore, key: str) -> Any:
    items = store.tables.items
    with store.backup.engine.connect() as conn:
        return conn.execute(select(items.c.expires_at).where(items.c.key == key)).scalar_one()


def test_expired_items_are_never_returned_and_sweep_deletes_them(store: TieredStore) -> None:
    store.put(("t", "u"), "short", {"v": 1}, ttl=0.001)  # 60 ms
    store.put(("t", "u"), "long", {"v": 2}, ttl=60)
    store.put(("t", "gone"), "short", {"v": 3}, ttl=0.001)
    time.sleep(0.3)

    assert store.get(("t", "u"), "short") is None
    assert keys(store.search(("t",))) == ["long"]
    assert store.list_namespaces() == [("t", "u")]
    assert store.sweep_ttl() == 2
    assert store.sweep_ttl() == 0
    assert store.get(("t", "u"), "long") is not None


def test_reads_refresh_the_ttl_unless_told_not_to(store: TieredStore) -> None:
    store.put(("t",), "k", {"v": 1}, ttl=5)
    first = _expiry(store, "k")
    time.sleep(0.02)
    store.get(("t",), "k", refresh_ttl=False)
    assert _expiry(store, "k") == first
    store.get(("t",), "k")
    refreshed = _expiry(store, "k")
    assert refreshed > first
    time.sleep(0.02)
    store.search(("t",))
    assert _expiry(store, "k") > refreshed


def test_the_ttl_config_sets_the_default_and_the_refresh(backup: MySQLBackup) -> None:
    store = TieredStore(backup, ttl={"default_ttl": 5, "refresh_on_read": False})
    try:
        store.put(("t",), "k", {"v": 1})
        store.put(("t",), "forever", {"v": 1}, ttl=None)
        first = _expiry(store, "k")
        time.sleep(0.02)
        store.get(("t",), "k")
        assert first is not None and _expiry(store, "k") == first
        assert _expiry(store, "forever") is None
    finally:
        store.metadata.drop_all(backup.engine)


@pytest.mark.parametrize("read", ["get", "search"])
def test_a_put_between_a_read_and_its_ttl_refresh_keeps_its_own_expiry(
    store: TieredStore, other_process: TieredStore, read: str
) -> None:
    # A read refreshes the TTL after reading (in a transaction of its own). Another
    # process makes the item permanent in between: it must stay permanent (the refresh
    # gave it back the old expiry, and the item vanished minutes later).
    namespace = ("users", "u1")
    store.put(namespace, "pref", {"text": "temporary"}, ttl=5)
    refresh = store.planner.refresh_plan

    def refresh_after_a_put_elsewhere(*args: Any) -> Any:
        other_process.put(namespace, "pref", {"text": "permanent"}, ttl=None)
        return (yield from refresh(*args))

    store.planner.refresh_plan = refresh_after_a_put_elsewhere  # type: ignore[method-assign]
    try:
        if read == "get":
            store.get(namespace, "pref")
        else:
            store.search(namespace)
    finally:
        store.planner.refresh_plan = refresh  # type: ignore[method-assign]

    assert _expiry(store, "pref") is None
    assert store.get(namespace, "pref").value == {"text": "permanent"}  # type: ignore[union-attr]
    store.get(namespace, "pref")  # a read now refreshes nothing
    assert _expiry(store, "pref") is None


# -- hostile input ----------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    [("a.b",), ("",), ("a", 1), ("ok", "tab\there"), ("lone\ud800",), ("x" * 600,), "users"],
)
def test_a_bad_namespace_is_refused_and_nothing_is_stored(
    store: TieredStore, namespace: Any
) -> None:
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("fine",), "k", {"v": 1}), PutOp(namespace, "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        store.search(namespace)
    assert store.get(("fine",), "k") is None  # the whole batch was refused


def test_reserved_and_empty_namespaces_are_refused_for_puts(store: TieredStore) -> None:
    for namespace in [("langgraph", "x"), ()]:
        with pytest.raises(InvalidNamespaceError):
            store.batch([PutOp(namespace, "k", {"v": 1})])


@pytest.mark.parametrize("key", ["", 7, "k" * 2000, "nul\x00", None])
def test_a_bad_key_is_refused(store: TieredStore, key: Any) -> None:
    with pytest.raises((InvalidKeyError, TypeError)):
        store.batch([PutOp(("n",), key, {"v": 1})])
    with pytest.raises(InvalidKeyError):
        store.batch([GetOp(("n",), key)])


@pytest.mark.parametrize(
    ("value", "error"),
    [(["not", "a", "dict"], TypeError), ({"x": object()}, TypeError), ({"x": {1, 2}}, TypeError)],
)
def test_a_bad_value_is_refused(store: TieredStore, value: Any, error: type) -> None:
    with pytest.raises(error):
        store.put(("n",), "k", value)


def test_a_batch_larger_than_one_statement_is_stored_whole(store: TieredStore) -> None:
    # 18 MB of puts: more than MariaDB's max_allowed_packet (16 MB) in one INSERT.
    ops = [
        PutOp(("bulk",), f"k{i}", {"text": f"{i} " + "y" * 60_000}, index=False) for i in range(300)
    ]

    store.batch(ops)

    assert len(store.search(("bulk",), limit=1000)) == 300
    assert store.get(("bulk",), "k299").value == {"text": "299 " + "y" * 60_000}  # type: ignore[union-attr]


def test_a_value_too_large_to_store_is_refused_and_nothing_is_lost(store: TieredStore) -> None:
    store.put(("docs",), "kept", {"text": "old"})
    big = {"text": "x" * (20 * 1024 * 1024)}

    with pytest.raises(ValueTooLargeError) as refused:
        store.batch([PutOp(("docs",), "kept", {"text": "new"}), PutOp(("docs",), "big", big)])

    error = refused.value
    assert isinstance(error, ValueError)  # a bad value, not an outage
    assert (error.namespace, error.key) == (("docs",), "big")
    assert error.size > 20 * 1024 * 1024 > error.limit
    assert "'big'" in str(error) and "('docs',)" in str(error) and f"{error.limit:,}" in str(error)
    assert store.get(("docs",), "kept").value == {"text": "old"}  # type: ignore[union-attr]
    assert store.get(("docs",), "big") is None


def test_an_item_whose_vectors_are_too_large_is_refused(hybrid: TieredStore) -> None:
    # A small value, but 3,500 indexed texts of 256-dim vectors: about 9.5 MB of them.
    value = {"items": [{"text": "tea"}] * 3500}

    with pytest.raises(ValueTooLargeError, match="'many'"):
        hybrid.put(("docs",), "many", value, index=["items[*].text"])

    assert hybrid.get(("docs",), "many") is None


def test_bad_filters_pages_and_ttls_are_refused(store: TieredStore) -> None:
    with pytest.raises(InvalidFilterError, match=r"\$regex"):
        store.search(("n",), filter={"name": {"$regex": ".*"}})
    with pytest.raises(ValueError, match="limit"):
        store.search(("n",), limit=-1)
    with pytest.raises(ValueError, match="offset"):
        store.search(("n",), offset=-5)
    with pytest.raises(ValueError, match="ttl"):
        store.put(("n",), "k", {"v": 1}, ttl=-1)
    with pytest.raises(ValueError, match="max_depth"):
        store.list_namespaces(max_depth=0)


def test_lookalike_keys_and_labels_stay_apart(store: TieredStore) -> None:
    # MySQL's PAD SPACE collations would merge "k" and "k "; LIKE would read % and _.
    store.put(("a",), "k", {"v": "plain"})
    store.put(("a",), "k ", {"v": "space"})
    store.put(("a",), "K", {"v": "upper"})
    store.put(("a_",), "k", {"v": "underscore"})
    store.put(("a%",), "k", {"v": "percent"})
    store.put(("ab",), "k", {"v": "ab"})
    store.put(("a ",), "k", {"v": "label space"})

    assert store.get(("a",), "k").value == {"v": "plain"}  # type: ignore[union-attr]
    assert store.get(("a",), "k ").value == {"v": "space"}  # type: ignore[union-attr]
    assert store.get(("a",), "K").value == {"v": "upper"}  # type: ignore[union-attr]
    assert [hit.value["v"] for hit in store.search(("a",))] == ["plain", "space", "upper"]
    assert store.get(("a ",), "k").value == {"v": "label space"}  # type: ignore[union-attr]
    assert store.list_namespaces(prefix=("a",)) == [("a",)]
    assert len(store.list_namespaces()) == 5


def test_values_round_trip_exactly(store: TieredStore) -> None:
    value = {
        "text": "应收账款 😀 and a lone \ud800 surrogate",
        "nested": {"list": [1, 2.5, None, True, {"deep": ["x"]}]},
        "empty": {},
    }
    store.put(("n",), "k", value)

    assert store.get(("n",), "k").value == value  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value",
    [
        {"scores": {1: "first"}},
        {"scores": {1: "first", "1": "one"}},  # JSON would keep one of them
        {"a": [{"b": {None: "null"}}]},
        {"a": {"b": {(1, 2): "tuple"}}},
        {2.5: "top level"},
    ],
)
@pytest.mark.parametrize("index", [None, False])
def test_a_value_with_a_key_that_is_not_a_str_is_refused_at_any_depth(
    store: TieredStore, value: dict[Any, Any], index: bool | None
) -> None:
    with pytest.raises(TypeError, match="keys must be str"):
        store.put(("n",), "k", value, index=index)  # type: ignore[arg-type]

    assert store.get(("n",), "k") is None


def test_one_huge_number_leaves_range_filters_working(store: TieredStore) -> None:
    namespace = ("users", "u1")
    store.put(namespace, "small", {"n": 5})
    store.put(namespace, "text", {"n": "not a number"})
    store.put(namespace, "huge", {"n": 10**400})  # valid JSON; float() overflows on it
    store.put(namespace, "big", {"n": 2**53 + 1})  # a float cannot tell it from 2**53

    def found(condition: dict[str, Any]) -> list[str]:
        return keys(store.search(namespace, filter={"n": condition}))

    assert store.get(namespace, "huge").value == {"n": 10**400}  # type: ignore[union-attr]
    assert found({"$gte": 1}) == ["small", "huge", "big"]
    assert found({"$lt": 10**400}) == ["small", "big"]
    assert found({"$gt": 2**53}) == ["huge", "big"]  # ints are compared exactly
    assert found({"$lte": 5.5}) == ["small"]
    assert found({"$gt": 1e308}) == ["huge"]


def test_eq_and_ne_compare_dict_operands_with_dollar_keys(store: TieredStore) -> None:
    # JSON documents have "$" keys (JSON Schema's "$ref", MongoDB's "$oid"); $eq and $ne
    # compare their operand as a value, as InMemoryStore does.
    reference = InMemoryStore()
    for target in (reference, store):
        target.put(("docs",), "schema", {"meta": {"$ref": "#/defs/a"}})
        target.put(("docs",), "other", {"meta": {"$ref": "#/defs/b"}})
    for condition in ({"$eq": {"$ref": "#/defs/a"}}, {"$ne": {"$ref": "#/defs/a"}}):
        wanted = keys(reference.search(("docs",), filter={"meta": condition}))
        assert keys(store.search(("docs",), filter={"meta": condition})) == wanted
    assert keys(store.search(("docs",), filter={"meta": {"$eq": {"$ref": "#/defs/a"}}})) == [
        "schema"
    ]


@pytest.mark.parametrize(
    "filter_",
    [
        {"n": {"$gt": 1, "limit": 2}},  # an operator beside a field: was read as $lte
        {"tags": [{"$regex": "x"}]},  # an operator inside a list is applied too
        {"a": {"b": {"$in": [1]}}},
    ],
)
def test_filters_with_operators_langgraph_lacks_are_refused(
    store: TieredStore, filter_: dict[str, Any]
) -> None:
    with pytest.raises(InvalidFilterError):
        store.search(("n",), filter=filter_)


def nested(depth: int, inner: Any = 1, *, lists: bool = False) -> Any:
    """``inner`` inside ``depth`` levels of ``{"a": ...}`` (or of one-item lists)."""
    for _ in range(depth):
        inner = [inner] if lists else {"a": inner}
    return inner


@pytest.mark.parametrize(
    "filter_",
    [
        {"a": nested(5000)},
        {"a": nested(5000, lists=True)},
        {"a": nested(MAX_NESTING)},  # with its field: one level more than a value holds
        {"a": {"$eq": nested(MAX_NESTING)}},
        {"a": nested(MAX_NESTING - 1, {"$ne": [1]})},
        {"a": [nested(3000, lists=True), nested(3000)]},
    ],
    ids=["dicts", "lists", "dicts-past-the-limit", "eq-operand", "ne-at-the-limit", "mixed"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_filter_deeper_than_any_value_is_refused_by_name(
    store: TieredStore, filter_: dict[str, Any], mode: str
) -> None:
    store.put(("d",), "k", {"a": 1})

    with pytest.raises(InvalidFilterError, match=f"deeper than {MAX_NESTING} levels"):
        if mode == "sync":
            store.search(("d",), filter=filter_)
        else:
            await store.asearch(("d",), filter=filter_)

    assert store.get(("d",), "k").value == {"a": 1}  # type: ignore[union-attr]


def test_a_value_as_deep_as_allowed_is_found_by_a_filter_as_deep(store: TieredStore) -> None:
    deepest = nested(MAX_NESTING - 1)  # {"a": deepest} nests MAX_NESTING levels
    reference = InMemoryStore()
    for target in (reference, store):
        target.put(("d",), "deep", {"a": deepest})
        target.put(("d",), "other", {"a": nested(MAX_NESTING - 1, 2)})
    for filter_ in (
        {"a": deepest},
        {"a": nested(MAX_NESTING - 2, {"a": {"$eq": 1}})},
        {"a": nested(MAX_NESTING - 2, {"$eq": {"a": 1}})},
        {"a": nested(MAX_NESTING - 2, {"$ne": {"a": 1}})},
    ):
        expected = keys(reference.search(("d",), filter=filter_))
        assert keys(store.search(("d",), filter=filter_)) == expected
        assert len(expected) == 1


def test_matching_a_filter_deeper_than_any_value_raises_by_name() -> None:
    # The in-process match, reached without validate_filter (on a value never stored).
    value = nested(5000)
    with pytest.raises(InvalidFilterError, match=f"deeper than {MAX_NESTING} levels"):
        matches_filter(value, value)


class CountingEmbeddings(HashEmbeddings):
    """HashEmbeddings that count the texts they embed."""

    def __init__(self) -> None:
        self.embedded = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.embedded += len(texts)
        return super().embed_documents(texts)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_item_too_large_with_its_vectors_is_refused_before_embedding(
    backup: MySQLBackup, mode: str
) -> None:
    embeddings = CountingEmbeddings()
    index: Any = {"embed": embeddings, "dims": HashEmbeddings.dims, "fields": ["text"]}
    store = TieredStore(backup, index=index)
    unsized = TieredStore(backup, index={"embed": HashEmbeddings(), "fields": ["text"]})
    # 3,500 distinct short texts: a small value, about 9.5 MB of 256-dim vectors.
    big = {"items": [{"text": f"tea {i}"} for i in range(3500)]}
    ops = [
        PutOp(("docs",), "small", {"text": "oolong"}),
        PutOp(("docs",), "many", big, index=["items[*].text"]),
    ]
    try:
        with pytest.raises(ValueTooLargeError, match="'many'") as refused:
            if mode == "sync":
                store.batch(ops)
            else:
                await store.abatch(ops)
        # Without dims, the same rule after embedding: the same size, to the byte.
        with pytest.raises(ValueTooLargeError, match="'many'") as late:
            unsized.batch(ops)

        assert embeddings.embedded == 0
        assert refused.value.size == late.value.size > refused.value.limit
        assert store.get(("docs",), "small") is None
        assert store.get(("docs",), "many") is None
    finally:
        await store.backup.adispose()
        store.metadata.drop_all(backup.engine)


def test_dims_must_be_a_positive_int(backup: MySQLBackup) -> None:
    for dims, error in ((0, ValueError), ("256", TypeError), (True, TypeError)):
        with pytest.raises(error, match="dims"):
            TieredStore(backup, index={"embed": HashEmbeddings(), "dims": dims})  # type: ignore[typeddict-item]


def test_keys_may_hold_line_breaks_and_tabs(store: TieredStore) -> None:
    # The README's remember tool keys a fact by its first 40 characters.
    fact = "User preferences:\n- oolong tea\n- no sugar"
    namespace = ("users", "u1")
    store.put(namespace, fact[:40], {"text": fact})
    store.put(namespace, "a\tb\r\nc", {"text": "tab and CRLF"})

    assert store.get(namespace, fact[:40]).value == {"text": fact}  # type: ignore[union-attr]
    assert store.get(namespace, "a\tb\r\nc").value == {"text": "tab and CRLF"}  # type: ignore[union-attr]
    assert store.get(namespace, "a\tb\nc") is None  # no normalisation: keys stay apart
    assert keys(store.search(namespace)) == [fact[:40], "a\tb\r\nc"]
    for bad in ("nul\x00", "escape\x1b[31m", "bell\x07", "lone\ud800"):
        with pytest.raises(InvalidKeyError):
            store.put(namespace, bad, {"v": 1})


# -- the archive's database, across processes' views -------------------------------


def test_items_persist_for_a_new_store_on_the_same_database(
    backend_url: str, table_name: str
) -> None:
    first = TieredStore(backend_url, table_name=table_name)
    try:
        first.put(("users", "u1"), "k", {"text": "persisted 持久"})
        first.backup.dispose()
        second = TieredStore(backend_url, table_name=table_name)
        assert second.get(("users", "u1"), "k").value == {"text": "persisted 持久"}  # type: ignore[union-attr]
        assert keys(second.search(("users",), query="持久")) == ["k"]
        second.backup.dispose()
    finally:
        first.metadata.drop_all(first.backup.engine)
        first.backup.metadata.drop_all(first.backup.engine)
        first.backup.dispose()


def test_with_and_async_with_close_the_connections_and_keep_the_items(
    backend_url: str, table_name: str
) -> None:
    with TieredStore(backend_url, table_name=table_name) as store:
        store.put(("users", "u1"), "k", {"text": "kept"})
        pool = store.backup.engine.pool
        assert pool.checkedin() >= 1  # a pooled connection stays open while in use
    assert pool.checkedin() == 0

    async def main() -> None:
        async with TieredStore(backend_url, table_name=table_name) as again:
            assert (await again.aget(("users", "u1"), "k")).value == {"text": "kept"}  # type: ignore[union-attr]
            assert again.get(("users", "u1"), "k") is not None
            sync_pool = again.backup.engine.pool
            assert sync_pool.checkedin() >= 1
        assert sync_pool.checkedin() == 0

    try:
        asyncio.run(main())
    finally:
        store.metadata.drop_all(store.backup.engine)
        store.backup.metadata.drop_all(store.backup.engine)
        store.backup.dispose()


def test_concurrent_async_puts_all_land(store: TieredStore) -> None:
    async def main() -> None:
        try:
            await asyncio.gather(
                *(store.aput(("c", str(i % 3)), f"k{i}", {"i": i}) for i in range(30))
            )
        finally:
            await store.backup.adispose()

    asyncio.run(main())

    assert len(store.search(("c",), limit=100)) == 30
    assert store.list_namespaces() == [("c", "0"), ("c", "1"), ("c", "2")]
