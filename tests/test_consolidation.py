"""MemoryConsolidator: MEMORY.md/HISTORY.md from old history, on SQLite and MariaDB.

The LLM is a langchain-core fake chat model (``GenericFakeChatModel`` or
``FakeListChatModel``), extended to record prompts, fail, hang or report how many
calls run at once for a session. Crashes are real child processes killed with
SIGKILL (or ending with ``os._exit``) in the middle of a consolidation.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from pydantic import Field
from sqlalchemy import select

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.core.prompts import PROMPTS, prompts_for
from langchain_tiered_memory.core.validation import safe_filename
from langchain_tiered_memory.text.tokens import exact_tokens, prompt_budget
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator

from .fakes import HOSTILE
from .long_memory_support import job_rows, wait_until

REPO = Path(__file__).resolve().parents[1]
ZH_HEADINGS = ["用户偏好和习惯", "已知的数据库信息", "已解决的问题和答案", "待解决的问题"]
EN_HEADINGS = [
    "User preferences and habits",
    "Known database facts",
    "Solved problems and their answers",
    "Open problems",
]
_RANGE = re.compile(r"#(\d+)-#(\d+)")
_MARKER = re.compile(r"<!-- batch (\d+)-(\d+) -->")
_SESSION_TAG = re.compile(r"\[s:(\w+)\]")


# -- the fake LLM ---------------------------------------------------------------------


class Calls:
    """A thread-safe log of the prompts, and of the calls in flight per session tag."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompts: list[str] = []
        self.inflight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.started = threading.Event()

    def begin(self, prompt: str) -> tuple[int, str]:
        found = _SESSION_TAG.search(prompt)
        key = found.group(1) if found else "-"
        with self.lock:
            self.prompts.append(prompt)
            self.inflight[key] += 1
            self.peak[key] = max(self.peak[key], self.inflight[key])
            number = len(self.prompts)
        self.started.set()
        return number, key

    def end(self, key: str) -> None:
        with self.lock:
            self.inflight[key] -= 1

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.prompts)


class FakeLLM(GenericFakeChatModel):
    """A fake MEMORY.md writer.

    It answers ``answer`` (or ``# Memory v<call>``), and on purpose fails its first
    ``fail_first`` calls (or all of them), sleeps ``sleep`` seconds in its first
    ``sleep_first`` calls (all calls when 0), or waits for ``gate`` to open.
    """

    messages: Iterator[Any] = Field(default_factory=lambda: iter(()))
    calls: Any = Field(default_factory=Calls)
    answer: str | None = None
    fail_first: int = 0
    fail_always: bool = False
    sleep: float = 0.0
    sleep_first: int = 0
    gate: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        number, key = self.calls.begin(str(messages[-1].content))
        try:
            if self.gate is not None:
                self.gate.wait(30)
            if self.sleep and (not self.sleep_first or number <= self.sleep_first):
                time.sleep(self.sleep)
            if self.fail_always or number <= self.fail_first:
                msg = f"llm failure #{number}"
                raise RuntimeError(msg)
            text = self.answer if self.answer is not None else f"# Memory v{number}"
            message = AIMessage(text, response_metadata=dict(self.metadata))
            return ChatResult(generations=[ChatGeneration(message=message)])
        finally:
            self.calls.end(key)


class CancelledLLM(FakeLLM):
    """Raises ``asyncio.CancelledError`` (no ``Exception``), as a cancelled HTTP client does."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        _, key = self.calls.begin(str(messages[-1].content))
        self.calls.end(key)
        raise asyncio.CancelledError("request cancelled")


# -- helpers ------------------------------------------------------------------------


def mark(n: int, lang: str = "en", tag: str = "") -> str:
    """The unique label of message ``n`` (zero-padded, so no label contains another)."""
    return f"{tag}第{n:03d}条" if lang == "zh" else f"{tag}M{n:03d}"


def chat(first: int, last: int, *, lang: str = "en", tag: str = "") -> list[BaseMessage]:
    """Messages ``first``..``last``: odd ones from the user, even ones from the AI."""
    out: list[BaseMessage] = []
    for n in range(first, last + 1):
        label = mark(n, lang, tag)
        if lang == "zh":
            text = (
                f"{label}：请问订单表的字段 amount_{n:03d} 是什么意思？"
                if n % 2
                else f"{label}：这个字段表示含税金额，单位是人民币元。"
            )
        else:
            text = (
                f"{label}: what does column amount_{n:03d} of table orders mean?"
                if n % 2
                else f"{label}: it is the gross amount in euros."
            )
        out.append(HumanMessage(text) if n % 2 else AIMessage(text))
    return out


def message_ids(backup: MySQLBackup, session_id: str) -> list[int]:
    return [m.id for m in backup.history(session_id, limit=10_000)]


def cursor_of(backup: MySQLBackup, session_id: str) -> int | None:
    c = backup.tables.consolidation.c

    def plan() -> Any:
        result = yield select(c.cursor).where(c.session_id == session_id)
        return result.scalar()

    return backup.run(plan())


def log_rows(backup: MySQLBackup, session_id: str | None = None) -> list[Any]:
    h = backup.tables.history_log

    def plan() -> Any:
        query = select(h).order_by(h.c.session_id, h.c.first_id)
        if session_id is not None:
            query = query.where(h.c.session_id == session_id)
        result = yield query
        return result.all()

    return backup.run(plan())


def consolidation_rows(backup: MySQLBackup) -> list[Any]:
    c = backup.tables.consolidation

    def plan() -> Any:
        result = yield select(c).order_by(c.c.session_id)
        return result.all()

    return backup.run(plan())


def consolidate_jobs(backup: MySQLBackup) -> list[Any]:
    return [row for row in job_rows(backup) if row.kind == "consolidate"]


def ranges(entries: list[str]) -> list[tuple[int, int]]:
    found = []
    for entry in entries:
        match = _RANGE.search(entry)
        assert match, entry
        found.append((int(match.group(1)), int(match.group(2))))
    return found


def markers(path: Path) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in _MARKER.findall(path.read_text(encoding="utf-8"))]


def batches(ids: list[int], size: int, count: int) -> list[tuple[int, int]]:
    return [(ids[i * size], ids[i * size + size - 1]) for i in range(count)]


def assert_consolidated(
    consolidator: MemoryConsolidator,
    session_id: str,
    *,
    messages: int,
    batch_count: int,
    files: bool = True,
) -> None:
    """Exactly one HISTORY entry per batch, contiguous, cursor at the last one, nothing lost."""
    backup = consolidator.backup
    ids = message_ids(backup, session_id)
    assert len(ids) == messages  # nothing lost from the archive
    expected = batches(ids, consolidator.batch, batch_count)
    assert ranges(consolidator.history_entries(session_id)) == expected
    assert [(r.first_id, r.last_id) for r in log_rows(backup, session_id)] == expected
    assert cursor_of(backup, session_id) == expected[-1][1]
    assert len(ids) - ids.index(expected[-1][1]) - 1 <= consolidator.threshold
    if files:
        assert markers(consolidator.folder(session_id) / "HISTORY.md") == expected


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "memory"


@pytest.fixture
def make_consolidator(
    backup: MySQLBackup, root: Path
) -> Iterator[Callable[..., MemoryConsolidator]]:
    """Consolidators on the test's archive (no worker thread unless asked); closed after."""
    made: list[MemoryConsolidator] = []

    def make(llm: Any, **kwargs: Any) -> MemoryConsolidator:
        kwargs.setdefault("root", root)
        kwargs.setdefault("backup", backup)
        kwargs.setdefault("start_worker", False)
        kwargs.setdefault("retry_base_delay", 0.01)
        consolidator = MemoryConsolidator(llm, **kwargs)
        made.append(consolidator)
        return consolidator

    yield make
    for consolidator in made:
        consolidator.close(timeout=10)


