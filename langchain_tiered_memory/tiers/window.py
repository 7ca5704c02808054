"""The window tier: the last K turns under a token budget, cut on turn boundaries."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage, ToolMessage

from langchain_tiered_memory.core.turns import (
    answerable_calls,
    answered_call,
    is_system,
    split_turns,
    tool_call_ids,
)

# split_turns lives in core.turns; it is re-exported here for its older importers.
__all__ = [
    "UNANSWERED",
    "answer_open_calls",
    "drop_orphan_tool_messages",
    "select_window",
    "system_messages_first",
    "split_turns",
]

#: The result a window shows for a tool call the archive holds no result of.
UNANSWERED = "[no result archived: this tool call was not answered]"


def drop_orphan_tool_messages(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Remove tool results whose calling ``AIMessage`` is not in ``messages``.

    A call is any of :func:`~langchain_tiered_memory.core.turns.tool_calls_of`,
    invalid ones included.
    """
    called: set[str] = set()
    kept: list[BaseMessage] = []
    for message in messages:
        called |= tool_call_ids(message)
        if isinstance(message, ToolMessage) and message.tool_call_id not in called:
            continue
        kept.append(message)
    return kept


def answer_open_calls(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Answer each tool call right after it, once: with its result, else a stand-in.

    Chat providers refuse a conversation in which a call is not answered before
    the next message, or answered twice. The archive can hold one: a
    ``create_agent`` run that ended on a call with malformed arguments (the agent
    answers those in its prompt only), a writer stopped between a call and its
    results, a result written after another message, a result written twice. A
    result that comes later is moved up to its call, a call with none gets
    :data:`UNANSWERED`, and a result that answers no open call is left out. A
    ``FunctionMessage`` or a ``ChatMessage`` "tool" right after the calls is the
    result of one (:func:`~langchain_tiered_memory.core.turns.answered_call`). In
    the window only: the archive is unchanged.
    """
    # A result answers the latest call of its id before it (an id used again, by a
    # retry of a call whose arguments were malformed, is the retry's).
    calls = [answerable_calls(message) for message in messages]
    results: dict[int, list[int]] = {}  # a call's message index -> its results' indexes
    latest: dict[str, int] = {}
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage) and message.tool_call_id in latest:
            results.setdefault(latest[message.tool_call_id], []).append(index)
        for call_id, _ in calls[index]:
            latest[call_id] = index
    moved: set[int] = set()
    kept: list[BaseMessage] = []
    # The calls not answered yet: id, tool name and message index. A list, as one
    # message may make several calls of one id (a server that names every call "").
    waiting: list[tuple[str, str, int]] = []

    def answer_waiting(now: int) -> None:
        for call_id, name, at in waiting:
            later = [
                i
                for i in results.get(at, ())
                if i > now
                and i not in moved
                and getattr(messages[i], "tool_call_id", "") == call_id
            ]
            if later:
                moved.add(later[0])
                kept.append(messages[later[0]])
            else:
                kept.append(
                    ToolMessage(UNANSWERED, tool_call_id=call_id, name=name, status="error")
                )
        waiting.clear()

    for index, message in enumerate(messages):
        if index in moved:
            continue
        # A FunctionMessage or a ChatMessage "tool" right after the calls answers
        # one too (by its tool's name, or the first), though it names no call id.
        answered = answered_call(message, [call[:2] for call in waiting])
        if answered is not None:
            del waiting[answered]
            kept.append(message)
            continue
        if isinstance(message, ToolMessage):
            continue  # a second result, or one whose call is not open
        answer_waiting(index)
        kept.append(message)
        waiting += [(call_id, name, index) for call_id, name in calls[index]]
    answer_waiting(len(messages))
    return kept


def system_messages_first(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The system messages of ``messages`` first, then the others, each in order.

    Providers take system messages at the start of a conversation only: OpenAI
    refuses one between a tool call and its results; Anthropic has no system role
    mid-conversation (langchain_anthropic moves a later one into the leading
    instructions, and refuses it when the prompt has its own), nor has Google's
    API. At the start of a window, after a prompt's own system message, they are
    part of its instructions, which every provider takes. A ``ChatMessage``
    "system" or "developer" is one too (:func:`~langchain_tiered_memory.core.turns.is_system`).
    """
    system = [message for message in messages if is_system(message)]
    rest = [message for message in messages if not is_system(message)]
    return [*system, *rest]


def select_window(
    messages: Sequence[BaseMessage],
    *,
    max_turns: int,
    max_tokens: int | None,
    count_tokens: Callable[[Sequence[BaseMessage]], int],
) -> list[BaseMessage]:
    """The newest whole turns that fit both ``max_turns`` and ``max_tokens``.

    Turns are those of :func:`~langchain_tiered_memory.core.turns.split_turns`;
    messages before the first human message are dropped, so a window never
    starts with an AI or tool message.

    Within a turn, a tool result without its call is dropped and each call is
    answered right after it (:func:`answer_open_calls`); a system message stored
    mid-conversation is moved to the window's start (:func:`system_messages_first`),
    so the window is a conversation providers accept.

    Turns are dropped whole, oldest first. As with ``trim_messages``, the budget is
    a hard limit: if the newest turn alone is over it, the window is empty.
    """
    turns = split_turns(messages)[-max_turns:] if max_turns > 0 else []
    kept: list[list[BaseMessage]] = []
    total = 0
    for turn in reversed(turns):
        turn = answer_open_calls(drop_orphan_tool_messages(turn))
        if max_tokens is not None:
            total += count_tokens(turn)
            if total > max_tokens:
                break
        kept.append(turn)
    return system_messages_first([message for turn in reversed(kept) for message in turn])
