"""JSON text that keeps every string exactly, lone surrogates included."""

from __future__ import annotations

import json
from typing import Any


def exact_json(value: Any) -> str:
    r"""``value`` as JSON text that UTF-8 can hold and ``json.loads`` reads back exactly.

    Non-ASCII characters are kept as they are (readable, compact), unless a string
    holds a lone surrogate (pasted from a broken clipboard, an emoji cut in half):
    UTF-8 cannot encode one, so the whole text is then written with ASCII escapes
    (``\ud83d``), which read back as the same string.
    """
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value)
    return text
