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
    """``value`` with every dict key a string: as JSON writes it, else its ``repr``.

    A key whose string another key of the dict already is gets a numbered suffix,
    so that no value is lost.
    """
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else _key_name(key)
            unique, n = name, 1
            while unique in out or (unique != key and unique in value):
                n += 1
                unique = f"{name} ({n})"
            out[unique] = string_keys(item)
        return out
    if isinstance(value, (list, tuple)):
        return [string_keys(item) for item in value]
    return value


def _key_name(key: Any) -> str:
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # "null", "true", "1", "1.5": what json.dumps makes of it
    return repr(key)


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
