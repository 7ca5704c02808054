"""MySQLBackup against SQLite and a real MariaDB: round trips, paging, atomicity, faults."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import shutil
import socket
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import uvloop
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_tiered_memory import (
    ArchiveRefusedError,
    ArchiveUnavailableError,
    MySQLBackup,
    SessionFileArchive,
    TieredChatMessageHistory,
    TieredStore,
)
from langchain_tiered_memory.storage.archive import in_memory, render_url, validate_table_name

from .conftest import MYSQL_URL, _drop, require_mysql, rows_read

EVERY_KIND = [
    SystemMessage("你是一个 ERP 助手。", id="sys-1"),
    HumanMessage(
        [
            {"type": "text", "text": "应收账款表 ar_invoice 的结构? 🚀"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
        id="h-1",
        name="alice",
        additional_kwargs={"trace": {"nested": [1, 2, {"深": "层"}]}},
    ),
    AIMessage(
        "",
        id="ai-1",
        tool_calls=[{"name": "search_kb", "args": {"q": "AR 表", "k": 5}, "id": "call-1"}],
        response_metadata={"finish_reason": "tool_calls", "model_name": "fake"},
        usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
    ),
    ToolMessage(
        "检索到 5 个文档 📄", tool_call_id="call-1", name="search_kb", artifact={"ids": [1]}
    ),
    AIMessage("AR 表有 invoice_no, amount 字段 ✅", id="ai-2"),
    ChatMessage("a custom role", role="reviewer"),
    FunctionMessage("{'ok': true}", name="legacy_fn"),
    AIMessageChunk("streamed 片段", id="chunk-1"),
    HumanMessage("'; DROP TABLE chat_messages; -- \\x00 𝒳 \u202e"),
]


def test_round_trip_of_every_message_kind(backup: MySQLBackup) -> None:
    ids = backup.add_messages("s1", EVERY_KIND, user_id="u1")
    assert ids == sorted(ids) and len(set(ids)) == len(EVERY_KIND)
    assert backup.get_messages("s1") == EVERY_KIND
    rows = backup.history("s1", limit=100)
    assert [row.message for row in rows] == EVERY_KIND
    assert {row.user_id for row in rows} == {"u1"}
    assert [row.role for row in rows] == [
        "system",
        "human",
        "ai",
        "tool",
        "ai",
        "chat",
        "function",
        "ai",
        "human",
    ]


@pytest.mark.parametrize("megabytes", [10, 17])
def test_large_messages_survive(backup: MySQLBackup, megabytes: int) -> None:
    # 17 MB is past MariaDB's default max_allowed_packet (16 MB).
    size = megabytes * 1024 * 1024
    big = HumanMessage(("应收账款 ar_invoice 🚀 " * (size // 20 + 1))[:size])
    backup.add_messages("big", [big, AIMessage("ok")])
    backup.add_messages("big", [HumanMessage("next"), AIMessage("fine")])
    stored = backup.get_messages("big")
    assert len(stored) == 4
    assert stored[0].content == big.content
    assert backup.tail("big", 1) == [HumanMessage("next"), AIMessage("fine")]


def test_created_at_keeps_microseconds(backup: MySQLBackup) -> None:
    for n in range(5):
        backup.add_messages("t", [HumanMessage(f"m{n}")])
    stamps = [row.created_at for row in backup.history("t")]
    assert stamps == sorted(stamps)
    assert any(stamp.microsecond for stamp in stamps)
    assert len(set(stamps)) == len(stamps)


def test_history_pages_backwards(backup: MySQLBackup) -> None:
    for n in range(120):
        backup.add_messages("p", [HumanMessage(f"message {n}")])
    backup.add_messages("other", [HumanMessage("not mine")])
    page1 = backup.history("p", limit=50)
    assert [r.message.content for r in page1] == [f"message {n}" for n in range(70, 120)]
    page2 = backup.history("p", before_id=page1[0].id, limit=50)
    assert [r.message.content for r in page2] == [f"message {n}" for n in range(20, 70)]
    page3 = backup.history("p", before_id=page2[0].id, limit=50)
    assert [r.message.content for r in page3] == [f"message {n}" for n in range(20)]
    assert backup.history("p", before_id=page3[0].id) == []


def test_sessions_lists_counts_and_activity(backup: MySQLBackup) -> None:
    backup.add_messages("a", [HumanMessage("1"), AIMessage("2")], user_id="u1")
    backup.add_messages("b", [HumanMessage("1")], user_id="u2")
    backup.add_messages("c", [HumanMessage("1"), AIMessage("2"), HumanMessage("3")], user_id="u1")
    everything = backup.sessions()
    assert [(s.session_id, s.message_count) for s in everything] == [("c", 3), ("b", 1), ("a", 2)]
    assert everything[0].last_active >= everything[1].last_active >= everything[2].last_active
    mine = backup.sessions(user_id="u1")
    assert [(s.session_id, s.user_id) for s in mine] == [("c", "u1"), ("a", "u1")]


def test_a_batch_is_one_transaction(backup: MySQLBackup) -> None:
    backup.add_messages("tx", [HumanMessage("kept"), AIMessage("kept too")])
    inserts = 0

    def fail_second_insert(conn, cursor, statement, params, context, executemany):
        nonlocal inserts
        if statement.lstrip().upper().startswith("INSERT"):
            inserts += 1
            if inserts == 2:
                raise sa.exc.OperationalError(statement, params, RuntimeError("disk full"))

    sa.event.listen(backup.engine, "before_cursor_execute", fail_second_insert)
    try:
        with pytest.raises(ArchiveUnavailableError, match="disk full"):
            backup.add_messages("tx", [HumanMessage("lost 1"), AIMessage("lost 2")])
    finally:
        sa.event.remove(backup.engine, "before_cursor_execute", fail_second_insert)
    assert [m.content for m in backup.get_messages("tx")] == ["kept", "kept too"]


async def test_async_methods_share_the_archive(backup: MySQLBackup) -> None:
    await backup.aadd_messages("as", [HumanMessage("async 1"), AIMessage("a1")], user_id="u")
    backup.add_messages("as", [HumanMessage("sync 2"), AIMessage("a2")], user_id="u")
    assert await backup.aget_messages("as") == backup.get_messages("as")
    assert [m.content for m in await backup.atail("as", 1)] == ["sync 2", "a2"]
    assert [r.message.content for r in await backup.ahistory("as", limit=1)] == ["a2"]
    assert [s.session_id for s in await backup.asessions(user_id="u")] == ["as"]
    assert await backup.aclear("as") == 4
    assert backup.get_messages("as") == []
    await backup.adispose()


def test_clear_touches_only_its_session(backup: MySQLBackup) -> None:
    big = HumanMessage("x" * 1_200_000)  # stored in parts
    backup.add_messages("gone", [big, AIMessage("a")])
    backup.add_messages("stays", [big, AIMessage("b")])
    assert backup.clear("gone") == 2
    assert backup.get_messages("gone") == []
    assert backup.get_messages("stays") == [big, AIMessage("b")]
    with backup.engine.connect() as conn:
        parts = conn.execute(sa.select(sa.func.count()).select_from(backup.parts_table)).scalar()
    assert parts == 2  # only the pieces of the message that stays


@pytest.mark.parametrize("reader", ["get_messages", "tail", "window", "aget_messages", "atail"])
def test_a_read_sees_the_session_before_or_after_a_clear_never_half(
    backup: MySQLBackup, reader: str
) -> None:
    # A read takes the rows, then the pieces of the large ones: the session is cleared
    # between the two, and the read still returns what it saw (one snapshot).
    turn = [HumanMessage("q"), AIMessage("y" * 1_200_000)]  # the answer is in pieces
    backup.add_messages("s1", turn)
    history = TieredChatMessageHistory("s1", backup=backup, window_max_tokens=None)
    cleared: list[threading.Thread] = []

    def clear_before_the_pieces(conn, cursor, statement, *_: object) -> None:  # type: ignore[no-untyped-def]
        if backup.parts_table.name in statement and not cleared:
            cleared.append(threading.Thread(target=backup.clear, args=("s1",)))
            cleared[0].start()
            cleared[0].join(30)  # a writer is never blocked by a reader
            assert not cleared[0].is_alive()

    async def aread() -> list[BaseMessage]:
        engine = backup.async_engine().sync_engine
        sa.event.listen(engine, "before_cursor_execute", clear_before_the_pieces)
        try:
            if reader == "aget_messages":
                return await backup.aget_messages("s1")
            return await backup.atail("s1", 1)
        finally:
            await backup.adispose()

    sa.event.listen(backup.engine, "before_cursor_execute", clear_before_the_pieces)
    try:
        if reader.startswith("a"):
            read = asyncio.run(aread())
        elif reader == "window":
            read = history.messages
        else:
            read = getattr(backup, reader)("s1", *((1,) if reader == "tail" else ()))
    finally:
        sa.event.remove(backup.engine, "before_cursor_execute", clear_before_the_pieces)
    assert cleared, "the read never fetched the pieces"
    assert read == turn
    assert backup.get_messages("s1") == []


# -- event loops come and go ---------------------------------------------------

LOOP_KINDS = [
    "asyncio.run",
    "asyncio.run in a thread",
    "closed loop",
    "abandoned loop",
    "dropped loop",
    "closed uvloop",
]


def _run_on_a_new_loop(kind: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run ``work`` once on a loop of its own, ended as ``kind`` says."""

    def by_hand(
        close: bool, new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    ) -> None:
        loop = new_loop()
        loop.run_until_complete(work())
        if close:  # closed without loop.shutdown_asyncgens()
            loop.close()

    if kind == "asyncio.run":
        asyncio.run(work())
        return
    if kind == "dropped loop":  # this thread's, never closed nor run again
        by_hand(close=False)
        return
    target = {
        "asyncio.run in a thread": lambda: asyncio.run(work()),
        "closed loop": lambda: by_hand(close=True),
        "abandoned loop": lambda: by_hand(close=False),  # its thread ends, it stays open
        "closed uvloop": lambda: by_hand(close=True, new_loop=uvloop.new_event_loop),
    }[kind]
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()


