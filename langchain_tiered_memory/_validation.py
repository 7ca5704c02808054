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


def validate_messages(messages: Iterable[Any]) -> Sequence[BaseMessage]:
    """Return ``messages`` as a list, raising ``TypeError`` on anything else."""
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
