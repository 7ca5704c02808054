"""Stand-ins for an LLM: langchain-core's fake chat models, lightly extended."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from langchain_tiered_memory.lexical import tokenize

#: Session ids that try to escape a folder or confuse a file system.
HOSTILE = [
    "../x",
    "/etc/passwd",
    "a/b",
    "..",
    ".",
    "会话 1",
    "会话_1",
    "__x",
    "x" * 255,
    "a/../../b",
    "..\\..\\x",
    "x.meta",
    ".lock",
    "~root",
    " x",
]


def turn(n: int, *, tool: bool = False) -> list[BaseMessage]:
    """One user turn: a question, optionally a tool round trip, and an answer."""
    messages: list[BaseMessage] = [HumanMessage(f"question {n}")]
    if tool:
        call_id = f"call-{n}"
        messages += [
            AIMessage("", tool_calls=[{"name": "lookup", "args": {"n": n}, "id": call_id}]),
            ToolMessage(f"result {n}", tool_call_id=call_id),
        ]
    messages.append(AIMessage(f"answer {n}"))
    return messages


def replies(*texts: str) -> Iterator[AIMessage]:
    """An endless iterator: the given replies, then ``reply N`` forever."""
    yield from (AIMessage(text) for text in texts)
    n = 0
    while True:
        n += 1
        yield AIMessage(f"reply {n}")


class RecordingChatModel(GenericFakeChatModel):
    """A fake chat model that remembers every prompt it was sent."""

    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.prompts.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


class CountingModel(GenericFakeChatModel):
    """A fake chat model whose token count is one per character of content."""

    def get_num_tokens_from_messages(
        self, messages: Sequence[BaseMessage], tools: Any = None
    ) -> int:
        return sum(len(str(m.content)) for m in messages)


class HashEmbeddings(Embeddings):
    """Deterministic bag-of-words vectors: fast, and similar texts are similar."""

    languages = None  # treated as knowing every language
    dims = 256

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for token in tokenize(text) or [text]:
            digest = hashlib.md5(token.encode("utf-8", "surrogatepass")).digest()
            vector[int.from_bytes(digest[:4], "little") % self.dims] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)