def _wait_until(what: Callable[[], bool]) -> bool:
    """``what()`` within 30 s (a server notices a closed socket when it reads it)."""
    deadline = time.monotonic() + 30
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("kind", LOOP_KINDS)
@pytest.mark.parametrize("database", ["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def test_the_connections_of_an_event_loop_are_closed_once_it_ends(
    database: str,
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    table_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A sync app that runs each request with asyncio.run opened one connection per
    # request and never closed it: MariaDB refused every client after 151 requests.
    if database == "mysql":
        user, password = request.getfixturevalue("mysql_user")
        url = sa.make_url(MYSQL_URL).set(username=user, password=password)
        server = sa.create_engine(MYSQL_URL, poolclass=sa.NullPool)

        def connections() -> int:  # the archive's own, seen by the server
            with server.connect() as conn:
                query = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s"
                return int(conn.exec_driver_sql(query, (user,)).scalar_one())

    else:
        url = sa.make_url(f"sqlite:///{tmp_path / 'loops.sqlite3'}")
        before = threading.active_count()

        def connections() -> int:  # an aiosqlite connection is a thread
            return threading.active_count() - before

    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: unraisable.append(repr(info)))
    backup = MySQLBackup(url, table_name=table_name)
    try:
        backup.dispose()
        assert _wait_until(lambda: connections() == 0)
        for n in range(1, 21):
            _run_on_a_new_loop(kind, lambda: backup.aadd_messages("s", [HumanMessage("q")]))
            # At most the last loop's, until the next call or dispose() sees it ended;
            # a dropped loop cannot be told from a paused one before dispose().
            most = n if kind == "dropped loop" else 1
            assert _wait_until(lambda most=most: connections() <= most), connections()
        backup.dispose()
        assert _wait_until(lambda: connections() == 0), connections()
        assert len(backup.get_messages("s")) == 20
        backup.dispose()
        gc.collect()
        assert unraisable == []  # no "Event loop is closed" while a connection is collected
    finally:
        _drop_all(backup)
        if database == "mysql":
            server.dispose()


def test_a_loop_paused_in_the_middle_of_a_call_keeps_its_connection(backup: MySQLBackup) -> None:
    """Another loop's call swept every loop not running: a loop paused between
    run_until_complete calls lost the connection its task was reading from."""

    def plan() -> Iterator[Any]:
        heavy = (
            "SELECT SLEEP(1.5)"
            if backup.dialect == "mysql"
            else (
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
                "SELECT count(*) FROM c"
            )
        )
        first = yield sa.text(heavy)
        value = first.scalar()
        second = yield sa.text("SELECT 2")
        return value, second.scalar()

    loop = asyncio.new_event_loop()
    paused = threading.Event()
    out: list[Any] = []

    def paused_mid_call() -> None:
        task = loop.create_task(backup.arun(plan, read_only=True))
        loop.run_until_complete(asyncio.sleep(0.3))  # the task is in the middle of its query
        paused.set()
        time.sleep(0.5)  # the other loop's call comes now
        out.append(loop.run_until_complete(asyncio.wait_for(task, 30)))
        loop.run_until_complete(backup.adispose())
        loop.close()

    thread = threading.Thread(target=paused_mid_call)
    thread.start()
    assert paused.wait(30)
    asyncio.run(backup.aget_messages("s"))
    thread.join(60)
    assert out and out[0][1] == 2


def test_a_loop_closed_in_the_middle_of_a_call_holds_up_no_later_call(
    tmp_path: Path, table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiosqlite's thread dies with a loop closed mid-call; closing its connection
    from the next call's loop then waited for good (asyncio.run never returned)."""
    died: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    path = tmp_path / "mid.sqlite3"
    backup = MySQLBackup(f"sqlite:///{path}", table_name=table_name, timeout=5)
    blocker = sqlite3.connect(path)
    blocker.execute("BEGIN IMMEDIATE")  # the call waits for the write lock

    def stopped_mid_call() -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(backup.aadd_messages("s", [HumanMessage("lost")]))
        loop.call_later(0.5, loop.stop)
        loop.run_forever()
        assert not task.done()  # stopped in the middle of the call
        loop.close()

    first = threading.Thread(target=stopped_mid_call)
    first.start()
    first.join(30)
    blocker.rollback()
    blocker.close()
    assert _wait_until(lambda: len(died) == 1)  # "Event loop is closed", in aiosqlite
    read: list[list[BaseMessage]] = []
    later = threading.Thread(
        target=lambda: read.append(asyncio.run(backup.aget_messages("s"))), daemon=True
    )
    later.start()
    later.join(60)
    assert not later.is_alive(), "the next async call never returned"
    assert read == [[]]
    started = time.monotonic()
    backup.dispose()
    assert time.monotonic() - started < 10
    backup.add_messages("s", [HumanMessage("next")])  # the dead call's lock is gone
    _drop_all(backup)


async def test_a_long_lived_loop_keeps_its_connection(backup: MySQLBackup) -> None:
    connects: list[object] = []
    sa.event.listen(backup.async_engine().sync_engine, "connect", lambda *_: connects.append(1))
    for n in range(20):
        await backup.aadd_messages("s", [HumanMessage(f"q{n}")])
        assert len(await backup.aget_messages("s")) == n + 1
    assert len(connects) == 1
    await backup.adispose()


def test_table_creation_is_idempotent(backend_url: str, table_name: str) -> None:
    first = MySQLBackup(backend_url, table_name=table_name)
    first.add_messages("s", [HumanMessage("hi")])
    second = MySQLBackup(backend_url, table_name=table_name)
    assert second.get_messages("s") == [HumanMessage("hi")]
    first.metadata.drop_all(first.engine)
    first.dispose()
    second.dispose()


@pytest.mark.mysql
def test_id_list_columns_of_an_earlier_table_are_widened_by_processes_starting_at_once(
    table_name: str,
) -> None:
    """H2: ``source_ids`` was a TEXT (64 KB on MySQL): a memory that kept absorbing
    repeated turns overflowed it, and every later batch was refused."""
    require_mysql()
    first = MySQLBackup(MYSQL_URL, table_name=table_name)
    memories = first.tables.memories.name
    try:
        with first.engine.begin() as conn:  # as an earlier version made them
            for column, null in (("source_ids", "NOT NULL"), ("context_ids", "NULL")):
                conn.exec_driver_sql(f"ALTER TABLE `{memories}` MODIFY `{column}` TEXT {null}")
            conn.exec_driver_sql(
                f"INSERT INTO `{memories}` (id, session_id, content_hash, text, kind, "
                "source_ids, turn_at, created_at) VALUES ('m', 's', 'h', 't', 'raw', '[1, 2]', "
                "NOW(), NOW())"
            )
        started: list[MySQLBackup] = []
        failures: list[BaseException] = []
        barrier = threading.Barrier(4)

        def start() -> None:
            barrier.wait()
            try:
                started.append(MySQLBackup(MYSQL_URL, table_name=table_name))
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=start) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert failures == [] and len(started) == 4
        columns = {c["name"]: c for c in sa.inspect(first.engine).get_columns(memories)}
        for column, null in (("source_ids", False), ("context_ids", True)):
            assert isinstance(columns[column]["type"], sa.dialects.mysql.LONGTEXT)
            assert columns[column]["nullable"] is null
        long_list = "[" + ", ".join(str(10**12 + n) for n in range(10_000)) + "]"  # 150 KB

        def grow() -> Any:
            table = first.tables.memories
            yield sa.update(table).where(table.c.id == "m").values(source_ids=long_list)

        first.run(grow(), write=True)
        with first.engine.connect() as conn:
            stored = conn.execute(sa.text(f"SELECT source_ids FROM `{memories}`")).scalar()
        assert stored == long_list
        for backup in started:
            backup.dispose()
    finally:
        first.metadata.drop_all(first.engine)
        first.dispose()


def test_a_value_the_database_refuses_is_a_typed_refusal_not_an_outage(
    backup: MySQLBackup,
) -> None:
    """H3: a refusal of the data was reported as ``ArchiveUnavailableError``, an outage."""
    locks, messages = backup.tables.locks, backup.tables.messages

    def duplicate() -> Any:
        yield sa.insert(locks).values(name="claim")  # created with the tables

    with pytest.raises(ArchiveRefusedError, match="refused") as refused:
        backup.run(duplicate(), write=True)
    assert isinstance(refused.value, ValueError)
    assert not isinstance(refused.value, ArchiveUnavailableError)
    if backup.dialect != "sqlite":  # SQLite stores any length

        def too_long() -> Any:
            yield sa.insert(messages).values(
                session_id="s", role="x" * 40, message="{}", parts=0, created_at=sa.func.now()
            )

        with pytest.raises(ArchiveRefusedError, match="Data too long"):
            backup.run(too_long(), write=True)
    backup.add_messages("s", [HumanMessage("still works")])
    assert backup.get_messages("s") == [HumanMessage("still works")]


def test_accepts_an_engine(backend_url: str, table_name: str) -> None:
    engine = sa.create_engine(backend_url)
    backup = MySQLBackup(engine, table_name=table_name)
    backup.add_messages("e", [HumanMessage("via engine")])
    assert backup.get_messages("e") == [HumanMessage("via engine")]
    backup.metadata.drop_all(engine)
    engine.dispose()


@pytest.mark.parametrize("bad", ["1abc", "x;drop", "a" * 60, ""])
def test_rejects_bad_table_names(bad: str) -> None:
    with pytest.raises(ValueError, match="table_name"):
        MySQLBackup("sqlite://", table_name=bad)


@contextlib.contextmanager
def _own_database(backend_url: str, tmp_path: Path) -> Iterator[sa.Engine]:
    """An empty database of the test's own: any table name is free in it."""
    if backend_url.startswith("sqlite"):
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'own.sqlite3'}")
        yield engine
        engine.dispose()
        return
    name = f"tm_own_{uuid.uuid4().hex[:12]}"
    server = sa.create_engine(backend_url)
    with server.begin() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine = sa.create_engine(sa.make_url(backend_url).set(database=name))
    try:
        yield engine
    finally:
        engine.dispose()
        with server.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name}")
        server.dispose()


