"""JSON text that keeps every string exactly, lone surrogates included."""

from __future__ import annotations

import json
from typing import Any


def stand_in(value: Any) -> Any:
    """LangChain's own JSON for a value JSON cannot hold (``dumpd``).

    A ``Serializable`` (a ``Document``) becomes its constructor form; anything else
    (a date, a DataFrame) ``{"lc": 1, "type": "not_implemented", "repr": ...}``, as
    LangChain's tracers record it.
    """
    from langchain_core.load import dumpd

    return dumpd(value)


def string_keys(value: Any) -> Any:
    """``value`` with every dict key JSON cannot hold (a tuple) as its ``repr``."""
    if isinstance(value, dict):
        return {
            key if isinstance(key, str) else repr(key): string_keys(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [string_keys(item) for item in value]
    return value


def exact_json(value: Any, *, stand_ins: bool = False) -> str:
    r"""``value`` as JSON text that UTF-8 can hold and ``json.loads`` reads back exactly.

    Non-ASCII characters are kept as they are (readable, compact), unless a string
    holds a lone surrogate (pasted from a broken clipboard, an emoji cut in half):
    UTF-8 cannot encode one, so the whole text is then written with ASCII escapes
    (``\ud83d``), which read back as the same string.

    Args:
        value: What to write.
        stand_ins: Write a value JSON cannot hold as its :func:`stand_in`, and a
            key JSON cannot hold as its ``repr``, instead of raising ``TypeError``
            (an archived message keeps its text and the rest of its fields).
    """
    default = stand_in if stand_ins else None
    try:
        text = json.dumps(value, ensure_ascii=False, default=default)
    except TypeError:
        if not stand_ins:
            raise
        value = string_keys(value)  # a key JSON cannot hold: `default` never sees keys
        text = json.dumps(value, ensure_ascii=False, default=default)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, default=default)
    return text
