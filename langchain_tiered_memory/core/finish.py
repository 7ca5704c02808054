"""Why a model stopped: the provider's finish reason, and whether it means "cut off".

langchain-core 1.x does not normalise that signal: the provider's raw
``finish_reason`` / ``stop_reason`` is passed through in ``response_metadata``
(with ``generation_info`` merged in), each provider in its own words:

======================  ==========================================  ===================
provider                key in ``response_metadata``                truncated value
======================  ==========================================  ===================
OpenAI, Mistral, Groq   ``finish_reason``                           ``"length"``
OpenAI Responses API    ``incomplete_details["reason"]``            ``"max_output_tokens"``
Anthropic               ``stop_reason``                             ``"max_tokens"``
Bedrock Converse        ``stopReason``                              ``"max_tokens"``
Google (Gemini/Vertex)  ``finish_reason`` (a str or an enum)        ``"MAX_TOKENS"``
Ollama                  ``done_reason``                             ``"length"``
======================  ==========================================  ===================

Read by the chat pipeline's ``FinishReasonHandler`` (which continues a cut
answer) and by the background tiers (which must not store a cut answer).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

#: Where providers put their finish reason in ``response_metadata``.
FINISH_KEYS = ("finish_reason", "stop_reason", "done_reason", "stopReason", "finishReason")
#: Values (lower-cased) that mean "stopped at the output-token limit".
TRUNCATED_REASONS = frozenset({"length", "max_tokens", "max_output_tokens"})
#: Values (lower-cased) that mean "not a whole answer": truncated, the context
#: window exhausted (Anthropic, Bedrock), a content filter (OpenAI, Azure, Bedrock,
#: Gemini's safety and recitation stops), a refusal (Anthropic).
INCOMPLETE_REASONS = TRUNCATED_REASONS | frozenset(
    {
        "model_context_window_exceeded",
        "content_filter",
        "content_filtered",
        "guardrail_intervened",
        "safety",
        "recitation",
        "blocklist",
        "prohibited_content",
        "spii",
        "refusal",
    }
)


def _reason_text(value: Any) -> str | None:
    """A finish reason as text; enums (Gemini's ``FinishReason.MAX_TOKENS``) by name."""
    if value is None or value == "":
        return None
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def finish_reason(message: BaseMessage) -> str | None:
    """The provider's reason for ending ``message``, as text, if it gave one.

    Args:
        message: A chat model's answer (or an aggregated stream of chunks).

    Returns:
        The raw value (``"length"``, ``"max_tokens"``, ``"MAX_TOKENS"``,
        ``"stop"``...) of the first known key present, ``None`` if there is none.
    """
    metadata = message.response_metadata or {}
    for key in FINISH_KEYS:
        reason = _reason_text(metadata.get(key))
        if reason is not None:
            return reason
    details = metadata.get("incomplete_details")
    if isinstance(details, dict):
        return _reason_text(details.get("reason"))
    return None


def is_truncated(message: BaseMessage) -> bool:
    """Whether the provider says ``message`` was cut by its output-token limit."""
    reason = finish_reason(message)
    return reason is not None and reason.lower() in TRUNCATED_REASONS


def is_incomplete(message: BaseMessage) -> bool:
    """Whether the provider says ``message`` is not a whole answer.

    Cut by the output limit (:func:`is_truncated`), by the context window or by a
    content filter, or a refusal. What a tier that stores an answer as a whole (a
    memory, MEMORY.md) checks; only a truncated answer is worth continuing.
    """
    reason = finish_reason(message)
    if reason is not None and reason.lower() in INCOMPLETE_REASONS:
        return True
    return (message.response_metadata or {}).get("status") == "incomplete"  # OpenAI Responses


def require_whole(answer: BaseMessage, what: str) -> None:
    """Refuse an answer a tier would store as a whole (a memory, MEMORY.md).

    Args:
        answer: The model's answer.
        what: What the answer is, for the error (``"the extractor's answer"``).

    Raises:
        ValueError: If :func:`is_incomplete`: a failed attempt, retried, then the
            tier's raw fallback.
    """
    if is_incomplete(answer):
        msg = f"{what} is not whole (finish reason {finish_reason(answer)!r})"
        raise ValueError(msg)