# -- 1. the design defaults -------------------------------------------------------------

ZH_ANSWER = (
    "## 用户偏好和习惯\n- 喜欢简洁的中文回答\n"
    "## 已知的数据库信息\n- 订单表 orders：amount_001 是含税金额\n"
    "- 连接 mysql://app:s3cret@db/erp，password=hunter2\n"
    "## 已解决的问题和答案\n- amount 字段的含义\n"
    "## 待解决的问题\n- 无\n\n"
)
ZH_MEMORY = (
    "## 用户偏好和习惯\n- 喜欢简洁的中文回答\n"
    "## 已知的数据库信息\n- 订单表 orders：amount_001 是含税金额\n"
    "- 连接 mysql://app:***@db/erp，password=***\n"
    "## 已解决的问题和答案\n- amount 字段的含义\n"
    "## 待解决的问题\n- 无\n"
)


def test_design_defaults_chinese_conversation(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator], root: Path
) -> None:
    llm = FakeLLM(answer=ZH_ANSWER)
    consolidator = make_consolidator(llm)
    assert (consolidator.threshold, consolidator.batch) == (100, 50)
    session = "销售/会话 1"
    history = TieredChatMessageHistory(
        session, user_id="u", backup=backup, consolidator=consolidator
    )
    history.add_messages(chat(1, 100, lang="zh"))
    assert consolidate_jobs(backup) == []  # 100 is not past the threshold
    history.add_messages(chat(101, 101, lang="zh"))
    ids = message_ids(backup, session)
    [job] = consolidate_jobs(backup)
    assert (job.session_id, job.user_id, job.last_message_id) == (session, "u", ids[-1])
    assert history.consolidated_memory == ""

    consolidator.flush(timeout=30)
    [prompt] = llm.calls.prompts
    for heading in ZH_HEADINGS:
        assert heading in prompt
    assert "## 当前长期记忆\n-\n" in prompt  # no MEMORY.md yet
    for n in range(1, 51):
        assert mark(n, "zh") in prompt
    assert mark(51, "zh") not in prompt
    assert f"用户: {mark(1, 'zh')}" in prompt and f"助手: {mark(2, 'zh')}" in prompt

    folder = root / safe_filename(session)
    assert consolidator.folder(session) == folder
    memory_md = (folder / "MEMORY.md").read_text(encoding="utf-8")
    assert memory_md == ZH_MEMORY
    assert "s3cret" not in memory_md and "hunter2" not in memory_md
    assert history.consolidated_memory == ZH_MEMORY == consolidator.memory(session)
    history_md = (folder / "HISTORY.md").read_text(encoding="utf-8")
    assert all(mark(n, "zh") in history_md for n in range(1, 51))
    assert mark(51, "zh") not in history_md
    [entry] = consolidator.history_entries(session)
    assert "[RAW]" not in entry and entry in history_md
    assert ranges([entry]) == [(ids[0], ids[49])]
    assert markers(folder / "HISTORY.md") == [(ids[0], ids[49])]
    assert cursor_of(backup, session) == ids[49]
    assert consolidate_jobs(backup) == []  # 51 left: no second job

    # The backlog must pass the threshold again before the next job is queued.
    history.add_messages(chat(102, 150, lang="zh"))  # 100 past the cursor
    assert consolidate_jobs(backup) == []
    history.add_messages(chat(151, 151, lang="zh"))  # 101
    assert len(consolidate_jobs(backup)) == 1
    consolidator.flush(timeout=30)
    second = llm.calls.prompts[1]
    current = second.split("## 需要处理的对话")[0]
    assert ZH_MEMORY.strip() in current  # the current MEMORY.md goes with the batch
    assert mark(51, "zh") in second and mark(100, "zh") in second
    assert mark(50, "zh") not in second and mark(101, "zh") not in second
    assert_consolidated(consolidator, session, messages=151, batch_count=2)


