"""TieredMemory in langchain_classic's ConversationChain and LLMChain, sync and async.

Real archives (the ``backup`` fixture: SQLite and MariaDB), real embedded Chroma with
``HashEmbeddings``, a real MemoryConsolidator; fake chat models stand in for the LLM
and record the prompts they were sent.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

from langchain_tiered_memory import (
    MySQLBackup,
    SessionOwnershipError,
    TieredChatMessageHistory,
    TieredMemory,
)
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import RecordingChatModel, replies

with warnings.catch_warnings():  # the classic chains warn about their own deprecation
    warnings.simplefilter("ignore")
    from langchain_classic.chains import ConversationChain, LLMChain
    from langchain_classic.memory import ConversationSummaryBufferMemory

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MakeMemory = Callable[..., ChromaLongMemory]
FACT = "My cat is called Miso and she is 7 years old."
# The memory context, and a memory's bullet: the day its turn happened, then its text.
HEADER = re.escape("System: Relevant long-term memories:\n")
DAY = r"- \(\d{4}-\d{2}-\d{2}\) User: "
QUESTION = "What is my cat called?"


def prompt_text(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


def conversation(model: RecordingChatModel, memory: TieredMemory) -> ConversationChain:
    return ConversationChain(llm=model, memory=memory)


@pytest.fixture
def model() -> RecordingChatModel:
    return RecordingChatModel(messages=replies())


# -- ConversationChain: the window, the prefixes, the archive -------------------------


def test_conversation_chain_text_buffer_with_prefixes(
    backup: MySQLBackup, model: RecordingChatModel
) -> None:
    history = TieredChatMessageHistory("s1", backup=backup, window_turns=2)
    memory = TieredMemory(history=history, human_prefix="User", ai_prefix="Bot")
    chain = conversation(model, memory)
    for n in range(1, 5):
        result = chain.invoke({"input": f"question {n}"})
        assert result["response"] == f"reply {n}"

    last = prompt_text(model.prompts[-1])
    # The window holds the two turns before this one, with the chosen prefixes.
    window = last.split("Current conversation:\n")[1].split("\nHuman: question 4\nAI:")[0]
    assert window == "User: question 2\nBot: reply 2\nUser: question 3\nBot: reply 3"
    # Every turn is archived, in order, even those the window dropped.
    assert backup.get_messages("s1") == [
        m for n in range(1, 5) for m in (HumanMessage(f"question {n}"), AIMessage(f"reply {n}"))
    ]
    assert memory.buffer == ("User: question 3\nBot: reply 3\nUser: question 4\nBot: reply 4")


def test_llm_chain_with_messages_and_custom_keys(
    backup: MySQLBackup, model: RecordingChatModel
) -> None:
    history = TieredChatMessageHistory("s1", backup=backup)
    memory = TieredMemory(
        history=history, memory_key="chat_history", input_key="question", return_messages=True
    )
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are an ERP assistant."),
            MessagesPlaceholder("chat_history"),
            ("human", "{question}"),
        ]
    )
    chain = LLMChain(llm=model, prompt=prompt, memory=memory)
    assert memory.memory_variables == ["chat_history"]

    chain.invoke({"question": "Which table holds invoices?"})
    chain.invoke({"question": "And its key?"})

    assert model.prompts[-1] == [
        SystemMessage("You are an ERP assistant."),
        HumanMessage("Which table holds invoices?"),
        AIMessage("reply 1"),
        HumanMessage("And its key?"),
    ]
    # LLMChain's single output ("text") is what is saved as the AI message.
    assert backup.get_messages("s1")[-1] == AIMessage("reply 2")


def test_output_key_picks_among_several_outputs(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("s1", backup=backup)
    memory = TieredMemory(history=history, output_key="answer")
    memory.save_context({"input": "hi"}, {"answer": "hello", "sources": "none"})
    assert backup.get_messages("s1") == [HumanMessage("hi"), AIMessage("hello")]
    ambiguous = TieredMemory(history=history)
    with pytest.raises(ValueError, match="multiple output keys"):
        ambiguous.save_context({"input": "hi"}, {"answer": "hello", "sources": "none"})


# -- the leading context: long-term memories and MEMORY.md ---------------------------


def _early_session(chain_for: Callable[[str], ConversationChain]) -> None:
    """Session s1 states the fact, then moves its window past it."""
    chain = chain_for("s1")
    chain.invoke({"input": FACT})
    for n in range(3):
        chain.invoke({"input": f"Let us talk about invoice batch {n}."})


def test_fact_from_an_earlier_session_is_recalled(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory()
    model = RecordingChatModel(messages=replies("Noted!"))

    def chain_for(session_id: str) -> ConversationChain:
        history = TieredChatMessageHistory(
            session_id, user_id="u1", backup=backup, long_memory=long_memory, window_turns=2
        )
        return conversation(model, TieredMemory(history=history, scope="user", k=1))

    _early_session(chain_for)
    s1 = TieredChatMessageHistory("s1", user_id="u1", backup=backup, window_turns=2)
    assert FACT not in prompt_text(s1.messages)  # the window has moved on
    long_memory.flush(timeout=30)

    chain_for("s2").invoke({"input": QUESTION})

    last = prompt_text(model.prompts[-1])
    assert "Miso" in last
    # Like ConversationSummaryBufferMemory's summary, the context leads the buffer.
    history_part = last.split("Current conversation:\n")[1]
    assert re.match(HEADER + DAY + re.escape(FACT), history_part)
    # k=1: the best match only, not the invoice chatter.
    assert "invoice batch" not in last


def test_memories_lead_as_a_system_message(backup: MySQLBackup, make_memory: MakeMemory) -> None:
    long_memory = make_memory()
    s1 = TieredChatMessageHistory("s1", user_id="u1", backup=backup, long_memory=long_memory)
    s1.add_messages([HumanMessage(FACT), AIMessage("Noted!")])
    long_memory.flush(timeout=30)
    s2 = TieredChatMessageHistory("s2", user_id="u1", backup=backup, long_memory=long_memory)
    s2.add_messages([HumanMessage("hello"), AIMessage("hi")])
    memory = TieredMemory(history=s2, return_messages=True, scope="user", k=1)

    buffer = memory.load_memory_variables({"input": QUESTION})["history"]

    assert isinstance(buffer[0], SystemMessage)
    assert FACT in buffer[0].content
    assert buffer[1:] == [HumanMessage("hello"), AIMessage("hi")]
    # Session scope (the default) does not see another session's memories.
    session_scoped = TieredMemory(history=s2, return_messages=True)
    assert session_scoped.load_memory_variables({"input": QUESTION})["history"] == buffer[1:]


def test_memory_md_leads_the_buffer(backup: MySQLBackup, tmp_path: Path) -> None:
    llm = GenericFakeChatModel(messages=iter([AIMessage("- The user is Ada, an accountant.")]))
    consolidator = MemoryConsolidator(
        llm, root=tmp_path / "memory", backup=backup, threshold=2, batch=2, start_worker=False
    )
    try:
        history = TieredChatMessageHistory("s1", backup=backup, consolidator=consolidator)
        memory = TieredMemory(history=history)
        memory.save_context({"input": "I am Ada."}, {"output": "Hello Ada."})
        memory.save_context({"input": "I do accounts."}, {"output": "Got it."})
        consolidator.flush(timeout=30)

        text = memory.load_memory_variables({"input": "who am I?"})["history"]
        assert text.startswith(
            "System: Consolidated memory (MEMORY.md):\n- The user is Ada, an accountant.\n"
        )
        assert text.endswith("Human: I do accounts.\nAI: Got it.")
    finally:
        consolidator.close()


# -- async: the history's async methods ----------------------------------------------


class AsyncOnlyHistory(TieredChatMessageHistory):
    """Fails on the sync read and write, so the async path must not use them."""

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        raise AssertionError("sync window read on the async path")

    def add_messages(self, messages: Any) -> None:
        raise AssertionError("sync write on the async path")


async def test_async_conversation_chain_recalls_across_sessions(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory()
    model = RecordingChatModel(messages=replies("Noted!"))

    def chain_for(session_id: str) -> ConversationChain:
        history = AsyncOnlyHistory(
            session_id, user_id="u1", backup=backup, long_memory=long_memory, window_turns=2
        )
        return conversation(model, TieredMemory(history=history, scope="user", k=1))

    early = chain_for("s1")
    await early.ainvoke({"input": FACT})
    for n in range(3):
        await early.ainvoke({"input": f"Let us talk about invoice batch {n}."})
    long_memory.flush(timeout=30)

    result = await chain_for("s2").ainvoke({"input": QUESTION})

    assert "Miso" in prompt_text(model.prompts[-1])
    assert re.match(HEADER + DAY + re.escape(FACT), result["history"])
    assert len(backup.get_messages("s1")) == 8
    assert backup.get_messages("s2") == [HumanMessage(QUESTION), AIMessage(result["response"])]
    await backup.adispose()


async def test_async_buffer_and_clear(backup: MySQLBackup, make_memory: MakeMemory) -> None:
    long_memory = make_memory()
    history = AsyncOnlyHistory("s1", backup=backup, long_memory=long_memory)
    memory = TieredMemory(history=history, return_messages=True)
    await memory.asave_context({"input": FACT}, {"response": "Noted!"})
    assert await memory.abuffer() == [HumanMessage(FACT), AIMessage("Noted!")]
    long_memory.flush(timeout=30)
    assert long_memory.search("cat", session_id="s1")

    await memory.aclear()

    assert backup.get_messages("s1") == []
    assert long_memory.search("cat", session_id="s1") == []
    await backup.adispose()


# -- clear, validation ---------------------------------------------------------------


def test_clear_forgets_the_session_in_every_tier(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory()
    mine = TieredChatMessageHistory("s1", user_id="u1", backup=backup, long_memory=long_memory)
    other = TieredChatMessageHistory("s2", user_id="u1", backup=backup, long_memory=long_memory)
    memory = TieredMemory(history=mine)
    memory.save_context({"input": FACT}, {"response": "Noted!"})
    TieredMemory(history=other).save_context({"input": "I like tea."}, {"response": "OK"})
    long_memory.flush(timeout=30)

    memory.clear()

    assert memory.buffer == ""
    assert backup.get_messages("s1") == []
    assert long_memory.search(QUESTION, session_id="s1") == []
    # The user's other session keeps its messages and memories.
    assert len(backup.get_messages("s2")) == 2
    assert [
        d.metadata["session_id"] for d in long_memory.search("tea", user_id="u1", scope="user")
    ] == ["s2"]


async def test_a_cleared_session_stays_its_users(backup: MySQLBackup) -> None:
    """``clear`` empties the session; another user cannot take the id over afterwards."""
    alice = TieredMemory(history=TieredChatMessageHistory("s1", user_id="u1", backup=backup))
    alice.save_context({"input": FACT}, {"response": "Noted!"})
    alice.clear()
    await alice.aclear()
    assert backup.get_messages("s1") == []

    bob = TieredChatMessageHistory("s1", user_id="u2", backup=backup)
    with pytest.raises(SessionOwnershipError):
        bob.add_user_message("mine now")
    alice.save_context({"input": "I like tea."}, {"response": "OK"})
    assert backup.get_messages("s1") == [HumanMessage("I like tea."), AIMessage("OK")]
    # An erasure still frees the id.
    backup.forget(session_id="s1")
    bob.add_user_message("mine now")


async def test_a_memory_without_a_user_clears_no_users_session(backup: MySQLBackup) -> None:
    """A user-less memory neither shows a user's session (its buffer goes into a prompt)
    nor erases it."""
    TieredMemory(history=TieredChatMessageHistory("s1", user_id="u1", backup=backup)).save_context(
        {"input": FACT}, {"response": "Noted!"}
    )
    anonymous = TieredMemory(history=TieredChatMessageHistory("s1", backup=backup))
    with pytest.raises(SessionOwnershipError, match="belongs to a user"):
        anonymous.buffer  # noqa: B018 - the read is what is refused

    with pytest.raises(SessionOwnershipError, match="belongs to a user"):
        anonymous.clear()
    with pytest.raises(SessionOwnershipError, match="belongs to a user"):
        await anonymous.aclear()

    assert backup.get_messages("s1") == [HumanMessage(FACT), AIMessage("Noted!")]


def test_summary_buffer_arguments_say_where_they_went(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("s1", backup=backup)
    with pytest.raises(TypeError, match=r"llm, max_token_limit .*window_max_tokens"):
        TieredMemory(history=history, llm=object(), max_token_limit=100)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="history=TieredChatMessageHistory"):
        TieredMemory(history=InMemoryChatMessageHistory())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got NoneType"):
        TieredMemory()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="scope='user' needs a history with a user_id"):
        TieredMemory(history=history, scope="user")
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TieredMemory(history=history, windw_turns=3)  # type: ignore[call-arg]
    # chat_memory is an alias of history, as in ConversationSummaryBufferMemory.
    memory = TieredMemory(chat_memory=history)
    assert memory.history is history and memory.chat_memory is history


def test_every_summary_buffer_field_is_mapped(backup: MySQLBackup) -> None:
    """Each ConversationSummaryBufferMemory field is either ours or explained."""
    ours = set(TieredMemory.model_fields)
    for name in ConversationSummaryBufferMemory.model_fields:
        if name in ours:
            continue
        with pytest.raises(TypeError, match=f"does not take {name} "):
            TieredMemory(history=TieredChatMessageHistory("s", backup=backup), **{name: None})


@pytest.mark.parametrize("bad", ["", "x" * 256, "a\x00b", "line\nbreak", "half \ud800"])
def test_hostile_session_ids_never_reach_the_chain(
    backup: MySQLBackup, model: RecordingChatModel, bad: str
) -> None:
    with pytest.raises(ValueError, match="session_id"):
        TieredMemory(history=TieredChatMessageHistory(bad, backup=backup))
    assert model.prompts == []
    assert backup.sessions() == []


# -- a session belongs to its user ----------------------------------------------------


async def test_another_users_memory_reads_writes_and_clears_nothing(
    backup: MySQLBackup, make_memory: MakeMemory, tmp_path: Path
) -> None:
    long_memory = make_memory()
    consolidator = MemoryConsolidator(
        RecordingChatModel(messages=replies("- the cat is Miso")),
        root=tmp_path / "memory",
        backup=backup,
        threshold=1,
        batch=1,
        start_worker=False,
    )
    try:

        def memory(user_id: str) -> TieredMemory:
            history = TieredChatMessageHistory(
                "s1",
                user_id=user_id,
                backup=backup,
                long_memory=long_memory,
                consolidator=consolidator,
            )
            return TieredMemory(history=history)

        memory("alice").save_context({"input": FACT}, {"response": "Noted!"})
        long_memory.run_pending()
        consolidator.run_pending()
        bob = memory("bob")
        for action in (
            lambda: bob.load_memory_variables({"input": QUESTION}),
            lambda: bob.buffer,
            lambda: bob.save_context({"input": "mine now"}, {"response": "OK"}),
            bob.clear,
        ):
            with pytest.raises(SessionOwnershipError):
                action()
        with pytest.raises(SessionOwnershipError):
            await bob.aload_memory_variables({"input": QUESTION})
        with pytest.raises(SessionOwnershipError):
            await bob.asave_context({"input": "mine now"}, {"response": "OK"})
        with pytest.raises(SessionOwnershipError):
            await bob.aclear()
        # Alice's session is whole in every tier.
        assert backup.get_messages("s1") == [HumanMessage(FACT), AIMessage("Noted!")]
        assert long_memory.search("cat", session_id="s1")
        assert "Miso" in consolidator.memory("s1")
    finally:
        consolidator.close()
        await backup.adispose()
