"""TieredStore against LangGraph's InMemoryStore: the same random operations, the same results.

Seeded random sequences of puts, deletes, gets, filtered and paged searches,
namespace listings (prefix, suffix, wildcards, max_depth, paging) and mixed
batches run on both stores, on SQLite and MariaDB, through ``batch`` and
``abatch``; every result is compared. With an embedding and ``dense_weight=1``
query searches are compared too (scores included): that is InMemoryStore's
ranking. Without one, TieredStore ranks ``query=`` by BM25, which InMemoryStore
does not do, so those sequences carry no queries.

Where the two differ on purpose, the reference is adjusted, not the store:
InMemoryStore creates an empty namespace when one is read or deleted from
(``defaultdict``) and then lists it; a database store lists namespaces that hold
items (as LangGraph's SqliteStore and PostgresStore do).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from sqlalchemy import delete

from langchain_tiered_memory import MySQLBackup, TieredStore
from langchain_tiered_memory.integrations.store import InvalidFilterError

LABELS = ["a", "b", "用户", "x y", "a_%"]
KEYS = ["k1", "k2", "k 2", "键", "K1"]
WORDS = "invoice tea 乌龙茶 表结构 ledger cat Miso 应收 report".split()
TAGS = ["red", "blue", "绿"]
FIELDS = ["text", "notes[*]"]
#: Sequences per run, and operations per sequence.
SEQUENCES = 12
STEPS = 60

#: What the differential runs compared, for the report (filled as tests run).
COMPARED: dict[str, int] = {}


class ReferenceStore(InMemoryStore):
    """InMemoryStore whose namespaces exist from their first put on, as in a database."""

    def _prepare_ops(self, ops: Iterable[Op]) -> Any:
        before = set(self._data)
        prepared = super()._prepare_ops(ops)
        for namespace in set(self._data) - before:
            if not self._data[namespace]:  # made by a get's defaultdict lookup
                del self._data[namespace]
        return prepared

    def _apply_put_ops(self, put_ops: Any) -> None:
        before = set(self._data)
        super()._apply_put_ops(put_ops)
        for namespace in set(self._data) - before:
            if not self._data[namespace]:  # made by a delete of a key never put
                del self._data[namespace]

    def _handle_list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        everything = self._data
        self._data = {ns: items for ns, items in everything.items() if items}  # type: ignore[assignment]
        try:
            return super()._handle_list_namespaces(op)
        finally:
            self._data = everything


def _namespace(rng: random.Random, *, low: int = 1) -> tuple[str, ...]:
    return tuple(rng.choice(LABELS) for _ in range(rng.randint(low, 3)))


def _value(rng: random.Random, namespace: tuple[str, ...], key: str) -> dict[str, Any]:
    # The text names its item: two items never embed alike, so no score ties.
    where = "/".join((*namespace, key))
    return {
        "text": f"{where} " + " ".join(rng.sample(WORDS, 3)),
        # Distinct notes: InMemoryStore miscounts an item's texts when two are equal.
        "notes": [f"{where} {i} {rng.choice(WORDS)}" for i in range(2)],
        "n": rng.randint(0, 9),
        "score": rng.choice([0.5, 1.5, 2.0]),
        "tag": rng.choice(TAGS),
        "nested": {"c": rng.choice(TAGS), "d": rng.randint(0, 2)},
        "flag": rng.choice([True, False]),
    }


def _filter(rng: random.Random) -> dict[str, Any] | None:
    choice = rng.randrange(9)
    low, high = sorted((rng.randint(0, 9), rng.randint(0, 9)))
    return [
        None,
        {"tag": rng.choice(TAGS)},
        {"n": {"$gt": low}},
        {"n": {"$gte": low, "$lt": high}},
        {"tag": {"$ne": rng.choice(TAGS)}, "n": {"$lte": high}},
        {"nested": {"c": rng.choice(TAGS)}},
        {"score": {"$eq": rng.choice([0.5, 1.5, 2])}, "flag": rng.choice([True, False])},
        {"nested": {"d": {"$gte": 1}}, "tag": rng.choice(TAGS)},
        {"missing": {"$ne": 1}},
    ][choice]


def _condition(rng: random.Random) -> MatchCondition:
    path = tuple(rng.choice([*LABELS, "*"]) for _ in range(rng.randint(1, 2)))
    return MatchCondition(match_type=rng.choice(["prefix", "suffix"]), path=path)


def random_op(rng: random.Random, *, queries: bool) -> Op:
    """One random store operation."""
    kind = rng.choices(["put", "delete", "get", "search", "list"], [5, 1, 2, 3, 2])[0]
    if kind in ("put", "delete", "get"):
        namespace, key = _namespace(rng), rng.choice(KEYS)
        if kind == "get":
            return GetOp(namespace, key)
        return PutOp(namespace, key, None if kind == "delete" else _value(rng, namespace, key))
    if kind == "search":
        query = None
        if queries and rng.random() < 0.6:
            query = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
        return SearchOp(
            namespace_prefix=_namespace(rng, low=0)[: rng.randint(0, 2)],
            filter=_filter(rng),
            limit=rng.randint(0, 6),
            offset=rng.choice([0, 0, 1, 3]),
            query=query,
        )
    conditions = tuple(_condition(rng) for _ in range(rng.randint(0, 2)))
    return ListNamespacesOp(
        match_conditions=conditions or None,
        max_depth=rng.choice([None, None, 1, 2]),
        limit=rng.randint(1, 8),
        offset=rng.choice([0, 0, 1, 2]),
    )


def random_batches(seed: int, *, queries: bool) -> Iterator[list[Op]]:
    """Batches of one op mostly, and mixed batches of up to five."""
    rng = random.Random(seed)
    for _ in range(STEPS):
        size = 1 if rng.random() < 0.7 else rng.randint(2, 5)
        yield [random_op(rng, queries=queries) for _ in range(size)]


def comparable(result: Result) -> Any:
    """A result without its timestamps (InMemoryStore renews created_at on update)."""
    if isinstance(result, SearchItem):
        score = None if result.score is None else round(result.score, 9)
        return ("hit", result.namespace, result.key, result.value, score)
    if isinstance(result, Item):
        return ("item", result.namespace, result.key, result.value)
    if isinstance(result, list):
        return [comparable(r) for r in result]
    return result


def _clear(store: TieredStore) -> None:
    with store.backup.engine.begin() as conn:
        conn.execute(delete(store.tables.items))
        conn.execute(delete(store.tables.namespaces))


@pytest.fixture(params=["lexical", "embedded"])
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stores(backup: MySQLBackup, variant: str) -> Iterator[tuple[TieredStore, Any]]:
    """A TieredStore on each backend, and how to make the matching reference."""
    embedding = DeterministicFakeEmbedding(size=24)
    if variant == "embedded":
        index: Any = {"dims": 24, "embed": embedding, "fields": FIELDS}
        store = TieredStore(backup, index=index, dense_weight=1.0)

        def reference() -> ReferenceStore:
            return ReferenceStore(index={"dims": 24, "embed": embedding, "fields": FIELDS})

    else:
        store = TieredStore(backup)

        def reference() -> ReferenceStore:
            return ReferenceStore()

    yield store, reference
    store.metadata.drop_all(backup.engine)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_same_results_as_in_memory_store(
    stores: tuple[TieredStore, Any], variant: str, mode: str, backend_url: str
) -> None:
    store, make_reference = stores
    compared = 0
    try:
        for sequence in range(SEQUENCES):
            _clear(store)
            reference = make_reference()
            seed = sequence * 7919 + len(mode)
            for step, ops in enumerate(random_batches(seed, queries=variant == "embedded")):
                expected = reference.batch(ops)
                got = store.batch(ops) if mode == "sync" else await store.abatch(ops)
                assert comparable(got) == comparable(expected), (seed, step, ops)
                compared += len(ops)
    finally:
        await store.backup.adispose()
    backend = "mysql" if backend_url.startswith("mysql") else "sqlite"
    COMPARED[f"{backend}/{variant}/{mode}"] = compared
    assert compared >= SEQUENCES * STEPS


def test_the_sequences_exercise_every_kind_of_result(variant: str) -> None:
    # The differential test above means little if the sequences never hit anything.
    reference = ReferenceStore(
        index={"dims": 24, "embed": DeterministicFakeEmbedding(size=24), "fields": FIELDS}
        if variant == "embedded"
        else None
    )
    found = {"item": 0, "missing": 0, "hits": 0, "filtered hits": 0, "namespaces": 0, "scored": 0}
    for sequence in range(SEQUENCES):
        for ops in random_batches(sequence * 7919 + 4, queries=variant == "embedded"):
            for op, result in zip(ops, reference.batch(ops), strict=True):
                if isinstance(op, GetOp):
                    found["item" if result else "missing"] += 1
                elif isinstance(op, SearchOp) and result:
                    found["hits"] += 1
                    found["filtered hits"] += op.filter is not None
                    found["scored"] += any(hit.score is not None for hit in result)  # type: ignore[union-attr]
                elif isinstance(op, ListNamespacesOp) and result:
                    found["namespaces"] += 1
    assert min(v for k, v in found.items() if k != "scored") > 20, found
    assert (found["scored"] > 20) == (variant == "embedded"), found


#: Values with fields named like operators (JSON Schema's "$schema", "$id"...).
DOLLAR_VALUES = {
    "s1": {
        "$schema": "draft-07",
        "$id": "a",
        "$eq": 1,
        "title": "A",
        "n": 1,
        "meta": {"$ref": "#/a", "x": 2},
        "tags": ["x", {"$k": 1}],
    },
    "s2": {"$schema": "2020-12", "$gt": 3, "title": "B", "n": 5, "meta": {"x": 3}, "tags": ["y"]},
    "s3": {"$schema": None, "title": "C", "n": 2, "meta": {"x": {"y": 1}}, "tags": []},
}
#: Filters both stores answer: a filter's own keys are field names, whatever they are.
DOLLAR_FILTERS: list[dict[str, Any]] = [
    {"$schema": "draft-07"},
    {"$schema": "2020-12", "title": "B"},
    {"$id": "a"},
    {"$eq": 1},
    {"$eq": 1, "title": "A"},
    {"$eq": 1, "title": "B"},
    {"$gt": 3},
    {"$gt": {"$eq": 3}},
    {"$eq": {"$ne": 1}},
    {"$schema": {"$ne": "draft-07"}},
    {"$schema": None},
    {"$missing": None},
    {"$schema": "draft-07", "n": {"$lt": 2}},
    {"meta": {"x": 2}},
    {"meta": {"x": {"y": 1}}},
    {"meta": {"x": {"$ne": 2}}},
    {"meta": {"$eq": {"$ref": "#/a", "x": 2}}},
    {"tags": ["y"]},
    {"tags": []},
]
#: Filters InMemoryStore fails on ("Unsupported operator") and PostgresStore refuses:
#: below the top level a dict with a "$" key is one of operators, all LangGraph's.
REFUSED_FILTERS: list[dict[str, Any]] = [
    {"meta": {"$ref": "#/a"}},
    {"title": {"x": 1, "$eq": "A"}},
    {"$schema": {"$regex": "d"}},
    {"meta": {"x": {"$in": [2]}}},
    {"tags": ["x", {"$k": 1}]},
]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_fields_named_like_operators_filter_as_in_memory_store(
    backup: MySQLBackup, mode: str
) -> None:
    store, reference = TieredStore(backup), InMemoryStore()
    try:
        for target in (store, reference):
            for key, value in DOLLAR_VALUES.items():
                target.put(("docs",), key, value)

        async def search(filter_: dict[str, Any]) -> list[str]:
            if mode == "sync":
                return [hit.key for hit in store.search(("docs",), filter=filter_)]
            return [hit.key for hit in await store.asearch(("docs",), filter=filter_)]

        answered = set()
        for filter_ in DOLLAR_FILTERS:
            expected = [hit.key for hit in reference.search(("docs",), filter=filter_)]
            assert await search(filter_) == expected, filter_
            answered.update(expected)
        assert answered == set(DOLLAR_VALUES)  # every item is found by some filter
        for filter_ in REFUSED_FILTERS:
            with pytest.raises(ValueError, match="Unsupported operator"):
                reference.search(("docs",), filter=filter_)
            with pytest.raises(InvalidFilterError, match="unsupported filter operator"):
                await search(filter_)
        assert len(store.search(("docs",))) == len(DOLLAR_VALUES)  # nothing lost
    finally:
        await store.backup.adispose()
        store.metadata.drop_all(backup.engine)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_eleven_or_more_equal_scores_keep_in_memory_stores_order(
    stores: tuple[TieredStore, Any], variant: str, mode: str
) -> None:
    # Past ten items a tie broken on positions as strings puts the 11th ("10") before the 3rd.
    store, make_reference = stores
    reference = make_reference()
    keys = [f"k{n:02d}" for n in range(12)]
    random.Random(5).shuffle(keys)  # store order is not key order
    try:
        for key in keys:
            for target in (store, reference):
                target.put(("docs",), key, {"text": "invoice ledger report"})
        for op in (
            SearchOp(("docs",), query="invoice", limit=12),
            SearchOp(("docs",), query="ledger", limit=4, offset=8),
            SearchOp(("docs",), limit=12),
        ):
            expected = reference.batch([op])[0]
            got = (store.batch([op]) if mode == "sync" else await store.abatch([op]))[0]
            assert [hit.key for hit in got] == [hit.key for hit in expected], op  # type: ignore[union-attr]
            if variant == "embedded":  # the same scores too (without one, BM25 scores)
                assert comparable(got) == comparable(expected), op
        assert len(expected) == 12 and [hit.key for hit in expected] == keys  # type: ignore[arg-type]
    finally:
        await store.backup.adispose()
