"""Token estimates that do not undercount any script or kind of text, and token counter plumbing.

``len(text) / 4`` undercounts Chinese two to six times (field notes, lesson 6), Hindi,
Tamil or Georgian three to seven times, base64 twice. The estimate here counts what
``cl100k_base``'s pre-tokenizer splits apart (words, numbers, marks, line breaks), CJK
characters and each other alphabet's letters by a weight per Unicode block, fitted
against ``cl100k_base`` (see ``benchmarks/bench_tokens.py``).
"""

from __future__ import annotations

import inspect
import json
import re
import reprlib
import string
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar, cast

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately

from langchain_tiered_memory.core.turns import repeated_call_blocks
from langchain_tiered_memory.core.validation import check_int, check_token_count
from langchain_tiered_memory.text.media import media_kind, media_tokens

T = TypeVar("T")

#: Per-message overhead of the chat format (role markers and separators).
MESSAGE_OVERHEAD = 4
#: How deep blocks inside blocks are read (a tool result's content, a document's).
MAX_NESTING = 8

# Han, kana, hangul and CJK punctuation: each is usually one or more BPE tokens.
_CJK_RANGES = (
    "\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
)
CJK_WEIGHT = 1.3
# Characters past U+FFFF: four UTF-8 bytes, which byte-level BPE rarely merges. The
# Han extensions Cantonese and names use take about 4 tokens each in cl100k and
# Qwen's tokenizer, emoji about 2.5.
WIDE_WEIGHT = 3
RARE_HAN_WEIGHT = 4
_RARE_HAN = re.compile("[\U00020000-\U0003ffff]+")
#: Tokens per character of the scripts other than Latin, by Unicode block, the
#: commonest first (cl100k_base on everyday sentences, ``benchmarks/token_samples.py``;
#: a space before a word is in its first token). Any other character past ASCII is
#: one token: Latin-1's accented letters, Arabic, Thai, symbols, punctuation.
#: A script BPE hardly saw is a token per UTF-8 byte: an unlisted one is undercounted.
SCRIPT_WEIGHTS: tuple[tuple[float, str], ...] = (
    # Cyrillic; Vietnamese's letters with tone marks (Latin Extended Additional); box
    # drawing (a terminal's tables and trees: its lines merge)
    (
        0.6,
        "\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f\u1e00-\u1eff\u2500-\u257f",
    ),
    (CJK_WEIGHT, _CJK_RANGES),
    # Greek, Hebrew, Devanagari, the Arabic letters of Persian and Urdu
    (
        1.25,
        "\u0370-\u03ff\u1f00-\u1fff\u0590-\u05ff\ufb1d-\ufb4f\u0900-\u097f"
        "\ua8e0-\ua8ff\u0671-\u06ff",
    ),
    # Latin Extended-A/B (Polish, Czech, Turkish, Romanian), Armenian, Gurmukhi,
    # Gujarati, Oriya, Telugu, Kannada, Malayalam, Sinhala, Lao, Tibetan, Myanmar,
    # Georgian, Mongolian; mathematical operators and phonetic letters (IPA, its
    # stress marks, subscripts)
    (
        1.9,
        "\u0100-\u02ff\u0530-\u058f\u0a00-\u0b7f\u0c00-\u0dff\u0e80-\u0fff"
        "\u1000-\u10ff\u1c90-\u1cbf\u2d00-\u2d2f\u1800-\u18af\u1d00-\u1dbf"
        "\u2200-\u22ff\u2a00-\u2aff",
    ),
    # Bengali, Tamil, Khmer; accents as combining marks (text in NFD)
    (1.6, "\u0980-\u09ff\u0b80-\u0bff\u1780-\u17ff\u0300-\u036f"),
    # Syriac, Thaana (Dhivehi), N'Ko: a token per UTF-8 byte, as BPE merged few of them
    (2, "\u0700-\u07ff"),
    # Ethiopic (Amharic, Tigrinya): a syllable per character, about a token per byte;
    # so are the scripts of three UTF-8 bytes BPE hardly saw: Samaritan, Hangul's
    # conjoining jamo (Korean in NFD, as macOS file names have it), Cherokee, Canadian
    # syllabics, Tagalog, Balinese, Javanese, Tai scripts, Braille, Glagolitic, Coptic,
    # Tifinagh, CJK radicals, Yi, Vai, Cham, Meetei Mayek, Latin ligatures (ﬁ, ﬂ) and
    # Arabic presentation forms
    (
        3,
        "\u1200-\u139f\u2d80-\u2ddf\u0800-\u08ff\u1100-\u11ff\u13a0-\u177f"
        "\u18b0-\u1c7f\u1cc0-\u1cff\u2800-\u28ff\u2c00-\u2cff\u2d30-\u2d7f"
        "\u2e80-\u2fdf\ua000-\ua63f\ua6a0-\ua8df\ua900-\uabff\ud7b0-\ud7ff"
        "\ufb00-\ufb06\ufb50-\ufdff\ufe70-\ufefe",
    ),
)
_SCRIPTS = [(weight, re.compile(f"[{ranges}]+")) for weight, ranges in SCRIPT_WEIGHTS]
_ANY_SCRIPT = re.compile(f"[{''.join(ranges for _, ranges in SCRIPT_WEIGHTS)}]+")
_NON_ASCII = re.compile("[^\\x00-\\x7f\\s]+")
LONG_WORD_CHARS = 10
_PUNCT = "!-/:-@\\[-`{-~"
#: Marks whose runs BPE merged into long tokens: up to 16 of one are a token in a text
#: (a separator line of 80 "-" or "=" alone is one or two); other marks' runs go two or
#: four to a token.
RUN_MARKS = "-=_.*#/"
MARKS_PER_RUN = 16
# What cl100k's pre-tokenizer splits ASCII into: runs of one of RUN_MARKS, words (cut
# where a lower-case letter meets a capital and every 10 letters; a "." or "/" before
# one is in its token: ".com", "/blob"), numbers of up to 3 digits, pairs of marks
# with the line breaks after them, line breaks after anything else (a token each: one
# word per line is two tokens a line), and a lone tab.
_PIECE = re.compile(
    f"([{re.escape(RUN_MARKS)}])\\1{{2,{MARKS_PER_RUN - 1}}}(?:[\\r\\n]\\s*)?"
    f"|[./]?(?:[A-Z]?[a-z]{{1,{LONG_WORD_CHARS}}}|[A-Z]{{1,{LONG_WORD_CHARS}}})"
    f"|[0-9]{{1,3}}|[{_PUNCT}]{{1,2}}(?:[\\r\\n]\\s*)?|[\\r\\n]\\s*|(?<!\\s)\\t(?!\\s)"
)
# Letters after a digit are the inside of a key, a hash or base64 ("k3jx9Qz"), not a
# word: BPE splits them about every two letters.
_AFTER_DIGIT = re.compile("[0-9][A-Za-z]{2,}")
AFTER_DIGIT_WEIGHT = 0.5
# Runs of whitespace: cl100k merges up to about 80 spaces into one token, and 8-30
# newlines; the indentation after a line break is a token of its own; tabs (a table's
# empty cells) merge little.
_SPACE_RUN = re.compile(r"\s{2,}")
# Control characters (NUL, form feed, an escape code's ESC, DEL): cl100k's
# pre-tokenizer splits each from its neighbours, and BPE merges them rarely.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

