"""ChromaLongMemory's durable queue and worker: the hot path, retries, order, concurrency."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import event

from langchain_tiered_memory import ArchiveUnavailableError, MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.storage.base import utcnow
from langchain_tiered_memory.tiers.extraction import parse_extraction
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .conftest import MYSQL_URL, _drop, require_mysql
from .fakes import HashEmbeddings
from .long_memory_support import (
    FakeExtractor,
    Recorder,
    archive_ids,
    catalog,
    job_rows,
    say,
    sources,
    turn_ids,
    wait_until,
)

MakeMemory = Callable[..., ChromaLongMemory]
REPO = Path(__file__).resolve().parents[1]


def history(
    backup: MySQLBackup, memory: ChromaLongMemory, session_id: str, user_id: str | None = None
) -> TieredChatMessageHistory:
    return TieredChatMessageHistory(session_id, user_id=user_id, backup=backup, long_memory=memory)


# -- 4a. durability: the job is written with the messages ---------------------------------


def test_job_row_is_written_in_the_messages_transaction(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    say(history(backup, memory, "s1", "u1"), "what is the AR table?", "a ledger")
    [job] = job_rows(backup)
    assert (job.kind, job.session_id, job.user_id, job.state, job.attempts) == (
        "extract",
        "s1",
        "u1",
        "pending",
        0,
    )
    assert job.last_message_id == archive_ids(backup, "s1")[-1]
    assert memory.queue.depth() == 1
    assert catalog(backup) == []  # nothing is extracted on the hot path


async def test_async_add_messages_queues_the_job_too(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "async", "u")
    await chat.aadd_messages([HumanMessage("async question"), AIMessage("async answer")])
    await backup.adispose()
    [job] = job_rows(backup)
    assert job.last_message_id == archive_ids(backup, "async")[-1]
    assert memory.run_pending() == 1
    assert [row.text for row in catalog(backup)] == ["User: async question\nAI: async answer"]


def test_failed_transaction_stores_neither_messages_nor_job(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "tx")
    jobs_insert = re.compile(rf"\s*INSERT INTO [`\"]?{backup.tables.jobs.name}\b", re.IGNORECASE)
    dbapi = backup.engine.dialect.loaded_dbapi

    def fail_on_job_insert(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if jobs_insert.match(statement):
            raise dbapi.OperationalError("injected failure on the job INSERT")

    event.listen(backup.engine, "before_cursor_execute", fail_on_job_insert)
    try:
        with pytest.raises(ArchiveUnavailableError, match="injected failure"):
            say(chat, "lost question", "lost answer")
    finally:
        event.remove(backup.engine, "before_cursor_execute", fail_on_job_insert)
    assert backup.get_messages("tx") == []
    assert job_rows(backup) == []
    say(chat, "kept question", "kept answer")  # the connection is still usable
    assert [m.content for m in backup.get_messages("tx")] == ["kept question", "kept answer"]
    assert len(job_rows(backup)) == 1


# -- 4b. the worker ----------------------------------------------------------------------


def test_worker_wakes_on_its_own_jobs_and_close_stops_it(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(start_worker=True, poll_interval=30.0)  # it would poll very rarely
    thread = memory._thread
    assert thread is not None and thread.is_alive()
    memory.start()  # idempotent
    assert memory._thread is thread
    time.sleep(0.1)  # let it go idle
    started = time.monotonic()
    say(history(backup, memory, "w"), "wake up")
    assert wait_until(lambda: len(catalog(backup)) == 1, timeout=10)
    assert time.monotonic() - started < 5  # notify, not the 30 s poll
    memory.close()
    assert not thread.is_alive()
    assert memory._thread is None


async def test_worker_wakes_on_its_own_async_jobs(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(start_worker=True, poll_interval=30.0)  # it would poll very rarely
    thread = memory._thread
    assert thread is not None and thread.is_alive()
    await asyncio.sleep(0.1)  # let it go idle
    started = time.monotonic()
    chat = history(backup, memory, "aw")
    await chat.aadd_messages([HumanMessage("wake up async"), AIMessage("awake")])
    await backup.adispose()
    assert wait_until(lambda: len(catalog(backup)) == 1, timeout=10)
    assert time.monotonic() - started < 5  # notify, not the 30 s poll
    memory.close()
    assert not thread.is_alive()


def test_flush_processes_everything_and_close_leaves_pending_jobs(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(start_worker=True, poll_interval=0.05)
    chat = history(backup, memory, "f")
    for n in range(5):
        say(chat, f"question {n}")
    memory.flush(timeout=20)
    assert memory.queue.depth() == 0
    assert len(catalog(backup)) == 5
    memory.close()
    say(chat, "after close")
    time.sleep(0.2)
    assert memory.queue.depth() == 1  # nobody works any more; the job waits durably
    memory.flush(timeout=20)  # without a worker, flush runs the jobs itself
    assert len(catalog(backup)) == 6


def test_pending_jobs_are_redriven_by_a_new_memory(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    first = make_memory(start_worker=True)
    first.close()
    for n in range(3):
        say(history(backup, first, "r", "u"), f"left behind {n}")
    assert first.queue.depth() == 3
    second = make_memory(start_worker=True, poll_interval=0.05)
    assert wait_until(lambda: second.queue.depth() == 0, timeout=20)
    rows = catalog(backup)
    assert [sources(row) for row in rows] == turn_ids(backup, "r")
    assert len(second.search("left behind", session_id="r")) == 3


def test_memories_of_a_session_follow_turn_order(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # The very first extraction fails: session a's later turns must wait for it.
    extractor = FakeExtractor(fail_first=1)
    memory = make_memory(extractor=extractor, retry_base_delay=0.05, batch_size=3)
    for n in range(6):
        say(history(backup, memory, "a"), f"a{n}: step {n} of the plan")
        say(history(backup, memory, "b"), f"b{n}: step {n} of the other plan")
    memory.flush(timeout=30)
    for session_id in ("a", "b"):
        rows = catalog(backup, session_id)
        assert [sources(row) for row in rows] == turn_ids(backup, session_id)
        assert [row.text for row in rows] == [
            f"Summary: {session_id}{n}: step {n} of the {'other ' if session_id == 'b' else ''}plan"
            for n in range(6)
        ]
    assert extractor.recorder.calls == 13  # one retry


# -- 4c. retries -------------------------------------------------------------------------


def test_extractor_failing_twice_then_succeeding(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    extractor = FakeExtractor(fail_first=2)
    memory = make_memory(extractor=extractor, retry_base_delay=0.1)
    say(history(backup, memory, "retry"), "what is the AR table?", "a ledger")
    for attempt in (1, 2):
        started = utcnow()
        assert memory.run_pending(max_batches=1) == 0
        [job] = job_rows(backup)
        assert job.attempts == attempt
        assert job.state == "pending"
        assert f"RuntimeError: extractor failure #{attempt}" in job.last_error
        # Exponential backoff: 0.1 s, then 0.2 s.
        assert job.not_before >= started + timedelta(seconds=0.1 * 2 ** (attempt - 1))
        assert wait_until(lambda due=job.not_before: utcnow() >= due, timeout=5)
    memory.flush(timeout=10)
    assert extractor.recorder.calls == 3
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("extracted", "Summary: what is the AR table?")
    assert job_rows(backup) == []


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_always_failing_extractor_stores_the_raw_turn(
    make_memory: MakeMemory, backup: MySQLBackup, max_attempts: int
) -> None:
    extractor = FakeExtractor(fail_always=True)
    memory = make_memory(extractor=extractor, retry_base_delay=0.01, max_attempts=max_attempts)
    say(history(backup, memory, "raw", "u"), "what is the AR table?", "a ledger")
    memory.flush(timeout=10)
    assert extractor.recorder.calls == max_attempts
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("raw", "User: what is the AR table?\nAI: a ledger")
    assert sources(row) == archive_ids(backup, "raw")
    assert memory.queue.depth() == 0


class Aborting(FakeExtractor):
    """Raises a ``BaseException`` that is no ``Exception`` on its first two calls."""

    abort: Any = None

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        if self.recorder.calls < 2:
            self.recorder.add(self.name_tag, "aborted")
            raise self.abort
        return super()._generate(messages, stop, run_manager, **kw)


@pytest.mark.parametrize(
    "abort",
    [asyncio.CancelledError("request cancelled"), KeyboardInterrupt(), SystemExit(3)],
    ids=["cancelled", "interrupt", "exit"],
)
def test_an_extractor_raising_a_base_exception_is_a_failed_attempt(
    make_memory: MakeMemory, backup: MySQLBackup, abort: BaseException
) -> None:
    """An asyncio.CancelledError from the model (an HTTP client cancelled) killed the
    worker thread for good: no later turn of any user was extracted, and flush raised
    the model's error."""
    extractor = Aborting(abort=abort)
    memory = make_memory(
        extractor=extractor, start_worker=True, poll_interval=0.05, retry_base_delay=0.01
    )
    say(history(backup, memory, "s1", "u"), "my bike is red", "Noted.")
    say(history(backup, memory, "s2", "v"), "my car is green", "Noted.")
    memory.flush(timeout=30)
    texts = sorted(row.text for row in catalog(backup))
    assert texts == ["Summary: my bike is red", "Summary: my car is green"]
    assert extractor.recorder.calls == 4  # two failed attempts, then each job once
    # The worker thread lives on: a later turn is extracted without a flush.
    say(history(backup, memory, "s3", "w"), "my boat is blue", "Noted.")
    assert wait_until(lambda: len(catalog(backup)) == 3, timeout=30)