def test_table_names_of_every_length_work_or_are_refused_up_front(
    backend_url: str, tmp_path: Path
) -> None:
    """MySQL's identifiers end at 64 characters; the derived index names are longer.

    Every length is either refused before anything is created, or works end to end.
    Derived names grow with the base name, so the longest accepted length (37) is
    the one that could fail; a spread of shorter ones is created as well (each
    costs seven CREATE TABLEs on MariaDB).
    """
    end_to_end = {1, 2, 3, 9, 17, 33, 36, 37}
    with _own_database(backend_url, tmp_path) as engine:
        accepted = []
        for length in range(1, 65):
            name = ("T" + uuid.uuid4().hex * 2)[:length]
            if length <= 37 and length not in end_to_end:
                validate_table_name(name)
                accepted.append(length)
                continue
            try:
                archive = MySQLBackup(engine, table_name=name)
            except ValueError as exc:
                assert "the limit is 37" in str(exc)
                assert sa.inspect(engine).get_table_names() == [], "refused, yet created"
                continue
            accepted.append(length)
            archive.add_messages("s", [HumanMessage(name), AIMessage("ok")], jobs=["extract"])
            assert [m.content for m in archive.get_messages("s")] == [name, "ok"]
            created = set(sa.inspect(engine).get_table_names())
            assert created == {t.name for t in archive.metadata.sorted_tables}
            archive.metadata.drop_all(engine)
        assert accepted == list(range(1, 38))


