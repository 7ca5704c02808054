"""Text and JSON that UTF-8 can hold: strings kept exactly, or lone surrogates replaced."""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so UTF-8 can encode it.

    A lone surrogate (pasted from a broken clipboard, an emoji cut in half) cannot
    be written to MySQL's utf8mb4, a file or Chroma, and tokenizers refuse it: what
    is stored, embedded or searched passes through here first. Everything else is
    kept as it is.
    """
    return _SURROGATE.sub("\ufffd", text)


def stand_in(value: Any) -> Any:
    """LangChain's own JSON for a value JSON cannot hold (``dumpd``).

    A date or a DataFrame becomes ``{"lc": 1, "type": "not_implemented", "repr": ...}``,
    as LangChain's tracers record it. (A pydantic model in a message, a ``Document``
    artifact, never gets here: ``message_to_dict`` has made it a dict of its fields,
    which is what is archived and read back, as LangChain's own histories do.)
    """
    from langchain_core.load import dumpd

    return dumpd(value)


def string_keys(value: Any, *, reprs: bool = True) -> Any:
    """``value`` with every dict key a string: as JSON writes it, else its ``repr``.

    A key whose string another key of the dict already is gets a numbered suffix,
    so that no value is lost.

    Args:
        value: What to convert (dicts, lists and tuples at any depth).
        reprs: Write a key JSON cannot hold (a tuple) as its ``repr``; if
            ``False``, such a key raises ``TypeError`` as ``json.dumps`` does.
    """
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else _key_name(key, reprs)
            unique, n = name, 1
            while unique in out or (unique != key and unique in value):
                n += 1
                unique = f"{name} ({n})"
            out[unique] = string_keys(item, reprs=reprs)
        return out
    if isinstance(value, (list, tuple)):
        return [string_keys(item, reprs=reprs) for item in value]
    return value


def _key_name(key: Any, reprs: bool) -> str:
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # "null", "true", "1", "1.5": what json.dumps makes of it
    if not reprs:
        msg = f"keys must be str, int, float, bool or None, not {type(key).__name__}"
        raise TypeError(msg)
    return repr(key)


def has_other_keys(value: Any) -> bool:
    """Whether a dict in ``value``, at any depth, has a key that is not a ``str``.

    Walks only dicts, lists and tuples (what ``json.dumps`` walks), without
    recursion, so a deep value costs no stack.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return True
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def exact_json(value: Any, *, stand_ins: bool = False) -> str:
    r"""``value`` as JSON text that UTF-8 can hold and ``json.loads`` reads back exactly.

    Non-ASCII characters are kept as they are (readable, compact), unless a string
    holds a lone surrogate (pasted from a broken clipboard, an emoji cut in half):
    UTF-8 cannot encode one, so the whole text is then written with ASCII escapes
    (``\ud83d``), which read back as the same string.

    Dict keys that are not strings are written as :func:`string_keys` writes
    them, so ``1`` and ``"1"`` in one dict both keep their values (``json.dumps``
    would write both as ``"1"``, and ``json.loads`` keep only the last).

    Args:
        value: What to write.
        stand_ins: Write a value JSON cannot hold as its :func:`stand_in`, and a
            key JSON cannot hold as its ``repr``, instead of raising ``TypeError``
            (an archived message keeps its text and the rest of its fields).

    Raises:
        TypeError: Without ``stand_ins``, if a value or key JSON cannot hold.
    """
    default = stand_in if stand_ins else None
    if has_other_keys(value):  # rare: the rebuild is paid only then
        value = string_keys(value, reprs=stand_ins)
    text = json.dumps(value, ensure_ascii=False, default=default)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, default=default)
    return text