SPACES_PER_TOKEN = 64
BREAKS_PER_TOKEN = 8
TABS_PER_TOKEN = 2
SAMPLE_ABOVE = 16_384
SAMPLE_SLICES = 16
SAMPLE_CHARS = 1024
CACHE_ABOVE = 512
CACHE_SIZE = 65_536

#: A function of a message list, a function of one message, a chat model with
#: ``get_num_tokens_from_messages``, or ``"approximate"`` (what ``trim_messages`` accepts).
TokenCounter: TypeAlias = Callable[[list[BaseMessage]], int] | Callable[[BaseMessage], int] | Any


def _chars(pattern: re.Pattern[str], text: str) -> int:
    """How many characters of ``text`` ``pattern`` (a run of a class) matches."""
    return sum(map(len, pattern.findall(text)))


def _beyond_ascii(text: str) -> float:
    """Tokens of the characters of ``text`` past ASCII, by their script."""
    count = len(text) - len(text.encode("ascii", "ignore"))
    # Characters past U+FFFF are two UTF-16 code units.
    wide = len(text.encode("utf-16-le", "surrogatepass")) // 2 - len(text)
    # Mostly ASCII (English with a few quotes, code): the passes below read the rest only.
    chars = text if count * 4 > len(text) else "".join(_NON_ASCII.findall(text))
    tokens: float = count + wide * (WIDE_WEIGHT - 1)  # one each, but wide
    if wide:
        tokens += _chars(_RARE_HAN, chars) * (RARE_HAN_WEIGHT - WIDE_WEIGHT)
    letters = _chars(_ANY_SCRIPT, chars)
    for weight, script in _SCRIPTS:  # the commonest first: most texts stop after one
        if not letters:
            break
        found = _chars(script, chars)
        tokens += found * (weight - 1)
        letters -= found
    return tokens


