"""TieredMemoryMiddleware in real ``langchain.agents.create_agent`` agents, sync and async.

A fake tool-calling chat model (it records every prompt) drives a real ``@tool`` that
really runs; archives are real (the ``backup`` fixture: SQLite and MariaDB), Chroma
is embedded with ``HashEmbeddings``, and threads are kept by LangGraph's
``InMemorySaver``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    ModelRetryMiddleware,
    PIIMiddleware,
    SummarizationMiddleware,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_tiered_memory import (
    ContextCompressor,
    ContextOverflowError,
    MySQLBackup,
    SessionOwnershipError,
    TieredChatMessageHistory,
    TieredMemoryMiddleware,
)
from langchain_tiered_memory.core.validation import InvalidSessionDateError
from langchain_tiered_memory.tiers.compression import validate_conversation
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import RecordingChatModel

MakeMemory = Callable[..., ChromaLongMemory]
SYSTEM = "You are an ERP assistant."
FACT = "My cat is called Miso and she is 7 years old."
# A memory's bullet: the day its turn happened, then its text.
DAY = r"- \(\d{4}-\d{2}-\d{2}\) User: "
QUESTION = "What is my cat called?"

STOCK = {"A-1": 12, "B-2": 0}
tool_runs: list[str] = []


@tool
def stock_level(sku: str) -> str:
    """How many units of an article are in stock."""
    tool_runs.append(sku)
    return f"{sku}: {STOCK.get(sku, 0)} units in stock"


@pytest.fixture(autouse=True)
def _fresh_tool_runs() -> Iterator[None]:
    tool_runs.clear()
    yield


class ToolCallingModel(RecordingChatModel):
    """A fake chat model that 'binds' tools: its scripted replies include tool calls."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingModel:
        return self


def call(sku: str, call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "stock_level", "args": {"sku": sku}, "id": call_id}])


def script(*steps: AIMessage | str) -> ToolCallingModel:
    return ToolCallingModel(
        messages=iter([AIMessage(s) if isinstance(s, str) else s for s in steps])
    )


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def thread(thread_id: str, **extra: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, **extra}}


def roles(messages: list[BaseMessage]) -> list[str]:
    return [m.type for m in messages]


def text_of(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


# -- archiving: once, in order, tool pairs intact ------------------------------------


def test_a_run_is_archived_with_its_tool_pair(backup: MySQLBackup) -> None:
    model = script(call("A-1", "c1"), "A-1 has 12 units.")
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[TieredMemoryMiddleware(backup=backup)],
    )

    result = agent.invoke(ask("How many A-1 do we have?"), thread("s1"))

    assert tool_runs == ["A-1"]  # the real tool ran
    archived = backup.get_messages("s1")
    assert archived == result["messages"]
    assert roles(archived) == ["human", "ai", "tool", "ai"]
    assert isinstance(archived[2], ToolMessage)
    assert archived[2].tool_call_id == archived[1].tool_calls[0]["id"] == "c1"
    assert archived[2].content == "A-1: 12 units in stock"
    validate_conversation(archived)
    # The private bookkeeping key never reaches the caller.
    assert set(result) == {"messages"}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_archived_exactly_once_across_runs_on_a_thread(
    backup: MySQLBackup, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The archive-side guard (for stateless re-sends) is off here, so the thread's
    # own bookkeeping must keep earlier runs out.
    monkeypatch.setattr(
        TieredMemoryMiddleware, "_drop_known", staticmethod(lambda fresh, tail: fresh)
    )
    model = script(call("A-1", "c1"), "12 units.", call("B-2", "c2"), "None left.", "Bye.")
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[TieredMemoryMiddleware(backup=backup)],
        checkpointer=InMemorySaver(),
    )
    config = thread("t1")
    for question in ("Stock of A-1?", "And B-2?", "Thanks."):
        if mode == "sync":
            agent.invoke(ask(question), config)
        else:
            await agent.ainvoke(ask(question), config)

    state = agent.get_state(config).values["messages"]
    archived = backup.get_messages("t1")
    assert len(state) == 10  # the checkpointer kept the whole thread...
    assert archived == state  # ...and each message was archived once, in order
    assert len({m.id for m in archived}) == 10
    assert roles(archived) == ["human", "ai", "tool", "ai"] * 2 + ["human", "ai"]
    assert [m.tool_call_id for m in archived if isinstance(m, ToolMessage)] == ["c1", "c2"]
    assert tool_runs == ["A-1", "B-2"]
    # The later model calls saw the earlier runs through the thread state.
    assert "12 units." in text_of(model.prompts[-1])
    if mode == "async":
        await backup.adispose()


