"""One definition of a turn: the archive's tail, the session files and the window agree."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)

from langchain_tiered_memory import (
    MySQLBackup,
    SessionFileArchive,
    TieredChatMessageHistory,
    estimate_tokens,
)
from langchain_tiered_memory.core.turns import role_of, split_turns, tool_calls_of
from langchain_tiered_memory.storage import archive as archive_module
from langchain_tiered_memory.tiers.compression import validate_conversation
from langchain_tiered_memory.tiers.window import select_window


def _call(n: int) -> list[BaseMessage]:
    call_id = f"call-{n}"
    return [
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"n": n}, "id": call_id}]),
        ToolMessage(f"result {n}", tool_call_id=call_id),
    ]


CONVERSATIONS: dict[str, list[BaseMessage]] = {
    "consecutive humans": [
        HumanMessage("q1"),
        AIMessage("a1"),
        HumanMessage("q2"),
        HumanMessage("q2, more"),
        HumanMessage("q2, still more"),
        AIMessage("a2"),
        HumanMessage("q3"),
        AIMessage("a3"),
        HumanMessage("q4"),
        HumanMessage("q4, more"),
    ],
    "leading ai and system": [
        SystemMessage("be brief"),
        AIMessage("welcome!"),
        AIMessage("ask me anything"),
        HumanMessage("q1"),
        AIMessage("a1"),
        HumanMessage("q2"),
        AIMessage("a2"),
    ],
    "tool messages": [
        HumanMessage("q1"),
        *_call(1),
        AIMessage("a1"),
        HumanMessage("q2"),
        HumanMessage("q2, more"),
        *_call(2),
        *_call(3),
        AIMessage("a2"),
        HumanMessage("q3"),
        *_call(4),
    ],
}


def contents(messages: Sequence[BaseMessage]) -> list[str]:
    return [str(message.content) for message in messages]


def expected_tail(messages: Sequence[BaseMessage], turns: int) -> list[str]:
    """The last ``turns`` turns by core.turns (the leading turn counts as one)."""
    return contents([m for turn in split_turns(messages, keep_leading=True)[-turns:] for m in turn])


def window(messages: Sequence[BaseMessage], turns: int) -> list[str]:
    return contents(select_window(messages, max_turns=turns, max_tokens=None, count_tokens=len))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_archives_and_window_give_the_same_turns(
    name: str, backup: MySQLBackup, tmp_path: Path
) -> None:
    messages = CONVERSATIONS[name]
    files = SessionFileArchive(tmp_path / "files")
    for archive in (backup, files):
        archive.add_messages(name, messages[:3])  # turns split across writes, too
        archive.add_messages(name, messages[3:])
    every = range(1, len(messages) + 2)

    async def atails() -> list[list[BaseMessage]]:
        try:
            return [await backup.atail(name, turns) for turns in every]
        finally:
            await backup.adispose()

    for turns, atail in zip(every, asyncio.run(atails()), strict=True):
        want = expected_tail(messages, turns)
        assert contents(backup.tail(name, turns)) == want, turns
        assert contents(atail) == want, turns
        assert contents(files.tail(name, turns)) == want, turns
        # The window over the archive's tail is the window over the whole session.
        assert window(backup.tail(name, turns), turns) == window(messages, turns), turns


def test_a_run_of_human_messages_is_one_turn(backup: MySQLBackup, tmp_path: Path) -> None:
    """Two questions before one answer are one turn, even over the archive's read steps."""
    run = [HumanMessage(f"part {i}") for i in range(60)]  # longer than the first step
    messages = [HumanMessage("q1"), AIMessage("a1"), *run, AIMessage("a2"), HumanMessage("q3")]
    files = SessionFileArchive(tmp_path)
    for archive in (backup, files):
        archive.add_messages("run", messages)
        assert contents(archive.tail("run", 1)) == ["q3"]
        assert contents(archive.tail("run", 2)) == contents([*run, AIMessage("a2"), messages[-1]])
        assert contents(archive.tail("run", 3)) == contents(messages)
    assert window(backup.tail("run", 2), 2) == contents([*run, AIMessage("a2"), messages[-1]])


