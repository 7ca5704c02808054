"""What a turn is: one definition for the archive, the window and every tier.

A turn starts at a human message and runs to the next one; messages before the
first human message form a turn of their own. The tool calls a message makes are
defined here too: a tool result belongs with the call it answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall

_ROLE_OF_TYPE = {
    "HumanMessageChunk": "human",
    "AIMessageChunk": "ai",
    "ToolMessageChunk": "tool",
    "SystemMessageChunk": "system",
    "FunctionMessageChunk": "function",
    "ChatMessageChunk": "chat",
}

# A ChatMessage's role as langchain_core reads it (``convert_to_messages`` and the
# provider integrations send "user" as a user message); other roles stay "chat".
_ROLE_OF_CHAT_ROLE = {
    "human": "human",
    "user": "human",
    "ai": "ai",
    "assistant": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "function",
}


#: Content blocks that make a tool call: the keys of their call id and arguments
#: (OpenAI's Responses API names its call ``call_id``; its ``id`` is the item's).
_CALL_BLOCKS = {
    "tool_use": ("id", "input"),
    "tool_call": ("id", "args"),
    "function_call": ("call_id", "arguments"),
}


def role_of(message: BaseMessage) -> str:
    """The archive's role column for a message.

    Chunks count as their full type; a ``ChatMessage`` counts as the role it
    names when langchain_core knows that role (``ChatMessage(role="user")`` is a
    human message, so it opens a turn), else as ``"chat"``.
    """
    if isinstance(message, ChatMessage):
        return _ROLE_OF_CHAT_ROLE.get(message.role, "chat")
    return _ROLE_OF_TYPE.get(message.type, message.type)


def is_system(message: BaseMessage) -> bool:
    """Whether ``message`` is a system message.

    A ``SystemMessage``, or a ``ChatMessage`` "system" or "developer", which the
    provider integrations send with that role too.
    """
    return role_of(message) == "system"


def roles_of(messages: Sequence[BaseMessage]) -> list[str]:
    """:func:`role_of` of each message."""
    return [role_of(message) for message in messages]


def turn_starts(roles: Sequence[str]) -> list[int]:
    """Indexes where turns start: the first of each run of human messages.

    Messages before the first human message form a turn of their own (index 0).

    Args:
        roles: The messages' roles, oldest first (:func:`roles_of`).
    """
    starts = [0] if roles and roles[0] != "human" else []
    for index, role in enumerate(roles):
        if role == "human" and (index == 0 or roles[index - 1] != "human"):
            starts.append(index)
    return starts


def turn_ends(roles: Sequence[str]) -> list[int]:
    """Indexes of the last message of each turn (the last message always ends one)."""
    starts = turn_starts(roles)
    return [start - 1 for start in starts[1:]] + ([len(roles) - 1] if roles else [])


def split_turns(
    messages: Sequence[BaseMessage], *, keep_leading: bool = False
) -> list[list[BaseMessage]]:
    """Group messages into turns (see :func:`turn_starts`).

    Args:
        messages: Oldest first.
        keep_leading: Keep the messages before the first human message as a turn of
            their own; by default they are dropped, so that a window never starts
            with an AI or tool message, nor with the instructions of a session's
            start.
    """
    roles = roles_of(messages)
    starts = turn_starts(roles)
    bounds = zip(starts, [*starts[1:], len(messages)][: len(starts)], strict=True)
    return [
        list(messages[start:end])
        for start, end in bounds
        if keep_leading or roles[start] == "human"
    ]


def call_id_of(call: ToolCall | InvalidToolCall) -> str | None:
    """The id a result names to answer ``call``, ``None`` if it has none.

    ``""`` is an id like any other: some OpenAI-compatible servers send it, and an
    agent answers such a call with ``ToolMessage(tool_call_id="")``, so the call
    still needs its result.
    """
    call_id = call.get("id")
    return call_id if isinstance(call_id, str) else None


def _block_call(block: object) -> ToolCall | None:
    """The call a content block makes (see ``_CALL_BLOCKS``), else ``None``.

    A block's id that is no string counts as no id.
    """
    if not isinstance(block, dict) or block.get("type") not in _CALL_BLOCKS:
        return None
    id_key, args_key = _CALL_BLOCKS[block["type"]]
    call_id, name, args = block.get(id_key), block.get("name"), block.get(args_key)
    return ToolCall(
        name=name if isinstance(name, str) else "tool",
        args=args if isinstance(args, dict) else {},
        id=call_id if isinstance(call_id, str) else None,
    )


def _calls_and_repeats(message: BaseMessage) -> tuple[list[ToolCall | InvalidToolCall], set[int]]:
    """:func:`tool_calls_of` and :func:`repeated_call_blocks` of ``message``, read once."""
    if not isinstance(message, AIMessage):
        return [], set()
    calls: list[ToolCall | InvalidToolCall] = [*message.tool_calls, *message.invalid_tool_calls]
    repeats: set[int] = set()
    if not isinstance(message.content, list):
        return calls, repeats
    known = {call_id for call in calls if (call_id := call_id_of(call)) is not None}
    # A tool_calls entry without an id is the same call as the next block of its
    # name (a message whose ids were lost from tool_calls but kept in its blocks).
    idless = [i for i, call in enumerate(message.tool_calls) if call_id_of(call) is None]
    for index, block in enumerate(message.content):
        call = _block_call(block)
        if call is None:
            continue
        call_id = call["id"]
        if call_id is not None and call_id in known:
            repeats.add(index)
            continue
        same = next((i for i in idless if calls[i].get("name") == call["name"]), None)
        if same is not None:
            idless.remove(same)
            repeats.add(index)
            if call_id is not None:
                named = message.tool_calls[same].copy()
                named["id"] = call_id
                calls[same] = named
                known.add(call_id)
        elif call_id is not None:
            known.add(call_id)
            calls.append(call)
    return calls, repeats


def tool_calls_of(message: BaseMessage) -> list[ToolCall | InvalidToolCall]:
    """Every tool call ``message`` makes: its ``tool_calls`` and its ``invalid_tool_calls``.

    An invalid call (arguments that are not JSON) is still a call: provider
    integrations send it among the assistant's tool calls, and ``create_agent``
    answers it with a ``ToolMessage``, so its result belongs with it as a valid
    call's does. So is a call given only as a content block (Anthropic's
    ``tool_use``, LangChain's standard ``tool_call``, OpenAI Responses'
    ``function_call``), as a message made from an Anthropic-shaped dict is:
    ``tool_calls`` is empty there. A block repeating a call of ``tool_calls`` (by
    id, or by name for an entry without an id, which then takes the block's id)
    is that call, not another.

    Returns:
        The ``tool_calls`` then the ``invalid_tool_calls``, in order, then the calls
        given only as blocks.
    """
    return _calls_and_repeats(message)[0]


def _named_block(
    block: str | dict[Any, Any], fresh: dict[object, list[str]]
) -> str | dict[Any, Any]:
    """``block`` with the next of ``fresh``'s ids for its tool, if it makes a call without one."""
    call = _block_call(block)
    if call is None or call["id"] is not None or not fresh.get(call["name"]):
        return block
    assert isinstance(block, dict)  # a call block is one (_block_call)
    return {**block, _CALL_BLOCKS[block["type"]][0]: fresh[call["name"]].pop(0)}


def name_calls(message: AIMessage, new_id: Callable[[], str]) -> AIMessage:
    """``message`` with an id for each call that has none, the same wherever it is given.

    A ``tool_calls`` entry takes the id :func:`tool_calls_of` reads for it (``""``
    is an id, and an entry without one takes the id of its content block); one
    without any gets ``new_id()``, as does the content block without an id that
    repeats it, so the call stays one call. So does an invalid call without an id.

    Args:
        message: An AI message.
        new_id: Makes an id for a call that has none.
    """
    calls = tool_calls_of(message)
    fresh: dict[object, list[str]] = {}  # a tool's name -> new ids, in call order
    named = []
    for entry, seen in zip(message.tool_calls, calls, strict=False):
        call_id = call_id_of(seen)
        if call_id is None:
            call_id = new_id()
            fresh.setdefault(entry.get("name"), []).append(call_id)
        named.append({**entry, "id": call_id})
    invalid = [
        {**entry, "id": call_id if (call_id := call_id_of(entry)) is not None else new_id()}
        for entry in message.invalid_tool_calls
    ]
    content = message.content
    if isinstance(content, list):
        # The blocks without an id pair, in order, with the entries left without one
        # (as tool_calls_of pairs them).
        content = [_named_block(block, fresh) for block in content]
    update = {"tool_calls": named, "invalid_tool_calls": invalid, "content": content}
    return message.model_copy(update=update)


def repeated_call_blocks(message: BaseMessage) -> set[int]:
    """Indexes of ``message``'s content blocks that repeat a call made before them.

    A call of its ``tool_calls`` or ``invalid_tool_calls`` (by id, or by name for an
    entry without an id) or of an earlier block: the same call (see
    :func:`tool_calls_of`), which a reader counting the message counts once.
    """
    return _calls_and_repeats(message)[1]


def answerable_calls(message: BaseMessage) -> list[tuple[str, str]]:
    """The id and tool name of each tool call ``message`` makes that has an id.

    Those are the calls a result answers (:func:`call_id_of`), one entry a call: a
    message may make two calls of one id (a server that names every call ``""``),
    and each needs its result. A call without a name counts as tool ``"tool"``.
    """
    return [
        (call_id, call.get("name") or "tool")
        for call in tool_calls_of(message)
        if (call_id := call_id_of(call)) is not None
    ]


def tool_call_ids(message: BaseMessage) -> set[str]:
    """The ids of the tool calls ``message`` makes (:func:`answerable_calls`), ``""`` included."""
    return {call_id for call_id, _ in answerable_calls(message)}


def answered_call(message: BaseMessage, open_calls: Sequence[tuple[str, str]]) -> int | None:
    """Which of ``open_calls`` ``message`` answers, if it is a result of one.

    A ``ToolMessage`` answers the first open call of its ``tool_call_id``. The
    older shapes of a result name no call id: a ``FunctionMessage`` (or a
    ``ChatMessage`` "function") answers the first open call of its tool's name, a
    ``ChatMessage`` "tool", which names neither, the first open call.

    Args:
        message: A message that follows the calls.
        open_calls: The calls still waiting for a result, in call order, as
            :func:`answerable_calls` gives them.

    Returns:
        The index of the call answered in ``open_calls``, or ``None``.
    """
    if isinstance(message, ToolMessage):
        wanted: str | None = message.tool_call_id
        key = 0
    elif (role := role_of(message)) == "function":
        wanted, key = message.name, 1
    elif role == "tool":
        return 0 if open_calls else None
    else:
        return None
    return next((i for i, call in enumerate(open_calls) if call[key] == wanted), None)


def call_text(call: ToolCall | InvalidToolCall) -> str:
    """A tool call as a reader sees it: ``name({"arg": ...})`` (an invalid call's raw args)."""
    args = json.dumps(call.get("args"), ensure_ascii=False, default=str)
    return f"{call.get('name') or 'tool'}({args})"
