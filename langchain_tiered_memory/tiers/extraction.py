"""What goes into long-term memory from one finished turn: the v3 design's prompt.

The prompt and the speaker labels are a :class:`~langchain_tiered_memory.core.prompts.Prompts`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory.core.prompts import Prompts, prompts_for
from langchain_tiered_memory.core.turns import role_of
from langchain_tiered_memory.text.lexical import cjk_share

_NONE = re.compile(r"^\W*none\W*$", re.IGNORECASE)


def _text(message: BaseMessage) -> str:
    return message.text if isinstance(message.text, str) else str(message.content)


def detect_language(messages: Sequence[BaseMessage]) -> str:
    """``"zh"`` when the turn is mostly Chinese, else ``"en"``."""
    sample = " ".join(_text(m) for m in messages if role_of(m) in ("human", "ai"))[:2000]
    return "zh" if cjk_share(sample) > 0.2 else "en"


def turn_prompts(
    messages: Sequence[BaseMessage], language: str | None = None, prompts: Prompts | None = None
) -> Prompts:
    """The prompts for a turn: ``prompts`` if given, else ``language``'s or the turn's."""
    if prompts is not None:
        return prompts
    return prompts_for(language or detect_language(messages))


def format_turn(messages: Sequence[BaseMessage], prompts: Prompts) -> str:
    """The turn as ``User: ...`` / ``AI: ...`` lines (tool traffic left out).

    The labels are ``prompts.extraction_roles``; a message's ``name``, when set,
    replaces the generic label, so who said what survives into the memory.
    """
    user, ai = prompts.extraction_roles["human"], prompts.extraction_roles["ai"]
    lines = []
    for message in messages:
        text = _text(message).strip()
        if not text:
            continue
        if isinstance(message, HumanMessage) or role_of(message) == "human":
            lines.append(f"{message.name or user}: {text}")
        elif isinstance(message, AIMessage) or role_of(message) == "ai":
            lines.append(f"{message.name or ai}: {text}")
    return "\n".join(lines)


def extraction_prompt(messages: Sequence[BaseMessage], prompts: Prompts) -> str:
    """The v3 extraction prompt (``prompts.extraction``) for a turn."""
    return prompts.extraction.format(conversation=format_turn(messages, prompts))


def parse_extraction(answer: BaseMessage | str) -> str | None:
    """The memory text of an extractor's answer; ``None`` when it said ``NONE``.

    Raises:
        ValueError: If the answer is empty or not text (a garbage answer counts as
            a failed attempt, so it is retried and finally stored raw).
    """
    text = answer if isinstance(answer, str) else answer.content
    if not isinstance(text, str):
        text = answer.text if isinstance(answer, BaseMessage) else ""
    text = text.strip()
    if not text:
        msg = "the extractor returned an empty answer"
        raise ValueError(msg)
    if _NONE.match(text):
        return None
    return text
