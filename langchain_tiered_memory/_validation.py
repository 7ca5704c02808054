"""Checks for untrusted identifiers and message inputs.

Session and user ids reach SQL parameters, file paths and Chroma filters, so they
are validated once, at the edge, with errors that name the problem.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

MAX_ID_LENGTH = 255
#: Deepest nesting of dicts and lists accepted in a message's fields.
MAX_NESTING = 200


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
    for position, char in enumerate(value):
        category = unicodedata.category(char)
        if category == "Cc":
            msg = f"{name} contains the control character U+{ord(char):04X} at position {position}"
            raise ValueError(msg)
        if category == "Cs":
            msg = f"{name} contains a lone surrogate U+{ord(char):04X} at position {position}"
            raise ValueError(msg)
    return value


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