class StopsAfterTheTool(ToolCallingModel):
    """Its second call (after the tool ran) fails, or hangs until cancelled."""

    hang: bool = False
    calls: int = 0

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("provider 503")
        return super()._generate(*args, **kwargs)

    async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            if not self.hang:
                raise ConnectionError("provider 503")
            await asyncio.sleep(3600)
        return super()._generate(*args, **kwargs)


@pytest.mark.parametrize("summarized", [False, True])
@pytest.mark.parametrize("how", ["error", "async error", "cancelled"])
async def test_a_run_stopped_after_a_tool_never_archives_a_call_without_its_result(
    backup: MySQLBackup, how: str, summarized: bool
) -> None:
    model = StopsAfterTheTool(
        messages=iter([call("A-1", "c1"), AIMessage("12 units.")]), hang=how == "cancelled"
    )
    # Listed after it, a summarization keeps only the newest message before the next
    # run's model call: the waiting call and its result must be archived before that.
    later = [
        SummarizationMiddleware(
            GenericFakeChatModel(messages=iter(["SUMMARY"] * 5)),
            trigger=("messages", 4),
            keep=("messages", 1),
        )
    ]
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup), *(later if summarized else [])],
        checkpointer=InMemorySaver(),
    )
    config = thread("t1")
    if how == "error":
        with pytest.raises(ConnectionError):
            agent.invoke(ask("Stock of A-1?"), config)
    elif how == "async error":
        with pytest.raises(ConnectionError):
            await agent.ainvoke(ask("Stock of A-1?"), config)
    else:  # a client that disconnects during the second model call
        run = asyncio.create_task(agent.ainvoke(ask("Stock of A-1?"), config))
        while model.calls < 2:
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert tool_runs == ["A-1"]  # the tool ran, its result is in the thread only
    archived = backup.get_messages("t1")
    validate_conversation(archived)
    assert not [m for m in archived if isinstance(m, AIMessage) and m.tool_calls]
    validate_conversation(TieredChatMessageHistory("t1", backup=backup).messages)

    # The thread goes on: the call and its result are archived together, in order.
    await agent.ainvoke(ask("Thanks."), config)
    archived = backup.get_messages("t1")
    assert roles(archived) == ["human", "ai", "tool", "human", "ai"]
    assert [m.content for m in archived[2:]] == ["A-1: 12 units in stock", "Thanks.", "12 units."]
    state = agent.get_state(config).values["messages"]
    assert "SUMMARY" in text_of(state) if summarized else archived == state
    await backup.adispose()


def test_stateless_resend_is_not_archived_twice(backup: MySQLBackup) -> None:
    model = script("First answer.", "Second answer.")
    agent = create_agent(model, [stock_level], middleware=[TieredMemoryMiddleware(backup=backup)])
    first = agent.invoke(ask("first"), thread("t1"))
    # No checkpointer: the caller sends the conversation back with the new question.
    agent.invoke({"messages": [*first["messages"], HumanMessage("second")]}, thread("t1"))

    archived = backup.get_messages("t1")
    assert [m.content for m in archived] == ["first", "First answer.", "second", "Second answer."]