def test_history_and_tail_refuse_bad_numbers(backup: MySQLBackup) -> None:
    """Out-of-range ints were OverflowErrors or SQL errors; a str before_id read rows."""
    backup.add_messages("n", [HumanMessage(f"q{i}") for i in range(11)])
    last = backup.history("n", limit=1)[0].id
    for kwargs, error, match in [
        ({"before_id": "abc"}, TypeError, "before_id must be an int"),
        ({"before_id": "12"}, TypeError, "before_id must be an int"),
        ({"before_id": 5.0}, TypeError, "before_id must be an int"),
        ({"before_id": True}, TypeError, "before_id must be an int"),
        ({"before_id": 0}, ValueError, "before_id must be a positive int"),
        ({"before_id": 10**30}, ValueError, "no larger than 9_223_372_036_854_775_807"),
        ({"before_id": 2**63}, ValueError, "before_id"),
        ({"limit": 10**20}, ValueError, "limit must be a positive int no larger than 1_000"),
        ({"limit": -5}, ValueError, "limit"),
        ({"limit": 2**4000}, ValueError, "an int of 4001 bits"),
        ({"limit": None}, TypeError, "limit must be an int"),
    ]:
        with pytest.raises(error, match=match):
            backup.history("n", **kwargs)
    for turns in (10**20, 0, -1):
        with pytest.raises(ValueError, match="turns"):
            backup.tail("n", turns)
    with pytest.raises(TypeError, match="jobs must hold job kinds or enqueue planners"):
        backup.add_messages("n", [HumanMessage("lost")], jobs=[10**20])
    # The edges themselves work.
    assert len(backup.history("n", before_id=2**63 - 1, limit=10**9)) == 11
    assert len(backup.history("n", before_id=last)) == 10
    assert len(backup.tail("n", 10**9)) == 11
    assert len(backup.get_messages("n")) == 11  # nothing stored by the refused write


