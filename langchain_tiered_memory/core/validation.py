"""Checks for untrusted identifiers, message inputs and numeric settings.

Session and user ids reach SQL parameters, file paths and Chroma filters, and
counts and ids reach ``LIMIT``/``OFFSET`` and comparisons, so they are validated
once, at the edge, with errors that name the problem.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
import reprlib
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from typing import Any

from langchain_core.messages import BaseMessage

MAX_ID_LENGTH = 255
#: Deepest nesting of dicts and lists accepted in a message's fields.
MAX_NESTING = 200
#: The message types ``langchain_core.messages.messages_from_dict`` reads back: a
#: message of another ``type`` (a custom subclass) could be stored, never loaded.
#: ``remove`` is left out: a ``RemoveMessage`` is an instruction to LangGraph's
#: ``add_messages`` reducer, not a message; archived, it reached every later prompt,
#: which providers refuse.
READABLE_TYPES = frozenset(
    {"human", "ai", "system", "chat", "function", "tool"}
    | {f"{kind}MessageChunk" for kind in ("AI", "Human", "Function", "Tool", "System", "Chat")}
)
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


def check_characters(
    value: str, name: str, error: type[ValueError] = ValueError, *, allowed: str = ""
) -> None:
    """Raise ``error`` if ``value`` holds a control character or a lone surrogate.

    A control character hides in logs and paths; a lone surrogate cannot be stored
    in MySQL's utf8mb4.

    Args:
        value: The text to check.
        name: How the error names it.
        error: The exception raised.
        allowed: Control characters that are accepted (never NUL: a C string ends at it).
    """
    for position, char in enumerate(value):
        category = unicodedata.category(char)
        if category == "Cc" and (char not in allowed or char == "\x00"):
            msg = f"{name} contains the control character U+{ord(char):04X} at position {position}"
            raise error(msg)
        if category == "Cs":
            msg = f"{name} contains a lone surrogate U+{ord(char):04X} at position {position}"
            raise error(msg)


def validate_optional_id(value: Any, name: str = "user_id") -> str | None:
    """Like :func:`validate_id`, but ``None`` is allowed."""
    return None if value is None else validate_id(value, name)


def nesting_depth(value: Any, limit: int, *, string_keys: bool = False) -> int:
    """How deeply dicts and lists nest in ``value``, counted up to ``limit + 1``.

    Args:
        value: The value to walk.
        limit: Where to stop counting (the walk stops past it).
        string_keys: Also require every dict key met to be a str: JSON turns ``1``
            into ``"1"`` (so ``{1: "a", "1": "b"}`` would lose one), so a value meant
            to round-trip through JSON must not have any.

    Raises:
        TypeError: With ``string_keys``, at the first key that is not a str.
    """
    deepest = 0
    stack = [(value, 0)]
    while stack and deepest <= limit:
        item, level = stack.pop()
        if isinstance(item, dict):
            if string_keys:
                for name in item:
                    if not isinstance(name, str):
                        kind = type(name).__name__
                        msg = f"dict keys must be str, got {name!r} ({kind}) at depth {level + 1}"
                        raise TypeError(msg)
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


#: The key of a message's ``additional_kwargs`` (or ``response_metadata``) that
#: says when its conversation took place; the long-term memory of the turn is
#: dated by it (``turn_at``) instead of by the time it was archived.
SESSION_DATE_KEY = "session_date"
_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ),
        start=1,
    )
    for name in names
}
# LoCoMo's session dates, "1:56 pm on 8 May, 2023", and the month first: "May 8, 2023".
_SPOKEN_DATE = re.compile(
    r"^\s*(?:(\d{1,2}):(\d{2})\s*([ap]\.?m\.?)\s+on\s+)?"
    r"(?:(\d{1,2})\s+([a-z]+)\.?|([a-z]+)\.?\s+(\d{1,2})),?\s+(\d{4})\s*$",
    re.IGNORECASE,
)
# The year first, as Chinese and most of Asia write it: "2023年5月8日", "2023/5/8 13:56".
# The time is set apart (a space, "T" or 日): "2023/5/113:56" could be 1 or 11 May.
_YEAR_FIRST = re.compile(
    r"^\s*(\d{4})\s*[-/.年]\s*(\d{1,2})\s*[-/.月]\s*(\d{1,2})\s*[日号]?"
    r"(?:(?:[\sT]+|(?<=[日号]))(\d{1,2})\s*[:：时]\s*(\d{2})\s*分?)?\s*$"
)


class InvalidSessionDateError(ValueError):
    """A message's session date (``additional_kwargs["session_date"]``) is not a date."""


