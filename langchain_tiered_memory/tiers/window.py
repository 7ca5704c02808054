"""The window tier: the last K turns under a token budget, cut on turn boundaries."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage, ToolMessage

from langchain_tiered_memory.core.turns import split_turns, tool_call_ids

# split_turns lives in core.turns; it is re-exported here for its older importers.
__all__ = ["drop_orphan_tool_messages", "select_window", "split_turns"]


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
    starts with an AI, tool or system message.

    Turns are dropped whole, oldest first. As with ``trim_messages``, the budget is
    a hard limit: if the newest turn alone is over it, the window is empty.
    """
    turns = split_turns(messages)[-max_turns:] if max_turns > 0 else []
    kept: list[list[BaseMessage]] = []
    total = 0
    for turn in reversed(turns):
        turn = drop_orphan_tool_messages(turn)
        if max_tokens is not None:
            total += count_tokens(turn)
            if total > max_tokens:
                break
        kept.append(turn)
    return [message for turn in reversed(kept) for message in turn]
