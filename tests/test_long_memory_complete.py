"""Nothing lost on the way to long-term memory: every archived turn reaches a memory.

A turn without an AI answer (a user who states a fact and leaves, two people
talking, a crash before the answer) waits ``idle_seconds`` for it, then is extracted
as it is; ``flush()`` and ``close(drain=True)`` do not wait. Batches given as any
iterable queue their jobs. The worker loads the embedding model before its first
job, and ``flush()`` does not count that load against its timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.storage.jobs import TurnJobs
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings, MultilingualE5Embeddings
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import HashEmbeddings
from .long_memory_support import archive_ids, catalog, job_rows, sources, wait_until

MakeMemory = Callable[..., ChromaLongMemory]


def history(
    backup: MySQLBackup, memory: ChromaLongMemory, session_id: str, user_id: str | None = "u"
) -> TieredChatMessageHistory:
    return TieredChatMessageHistory(session_id, user_id=user_id, backup=backup, long_memory=memory)


def normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def assert_every_message_in_a_memory(backup: MySQLBackup, session_id: str) -> None:
    """Each archived human/AI message's text is in a memory that lists it as a source."""
    rows = catalog(backup, session_id)
    for archived in backup.history(session_id, limit=10_000):
        if archived.role not in ("human", "ai"):
            continue
        holders = [row for row in rows if archived.id in sources(row)]
        text = normalised(archived.message.text)
        assert any(text in normalised(row.text) for row in holders), (
            f"message {archived.id} ({archived.message.text!r}) is in no memory"
        )


def states(backup: MySQLBackup) -> list[tuple[str, int]]:
    return [(job.state, job.last_message_id) for job in job_rows(backup)]


# -- A. turns without an AI answer -------------------------------------------------------


def test_a_user_who_states_a_fact_and_leaves(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory()
    chat = history(backup, memory, "leaves")
    chat.add_messages([HumanMessage("My VAT number is DE123456789, remember it.")])
    [message_id] = archive_ids(backup, "leaves")
    assert states(backup) == [("delayed", message_id)]
    assert memory.run_pending() == 0  # the answer may still come: not yet
    memory.flush(timeout=30)
    [row] = catalog(backup, "leaves")
    assert sources(row) == [message_id]
    [doc] = memory.search("VAT number", session_id="leaves")
    assert "DE123456789" in doc.page_content
    assert job_rows(backup) == []


async def test_async_user_who_leaves_is_flushed(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "async-leaves")
    await chat.aadd_messages([HumanMessage("The warehouse code is WH-77.")])
    await backup.adispose()
    memory.flush(timeout=30)
    assert "WH-77" in catalog(backup, "async-leaves")[0].text


def test_two_humans_chatting_without_an_ai(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory()
    chat = history(backup, memory, "duo")
    chat.add_messages([HumanMessage("Shall we meet at the Blue Door cafe?", name="alice")])
    chat.add_messages([HumanMessage("Yes, Friday at noon suits me.", name="bob")])
    chat.add_messages(
        [
            HumanMessage("I will bring the Q3 invoices.", name="alice"),
            HumanMessage("And I the ledger printout.", name="bob"),
        ]
    )
    # One run of human messages is one turn: one delayed job, for all of it.
    assert states(backup) == [("delayed", archive_ids(backup, "duo")[-1])]
    memory.flush(timeout=30)
    assert_every_message_in_a_memory(backup, "duo")
    text = " ".join(row.text for row in catalog(backup, "duo"))
    assert "alice: Shall we meet" in text and "bob: And I the ledger" in text


def test_the_answer_replaces_the_waiting_job(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory()
    chat = history(backup, memory, "answered")
    chat.add_messages([HumanMessage("Which table holds the invoices?")])
    chat.add_messages([AIMessage("The AR table, ar_invoice.")])
    ids = archive_ids(backup, "answered")
    assert states(backup) == [("pending", ids[-1])]  # one job, for the whole turn
    assert memory.run_pending() == 1
    [row] = catalog(backup, "answered")
    assert sources(row) == ids
    assert row.text == "User: Which table holds the invoices?\nAI: The AR table, ar_invoice."


def test_an_answer_after_an_early_extraction_extends_the_turn(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "late")
    chat.add_messages([HumanMessage("Our fiscal year starts in April.")])
    memory.flush(timeout=30)  # extracted as it is: the answer had not come
    chat.add_messages([AIMessage("Noted: fiscal year from April.")])
    memory.flush(timeout=30)
    ids = archive_ids(backup, "late")
    full = [row for row in catalog(backup, "late") if sources(row) == ids]
    assert [row.text for row in full] == [
        "User: Our fiscal year starts in April.\nAI: Noted: fiscal year from April."
    ]
    assert_every_message_in_a_memory(backup, "late")


def test_a_new_turn_closes_an_open_one(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory()
    chat = history(backup, memory, "closed")
    call = {"name": "lookup", "args": {"invoice": 7}, "id": "call-7"}
    chat.add_messages([HumanMessage("What is invoice 7?"), AIMessage("", tool_calls=[call])])
    [waiting] = job_rows(backup)
    assert waiting.state == "delayed"
    # The tool never answered; the user moves on: the open turn is over.
    chat.add_messages([HumanMessage("Never mind. Who is our auditor?"), AIMessage("KPMG.")])
    ids = archive_ids(backup, "closed")
    assert states(backup) == [("pending", ids[1]), ("pending", ids[-1])]
    assert memory.run_pending() == 2  # both runnable without a flush
    assert_every_message_in_a_memory(backup, "closed")


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(
            lambda: [
                HumanMessage("first: the AP table"),
                AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "c1"}]),
                ToolMessage("tool says ap_bill", tool_call_id="c1"),
                HumanMessage("second: the GL table"),
                AIMessage("gl_entry"),
            ],
            id="tool result then a new question",
        ),
        pytest.param(
            lambda: [
                HumanMessage("first: the AP table"),
                AIMessage("ap_bill"),
                HumanMessage("second: the GL table, answer later"),
            ],
            id="answered turn then an open one",
        ),
    ],
)
def test_every_turn_of_one_batch_is_extracted(
    make_memory: MakeMemory, backup: MySQLBackup, batch: Callable[[], list[BaseMessage]]
) -> None:
    memory = make_memory()
    history(backup, memory, "batch").add_messages(batch())
    memory.flush(timeout=30)
    assert_every_message_in_a_memory(backup, "batch")
    assert "first: the AP table" in catalog(backup, "batch")[0].text


