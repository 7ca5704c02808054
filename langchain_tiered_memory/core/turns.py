"""What a turn is: one definition for the archive, the window and every tier.

A turn starts at a human message and runs to the next one; messages before the
first human message form a turn of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

_ROLE_OF_TYPE = {
    "HumanMessageChunk": "human",
    "AIMessageChunk": "ai",
    "ToolMessageChunk": "tool",
    "SystemMessageChunk": "system",
    "FunctionMessageChunk": "function",
    "ChatMessageChunk": "chat",
}


def role_of(message: BaseMessage) -> str:
    """The archive's role column for a message (chunks count as their full type)."""
    return _ROLE_OF_TYPE.get(message.type, message.type)


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
            with an AI, tool or system message.
    """
    roles = roles_of(messages)
    starts = turn_starts(roles)
    bounds = zip(starts, [*starts[1:], len(messages)][: len(starts)], strict=True)
    return [
        list(messages[start:end])
        for start, end in bounds
        if keep_leading or roles[start] == "human"
    ]
