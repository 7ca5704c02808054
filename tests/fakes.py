"""Stand-ins for an LLM: langchain-core's fake chat models, lightly extended."""

from __future__ import annotations

import base64
import hashlib
import io
import math
import operator
import re
import struct
import wave
from collections.abc import Iterator, Sequence
from functools import reduce
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    message_chunk_to_message,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from PIL import Image
from pydantic import Field

from langchain_tiered_memory.text.lexical import tokenize

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
    salt = ""  # another salt: another model of the same size

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for token in tokenize(text) or [text]:
            digest = hashlib.md5((self.salt + token).encode("utf-8", "surrogatepass")).digest()
            vector[int.from_bytes(digest[:4], "little") % self.dims] += self.weight(digest)
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    def weight(self, digest: bytes) -> float:
        """How much a token counts: every token alike."""
        return 1.0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)


class WeightedHashEmbeddings(HashEmbeddings):
    """``HashEmbeddings`` whose tokens weigh 0.5-1.5 by their hash.

    Texts of the same shape ("invoice 8 is 296 euros", "refund 7 is 259 euros")
    then score apart instead of tying, for tests that compare two rankings.
    """

    def weight(self, digest: bytes) -> float:
        return 0.5 + digest[4] / 255


class SaltedHashEmbeddings(HashEmbeddings):
    """Another model of ``HashEmbeddings``' size: its vectors are not comparable."""

    salt = "salted:"


class WideHashEmbeddings(HashEmbeddings):
    """A model of another size (384, as MiniLM after a 256-dimension model)."""

    dims = 384


USAGE = {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}


def cut(text: str, **metadata: Any) -> AIMessage:
    """A reply stopped by the output-token limit (OpenAI's spelling by default)."""
    return AIMessage(
        text,
        response_metadata={"finish_reason": "length", "model_name": "fake-1", **metadata},
        usage_metadata=USAGE,
    )


def done(text: str) -> AIMessage:
    """A reply that ended normally."""
    return AIMessage(
        text,
        response_metadata={"finish_reason": "stop", "model_name": "fake-1"},
        usage_metadata=USAGE,
    )


class ScriptedChatModel(RecordingChatModel):
    """Scripted replies that keep their metadata when streamed, and can fail mid-stream.

    Streaming splits a reply on whitespace; ``model_name`` rides on the first chunk,
    the finish reason and usage on the last one (as OpenAI, Anthropic and Ollama
    send them). ``fail_after`` raises after that many chunks of a stream.
    ``bind_tools`` binds OpenAI tool schemas; ``calls`` records each call's kwargs.
    """

    calls: list[dict[str, Any]] = Field(default_factory=list)
    fail_after: int | None = None

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls.append({k: v for k, v in kwargs.items() if k != "run_manager"})
        return super()._generate(messages, *args, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        result = self._generate(messages, stop=stop, **kwargs)
        message = result.generations[0].message
        assert isinstance(message, AIMessage)
        tokens = [t for t in re.split(r"(\s)", message.text) if t] or [""]
        metadata = dict(message.response_metadata)
        first_metadata = {"model_name": metadata.pop("model_name", "fake-1")}
        for index, token in enumerate(tokens):
            if self.fail_after is not None and index == self.fail_after:
                msg = "connection reset mid-stream"
                raise ConnectionError(msg)
            last = index == len(tokens) - 1
            chunk = AIMessageChunk(
                content=token,
                id=message.id,
                response_metadata={
                    **(first_metadata if index == 0 else {}),
                    **(metadata if last else {}),
                },
                usage_metadata=message.usage_metadata if last else None,
                tool_call_chunks=[
                    {"name": c["name"], "args": repr(c["args"]), "id": c["id"], "index": i}
                    for i, c in enumerate(message.tool_calls)
                ]
                if last
                else [],
                chunk_position="last" if last else None,
            )
            generation = ChatGenerationChunk(message=chunk)
            if run_manager:
                run_manager.on_llm_new_token(token, chunk=generation)
            yield generation

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


class ChunkedChatModel(BaseChatModel):
    """Streams each scripted reply as its chunks; ``invoke`` answers their sum.

    For replies whose streamed shape ``ScriptedChatModel`` cannot make: content
    blocks numbered by ``index`` (Anthropic's thinking and text), reasoning in
    ``additional_kwargs`` (DeepSeek's ``reasoning_content``).
    """

    replies: list[list[AIMessageChunk]]

    @property
    def _llm_type(self) -> str:
        return "chunked-fake"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        message = message_chunk_to_message(reduce(operator.add, self.replies.pop(0)))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self.replies.pop(0):
            yield ChatGenerationChunk(message=chunk)


def wav_base64(seconds: float, rate: int = 16_000) -> str:
    """A real WAV recording of ``seconds`` of silence (16-bit mono) as base64."""
    out = io.BytesIO()
    with wave.open(out, "wb") as recording:
        recording.setnchannels(1)
        recording.setsampwidth(2)
        recording.setframerate(rate)
        recording.writeframes(b"\0\0" * int(seconds * rate))
    return base64.b64encode(out.getvalue()).decode()


def mp4_base64(seconds: int) -> str:
    """An MP4 whose movie header says it lasts ``seconds``, as base64."""

    def atom(name: bytes, payload: bytes) -> bytes:
        return struct.pack(">I4s", 8 + len(payload), name) + payload

    header = atom(b"mvhd", bytes(4) + struct.pack(">IIII", 0, 0, 1000, seconds * 1000) + bytes(80))
    data = atom(b"ftyp", b"isom\0\0\0\0isom") + atom(b"moov", header) + atom(b"mdat", bytes(4096))
    return base64.b64encode(data).decode()


def pdf_base64(pages: int) -> str:
    """A real PDF of ``pages`` blank pages as base64."""
    import pypdf

    writer = pypdf.PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    return base64.b64encode(out.getvalue()).decode()


def image_base64(width: int, height: int, image_format: str = "PNG", exif_bytes: int = 0) -> str:
    """A real image of ``width`` x ``height`` pixels as base64 (with ``exif_bytes`` of EXIF)."""
    out = io.BytesIO()
    extra = {"exif": b"Exif\x00\x00" + b"\x00" * exif_bytes} if exif_bytes else {}
    Image.new("RGB", (width, height)).save(out, image_format, **extra)
    return base64.b64encode(out.getvalue()).decode()