async def test_async_run_uses_the_async_archive(
    backup: MySQLBackup, monkeypatch: pytest.MonkeyPatch
) -> None:
    def sync_call(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("sync archive call on the async path")

    model = script(call("A-1", "c1"), "12 units.")
    agent = create_agent(model, [stock_level], middleware=[TieredMemoryMiddleware(backup=backup)])
    monkeypatch.setattr(backup, "add_messages", sync_call)
    monkeypatch.setattr(backup, "tail", sync_call)

    await agent.ainvoke(ask("Stock of A-1?"), thread("t1"))

    monkeypatch.undo()
    assert roles(backup.get_messages("t1")) == ["human", "ai", "tool", "ai"]
    await backup.adispose()


def agent_calling(backup: MySQLBackup, tool_: Any, args: dict[str, Any], *replies: str) -> Any:
    """A checkpointed agent whose model calls ``tool_`` once (id ``c1``), then says ``replies``."""
    first = AIMessage("", tool_calls=[{"name": tool_.name, "args": args, "id": "c1"}])
    return create_agent(
        script(first, *replies),
        [tool_],
        middleware=[TieredMemoryMiddleware(backup=backup)],
        checkpointer=InMemorySaver(),
    )


@tool(response_format="content_and_artifact")
def invoice(number: str) -> tuple[str, Any]:
    """An invoice's amount (its artifact: values JSON cannot hold)."""
    return f"invoice {number}: 120 EUR", {"due": datetime.date(2023, 6, 1), "tags": {"a"}}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_tool_artifact_json_cannot_hold_is_archived_and_the_thread_goes_on(
    backup: MySQLBackup, mode: str
) -> None:
    agent = agent_calling(backup, invoice, {"number": "42"}, "Invoice 42 is 120.", "Welcome.")
    for question in ("What is invoice 42?", "Thanks."):
        if mode == "sync":
            agent.invoke(ask(question), thread("t1"))
        else:
            await agent.ainvoke(ask(question), thread("t1"))

    archived = backup.get_messages("t1")
    assert roles(archived) == ["human", "ai", "tool", "ai", "human", "ai"]
    assert archived[2].content == "invoice 42: 120 EUR"
    # LangChain's own stand-in for what JSON cannot hold: its repr.
    due = archived[2].artifact["due"]
    assert due["type"] == "not_implemented" and due["repr"] == "datetime.date(2023, 6, 1)"
    if mode == "async":
        await backup.adispose()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_message_the_archive_refuses_is_refused_before_the_model_and_only_once(
    backup: MySQLBackup, mode: str
) -> None:
    model = script("First answer.", "Second answer.")
    agent = create_agent(
        model, [], middleware=[TieredMemoryMiddleware(backup=backup)], checkpointer=InMemorySaver()
    )
    bad = {"messages": [HumanMessage("notes", additional_kwargs={"session_date": "tuesday"})]}

    async def invoke(payload: dict[str, Any]) -> dict[str, Any]:
        if mode == "sync":
            return agent.invoke(payload, thread("t1"))
        return await agent.ainvoke(payload, thread("t1"))

    await invoke(ask("Hello."))
    with pytest.raises(InvalidSessionDateError, match="'tuesday' is not a date"):
        await invoke(bad)
    assert len(model.prompts) == 1  # refused before any model call
    await invoke(ask("Hello again."))  # the thread is not poisoned

    archived = backup.get_messages("t1")
    assert [m.content for m in archived] == [
        "Hello.",
        "First answer.",
        "Hello again.",
        "Second answer.",
    ]
    assert archived == agent.get_state(thread("t1")).values["messages"]
    if mode == "async":
        await backup.adispose()


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@tool(response_format="content_and_artifact")
def deep_lookup(query: str) -> tuple[str, Any]:
    """A lookup whose artifact nests deeper than the archive keeps."""
    return "found 42", _nested(205)


def test_a_tool_result_the_archive_refuses_keeps_its_place_so_the_pair_stays_whole(
    backup: MySQLBackup,
) -> None:
    agent = agent_calling(backup, deep_lookup, {"query": "x"}, "It is 42.", "Bye.")
    agent.invoke(ask("What is it?"), thread("t1"))
    agent.invoke(ask("Thanks."), thread("t1"))

    archived = backup.get_messages("t1")
    assert roles(archived) == ["human", "ai", "tool", "ai", "human", "ai"]
    assert archived[2].tool_call_id == "c1" and "not archived" in archived[2].content
    validate_conversation(archived)  # no tool call without its answer


def test_a_refused_tool_result_in_the_input_goes_with_its_call(backup: MySQLBackup) -> None:
    model = script("Answer.")
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup)],
        checkpointer=InMemorySaver(),
    )
    bad_result = ToolMessage(
        "12 units", tool_call_id="c1", additional_kwargs={"session_date": "someday"}
    )
    with pytest.raises(InvalidSessionDateError):
        agent.invoke(
            {"messages": [HumanMessage("Stock?"), call("A-1", "c1"), bad_result]}, thread("t1")
        )
    agent.invoke(ask("Next."), thread("t1"))

    state = agent.get_state(thread("t1")).values["messages"]
    assert roles(state) == ["human", "human", "ai"]  # the call went with its refused answer
    validate_conversation(model.prompts[-1])
    assert backup.get_messages("t1") == state


