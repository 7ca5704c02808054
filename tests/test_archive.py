"""MySQLBackup against SQLite and a real MariaDB: round trips, paging, atomicity, faults."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_tiered_memory import ArchiveUnavailableError, MySQLBackup

from .conftest import MYSQL_URL, require_mysql

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


def test_table_creation_is_idempotent(backend_url: str, table_name: str) -> None:
    first = MySQLBackup(backend_url, table_name=table_name)
    first.add_messages("s", [HumanMessage("hi")])
    second = MySQLBackup(backend_url, table_name=table_name)
    assert second.get_messages("s") == [HumanMessage("hi")]
    first.metadata.drop_all(first.engine)
    first.dispose()
    second.dispose()


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
