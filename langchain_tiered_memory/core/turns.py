"""What a turn is: one definition for the archive, the window and every tier.

A turn starts at a human message and runs to the next one; messages before the
first human message form a turn of their own.
"""

from __future__ import annotations

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