def behind_a_model_retry(model: ToolCallingModel, backup: MySQLBackup, **options: Any) -> Any:
    """An agent whose model calls a ModelRetryMiddleware retries (after 1 s, then 2 s)."""
    return create_agent(
        model,
        [],
        middleware=[
            ModelRetryMiddleware(max_retries=2, initial_delay=1.0),
            TieredMemoryMiddleware(backup=backup),
        ],
        **options,
    )


def test_a_refusal_reaches_the_caller_through_a_model_retry_middleware(
    backup: MySQLBackup,
) -> None:
    model = script("Answer.")
    agent = behind_a_model_retry(model, backup, checkpointer=InMemorySaver())
    bad = {"messages": [HumanMessage("notes", additional_kwargs={"session_date": "tuesday"})]}
    with pytest.raises(InvalidSessionDateError):
        agent.invoke(bad, thread("t1"))
    assert model.prompts == [] and backup.get_messages("t1") == []


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_messages_a_summarization_middleware_removes_mid_run_are_archived(
    backup: MySQLBackup, mode: str
) -> None:
    # SummarizationMiddleware replaces the thread's messages before a model call;
    # archived only after the run, the question and the first tool pairs were lost.
    model = script(call("A-1", "c1"), call("B-2", "c2"), call("A-1", "c3"), "All checked.")
    summarize = SummarizationMiddleware(
        GenericFakeChatModel(messages=iter(["SUMMARY"] * 10)),
        trigger=("messages", 6),
        keep=("messages", 2),
    )
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup, compressor=False), summarize],
        checkpointer=InMemorySaver(),
    )
    question = ask("Stock of A-1, B-2 and A-1 again?")
    if mode == "sync":
        result = agent.invoke(question, thread("t1"))
    else:
        result = await agent.ainvoke(question, thread("t1"))

    assert "SUMMARY" in text_of(result["messages"])  # the summary did replace messages
    archived = backup.get_messages("t1")
    assert roles(archived) == ["human"] + ["ai", "tool"] * 3 + ["ai"]
    assert archived[0].content == "Stock of A-1, B-2 and A-1 again?"
    assert [m.tool_call_id for m in archived if isinstance(m, ToolMessage)] == ["c1", "c2", "c3"]
    assert "SUMMARY" not in text_of(archived)
    validate_conversation(archived)
    if mode == "async":
        await backup.adispose()


@pytest.mark.parametrize("redacted", ["input", "tool results"])
def test_what_a_pii_middleware_listed_after_redacts_is_archived_redacted_once(
    backup: MySQLBackup, redacted: str
) -> None:
    # The input and this step's tool results wait for the next call: archived at
    # the first model call, the raw email was archived, then its redacted copy too.
    @tool
    def contact(name: str) -> str:
        """A customer's contact."""
        return f"{name}: alice@example.com"

    model = script(
        AIMessage("", tool_calls=[{"name": "contact", "args": {"name": "a"}, "id": "c1"}]),
        "Done.",
    )
    pii = PIIMiddleware(
        "email",
        strategy="redact",
        apply_to_input=redacted == "input",
        apply_to_tool_results=redacted == "tool results",
    )
    agent = create_agent(
        model,
        [contact],
        middleware=[TieredMemoryMiddleware(backup=backup), pii],
        checkpointer=InMemorySaver(),
    )
    agent.invoke(ask("Mail bob@example.com the contact of a."), thread("t1"))

    archived = backup.get_messages("t1")
    assert archived == agent.get_state(thread("t1")).values["messages"]
    assert roles(archived) == ["human", "ai", "tool", "ai"]
    leaked = "bob@example.com" if redacted == "input" else "alice@example.com"
    assert leaked not in text_of(archived)
    validate_conversation(archived)