def _count(text: str) -> float:
    pieces = float(len(_CONTROL.findall(text)))  # a token each
    if not text.isascii():
        pieces += _beyond_ascii(text)
        # The passes below read ASCII: a run of other letters is one mark to them, as
        # it is to cl100k's pre-tokenizer around it (a word apart from its neighbours);
        # the NUL standing for it is not counted (the text's own were, above).
        text = _NON_ASCII.sub("\x00", text)
    pieces += len(_PIECE.findall(text))
    pieces += AFTER_DIGIT_WEIGHT * sum(len(run) - 2 for run in _AFTER_DIGIT.findall(text))
    for run in _SPACE_RUN.findall(text):
        spaces, tabs = run.count(" "), run.count("\t")
        if spaces == len(run):  # padding: "a  b" costs a token more than "a b"
            pieces += (spaces + SPACES_PER_TOKEN - 1) // SPACES_PER_TOKEN
        else:  # line breaks and tabs, with the indentation they carry
            breaks = len(run) - spaces - tabs
            pieces += (tabs + TABS_PER_TOKEN - 1) // TABS_PER_TOKEN
            # the first line break is a piece of its own
            pieces += max(breaks - 1, 0) // BREAKS_PER_TOKEN + spaces // SPACES_PER_TOKEN
            pieces += breaks > 0 and run.endswith("  ")  # indentation
    return pieces


def _floor(text: str) -> float:
    """Fewer tokens than ``text`` has, read whole at C speed (no regular expression).

    Visible ASCII takes at least one token per four characters (a separator's run of
    one mark, one per 64), spaces one per 128,
    other whitespace one per 32, and each byte past a character's first UTF-8 byte
    half a token (a Chinese character one, cl100k gives it one or two). A sample
    that missed what the text is made of cannot go below it.
    """
    wide = 0 if text.isascii() else len(text.encode("utf-8", "surrogatepass")) - len(text)
    # Runs of RUN_MARKS (separator lines) are at least a token per 64 marks.
    runs = sum(text.count(mark * MARKS_PER_RUN) for mark in RUN_MARKS)
    spaces = text.count(" ")
    other = text.count("\t") + text.count("\n") + text.count("\r")
    # Each character past ASCII has at least one byte more: at most `wide` of them.
    visible = max(0, len(text) - spaces - other - wide - runs * MARKS_PER_RUN)
    return visible / 4 + spaces / 128 + other / 32 + wide / 2 + runs * MARKS_PER_RUN / 64


_MISSING = object()
_cache: OrderedDict[tuple[int, int], int] = OrderedDict()