async def test_async_history_and_tail_refuse_bad_numbers(backup: MySQLBackup) -> None:
    await backup.aadd_messages("n", [HumanMessage("q"), AIMessage("a")])
    with pytest.raises(TypeError, match="before_id"):
        await backup.ahistory("n", before_id="abc")
    with pytest.raises(ValueError, match="limit"):
        await backup.ahistory("n", limit=10**20)
    with pytest.raises(ValueError, match="turns"):
        await backup.atail("n", 10**20)
    assert [m.content for m in await backup.atail("n", 10**9)] == ["q", "a"]
    await backup.adispose()


def test_tail_reads_back_only_as_far_as_the_turns_it_returns(backup: MySQLBackup) -> None:
    """A window of one turn on a session of 10,000 messages reads a few rows, not all."""
    size = 10_000
    for start in range(0, size, 2_000):
        batch: list[BaseMessage] = []
        for n in range(start, start + 2_000, 2):
            batch += [HumanMessage(f"question {n}"), AIMessage(f"answer {n}")]
        backup.add_messages("long", batch)
    assert [info.message_count for info in backup.sessions()] == [size]
    got: list[BaseMessage] = []
    read = rows_read(backup, backup.table.name, lambda: got.extend(backup.tail("long", 1)))
    assert [m.content for m in got] == [f"question {size - 2}", f"answer {size - 2}"]
    assert read < size // 10, f"tail(s, 1) read {read} rows of a {size}-message session"