def test_a_question_edited_by_time_travel_is_archived_before_its_answer(
    backup: MySQLBackup,
) -> None:
    model = script("Paris.", "Rome.")
    agent = create_agent(
        model, [], middleware=[TieredMemoryMiddleware(backup=backup)], checkpointer=InMemorySaver()
    )
    config = thread("t1")
    question = agent.invoke(ask("Capital of France?"), config)["messages"][0]
    # LangGraph's time travel: the checkpoint before the model ran, the question
    # replaced under its id, the run resumed from there.
    before = next(
        snapshot
        for snapshot in agent.get_state_history(config)
        if snapshot.next and snapshot.next[0].endswith("before_model")
    )
    forked = agent.update_state(
        before.config, {"messages": [HumanMessage("Capital of Italy?", id=question.id)]}
    )
    agent.invoke(None, forked)

    archived = backup.get_messages("t1")
    assert [m.content for m in archived] == [
        "Capital of France?",
        "Paris.",
        "Capital of Italy?",
        "Rome.",
    ]


def test_a_stateless_conversation_longer_than_a_hundred_turns_is_archived_once(
    backup: MySQLBackup,
) -> None:
    turns = 105
    model = script(*[f"answer {n}" for n in range(turns)])
    agent = create_agent(model, [], middleware=[TieredMemoryMiddleware(backup=backup)])
    messages: list[BaseMessage] = []
    for n in range(turns):  # no checkpointer: the caller sends the conversation back
        messages = agent.invoke(
            {"messages": [*messages, HumanMessage(f"question {n}")]}, thread("t1")
        )["messages"]

    archived = backup.get_messages("t1")
    assert [m.content for m in archived] == [m.content for m in messages]
    assert len(archived) == 2 * turns


def test_a_missing_session_is_raised_at_once_through_a_model_retry_middleware(
    backup: MySQLBackup,
) -> None:
    model = script("Answer.")
    agent = behind_a_model_retry(model, backup)
    started = time.perf_counter()
    with pytest.raises(ValueError, match="needs a session"):
        agent.invoke(ask("hi"))  # no thread_id
    assert time.perf_counter() - started < 1.0  # not retried with a back-off
    assert model.prompts == []


# -- before each call: memories for this call only ------------------------------------


def _early_session(agent: Any, backup: MySQLBackup) -> None:
    """Session s1 states the fact, then talks on until a window has moved past it."""
    config = thread("s1", user_id="u1")
    agent.invoke(ask(FACT), config)
    for n in range(3):
        agent.invoke(ask(f"Let us talk about invoice batch {n}."), config)
    window = TieredChatMessageHistory("s1", user_id="u1", backup=backup, window_turns=2).messages
    assert FACT not in text_of(window)