class EmbeddingDimensionError(ValueError):
    """Stored vectors are not of the embedding's size: another model embedded them.

    Raised by a search that compares them with a query's vector (and by a
    ``KnowledgeBase`` write, which Chroma refuses), e.g. after the embedding model
    was changed for one of another size.

    Args:
        stored: The sizes of the stored vectors.
        model: The size of the embedding's vectors.
        remedy: What to do about it, where the owner offers a way (``"call
            reindex()"``); said after the sizes.

    Attributes:
        stored: The sizes of the stored vectors (two or more: several models made them).
        model: The size of the embedding's vectors (``None``: not known where raised).
    """

    def __init__(self, stored: Sequence[int], model: int | None, remedy: str | None = None) -> None:
        self.stored = tuple(sorted(set(stored)))
        self.model = model
        sizes = " and ".join(map(str, self.stored))
        if model is None:
            msg = (
                f"the stored vectors have {sizes} dimensions: several models embedded them; "
                f"{remedy or 'embed them again with one'}"
            )
        else:
            msg = (
                f"the stored vectors have {sizes} dimensions but the embedding's have "
                f"{model}: another model embedded them; "
                f"{remedy or 'search with that model, or embed them again with this one'}"
            )
        super().__init__(msg)


def parse_session_date(value: Any) -> datetime:
    """A session date as the naive UTC ``datetime`` the archive stores.

    Accepted: an ISO date or date-time string (``"2023-05-08"``,
    ``"2023-05-08T13:56:00+02:00"``; an offset is converted to UTC, none means
    UTC), LoCoMo's spoken form (``"1:56 pm on 8 May, 2023"``, ``"8 May 2023"``,
    ``"May 8, 2023"``) and the year first (``"2023年5月8日"``, ``"2023/5/8 13:56"``).
    A form whose day and month could be swapped (``"08.05.2023"``) is refused.

    Raises:
        InvalidSessionDateError: If ``value`` is not such a string, or falls outside
            the years 1-9999 once converted to UTC (the error names the value).
    """
    return _read_date(value)[0]


def _read_date(value: Any) -> tuple[datetime, bool]:
    """``value`` as a naive UTC ``datetime``, and whether it gave a time of day."""
    if not isinstance(value, str):
        msg = (
            f"{SESSION_DATE_KEY} must be an ISO date string such as '2023-05-08', "
            f"got a {type(value).__name__}: {_shown(value)}"
        )
        raise InvalidSessionDateError(msg)
    text = value.strip()
    parsed: datetime | None
    try:
        if len(text) > 10:
            parsed, timed = datetime.fromisoformat(text), True
        else:
            parsed, timed = datetime.combine(date.fromisoformat(text), datetime.min.time()), False
    except ValueError:
        parsed, timed = _spoken_date(text)
    if parsed is None:
        msg = (
            f"{SESSION_DATE_KEY} {_shown(value)} is not a date: give an ISO date such as "
            "'2023-05-08' or '2023-05-08T13:56:00', '1:56 pm on 8 May, 2023' or '2023年5月8日'"
        )
        raise InvalidSessionDateError(msg)
    return _naive_utc(parsed, value), timed


def _naive_utc(moment: datetime, given: Any) -> datetime:
    """``moment`` in UTC without its offset; refused when UTC leaves the years 1-9999."""
    if moment.tzinfo is None:
        return moment
    try:
        return moment.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        msg = f"{SESSION_DATE_KEY} {_shown(given)} falls outside the years 1-9999 in UTC"
        raise InvalidSessionDateError(msg) from None


def _spoken_date(text: str) -> tuple[datetime | None, bool]:
    """A date in one of the non-ISO forms read (see :func:`parse_session_date`)."""
    if len(text) > 40:
        return None, False
    year_first = _YEAR_FIRST.match(text)
    if year_first is not None:
        year, month, day, hour, minute = year_first.groups()
        clock = (int(hour), int(minute)) if hour is not None else (0, 0)
        return _date_of(int(year), int(month), int(day), clock), hour is not None
    found = _SPOKEN_DATE.match(text)
    if found is None:
        return None, False
    hour, minute, half, day, month, month_first, day_second, year = found.groups()
    number = _MONTHS.get((month or month_first).lower())
    if number is None:
        return None, False
    clock = (0, 0)
    if hour is not None:
        if not 1 <= int(hour) <= 12:
            return None, False
        clock = (int(hour) % 12 + (12 if half.lower().startswith("p") else 0), int(minute))
    return _date_of(int(year), number, int(day or day_second), clock), hour is not None


def _date_of(year: int, month: int, day: int, clock: tuple[int, int]) -> datetime | None:
    try:
        return datetime(year, month, day, *clock)
    except ValueError:  # 31 February, minute 75
        return None


