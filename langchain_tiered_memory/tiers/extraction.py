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
# An update's first line that says nothing changed starts with one of these ("NONE",
# "N/A — no update needed", "无需更新", "No, ...").
_NO_CHANGE_HEAD = re.compile(
    r"[\W_]*+(?:none|n/?a|not\s+applicable|no\s+(?:changes?|updates?|new\s+information)"
    r"(?:\s+needed)?|nothing\s+(?:new|changed|to\s+update)|unchanged|same\s+as\s+before"
    r"|没有变化|没有更新|无变化|无需更新|保持不变|未变化|不变|未变|no|没有|无)(?![\w/])",
    re.IGNORECASE,
)
# A remark that only says so too: "(nothing changed since 2023)", "— still valid".
_NOTHING_CHANGED = re.compile(
    r"nothing\s+(?:new|changed|to\s+(?:update|change))|no\s+(?:changes?|updates?|new)\b"
    r"|unchanged|\bsame\b|as\s+(?:before|is)\b|see\s+above|up\s+to\s+date"
    r"|not\s+(?:changed|relevant)|still\s+(?:valid|correct|accurate|current|true|applies)"
    r"|不变|无变化|没有变化|没变|未变|保持|相同|一致|仍然(?:有效|正确|准确)|同上|无需更新|没有更新",
    re.IGNORECASE,
)
# Words by which a remark says more than that: "but the contact is Bob", "改为".
_MORE = re.compile(
    r"\b(?:but|except|however|instead|now|changed\s+to|no\s+longer|any\s*more|new\s+\w+\s+(?:is|are))\b"
    r"|但|不过|除了|现在|改为|改成|变为|变成|换成|变更|调整|不再|不一致",
    re.IGNORECASE,
)
# Dates in a remark ("since 2023", "as of 5 May", "2023年5月"), which say nothing new.
_DATES = re.compile(
    r"\b(?:19|20)\d\d\b|\d{1,4}\s*[年月日号]"
    r"|\b\d{1,2}(?:st|nd|rd|th)?\s+(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)"
    r"|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+\d{1,2}\b",
    re.IGNORECASE,
)


def _nothing_changed(line: str) -> bool | None:
    """Whether an update's first line says nothing changed about its memory.

    Returns:
        ``None`` if it states a new value (it does not start by saying nothing
        changed, or its words go on: "None of our suppliers ..."); ``True`` if it
        says nothing more, or only that nothing changed ("NONE (nothing changed
        since 2023)", "No, it is still accurate"); ``False`` if it says nothing
        changed and then more ("N/A, but the contact is now Bob", "No, ACME now
        pays net sixty"). Either way such a line supersedes nothing: what it says
        more is kept as a memory of its own, so a misread remark never buries the
        memory, nor is a new fact in it lost.
    """
    found = _NO_CHANGE_HEAD.match(line)
    if found is None:
        return None
    rest = line[found.end() :]
    if rest[:1].isspace() and rest.lstrip()[:1].isalnum():
        return None  # the words go on: "None of our suppliers ..."
    if not any(map(str.isalnum, rest)):
        return True
    only = _NOTHING_CHANGED.search(rest) and not _MORE.search(rest)
    return bool(only) and not re.search(r"[\d@]", _DATES.sub(" ", rest))


