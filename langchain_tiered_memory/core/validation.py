"""Checks for untrusted identifiers, message inputs and numeric settings.

Session and user ids reach SQL parameters, file paths and Chroma filters, and
counts and ids reach ``LIMIT``/``OFFSET`` and comparisons, so they are validated
once, at the edge, with errors that name the problem.
"""

from __future__ import annotations

import hashlib
import re
import reprlib
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

MAX_ID_LENGTH = 255
#: Deepest nesting of dicts and lists accepted in a message's fields.
MAX_NESTING = 200
#: Largest count accepted for a limit, a number of turns, a threshold, a batch or
#: ``k`` (a billion): more means nothing here, and far more overflows SQL's LIMIT.
MAX_COUNT = 10**9
#: Largest archive id (MySQL's signed BIGINT, SQLite's INTEGER).
MAX_ROW_ID = 2**63 - 1
#: Longest accepted lease, poll interval, timeout or backoff base (ten years):
#: larger ones overflow ``timedelta`` and the databases' DATETIME columns.
MAX_SECONDS = 10 * 365 * 24 * 3600.0


def validate_id(value: Any, name: str = "session_id") -> str:
    """Return ``value`` if it is a usable identifier, else raise.

    Args:
        value: The candidate id.
        name: What the id is called in the error message.

    Raises:
        TypeError: If ``value`` is not a string.
        ValueError: If it is empty, longer than 255 characters, or contains a
            control character, NUL or a lone surrogate.

    """
    if not isinstance(value, str):
        msg = f"{name} must be a str, got {type(value).__name__}"
        raise TypeError(msg)
    if not value:
        msg = f"{name} must not be empty"
        raise ValueError(msg)
    if len(value) > MAX_ID_LENGTH:
        msg = f"{name} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}"
        raise ValueError(msg)
    if value.endswith(" "):
        # MySQL's PAD SPACE collations compare 'x ' equal to 'x': two scopes in one.
        msg = f"{name} ends with a space; trailing spaces are not allowed in ids"
        raise ValueError(msg)
    check_characters(value, name)
    return value


def check_characters(value: str, name: str, error: type[ValueError] = ValueError) -> None:
    """Raise ``error`` if ``value`` holds a control character or a lone surrogate.

    A control character hides in logs and paths; a lone surrogate cannot be stored
    in MySQL's utf8mb4.
    """
    for position, char in enumerate(value):
        category = unicodedata.category(char)
        if category == "Cc":
            msg = f"{name} contains the control character U+{ord(char):04X} at position {position}"
            raise error(msg)
        if category == "Cs":
            msg = f"{name} contains a lone surrogate U+{ord(char):04X} at position {position}"
            raise error(msg)


def validate_optional_id(value: Any, name: str = "user_id") -> str | None:
    """Like :func:`validate_id`, but ``None`` is allowed."""
    return None if value is None else validate_id(value, name)


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply dicts and lists nest in ``value``, counted up to ``limit + 1``."""
    deepest = 0
    stack = [(value, 0)]
    while stack and deepest <= limit:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def validate_messages(messages: Iterable[Any]) -> Sequence[BaseMessage]:
    """Return ``messages`` as a list, raising ``TypeError`` on anything else.

    Raises:
        TypeError: If an element is not a ``BaseMessage``.
        ValueError: If a message's fields nest deeper than :data:`MAX_NESTING`
            (JSON that deep may be stored, then fail to load on a deeper stack).
    """
    if isinstance(messages, (str, bytes, BaseMessage)):
        msg = f"expected a sequence of BaseMessage, got a single {type(messages).__name__}"
        raise TypeError(msg)
    result = list(messages)
    for index, message in enumerate(result):
        if not isinstance(message, BaseMessage):
            msg = (
                f"messages[{index}] is a {type(message).__name__}, not a langchain_core BaseMessage"
            )
            raise TypeError(msg)
        depth = nesting_depth(list(vars(message).values()), MAX_NESTING)
        if depth > MAX_NESTING:
            msg = f"messages[{index}] nests more than {MAX_NESTING} levels deep"
            raise ValueError(msg)
    return result


def safe_filename(value: str) -> str:
    """A file name for an id that can never leave its folder.

    Letters, digits, ``-``, ``_`` and ``.`` are kept (leading dots dropped, so
    no ``..``), the rest become ``_``, and a short hash of the original keeps
    distinct ids distinct: ``../x`` and ``__x`` never share a file.
    """
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", value).lstrip(".")[:80] or "_"
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}"


def validate_batch(
    session_id: Any, messages: Any, user_id: Any
) -> tuple[str, Sequence[BaseMessage], str | None]:
    """Validate what every archive's ``add_messages`` takes: ids and messages."""
    return (
        validate_id(session_id),
        validate_messages(messages),
        validate_optional_id(user_id),
    )


def _shown(value: Any) -> str:
    """``repr(value)`` kept short; huge ints (whose repr may even fail) by their size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"{'-' if value < 0 else ''}an int of {value.bit_length()} bits"
    return reprlib.repr(value)


def check_int(name: str, value: Any, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """``value`` if it is an int in ``[minimum, maximum]``.

    Every count and id that reaches SQL goes through here: limits, turns,
    thresholds and batch sizes are bounded by :data:`MAX_COUNT`, archive ids by
    :data:`MAX_ROW_ID`.

    Raises:
        TypeError: If it is not an int (a bool is not one here).
        ValueError: If it is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{name} must be an int, got {_shown(value)}"
        raise TypeError(msg)
    if not minimum <= value <= maximum:
        kind = "a positive int" if minimum == 1 else f"an int of at least {minimum}"
        msg = f"{name} must be {kind} no larger than {maximum:_}, got {_shown(value)}"
        raise ValueError(msg)
    return value


def check_optional_int(
    name: str, value: Any, minimum: int = 1, maximum: int = MAX_COUNT
) -> int | None:
    """Like :func:`check_int`, but ``None`` is allowed."""
    return None if value is None else check_int(name, value, minimum, maximum)


def validate_page(session_id: Any, before_id: Any, limit: Any) -> tuple[str, int | None, int]:
    """Validate what every archive's ``history`` takes: a session, a page end and a size.

    Raises:
        TypeError: If ``before_id`` or ``limit`` is not an int (or ``before_id`` None).
        ValueError: If ``before_id`` is not in ``[1, 2**63 - 1]`` or ``limit`` not in
            ``[1, 10**9]``.
    """
    return (
        validate_id(session_id),
        check_optional_int("before_id", before_id, 1, MAX_ROW_ID),
        check_int("limit", limit),
    )


def check_number(name: str, value: Any, low: float, high: float, *, low_ok: bool = True) -> float:
    """``value`` as a float if it is a number in ``[low, high]`` (``(low, high]``).

    Raises:
        TypeError: If it is not an int or a float (a bool is not one here).
        ValueError: If it is out of range or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"{name} must be a number, got {_shown(value)}"
        raise TypeError(msg)
    if not ((low <= value if low_ok else low < value) and value <= high):
        msg = f"{name} must be in {'[' if low_ok else '('}{low:g}, {high:g}], got {_shown(value)}"
        raise ValueError(msg)
    return float(value)


def check_seconds(name: str, value: Any, *, zero_ok: bool = False) -> float:
    """``value`` if it is a usable number of seconds (positive, or zero if allowed)."""
    return check_number(name, value, 0.0, MAX_SECONDS, low_ok=zero_ok)
