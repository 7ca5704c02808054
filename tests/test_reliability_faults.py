"""Faults: the database stopped, crashed or frozen, the Chroma server killed, a bad LLM.

The contract under test:

* a write either succeeds durably or raises ``ArchiveUnavailableError``; nothing
  acknowledged is lost or doubled, and a failed batch is stored wholly or not at all;
* reads raise the same typed error while the archive is down, and never hang;
* the chat keeps answering with what is reachable: with the Chroma server gone, turns
  are still archived and long-term search still answers (from the catalog);
* pending extraction and consolidation catch up by themselves once the service is
  back, without waiting out a lease, and without counting the outage as LLM failures.

MariaDB faults run on a private server (:class:`PrivateMariaDB`: its own data
directory and port) that the tests stop, kill and freeze; Chroma faults on a private
``chroma run``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from sqlalchemy import insert, make_url, select, update

from langchain_tiered_memory import ArchiveUnavailableError, MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.storage.base import utcnow
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from langchain_tiered_memory.tiers.long_memory.catalog import storable

from .conftest import MYSQL_URL, require_mysql
from .fakes import HashEmbeddings
from .long_memory_support import FakeExtractor, wait_until
from .reliability_support import (
    ChaosExtractor,
    ChromaServer,
    MemoryWriter,
    PrivateMariaDB,
    StallingProxy,
    archive_rows,
    by_session,
    percentile,
    private_mariadb,
    table_rows,
)
from .scripts import run_python

MakeMemory = Callable[..., ChromaLongMemory]


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    """A MariaDB of this module's own, which its tests stop, kill and freeze."""
    with private_mariadb(tmp_path_factory.mktemp("mariadb")) as server:
        yield server


def _turn(tag: str, n: int) -> list[BaseMessage]:
    return [HumanMessage(f"{tag} question {n} q{n}x"), AIMessage(f"{tag} answer {n} a{n}y")]