def test_design_defaults_english_conversation(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    llm = FakeLLM(answer="## User preferences and habits\n- short answers, api_key=sk-abc")
    consolidator = make_consolidator(llm)
    history = TieredChatMessageHistory("en", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 101))
    consolidator.flush(timeout=30)
    [prompt] = llm.calls.prompts
    for heading in EN_HEADINGS:
        assert heading in prompt
    for heading in ZH_HEADINGS:
        assert heading not in prompt
    assert "## Current long-term memory\n-\n" in prompt
    assert f"User: {mark(1)}" in prompt and f"Assistant: {mark(50)}" in prompt
    assert mark(51) not in prompt
    memory_md = history.consolidated_memory
    assert memory_md == "## User preferences and habits\n- short answers, api_key=***\n"
    assert (consolidator.folder("en") / "MEMORY.md").read_text(encoding="utf-8") == memory_md


def test_custom_prompts_reach_the_llm_whatever_the_conversation_language(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    house = replace(
        PROMPTS["en"],
        consolidation="HOUSE STYLE\nnow: {memory}\nchat:\n{conversation}",
        consolidation_roles={"human": "Customer", "ai": "Clerk"},
    )
    llm = FakeLLM(answer="# Memory")
    consolidator = make_consolidator(llm, prompts=house)
    history = TieredChatMessageHistory("house", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 101, lang="zh"))  # a Chinese chat: the house style wins
    consolidator.flush(timeout=30)
    [prompt] = llm.calls.prompts
    assert prompt.startswith("HOUSE STYLE\nnow: -\nchat:\n")
    # A house style without its own limit line gets the English one.
    assert prompt.endswith(
        "\nKeep the whole document under 16000 tokens: merge related points "
        "and drop what no longer matters.\n"
    )
    assert f"Customer: {mark(1, 'zh')}" in prompt and f"Clerk: {mark(2, 'zh')}" in prompt
    assert not any(heading in prompt for heading in ZH_HEADINGS + EN_HEADINGS)


@pytest.mark.parametrize(
    "limit",
    ["Under {tokens} tokens for {user}.", "Under {tokens} tokens {}.", 'e.g. {"a": 1} {tokens}'],
)
def test_a_limit_line_that_cannot_be_formatted_is_refused_by_name(limit: str) -> None:
    with pytest.raises(ValueError, match="the consolidation_limit prompt cannot be formatted"):
        replace(PROMPTS["en"], consolidation_limit=limit)


def test_a_prompt_without_its_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="memory"):
        replace(PROMPTS["zh"], consolidation="只有 {conversation}")
    with pytest.raises(ValueError, match="'ai'"):
        replace(PROMPTS["en"], consolidation_roles={"human": "User"})
    with pytest.raises(ValueError, match="language must be 'en' or 'zh'"):
        prompts_for("fr")


def test_the_job_is_queued_in_the_same_transaction_as_the_messages(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import langchain_tiered_memory.tiers.consolidation as consolidation_module

    consolidator = make_consolidator(FakeLLM())
    history = TieredChatMessageHistory("tx", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 100))
    original = consolidation_module.backlog_enqueue_plan

    def enqueue_then_fail(*args: Any, **kwargs: Any) -> Any:
        queued = yield from original(*args, **kwargs)
        assert queued  # the INSERT of the job was sent ...
        msg = "the transaction dies after the job was queued"
        raise RuntimeError(msg)  # ... and is rolled back with the messages

    monkeypatch.setattr(consolidation_module, "backlog_enqueue_plan", enqueue_then_fail)
    with pytest.raises(RuntimeError, match="dies after"):
        history.add_messages(chat(101, 101))
    assert len(message_ids(backup, "tx")) == 100
    assert consolidate_jobs(backup) == []
    monkeypatch.undo()
    history.add_messages(chat(101, 101))
    [job] = consolidate_jobs(backup)
    assert job.last_message_id == message_ids(backup, "tx")[-1]


def test_250_messages_are_consolidated_batch_after_batch(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    llm = FakeListChatModel(responses=["# Memory v1", "# Memory v2", "# Memory v3"])
    consolidator = make_consolidator(llm)
    history = TieredChatMessageHistory("long", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 250))
    assert len(consolidate_jobs(backup)) == 1
    cursors = [cursor_of(backup, "long") or 0]
    for _ in range(10):
        if consolidator.run_pending(max_batches=1) == 0:
            break
        cursors.append(cursor_of(backup, "long"))
    assert consolidate_jobs(backup) == []
    assert cursors == sorted(set(cursors))  # the cursor only moves forward
    assert len(cursors) == 4  # three batches: 100 messages (<= threshold) remain
    assert_consolidated(consolidator, "long", messages=250, batch_count=3)
    entries = consolidator.history_entries("long")
    spans = ranges(entries)
    ids = message_ids(backup, "long")
    covered = [i for first, last in spans for i in ids if first <= i <= last]
    assert covered == ids[:150]  # contiguous, no gap, no overlap
    for n, entry in enumerate(entries):
        assert all(mark(k) in entry for k in range(n * 50 + 1, n * 50 + 51))
    assert consolidator.memory("long") == "# Memory v3\n"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("连接 mysql+pymysql://app:s3cret@db:3306/erp", "s3cret"),
        ("PASSWORD=hunter2", "hunter2"),
        ("密码：hunter2", "hunter2"),
        ("api_key: sk-abcdefghijklmnop", "abcdefghijklmnop"),
        ("token=ghp_abcdefghijklmnopqrstu", "abcdefghijklmnopqrstu"),
        # A connection written as JSON (or a Python dict): the key is quoted.
        ('{"user": "app", "password": "hunter2"}', "hunter2"),
        # A quoted value with a space: all of it is the secret.
        ('password="correct horse"', "horse"),
    ],
)
def test_memory_md_never_keeps_a_secret(text: str, secret: str) -> None:
    from langchain_tiered_memory.tiers.consolidation import redact

    assert secret not in redact(text)
    assert "***" in redact(text)


# -- 2. the documents live in the database -------------------------------------------