def test_fact_from_an_earlier_session_reaches_the_prompt(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory()
    model = script("Noted!", "OK.", "OK.", "OK.", call("A-1", "c1"), "Her name is Miso.")
    middleware = TieredMemoryMiddleware(backup=backup, long_memory=long_memory, scope="user", k=1)
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    _early_session(agent, backup)
    long_memory.flush(timeout=30)

    config = thread("s2", user_id="u1")
    result = agent.invoke(ask(QUESTION), config)

    # Both model calls of the run (before and after the tool) got the memory...
    for prompt in model.prompts[-2:]:
        assert isinstance(prompt[0], SystemMessage)
        # Each memory a bullet dated by its turn.
        assert re.match(
            re.escape(SYSTEM + "\n\nRelevant long-term memories:\n") + DAY + re.escape(FACT),
            prompt[0].content,
        )
        assert "invoice batch" not in prompt[0].content  # k=1: the best match only
        assert sum(isinstance(m, SystemMessage) for m in prompt) == 1
    # ...for that call only: neither the thread state nor the archive holds it.
    state = agent.get_state(config).values["messages"]
    assert not any(isinstance(m, SystemMessage) for m in state)
    assert "Miso" not in text_of(state[:-1])
    assert backup.get_messages("s2") == result["messages"]
    assert "Miso" not in text_of(backup.get_messages("s2")[:-1])


async def test_async_fact_from_an_earlier_session_reaches_the_prompt(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory()
    model = script("Noted!", "OK.", "OK.", "OK.", "Her name is Miso.")
    middleware = TieredMemoryMiddleware(backup=backup, long_memory=long_memory, scope="user", k=1)
    agent = create_agent(model, [stock_level], middleware=[middleware])
    config = thread("s1", user_id="u1")
    await agent.ainvoke(ask(FACT), config)
    for n in range(3):
        await agent.ainvoke(ask(f"Let us talk about invoice batch {n}."), config)
    long_memory.flush(timeout=30)

    await agent.ainvoke(ask(QUESTION), thread("s2", user_id="u1"))

    system = model.prompts[-1][0]
    assert isinstance(system, SystemMessage)
    assert re.fullmatch(
        re.escape("Relevant long-term memories:\n") + DAY + re.escape(FACT + "\n  AI: Noted!"),
        system.content,
    )
    assert len(backup.get_messages("s1")) == 8
    await backup.adispose()


def test_memory_md_is_added_to_the_system_message(backup: MySQLBackup, tmp_path: Path) -> None:
    llm = GenericFakeChatModel(messages=iter([AIMessage("- The user is Ada, an accountant.")]))
    consolidator = MemoryConsolidator(
        llm, root=tmp_path / "memory", backup=backup, threshold=2, batch=2, start_worker=False
    )
    try:
        model = script("Hello Ada.", "You are Ada.")
        agent = create_agent(
            model,
            [stock_level],
            system_prompt=SYSTEM,
            middleware=[TieredMemoryMiddleware(backup=backup, consolidator=consolidator)],
        )
        agent.invoke(
            {
                "messages": [
                    HumanMessage("I am Ada."),
                    AIMessage("Hi!"),
                    HumanMessage("I do accounts."),
                ]
            },
            thread("s1"),
        )
        consolidator.flush(timeout=30)

        agent.invoke(ask("Who am I?"), thread("s1"))

        assert model.prompts[-1][0] == SystemMessage(
            SYSTEM + "\n\nConsolidated memory (MEMORY.md):\n- The user is Ada, an accountant."
        )
    finally:
        consolidator.close()


# -- compression --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_call_over_budget_is_compressed_with_tool_pairs_intact(
    backup: MySQLBackup, mode: str
) -> None:
    skus = ["A-1", "B-2", "A-1", "B-2"]
    steps: list[AIMessage | str] = []
    for n, sku in enumerate(skus):
        steps += [call(sku, f"c{n}"), f"Answer {n}: " + "details " * 60]
    model = script(*steps)
    compressor = ContextCompressor(
        compress_threshold=400,
        preserve_count=2,
        force_delete_threshold=5_000,
        error_threshold=10_000,
    )
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[TieredMemoryMiddleware(backup=backup, compressor=compressor)],
        checkpointer=InMemorySaver(),
    )
    config = thread("t1")
    for n, sku in enumerate(skus):
        if mode == "sync":
            agent.invoke(ask(f"Question {n}: stock of {sku}?"), config)
        else:
            await agent.ainvoke(ask(f"Question {n}: stock of {sku}?"), config)

    first, last = model.prompts[0], model.prompts[-1]
    assert first[0] == SystemMessage(SYSTEM)  # small: sent as is
    # The last call was over budget: one system message (the agent's prompt and the
    # structured summary), then the newest messages with the tool pair whole.
    assert isinstance(last[0], SystemMessage)
    assert last[0].content.startswith(SYSTEM + "\n\n[Context compression summary]")
    assert "Tools used: stock_level" in last[0].content
    assert sum(isinstance(m, SystemMessage) for m in last) == 1
    validate_conversation(last)
    # preserve_count=2: the pair, whole, after the question that opened its turn (a
    # prompt keeps a user message; some providers require one).
    assert roles(last) == ["system", "human", "ai", "tool"]
    assert last[1].content == "Question 3: stock of B-2?"
    assert "Question 3: stock of B-2?" not in last[0].content  # not summarised twice
    assert last[-1].tool_call_id == last[-2].tool_calls[0]["id"] == "c3"
    assert compressor.measure(last) <= compressor.compress_threshold + 200  # the tool schema
    # The thread and the archive keep everything.
    state = agent.get_state(config).values["messages"]
    assert len(state) == 16
    assert backup.get_messages("t1") == state
    if mode == "async":
        await backup.adispose()