def _cached(cache: OrderedDict[tuple[int, int], T], text: str, compute: Callable[[str], T]) -> T:
    """``compute(text)``, kept in ``cache`` by (hash, length).

    The oldest entry goes past :data:`CACHE_SIZE`. A str caches its own hash, so a
    hit is O(1), and the cache holds no reference to the text.
    """
    key = (hash(text), len(text))
    value = cache.get(key, _MISSING)  # one lookup: another thread may evict meanwhile
    if value is not _MISSING:
        return cast("T", value)
    value = cache[key] = compute(text)
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _text_tokens(text: str) -> int:
    # Long texts (tool outputs) are re-estimated on every turn: their counts are kept.
    if len(text) <= CACHE_ABOVE:
        return _estimate(text)
    return _cached(_cache, text, _estimate)


def _estimate(text: str) -> int:
    if len(text) <= SAMPLE_ABOVE:
        return int(_count(text) + 0.999)
    # Huge tool outputs: count evenly spread slices and scale, so the cost stays
    # bounded (a 1 MB document costs what 16 KB does) while the estimate holds; a
    # text whose slices are unlike the rest (built to be, or just uneven) is held up
    # by its floor, read whole.
    step = len(text) // SAMPLE_SLICES
    sampled = sum(_count(text[i : i + SAMPLE_CHARS]) for i in range(0, len(text), step))
    seen = sum(len(text[i : i + SAMPLE_CHARS]) for i in range(0, len(text), step))
    return int(max(sampled * len(text) / seen, _floor(text)) + 0.999)


def _block_text(block: dict[str, Any]) -> str:
    """The text a model reads in one non-media content block."""
    kind = block.get("type")
    if kind == "thinking":  # Anthropic's extended thinking
        return str(block.get("thinking") or "")
    if kind == "reasoning":  # LangChain's standard block; OpenAI's has summaries
        summary = block.get("summary")
        parts = [str(block.get("reasoning") or "")]
        if isinstance(summary, list):
            parts += [str(s.get("text") or "") for s in summary if isinstance(s, dict)]
        return "\n".join(part for part in parts if part)
    text = block.get("text") or block.get("content")
    try:
        if text is not None:
            return str(text)
        # A block of a kind not known here: its JSON, so it is never counted as nothing.
        return json.dumps(block, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):  # holds itself, a 5,000-digit int
        # No provider can be sent it either; counted by a bounded sketch of it.
        try:
            return reprlib.repr(block)
        except ValueError:
            return type(block).__name__


def _inner_blocks(block: dict[str, Any]) -> list[Any] | None:
    """The blocks a block holds, if it holds any.

    A tool result's or a search result's content, a document given as content
    blocks (with its title and context), a provider's block wrapped as
    ``non_standard``: their media count as media, not as base64 text.
    """
    if block.get("type") == "non_standard" and isinstance(block.get("value"), dict):
        return [block["value"]]
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "content":  # Anthropic
        inner = source.get("content")
        blocks = list(inner) if isinstance(inner, list) else [str(inner or "")]
        return blocks + [
            block[key] for key in ("title", "context") if isinstance(block.get(key), str)
        ]
    content = block.get("content")
    return list(content) if isinstance(content, list) else None


def _content_parts(
    blocks: list[Any], parts: list[str], depth: int = 0, skip: frozenset[int] = frozenset()
) -> int:
    """Add the text of ``blocks`` to ``parts``; return the fixed tokens of their media.

    The blocks at the indexes ``skip`` are left out: calls the message counts
    elsewhere.
    """
    fixed = 0
    for index, block in enumerate(blocks):
        if index in skip:
            continue
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict):
            inner = _inner_blocks(block) if depth < MAX_NESTING else None
            if inner is not None:
                fixed += _content_parts(inner, parts, depth + 1)
            elif media_kind(block) is not None:
                fixed += media_tokens(block, _text_tokens)
            else:
                parts.append(_block_text(block))
    return fixed