def test_random_sessions_agree_with_core_turns(
    backup: MySQLBackup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random role sequences, with a small read step so that tails span many steps."""
    monkeypatch.setattr(archive_module, "TAIL_SCAN", 5)
    files = SessionFileArchive(tmp_path)
    rng = random.Random(12)
    makers = {
        "h": lambda i: HumanMessage(f"h{i}"),
        "a": lambda i: AIMessage(f"a{i}"),
        "s": lambda i: SystemMessage(f"s{i}"),
        "t": lambda i: ToolMessage(f"t{i}", tool_call_id=f"c{i}"),
    }
    for number in range(25):
        roles = rng.choices("hhhaats", k=rng.randint(1, 40))
        messages = [makers[role](i) for i, role in enumerate(roles)]
        session = f"r{number}"
        backup.add_messages(session, messages)
        files.add_messages(session, messages)
        for turns in (1, 2, 3, 5, 8, 50):
            want = expected_tail(messages, turns)
            assert contents(backup.tail(session, turns)) == want, (roles, turns)
            assert contents(files.tail(session, turns)) == want, (roles, turns)


def test_chat_messages_of_user_and_assistant_make_turns(
    backup: MySQLBackup, tmp_path: Path
) -> None:
    """ChatMessage(role="user") is a user message to langchain_core and every provider,
    so it opens a turn in the archives and the window as a HumanMessage does."""
    messages: list[BaseMessage] = []
    for n in range(3):
        messages += [ChatMessage(f"q{n}", role="user"), ChatMessage(f"a{n}", role="assistant")]
    for archive in (backup, SessionFileArchive(tmp_path)):
        history = TieredChatMessageHistory("chat", backup=archive, window_turns=2)
        history.add_messages(messages)
        assert contents(history.messages) == ["q1", "a1", "q2", "a2"]
        assert contents(archive.tail("chat", 1)) == ["q2", "a2"]
    assert [role_of(m) for m in messages[:2]] == ["human", "ai"]
    assert role_of(ChatMessage("note", role="narrator")) == "chat"  # a role of its own


#: One call as each provider shape writes it in content blocks, with no tool_calls.
CALL_BLOCKS: dict[str, dict[str, Any]] = {
    "anthropic dicts": {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    },
    "standard blocks": {
        "type": "tool_call",
        "id": "toolu_1",
        "name": "get_weather",
        "args": {"city": "Paris"},
    },
    # OpenAI's Responses API: the call's id is call_id, its id is the item's.
    "responses api": {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "toolu_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    },
}


@pytest.mark.parametrize("shape", list(CALL_BLOCKS))
def test_a_call_given_only_as_a_content_block_keeps_its_result(
    backup: MySQLBackup, tmp_path: Path, shape: str
) -> None:
    """A message made from Anthropic-shaped dicts, or with LangChain's standard
    ``tool_call`` blocks, has no ``tool_calls``; its calls are still calls, and the
    window kept the call's block but dropped its result (Anthropic refuses that)."""
    call = CALL_BLOCKS[shape]
    messages = convert_to_messages(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, call]},
            {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    )
    assert not messages[1].tool_calls  # as langchain_core makes it
    assert [(c["id"], c["name"], c["args"]) for c in tool_calls_of(messages[1])] == [
        ("toolu_1", "get_weather", {"city": "Paris"})
    ]
    for archive in (backup, SessionFileArchive(tmp_path)):
        history = TieredChatMessageHistory("blocks", backup=archive)
        history.add_messages(messages)
        assert history.messages == messages
        validate_conversation(history.messages)


@pytest.mark.parametrize("shape", list(CALL_BLOCKS))
def test_a_call_given_as_an_idless_entry_and_a_block_counts_once(
    backup: MySQLBackup, shape: str
) -> None:
    """A ``tool_calls`` entry without an id beside the block of the same call (its id
    kept there only) was two calls: counted twice against the budget."""
    args = {"city": "Paris, " * 300}
    block = CALL_BLOCKS[shape]
    id_key = "call_id" if "call_id" in block else "id"
    args_key = next(key for key in ("input", "args", "arguments") if key in block)
    first = {**block, args_key: args}
    second = {**first, id_key: "toolu_2"}
    entry: Any = {"name": "get_weather", "args": args, "id": None}
    text = {"type": "text", "text": "Checking."}

    def tokens(content: list[dict[str, Any]], calls: list[Any]) -> int:
        return estimate_tokens(AIMessage(content, tool_calls=calls))

    assert tokens([text, first], [entry]) == tokens([text], [entry])
    # Two calls of one tool: each entry is the block of its place.
    assert tokens([text, first, second], [entry, entry]) == tokens([text], [entry, entry])
    twice = AIMessage([text, first, second], tool_calls=[entry, entry])
    assert [(c["id"], c["name"]) for c in tool_calls_of(twice)] == [
        ("toolu_1", "get_weather"),
        ("toolu_2", "get_weather"),
    ]
    # A block of another tool is another call: its arguments count.
    other = {"name": "get_time", "args": {}, "id": None}
    assert tokens([text, first], [other]) > tokens([text], [other]) + 300
    # In the window, each call (by its block's id) keeps its result.
    results = [ToolMessage("sunny", tool_call_id=i) for i in ("toolu_1", "toolu_2")]
    stored = [HumanMessage("weather?"), twice, *results, AIMessage("Sunny.")]
    history = TieredChatMessageHistory(f"idless-{shape}".replace(" ", "-"), backup=backup)
    history.add_messages(stored)
    assert history.messages == stored
    validate_conversation(history.messages)
