"""What goes into long-term memory from one finished turn: the v3 design's prompt."""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory.core.turns import role_of
from langchain_tiered_memory.text.lexical import cjk_share

PROMPTS = {
    "zh": (
        "总结以下对话的核心语义。\n"
        "保留任务目标、问题描述、解决方案、重要约束；\n"
        "忽略礼貌用语、重复内容、确认性回复；\n"
        "如果没有任何实质性内容，只返回 NONE。\n\n"
        "{conversation}\n\n总结："
    ),
    "en": (
        "Summarise the core meaning of the conversation below.\n"
        "Keep task goals, problem descriptions, solutions and important constraints;\n"
        "drop courtesies, repetition and confirmations;\n"
        "if there is nothing of substance, answer only NONE.\n\n"
        "{conversation}\n\nSummary:"
    ),
}
LABELS = {"zh": ("用户", "AI"), "en": ("User", "AI")}
_NONE = re.compile(r"^\W*none\W*$", re.IGNORECASE)


def _text(message: BaseMessage) -> str:
    return message.text if isinstance(message.text, str) else str(message.content)


def detect_language(messages: Sequence[BaseMessage]) -> str:
    """``"zh"`` when the turn is mostly Chinese, else ``"en"``."""
    sample = " ".join(_text(m) for m in messages if role_of(m) in ("human", "ai"))[:2000]
    return "zh" if cjk_share(sample) > 0.2 else "en"


def format_turn(messages: Sequence[BaseMessage], language: str) -> str:
    """The turn as ``User: ...`` / ``AI: ...`` lines (tool traffic left out).

    A message's ``name``, when set, replaces the generic label, so who said what
    survives into the memory.
    """
    user, ai = LABELS[language]
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


def extraction_prompt(messages: Sequence[BaseMessage], language: str | None = None) -> str:
    """The v3 extraction prompt for a turn, in the turn's language by default."""
    language = language or detect_language(messages)
    return PROMPTS[language].format(conversation=format_turn(messages, language))


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
