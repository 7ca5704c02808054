"""Leases: a slow job is not run twice, and a stale runner's commit changes nothing.

Two workers share one archive (SQLite or MariaDB) and, for extraction, one Chroma
collection. Worker A claims a job and is held inside it (its fake LLM, its Chroma
write or its file write waits on an Event). With A's heartbeat off and a tiny
lease, worker B claims the job again and finishes it; then A is let go. Each job's
effect must happen once, from B, and the catalog, Chroma, MEMORY.md and HISTORY.md
must agree; nothing B wrote may be deleted. With the heartbeat on, B must not get
the job at all while A works past its lease.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from pydantic import Field
from sqlalchemy import inspect

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.storage.base import utcnow
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .long_memory_support import FakeExtractor, catalog, chroma_ids, job_rows, say, wait_until
from .test_consolidation import FakeLLM, chat, cursor_of, log_rows
from .test_long_memory_dedupe import assert_nothing_lost

MakeMemory = Callable[..., ChromaLongMemory]
STALE = 0.3  # seconds: the lease of the worker that is held up
HALF = timedelta(seconds=0.5)


class GatedExtractor(FakeExtractor):
    """A FakeExtractor that signals ``started`` and then waits for ``gate``."""

    gate: Any = Field(default_factory=threading.Event)
    started: Any = Field(default_factory=threading.Event)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.started.set()
        assert self.gate.wait(30)
        return super()._generate(messages, *args, **kwargs)


class GatedCollection:
    """A Chroma collection whose first ``upsert`` waits for ``gate``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()

    def upsert(self, **kwargs: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(30)
        return self.inner.upsert(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Runner(threading.Thread):
    """``worker.run_pending()`` in a thread; ``finished`` is its answer."""

    def __init__(self, worker: Any) -> None:
        super().__init__(daemon=True)
        self.worker = worker
        self.finished: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.finished = self.worker.run_pending()
        except BaseException as exc:
            self.error = exc

    def result(self) -> int | None:
        self.join(30)
        assert not self.is_alive(), "the worker is stuck"
        if self.error is not None:
            raise self.error
        return self.finished


def _lease_until(backup: MySQLBackup) -> Any:
    [job] = job_rows(backup)
    return job.lease_until


def _wait_past_lease(backup: MySQLBackup) -> None:
    until = _lease_until(backup)
    assert until is not None
    assert wait_until(lambda: utcnow() > until, timeout=10)


def _stale_memory(make_memory: MakeMemory, **kwargs: Any) -> ChromaLongMemory:
    memory = make_memory(lease_seconds=STALE, **kwargs)
    memory.heartbeat_interval = None  # it stalls past its lease, as a frozen process would
    return memory


def _assert_extracted_once(backup: MySQLBackup, memory: ChromaLongMemory, text: str) -> None:
    """One memory, B's; Chroma holds exactly it, with B's text; no job left."""
    [row] = catalog(backup)
    assert row.text == text
    assert chroma_ids(memory.collection) == [row.id]
    stored = memory.collection.get(ids=[row.id], include=["documents"])
    assert stored["documents"] == [text]
    assert job_rows(backup) == []


def _assert_consolidated_once(
    consolidator: MemoryConsolidator, session_id: str, memory: str
) -> None:
    """One batch, B's MEMORY.md; files equal the database; no job left."""
    backup = consolidator.backup
    [row] = log_rows(backup, session_id)
    assert cursor_of(backup, session_id) == row.last_id
    assert consolidator.memory(session_id) == memory
    folder = consolidator.folder(session_id)
    assert (folder / "MEMORY.md").read_text(encoding="utf-8") == memory
    history_md = (folder / "HISTORY.md").read_text(encoding="utf-8")
    assert history_md == "".join(consolidator.history_entries(session_id)) == row.entry
    assert job_rows(backup) == []


# -- a stale runner's commit is refused --------------------------------------------------


def test_a_stale_extraction_commits_nothing_and_deletes_no_vector(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    stale = _stale_memory(make_memory, extractor=GatedExtractor(answer="Summary: stale"))
    fresh = make_memory(extractor=FakeExtractor(answer="Summary: fresh"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, long_memory=fresh)
    say(history, "where are invoices kept?")
    a = Runner(stale)
    a.start()
    assert stale.extractor.started.wait(10)
    _wait_past_lease(backup)
    assert fresh.run_pending() == 1  # B claims the job A still runs, and finishes it
    stale.extractor.gate.set()
    assert a.result() == 0  # A's lease was taken over: it finished nothing
    _assert_extracted_once(backup, fresh, "Summary: fresh")
    assert fresh.extractor.recorder.calls == 1 and stale.extractor.recorder.calls == 1


def test_a_stale_vector_write_is_put_back_from_the_catalog(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """A stalls after its lease check, in its Chroma write: B's memory must survive it."""
    stale = _stale_memory(make_memory, extractor=FakeExtractor(answer="Summary: stale"))
    gated = GatedCollection(stale.collection)
    stale.collection = gated
    fresh = make_memory(extractor=FakeExtractor(answer="Summary: fresh"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, long_memory=fresh)
    say(history, "where are invoices kept?")
    a = Runner(stale)
    a.start()
    assert gated.entered.wait(10)
    _wait_past_lease(backup)
    assert fresh.run_pending() == 1
    gated.gate.set()  # A now overwrites B's vector, and its commit is refused
    assert a.result() == 0
    _assert_extracted_once(backup, fresh, "Summary: fresh")


def test_a_stale_merge_leaves_the_new_owners_sources_alone(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """A merged a turn into a stored memory, then stalled: B placed the turn otherwise.

    B's batch also holds the turn's growth, so B stores the grown turn as its own
    memory and leaves the stored one its first sources; A's refused commit must not
    merge the turn's messages into the stored memory again.
    """
    fresh = make_memory()
    chat = TieredChatMessageHistory("s", user_id="u", backup=backup, long_memory=fresh)
    other = TieredChatMessageHistory("t", user_id="u", backup=backup, long_memory=fresh)
    chat.add_messages([HumanMessage("hi"), AIMessage("hello")])
    assert fresh.run_pending() == 1
    say(other, "where are invoices kept?")  # A's batch: this turn, written to Chroma
    chat.add_messages([HumanMessage("hi"), AIMessage("hello")])  # and this one, merged
    chat.add_messages([AIMessage("hello")])  # the turn grows: B's batch only
    stale = _stale_memory(make_memory, batch_size=2)
    gated = GatedCollection(stale.collection)
    stale.collection = gated
    a = Runner(stale)
    a.start()
    assert gated.entered.wait(10)
    until = max(job.lease_until for job in job_rows(backup) if job.lease_until is not None)
    assert wait_until(lambda: utcnow() > until, timeout=10)
    assert fresh.run_pending() == 3
    gated.gate.set()
    assert a.result() == 0
    assert_nothing_lost(backup, fresh, "s")
    assert_nothing_lost(backup, fresh, "t")
    assert sorted(chroma_ids(fresh.collection)) == sorted(row.id for row in catalog(backup))
    assert job_rows(backup) == []


def test_a_session_forgotten_during_the_vector_write_keeps_no_vector(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """The job is gone, and so is every catalog row: no commit can come, the vector goes."""
    memory = make_memory(extractor=FakeExtractor(answer="Summary: secret"))
    gated = GatedCollection(memory.collection)
    memory.collection = gated
    history = TieredChatMessageHistory("gone", user_id="u", backup=backup, long_memory=memory)
    say(history, "my password hint is the cat's name")
    a = Runner(memory)
    a.start()
    try:
        assert gated.entered.wait(10)  # past its lease check, before its Chroma write
        assert backup.forget(session_id="gone") == 2
    finally:
        gated.gate.set()
    assert a.result() == 0
    assert catalog(backup) == [] and job_rows(backup) == []
    assert chroma_ids(gated.inner, {"session_id": "gone"}) == []


def test_a_stale_consolidation_touches_no_file(
    make_consolidator: Callable[..., MemoryConsolidator], backup: MySQLBackup
) -> None:
    gate = threading.Event()
    stale = make_consolidator(FakeLLM(gate=gate, answer="# stale"), lease_seconds=STALE)
    stale.heartbeat_interval = None
    fresh = make_consolidator(FakeLLM(answer="# fresh"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, consolidator=fresh)
    history.add_messages(chat(1, 5))  # one batch of 2 is due
    a = Runner(stale)
    a.start()
    assert stale.llm.calls.started.wait(10)
    _wait_past_lease(backup)
    assert fresh.run_pending() == 1
    gate.set()
    assert a.result() == 0
    _assert_consolidated_once(fresh, "s", "# fresh\n")
    assert stale.llm.calls.count == 1 and fresh.llm.calls.count == 1


def test_a_consolidation_stalled_while_writing_its_files_is_undone(
    make_consolidator: Callable[..., MemoryConsolidator],
    backup: MySQLBackup,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stalls after its lease check, while writing its files: B waits, then wins."""
    stale = make_consolidator(FakeLLM(answer="# stale"), lease_seconds=STALE)
    stale.heartbeat_interval = None
    fresh = make_consolidator(FakeLLM(answer="# fresh"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, consolidator=fresh)
    history.add_messages(chat(1, 5))
    entered, gate = threading.Event(), threading.Event()
    write = stale._write_files

    def stalled_write(*args: Any) -> None:
        if not entered.is_set():
            entered.set()
            assert gate.wait(30)
        write(*args)

    monkeypatch.setattr(stale, "_write_files", stalled_write)
    a = Runner(stale)
    a.start()
    assert entered.wait(10)
    _wait_past_lease(backup)
    b = Runner(fresh)
    b.start()
    assert fresh.llm.calls.started.wait(10)  # B has its answer and goes for the files
    gate.set()
    assert a.result() == 0
    assert b.result() == 1
    _assert_consolidated_once(fresh, "s", "# fresh\n")


# -- the heartbeat keeps a slow job's lease --------------------------------------------


def test_a_slow_extraction_keeps_its_lease(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    slow = make_memory(extractor=GatedExtractor(answer="Summary: slow"), lease_seconds=1.0)
    other = make_memory(extractor=FakeExtractor(answer="Summary: other"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, long_memory=other)
    say(history, "where are invoices kept?")
    a = Runner(slow)
    a.start()
    try:
        assert slow.extractor.started.wait(10)
        first = _lease_until(backup)
        assert wait_until(lambda: utcnow() > first + HALF)
        assert other.run_pending() == 0  # past the first lease: still A's
        [job] = job_rows(backup)
        assert job.worker == slow.queue.worker_id and job.lease_until > first
    finally:
        slow.extractor.gate.set()
    assert a.result() == 1
    _assert_extracted_once(backup, other, "Summary: slow")
    assert other.extractor.recorder.calls == 0


def test_a_slow_consolidation_keeps_its_lease(
    make_consolidator: Callable[..., MemoryConsolidator], backup: MySQLBackup
) -> None:
    gate = threading.Event()
    slow = make_consolidator(FakeLLM(gate=gate, answer="# slow"), lease_seconds=1.0)
    other = make_consolidator(FakeLLM(answer="# other"))
    history = TieredChatMessageHistory("s", user_id="u", backup=backup, consolidator=other)
    history.add_messages(chat(1, 5))
    a = Runner(slow)
    a.start()
    try:
        assert slow.llm.calls.started.wait(10)
        first = _lease_until(backup)
        assert wait_until(lambda: utcnow() > first + HALF)
        assert other.run_pending() == 0
        [job] = job_rows(backup)
        assert job.worker == slow.queue.worker_id and job.lease_until > first
    finally:
        gate.set()
    assert a.result() == 1
    _assert_consolidated_once(other, "s", "# slow\n")
    assert other.llm.calls.count == 0


# -- an archive made by the previous version ---------------------------------------------


def test_an_archive_without_lease_tokens_gets_the_column(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    jobs = backup.tables.jobs
    with backup.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {jobs.name} DROP COLUMN lease_token")
    old = make_memory(backup=backup)
    say(TieredChatMessageHistory("s", backup=backup, long_memory=old), "a turn queued before")
    upgraded = MySQLBackup(backup.url, table_name=backup.table.name)
    try:
        columns = {c["name"] for c in inspect(upgraded.engine).get_columns(jobs.name)}
        assert "lease_token" in columns
        MySQLBackup(backup.url, table_name=backup.table.name).dispose()  # again: a no-op
        memory = make_memory(backup=upgraded)
        assert memory.run_pending() == 1
        assert len(catalog(upgraded)) == 1 and job_rows(upgraded) == []
    finally:
        upgraded.dispose()
