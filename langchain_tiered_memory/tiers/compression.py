"""Real-time compression before each LLM call (the ERP design's first layer).

When the prompt that will be sent (messages, system prompt and tool schemas) passes
``compress_threshold`` tokens, everything but the last ``preserve_count`` messages
is replaced by one structured summary that needs no LLM (after claw-code's
``compact.rs``); if the preserved tail alone keeps it over, whole oldest turns of
the tail are summarised too, down to the last turn. Level 2: still over
``force_delete_threshold``, the oldest messages of the last turn are deleted (and
counted). Level 3: over ``error_threshold``, a :class:`ContextOverflowError` says to
start a new session. No cut separates a tool result from the AI message that
called it, and a cut inside a turn keeps the question that opened it (every user
message of the run that opens it), so the prompt always has a user message. A
compression that does not make the prompt smaller is not used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import (
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_tiered_memory.core.prompts import CompressionLabels, Prompts, prompts_for
from langchain_tiered_memory.core.turns import (
    answerable_calls,
    answered_call,
    is_system,
    role_of,
    roles_of,
    tool_calls_of,
)
from langchain_tiered_memory.core.turns import turn_starts as core_turn_starts
from langchain_tiered_memory.text.lexical import cjk_share
from langchain_tiered_memory.text.tokens import TokenCounter, resolve_token_counter

SUMMARY_KEY = "tiered_memory_summary"
#: Roles of a tool's result: a ToolMessage's, and a FunctionMessage's or a ChatMessage
#: "tool"'s (those name no call id).
RESULT_ROLES = frozenset({"tool", "function"})
MAX_SEEN_OUTPUTS = 512  # tool-output keys remembered across re-compressions
#: Tool names the summary lists (the latest) and characters per name. A name comes
#: from the model (an invalid call can name anything): unbounded, the summary
#: itself could outgrow the budget it is there to meet.
MAX_TOOL_NAMES = 32
TOOL_NAME_CHARS = 64
PENDING_WORDS = (
    "todo",
    "next",
    "pending",
    "follow up",
    "remaining",
    "待",
    "下一步",
    "还需",
    "未完成",
)


class ContextOverflowError(ValueError):
    """The prompt is too large even after compression: start a new session.

    Attributes:
        estimated_tokens: The prompt's size after every compression level.
        limit: The error threshold it passed.
    """

    def __init__(
        self, estimated_tokens: int, limit: int, language: str = "en", advice: str | None = None
    ) -> None:
        self.estimated_tokens = estimated_tokens
        self.limit = limit
        if advice is None:
            advice = prompts_for(language).compression.overflow_advice
        super().__init__(
            f"the prompt needs about {estimated_tokens} tokens after compression, over the "
            f"limit of {limit}. {advice}"
        )


@dataclass
class _Digest:
    """What a summary knows; stored on the summary message so it can be flattened."""

    user: int = 0
    ai: int = 0
    tool: int = 0
    #: Messages of other roles (a ChatMessage "critic", a system message mid-way).
    other: int = 0
    tools: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    repeats: int = 0
    omitted: int = 0
    dropped: int = 0
    seen_outputs: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.user + self.ai + self.tool + self.other


def _text(message: BaseMessage) -> str:
    text = message.text
    return text if isinstance(text, str) else str(message.content)


def _short(text: str, limit: int) -> str:
    # Only a prefix is normalised: tool outputs can be 150k characters.
    head = " ".join(text[: 4 * limit].split())
    return head if len(head) <= limit and len(text) <= 4 * limit else head[: limit - 1] + "…"


def _add_tool(digest: _Digest, name: str) -> None:
    """List a tool in the summary once, its name cut to :data:`TOOL_NAME_CHARS`."""
    name = _short(name, TOOL_NAME_CHARS)
    if name not in digest.tools:
        digest.tools.append(name)


def _output_key(name: str, text: str) -> str:
    """A short key for 'same tool, same first 100 characters' (kept across summaries)."""
    return hashlib.sha1(f"{name}\x1f{text[:100]}".encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _is_summary(message: BaseMessage) -> bool:
    return isinstance(message, SystemMessage) and SUMMARY_KEY in message.additional_kwargs


def turn_starts(messages: Sequence[BaseMessage]) -> list[int]:
    """Indexes of the human messages that open turns (:func:`core.turns.turn_starts`)."""
    roles = roles_of(messages)
    return [i for i in core_turn_starts(roles) if roles[i] == "human"]


def safe_cut(messages: Sequence[BaseMessage], index: int) -> int:
    """Move ``index`` back until ``messages[index:]`` has no orphaned tool result.

    The kept part then never starts with a ``ToolMessage`` and every kept tool
    result has its calling ``AIMessage`` kept too.
    """
    index = max(0, min(index, len(messages)))
    # A FunctionMessage or a ChatMessage "tool" is a result as well.
    while 0 < index < len(messages) and role_of(messages[index]) in RESULT_ROLES:
        index -= 1
    return index


def _question_length(messages: Sequence[BaseMessage]) -> int:
    """How many human messages open ``messages``: the question of the turn they start.

    A turn opens with a run of human messages (:func:`core.turns.turn_starts`): a
    question left unanswered (its model call failed) and the one sent after it are
    one question, and the latest of them is the one to answer.
    """
    roles = roles_of(messages)
    return next((i for i, role in enumerate(roles) if role != "human"), len(roles))


def _question(messages: Sequence[BaseMessage], cut: int) -> range | None:
    """The part before ``cut`` of the question (:func:`_question_length`) of ``cut``'s turn.

    ``None`` when ``cut`` starts a turn (or the messages): nothing of it is folded.
    """
    starts = [i for i in turn_starts(messages) if i <= cut]
    if cut >= len(messages) or not starts or starts[-1] == cut:
        return None
    return range(starts[-1], starts[-1] + _question_length(messages[starts[-1] : cut]))


def validate_conversation(messages: Sequence[BaseMessage]) -> None:
    """Raise ``ValueError`` unless chat providers would accept ``messages``.

    Checks: system messages (a ``ChatMessage`` "system" or "developer" too) only at
    the start; every tool result answers a tool
    call of the AI message before it; every tool call is answered before the next
    human or AI message (a ``FunctionMessage`` or a ``ChatMessage`` "tool" right
    after it answers it too: :func:`~langchain_tiered_memory.core.turns.answered_call`).
    """
    seen_other = False
    # (id, tool name) of each call not answered yet: a message may make two of one id.
    open_calls: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if is_system(message):
            if seen_other:
                msg = f"message {index} is a system message after the conversation started"
                raise ValueError(msg)
            continue
        seen_other = True
        answered = answered_call(message, open_calls)
        if answered is not None:
            del open_calls[answered]
            continue
        if isinstance(message, ToolMessage):
            msg = f"message {index} answers tool call {message.tool_call_id!r}, not open"
            raise ValueError(msg)
        if open_calls:
            ids = sorted(call_id for call_id, _ in open_calls)
            msg = f"message {index} comes before tool calls {ids} were answered"
            raise ValueError(msg)
        open_calls = answerable_calls(message)


class ContextCompressor(Runnable[Any, list[BaseMessage]]):
    """Structured, LLM-free compression of a prompt that grew too large.

    Use it as a function, ``compressor.compress(messages)``, or as a Runnable in
    front of a model: ``prompt | compressor | llm``.

    Args:
        compress_threshold: Compress above this many tokens.
        preserve_count: Messages kept verbatim at the end (moved back, if needed,
            so a tool result keeps its call).
        force_delete_threshold: After compression, drop whole oldest turns of the
            kept messages while above this.
        error_threshold: Raise :class:`ContextOverflowError` above this.
        token_counter: Counts a message list; default
            :func:`~langchain_tiered_memory.estimate_tokens`.
        tools: Tool schemas bound to the model, counted in the prompt's size.
        language: Labels of the summary; ``None`` follows the conversation.
        prompts: The summary's labels (a
            :class:`~langchain_tiered_memory.core.prompts.Prompts`) whatever the
            conversation's language; ``None`` picks them by ``language``.
        timeline_entries: Timeline entries kept (the first two and the latest).
        entry_chars: Characters per timeline entry.
    """

    def __init__(
        self,
        *,
        compress_threshold: int = 60_000,
        preserve_count: int = 4,
        force_delete_threshold: int = 100_000,
        error_threshold: int = 120_000,
        token_counter: TokenCounter | None = None,
        tools: Sequence[Any] | None = None,
        language: Literal["en", "zh"] | None = None,
        prompts: Prompts | None = None,
        timeline_entries: int = 10,
        entry_chars: int = 160,
    ) -> None:
        if not 0 < compress_threshold <= force_delete_threshold <= error_threshold:
            msg = (
                "thresholds must satisfy 0 < compress_threshold <= force_delete_threshold "
                f"<= error_threshold, got {compress_threshold}, {force_delete_threshold}, "
                f"{error_threshold}"
            )
            raise ValueError(msg)
        if preserve_count < 1:
            msg = f"preserve_count must be at least 1, got {preserve_count}"
            raise ValueError(msg)
        if language not in (None, "en", "zh"):
            msg = f"language must be 'en', 'zh' or None, got {language!r}"
            raise ValueError(msg)
        self.compress_threshold = compress_threshold
        self.preserve_count = preserve_count
        self.force_delete_threshold = force_delete_threshold
        self.error_threshold = error_threshold
        self.count_tokens = resolve_token_counter(token_counter)
        self.tools = list(tools or [])
        self.language = language
        self.prompts = prompts
        self.timeline_entries = max(3, timeline_entries)
        self.entry_chars = entry_chars
        self._tool_tokens = self._count_tools(self.tools)

    def _labels(self, language: str) -> CompressionLabels:
        return (self.prompts or prompts_for(language)).compression

    # -- measuring ------------------------------------------------------------

    def _count_tools(self, tools: Sequence[Any]) -> int:
        if not tools:
            return 0
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        return self.count_tokens([SystemMessage(json.dumps(schemas, ensure_ascii=False))])

    def measure(self, messages: Sequence[BaseMessage]) -> int:
        """Tokens of the prompt that will be sent: messages plus tool schemas."""
        return self.count_tokens(list(messages)) + self._tool_tokens

    # -- compressing ----------------------------------------------------------

    def compress(self, messages: Sequence[BaseMessage] | PromptValue) -> list[BaseMessage]:
        """Return ``messages`` unchanged if small enough, else compressed.

        Raises:
            ContextOverflowError: If even the compressed prompt is over
                ``error_threshold``.
        """
        messages = _as_messages(messages)
        if self.measure(messages) <= self.compress_threshold:
            return messages
        language = self.language or ("zh" if cjk_share(_sample(messages)) > 0.2 else "en")
        head_end = 0
        while head_end < len(messages) and isinstance(messages[head_end], SystemMessage):
            head_end += 1
        earlier = [m for m in messages[:head_end] if _is_summary(m)]
        head = [m for m in messages[:head_end] if not _is_summary(m)]
        body = list(messages[head_end:])
        cut = safe_cut(body, len(body) - self.preserve_count)
        # Still over: fold whole oldest turns of the preserved tail into the summary
        # too (a 150k-character tool result), down to the last turn.
        later = [i for i in turn_starts(body) if i > cut]
        # A summary has a size of its own: folding a few short messages can make the
        # prompt larger, and a larger prompt must not reach level 2 or 3.
        best, best_size = messages, self.measure(messages)
        while True:
            result = self._assemble(head, earlier, body, cut, language)
            size = self.measure(result)
            if size < best_size:
                best, best_size = result, size
            if not later or size <= self.compress_threshold:
                break
            cut = later.pop(0)
        return self._enforce(best, language)

    def _assemble(
        self,
        head: list[BaseMessage],
        earlier: list[BaseMessage],
        body: list[BaseMessage],
        cut: int,
        language: str,
        dropped: int = 0,
    ) -> list[BaseMessage]:
        if cut == 0 and not earlier and not dropped:
            return head + body  # nothing to summarise: only the levels below apply
        folded, kept = body[:cut], body[cut:]
        question = _question(body, cut)
        if question is not None:
            # Cut inside a turn: keep the question that opened it, so the prompt
            # still has a user message (some providers require one first).
            folded = body[: question.start] + body[question.stop : cut]
            kept = [*body[question.start : question.stop], *kept]
        digest = self._digest(folded, earlier, language)
        digest.dropped += dropped
        return [*head, self._summary_message(digest, language), *kept]

    def _enforce(self, messages: list[BaseMessage], language: str) -> list[BaseMessage]:
        """Level 2: force-delete the oldest messages of the last turn; level 3: refuse.

        Deleted messages are counted in the summary, never cut so that a tool
        result loses its call, and the last message always stays.
        """
        size = self.measure(messages)
        if size > self.force_delete_threshold:
            start = next(
                (i for i, m in enumerate(messages) if not isinstance(m, SystemMessage)),
                len(messages),
            )
            head = [m for m in messages[:start] if not _is_summary(m)]
            earlier = [m for m in messages[:start] if _is_summary(m)]
            tail = messages[start:]
            # Earlier turns are folded; the last turn's question stays (see _assemble)
            # and the oldest messages after it go. No tail (system messages only):
            # nothing to delete, level 3 decides.
            last = ([0, *turn_starts(tail)])[-1]
            first = last + _question_length(tail[last:])
            for cut in [
                # Only a ToolMessage names the call it answers: a FunctionMessage or a
                # ChatMessage "tool" may be deleted without what came before it.
                i
                for i in range(first + 1, len(tail))
                if not isinstance(tail[i], ToolMessage)
            ]:
                body = tail[:first] + tail[cut:]
                candidate = self._assemble(head, earlier, body, last, language, dropped=cut - first)
                candidate_size = self.measure(candidate)
                if candidate_size < size:  # the summary's own size can outweigh a deletion
                    messages, size = candidate, candidate_size
                if candidate_size <= self.force_delete_threshold:
                    break
        if size > self.error_threshold:
            advice = self._labels(language).overflow_advice
            raise ContextOverflowError(size, self.error_threshold, language, advice)
        return messages

    def _digest(
        self, messages: Sequence[BaseMessage], earlier: Sequence[BaseMessage], language: str
    ) -> _Digest:
        digest = _Digest()
        for summary in earlier:  # flatten: fold the old numbers in, do not nest text
            old = _Digest(**summary.additional_kwargs[SUMMARY_KEY])
            digest.user += old.user
            digest.ai += old.ai
            digest.tool += old.tool
            digest.other += old.other
            digest.repeats += old.repeats
            digest.omitted += old.omitted
            digest.dropped += old.dropped
            for name in old.tools:
                _add_tool(digest, name)
            digest.requests.extend(old.requests)
            digest.timeline.extend(old.timeline)
            digest.pending.extend(old.pending)
            digest.seen_outputs.extend(old.seen_outputs)
        roles = self._labels(language).roles
        seen_outputs = set(digest.seen_outputs)
        tool_names: dict[str, str] = {}
        for message in messages:
            text = _text(message)
            role = role_of(message)  # a ChatMessage counts as the role it names
            if role == "human":
                digest.user += 1
                digest.requests.append(_short(text, self.entry_chars))
                label = roles["human"]
            elif role == "ai":
                digest.ai += 1
                calls = tool_calls_of(message)
                names = [call.get("name") or "tool" for call in calls]
                for call, name in zip(calls, names, strict=True):
                    tool_names[call.get("id") or ""] = name
                    _add_tool(digest, name)
                if not text and calls:
                    text = "→ " + ", ".join(names)
                label = roles["ai"]
            elif role in RESULT_ROLES:  # a FunctionMessage, a ChatMessage "tool" too
                digest.tool += 1
                # A ChatMessage "tool" names neither its tool nor its call: no tool
                # is listed for it, and its output is no repeat of another tool's.
                call_id = getattr(message, "tool_call_id", "")
                tool = message.name or tool_names.get(call_id)
                label = roles["tool"]
                if tool:
                    _add_tool(digest, tool)
                    key = _output_key(tool, text)
                    if key in seen_outputs:
                        digest.repeats += 1
                        continue
                    seen_outputs.add(key)
                    digest.seen_outputs.append(key)
                    label = f"{roles['tool']}({tool})"
            else:
                digest.other += 1
                label = roles.get(role, role)
            if role not in RESULT_ROLES and any(
                word in text[:2000].lower() for word in PENDING_WORDS
            ):
                digest.pending.append(_short(text, self.entry_chars))
            digest.timeline.append(_short(f"{label}: {text}", self.entry_chars))
        digest.tools = digest.tools[-MAX_TOOL_NAMES:]
        digest.requests = digest.requests[-3:]
        digest.pending = digest.pending[-3:]
        digest.seen_outputs = digest.seen_outputs[-MAX_SEEN_OUTPUTS:]
        if len(digest.timeline) > self.timeline_entries:
            keep_tail = self.timeline_entries - 2
            digest.omitted += len(digest.timeline) - self.timeline_entries
            digest.timeline = digest.timeline[:2] + digest.timeline[-keep_tail:]
        return digest

    def _summary_message(self, digest: _Digest, language: str) -> SystemMessage:
        labels = self._labels(language)
        lines = [
            labels.title,
            labels.scope,
            labels.counts.format(
                total=digest.total, user=digest.user, ai=digest.ai, tool=digest.tool
            ),
        ]
        if digest.tools:
            lines.append(labels.tools.format(tools=", ".join(digest.tools)))
        if digest.requests:
            lines.append(labels.requests)
            lines.extend(f"    • {r}" for r in digest.requests)
        lines.append(labels.timeline)
        entries = [f"    • {e}" for e in digest.timeline]
        if digest.omitted:
            entries.insert(2, labels.omitted.format(n=digest.omitted))
        lines.extend(entries)
        if digest.repeats:
            lines.append(labels.repeats.format(n=digest.repeats))
        if digest.dropped:
            lines.append(labels.dropped.format(n=digest.dropped))
        if digest.pending:
            lines.append(labels.pending)
            lines.extend(f"    • {p}" for p in digest.pending)
        return SystemMessage("\n".join(lines), additional_kwargs={SUMMARY_KEY: vars(digest)})

    # -- Runnable -------------------------------------------------------------

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        """Compress a prompt value or message list (see :meth:`compress`)."""
        return self._call_with_config(self.compress, input, config)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        """Async :meth:`invoke` (compression is CPU-only: no thread hop)."""
        return self.invoke(input, config, **kwargs)


def _as_messages(value: Any) -> list[BaseMessage]:
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return [HumanMessage(value)]
    return convert_to_messages(value)


def _sample(messages: Sequence[BaseMessage]) -> str:
    return " ".join(_text(m)[:200] for m in messages if not isinstance(m, ToolMessage))[:4000]