def test_another_server_with_another_root_sees_the_same_documents(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    tmp_path: Path,
) -> None:
    first = make_consolidator(FakeLLM(answer="# memory of server one"), threshold=4, batch=2)
    TieredChatMessageHistory("shared", backup=backup, consolidator=first).add_messages(chat(1, 6))
    first.flush(timeout=30)

    # A second app server: its own engine and its own (empty) folder.
    url = backup.url.render_as_string(hide_password=False)
    other_backup = MySQLBackup(url, table_name=backup.table.name)
    try:
        llm = FakeLLM(answer="# memory of server two")
        second = make_consolidator(
            llm, backup=other_backup, root=tmp_path / "other", threshold=4, batch=2
        )
        assert second.memory("shared") == first.memory("shared") == "# memory of server one\n"
        assert second.history_entries("shared") == first.history_entries("shared")
        assert len(second.history_entries("shared")) == 1
        assert not second.folder("shared").exists()

        # It carries on from the shared cursor and the shared MEMORY.md.
        later = TieredChatMessageHistory("shared", backup=other_backup, consolidator=second)
        later.add_messages(chat(7, 7))
        second.flush(timeout=30)
        [prompt] = llm.calls.prompts
        assert "# memory of server one" in prompt
        assert mark(3) in prompt and mark(4) in prompt and mark(2) not in prompt
        assert first.memory("shared") == "# memory of server two\n"
        assert_consolidated(first, "shared", messages=7, batch_count=2, files=False)
    finally:
        other_backup.dispose()


# -- 3. failures: retries, timeouts and the raw fallback ----------------------------------


def test_a_failing_llm_archives_the_batch_raw(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    root: Path,
) -> None:
    # One session per kind of failure, one after the other (they share the queue).
    for session, llm in {
        "error": FakeLLM(fail_always=True),
        "hang": FakeLLM(sleep=2.0),  # past timeout=0.2
        "empty": FakeLLM(answer="  \n "),
        "huge": FakeLLM(answer="# memory\n" + "y" * (20 * 1024 * 1024)),
        "cancelled": CancelledLLM(),  # it killed the worker thread for good
    }.items():
        consolidator = make_consolidator(llm, timeout=0.2)
        history = TieredChatMessageHistory(session, backup=backup, consolidator=consolidator)
        history.add_messages(chat(1, 101))
        consolidator.flush(timeout=30)
        assert llm.calls.count == 3, session  # max_attempts, then no more LLM calls
        assert_consolidated(consolidator, session, messages=101, batch_count=1)
        [entry] = consolidator.history_entries(session)
        assert "[RAW]" in entry.splitlines()[1]
        assert all(mark(n) in entry for n in range(1, 51))  # nothing lost
        assert mark(51) not in entry
        folder = root / safe_filename(session)
        assert entry in (folder / "HISTORY.md").read_text(encoding="utf-8")
        assert not (folder / "MEMORY.md").exists()
        assert consolidator.memory(session) == ""
        [row] = log_rows(backup, session)
        assert row.raw == 1
        assert consolidate_jobs(backup) == []


def assert_kept_then_raw(consolidator: MemoryConsolidator, session: str, memory: str) -> None:
    """MEMORY.md stayed ``memory``; the second batch (messages 3-4) went to HISTORY.md raw."""
    assert consolidator.memory(session) == memory
    first, second = consolidator.history_entries(session)
    assert "[RAW]" not in first and "[RAW]" in second
    assert mark(3) in second and mark(4) in second
    assert_consolidated(consolidator, session, messages=7, batch_count=2)


def test_a_raw_batch_leaves_an_existing_memory_unchanged(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    consolidator = make_consolidator(FakeLLM(answer="# good memory"), threshold=4, batch=2)
    history = TieredChatMessageHistory("keep", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)
    memory_path = consolidator.folder("keep") / "MEMORY.md"
    before = memory_path.read_bytes()
    consolidator.llm = FakeLLM(fail_always=True)
    history.add_messages(chat(6, 7))
    consolidator.flush(timeout=30)
    assert memory_path.read_bytes() == before
    assert_kept_then_raw(consolidator, "keep", "# good memory\n")


@pytest.mark.parametrize(
    "metadata",
    [
        {"finish_reason": "length"},  # OpenAI
        {"stop_reason": "max_tokens"},  # Anthropic
        {"incomplete_details": {"reason": "max_output_tokens"}},  # OpenAI Responses
        {"stop_reason": "model_context_window_exceeded"},  # Anthropic
        {"finish_reason": "content_filter"},  # OpenAI, Azure: cut by the filter
        {"stopReason": "content_filtered"},  # Bedrock Converse
        {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}},
        {"finish_reason": "SAFETY"},  # Gemini
        {"stop_reason": "refusal"},  # Anthropic
    ],
)
def test_an_answer_cut_at_the_output_limit_keeps_the_memory(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    metadata: dict[str, Any],
) -> None:
    # MEMORY.md is rewritten whole by each answer: a cut one would drop every fact
    # after the cut, and the old document with them.
    good = FakeLLM(answer="# good memory\n- a\n- b")
    consolidator = make_consolidator(good, threshold=4, batch=2)
    history = TieredChatMessageHistory("cut", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)
    memory_path = consolidator.folder("cut") / "MEMORY.md"
    before = memory_path.read_bytes()
    llm = FakeLLM(answer="# good memory\n- a\n- ", metadata=metadata)
    consolidator.llm = llm
    history.add_messages(chat(6, 7))
    consolidator.flush(timeout=30)
    assert llm.calls.count == 3  # each cut answer is a failed attempt
    assert memory_path.read_bytes() == before
    assert_kept_then_raw(consolidator, "cut", "# good memory\n- a\n- b\n")