def time_bound(name: str, value: Any, *, end: bool = False) -> datetime | None:
    """A ``since``/``until`` bound as a naive UTC ``datetime`` (``None`` stays ``None``).

    Takes a ``datetime`` (aware ones converted to UTC), a ``date`` or a string
    :func:`parse_session_date` reads. A bound given as a date without a time of
    day, with ``end=True``, is the end of that day, so ``until="2023-05-08"`` (or
    ``"8 October 2023"``) includes that whole day.

    Raises:
        InvalidSessionDateError: If ``value`` is not a date (the error names it).
    """
    if value is None:
        return None
    try:
        if isinstance(value, datetime):
            return _naive_utc(value, value)
        if isinstance(value, date):
            bound, timed = datetime.combine(value, datetime.min.time()), False
        else:
            bound, timed = _read_date(value)
    except InvalidSessionDateError as exc:
        raise InvalidSessionDateError(f"{name}: {exc}") from None
    if end and not timed:
        bound = bound.replace(hour=23, minute=59, second=59, microsecond=999999)
    return bound


def time_window(since: Any, until: Any) -> tuple[datetime | None, datetime | None]:
    """``since`` and ``until`` as :func:`time_bound` reads them, checked to be in order.

    ``until`` given as a date without a time of day runs to the end of that day.

    Raises:
        InvalidSessionDateError: If either is not a date, or ``since`` is after ``until``.
    """
    start, end = time_bound("since", since), time_bound("until", until, end=True)
    if start is not None and end is not None and start > end:
        msg = f"since ({_shown(since)}) is after until ({_shown(until)}): no memory can match"
        raise InvalidSessionDateError(msg)
    return start, end


def session_date(message: BaseMessage) -> datetime | None:
    """The session date a message carries, if any (see :data:`SESSION_DATE_KEY`).

    Read from ``additional_kwargs``, else ``response_metadata``.

    Raises:
        InvalidSessionDateError: If the value there is not a date.
    """
    for fields in (message.additional_kwargs, message.response_metadata):
        if isinstance(fields, dict) and fields.get(SESSION_DATE_KEY) is not None:
            return parse_session_date(fields[SESSION_DATE_KEY])
    return None


def validate_messages(messages: Iterable[Any]) -> Sequence[BaseMessage]:
    """Return ``messages`` as a list, raising ``TypeError`` on anything else.

    Raises:
        TypeError: If an element is not a ``BaseMessage``, or its ``type`` is not
            one of :data:`READABLE_TYPES` (it could not be read back).
        ValueError: If a message's fields nest deeper than :data:`MAX_NESTING`
            (JSON that deep may be stored, then fail to load on a deeper stack).
        InvalidSessionDateError: If a message's session date is not a date.
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
        if message.type == "remove":
            msg = (
                f"messages[{index}] is a RemoveMessage: an instruction to LangGraph's message "
                "reducer, not a message to archive; the archive keeps every message "
                "(clear() or forget() remove a session's messages)"
            )
            raise TypeError(msg)
        if message.type not in READABLE_TYPES:
            msg = (
                f"messages[{index}] is of type {message.type!r}, which langchain_core cannot "
                f"read back; use one of {', '.join(sorted(READABLE_TYPES))}"
            )
            raise TypeError(msg)
        depth = nesting_depth(list(vars(message).values()), MAX_NESTING)
        if depth > MAX_NESTING:
            msg = f"messages[{index}] nests more than {MAX_NESTING} levels deep"
            raise ValueError(msg)
        try:
            session_date(message)
        except InvalidSessionDateError as exc:
            msg = f"messages[{index}]: {exc}"
            raise InvalidSessionDateError(msg) from None
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


def check_token_count(value: Any) -> int:
    """``value`` as an int if it is a token count: a finite number of at least 0.

    What a caller's ``token_counter`` answers is checked before a budget adds it
    up: a negative or NaN count would let everything in, a ``None`` fail later. An
    int, a float, a ``Decimal`` or a numpy scalar is a number; a fraction is rounded
    up, so a budget never takes in more than it holds.

    Raises:
        TypeError: If it is not a number (a bool or a string is not one here).
        ValueError: If it is negative, NaN or infinite.
    """
    # numpy's and torch's booleans (a scalar, a 0-d array) are no more a count than
    # Python's: their type or dtype names a bool.
    if (
        isinstance(value, str | bytes)
        or type(value).__name__ in ("bool", "bool_")
        or "bool" in str(getattr(value, "dtype", ""))
        or not hasattr(type(value), "__float__")
    ):
        msg = f"token_counter must return a number of tokens, got {_shown(value)}"
        raise TypeError(msg)
    if isinstance(value, numbers.Integral):  # never a float: it may be too large for one
        count: float = int(value)
    else:
        try:
            count = float(value)
        except (TypeError, ValueError):  # an array of several values
            msg = f"token_counter must return a number of tokens, got {_shown(value)}"
            raise TypeError(msg) from None
    if count < 0 or not (isinstance(count, int) or math.isfinite(count)):
        msg = f"token_counter must return a finite count of at least 0, got {_shown(value)}"
        raise ValueError(msg)
    return count if isinstance(count, int) else math.ceil(count)


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