def test_flush_times_out_while_a_job_backs_off(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(extractor=FakeExtractor(fail_always=True), retry_base_delay=30)
    say(history(backup, memory, "slow"), "question")
    with pytest.raises(TimeoutError, match="1 extract jobs still queued"):
        memory.flush(timeout=0.3)


def test_hanging_extractor_counts_as_a_failure(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    extractor = FakeExtractor(sleep=1.0)
    memory = make_memory(extractor=extractor, extract_timeout=0.2, retry_base_delay=0.01)
    say(history(backup, memory, "hang"), "what is the AR table?", "a ledger")
    started = time.monotonic()
    assert memory.run_pending(max_batches=1) == 0
    assert time.monotonic() - started < 0.9  # it did not wait for the answer
    [job] = job_rows(backup)
    assert job.attempts == 1
    assert "TimeoutError" in job.last_error and "0.2 s" in job.last_error
    memory.flush(timeout=10)
    assert time.monotonic() - started < 4
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("raw", "User: what is the AR table?\nAI: a ledger")
    assert extractor.recorder.calls == 3


def test_garbage_answer_counts_as_a_failure(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory(extractor=FakeListChatModel(responses=["", "   "]), retry_base_delay=0.01)
    say(history(backup, memory, "garbage"), "what is the AR table?", "a ledger")
    assert memory.run_pending(max_batches=1) == 0
    [job] = job_rows(backup)
    assert job.attempts == 1
    assert "ValueError: the extractor returned an empty answer" in job.last_error
    memory.flush(timeout=10)
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("raw", "User: what is the AR table?\nAI: a ledger")


def test_an_answer_cut_at_the_output_limit_counts_as_a_failure(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """A cut answer states half a fact as a whole one: retried, then the raw turn is kept."""
    cut = AIMessage("The AR table holds the invoi", response_metadata={"stop_reason": "max_tokens"})
    extractor = GenericFakeChatModel(messages=iter([cut, cut, cut]))
    memory = make_memory(extractor=extractor, retry_base_delay=0.01)
    say(history(backup, memory, "cut"), "what is the AR table?", "a ledger of invoices")
    assert memory.run_pending(max_batches=1) == 0
    [job] = job_rows(backup)
    assert "not whole (finish reason 'max_tokens')" in job.last_error
    memory.flush(timeout=10)
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("raw", "User: what is the AR table?\nAI: a ledger of invoices")


INCOMPLETE = [
    {"finish_reason": "length"},
    {"stop_reason": "max_tokens"},
    {"stop_reason": "model_context_window_exceeded"},
    {"finish_reason": "content_filter"},
    {"stopReason": "content_filtered"},
    {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}},
    {"finish_reason": "SAFETY"},
    {"stop_reason": "refusal"},
]
WHOLE = [
    {},
    {"finish_reason": "stop"},
    {"finish_reason": "STOP"},
    {"stop_reason": "end_turn"},
    {"stopReason": "end_turn"},
    {"done_reason": "stop"},
    {"status": "completed"},
]


@pytest.mark.parametrize("metadata", INCOMPLETE)
def test_an_answer_that_is_not_whole_is_no_memory(metadata: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not whole"):
        parse_extraction(AIMessage("The refund IBAN is DE89 3704", response_metadata=metadata))


@pytest.mark.parametrize("metadata", WHOLE)
def test_a_whole_answer_is_a_memory(metadata: dict[str, Any]) -> None:
    answer = AIMessage("The refund IBAN is DE89 3704 0044", response_metadata=metadata)
    assert parse_extraction(answer) == "The refund IBAN is DE89 3704 0044"


def test_garbage_then_a_good_answer_is_extracted(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(
        extractor=FakeListChatModel(responses=["", "The AR table is a ledger."]),
        retry_base_delay=0.01,
    )
    say(history(backup, memory, "garbage"), "what is the AR table?", "a ledger")
    memory.flush(timeout=10)
    [row] = catalog(backup)
    assert (row.kind, row.text) == ("extracted", "The AR table is a ledger.")


# -- a memory that cannot be stored fails alone ------------------------------------------


class RefusingEmbeddings(HashEmbeddings):
    """Refuses a text over 5,000 characters, as a hosted API refuses one over its token limit."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if any(len(text) > 5000 for text in texts):
            raise ValueError("maximum context length is 8192 tokens")
        return super().embed_documents(texts)


class UnreachableEmbeddings(HashEmbeddings):
    """An embedding API whose server does not answer (a real connection refused)."""

    def __init__(self) -> None:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        httpx.post(f"http://127.0.0.1:{self.port}/embed", json=texts, timeout=5)
        raise AssertionError("unreachable")


def assert_parked(job: Any, error: str) -> None:
    """A job that failed on its own data: counted, its error kept, parked a minute at least."""
    assert (job.state, job.attempts) == ("pending", 1)
    assert error in job.last_error
    assert (job.not_before - utcnow()).total_seconds() > 50


def test_a_memory_the_embedding_refuses_holds_up_only_its_own_job_and_session(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """H3: one refused text failed the whole batch, other users' turns included, forever."""
    memory = make_memory(embedding=RefusingEmbeddings())
    bob = history(backup, memory, "s-bob", "bob")
    say(bob, "here is my log: " + "错误" * 3000, "Noted.")
    say(bob, "and a short question", "a short answer")  # waits behind it: session order
    say(history(backup, memory, "s-carol", "carol"), "my cat is called Tom", "Noted.")
    for _ in range(3):
        memory.run_pending()  # never raises, never spins on the parked job
    [doc] = memory.search("cat", user_id="carol", scope="user")
    assert "my cat is called Tom" in doc.page_content
    assert catalog(backup, "s-bob") == []
    refused, waiting = job_rows(backup)
    assert_parked(refused, "maximum context length")
    assert (waiting.state, waiting.attempts, waiting.last_error) == ("pending", 0, None)
    assert memory.collection.count() == 1  # nothing of bob's in the index
    assert memory.queue.depth() == 2


def test_a_memory_the_database_refuses_holds_up_only_its_own_job(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """H2/H3: a value the catalog refused stalled the queue, reported as an outage."""
    memory = make_memory()
    table = backup.tables.memories.name
    with backup.engine.begin() as conn:  # a catalog that takes memories of 300 characters
        if backup.dialect == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_short BEFORE INSERT ON {table} "
                "WHEN length(NEW.text) > 300 BEGIN SELECT RAISE(ABORT, 'text too long'); END"
            )
        else:
            conn.exec_driver_sql(f"ALTER TABLE `{table}` MODIFY `text` VARCHAR(300) NOT NULL")
    say(history(backup, memory, "s-bob", "bob"), "here is my log: " + "x" * 400, "Noted.")
    say(history(backup, memory, "s-carol", "carol"), "my cat is called Tom", "Noted.")
    memory.run_pending()
    [doc] = memory.search("cat", user_id="carol", scope="user")
    assert "my cat is called Tom" in doc.page_content
    [refused] = job_rows(backup)
    assert_parked(refused, "ArchiveRefusedError")
    # The index agrees with the catalog: the vector written before the refusal is gone.
    assert sorted(memory.collection.get(include=[])["ids"]) == [doc.id]


def test_an_embedding_api_that_does_not_answer_is_an_outage_counted_against_no_job(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(embedding=UnreachableEmbeddings())
    say(history(backup, memory, "a", "u"), "first question", "first answer")
    say(history(backup, memory, "b", "v"), "second question", "second answer")
    for _ in range(3):
        with pytest.raises(httpx.ConnectError):
            memory.run_pending()
    assert [(job.attempts, job.last_error) for job in job_rows(backup)] == [(0, None)] * 2
    assert catalog(backup) == []
    memory.embedding = HashEmbeddings()  # the service is back
    assert memory.run_pending() == 2
    assert len(catalog(backup)) == 2


class BusyEmbeddings(HashEmbeddings):
    """An embedding API over real HTTP that answers 429, then 503, then embeds."""

    def __init__(self, busy: list[int]) -> None:
        statuses = list(busy)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(statuses.pop(0) if statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        port = self.server.server_address[1]
        httpx.post(f"http://127.0.0.1:{port}/embed", json=texts, timeout=5).raise_for_status()
        return super().embed_documents(texts)


def test_an_embedding_api_that_is_rate_limited_or_failing_is_an_outage_counted_against_no_job(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """A 429 or a 503 counted as the job's failure: three of them and a good extraction
    was thrown away each time, then the turn stored raw."""
    extractor = FakeExtractor()
    embedding = BusyEmbeddings([429, 503, 502, 504])
    memory = make_memory(embedding=embedding, extractor=extractor, retry_base_delay=0)
    say(history(backup, memory, "a", "u"), "my IBAN is DE89 3704", "Noted.")
    say(history(backup, memory, "b", "v"), "my cat is Tom", "Noted.")
    for _ in range(4):
        with pytest.raises(httpx.HTTPStatusError):
            memory.run_pending()
        assert [job.attempts for job in job_rows(backup)] == [0, 0]
    assert memory.run_pending() == 2
    rows = catalog(backup)
    assert sorted((row.kind, row.text) for row in rows) == [
        ("extracted", "Summary: my IBAN is DE89 3704"),
        ("extracted", "Summary: my cat is Tom"),
    ]
    embedding.server.shutdown()


class ServerError(Exception):
    """An API client's error for an HTTP 500, as Ollama's ``ResponseError`` carries it."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class FailingServer(HashEmbeddings):
    """Answers 500 to any text holding POISON (a text over its context)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if any("POISON" in text for text in texts):
            raise ServerError("the input length exceeds the context length", 500)
        return super().embed_documents(texts)


@pytest.mark.parametrize("batch_size", [1, 10])
@pytest.mark.parametrize("later", ["another session", "the same session"])
def test_a_500_for_one_input_is_that_jobs_failure(
    make_memory: MakeMemory, backup: MySQLBackup, batch_size: int, later: str
) -> None:
    """Every 5xx counted as an outage: one text a server answered 500 to stalled every
    session for good (and a batch of one, or of one session, however it was told)."""
    memory = make_memory(embedding=FailingServer(), batch_size=batch_size)
    say(history(backup, memory, "a", "u"), "POISON " * 50, "Noted.")
    session = "b" if later == "another session" else "a"
    say(history(backup, memory, session, "u"), "my cat is Tom", "Noted.")
    memory.run_pending()
    poisoned = [job for job in job_rows(backup) if job.attempts]
    assert len(poisoned) == 1 and poisoned[0].session_id == "a"
    assert_parked(poisoned[0], "ServerError: the input length exceeds the context length")
    stored = [row.session_id for row in catalog(backup)]
    assert stored == (["b"] if later == "another session" else [])  # a's turn waits its turn


def test_a_memory_that_keeps_absorbing_repeated_turns_outgrows_64_kb(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """H2: its ``source_ids`` overflowed MySQL's TEXT, and the whole queue stalled."""
    memory = make_memory()
    archive = backup.table.name
    with backup.engine.begin() as conn:  # 13-digit ids, as after 10^12 messages
        if backup.dialect == "sqlite":
            conn.exec_driver_sql(
                f"INSERT INTO sqlite_sequence (name, seq) VALUES ('{archive}', 999999999999)"
            )
        else:
            conn.exec_driver_sql(f"ALTER TABLE `{archive}` AUTO_INCREMENT=1000000000000")
    ping = history(backup, memory, "ping", "ops")
    for _ in range(5):
        ping.add_messages([HumanMessage("ping"), AIMessage("pong")] * 500)
        memory.run_pending()
    say(history(backup, memory, "s", "carol"), "my cat is called Tom", "Noted.")
    memory.run_pending()
    [row] = catalog(backup, "ping")
    assert sources(row) == archive_ids(backup, "ping")  # 5,000 ids, about 75 KB
    assert len(row.source_ids) > 65_535
    [doc] = memory.search("cat", user_id="carol", scope="user")
    assert "my cat is called Tom" in doc.page_content
    assert job_rows(backup) == []


# -- 4d. several workers ----------------------------------------------------------------


def test_two_workers_never_process_the_same_job(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    recorder = Recorder()
    workers = [
        make_memory(
            extractor=FakeExtractor(recorder=recorder, name_tag=tag, sleep=0.03),
            start_worker=True,
            batch_size=1,  # one job at a time, so the other worker gets its share
            poll_interval=0.02,
        )
        for tag in ("a", "b")
    ]
    questions = [f"question {n} about topic {n * 7}" for n in range(24)]
    for n, question in enumerate(questions):
        say(history(backup, workers[n % 2], f"w{n % 4}", "u"), question)
    for worker in workers:
        worker.flush(timeout=60)
    for question in questions:
        assert sum(f"User: {question}\n" in p for p in recorder.prompts) == 1, question
    assert recorder.calls == 24
    assert set(recorder.by_model) == {"a", "b"}  # both took part
    assert len(catalog(backup)) == 24
    assert workers[0].collection.count() == 24
    for n in range(4):
        assert [sources(row) for row in catalog(backup, f"w{n}")] == turn_ids(backup, f"w{n}")


_WORKER_CHILD = r"""
import json, sys, threading, time
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from tests.fakes import HashEmbeddings, replies

url, table, host, port, collection = sys.argv[1:6]
seen = []
lock = threading.Lock()

class Recording(GenericFakeChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        prompt = str(messages[-1].content)
        with lock:
            seen.append(prompt)
        time.sleep(0.04)
        line = next(x for x in prompt.splitlines() if x.startswith("User: "))
        return ChatResult(generations=[ChatGeneration(message=AIMessage("Summary: " + line[6:]))])

memory = ChromaLongMemory(
    host=host, port=int(port), collection_name=collection, embedding=HashEmbeddings(),
    backup=MySQLBackup(url, table_name=table), extractor=Recording(messages=replies()),
    batch_size=1, poll_interval=0.02,
)
print("ready", flush=True)
sys.stdin.readline()
memory.close()
print(json.dumps(seen), flush=True)
"""


@pytest.fixture
def mysql_backup() -> Iterator[MySQLBackup]:
    require_mysql()
    archive = MySQLBackup(MYSQL_URL, table_name=f"t_{uuid.uuid4().hex[:12]}")
    yield archive
    _drop(archive)


@pytest.mark.mysql
def test_two_worker_processes_share_mysql_and_a_chroma_server(
    mysql_backup: MySQLBackup, chroma_server: tuple[str, int], collection_name: str
) -> None:
    host, port = chroma_server
    url = mysql_backup.url.render_as_string(hide_password=False)
    args = [url, mysql_backup.table.name, host, str(port), collection_name]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER_CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        for _ in range(2)
    ]
    memory = ChromaLongMemory(
        host=host,
        port=port,
        collection_name=collection_name,
        embedding=HashEmbeddings(),
        backup=mysql_backup,
        start_worker=False,
    )
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
        questions = [f"question {n} about topic {n * 7}" for n in range(30)]
        for n, question in enumerate(questions):
            say(history(mysql_backup, memory, f"p{n % 3}", "u"), question)
        assert wait_until(lambda: memory.queue.depth() == 0, timeout=90)
        outputs = [child.communicate("stop\n", timeout=60) for child in children]
        assert [child.returncode for child in children] == [0, 0], outputs
        prompts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        everything = [p for ps in prompts for p in ps]
        for question in questions:
            assert sum(f"User: {question}\n" in p for p in everything) == 1, question
        assert all(prompts), "both processes took jobs"
        assert len(catalog(mysql_backup)) == 30
        assert memory.collection.count() == 30
        for n in range(3):
            rows = catalog(mysql_backup, f"p{n}")
            assert [sources(row) for row in rows] == turn_ids(mysql_backup, f"p{n}")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        memory.close()
        memory.client.delete_collection(collection_name)


# -- 4e. the hot path ---------------------------------------------------------------------


def test_long_memory_stays_off_the_hot_path(
    tmp_path: Path, chroma_client: Any, collection_name: str
) -> None:
    """Median ``add_messages`` with long memory (worker running, slow LLM) vs without.

    The archive is on tmpfs when there is one: with ``synchronous=FULL`` every commit
    waits for an fsync, and on a VM disk its jitter (medians of the *same* code vary
    by 1-2 ms between runs) would swamp a 1 ms bound. The cost measured is the
    library's: the job INSERT in the same transaction, the wake-up, and the worker
    thread competing for the GIL and the SQLite write lock.

    The bound is on the caller's own CPU time (``thread_time``): on a shared 2-core
    machine the worker's CPU competes with the caller's, so wall time grows with the
    machine's load whatever the library does (medians of 2.4 ms plain against 4.5 ms
    with long memory were seen at load 10). Wall time must still show that no
    extraction runs inline (the fake LLM sleeps 20 ms per call).
    """
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    with tempfile.TemporaryDirectory(dir=base) as folder:
        archive = MySQLBackup(f"sqlite:///{folder}/hot.sqlite3", table_name="hot")
        memory = ChromaLongMemory(
            client=chroma_client,
            collection_name=collection_name,
            embedding=HashEmbeddings(),
            backup=archive,
            extractor=FakeExtractor(sleep=0.02),  # a slow LLM, off the hot path
            batch_size=4,
            poll_interval=0.05,
        )
        plain = TieredChatMessageHistory("plain", backup=archive)
        tiered = TieredChatMessageHistory("tiered", backup=archive, long_memory=memory)
        timings: dict[str, list[float]] = {"plain": [], "tiered": []}
        cpu: dict[str, list[float]] = {"plain": [], "tiered": []}
        try:
            for n in range(220):
                messages = [
                    HumanMessage(f"Question {n}: what changed in the deployment?"),
                    AIMessage(f"Answer {n}: the cache was cold after the rollout."),
                ]
                pair = [("plain", plain), ("tiered", tiered)]
                for name, chat in pair if n % 2 else reversed(pair):
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    chat.add_messages(messages)
                    if n >= 20:  # warm-up
                        timings[name].append(time.perf_counter() - started)
                        cpu[name].append(time.thread_time() - started_cpu)
                if n == 19:
                    # The worker is busy before timing starts (a first batch committed;
                    # each turn queues another job), so the timed calls compete with it. A
                    # check after the loop instead was flaky: a tight writer loop can
                    # keep SQLite's write lock from the worker's commit until it ends.
                    deadline = time.monotonic() + 30
                    while not catalog(archive):
                        assert time.monotonic() < deadline, "the worker never committed"
                        time.sleep(0.01)
        finally:
            memory.close()
            archive.dispose()
            chroma_client.delete_collection(collection_name)
    plain_ms, tiered_ms = (statistics.median(timings[k]) * 1000 for k in ("plain", "tiered"))
    plain_cpu, tiered_cpu = (statistics.median(cpu[k]) * 1000 for k in ("plain", "tiered"))
    # Queueing the job is two statements (+0.12 ms p50 in bench_hot_path, alone);
    # here the worker commits into the same SQLite file meanwhile, so the caller's
    # commits also pay for checkpoints of its pages (1.1-1.4 ms seen at load 1-3).
    # An extraction or an embedding inline would cost far more than 2 ms.
    assert tiered_cpu - plain_cpu < max(2.0, 0.6 * plain_cpu), (
        f"caller's CPU: plain {plain_cpu:.3f} ms, with long memory {tiered_cpu:.3f} ms"
    )
    assert tiered_ms < 2 * plain_ms + 10, (
        f"wall: plain {plain_ms:.3f} ms, with long memory {tiered_ms:.3f} ms"
    )