def test_tool_schemas_count_towards_the_budget(backup: MySQLBackup) -> None:
    hello = "Hi, " + "some background first. " * 40  # long enough that a summary is shorter
    prompt = [SystemMessage(SYSTEM), HumanMessage(hello), AIMessage("One."), HumanMessage("Two?")]
    messages_only = ContextCompressor().measure(prompt)
    with_tools = ContextCompressor(tools=[stock_level]).measure(prompt)
    # Over budget only once the tool schema is counted.
    threshold = (messages_only + with_tools) // 2
    compressor = ContextCompressor(compress_threshold=threshold, preserve_count=1)
    model = script("One.", "Two.")
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[TieredMemoryMiddleware(backup=backup, compressor=compressor)],
        checkpointer=InMemorySaver(),
    )
    agent.invoke(ask(hello), thread("t1"))
    agent.invoke(ask("Two?"), thread("t1"))

    assert "[Context compression summary]" in model.prompts[-1][0].content


def test_a_prompt_too_large_even_compressed_is_refused(backup: MySQLBackup) -> None:
    compressor = ContextCompressor(
        compress_threshold=10, preserve_count=1, force_delete_threshold=20, error_threshold=30
    )
    model = script("never")
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup, compressor=compressor)],
    )
    with pytest.raises(ContextOverflowError, match="over the limit of 30"):
        agent.invoke(ask("Please list " + "every invoice " * 40), thread("t1"))
    assert model.prompts == []
    assert backup.get_messages("t1") == []  # the run failed: nothing to archive


def test_compression_can_be_turned_off(backup: MySQLBackup) -> None:
    model = script(call("A-1", "c1"), "Answer " + "details " * 400)
    agent = create_agent(
        model,
        [stock_level],
        system_prompt=SYSTEM,
        middleware=[TieredMemoryMiddleware(backup=backup, compressor=False)],
        checkpointer=InMemorySaver(),
    )
    agent.invoke(ask("Stock of A-1?"), thread("t1"))
    assert model.prompts[-1] == [
        SystemMessage(SYSTEM),
        *agent.get_state(thread("t1")).values["messages"][:-1],
    ]


# -- the session: config, context, errors ---------------------------------------------


@dataclasses.dataclass
class Context:
    session_id: str
    user_id: str | None = None


def test_session_comes_from_context_then_config(backup: MySQLBackup) -> None:
    model = script("a", "b", "c")
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup)],
        context_schema=Context,
    )
    agent.invoke(ask("one"), thread("thread-1"), context=Context("ctx-1", "u7"))
    agent.invoke(ask("two"), {"configurable": {"thread_id": "thread-2", "session_id": "cfg-2"}})
    agent.invoke(ask("three"), thread("thread-3"))

    sessions = {s.session_id: s for s in backup.sessions()}
    assert set(sessions) == {"ctx-1", "cfg-2", "thread-3"}
    assert backup.sessions(user_id="u7")[0].session_id == "ctx-1"


def test_a_dict_context_works_too(backup: MySQLBackup) -> None:
    model = script("a")
    agent = create_agent(model, [stock_level], middleware=[TieredMemoryMiddleware(backup=backup)])
    agent.invoke(ask("one"), context={"session_id": "dict-1", "user_id": "u1"})
    assert [s.session_id for s in backup.sessions(user_id="u1")] == ["dict-1"]


