"""Helpers for the long-term memory tests: fake extractors, embeddings and table readers."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from typing import Any

import numpy as np
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field
from sqlalchemy import select

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory

from .fakes import HashEmbeddings, replies

_USER_LINE = re.compile(r"^(?:User|用户): (.*)$", re.MULTILINE)


class Recorder:
    """A thread-safe log of the prompts extractors were sent (shared between models)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompts: list[str] = []
        self.by_model: dict[str, int] = {}

    def add(self, model: str, prompt: str) -> int:
        with self.lock:
            self.prompts.append(prompt)
            self.by_model[model] = self.by_model.get(model, 0) + 1
            return len(self.prompts)

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.prompts)


class FakeExtractor(GenericFakeChatModel):
    """A fake LLM extractor: answers ``Summary: <the user's line>``.

    It records every prompt, and on purpose it can fail its first ``fail_first``
    calls (or every call), sleep ``sleep`` seconds per call, or give a fixed
    ``answer`` (an empty string is a garbage answer).
    """

    messages: Any = Field(default_factory=replies)
    recorder: Any = Field(default_factory=Recorder)
    name_tag: str = "extractor"
    fail_first: int = 0
    fail_always: bool = False
    sleep: float = 0.0
    answer: str | None = None

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        prompt = str(messages[-1].content)
        call = self.recorder.add(self.name_tag, prompt)
        if self.sleep:
            time.sleep(self.sleep)
        if self.fail_always or call <= self.fail_first:
            msg = f"extractor failure #{call}"
            raise RuntimeError(msg)
        if self.answer is not None:
            text = self.answer
        else:
            found = _USER_LINE.search(prompt)
            text = f"Summary: {found.group(1) if found else prompt[-40:]}"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


class EnglishOnlyEmbeddings(HashEmbeddings):
    """Declares it knows English only; its vectors come from a table, else noise.

    ``table`` maps a substring to a fixed vector, so a test can make the dense side
    rank things adversarially; any other text gets a pseudo-random unit vector.
    """

    languages = frozenset({"en"})

    def __init__(self, table: dict[str, list[float]] | None = None) -> None:
        self.table = table or {}

    def _vector(self, text: str) -> list[float]:
        for marker, vector in self.table.items():
            if marker in text:
                return list(vector)
        seed = int.from_bytes(hashlib.md5(text.encode("utf-8")).digest()[:4], "little")
        raw = np.random.default_rng(seed).normal(size=self.dims)
        return (raw / np.linalg.norm(raw)).tolist()


class TableEmbeddings(EnglishOnlyEmbeddings):
    """The same vectors as :class:`EnglishOnlyEmbeddings`, but claiming every language."""

    languages = None


def unit(index: int, dims: int = HashEmbeddings.dims, sign: float = 1.0) -> list[float]:
    vector = [0.0] * dims
    vector[index] = sign
    return vector


def say(history: TieredChatMessageHistory, question: str, answer: str | None = None) -> None:
    """One completed turn."""
    history.add_messages([HumanMessage(question), AIMessage(answer or f"ok: {question}")])


def catalog(backup: MySQLBackup, session_id: str | None = None) -> list[Any]:
    """The memory catalog's rows, in ``seq`` order."""
    c = backup.tables.memories.c

    def plan() -> Any:
        query = select(backup.tables.memories).order_by(c.seq)
        if session_id is not None:
            query = query.where(c.session_id == session_id)
        result = yield query
        return result.all()

    return backup.run(plan())


def job_rows(backup: MySQLBackup) -> list[Any]:
    """The job queue's rows, in id order."""
    j = backup.tables.jobs

    def plan() -> Any:
        result = yield select(j).order_by(j.c.id)
        return result.all()

    return backup.run(plan())


def sources(row: Any) -> list[int]:
    return json.loads(row.source_ids)


def archive_ids(backup: MySQLBackup, session_id: str) -> list[int]:
    """The archive ids of a session's messages, oldest first."""
    return [m.id for m in backup.history(session_id, limit=10_000)]


def turn_ids(backup: MySQLBackup, session_id: str) -> list[list[int]]:
    """The archive ids of each turn of a session (a turn starts at a human message)."""
    turns: list[list[int]] = []
    for message in backup.history(session_id, limit=10_000):
        if message.role == "human" or not turns:
            turns.append([])
        turns[-1].append(message.id)
    return turns


def chroma_ids(collection: Any, where: dict[str, Any] | None = None) -> list[str]:
    return collection.get(where=where, include=[])["ids"]


def wait_until(condition: Any, timeout: float = 20.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def without_column(backup: MySQLBackup, column: str) -> MySQLBackup:
    """The archive as an older version left it: ``column`` of the catalog dropped, reopened.

    The reopened backup (the caller disposes of it) has added the column back, empty.
    """
    with backup.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {backup.tables.memories.name} DROP COLUMN {column}")
    return MySQLBackup(
        backup.url.render_as_string(hide_password=False), table_name=backup.table.name
    )