# Line ends as models write them: Windows, old Mac, Unicode line separators.
_LINE_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x85]")
# A fence line of a code block ("```", "```text"): markup, not memory.
_FENCE = re.compile(r"^[ \t]*+```[\w-]*+[ \t]*+$\n?", re.MULTILINE)
# Ids as this package makes them: 32 hex digits.
_OUR_ID = re.compile(r"[0-9a-fA-F]{32}")
# The head of an UPDATE answer, as models write it: after a list marker or markdown,
# the keyword, the id (bracketed, quoted or named: "[id]", "<id>", "【id】",
# "memory id", "#id"), then a colon, a dash, an arrow or a line break; "[id] text", as
# the prompt lists memories, needs none. Possessive quantifiers: a long run of "*" or
# spaces that fits no form fails at once, not at every split.
_NAME = r"(?:(?:memory\s+id|memory|id)\s*+[:=\#]?+\s*+|\#)?+"
# Read at the start of every line: an answer may update several memories, a line each.
# The markup before the keyword stays on its line, so a run of blank lines is read once.
_UPDATE = re.compile(
    rf"""^(?:[ \t\u00a0\u3000*_`\#>]|[-•+]\s|\d{{1,3}}[.)]\s|\d{{1,3}}、|\(\d{{1,3}}\)\s)*+
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
    line: the memory's text is what the updates say (and any summary around
    them), and it supersedes each of their ids. Only an id among ``offered`` (the
    memories of the turn's own scope that the prompt listed; matched whatever its
    case) is applied. Any other id (made up, another user's, text that looks like
    SQL) is refused: its new text is kept, and nothing outside the scope is
    touched. A refused id is read as a head only at the answer's start or in the
    package's own id form, so a summary line "UPDATE orders_2024 SET ..." stays as
    written. A summary that merely starts with "Update ...:" or "更新 ..." (not the
    prompt's upper-case keyword, no offered id) is kept whole. An update whose first
    line says nothing changed (``NONE``, ``N/A``, ``unchanged``, ``无变化``) applies
    nothing; the lines after it are kept as summary.

    Returns:
        The text to store (``None``: nothing, when every update says nothing
        changed) and the offered ids it supersedes, in the answer's order.

    Raises:
        ValueError: If an update of an offered id has no new text (a failed
            attempt: retried, then the raw turn is stored).
    """
    answer, text = text, _FENCE.sub("", _LINE_BREAKS.sub("\n", text))
    by_case = {each.lower(): each for each in offered}
    start = len(text) - len(text.lstrip(_MARKUP))  # where the answer's words start
    heads: list[tuple[re.Match[str], str | None]] = []
    for found in _UPDATE.finditer(text):
        keyword, memory_id = found.group(1), found.group(3)
        known = by_case.get(memory_id.lower())
        # Only the prompt's upper-case keyword with something that looks like an id, or
        # an offered id, makes it an UPDATE: a summary may start "Update pricing:",
        # "UPDATE ACME: the IBAN is now ..." or "更新 付款条件".
        made_up = keyword == "UPDATE" and (
            _OUR_ID.fullmatch(memory_id)
            or (found.start() <= start and _ID_LIKE.fullmatch(memory_id))
        )
        if known is not None or made_up:
            heads.append((found, known))
    if not heads:
        return answer, ()
    parts = [text[: heads[0][0].start()].strip(_MARKUP)]
    updates: list[str] = []
    refused: list[str] = []
    ends = [found.start() for found, _ in heads[1:]] + [len(text)]
    for (found, known), end in zip(heads, ends, strict=True):
        new_text = text[found.end() : end].strip(_MARKUP)
        if not new_text:
            if known is None:
                continue  # a made-up id without text: nothing to keep
            msg = f"the extractor answered UPDATE {found.group(3)[:80]!r} without the new text"
            raise ValueError(msg)
        first_line, _, rest = new_text.partition("\n")
        # Only marks ("--", "…") say nothing either; "✅" over a text is that text's.
        said = _nothing_changed(first_line.strip(_MARKUP))
        if said is not None or not any(map(str.isalnum, new_text)):
            # Nothing changed about it: it stays. A summary may follow, and a remark
            # that says more is kept beside it, superseding nothing.
            parts.append(new_text if said is False else rest.strip(_MARKUP))
            continue
        if known is None:
            refused.append(found.group(3)[:80])
        elif known not in updates:
            updates.append(known)
        parts.append(new_text)
    if refused:
        logger.warning(
            "the extractor asked to update %d memories it was not offered (%r...); "
            "their text is stored as a new memory",
            len(refused),
            refused[0],
        )
    kept = "\n".join(dict.fromkeys(part for part in parts if part))  # once each, in order
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