@pytest.mark.parametrize(
    ("config", "context", "problem"),
    [
        ({}, None, "needs a session"),
        ({"configurable": {"session_id": "a"}}, {"session_id": "b"}, "disagree"),
    ],
)
def test_missing_or_conflicting_session_is_a_clear_error(
    backup: MySQLBackup, config: dict[str, Any], context: Any, problem: str
) -> None:
    model = script("never")
    agent = create_agent(model, [stock_level], middleware=[TieredMemoryMiddleware(backup=backup)])
    with pytest.raises(ValueError, match=problem):
        agent.invoke(ask("hi"), config, context=context)
    assert model.prompts == []
    assert backup.sessions() == []


def test_user_scope_needs_a_user(backup: MySQLBackup, make_memory: MakeMemory) -> None:
    model = script("never")
    middleware = TieredMemoryMiddleware(backup=backup, long_memory=make_memory(), scope="user")
    agent = create_agent(model, [stock_level], middleware=[middleware])
    with pytest.raises(ValueError, match="scope='user' needs a user_id"):
        agent.invoke(ask("hi"), thread("t1"))
    assert model.prompts == []


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("", "must not be empty"),
        ("x" * 256, "256 characters long"),
        ("a\x00b", "control character U\\+0000"),
        ("line\nbreak", "control character U\\+000A"),
        ("half \ud800", "lone surrogate"),
    ],
)
async def test_hostile_session_ids_are_rejected(
    backup: MySQLBackup, bad: str, problem: str
) -> None:
    model = script("never")
    agent = create_agent(model, [stock_level], middleware=[TieredMemoryMiddleware(backup=backup)])
    with pytest.raises(ValueError, match=f"session_id .*{problem}"):
        agent.invoke(ask("hi"), thread(bad))
    with pytest.raises(ValueError, match=f"session_id .*{problem}"):
        await agent.ainvoke(ask("hi"), thread(bad))
    with pytest.raises(ValueError, match=f"user_id .*{problem}"):
        agent.invoke(ask("hi"), thread("ok", user_id=bad))
    with pytest.raises(ValueError, match=f"session_id .*{problem}"):
        agent.invoke(ask("hi"), context={"session_id": bad})
    assert model.prompts == []  # rejected before the model was called
    assert backup.sessions() == []


def test_constructor_checks(backup: MySQLBackup, make_memory: MakeMemory, tmp_path: Path) -> None:
    other = MySQLBackup(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        with pytest.raises(ValueError, match="long_memory must use the middleware's archive"):
            TieredMemoryMiddleware(backup=other, long_memory=make_memory())
    finally:
        other.dispose()
    with pytest.raises(ValueError, match="scope must be 'session' or 'user'"):
        TieredMemoryMiddleware(backup=backup, scope="global")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be a positive int"):
        TieredMemoryMiddleware(backup=backup, k=0)
    with pytest.raises(TypeError, match="compressor must be a ContextCompressor"):
        TieredMemoryMiddleware(backup=backup, compressor=object())  # type: ignore[arg-type]
    # Without backup=, the long-term memory's archive is used.
    long_memory = make_memory()
    assert TieredMemoryMiddleware(long_memory=long_memory).backup is backup


# -- a session belongs to its user ----------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_another_users_run_is_refused_before_the_model(
    backup: MySQLBackup, make_memory: MakeMemory, mode: str
) -> None:
    model = script(call("A-1", "c1"), "A-1 has 12 units.", "never", "never")
    agent = create_agent(
        model,
        [stock_level],
        middleware=[TieredMemoryMiddleware(backup=backup, long_memory=make_memory())],
        context_schema=Context,
    )
    agent.invoke(ask("Stock of A-1?"), thread("s1"), context=Context("s1", "alice"))
    before, calls = backup.get_messages("s1"), len(model.prompts)
    tool_runs.clear()

    for user in ("bob", None):  # None: a run without a user cannot archive here
        with pytest.raises(SessionOwnershipError):
            if mode == "sync":
                agent.invoke(ask("Stock of A-1?"), thread(f"t-{user}"), context=Context("s1", user))
            else:
                await agent.ainvoke(
                    ask("Stock of A-1?"), thread(f"t-{user}"), context=Context("s1", user)
                )
    assert len(model.prompts) == calls  # no model call, no tool run
    assert tool_runs == []
    assert backup.get_messages("s1") == before
    if mode == "async":
        await backup.adispose()