# -- URLs with passwords ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql+pymysql://u:S3cretPw@h/db", "mysql+pymysql://u:***@h/db"),
        ("mysql+pymysql://u@h/db?password=S3cretPw", "mysql+pymysql://u@h/db?password=***"),
        (
            "mysql+pymysql://u@h:3307/db?charset=utf8mb4&passwd=S3cretPw",
            "mysql+pymysql://u@h:3307/db?charset=utf8mb4&passwd=***",
        ),
        (
            "mysql+pymysql://u:S3cretPw@h/db?ssl_key=S3cretPw&PASSWORD=S3cretPw&x=1&x=2",
            "mysql+pymysql://u:***@h/db?ssl_key=***&PASSWORD=***&x=1&x=2",
        ),
        (sa.make_url("mysql://u:p%40ss@h/db?token=S3cretPw"), "mysql://u:***@h/db?token=***"),
        ("sqlite:///a.db", "sqlite:///a.db"),
        ("not a url S3cretPw", "<an unparsable URL>"),
    ],
)
def test_render_url_hides_every_password(url: str | sa.URL, shown: str) -> None:
    assert render_url(url) == shown


def test_a_password_in_the_query_never_shows_in_errors() -> None:
    for query in ("password", "passwd"):
        url = f"mysql+pymysql://root@127.0.0.1:1/test?{query}=S3cretPw&connect_timeout=2"
        with pytest.raises(ArchiveUnavailableError) as caught:
            MySQLBackup(url)
        assert "S3cretPw" not in str(caught.value)
        assert "127.0.0.1:1" in str(caught.value)
    # A parameter the driver does not know is the driver's TypeError, naming only the key.
    with pytest.raises(TypeError, match="api_token") as refused:
        MySQLBackup("mysql+pymysql://root@127.0.0.1:1/test?api_token=S3cretPw")
    assert "S3cretPw" not in str(refused.value)


@pytest.mark.mysql
@pytest.mark.parametrize("where", ["userinfo", "password", "passwd"])
async def test_a_password_anywhere_in_the_url_works_and_never_shows(
    mysql_user: tuple[str, str], table_name: str, where: str
) -> None:
    user, password = mysql_user
    base = sa.make_url(MYSQL_URL).set(username=user)
    url = (
        base.set(password=password)
        if where == "userinfo"
        else base.update_query_dict({where: password})
    ).render_as_string(hide_password=False)
    backup = MySQLBackup(url, table_name=table_name)
    try:
        backup.add_messages("s", [HumanMessage("sync")])
        await backup.aadd_messages("s", [HumanMessage("async")])  # aiomysql too
        assert [m.content for m in backup.get_messages("s")] == ["sync", "async"]
        for shown in (repr(backup), repr(backup.engine), str(backup.url), repr(backup.url)):
            assert password not in shown
        assert user in repr(backup)
        await backup.adispose()
    finally:
        _drop_all(backup)
    wrong = url.replace(password, "Wrong-" + password[::-1])
    with pytest.raises(ArchiveUnavailableError, match="Access denied") as caught:
        MySQLBackup(wrong, table_name=table_name)
    assert password[::-1] not in str(caught.value)
    assert password not in str(caught.value)


def _drop_all(backup: MySQLBackup) -> None:
    backup.metadata.drop_all(backup.engine)
    backup.dispose()


# -- an unreachable database ---------------------------------------------------


class _Proxy:
    """A TCP forwarder to the MySQL server that a test can cut and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()


@pytest.mark.mysql
def test_unreachable_mysql_raises_and_loses_nothing(table_name: str) -> None:
    require_mysql()
    url = sa.make_url(MYSQL_URL)
    proxy = _Proxy((url.host or "127.0.0.1", url.port or 3306))
    backup = MySQLBackup(url.set(host="127.0.0.1", port=proxy.port), table_name=table_name)
    try:
        backup.add_messages("s", [HumanMessage("before"), AIMessage("stored")])
        proxy.cut()
        with pytest.raises(ArchiveUnavailableError, match="archive mysql"):
            backup.add_messages("s", [HumanMessage("during"), AIMessage("refused")])
        proxy.restore()
        backup.add_messages("s", [HumanMessage("after"), AIMessage("stored again")])
        assert [m.content for m in backup.get_messages("s")] == [
            "before",
            "stored",
            "after",
            "stored again",
        ]
    finally:
        proxy.cut()
        backup.dispose()
        direct = MySQLBackup(MYSQL_URL, table_name=table_name)
        direct.metadata.drop_all(direct.engine)
        direct.dispose()


def test_unreachable_sqlite_raises_and_loses_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    backup = MySQLBackup(f"sqlite:///{folder / 'a.sqlite3'}")
    backup.add_messages("s", [HumanMessage("before"), AIMessage("stored")])
    backup.dispose()
    shutil.move(folder, tmp_path / "moved")
    with pytest.raises(ArchiveUnavailableError, match="unable to open database file"):
        backup.add_messages("s", [HumanMessage("during")])
    shutil.move(tmp_path / "moved", folder)
    backup.dispose()
    assert [m.content for m in backup.get_messages("s")] == ["before", "stored"]


def test_unreachable_at_start_is_a_clear_error() -> None:
    with pytest.raises(ArchiveUnavailableError, match=r"127\.0\.0\.1:1"):
        MySQLBackup("mysql+pymysql://root@127.0.0.1:1/test")


@pytest.mark.mysql
async def test_a_driver_error_that_sqlalchemy_does_not_wrap_is_archive_unavailable(
    table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting a pooled connection's isolation level calls the driver directly.

    After a server crash PyMySQL raised its own ``OperationalError`` ("Lost connection")
    there, past ``except SQLAlchemyError``: a write must still fail as the archive
    being unavailable, sync and async, with nothing stored.
    """
    require_mysql()  # SQLite sets no isolation level on a pooled connection
    backup = MySQLBackup(MYSQL_URL, table_name=table_name)
    backup.add_messages("s", [HumanMessage("before")])
    dbapi_error = backup.engine.dialect.loaded_dbapi.OperationalError

    def lost(*args: object, **kwargs: object) -> None:
        raise dbapi_error(2013, "Lost connection to MySQL server during query")

    dialects = {backup.engine.dialect.__class__, backup.async_engine().dialect.__class__}
    for dialect in dialects:
        monkeypatch.setattr(dialect, "set_isolation_level", lost)
        monkeypatch.setattr(dialect, "_assert_and_set_isolation_level", lost, raising=False)
    with pytest.raises(ArchiveUnavailableError, match="Lost connection"):
        backup.add_messages("s", [HumanMessage("lost")])
    with pytest.raises(ArchiveUnavailableError, match="Lost connection"):
        await backup.aadd_messages("s", [HumanMessage("lost")])
    monkeypatch.undo()
    try:
        assert backup.get_messages("s") == [HumanMessage("before")]
    finally:
        await backup.adispose()
        backup.metadata.drop_all(backup.engine)
        backup.dispose()