def _message_parts(message: BaseMessage) -> tuple[str, int]:
    """A message's text to estimate, and the fixed tokens of its media blocks."""
    content = message.content
    # The calls a message holds as data are counted from there, and a block that
    # repeats one (Anthropic's ``tool_use`` beside ``tool_calls``) is skipped: a
    # call counts once. A call given only as a block is counted as the block's
    # text, whatever shape its arguments have.
    calls = (
        [*message.tool_calls, *message.invalid_tool_calls] if isinstance(message, AIMessage) else []
    )
    fixed = 0
    if isinstance(content, str):
        text = content
    else:
        parts: list[str] = []
        fixed = _content_parts(content, parts, skip=frozenset(repeated_call_blocks(message)))
        text = "\n".join(parts)
    audio = message.additional_kwargs.get("audio")
    if isinstance(audio, dict):  # an OpenAI audio answer, sent back to the model by its id
        data = audio.get("data")
        answer = {"type": "audio", "base64": data, "format": "pcm16"} if data else {"type": "audio"}
        fixed += media_tokens(answer, _text_tokens)
    if calls:
        text += json.dumps(
            [{"name": c.get("name"), "args": c.get("args")} for c in calls],
            ensure_ascii=False,
            default=str,
        )
    return text, fixed


def _message_tokens(message: BaseMessage) -> int:
    text, fixed = _message_parts(message)
    return _text_tokens(text) + fixed + MESSAGE_OVERHEAD


