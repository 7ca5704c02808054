"""What goes into long-term memory from one finished turn: the v3 design's prompt.

The prompt and the speaker labels are a :class:`~langchain_tiered_memory.core.prompts.Prompts`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory.core.finish import require_whole
from langchain_tiered_memory.core.prompts import Prompts, prompts_for
from langchain_tiered_memory.core.turns import role_of
from langchain_tiered_memory.text.lexical import cjk_share
from langchain_tiered_memory.text.tokens import (
    check_instructions,
    cut_to_tokens,
    instruction_tokens,
    room_for,
)

logger = logging.getLogger(__name__)

_NONE = re.compile(r"^\W*none\W*$", re.IGNORECASE)
# The head of an UPDATE answer, as models write it: after a list marker or markdown,
# the keyword, the id (bracketed, quoted or named: "[id]", "<id>", "【id】",
# "memory id", "#id"), then a colon, a dash, an arrow or a line break; "[id] text", as
# the prompt lists memories, needs none. Possessive quantifiers: a long run of "*" or
# spaces that fits no form fails at once, not at every split.
_NAME = r"(?:(?:memory\s+id|memory|id)\s*+[:=\#]?+\s*+|\#)?+"
# Read at the start of every line: an answer may update several memories, a line each.
# The markup before the keyword stays on its line, so a run of blank lines is read once.
_UPDATE = re.compile(
    rf"""^(?:[ \t*_`\#>]|[-•]\s|\d{{1,3}}[.)]\s)*+
    (update|更新)
    (?:[\s*_`"'“”:：]++|(?=[\[<(【（「]))
    {_NAME}
    ([\[<(【（「"'`*]*+)
    {_NAME}
    ([^\s:：\]>)】）」"'`*,，.;；]{{1,200}}+)
    [\]>)】）」"'`*]*+
    (?:[ \t]*+(?:[:：=.,;；，]++>?+|[-–—]++>?+|→|\n)|(?<=[\]>)】）」])[ \t]++)
    """,
    re.IGNORECASE | re.VERBOSE | re.MULTILINE,
)
_MARKUP = "*_`> \t\n"
# What a made-up memory id looks like (ours are 32 hex digits): letters and digits, or
# a long run of hex.
_ID_LIKE = re.compile(r"(?=[\w-]*\d)[\w-]{6,}|[0-9a-fA-F]{16,}")
#: Memory texts shown to the extractor are cut to this many characters each.
NEIGHBOUR_CHARS = 500


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


def _template(prompts: Prompts, memories: Sequence[tuple[str, str]]) -> tuple[str, dict[str, str]]:
    """The extraction template for a turn, and its fields other than the conversation."""
    if not memories:
        return prompts.extraction, {}
    listed = "\n".join(
        f"[{memory_id}] {' '.join(text.split())[:NEIGHBOUR_CHARS]}" for memory_id, text in memories
    )
    return prompts.extraction_update, {"memories": listed}


def check_extraction_prompts(prompts: Prompts, max_tokens: int) -> None:
    """Refuse prompts whose instructions leave a turn less than half of ``max_tokens``.

    Raises:
        ValueError: Naming the prompt and the budget.
    """
    check_instructions("extraction", prompts.extraction, {}, max_tokens)
    check_instructions("extraction_update", prompts.extraction_update, {"memories": ""}, max_tokens)


def offerable(
    prompts: Prompts, memories: Sequence[tuple[str, str]], max_tokens: int
) -> list[tuple[str, str]]:
    """The nearest of ``memories`` that leave the turn at least half of ``max_tokens``."""
    kept = list(memories)
    while kept and instruction_tokens(*_template(prompts, kept)) > max_tokens // 2:
        kept.pop()
    return kept


def extraction_prompt(
    conversation: str,
    prompts: Prompts,
    memories: Sequence[tuple[str, str]] = (),
    max_tokens: int | None = None,
) -> str:
    """The v3 extraction prompt for a turn.

    Args:
        conversation: The turn as :func:`format_turn` writes it.
        prompts: Its prompts: ``prompts.extraction``, or with ``memories``
            ``prompts.extraction_update``, which offers them for ``UPDATE``.
        memories: ``(id, text)`` of the scope's memories the model may update
            (see :func:`offerable` for those that fit a budget).
        max_tokens: The prompt's budget (:func:`~langchain_tiered_memory.text.tokens.exact_tokens`).
            A turn too long for it is cut in the middle, its start and end kept;
            the archive keeps it whole.
    """
    template, fields = _template(prompts, memories)
    if max_tokens is not None:
        conversation = cut_to_tokens(conversation, max(room_for(template, fields, max_tokens), 0))
    return template.format(conversation=conversation, **fields)


def parse_update(text: str, offered: Collection[str]) -> tuple[str | None, tuple[str, ...]]:
    """A memory text and the ids it updates (none: a new memory).

    Every line that starts ``UPDATE <id>:`` starts an update, up to the next such
    line: the memory's text is what the updates say (and any summary before
    them), and it supersedes each of their ids. Only an id among ``offered`` (the
    memories of the turn's own scope that the prompt listed; matched whatever its
    case) is applied. Any other id (made up, another user's, text that looks like
    SQL) is refused: its new text is kept, and nothing outside the scope is
    touched. A summary that merely starts with "Update ...:" or "更新 ..." (not the
    prompt's upper-case keyword, no offered id) is kept whole.

    Returns:
        The text to store (``None``: nothing, when every update says ``NONE``)
        and the offered ids it supersedes, in the answer's order.

    Raises:
        ValueError: If an UPDATE has no new text (a failed attempt: retried, then
            the raw turn is stored).
    """
    by_case = {each.lower(): each for each in offered}
    heads: list[tuple[re.Match[str], str | None]] = []
    for found in _UPDATE.finditer(text):
        keyword, memory_id = found.group(1), found.group(3)
        known = by_case.get(memory_id.lower())
        # Only the prompt's upper-case keyword with something that looks like an id, or
        # an offered id, makes it an UPDATE: a summary may start "Update pricing:",
        # "UPDATE ACME: the IBAN is now ..." or "更新 付款条件".
        if known is not None or (keyword == "UPDATE" and _ID_LIKE.fullmatch(memory_id)):
            heads.append((found, known))
    if not heads:
        return text, ()
    parts = [text[: heads[0][0].start()].strip(_MARKUP)]
    updates: list[str] = []
    ends = [found.start() for found, _ in heads[1:]] + [len(text)]
    for (found, known), end in zip(heads, ends, strict=True):
        memory_id = found.group(3)
        new_text = text[found.end() : end].strip(_MARKUP)
        if not new_text:
            msg = f"the extractor answered UPDATE {memory_id[:80]!r} without the new text"
            raise ValueError(msg)
        if _NONE.match(new_text):  # "UPDATE <id>: NONE": nothing new about it
            continue
        if known is None:
            logger.warning(
                "the extractor asked to update %r, which it was not offered; "
                "stored as a new memory",
                memory_id[:80],
            )
        elif known not in updates:
            updates.append(known)
        parts.append(new_text)
    kept = "\n".join(part for part in parts if part)
    return (kept or None), tuple(updates)


def parse_extraction(answer: BaseMessage | str) -> str | None:
    """The memory text of an extractor's answer; ``None`` when it said ``NONE``.

    Raises:
        ValueError: If the answer is empty or not text, or not whole (cut at the
            output limit or by a content filter, or a refusal: its finish reason
            says so; half a fact would be stored as a whole one). Such an answer
            counts as a failed attempt, so it is retried and finally stored raw.
    """
    if isinstance(answer, BaseMessage):
        require_whole(answer, "the extractor's answer")
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