def test_a_plan_that_writes_after_reading_must_declare_it(backup: MySQLBackup) -> None:
    """A read-then-write plan run as a reader is refused before it writes, on both drivers.

    On SQLite it would fail with "database is locked" only when another writer
    slipped in between (a race); refusing it every time finds it in any test.
    """
    import asyncio

    from langchain_tiered_memory.storage.base import Plan, UndeclaredWriteError

    backup.add_messages("s", [HumanMessage("hi")])
    locks = backup.tables.locks

    def plan() -> Plan[None]:
        yield sa.select(locks.c.name)
        yield sa.insert(locks).values(name="extra")

    def names() -> Plan[set[str]]:
        rows = yield sa.select(locks.c.name)
        return {row.name for row in rows}

    with pytest.raises(UndeclaredWriteError, match="write=True"):
        backup.run(plan())

    async def run_async() -> None:
        try:
            with pytest.raises(UndeclaredWriteError, match="write=True"):
                await backup.arun(plan())
        finally:
            await backup.adispose()

    asyncio.run(run_async())
    assert "extra" not in backup.run(names(), read_only=True)
    backup.run(plan(), write=True)
    assert "extra" in backup.run(names(), read_only=True)


class NoteMessage(HumanMessage):
    """A custom message type langchain_core cannot read back."""

    type: str = "note"  # type: ignore[assignment]


def test_a_message_of_a_type_that_cannot_be_read_back_is_refused_and_nothing_is_lost(
    backup: MySQLBackup,
) -> None:
    backup.add_messages("s1", [HumanMessage("the warehouse is in Lyon"), AIMessage("ok")])
    with pytest.raises(TypeError, match=r"type 'note'.*cannot read back"):
        backup.add_messages("s1", [HumanMessage("fine"), NoteMessage("remember this")])
    with pytest.raises(TypeError, match="type 'note'"):
        TieredChatMessageHistory("s1", backup=backup).add_messages([NoteMessage("x")])
    assert [m.content for m in backup.get_messages("s1")] == ["the warehouse is in Lyon", "ok"]


def test_a_remove_message_is_refused_and_nothing_is_lost(
    backup: MySQLBackup, tmp_path: Path
) -> None:
    """A RemoveMessage was archived as a message: nothing was removed and every later
    prompt carried a message providers cannot convert."""
    sent = [HumanMessage("q", id="h1"), AIMessage("a", id="a1")]
    for archive in (backup, SessionFileArchive(tmp_path)):
        archive.add_messages("s1", sent)
        with pytest.raises(TypeError, match=r"messages\[1\] is a RemoveMessage.*reducer"):
            archive.add_messages("s1", [HumanMessage("next"), RemoveMessage(id="a1")])
        assert archive.get_messages("s1") == sent
    history = TieredChatMessageHistory("s2", backup=backup)
    with pytest.raises(TypeError, match="RemoveMessage"):
        history.add_messages([HumanMessage("q"), RemoveMessage(id="x")])
    with pytest.raises(TypeError, match="RemoveMessage"):
        asyncio.run(history.aadd_messages([RemoveMessage(id="x")]))
    assert history.messages == []