def test_tool_calls_reach_the_prompt_and_history_md(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    # An AI message that only calls a tool says what was run in its call alone:
    # its line was "Assistant: ", in the prompt and in the raw archive of HISTORY.md.
    llm = FakeLLM(fail_always=True)
    consolidator = make_consolidator(llm, threshold=4, batch=4, max_attempts=1)
    call = {"name": "run_sql", "args": {"sql": "SELECT * FROM ar_invoice"}, "id": "c1"}
    bad = {"name": "lookup", "args": "{not json", "id": "c2", "error": "bad"}
    history = TieredChatMessageHistory("tools", backup=backup, consolidator=consolidator)
    history.add_messages(
        [
            HumanMessage("overdue invoices?"),
            AIMessage("", tool_calls=[call], invalid_tool_calls=[bad]),
            ToolMessage("3 rows", tool_call_id="c1", name="run_sql"),
            ToolMessage("error", tool_call_id="c2", name="lookup"),
            AIMessage("3 are overdue"),
        ]
    )
    consolidator.flush(timeout=30)
    [prompt] = llm.calls.prompts
    said = '→ run_sql({"sql": "SELECT * FROM ar_invoice"}) → lookup("{not json")'
    assert f"Assistant: {said}\n" in prompt
    [entry] = consolidator.history_entries("tools")
    assert "[RAW]" in entry and f"Assistant: {said}\n" in entry
    assert entry in (consolidator.folder("tools") / "HISTORY.md").read_text(encoding="utf-8")


def test_an_llm_that_recovers_before_the_last_attempt_writes_memory(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    for session, llm in {
        "error": FakeLLM(fail_first=2, answer="# third time lucky"),
        "hang": FakeLLM(sleep=2.0, sleep_first=2, answer="# third time lucky"),
    }.items():
        consolidator = make_consolidator(llm, threshold=4, batch=2, timeout=0.2)
        history = TieredChatMessageHistory(session, backup=backup, consolidator=consolidator)
        history.add_messages(chat(1, 5))
        consolidator.flush(timeout=30)
        assert llm.calls.count == 3
        memory_path = consolidator.folder(session) / "MEMORY.md"
        assert memory_path.read_text() == "# third time lucky\n"
        assert history.consolidated_memory == "# third time lucky\n"
        [entry] = consolidator.history_entries(session)
        assert "[RAW]" not in entry
        assert log_rows(backup, session)[0].raw == 0
        assert_consolidated(consolidator, session, messages=5, batch_count=1)


# -- 3b. every prompt fits the model's window ---------------------------------------------


def long_chat(first: int, last: int, lang: str) -> list[BaseMessage]:
    """Like :func:`chat`, each message padded to about 1,900 characters (one line each)."""
    filler = "应收账款对账说明" if lang == "zh" else "reconcile the receivables ledger "
    padding = filler * (1900 // len(filler))
    return [type(m)(f"{m.content} {padding}") for m in chat(first, last, lang=lang)]


def assert_batches_contiguous(consolidator: MemoryConsolidator, session: str) -> list[int]:
    """Each consolidated message in exactly one entry, in order; the sizes of the batches."""
    ids = message_ids(consolidator.backup, session)
    spans = ranges(consolidator.history_entries(session))
    covered = [i for first, last in spans for i in ids if first <= i <= last]
    assert covered == ids[: len(covered)]  # from the first message, no gap, no overlap
    assert len(ids) - len(covered) <= consolidator.threshold  # caught up
    assert cursor_of(consolidator.backup, session) == covered[-1]
    return [sum(first <= i <= last for i in ids) for first, last in spans]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("source", ["argument", "profile"])
def test_every_prompt_fits_its_budget_and_every_message_is_consolidated_once(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    lang: str,
    source: str,
) -> None:
    # 250 messages of ~1,900 characters: the default batch of 50 would be a prompt of
    # ~15k tokens in English and ~120k in Chinese, past many models' windows.
    if source == "argument":
        llm, budget = FakeLLM(), 8_000
        consolidator = make_consolidator(llm, max_prompt_tokens=budget)
    else:  # the model declares its window (langchain-core model profiles)
        llm, budget = FakeLLM(profile={"max_input_tokens": 10_000}), 8_500
        consolidator = make_consolidator(llm)
    assert consolidator.max_prompt_tokens == budget
    session = f"fit-{lang}-{source}"
    history = TieredChatMessageHistory(session, backup=backup, consolidator=consolidator)
    history.add_messages(long_chat(1, 250, lang))
    consolidator.flush(timeout=120)
    assert consolidate_jobs(backup) == []
    sizes = assert_batches_contiguous(consolidator, session)
    assert sum(sizes) >= 150 and max(sizes) < consolidator.batch  # smaller batches, more of them
    entries = consolidator.history_entries(session)
    assert len(llm.calls.prompts) == len(entries)  # one LLM call per batch, none failed
    first = 1
    limit = f"{budget // 2} tokens" if lang == "en" else f"{budget // 2} 个 token"
    for prompt, entry, size in zip(llm.calls.prompts, entries, sizes, strict=True):
        assert exact_tokens(prompt) <= budget  # every character counted, no sampling
        assert limit in prompt  # the model is told how long MEMORY.md may be
        assert "[RAW]" not in entry.splitlines()[1]
        for n in range(first, first + size):  # the LLM saw every message it consolidated
            assert mark(n, lang) in prompt and mark(n, lang) in entry
        first += size
    assert consolidator.memory(session) == f"# Memory v{len(entries)}\n"


def test_a_batch_the_llm_keeps_failing_is_archived_raw_as_it_was_tried(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    llm = FakeLLM(fail_always=True)
    consolidator = make_consolidator(llm, max_prompt_tokens=4_000)
    history = TieredChatMessageHistory("fit-raw", backup=backup, consolidator=consolidator)
    history.add_messages(long_chat(1, 101, "en"))
    consolidator.flush(timeout=30)  # three attempts, then the raw archive
    assert llm.calls.count == 3
    [entry] = consolidator.history_entries("fit-raw")
    assert "[RAW]" in entry.splitlines()[1]
    tried = {n for n in range(1, 102) if mark(n) in llm.calls.prompts[0]}
    assert all(prompt == llm.calls.prompts[0] for prompt in llm.calls.prompts)
    assert {n for n in range(1, 102) if mark(n) in entry} == tried == set(range(1, len(tried) + 1))
    assert len(tried) < consolidator.batch


def test_a_memory_md_past_the_budget_still_moves_one_message_at_a_time(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    # A MEMORY.md written under a larger budget (or by an older version) is past this
    # one: the next batch still takes its oldest message, so consolidation never
    # stalls, and once the model rewrites MEMORY.md shorter the batches grow back.
    roomy = make_consolidator(FakeLLM(answer="# Memory\n" + "fact " * 3_000), threshold=4, batch=4)
    history = TieredChatMessageHistory("fit-floor", backup=backup, consolidator=roomy)
    history.add_messages(chat(1, 12))
    assert roomy.run_pending(max_batches=1) == 1
    roomy.close(timeout=10)
    tight = make_consolidator(FakeLLM(), max_prompt_tokens=1_000, threshold=4, batch=4)
    tight.flush(timeout=60)
    assert assert_batches_contiguous(tight, "fit-floor") == [4, 1, 4]
    assert tight.memory("fit-floor") == "# Memory v2\n"


@pytest.mark.parametrize(
    ("value", "error"), [(999, ValueError), (0, ValueError), ("8000", TypeError), (True, TypeError)]
)
def test_a_bad_prompt_budget_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_prompt_tokens"):
        MemoryConsolidator(FakeLLM(), max_prompt_tokens=value, start_worker=False)


@pytest.mark.parametrize(
    ("profile", "budget"),
    [
        (None, 32_000),
        ({}, 32_000),
        ({"max_input_tokens": "big"}, 32_000),
        ({"max_input_tokens": True}, 32_000),
        ({"max_input_tokens": -5}, 32_000),
        ({"max_input_tokens": 800}, 680),
        ({"max_input_tokens": 200_000}, 170_000),  # less 15 % for the estimate's error
    ],
)
def test_the_budget_follows_what_the_model_profile_declares(profile: Any, budget: int) -> None:
    assert prompt_budget(SimpleNamespace(profile=profile), None) == budget
    assert prompt_budget(SimpleNamespace(profile=profile), 5_000) == 5_000  # the caller's wins


def test_the_budget_is_found_through_wrappers_and_is_the_smallest_of_fallbacks() -> None:
    big = FakeLLM(profile={"max_input_tokens": 128_000})
    small = FakeLLM(profile={"max_input_tokens": 8_000})
    assert prompt_budget(small.with_retry(), None) == 6_800
    assert prompt_budget(small.bind(stop=["x"]), None) == 6_800
    assert prompt_budget(big.with_fallbacks([small]), None) == 6_800
    assert prompt_budget(RunnableLambda(str) | small, None) == 6_800
    assert prompt_budget(FakeLLM().with_retry(), None) == 32_000
    # A local model's whole context (ChatOllama's num_ctx, ChatLlamaCpp's n_ctx) holds
    # the answer too: the prompt takes 55 %, a MEMORY.md answer at most half of that.
    assert prompt_budget(SimpleNamespace(profile=None, num_ctx=8_192), None) == 4_505
    assert prompt_budget(SimpleNamespace(n_ctx=4_096), None) == 2_252
    local = FakeLLM()
    object.__setattr__(local, "num_ctx", 8_192)  # as ChatOllama(num_ctx=8192) holds it
    big = FakeLLM(profile={"max_input_tokens": 128_000})
    assert prompt_budget(big.with_fallbacks([local]), None) == 4_505


def test_a_local_model_too_small_for_the_prompts_is_refused_by_name() -> None:
    tiny = FakeLLM()
    object.__setattr__(tiny, "n_ctx", 512)  # ChatLlamaCpp's default context
    with pytest.raises(ValueError, match=r"prompt budget \(281: .*num_ctx\)"):
        MemoryConsolidator(tiny, start_worker=False)


def test_a_memory_md_past_half_the_budget_is_a_failed_attempt(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    # Within MEMORY_MD_CHARS, but ~5,200 tokens of a 8,000 budget: in every later
    # prompt it would leave room for one message at a time.
    llm = FakeLLM(answer="# 记忆\n" + "应收账款" * 1_000)
    consolidator = make_consolidator(llm, max_prompt_tokens=8_000)
    history = TieredChatMessageHistory("fit-big", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 101, lang="zh"))
    consolidator.flush(timeout=30)
    assert llm.calls.count == 3
    [entry] = consolidator.history_entries("fit-big")
    assert "[RAW]" in entry.splitlines()[1] and consolidator.memory("fit-big") == ""
    assert all(mark(n, "zh") in entry for n in range(1, 51))  # the whole batch: it fit


def test_a_house_style_that_shows_the_conversation_twice_still_fits(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    house = replace(PROMPTS["en"], consolidation="{memory}\n{conversation}\nAgain:\n{conversation}")
    llm = FakeLLM()
    consolidator = make_consolidator(llm, prompts=house, max_prompt_tokens=4_000)
    history = TieredChatMessageHistory("fit-twice", backup=backup, consolidator=consolidator)
    history.add_messages(long_chat(1, 130, "en"))
    consolidator.flush(timeout=60)
    assert llm.calls.prompts and all(exact_tokens(p) <= 4_000 for p in llm.calls.prompts)
    assert_batches_contiguous(consolidator, "fit-twice")


def test_instructions_past_half_the_budget_are_refused_at_construction() -> None:
    house = replace(PROMPTS["en"], consolidation="Be careful. " * 400 + "{memory}{conversation}")
    with pytest.raises(ValueError, match=r"consolidation prompt's instructions take \d+ tokens"):
        MemoryConsolidator(FakeLLM(), prompts=house, max_prompt_tokens=1_000, start_worker=False)


# -- 4. crashes ----------------------------------------------------------------------

_CHILD = r"""
import os, sys, time
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator

url, table, root, mode, at = sys.argv[1:6]
CALLS = [0]


class ChildLLM(GenericFakeChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        CALLS[0] += 1
        print(f"llm-call {CALLS[0]}", flush=True)
        if mode == "hang" and CALLS[0] >= int(at):
            time.sleep(30)
        message = AIMessage(f"# child memory {CALLS[0]}")
        return ChatResult(generations=[ChatGeneration(message=message)])


consolidator = MemoryConsolidator(
    ChildLLM(messages=iter(())), root=root, backup=MySQLBackup(url, table_name=table),
    threshold=4, batch=2, poll_interval=0.05, retry_base_delay=0.01, start_worker=False,
)
if mode == "die":
    commit = consolidator._commit_plan

    def die_before_commit(*args, **kwargs):
        if CALLS[0] >= int(at):
            os._exit(17)  # MEMORY.md and HISTORY.md are written, the commit never happens
        return commit(*args, **kwargs)

    consolidator._commit_plan = die_before_commit
consolidator.start()
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hang", "die"])
def test_a_worker_killed_mid_consolidation_loses_and_doubles_nothing(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    root: Path,
    mode: str,
) -> None:
    writer = make_consolidator(FakeLLM(), threshold=4, batch=2)
    history = TieredChatMessageHistory("k", user_id="u", backup=backup, consolidator=writer)
    history.add_messages(chat(1, 10))  # three batches: 1-2, 3-4, 5-6
    url = backup.url.render_as_string(hide_password=False)
    log = root.parent / f"child-{mode}.log"
    with log.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, url, backup.table.name, str(root), mode, "2"],
            cwd=REPO,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            text=True,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        assert child.stdout is not None
        if mode == "hang":
            for line in child.stdout:
                if line.strip() == "llm-call 2":  # inside the LLM call of the second batch
                    os.kill(child.pid, signal.SIGKILL)
                    break
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    expected = -signal.SIGKILL if mode == "hang" else 17
    assert child.returncode == expected, log.read_text()

    ids = message_ids(backup, "k")
    assert cursor_of(backup, "k") == ids[1]  # the first batch was committed
    [job] = consolidate_jobs(backup)
    assert job.state == "running"  # held by the dead process
    folder = root / safe_filename("k")
    if mode == "die":  # the second batch's files were written before the crash
        assert markers(folder / "HISTORY.md") == batches(ids, 2, 2)
        assert (folder / "MEMORY.md").read_text() == "# child memory 2\n"
    else:
        assert markers(folder / "HISTORY.md") == batches(ids, 2, 1)

    llm = FakeLLM(answer="# recovered")
    recovered = make_consolidator(llm, threshold=4, batch=2)  # same archive and root
    recovered.flush(timeout=30)
    assert llm.calls.count == 2  # batches two and three, each once
    assert_consolidated(recovered, "k", messages=10, batch_count=3)
    assert consolidate_jobs(backup) == []
    assert recovered.memory("k") == "# recovered\n"
    assert (folder / "MEMORY.md").read_text() == "# recovered\n"
    assert "[RAW]" not in (folder / "HISTORY.md").read_text()


def test_a_crash_between_the_files_and_the_commit_does_not_double_the_entry(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = FakeLLM()
    consolidator = make_consolidator(llm, threshold=4, batch=2)
    history = TieredChatMessageHistory("twice", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 8))  # two batches
    commit = consolidator._commit_plan
    crashes: list[int] = []

    def commit_then_crash(job: Any, cursor: int, last_id: int, first_id: int, *rest: Any) -> Any:
        done = yield from commit(job, cursor, last_id, first_id, *rest)
        if first_id not in crashes:  # each batch's first commit is rolled back
            crashes.append(first_id)
            msg = "crash before COMMIT"
            raise RuntimeError(msg)
        return done

    monkeypatch.setattr(consolidator, "_commit_plan", commit_then_crash)
    consolidator.flush(timeout=30)
    assert len(crashes) == 2
    assert llm.calls.count == 4  # each batch twice: its first commit was rolled back
    assert_consolidated(consolidator, "twice", messages=8, batch_count=2)
    assert len(log_rows(backup, "twice")) == 2
    folder = consolidator.folder("twice")
    assert (folder / "MEMORY.md").read_text() == consolidator.memory("twice")


def test_a_commit_failure_after_the_files_then_a_raw_batch_keeps_disk_and_database_equal(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MEMORY.md on disk must mirror memory() even when the retry of a batch goes raw.

    The last LLM attempt succeeds and its files are written, but the commit fails;
    the retry archives the batch raw and keeps the old MEMORY.md in the database,
    while the file on disk still holds the answer whose commit was rolled back.
    """
    llm = FakeLLM(answer="# never committed")
    consolidator = make_consolidator(llm, threshold=4, batch=2, max_attempts=1)
    history = TieredChatMessageHistory("diverge", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    original = backup.run
    failed: list[int] = []

    def run(plan: Any, **kwargs: Any) -> Any:
        if plan.gi_code.co_name == "_commit_plan" and not failed:
            failed.append(1)
            plan.close()
            msg = "the database went away before COMMIT"
            raise RuntimeError(msg)
        return original(plan, **kwargs)

    monkeypatch.setattr(backup, "run", run)
    consolidator.flush(timeout=30)
    monkeypatch.undo()
    assert failed and llm.calls.count == 1
    [row] = log_rows(backup, "diverge")
    assert row.raw == 1
    memory_path = consolidator.folder("diverge") / "MEMORY.md"
    on_disk = memory_path.read_text() if memory_path.exists() else ""
    assert on_disk == consolidator.memory("diverge")


# -- 5. one consolidation per session at a time ---------------------------------------


@pytest.mark.slow
def test_two_consolidators_never_run_one_session_twice_at_once(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    calls = Calls()
    workers = [
        make_consolidator(
            FakeLLM(calls=calls, sleep=0.2),
            threshold=4,
            batch=2,
            start_worker=True,
            poll_interval=0.05,
        )
        for _ in range(2)
    ]
    sessions = ["A", "B"]

    def talk(session: str, worker: MemoryConsolidator) -> None:
        history = TieredChatMessageHistory(session, backup=backup, consolidator=worker)
        for n in range(1, 13, 2):  # 12 messages, more than threshold * 2
            history.add_messages(chat(n, n + 1, tag=f"[s:{session}] "))
            time.sleep(0.05)

    threads = [
        threading.Thread(target=talk, args=(s, w)) for s, w in zip(sessions, workers, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert wait_until(lambda: consolidate_jobs(backup) == [], timeout=30)
    for worker in workers:
        worker.flush(timeout=30)
    assert dict(calls.peak) == {"A": 1, "B": 1}  # never two calls for one session at once
    for session in sessions:
        # 12 messages: four batches of two, until four (<= threshold) remain.
        assert_consolidated(workers[0], session, messages=12, batch_count=4, files=False)
        assert markers(workers[0].folder(session) / "HISTORY.md") == batches(
            message_ids(backup, session), 2, 4
        )
    assert calls.count == 8


# -- 6. forget -------------------------------------------------------------------------


GONE = {"messages": 0, "jobs": 0, "consolidation": 0, "history_log": 0}


def _rows_of(backup: MySQLBackup, session_id: str) -> dict[str, int]:
    return {
        "messages": len(message_ids(backup, session_id)),
        "jobs": sum(1 for row in job_rows(backup) if row.session_id == session_id),
        "consolidation": sum(
            1 for row in consolidation_rows(backup) if row.session_id == session_id
        ),
        "history_log": len(log_rows(backup, session_id)),
    }


def test_forget_removes_files_rows_jobs_and_messages(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    tmp_path: Path,
) -> None:
    consolidator = make_consolidator(FakeLLM(), threshold=4, batch=2)
    elsewhere = make_consolidator(FakeLLM(), threshold=4, batch=2, root=tmp_path / "elsewhere")
    owners = {"a": "u1", "b": "u1", "c": "u2"}
    chats = {
        session: TieredChatMessageHistory(
            session, user_id=user, backup=backup, consolidator=consolidator
        )
        for session, user in owners.items()
    }
    for history in chats.values():
        history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)  # batch 1-2 of each session, in "memory"
    for history in chats.values():
        history.add_messages(chat(6, 7))
    elsewhere.flush(timeout=30)  # batch 3-4 of each session, in "elsewhere"
    for history in chats.values():
        history.add_messages(chat(8, 9))  # a job is waiting again
    for session in owners:
        assert _rows_of(backup, session) == {
            "messages": 9,
            "jobs": 1,
            "consolidation": 1,
            "history_log": 2,
        }
        assert (consolidator.folder(session) / "MEMORY.md").exists()
        assert (elsewhere.folder(session) / "HISTORY.md").exists()

    assert backup.forget(session_id="a") == 9
    assert not consolidator.folder("a").exists()
    assert not elsewhere.folder("a").exists()
    assert _rows_of(backup, "a") == GONE
    for session in ("b", "c"):
        for folder in (consolidator.folder(session), elsewhere.folder(session)):
            assert sorted(p.name for p in folder.iterdir()) == ["HISTORY.md", "MEMORY.md"]
        assert _rows_of(backup, session)["history_log"] == 2

    assert backup.forget(user_id="u1") == 9
    assert not consolidator.folder("b").exists() and not elsewhere.folder("b").exists()
    assert _rows_of(backup, "b") == GONE
    assert (consolidator.folder("c") / "MEMORY.md").exists()
    assert consolidator.memory("c") != ""
    assert _rows_of(backup, "c") == {
        "messages": 9,
        "jobs": 1,
        "consolidation": 1,
        "history_log": 2,
    }
    consolidator.flush(timeout=30)  # "c" still consolidates
    assert len(consolidator.history_entries("c")) == 3


def test_forget_during_a_consolidation_leaves_no_files(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    """A session forgotten while its LLM call is in flight must not get its files back."""
    gate = threading.Event()
    llm = FakeLLM(gate=gate, answer="# secret facts of the forgotten user")
    consolidator = make_consolidator(llm, threshold=4, batch=2)
    history = TieredChatMessageHistory(
        "gone", user_id="u", backup=backup, consolidator=consolidator
    )
    history.add_messages(chat(1, 5))
    worker = threading.Thread(target=consolidator.run_pending)
    worker.start()
    try:
        assert llm.calls.started.wait(10)
        assert backup.forget(session_id="gone") == 5
    finally:
        gate.set()
        worker.join(30)
    assert _rows_of(backup, "gone") == GONE
    folder = consolidator.folder("gone")
    leftovers = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    assert leftovers == []  # no MEMORY.md or HISTORY.md of the forgotten conversation


# -- 7. hostile session ids --------------------------------------------------------------


def test_hostile_session_ids_stay_inside_root(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    root: Path,
    tmp_path: Path,
) -> None:
    consolidator = make_consolidator(FakeLLM(), threshold=2, batch=1)
    resolved_root = root.resolve()
    folders = [consolidator.folder(session).resolve() for session in HOSTILE]
    for folder in folders:
        assert folder.is_relative_to(resolved_root)
        assert folder.parent == resolved_root and folder != resolved_root
    assert len(set(folders)) == len(HOSTILE)  # distinct ids, distinct folders

    for session in HOSTILE:
        history = TieredChatMessageHistory(session, backup=backup, consolidator=consolidator)
        history.add_messages(chat(1, 3))
    consolidator.flush(timeout=30)
    for session, folder in zip(HOSTILE, folders, strict=True):
        assert sorted(p.name for p in folder.iterdir()) == ["HISTORY.md", "MEMORY.md"]
        assert consolidator.history_entries(session)[0] in (folder / "HISTORY.md").read_text()
    written = [p for p in tmp_path.rglob("*.md")]
    assert len(written) == 2 * len(HOSTILE)
    assert all(p.resolve().is_relative_to(resolved_root) for p in written)
    assert not (tmp_path / "x").exists() and not (tmp_path / "b").exists()

    assert backup.forget(session_id="../x") == 3
    assert not folders[0].exists()
    assert all(folder.exists() for folder in folders[1:])
