"""Ingest that does not slow down as a session grows (issue 16).

A batch's work must not depend on how much a session already holds: every
statement the worker runs is an index lookup, and the number of statements is the
same in a short session and a long one. Texts go to the model in one call per
batch, longest first; the worker does not sit idle while jobs are queued.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import event, text, update

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from langchain_tiered_memory.tiers.long_memory.catalog import from_bytes

from .fakes import HashEmbeddings
from .long_memory_support import FakeExtractor, catalog, job_rows, wait_until

MakeMemory = Callable[..., ChromaLongMemory]
#: A plan step that reads a whole table, or every row of a session or a user.
WHOLE = re.compile(r"^SCAN |\((session_id|user_id)=\?\)$")


def write_turns(
    backup: MySQLBackup, memory: ChromaLongMemory, session_id: str, turns: range
) -> TieredChatMessageHistory:
    history = TieredChatMessageHistory(session_id, user_id="u", backup=backup, long_memory=memory)
    for n in turns:
        history.add_messages(
            [HumanMessage(f"question {n}: " + "word " * (n % 7)), AIMessage(f"answer {n}")]
        )
    return history


def turn_number(memory_text: str) -> int:
    found = re.search(r"question (\d+)", memory_text)
    assert found is not None
    return int(found.group(1))


@contextmanager
def statements(backup: MySQLBackup) -> Iterator[list[tuple[str, Any]]]:
    """Every statement (with its parameters) the archive's engine runs in the block."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        seen.append((statement, params))

    event.listen(backup.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(backup.engine, "before_cursor_execute", record)


class ChromaCalls:
    """A Chroma collection that records each call: its method and how many ids it carries."""

    def __init__(self, collection: Any) -> None:
        self.collection = collection
        self.calls: list[tuple[str, int | None, tuple[str, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.collection, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("ids")
            self.calls.append((name, None if ids is None else len(ids), tuple(sorted(kwargs))))
            return target(*args, **kwargs)

        return call


def drain_last(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    session_id: str,
    turns: int,
    batch: int,
    chroma: list[ChromaCalls] | None = None,
) -> list[tuple[str, Any]]:
    """The statements of draining the last ``batch`` turns of a session of ``turns``.

    With ``chroma``, the Chroma calls of that drain are recorded into a
    :class:`ChromaCalls` appended to it.
    """
    memory = make_memory(backup=backup, batch_size=batch)
    write_turns(backup, memory, session_id, range(turns - batch))
    memory.run_pending()
    write_turns(backup, memory, session_id, range(turns - batch, turns))
    if chroma is not None:
        chroma.append(ChromaCalls(memory.collection))
        memory.collection = chroma[-1]
    with statements(backup) as seen:
        memory.run_pending()
    assert len(catalog(backup, session_id)) == turns
    return seen


def test_a_batch_runs_as_many_statements_in_a_long_session_as_in_a_short_one(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    short = drain_last(make_memory, backup, "short", 30, 20)
    long = drain_last(make_memory, backup, "long", 600, 20)
    assert [s for s, _ in long] == [s for s, _ in short]


def test_a_batch_asks_chroma_the_same_in_a_long_session_as_in_a_short_one(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # Chroma's own insert cost grows with its HNSW graph (not ours to flatten); what the
    # worker asks of it per batch must not: one write of the batch's new vectors, and
    # no count, get, peek or query that would read what the session already holds.
    recorded: list[ChromaCalls] = []
    drain_last(make_memory, backup, "short", 30, 20, recorded)
    drain_last(make_memory, backup, "long", 600, 20, recorded)
    short, long = (r.calls for r in recorded)
    assert long == short
    assert long == [("upsert", 20, ("documents", "embeddings", "ids", "metadatas"))]


def test_every_statement_of_a_batch_is_an_index_lookup(
    make_memory: MakeMemory, sqlite_backup: MySQLBackup
) -> None:
    seen = drain_last(make_memory, sqlite_backup, "grow", 300, 40)
    tables = {sqlite_backup.table.name, sqlite_backup.tables.memories.name}
    scans = []
    with sqlite_backup.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        for statement, params in seen:
            if not statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                continue
            plan = raw.execute(f"EXPLAIN QUERY PLAN {statement}", params).fetchall()
            for row in plan:
                detail = str(row[-1])
                if detail.split()[1:2] and detail.split()[1] in tables and WHOLE.search(detail):
                    scans.append((detail, statement))
    # Reading a whole table, session or user makes a batch cost more as they grow.
    assert scans == []


def test_texts_go_to_the_model_in_one_call_longest_first(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    calls: list[list[str]] = []

    class Recording(HashEmbeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            calls.append(list(texts))
            return super().embed_documents(texts)

    memory = make_memory(embedding=Recording(), batch_size=50)
    write_turns(backup, memory, "s", range(30))
    memory.run_pending()
    assert len(calls) == 1
    [texts] = calls
    assert len(texts) == 30
    assert [len(t) for t in texts] == sorted((len(t) for t in texts), reverse=True)
    # Sorting for the model must not shuffle which vector belongs to which memory.
    for row in catalog(backup, "s"):
        stored = from_bytes(row.vector).tolist()
        assert stored == pytest.approx(HashEmbeddings().embed_query(row.text), abs=1e-6)


def test_raw_turns_are_claimed_in_large_batches(make_memory: MakeMemory) -> None:
    assert make_memory().batch_size >= 256  # embedding-bound: fewer, fuller model calls
    assert make_memory(extractor=FakeExtractor()).batch_size <= 64  # LLM-bound


def test_the_worker_is_never_idle_while_jobs_are_queued(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # A batch that finishes nothing (its extraction fails and is retried at once)
    # must not send the worker to sleep for a poll interval with the job queued.
    extractor = FakeExtractor(fail_first=2)
    memory = make_memory(
        extractor=extractor,
        retry_base_delay=0.0,
        poll_interval=120.0,
        start_worker=True,
        max_attempts=5,
    )
    started = time.monotonic()
    write_turns(backup, memory, "s", range(1))
    assert wait_until(lambda: len(catalog(backup, "s")) == 1, timeout=20)
    assert time.monotonic() - started < 20
    assert extractor.recorder.calls == 3


def test_an_unreadable_message_holds_up_only_its_own_turn_and_session(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    write_turns(backup, memory, "a", range(5))
    write_turns(backup, memory, "b", range(2))
    archive = backup.table
    with backup.engine.begin() as conn:
        ids = [
            row.id
            for row in conn.execute(
                text(f"SELECT id FROM {archive.name} WHERE session_id = 'a' ORDER BY id")
            )
        ]
        # The human message of turn 3 (0-based 2) no longer decodes.
        conn.execute(update(archive).where(archive.c.id == ids[4]).values(message="{not json"))
    memory.run_pending(max_batches=1)
    assert sorted(turn_number(r.text) for r in catalog(backup, "b")) == [0, 1]
    stored_a = catalog(backup, "a")
    # Turns 0 and 1 were read in the same batch as the bad one, and stored.
    assert sorted(turn_number(r.text) for r in stored_a) == [0, 1]
    waiting = {row.last_message_id: row for row in job_rows(backup) if row.session_id == "a"}
    assert len(waiting) == 3
    bad = waiting[ids[5]]
    assert bad.attempts == 1  # retried with backoff, the error kept
    assert bad.last_error
    assert all(not waiting[i].last_error for i in (ids[7], ids[9]))  # only waiting


def test_an_unreadable_turn_is_parked_even_without_backoff(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(retry_base_delay=0)
    write_turns(backup, memory, "a", range(2))
    archive = backup.table
    with backup.engine.begin() as conn:
        first = conn.execute(
            text(f"SELECT MIN(id) FROM {archive.name} WHERE session_id = 'a'")
        ).scalar_one()
        conn.execute(update(archive).where(archive.c.id == first).values(message="{not json"))
    finished: list[int] = []
    worker = threading.Thread(target=lambda: finished.append(memory.run_pending()), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert finished == [0]  # it returned: the bad turn was not claimed again and again
    [bad, waiting] = [row for row in job_rows(backup) if row.session_id == "a"]
    assert bad.attempts == 1 and bad.last_error
    assert (bad.not_before - waiting.not_before).total_seconds() >= 59