def test_values_json_cannot_hold_are_archived_as_langchains_stand_in(backup: MySQLBackup) -> None:
    odd = {"when": datetime.date(2023, 6, 1), (1, 2): "a tuple key", "(1, 2)": "its name"}
    backup.add_messages("s1", [HumanMessage("hi", additional_kwargs=odd)])
    [stored] = backup.get_messages("s1")
    assert stored.content == "hi"
    assert stored.additional_kwargs["when"]["repr"] == "datetime.date(2023, 6, 1)"
    assert stored.additional_kwargs["(1, 2) (2)"] == "a tuple key"  # no value lost
    assert stored.additional_kwargs["(1, 2)"] == "its name"


def test_keys_json_writes_alike_all_keep_their_values(backup: MySQLBackup, tmp_path: Path) -> None:
    """json.dumps writes 1 and "1" (None and "null") as one key, and json.loads keeps the
    last: a tool's artifact keyed by row number and by name lost a row without a word."""
    artifact = {1: "row one (int key)", "1": "row one (str key)", None: "no key", "null": "text"}
    sent = [
        HumanMessage("q"),
        AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "c", "type": "tool_call"}]),
        ToolMessage("done", tool_call_id="c", artifact={"rows": [artifact]}),
    ]
    for archive in (backup, SessionFileArchive(tmp_path)):
        archive.add_messages("s1", sent)
        [rows] = archive.get_messages("s1")[-1].artifact["rows"]
        assert sorted(rows.values()) == sorted(artifact.values())  # no value lost
        assert rows["1"] == "row one (str key)" and rows["null"] == "text"


def test_an_in_memory_archive_is_one_database_for_every_thread() -> None:
    """MySQLBackup("sqlite://") gave each thread its own empty database: a store or a
    history used from a worker thread (LangGraph runs sync tools in one) saw nothing,
    or failed with "no such table"."""
    backup = MySQLBackup("sqlite://")
    store = TieredStore(backup)
    backup.add_messages("s1", [HumanMessage("q"), AIMessage("a")], user_id="u")
    store.put(("users", "u"), "tea", {"text": "likes oolong"})

    def write(n: int) -> None:
        for i in range(20):
            backup.add_messages(f"t{n}", [HumanMessage(f"{n}-{i}"), AIMessage("ok")], user_id="u")
            store.put(("users", "u"), f"k{n}-{i}", {"n": i})

    with ThreadPoolExecutor(4) as pool:
        assert pool.submit(backup.get_messages, "s1").result() == backup.get_messages("s1")
        item = pool.submit(store.get, ("users", "u"), "tea").result()
        assert item is not None and item.value == {"text": "likes oolong"}
        list(pool.map(write, range(4)))  # threads at once: no transaction mixes with another
    for n in range(4):
        assert [m.content for m in backup.get_messages(f"t{n}")[::2]] == [
            f"{n}-{i}" for i in range(20)
        ]
    assert len(store.search(("users", "u"), limit=100)) == 81
    backup.dispose()


def test_an_in_memory_engine_of_a_pool_per_thread_is_refused() -> None:
    """MySQLBackup(create_engine("sqlite://")) gave each thread its own empty database."""
    refused = [
        sa.create_engine("sqlite://"),
        sa.create_engine("sqlite://", poolclass=sa.NullPool),
        sa.create_engine("sqlite:///file:x?mode=memory&uri=true", poolclass=sa.SingletonThreadPool),
        sa.create_engine("sqlite:///file::memory:?uri=true"),
    ]
    # Without uri=true these name files: an archive like any other.
    for name in ("file:mode=memory.db", "file:db?mode=memory"):
        assert not in_memory(sa.make_url(f"sqlite:///{name}"))
    for engine in refused:
        with pytest.raises(ValueError, match="in-memory SQLite Engine needs StaticPool"):
            MySQLBackup(engine)
    for url in ("sqlite:///file:named?mode=memory&uri=true", "sqlite:///file::memory:?uri=true"):
        by_url = MySQLBackup(url)  # set up as one database for every thread
        by_url.add_messages("s", [HumanMessage("hi")])
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(by_url.get_messages, "s").result() == [HumanMessage("hi")]
    shared = sa.create_engine(
        "sqlite://", poolclass=sa.StaticPool, connect_args={"check_same_thread": False}
    )
    backup = MySQLBackup(shared)
    backup.add_messages("s", [HumanMessage("hi")])
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(backup.get_messages, "s").result() == [HumanMessage("hi")]


def test_an_archive_of_a_one_connection_pool_opens_on_mysql(table_name: str) -> None:
    """Table creation held a pooled connection for MySQL's schema lock and asked the
    same pool for another: a pool of one connection never opened (QueuePool limit)."""
    require_mysql()
    kwargs = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 5}
    backup = MySQLBackup(MYSQL_URL, table_name=table_name, engine_kwargs=kwargs)
    try:
        store = TieredStore(backup)
        backup.add_messages("s1", [HumanMessage("q"), AIMessage("a")])
        store.put(("ns",), "k", {"v": 1})
        again = MySQLBackup(MYSQL_URL, table_name=table_name, engine_kwargs=kwargs)
        assert [m.content for m in again.get_messages("s1")] == ["q", "a"]
        again.dispose()
        store.metadata.drop_all(backup.engine)
    finally:
        _drop(backup)
