"""The ERP design's third layer: old history consolidated into MEMORY.md by an LLM.

When a session has more than ``threshold`` archived messages past its cursor, a
``consolidate`` job (queued in the same transaction as the messages) sends the
oldest ``batch`` of them, with the current MEMORY.md, to the LLM. Its answer
replaces MEMORY.md; the raw batch is appended to HISTORY.md. The cursor moves in
one database transaction only after both writes succeeded, and the HISTORY.md
append is idempotent, so a crash never loses or doubles a batch. After
``max_attempts`` failed LLM calls the batch is archived raw, marked ``[RAW]``.

On disk: ``<root>/<session>/MEMORY.md`` and ``HISTORY.md``; in the archive
database the same documents live in ``<name>_consolidation`` and
``<name>_history_log``, so several app servers share them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from sqlalchemy import delete, func, insert, select, update

from langchain_tiered_memory._validation import safe_filename, validate_id, validate_optional_id
from langchain_tiered_memory.archive import (
    ArchiveUnavailableError,
    MySQLBackup,
    Plan,
    default_home,
    role_of,
    utcnow,
)
from langchain_tiered_memory.jobs import (
    Job,
    JobQueue,
    QueueWorker,
    backoff,
    call_with_timeout,
    check_int,
    check_seconds,
)
from langchain_tiered_memory.lexical import cjk_share
from langchain_tiered_memory.session_files import atomic_write

logger = logging.getLogger(__name__)

PROMPTS = {
    "zh": (
        "请分析以下对话，提取关键信息并更新长期记忆。\n"
        "## 当前长期记忆\n{memory}\n"
        "## 需要处理的对话\n{conversation}\n"
        "请以 Markdown 格式输出更新后的长期记忆，包括：\n"
        "1. **用户偏好和习惯**\n"
        "2. **已知的数据库信息**（表名、字段名、连接信息；密码、密钥等机密一律写作 ***）\n"
        "3. **已解决的问题和答案**\n"
        "4. **待解决的问题**\n"
    ),
    "en": (
        "Analyse the conversation below, extract the key information and update the "
        "long-term memory.\n"
        "## Current long-term memory\n{memory}\n"
        "## Conversation to process\n{conversation}\n"
        "Answer with the updated long-term memory in Markdown, with:\n"
        "1. **User preferences and habits**\n"
        "2. **Known database facts** (tables, fields, connections; write every password, "
        "key or other secret as ***)\n"
        "3. **Solved problems and their answers**\n"
        "4. **Open problems**\n"
    ),
}
ROLE_LABELS = {
    "zh": {"human": "用户", "ai": "助手", "tool": "工具", "system": "系统"},
    "en": {"human": "User", "ai": "Assistant", "tool": "Tool", "system": "System"},
}
MESSAGE_CHARS = 2000  # per message in the prompt and HISTORY.md; the archive keeps all
# Lone surrogates cannot be written as UTF-8 (files, MySQL): they become U+FFFD.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SECRETS = [
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+(@)", re.IGNORECASE), r"\1***\2"),
    (
        re.compile(
            r"((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|密码|口令|密钥)"
            r"[\"']?\s*(?:[:=：]|是|为)\s*)(\"[^\"]*\"|'[^']*'|[^\s,;，；]+)",
            re.IGNORECASE,
        ),
        r"\1***",
    ),
    (re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    (re.compile(r"\b(sk|pk|ghp|xox[bp])[-_][A-Za-z0-9_-]{12,}"), r"\1-***"),
]


def redact(text: str) -> str:
    """Mask credentials in URLs, ``password=...``-style pairs and API keys."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _append_once(path: Path, marker: str, entry: str) -> None:
    """Append ``entry`` unless the file already ends with the batch ``marker``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - len(entry.encode()) - 4096))
            if marker.encode() in handle.read():
                return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(entry)
        handle.flush()
        os.fsync(handle.fileno())


class MemoryConsolidator(QueueWorker):
    """Consolidates old history into ``MEMORY.md``, with a raw-archive fallback.

    Args:
        llm: The chat model that writes MEMORY.md.
        root: Folder of the per-session files; default
            ``$TIERED_MEMORY_HOME/memory``.
        backup: The archive (and job queue); ``None`` means the embedded default.
        threshold: Consolidate when more than this many messages are past the
            cursor.
        batch: How many of the oldest messages one consolidation takes.
        max_attempts: LLM attempts before the batch is archived raw.
        timeout: Seconds one LLM call may take.
        retry_base_delay: First backoff delay in seconds (doubles per attempt).
        language: ``"en"`` or ``"zh"`` prompt; ``None`` follows the conversation.
        poll_interval: Seconds between queue polls when idle.
        start_worker: Start the background worker now.
        lease_seconds: How long a claim lasts if its worker vanishes silently.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        *,
        root: str | Path | None = None,
        backup: MySQLBackup | None = None,
        threshold: int = 100,
        batch: int = 50,
        max_attempts: int = 3,
        timeout: float = 120.0,
        retry_base_delay: float = 1.0,
        language: Literal["en", "zh"] | None = None,
        poll_interval: float = 1.0,
        start_worker: bool = True,
        lease_seconds: float = 600.0,
    ) -> None:
        check_int("threshold", threshold)
        check_int("batch", batch)
        if not 0 < batch <= threshold:
            msg = f"need 0 < batch <= threshold, got batch={batch}, threshold={threshold}"
            raise ValueError(msg)
        check_int("max_attempts", max_attempts)
        check_seconds("timeout", timeout)
        check_seconds("retry_base_delay", retry_base_delay, zero_ok=True)
        if language not in (None, "en", "zh"):
            msg = f"language must be 'en', 'zh' or None, got {language!r}"
            raise ValueError(msg)
        if backup is None:
            from langchain_tiered_memory.history import default_backup

            backup = default_backup()
        self.llm = llm
        self.root = Path(root) if root is not None else default_home() / "memory"
        self.backup = backup
        self.threshold = threshold
        self.batch = batch
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.retry_base_delay = retry_base_delay
        self.language = language
        self.tables = backup.tables
        backup.on_forget(self._forget_files)
        super().__init__(
            JobQueue(backup, kinds=("consolidate",), lease_seconds=lease_seconds),
            poll_interval=poll_interval,
            batch_size=8,
            start=start_worker,
        )

    def __repr__(self) -> str:
        return f"MemoryConsolidator(root={str(self.root)!r}, backup={self.backup!r})"

    # -- reading --------------------------------------------------------------

    def folder(self, session_id: str) -> Path:
        """The session's folder under ``root`` (a safe name, never outside it)."""
        return self.root / safe_filename(validate_id(session_id))

    def memory(self, session_id: str, *, user_id: str | None = None) -> str:
        """The session's MEMORY.md (from the database; empty before the first run).

        Args:
            session_id: The session.
            user_id: The reading user; ``None`` reads without a check.

        Raises:
            SessionOwnershipError: If ``user_id`` is given and the session is not
                theirs.
        """
        c = self.tables.consolidation.c
        session_id = validate_id(session_id)
        user_id = validate_optional_id(user_id)

        def plan() -> Plan[str]:
            yield from self.backup._owner_check_plan(session_id, user_id)
            result = yield select(c.memory_md).where(c.session_id == session_id)
            return result.scalar() or ""

        return self.backup.run(plan())

    def history_entries(self, session_id: str) -> list[str]:
        """The session's HISTORY.md entries (from the database), oldest first."""
        h = self.tables.history_log.c
        session_id = validate_id(session_id)

        def plan() -> Plan[list[str]]:
            result = yield select(h.entry).where(h.session_id == session_id).order_by(h.first_id)
            return list(result.scalars())

        return self.backup.run(plan())

    # -- processing -----------------------------------------------------------

    def _batch_plan(self, session_id: str) -> Plan[tuple[int, str, list[Any], list[BaseMessage]]]:
        c, m = self.tables.consolidation.c, self.tables.messages
        state = yield select(c.cursor, c.memory_md).where(c.session_id == session_id)
        row = state.first()
        cursor, memory = (row.cursor, row.memory_md) if row else (0, "")
        backlog = yield select(func.count()).select_from(
            select(m.c.id)
            .where(m.c.session_id == session_id, m.c.id > cursor)
            .limit(self.threshold + 1)
            .subquery()
        )
        if backlog.scalar_one() <= self.threshold:
            return cursor, memory, [], []
        result = yield (
            select(m.c.id, m.c.message, m.c.parts, m.c.created_at)
            .where(m.c.session_id == session_id, m.c.id > cursor)
            .order_by(m.c.id)
            .limit(self.batch)
        )
        rows = result.all()
        messages = yield from self.backup._load_plan(rows)
        return cursor, memory, rows, messages

    def _format(self, messages: Sequence[BaseMessage], language: str) -> str:
        labels = ROLE_LABELS[language]
        lines = []
        for message in messages:
            text = message.text if isinstance(message.text, str) else str(message.content)
            text = _SURROGATE.sub("\ufffd", " ".join(text.split()))
            if len(text) > MESSAGE_CHARS:
                text = text[:MESSAGE_CHARS] + "…"
            lines.append(f"{labels.get(role_of(message), role_of(message))}: {text}")
        return "\n".join(lines)

    def _process(self, jobs: Sequence[Job]) -> int:
        finished = 0
        for job in jobs:
            try:
                self._consolidate(job)
                finished += 1
            except ArchiveUnavailableError:
                raise  # an outage is not the LLM's failure: the job is claimed again later
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                delay = backoff(self.retry_base_delay, job.attempts)
                logger.warning("consolidation of %r failed (%s)", job.session_id, error)
                self.queue.retry(job, error, delay)
        return finished

    def _consolidate(self, job: Job) -> None:
        cursor, memory, rows, messages = self.backup.run(self._batch_plan(job.session_id))
        if not rows:
            self.queue.done([job.id])
            return
        language = self.language or (
            "zh" if cjk_share(self._format(messages[:10], "en")) > 0.2 else "en"
        )
        conversation = self._format(messages, language)
        raw = job.attempts >= self.max_attempts
        if not raw:
            prompt = PROMPTS[language].format(memory=memory or "-", conversation=conversation)
            answer = call_with_timeout(
                lambda: self.llm.invoke([HumanMessage(prompt)]), self.timeout
            )
            text = answer.text if isinstance(answer.text, str) else str(answer.content)
            if not text.strip():
                msg = "the LLM returned an empty MEMORY.md"
                raise ValueError(msg)
            memory = redact(_SURROGATE.sub("\ufffd", text.strip())) + "\n"
        first_id, last_id = rows[0].id, rows[-1].id
        stamp = utcnow().strftime("%Y-%m-%d %H:%M")
        marker = f"<!-- batch {first_id}-{last_id} -->"
        tag = " [RAW]" if raw else ""
        entry = (
            f"\n## [{stamp}]{tag} {len(rows)} messages #{first_id}-#{last_id}\n{marker}\n\n"
            f"{conversation}\n"
        )
        folder = self.folder(job.session_id)
        # Even a raw batch rewrites MEMORY.md: an earlier attempt may have written
        # an answer whose commit then failed, and disk must match the database.
        if memory:
            atomic_write(folder / "MEMORY.md", memory)
        else:
            (folder / "MEMORY.md").unlink(missing_ok=True)
        _append_once(folder / "HISTORY.md", marker, entry)
        committed = self.backup.run(
            self._commit_plan(job, cursor, last_id, first_id, memory, entry, raw)
        )
        if not committed:  # the session was forgotten meanwhile: leave no file behind
            shutil.rmtree(folder, ignore_errors=True)

    def _commit_plan(
        self,
        job: Job,
        cursor: int,
        last_id: int,
        first_id: int,
        memory: str,
        entry: str,
        raw: bool,
    ) -> Plan[bool]:
        from langchain_tiered_memory.jobs import backlog_enqueue_plan

        c, h, j = self.tables.consolidation, self.tables.history_log, self.tables.jobs
        now = utcnow()
        gone = yield delete(j).where(j.c.id == job.id)
        if gone.rowcount == 0:
            return False  # forgotten meanwhile
        exists = yield select(c.c.cursor).where(c.c.session_id == job.session_id)
        if exists.first() is None:
            yield insert(c).values(
                session_id=job.session_id,
                user_id=job.user_id,
                cursor=last_id,
                memory_md=memory,
                updated_at=now,
            )
        else:
            yield (
                update(c)
                .where(c.c.session_id == job.session_id, c.c.cursor == cursor)
                .values(cursor=last_id, memory_md=memory, updated_at=now)
            )
        logged = yield select(h.c.id).where(
            h.c.session_id == job.session_id, h.c.first_id == first_id
        )
        if logged.first() is None:
            yield insert(h).values(
                session_id=job.session_id,
                user_id=job.user_id,
                first_id=first_id,
                last_id=last_id,
                raw=int(raw),
                entry=entry,
                created_at=now,
            )
        yield from backlog_enqueue_plan(
            self.tables, "consolidate", job.session_id, job.user_id, last_id, self.threshold, now
        )
        return True

    # -- forgetting -----------------------------------------------------------

    def _forget_files(
        self, session_ids: Sequence[str], session_id: str | None, user_id: str | None
    ) -> None:
        for session_id in session_ids:
            folder = self.root / safe_filename(session_id)
            if folder.is_dir():
                shutil.rmtree(folder)
