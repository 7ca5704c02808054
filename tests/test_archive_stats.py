"""``MySQLBackup.stats``: the counts the ``stats`` command shows, on SQLite and MySQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.storage.archive import CHUNK_CHARS
from langchain_tiered_memory.storage.base import Plan, utcnow
from langchain_tiered_memory.storage.jobs import enqueue_statement


def _seed(backup: MySQLBackup) -> None:
    backup.add_messages(
        "s1", [HumanMessage("hi"), AIMessage("x" * (CHUNK_CHARS + 10))], user_id="u1"
    )
    backup.add_messages("s2", [HumanMessage("hello")], user_id="u2")
    backup.add_messages("s3", [HumanMessage("anonymous")])
    t, now = backup.tables, utcnow()

    def plan() -> Plan[None]:
        for n, kind in enumerate(("raw", "raw", "fact")):
            yield sa.insert(t.memories).values(
                id=f"m{n}",
                session_id="s1" if n < 2 else "s2",
                user_id="u1" if n < 2 else "u2",
                content_hash=f"h{n}",
                text=f"memory {n}",
                kind=kind,
                source_ids="[1]",
                turn_at=now,
                created_at=now,
            )
        yield enqueue_statement(t.jobs, "extract", "s1", "u1", 2, now)
        yield enqueue_statement(t.jobs, "extract", "s2", "u2", 3, now)
        yield sa.update(t.jobs).where(t.jobs.c.session_id == "s2").values(attempts=2)

    backup.run(plan(), write=True)


def test_stats_counts_the_archive_and_one_session(backup: MySQLBackup) -> None:
    empty = backup.stats()
    assert (empty.messages, empty.sessions, empty.memory_count, empty.queue_depth) == (0, 0, 0, 0)
    assert empty.first_at is None and empty.user_id is None
    _seed(backup)

    whole = backup.stats()
    assert (whole.messages, whole.sessions, whole.users) == (4, 3, 2)
    assert whole.parts > 0  # the large message is stored in pieces
    assert whole.first_at is not None and whole.last_at is not None
    assert whole.first_at <= whole.last_at
    assert whole.memories == {"raw": 2, "fact": 1}
    assert whole.memory_count == 3
    assert [(j.kind, j.state, j.count) for j in whole.jobs] == [("extract", "pending", 2)]
    assert whole.jobs[0].attempts == 2 and whole.jobs[0].oldest is not None
    assert (whole.queue_depth, whole.retrying) == (2, 1)
    assert (whole.consolidated, whole.history_batches, whole.raw_batches) == (0, 0, 0)
    if backup.dialect == "sqlite":
        assert whole.table_bytes is None
    else:
        assert whole.table_bytes is not None and whole.table_bytes > 0

    s1 = backup.stats("s1")
    assert (s1.messages, s1.sessions, s1.users, s1.user_id) == (2, 1, 1, "u1")
    assert s1.parts == whole.parts  # only s1 has a large message
    assert s1.memories == {"raw": 2}
    assert (s1.queue_depth, s1.retrying, s1.table_bytes) == (1, 0, None)
    anonymous = backup.stats("s3")
    assert (anonymous.messages, anonymous.parts, anonymous.user_id) == (1, 0, None)
    assert anonymous.memory_count == 0
    missing = backup.stats("nobody")
    assert (missing.messages, missing.memory_count, missing.user_id) == (0, 0, None)

    # A session whose messages were cleared is still known by its memories' user.
    backup.clear("s2")
    cleared = backup.stats("s2")
    assert (cleared.messages, cleared.memory_count, cleared.user_id) == (0, 1, "u2")


def test_astats_is_stats(backup: MySQLBackup) -> None:
    _seed(backup)

    async def both() -> tuple[Any, Any]:
        try:
            return await backup.astats(), await backup.astats("s1")
        finally:
            await backup.adispose()

    whole, s1 = asyncio.run(both())
    assert whole == backup.stats()
    assert s1 == backup.stats("s1")


def test_stats_validates_the_session_id(backup: MySQLBackup) -> None:
    with pytest.raises(ValueError, match="control character"):
        backup.stats("bad\x01id")