def test_idle_turn_is_extracted_by_the_worker_without_flush(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    idle = 0.3
    memory = make_memory(idle_seconds=idle, start_worker=True, poll_interval=0.05)
    chat = history(backup, memory, "idle")
    chat.add_messages([HumanMessage("The board meets on the first Monday.")])
    [archived] = backup.history("idle")
    assert wait_until(lambda: catalog(backup, "idle") != [], timeout=30)
    [row] = catalog(backup, "idle")
    assert "first Monday" in row.text
    # Not before its time: the worker waited for an answer that never came.
    assert row.created_at - archived.created_at >= timedelta(seconds=idle)


def test_a_waiting_turn_survives_its_process(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    writer = make_memory(idle_seconds=3600)
    history(backup, writer, "crash").add_messages([HumanMessage("Codeword: heliotrope.")])
    writer.close()  # the process goes away before any answer
    assert [job.state for job in job_rows(backup)] == ["delayed"]
    successor = make_memory(idle_seconds=3600)
    successor.flush(timeout=30)
    assert "heliotrope" in catalog(backup, "crash")[0].text


def test_close_with_drain_extracts_waiting_turns(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    history(backup, memory, "drain").add_messages([HumanMessage("Pallets go to dock 4.")])
    memory.close(drain=True)
    assert "dock 4" in catalog(backup, "drain")[0].text
    assert job_rows(backup) == []


def test_a_waiting_turn_does_not_hold_up_consolidation(
    make_memory: MakeMemory, backup: MySQLBackup, tmp_path: Any
) -> None:
    memory = make_memory()
    consolidator = MemoryConsolidator(
        FakeListChatModel(responses=["## Facts\n- consolidated"]),
        root=tmp_path / "md",
        backup=backup,
        threshold=2,
        batch=2,
        start_worker=False,
    )
    try:
        chat = TieredChatMessageHistory(
            "both", backup=backup, long_memory=memory, consolidator=consolidator
        )
        chat.add_messages([HumanMessage("one"), AIMessage("two")])
        chat.add_messages([HumanMessage("three: a fact, then the user leaves")])
        assert [(job.kind, job.state) for job in job_rows(backup)] == [
            ("extract", "pending"),
            ("extract", "delayed"),
            ("consolidate", "pending"),
        ]
        consolidator.flush(timeout=30)  # the delayed extraction is not in its way
        assert "consolidated" in consolidator.memory("both")
    finally:
        consolidator.close()


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (True, TypeError), ("5", TypeError)]
)
def test_idle_seconds_is_checked(make_memory: MakeMemory, value: Any, error: type) -> None:
    with pytest.raises(error, match="idle_seconds"):
        make_memory(idle_seconds=value)


def test_archive_idle_seconds_is_checked(backup: MySQLBackup) -> None:
    with pytest.raises(ValueError, match="idle_seconds"):
        backup.add_messages("s", [HumanMessage("x")], jobs=[TurnJobs("extract", float("nan"))])
    assert backup.get_messages("s") == []


# -- B. any iterable is one batch --------------------------------------------------------


def test_a_generator_batch_queues_its_extraction(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "gen")
    turn = [HumanMessage("Generated question about the FX rate table"), AIMessage("fx_rate")]
    chat.add_messages(message for message in turn)
    assert states(backup) == [("pending", archive_ids(backup, "gen")[-1])]
    memory.run_pending()
    assert_every_message_in_a_memory(backup, "gen")


async def test_an_async_generator_like_batch_queues_its_extraction(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "agen")
    await chat.aadd_messages(
        iter([HumanMessage("iterator question"), AIMessage("iterator answer")])
    )
    await backup.adispose()
    assert len(job_rows(backup)) == 1
    memory.run_pending()
    assert_every_message_in_a_memory(backup, "agen")


def test_a_generator_with_a_bad_element_stores_nothing(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "bad")
    with pytest.raises(TypeError, match=r"messages\[1\] is a str"):
        chat.add_messages(m for m in [HumanMessage("fine"), "not a message"])  # type: ignore[misc]
    assert backup.get_messages("bad") == []
    assert job_rows(backup) == []


# -- C. the model loads when the worker starts ---------------------------------------------


class SlowLoadingEmbeddings(HashEmbeddings):
    """An embedding whose ``warm_up`` blocks until the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.loaded = threading.Event()
        self.embedded_before_load = False

    def warm_up(self) -> None:
        self.entered.set()
        self.release.wait(60)
        self.loaded.set()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not self.loaded.is_set():
            self.embedded_before_load = True
        return super().embed_documents(texts)


@pytest.fixture
def slow() -> Iterator[SlowLoadingEmbeddings]:
    embedding = SlowLoadingEmbeddings()
    yield embedding
    embedding.release.set()  # never leave a worker thread blocked


def test_the_worker_loads_the_model_before_its_first_job(
    make_memory: MakeMemory, backup: MySQLBackup, slow: SlowLoadingEmbeddings
) -> None:
    memory = make_memory(embedding=slow, start_worker=True, poll_interval=0.05)
    assert slow.entered.wait(30)  # at start, before anything is queued
    assert memory.loading is not None
    history(backup, memory, "w").add_messages([HumanMessage("q"), AIMessage("a")])
    slow.release.set()
    memory.flush(timeout=30)
    assert memory.loading is None
    assert not slow.embedded_before_load
    assert len(catalog(backup, "w")) == 1


def test_flush_does_not_count_the_model_load(
    make_memory: MakeMemory, backup: MySQLBackup, slow: SlowLoadingEmbeddings
) -> None:
    memory = make_memory(embedding=slow, start_worker=True, poll_interval=0.05)
    history(backup, memory, "cold").add_messages([HumanMessage("q"), AIMessage("a")])
    assert slow.entered.wait(30)
    outcome: list[BaseException | None] = []

    def flush() -> None:
        try:
            # Room for the job itself on a loaded machine (a MySQL commit and a Chroma
            # upsert), but less than the load below takes.
            memory.flush(timeout=5.0)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    flusher = threading.Thread(target=flush)
    flusher.start()
    time.sleep(6.0)  # the model takes longer to load than flush's whole budget
    slow.release.set()
    flusher.join(60)
    assert outcome == [None]
    assert len(catalog(backup, "cold")) == 1


def test_flush_timeout_says_the_model_is_still_loading(
    make_memory: MakeMemory, backup: MySQLBackup, slow: SlowLoadingEmbeddings
) -> None:
    memory = make_memory(embedding=slow, start_worker=True, poll_interval=0.05)
    history(backup, memory, "stuck").add_messages([HumanMessage("q"), AIMessage("a")])
    with pytest.raises(
        TimeoutError, match=r"the embedding model is still loading \(\d+ s so far\); 1 extract"
    ):
        memory.flush(timeout=0.1, load_timeout=0.2)
    slow.release.set()
    memory.flush(timeout=30)
    assert len(catalog(backup, "stuck")) == 1


def test_flush_timeout_counts_the_jobs_still_queued(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    history(backup, memory, "q").add_messages([HumanMessage("q"), AIMessage("a")])
    memory.run_pending = lambda max_batches=None: 0  # type: ignore[method-assign]
    with pytest.raises(TimeoutError, match=r"^1 extract jobs still queued after 0.1 s$"):
        memory.flush(timeout=0.1)


def test_a_failing_warm_up_does_not_stop_the_worker(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    class BrokenLoad(HashEmbeddings):
        def warm_up(self) -> None:
            raise RuntimeError("no weights")

    memory = make_memory(embedding=BrokenLoad(), start_worker=True, poll_interval=0.05)
    history(backup, memory, "broken").add_messages([HumanMessage("q"), AIMessage("a")])
    memory.flush(timeout=30)
    assert len(catalog(backup, "broken")) == 1


def test_the_offline_embeddings_offer_the_warm_up_hook() -> None:
    assert callable(MiniLMEmbeddings().warm_up)
    embedding = MultilingualE5Embeddings()
    assert embedding._model is None  # lazy
    embedding.warm_up()
    assert embedding._model is not None


# -- the multilingual embedding --------------------------------------------------------------


def test_multilingual_e5_vectors_and_languages() -> None:
    embedding = MultilingualE5Embeddings()
    assert {"en", "zh"} <= embedding.languages
    docs = embedding.embed_documents(
        ["应收账款表包括发票号和到期日。", "We hiked in the Alps.", "nul\x00 and \ud800 survive"]
    )
    query = embedding.embed_query("accounts receivable invoices")
    for vector in [*docs, query]:
        assert len(vector) == 384
        assert abs(sum(x * x for x in vector) - 1.0) < 1e-3

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(query, docs[0]) > cosine(query, docs[1])  # across languages
    assert embedding.embed_documents([]) == []


def test_multilingual_e5_uses_the_dense_side_for_chinese(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(embedding=MultilingualE5Embeddings())
    assert memory.languages is not None and "zh" in memory.languages
    chat = history(backup, memory, "zh")
    chat.add_messages([HumanMessage("我的猫只吃金枪鱼。"), AIMessage("记住了。")])
    chat.add_messages([HumanMessage("明天下午三点开董事会。"), AIMessage("好的。")])
    memory.run_pending()
    # No character in common with the memory: only the dense side can find it.
    [doc] = memory.search("宠物喜欢什么食物", session_id="zh", k=1)
    assert "金枪鱼" in doc.page_content


# -- D. the benchmark's completeness check ---------------------------------------------------


def test_the_completeness_check_counts_lost_and_capped_messages(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    from sqlalchemy import update

    from benchmarks.bench_complete import Count, verify

    memory = make_memory()
    chat = history(backup, memory, "check")
    chat.add_messages([HumanMessage("kept question"), AIMessage("kept answer")])
    chat.add_messages([HumanMessage("lost question"), AIMessage("lost answer")])
    chat.add_messages([HumanMessage("x" * 9000), AIMessage("after a huge question")])
    memory.flush(timeout=30)

    def counted() -> Count:
        count = Count("test", "hash")
        verify(backup, memory, ["check"], count)
        return count

    first = counted()
    # The huge turn is cut at the memory cap: both its messages count as capped, not lost.
    assert (first.messages, first.held, first.capped, first.lost_from_sources) == (6, 4, 2, 0)
    # A memory that no longer holds its turn's text: both its messages are lost.
    row = next(r for r in catalog(backup, "check") if "lost question" in r.text)
    memories = backup.tables.memories

    def tamper() -> Any:
        yield update(memories).where(memories.c.id == row.id).values(text="something else")

    backup.run(tamper())
    second = counted()
    assert (second.held, second.lost_from_sources, second.in_no_memory) == (2, 2, 2)