def estimate_tokens(value: str | BaseMessage | Sequence[BaseMessage]) -> int:
    """Estimate the tokens of a text, a message or a list of messages.

    Counts what ``cl100k_base`` splits text into (words, numbers, marks, line breaks,
    the letters of each script by :data:`SCRIPT_WEIGHTS`, CJK characters), so
    Chinese, Hindi, base64 or a list of one word per line are not undercounted the way
    ``len(text) / 4`` undercounts them (within 0.8-1.3x of ``cl100k_base`` on each
    class ``bench_tokens`` measures). Messages
    add a small per-message overhead and the JSON of their tool calls; their
    thinking and reasoning blocks count as text, each image, audio, video or
    file block by what it holds (:func:`~.media.media_tokens`: an image's size,
    a recording's length, a PDF's pages), and a block of another kind as its JSON.

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
        return _message_tokens(value)
    return sum(_message_tokens(m) for m in value)


def resolve_token_counter(
    token_counter: TokenCounter | None,
) -> Callable[[Sequence[BaseMessage]], int]:
    """Turn any accepted ``token_counter`` into a function of a message list.

    Accepts what ``langchain_core.messages.trim_messages`` accepts: a function of a
    list of messages, a function of one message (annotated ``BaseMessage``), a
    chat model with ``get_num_tokens_from_messages``, or ``"approximate"``
    (langchain_core's ``count_tokens_approximately``). ``None`` means
    :func:`estimate_tokens`.

    What it answers is checked (:func:`~langchain_tiered_memory.core.validation.check_token_count`).

    Raises:
        TypeError: If ``token_counter`` is none of these.
    """
    if token_counter is None:
        return estimate_tokens
    count = _any_counter(token_counter)
    return lambda messages: check_token_count(count(messages))


def _any_counter(token_counter: TokenCounter) -> Callable[[Sequence[BaseMessage]], Any]:
    """:func:`resolve_token_counter`'s function, its answers not checked yet."""
    # trim_messages' one string shortcut (a str test first: `==` on an array is no bool)
    if isinstance(token_counter, str) and token_counter == "approximate":
        return lambda messages: count_tokens_approximately(list(messages))
    if hasattr(token_counter, "get_num_tokens_from_messages"):
        return lambda messages: token_counter.get_num_tokens_from_messages(list(messages))
    if not callable(token_counter):
        # A string names itself; any other value, its type.
        kind = type(token_counter).__name__
        got = repr(token_counter) if isinstance(token_counter, str) else kind
        msg = (
            "token_counter must be a function, a chat model with "
            f'get_num_tokens_from_messages or "approximate", got {got}'
        )
        raise TypeError(msg)
    params = list(inspect.signature(token_counter).parameters.values())
    # The annotation tells which of the two callables it is; mypy cannot follow that.
    if params and params[0].annotation in (BaseMessage, "BaseMessage"):
        per_message = cast(Callable[[BaseMessage], int], token_counter)
        # Each answer is checked: one negative count must not cancel another.
        return lambda messages: sum(check_token_count(per_message(m)) for m in messages)
    per_list = cast(Callable[[list[BaseMessage]], int], token_counter)
    return lambda messages: per_list(list(messages))


#: Tokens an extraction or consolidation prompt may take when neither the caller nor
#: the model says. A model with a smaller window that declares none (``ChatOllama``
#: without ``num_ctx`` runs with the server's default, 2,048 or 4,096) needs
#: ``max_prompt_tokens``, a ``profile`` or its ``num_ctx``.
DEFAULT_PROMPT_TOKENS = 32_000
#: The smallest budget a caller may give: the prompts' own instructions take a few hundred.
MIN_PROMPT_TOKENS = 1_000
#: Share of a model's declared input limit a prompt takes: room for the estimate's
#: error against the model's own tokenizer (within 15 %, ``bench_tokens``).
PROFILE_SHARE = 0.85
#: Share of a local model's whole context (``num_ctx``, ``n_ctx``) a prompt takes: the
#: answer is counted in the same window, and a MEMORY.md answer may take half the
#: prompt's budget (0.55 + 0.275 of the window, within the estimate's error).
WINDOW_SHARE = 0.55
#: Text counted at once when a budget is filled from one end of a text.
_CHUNK = 4096
_CUT = " … "


def exact_tokens(text: str) -> int:
    """:func:`estimate_tokens` of a text with every character counted (no sampling).

    For budgets that must hold: the estimate of a text past 16 KB counts slices of
    it, and can be off either way on uneven text.
    """
    return int(_count(text) + 0.999)


def instruction_tokens(template: str, fields: Mapping[str, str]) -> int:
    """Tokens of ``template`` with its other ``fields`` and an empty ``{conversation}``."""
    return exact_tokens(template.format(conversation="", **fields))


def room_for(template: str, fields: Mapping[str, str], max_tokens: int) -> int:
    """Tokens each ``{conversation}`` of ``template`` may take within ``max_tokens``.

    Args:
        template: A prompt with a ``{conversation}`` field (a house style may show
            it more than once).
        fields: Its other fields' values.
        max_tokens: The whole prompt's budget.
    """
    copies = sum(name == "conversation" for _, name, _, _ in string.Formatter().parse(template))
    return (max_tokens - instruction_tokens(template, fields)) // max(copies, 1)


def check_instructions(what: str, template: str, fields: Mapping[str, str], budget: int) -> None:
    """Refuse a prompt whose instructions take more than half of ``budget``.

    Raises:
        ValueError: Naming the prompt, its tokens and the budget.
    """
    fixed = instruction_tokens(template, fields)
    if fixed > budget // 2:
        msg = (
            f"the {what} prompt's instructions take {fixed} tokens, more than half of "
            f"the prompt budget ({budget}: max_prompt_tokens, or the model's profile or "
            "num_ctx)"
        )
        raise ValueError(msg)


def prompt_budget(model: object, max_prompt_tokens: int | None) -> int:
    """How many tokens a prompt to ``model`` may take.

    Args:
        model: The chat model (or runnable) the prompt is for.
        max_prompt_tokens: The caller's budget; ``None`` takes the smallest input
            limit the model declares (its ``profile``'s ``max_input_tokens``, as
            langchain-core's model profiles give it, or the ``num_ctx``/``n_ctx`` a
            local model runs with; through ``with_retry``, ``bind``, a pipe and
            every model of ``with_fallbacks``), less the estimate's error
            (:data:`PROFILE_SHARE`) and, for a whole context, the answer's room
            (:data:`WINDOW_SHARE`); else :data:`DEFAULT_PROMPT_TOKENS`.

    Raises:
        TypeError: If ``max_prompt_tokens`` is not an int.
        ValueError: If it is below :data:`MIN_PROMPT_TOKENS`.
    """
    if max_prompt_tokens is not None:
        return check_int("max_prompt_tokens", max_prompt_tokens, MIN_PROMPT_TOKENS)
    budgets = _declared_budgets(model, depth=0)
    return max(min(budgets), 1) if budgets else DEFAULT_PROMPT_TOKENS


def _declared_budgets(model: object, depth: int) -> list[int]:
    """The prompt budgets the limits of ``model`` and of the models it wraps allow.

    A ``profile``'s ``max_input_tokens`` counts the prompt alone; the context a
    local model is run with (``num_ctx`` of ``ChatOllama``, ``n_ctx`` of
    ``ChatLlamaCpp``) counts the answer too, and such a server cuts a longer prompt
    from its start, silently.
    """
    if depth > 8:
        return []
    profile = getattr(model, "profile", None)
    shares = [
        (profile.get("max_input_tokens") if isinstance(profile, Mapping) else None, PROFILE_SHARE),
        (getattr(model, "num_ctx", None), WINDOW_SHARE),
        (getattr(model, "n_ctx", None), WINDOW_SHARE),
    ]
    found = [
        int(limit * share)
        for limit, share in shares
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    ]
    inner = [getattr(model, "bound", None), getattr(model, "runnable", None)]
    for name in ("fallbacks", "steps"):
        wrapped = getattr(model, name, None)
        if isinstance(wrapped, Sequence) and not isinstance(wrapped, str):
            inner.extend(wrapped)
    for each in inner:
        if each is not None and each is not model:
            found.extend(_declared_budgets(each, depth + 1))
    return found


def cut_to_tokens(text: str, max_tokens: int) -> str:
    """``text`` if it fits ``max_tokens``, else its start and its end joined by ``…``.

    Both ends are kept, half the budget each: a turn opens with the question and
    ends with the answer. Counted exactly (:func:`exact_tokens`), in time bounded
    by what is kept, not by the length of ``text``.
    """
    if _within(text, max_tokens, from_end=False) == len(text):
        return text
    room = max_tokens - exact_tokens(_CUT)
    head = text[: _within(text, room // 2, from_end=False)]
    tail = text[len(text) - _within(text, room - exact_tokens(head), from_end=True) :]
    cut = f"{head}{_CUT}{tail}"
    # Pieces counted chunk by chunk may join differently: the whole is checked.
    while exact_tokens(cut) > max_tokens and (head or tail):
        head, tail = head[: len(head) * 9 // 10], tail[len(tail) // 10 :]
        cut = f"{head}{_CUT}{tail}"
    return cut if exact_tokens(cut) <= max_tokens else ""


def _within(text: str, limit: int, *, from_end: bool) -> int:
    """Length of the longest start (or end) of ``text`` within ``limit`` tokens."""
    used = taken = 0
    while taken < len(text):
        size = min(_CHUNK, len(text) - taken)
        start = len(text) - taken - size if from_end else taken
        chunk = text[start : start + size]
        tokens = exact_tokens(chunk)
        if used + tokens > limit:
            return taken + _longest(chunk, limit - used, from_end=from_end)
        used += tokens
        taken += size
    return taken


def _longest(chunk: str, limit: int, *, from_end: bool) -> int:
    """The most characters of ``chunk``, from its start or its end, within ``limit`` tokens."""
    low, high = 0, len(chunk)
    while low < high:
        middle = (low + high + 1) // 2
        part = chunk[len(chunk) - middle :] if from_end else chunk[:middle]
        if exact_tokens(part) <= limit:
            low = middle
        else:
            high = middle - 1
    return low