class Writer(threading.Thread):
    """Writes numbered turns until stopped; records what was acknowledged and what raised."""

    def __init__(self, history: TieredChatMessageHistory, tag: str, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.history, self.tag, self.pause = history, tag, pause
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.unexpected: list[BaseException] = []
        self.slowest = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                self.history.add_messages(_turn(self.tag, n))
                self.acked.append(n)
            except ArchiveUnavailableError:
                self.failed.append(n)
            except BaseException as exc:
                self.unexpected.append(exc)
            self.slowest = max(self.slowest, time.monotonic() - began)
            n += 1
            time.sleep(self.pause)

    def wait_for(self, acked: int = 0, failed: int = 0, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < acked or len(self.failed) < failed:
            assert time.monotonic() < deadline, (len(self.acked), len(self.failed))
            assert not self.unexpected, self.unexpected
            time.sleep(0.02)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


def _check_turns(backup: MySQLBackup, writer: Writer, session_id: str) -> list[int]:
    """Acknowledged turns once each, in order; failed ones wholly or not at all."""
    assert not writer.unexpected, writer.unexpected
    contents = [str(row.content) for row in by_session(archive_rows(backup))[session_id]]
    assert len(contents) % 2 == 0
    stored = []
    for k in range(0, len(contents), 2):
        n = int(contents[k].split()[2])
        assert contents[k : k + 2] == [str(m.content) for m in _turn(writer.tag, n)]
        stored.append(n)
    assert stored == sorted(set(stored)), "duplicated or reordered turns"
    assert set(writer.acked) <= set(stored), set(writer.acked) - set(stored)
    # A failed write may have committed before its connection died (the reply lost).
    assert set(stored) - set(writer.acked) <= set(writer.failed)
    return stored


# -- the database: stopped, crashed, frozen ---------------------------------------------


def test_mysql_stopped_and_restarted_mid_conversation(
    mariadb: PrivateMariaDB, tmp_path: Path, chroma_client: Any, collection_name: str
) -> None:
    backup = MySQLBackup(mariadb.url, table_name=f"t_{uuid.uuid4().hex[:12]}")
    extractor = FakeExtractor()
    memory = ChromaLongMemory(
        client=chroma_client,
        collection_name=collection_name,
        embedding=HashEmbeddings(),
        extractor=extractor,
        backup=backup,
        poll_interval=0.05,
        retry_base_delay=0.01,
    )  # the default lease (300 s): catching up must not wait for it
    consolidator = MemoryConsolidator(
        MemoryWriter(),
        root=tmp_path / "memory",
        backup=backup,
        threshold=8,
        batch=4,
        poll_interval=0.05,
        retry_base_delay=0.01,
    )
    history = TieredChatMessageHistory(
        "conv", user_id="u", backup=backup, long_memory=memory, consolidator=consolidator
    )
    writer = Writer(history, "db")
    try:
        writer.start()
        writer.wait_for(acked=15)
        mariadb.stop()
        outage = time.monotonic()
        writer.wait_for(failed=len(writer.failed) + 5)
        # Reads fail fast with the same typed error while the server is down.
        for read in (
            lambda: history.messages,
            lambda: history.search_memories("question"),
            lambda: backup.history("conv"),
            lambda: memory.flush(timeout=1),
        ):
            began = time.monotonic()
            with pytest.raises(ArchiveUnavailableError, match=str(mariadb.port)):
                read()
            assert time.monotonic() - began < 10
        mariadb.start()
        writer.wait_for(acked=len(writer.acked) + 15)
        back = time.monotonic()
        writer.stop()
        # The workers survived the outage and catch up on their own.
        assert memory._thread is not None and memory._thread.is_alive()
        assert consolidator._thread is not None and consolidator._thread.is_alive()
        memory.flush(timeout=60)
        consolidator.flush(timeout=60)
        caught_up = time.monotonic() - back
        stored = _check_turns(backup, writer, "conv")
        assert len(writer.failed) >= 5 and len(stored) >= 30
        assert history.messages[-1].content == _turn("db", stored[-1])[1].content
        # Every stored turn has exactly one memory, extracted (the outage is not an
        # extractor failure, so no turn fell back to raw).
        rows = sorted(table_rows(backup, "memories"), key=lambda row: row.seq)
        assert [row.text for row in rows] == [f"Summary: db question {n} q{n}x" for n in stored]
        assert table_rows(backup, "jobs") == []
        logs = sorted(table_rows(backup, "history_log"), key=lambda row: row.first_id)
        ids = [row.id for row in archive_rows(backup)]
        assert [(r.first_id, r.last_id) for r in logs] == [
            (ids[k], ids[k + 3]) for k in range(0, 4 * len(logs), 4)
        ]
        assert len(ids) - 4 * len(logs) <= 8
        memory_md = (consolidator.folder("conv") / "MEMORY.md").read_text()
        assert memory_md == consolidator.memory("conv")
        print(
            f"\n[faults] MySQL stop/start: outage {back - outage:.1f} s, "
            f"{len(writer.failed)} writes raised, {len(writer.acked)} acknowledged, "
            f"caught up {caught_up:.2f} s after the restart"
        )
    finally:
        writer.stop()
        memory.close()
        consolidator.close()
        if mariadb.process is None or mariadb.process.poll() is not None:
            mariadb.start()
        backup.metadata.drop_all(backup.engine)
        backup.dispose()
        chroma_client.delete_collection(collection_name)


def test_mysql_killed_with_sigkill_keeps_every_acknowledged_write(
    mariadb: PrivateMariaDB,
) -> None:
    backup = MySQLBackup(mariadb.url, table_name=f"t_{uuid.uuid4().hex[:12]}")
    writers = [
        Writer(TieredChatMessageHistory(f"crash{k}", backup=backup), f"w{k}", pause=0.0)
        for k in range(4)
    ]
    try:
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.wait_for(acked=20)
        mariadb.kill()  # InnoDB has only its redo log to go by
        for writer in writers:
            writer.wait_for(failed=1)
        mariadb.start()
        for writer in writers:
            writer.wait_for(acked=len(writer.acked) + 10)
            writer.stop()
        for k, writer in enumerate(writers):
            _check_turns(backup, writer, f"crash{k}")
    finally:
        for writer in writers:
            writer.stop()
        if mariadb.process is None or mariadb.process.poll() is not None:
            mariadb.start()
        backup.metadata.drop_all(backup.engine)
        backup.dispose()


def test_a_frozen_mysql_server_raises_instead_of_hanging(mariadb: PrivateMariaDB) -> None:
    """SIGSTOP: the port accepts connections and nothing answers.

    Without socket timeouts PyMySQL waits forever; with them, writes and reads raise
    ``ArchiveUnavailableError`` within the timeout and the next call after the thaw
    works on the same objects.
    """
    backup = MySQLBackup(
        mariadb.url,
        table_name=f"t_{uuid.uuid4().hex[:12]}",
        engine_kwargs={
            "connect_args": {"connect_timeout": 2, "read_timeout": 2, "write_timeout": 2}
        },
    )
    history = TieredChatMessageHistory("frozen", backup=backup)
    try:
        history.add_messages(_turn("f", 0))
        mariadb.freeze()
        try:
            for action in (lambda: history.add_messages(_turn("f", 1)), lambda: history.messages):
                began = time.monotonic()
                with pytest.raises(ArchiveUnavailableError):
                    action()
                assert time.monotonic() - began < 15
        finally:
            mariadb.thaw()
        history.add_messages(_turn("f", 2))
        contents = [str(m.content) for m in backup.get_messages("frozen")]
        assert contents[:2] == [str(m.content) for m in _turn("f", 0)]
        assert contents[-2:] == [str(m.content) for m in _turn("f", 2)]
        assert len(contents) in (4, 6)  # turn 1 wholly or not at all
    finally:
        mariadb.thaw()
        backup.metadata.drop_all(backup.engine)
        backup.dispose()


TIMEOUT = 2.0  # MySQLBackup(timeout=...) in the silent-server test


@pytest.fixture
def silent_link(table_name: str) -> Iterator[tuple[StallingProxy, MySQLBackup]]:
    """An archive on the shared MariaDB, reached through a proxy that can go silent."""
    require_mysql()
    direct = MySQLBackup(MYSQL_URL, table_name=table_name)  # DDL without the short timeout
    upstream = make_url(MYSQL_URL)
    proxy = StallingProxy((upstream.host or "127.0.0.1", upstream.port or 3306))
    backup = MySQLBackup(
        upstream.set(host="127.0.0.1", port=proxy.port), table_name=table_name, timeout=TIMEOUT
    )
    try:
        yield proxy, backup
    finally:
        proxy.resume()
        backup.dispose()
        proxy.close()
        direct.metadata.drop_all(direct.engine)
        direct.dispose()


def _silent(proxy: StallingProxy, call: Callable[[], Any]) -> float:
    """Stall the proxy, run ``call``, and return how long it took to raise."""
    proxy.stall()
    began = time.monotonic()
    try:
        with pytest.raises(ArchiveUnavailableError):
            call()
        return time.monotonic() - began
    finally:
        proxy.resume()


def _stall_after_first(proxy: StallingProxy, statements: list[Any]) -> Any:
    """A plan that goes silent mid-transaction: after its first statement's reply."""
    for index, statement in enumerate(statements):
        yield statement
        if index == 0:
            proxy.stall()


@pytest.mark.mysql
def test_sync_calls_against_a_silent_server_raise_within_the_timeout(
    silent_link: tuple[StallingProxy, MySQLBackup],
) -> None:
    """Connections accepted, nothing answered: each call raises within ``timeout``.

    Covers a pooled connection (its ping goes unanswered, then the reconnect), an
    empty pool (the handshake goes unanswered), a write, and a transaction cut off
    after its first statement; the archive works again once the link does, and
    holds exactly the acknowledged writes.
    """
    proxy, backup = silent_link
    backup.add_messages("s", _turn("sync", 0))
    t = backup.table
    cut_off = [
        insert(t).values(session_id="s", role="human", message="{}", parts=0, created_at=utcnow()),
        select(t.c.id),
    ]
    calls: list[Callable[[], Any]] = [
        lambda: backup.get_messages("s"),
        lambda: backup.add_messages("s", _turn("sync", 1)),
        lambda: backup.run(_stall_after_first(proxy, cut_off)),
        lambda: TieredChatMessageHistory("s", backup=backup).messages,
    ]
    for index, call in enumerate(calls):
        if index == 3:
            backup.dispose()  # an empty pool: a fresh connection's handshake goes unanswered
        if index == 2:
            began = time.monotonic()
            with pytest.raises(ArchiveUnavailableError):
                call()
            took = time.monotonic() - began
            proxy.resume()
        else:
            took = _silent(proxy, call)
        assert took < 2 * TIMEOUT, f"call {index} took {took:.1f} s"
        # Back at once, on the same object, with exactly the acknowledged turn.
        assert backup.get_messages("s") == _turn("sync", 0)
    assert backup.engine.pool.checkedout() == 0


@pytest.mark.mysql
def test_async_calls_against_a_silent_server_raise_within_the_timeout(
    silent_link: tuple[StallingProxy, MySQLBackup],
) -> None:
    """The same on aiomysql, which has no read timeout: the call's deadline bounds it.

    A connection cut off mid-conversation is discarded: its late replies (the
    proxy forwards them on resume) must never reach a later call.
    """
    proxy, backup = silent_link
    t = backup.table
    cut_off = [
        insert(t).values(session_id="s", role="human", message="{}", parts=0, created_at=utcnow()),
        select(t.c.id),
    ]

    async def scenario() -> None:
        await backup.aadd_messages("s", _turn("async", 0))
        engine = backup.async_engine()
        for index, name in enumerate(("read", "write", "cut off", "history", "fresh")):
            if name == "fresh":
                await backup.adispose()  # the handshake of a new connection goes unanswered
                engine = backup.async_engine()
            proxy.stall()
            began = time.monotonic()
            with pytest.raises(ArchiveUnavailableError, match=f"within {TIMEOUT:g} s"):
                if name == "read":
                    await backup.aget_messages("s")
                elif name == "write":
                    await backup.aadd_messages("s", _turn("async", 1))
                elif name == "cut off":
                    await backup.arun(_stall_after_first(proxy, cut_off))
                else:
                    await TieredChatMessageHistory("s", backup=backup).aget_messages()
            took = time.monotonic() - began
            proxy.resume()
            assert took < 2 * TIMEOUT, f"{name} took {took:.1f} s"
            assert engine.pool.checkedout() == 0, name
            for _ in range(3):  # a pooled connection with a late reply would answer wrongly
                assert await backup.aget_messages("s") == _turn("async", 0), (index, name)
        await backup.adispose()

    asyncio.run(scenario())


# -- the Chroma server killed and restarted ------------------------------------------------


#: How the worker logs a batch that failed on something else than the LLM.
OUTAGE = ("ChromaLongMemory failed; retrying", "ChromaLongMemory still failing")


def test_chroma_server_killed_and_restarted(
    backup: MySQLBackup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ChromaServer(tmp_path / "chroma-server")
    server.start()
    memory = ChromaLongMemory(
        host="127.0.0.1",
        port=server.port,
        collection_name="faults",
        embedding=HashEmbeddings(),
        extractor=FakeExtractor(),
        backup=backup,
        poll_interval=0.05,
        retry_base_delay=0.01,
    )  # the default lease (300 s): catching up must not wait for it
    history = TieredChatMessageHistory("c", user_id="u", backup=backup, long_memory=memory)
    try:
        for n in range(5):
            history.add_messages(_turn("chroma", n))
        memory.flush(timeout=30)
        server.kill()
        latencies = []
        for n in range(5, 10):
            began = time.monotonic()
            history.add_messages(_turn("chroma", n))  # the hot path does not need Chroma
            latencies.append(time.monotonic() - began)
        assert max(latencies) < 1.0, latencies
        assert [m.content for m in history.messages][-1] == "chroma answer 9 a9y"
        # Search still answers, from the catalog's vectors: no exception.
        docs = history.search_memories("chroma question 3 q3x", k=3)
        assert docs and docs[0].page_content == "Summary: chroma question 3 q3x"
        context = memory.as_context().invoke(
            {"input": "question 1"}, config={"configurable": {"session_id": "c"}}
        )
        assert "Summary: chroma question 1 q1x" in context
        # Memories older than the catalog's vectors need Chroma for the dense side:
        # without it, a warning and BM25 alone, never an exception.
        memories = backup.tables.memories

        def drop_vectors() -> Any:
            yield update(memories).where(memories.c.session_id == "c").values(vector=None)

        backup.run(drop_vectors())
        with caplog.at_level("WARNING", logger="langchain_tiered_memory"):
            reader = ChromaLongMemory(  # a new process's view: no cached vectors
                host="127.0.0.1",
                port=server.port,
                collection_name="faults",
                embedding=HashEmbeddings(),
                backup=backup,
                start_worker=False,
            )
            docs = reader.search("chroma question 4 q4x", session_id="c", k=3)
        reader.close()
        assert docs and docs[0].page_content == "Summary: chroma question 4 q4x"
        assert "the Chroma server at" in caplog.text  # at construction
        assert "dense search unavailable" in caplog.text  # at search
        # The worker tries more often than an extraction's attempts (3), fails on
        # Chroma each time, and keeps the jobs: an outage is not the LLM's failure.
        with caplog.at_level("WARNING", logger="langchain_tiered_memory"):
            caplog.clear()
            assert wait_until(
                lambda: sum(r.getMessage().startswith(OUTAGE) for r in caplog.records) > 3,
                timeout=60,
            )
        assert len(table_rows(backup, "jobs")) == 5
        assert memory._thread is not None and memory._thread.is_alive()
        server.start()  # same folder and port
        back = time.monotonic()
        memory.flush(timeout=30)
        caught_up = time.monotonic() - back
        rows = sorted(table_rows(backup, "memories"), key=lambda row: row.seq)
        expected = [f"Summary: chroma question {n} q{n}x" for n in range(10)]
        assert [row.text for row in rows] == expected
        assert [row.kind for row in rows] == ["extracted"] * 10  # no raw fallback
        # Chroma kept what it had acknowledged before the kill, and got the rest.
        assert sorted(memory.collection.get(include=[])["ids"]) == sorted(row.id for row in rows)
        print(f"\n[faults] Chroma kill/restart: caught up {caught_up:.2f} s after the restart")
    finally:
        memory.close()
        server.stop()


def test_long_memory_starts_while_the_chroma_server_is_down(
    backup: MySQLBackup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ChromaServer(tmp_path / "chroma-late")
    history: TieredChatMessageHistory | None = None
    with caplog.at_level("WARNING"):
        memory = ChromaLongMemory(
            host="127.0.0.1",
            port=server.port,
            collection_name="late",
            embedding=HashEmbeddings(),
            backup=backup,
            poll_interval=0.05,
        )
    try:
        assert any("Chroma" in record.getMessage() for record in caplog.records)
        history = TieredChatMessageHistory("late", backup=backup, long_memory=memory)
        history.add_messages(_turn("late", 0))
        assert history.search_memories("question") == []
        server.start()
        memory.flush(timeout=30)
        [doc] = history.search_memories("question 0")
        assert doc.page_content == "User: late question 0 q0x\nAI: late answer 0 a0y"
        assert memory.collection.count() == 1
    finally:
        memory.close()
        server.stop()


# -- the extractor LLM failing, hanging, or answering garbage --------------------------------

MODES = ["ok", "raise", "hang", "empty", "blocks", "surrogate", "huge", "none", "flaky", "ok"]


def test_a_misbehaving_extractor_never_blocks_the_chat(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    extractor = ChaosExtractor(hang=3.0)
    memory = make_memory(
        extractor=extractor,
        extract_timeout=0.5,
        retry_base_delay=0.01,
        poll_interval=0.02,
        start_worker=True,
        batch_size=1,
    )
    history = TieredChatMessageHistory("chaos", backup=backup, long_memory=memory)
    # A new MySQL connection costs PyMySQL a TLS context (it reads the CA store: 55 ms
    # of CPU, 0.62 s once on a loaded machine), paid by the first write that finds the
    # worker holding the pool's only connection. Open the two the chat and the worker
    # use before timing, so the latencies measure the writes alone.
    with backup.engine.connect(), backup.engine.connect():
        pass
    latencies = []
    for n, mode in enumerate(MODES):
        began = time.monotonic()
        history.add_messages([HumanMessage(f"question mode={mode} #{n}"), AIMessage(f"answer {n}")])
        latencies.append(time.monotonic() - began)
        assert history.messages[-1].content == f"answer {n}"
    hang_started = time.monotonic()
    while extractor.seen.get("mode=hang #2", 0) == 0:
        assert time.monotonic() - hang_started < 30
        time.sleep(0.02)
    for n in range(len(MODES), len(MODES) + 10):  # while the extractor hangs
        began = time.monotonic()
        history.add_messages([HumanMessage(f"more mode=ok #{n}"), AIMessage(f"answer {n}")])
        latencies.append(time.monotonic() - began)
    memory.flush(timeout=60)
    assert memory._thread is not None and memory._thread.is_alive()
    assert table_rows(backup, "jobs") == []
    rows = {json.loads(row.source_ids)[0]: row for row in table_rows(backup, "memories")}
    ids = [row.id for row in archive_rows(backup)]
    outcome = {}
    for n in range(len(MODES) + 10):
        row = rows.get(ids[2 * n])
        outcome[n] = None if row is None else (row.kind, len(row.text))
    for n, mode in enumerate(MODES):
        row = rows.get(ids[2 * n])
        if mode in ("ok", "flaky"):
            assert (row.kind, row.text) == ("extracted", f"Summary: mode={mode} #{n}")
        elif mode == "none":
            assert row is None
        elif mode == "surrogate":  # stored, the lone surrogate replaced
            assert row.kind == "extracted" and "\ud800" not in row.text
        elif mode == "huge":  # stored, cut to a size a memory can use
            assert row.kind == "extracted" and 0 < len(row.text) < extractor.huge
        else:  # raise, hang, empty, blocks: three failed attempts, then the raw turn
            assert row.kind == "raw", (mode, outcome)
            assert row.text == f"User: question mode={mode} #{n}\nAI: answer {n}"
            assert extractor.seen[f"mode={mode} #{n}"] == 3
    # The hot path never waited for the extractor (0.5 s timeouts, 3 s hangs).
    assert max(latencies) < 0.5, sorted(latencies)[-3:]
    print(
        f"\n[faults] chaos extractor: add_messages p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )


def test_a_huge_answer_is_cut_before_it_is_scanned(tmp_path: Path) -> None:
    """The worker's work on an answer is bounded by the memory size, not the answer's.

    A regex over a 20 MB answer holds the GIL for the whole scan and stalls the
    chat's own threads; the answer is cut first, so no copy of it is ever made.
    Measured in an interpreter of its own: tracemalloc counts every thread's
    allocations, and an earlier test's abandoned extractor call may still be running.
    """
    code = """
import tracemalloc

from langchain_tiered_memory.tiers.long_memory.catalog import MEMORY_CHARS, storable

huge = "y" * (20 * 1024 * 1024) + "\\ud800"  # the lone surrogate forces a rewrite
tracemalloc.start()
text = storable(huge)
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
assert len(text) == MEMORY_CHARS and text.endswith("…"), len(text)
print(peak)
"""
    peak = int(run_python(code, tmp_path).stdout.split()[-1])
    assert peak < 1024 * 1024, f"{peak} bytes: the answer was copied before it was cut"
    assert storable("a \ud800 b") == "a \ufffd b"
