"""Token estimates that do not undercount Chinese, and token counter plumbing.

``len(text) / 4`` undercounts Chinese two to six times (field notes, lesson 6). The
estimate here counts CJK characters and the remaining text separately, with weights
fitted against ``cl100k_base`` (see ``benchmarks/bench_tokens.py``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

from langchain_core.messages import BaseMessage

#: Per-message overhead of the chat format (role markers and separators).
MESSAGE_OVERHEAD = 4

# Han, kana, hangul and CJK punctuation: each is usually one or more BPE tokens.
_CJK_RANGES = (
    "\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
)
_CJK = re.compile(f"[{_CJK_RANGES}]")
# Words, numbers of up to 3 digits, and pairs of other marks, outside CJK.
_PIECE = re.compile(f"[A-Za-z]+|[0-9]{{1,3}}|[^\\sA-Za-z0-9{_CJK_RANGES}]{{1,2}}")
# Long words split into several BPE tokens.
_LONG_WORD = re.compile(r"[A-Za-z]{11,}")

CJK_WEIGHT = 1.3
LONG_WORD_CHARS = 10
SAMPLE_ABOVE = 16_384
SAMPLE_SLICES = 16
SAMPLE_CHARS = 1024
CACHE_ABOVE = 512
CACHE_SIZE = 65_536

#: A function of a message list, a function of one message, or a chat model
#: with ``get_num_tokens_from_messages`` (what ``trim_messages`` accepts).
TokenCounter: TypeAlias = Callable[[list[BaseMessage]], int] | Callable[[BaseMessage], int] | Any


def _count(text: str) -> float:
    cjk = len(_CJK.findall(text))
    pieces = len(_PIECE.findall(text))
    pieces += sum((len(word) - 1) // LONG_WORD_CHARS for word in _LONG_WORD.findall(text))
    return cjk * CJK_WEIGHT + pieces


_cache: OrderedDict[tuple[int, int], int] = OrderedDict()


def _text_tokens(text: str) -> int:
    # Long texts (tool outputs) are re-estimated on every turn: cache their counts
    # by (hash, length). A str caches its own hash, so a hit is O(1), and the cache
    # holds no reference to the text.
    if len(text) <= CACHE_ABOVE:
        return _estimate(text)
    key = (hash(text), len(text))
    tokens = _cache.get(key)
    if tokens is None:
        tokens = _cache[key] = _estimate(text)
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return tokens


def _estimate(text: str) -> int:
    if len(text) <= SAMPLE_ABOVE:
        return int(_count(text) + 0.999)
    # Huge tool outputs: count evenly spread slices and scale, so the cost stays
    # bounded (a 1 MB document costs what 16 KB does) while the estimate holds.
    step = len(text) // SAMPLE_SLICES
    sampled = sum(_count(text[i : i + SAMPLE_CHARS]) for i in range(0, len(text), step))
    seen = sum(len(text[i : i + SAMPLE_CHARS]) for i in range(0, len(text), step))
    return int(sampled * len(text) / seen + 0.999)


def _message_text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                parts.append(str(block.get("text") or block.get("content") or ""))
        text = "\n".join(parts)
    tool_calls = getattr(message, "tool_calls", None)
    if tool_calls:
        text += json.dumps(
            [{"name": c.get("name"), "args": c.get("args")} for c in tool_calls],
            ensure_ascii=False,
        )
    return text


def estimate_tokens(value: str | BaseMessage | Sequence[BaseMessage]) -> int:
    """Estimate the tokens of a text, a message or a list of messages.

    Counts CJK characters and the words, numbers and punctuation of the rest, so
    Chinese is not undercounted the way ``len(text) / 4`` undercounts it. Messages
    add a small per-message overhead and the JSON of their tool calls.

    Args:
        value: A string, one message, or a sequence of messages.

    Returns:
        The estimated number of tokens.

    Example:
        .. code-block:: python

            estimate_tokens("应收账款表 ar_invoice")

    """
    if isinstance(value, str):
        return _text_tokens(value)
    if isinstance(value, BaseMessage):
        return _text_tokens(_message_text(value)) + MESSAGE_OVERHEAD
    return sum(_text_tokens(_message_text(m)) + MESSAGE_OVERHEAD for m in value)


def resolve_token_counter(
    token_counter: TokenCounter | None,
) -> Callable[[Sequence[BaseMessage]], int]:
    """Turn any accepted ``token_counter`` into a function of a message list.

    Accepts what ``langchain_core.messages.trim_messages`` accepts: a function of a
    list of messages, a function of one message (annotated ``BaseMessage``), or a
    chat model with ``get_num_tokens_from_messages``. ``None`` means
    :func:`estimate_tokens`.
    """
    if token_counter is None:
        return estimate_tokens
    if hasattr(token_counter, "get_num_tokens_from_messages"):
        return lambda messages: token_counter.get_num_tokens_from_messages(list(messages))
    if not callable(token_counter):
        msg = (
            "token_counter must be a function or a chat model with "
            f"get_num_tokens_from_messages, got {type(token_counter).__name__}"
        )
        raise TypeError(msg)
    params = list(inspect.signature(token_counter).parameters.values())
    # The annotation tells which of the two callables it is; mypy cannot follow that.
    if params and params[0].annotation in (BaseMessage, "BaseMessage"):
        per_message = cast(Callable[[BaseMessage], int], token_counter)
        return lambda messages: sum(per_message(m) for m in messages)
    per_list = cast(Callable[[list[BaseMessage]], int], token_counter)
    return lambda messages: per_list(list(messages))
