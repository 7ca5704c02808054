"""The ERP design's third layer: old history consolidated into MEMORY.md by an LLM.

When a session has more than ``threshold`` archived messages past its cursor, a
``consolidate`` job (queued in the same transaction as the messages) sends the
oldest ``batch`` of them, with the current MEMORY.md, to the LLM. Its answer
replaces MEMORY.md; the raw batch is appended to HISTORY.md. The cursor moves in
one database transaction only after both writes succeeded, so a crash never
loses or doubles a batch. An LLM call fails if it raises or times out, or if its
answer is empty, longer than :data:`MEMORY_MD_CHARS` or not whole (cut at the
output limit or by a content filter, or a refusal: its finish reason says so):
MEMORY.md then stays as it was. After
``max_attempts`` failed LLM calls the batch is archived raw, marked ``[RAW]``.

The database is the source of truth and the files follow it. A batch's entry is
computed from stored data only (its timestamp is its last message's), so a retry
writes the same text; every write of HISTORY.md first checks the file's tail
against the newest committed entry and cuts off whatever follows it (a torn
entry of a kill or a full disk, an entry whose commit never happened), or
rebuilds the file from the database when that check fails. The files of a root
are written under a file lock and only by the holder of the job's lease (see
:mod:`~langchain_tiered_memory.storage.jobs`); a stale runner whose commit is refused
puts them back as the database has them. A disk error is not an LLM failure: the
batch is retried with backoff and never falls back to ``[RAW]`` for it.

On disk: ``<root>/<session>/MEMORY.md`` and ``HISTORY.md``; in the archive
database the same documents live in ``<name>_consolidation`` and
``<name>_history_log``, so several app servers share them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from sqlalchemy import delete, func, insert, select, update

from langchain_tiered_memory.core.encoding import well_formed
from langchain_tiered_memory.core.finish import require_whole
from langchain_tiered_memory.core.lifecycle import DRAIN_TIMEOUT
from langchain_tiered_memory.core.prompts import EN, Prompts, prompts_for, prompts_in_use
from langchain_tiered_memory.core.turns import call_text, role_of, tool_calls_of
from langchain_tiered_memory.core.validation import (
    check_int,
    check_seconds,
    safe_filename,
    validate_id,
    validate_optional_id,
)
from langchain_tiered_memory.storage.archive import (
    ArchiveUnavailableError,
    ForgetHook,
    MySQLBackup,
    default_backup,
    default_home,
    register_eraser,
)
from langchain_tiered_memory.storage.base import Plan, WrittenBatch, utcnow
from langchain_tiered_memory.storage.jobs import (
    Job,
    JobQueue,
    QueueWorker,
    backlog_enqueue_plan,
    backoff,
    call_with_timeout,
    held_by,
)
from langchain_tiered_memory.storage.session_files import atomic_write
from langchain_tiered_memory.text.lexical import cjk_share
from langchain_tiered_memory.text.tokens import (
    check_instructions,
    exact_tokens,
    prompt_budget,
    room_for,
)

logger = logging.getLogger(__name__)

MESSAGE_CHARS = 2000  # per message in the prompt and HISTORY.md; the archive keeps all
#: A longer MEMORY.md answer is garbage (it would not fit the next prompt): a failed attempt.
MEMORY_MD_CHARS = 64_000
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


#: A file write failing this often in a row waits at most this long between tries.
MAX_DISK_BACKOFF = 300.0


class FilesUnwritableError(Exception):
    """MEMORY.md or HISTORY.md could not be written (a full disk, EIO, permissions).

    Not the LLM's failure: the batch stays queued, is retried with backoff and is
    never archived raw for it.
    """


def write_history(path: Path, last: str | None, entries: Callable[[], list[str]], new: str) -> None:
    """Make HISTORY.md the committed entries followed by ``new``.

    Args:
        path: The file.
        last: The newest committed entry (``None`` when there is none).
        entries: Reads every committed entry, oldest first (only for a rebuild).
        new: The entry about to be committed, or ``""``.

    The file normally ends with ``last``, maybe followed by a torn or uncommitted
    entry (a kill or a full disk mid-append, a crash before the commit): that tail
    is cut off and ``new`` appended. A file that does not hold ``last`` near its end
    (missing, truncated, edited) is rebuilt from the database, atomically.
    """
    committed, wanted = (last or "").encode(), new.encode()
    if not committed and not wanted:
        path.unlink(missing_ok=True)
        return
    try:
        handle = open(path, "r+b")  # noqa: SIM115 - closed below, or absent
    except FileNotFoundError:
        handle = None
    if handle is not None:
        with handle:
            size = os.fstat(handle.fileno()).st_size
            # An uncommitted entry is the same batch as ``new``: it differs at most by
            # its [RAW] tag. Entries hold no message's newline (whitespace is folded),
            # so ``last`` cannot be found inside the text of another entry.
            start = max(0, size - len(committed) - len(wanted) - 256)
            handle.seek(start)
            window = handle.read()
            # With nothing committed, the whole file is the tail to replace.
            at = window.rfind(committed) if committed else (0 if start == 0 else -1)
            if at >= 0:
                keep = start + at + len(committed)
                if window[at + len(committed) :] != wanted:
                    handle.truncate(keep)
                    handle.seek(keep)
                    handle.write(wanted)
                    handle.flush()
                    os.fsync(handle.fileno())
                return
    atomic_write(path, "".join(entries() if last is not None else []) + new)


class MemoryConsolidator(QueueWorker):
    """Consolidates old history into ``MEMORY.md``, with a raw-archive fallback.

    Args:
        llm: The chat model that writes MEMORY.md.
        root: Folder of the per-session files; default
            ``$TIERED_MEMORY_HOME/memory``.
        backup: The archive (and job queue); ``None`` means the embedded default.
        threshold: Consolidate when more than this many messages are past the
            cursor.
        batch: How many of the oldest messages one consolidation takes at most.
        max_prompt_tokens: Tokens one consolidation prompt (MEMORY.md and the
            batch) may take; ``None`` takes what the model's declared limits allow
            (85 % of ``profile["max_input_tokens"]``, 55 % of a local model's
            ``num_ctx``), else 32,000 (see
            :func:`~langchain_tiered_memory.text.tokens.prompt_budget`). A batch
            that would not fit takes fewer messages (at least one); the rest go to
            the next batch. A MEMORY.md answer past half of it is a failed attempt.
        max_attempts: LLM attempts before the batch is archived raw.
        timeout: Seconds one LLM call may take.
        retry_base_delay: First backoff delay in seconds (doubles per attempt).
        language: ``"en"`` or ``"zh"`` prompt; ``None`` follows the conversation.
        prompts: The prompt and speaker labels (a
            :class:`~langchain_tiered_memory.core.prompts.Prompts`) for every
            batch; ``None`` picks them by ``language``.
        poll_interval: Seconds between queue polls when idle.
        start_worker: Start the background worker now.
        lease_seconds: How long a claim lasts if its worker vanishes silently.
        drain_timeout: Seconds :meth:`shutdown` (a ``with`` block's end, the
            interpreter's exit) may spend on queued consolidations; the rest
            stay queued for the next process.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        *,
        root: str | Path | None = None,
        backup: MySQLBackup | None = None,
        threshold: int = 100,
        batch: int = 50,
        max_prompt_tokens: int | None = None,
        max_attempts: int = 3,
        timeout: float = 120.0,
        retry_base_delay: float = 1.0,
        language: Literal["en", "zh"] | None = None,
        prompts: Prompts | None = None,
        poll_interval: float = 1.0,
        start_worker: bool = True,
        lease_seconds: float = 600.0,
        drain_timeout: float = DRAIN_TIMEOUT,
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
            backup = default_backup()
        self.llm = llm
        self.root = Path(root) if root is not None else default_home() / "memory"
        self.backup = backup
        self.threshold = threshold
        self.batch = batch
        self.max_prompt_tokens = budget = prompt_budget(llm, max_prompt_tokens)
        for each in prompts_in_use(prompts):
            check_instructions("consolidation", self._template(each), {"memory": ""}, budget)
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.retry_base_delay = retry_base_delay
        self.language = language
        self.prompts = prompts
        self.tables = backup.tables
        self._disk_failures: dict[int, int] = {}  # job id -> file write failures in a row
        # Recorded in the archive, so a forget from any process reaches these folders.
        backup.register_tier(
            "consolidation", {"root": os.path.abspath(self.root)}, self._forget_files
        )
        super().__init__(
            JobQueue(backup, kinds=("consolidate",), lease_seconds=lease_seconds),
            poll_interval=poll_interval,
            batch_size=8,
            start=start_worker,
            drain_timeout=drain_timeout,
        )

    def __repr__(self) -> str:
        return f"MemoryConsolidator(root={str(self.root)!r}, backup={self.backup!r})"

    # -- writing --------------------------------------------------------------

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[bool]:
        """Queue a consolidation when the write takes the backlog past ``threshold``.

        The archive runs it in the write's transaction (see
        :class:`~langchain_tiered_memory.storage.base.EnqueuePlanner`).
        """
        return backlog_enqueue_plan(
            batch.tables,
            "consolidate",
            batch.session_id,
            batch.user_id,
            batch.ids[-1],
            self.threshold,
            batch.now,
        )

    # -- reading --------------------------------------------------------------

    def folder(self, session_id: str) -> Path:
        """The session's folder under ``root`` (a safe name, never outside it)."""
        return self.root / safe_filename(validate_id(session_id))

    def memory(self, session_id: str, *, user_id: str | None = None, write: bool = False) -> str:
        """The session's MEMORY.md (from the database; empty before the first run).

        Args:
            session_id: The session.
            user_id: The reading user; ``None`` reads without a check.
            write: Check ``user_id`` as for a write (``None`` then reads only a
                session without a user): for MEMORY.md that goes into a prompt.

        Raises:
            SessionOwnershipError: If ``user_id`` is given and the session is not
                theirs (with ``write``, also if it has a user while ``user_id`` is
                ``None``).
        """
        c = self.tables.consolidation.c
        session_id = validate_id(session_id)
        user_id = validate_optional_id(user_id)

        def plan() -> Plan[str]:
            yield from self.backup.owner_check_plan(session_id, user_id, write)
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
        messages = yield from self.backup.load_plan(rows)
        return cursor, memory, rows, messages

    def _lines(self, messages: Sequence[BaseMessage], prompts: Prompts) -> list[str]:
        """One ``Speaker: text`` line per message, as the prompt and HISTORY.md show it."""
        labels = prompts.consolidation_roles
        lines = []
        for message in messages:
            raw: str = message.text if isinstance(message.text, str) else str(message.content)
            # What the AI ran (the SQL, the document it asked for) is often all the
            # message says: without it the line was empty.
            calls = [f"→ {call_text(call)}" for call in tool_calls_of(message)]
            raw = " ".join([raw, *calls]) if calls else raw
            text = well_formed(" ".join(raw.split()))
            if len(text) > MESSAGE_CHARS:
                text = text[:MESSAGE_CHARS] + "…"
            lines.append(f"{labels.get(role_of(message), role_of(message))}: {text}")
        return lines

    def _template(self, prompts: Prompts) -> str:
        """The consolidation prompt, with the line that says how long MEMORY.md may be."""
        limit = prompts.consolidation_limit.format(tokens=self.max_prompt_tokens // 2)
        # It is formatted again with the memory and the conversation: its braces stay text.
        return f"{prompts.consolidation}\n{limit.replace('{', '{{').replace('}', '}}')}\n"

    def _fitting(self, prompts: Prompts, memory: str, lines: Sequence[str]) -> int:
        """How many of the oldest ``lines`` fit the prompt's budget with ``memory`` (>= 1)."""
        room = room_for(self._template(prompts), {"memory": memory or "-"}, self.max_prompt_tokens)
        taken = 0
        for line in lines:
            room -= exact_tokens(line) + 1  # the line break
            if room < 0:
                break
            taken += 1
        return max(taken, 1)

    def _process(self, jobs: Sequence[Job]) -> int:
        finished = 0
        for job in jobs:
            try:
                if self._consolidate(job):
                    finished += 1
                self._disk_failures.pop(job.id, None)
            except ArchiveUnavailableError:
                raise  # an outage is not the LLM's failure: the job is claimed again later
            except FilesUnwritableError as exc:
                # Not the LLM's failure either: retried, never counted towards [RAW].
                failures = self._disk_failures.pop(job.id, 0) + 1
                if len(self._disk_failures) < 10_000:
                    self._disk_failures[job.id] = failures
                delay = min(backoff(self.retry_base_delay or 0.05, failures - 1), MAX_DISK_BACKOFF)
                logger.error(
                    "cannot write the consolidation files of session %r (%s); the batch "
                    "stays queued and is retried in %.1f s (not counted as an LLM failure)",
                    job.session_id,
                    exc,
                    delay,
                )
                self.queue.retry(job, f"FilesUnwritableError: {exc}", delay, count=False)
            except Exception as exc:
                self._disk_failures.pop(job.id, None)
                error = f"{type(exc).__name__}: {exc}"
                delay = backoff(self.retry_base_delay, job.attempts)
                logger.warning("consolidation of %r failed (%s)", job.session_id, error)
                self.queue.retry(job, error, delay)
        return finished

    def _consolidate(self, job: Job) -> bool:
        """Consolidate the job's batch; ``False`` if the job is no longer this claim's."""
        cursor, memory, rows, messages = self.backup.run(self._batch_plan(job.session_id))
        if not rows:
            return self._write_and_commit(job, cursor, None)
        prompts = self.prompts or prompts_for(
            self.language
            or ("zh" if cjk_share("\n".join(self._lines(messages[:10], EN))) > 0.2 else "en")
        )
        lines = self._lines(messages, prompts)
        # The same batch for every attempt: the raw archive takes the one that failed.
        taken = self._fitting(prompts, memory, lines)
        rows, conversation = rows[:taken], "\n".join(lines[:taken])
        raw = job.attempts >= self.max_attempts
        if not raw:
            prompt = self._template(prompts).format(memory=memory or "-", conversation=conversation)
            answer = call_with_timeout(
                lambda: self.llm.invoke([HumanMessage(prompt)]), self.timeout
            )
            # It rewrites the whole document: a cut one drops what followed the cut.
            require_whole(answer, "the LLM's answer (MEMORY.md is kept as it was)")
            text = answer.text if isinstance(answer.text, str) else str(answer.content)
            if len(text) > MEMORY_MD_CHARS:  # checked before any scan of the text
                msg = f"the LLM returned {len(text)} characters, more than {MEMORY_MD_CHARS}"
                raise ValueError(msg)
            if not text.strip():
                msg = "the LLM returned an empty MEMORY.md"
                raise ValueError(msg)
            tokens = exact_tokens(text)
            if tokens > self.max_prompt_tokens // 2:
                # It goes into every later prompt: the batches would shrink to one message.
                msg = (
                    f"the LLM returned a MEMORY.md of {tokens} tokens, more than half of "
                    f"max_prompt_tokens ({self.max_prompt_tokens})"
                )
                raise ValueError(msg)
            memory = redact(well_formed(text.strip())) + "\n"
        first_id, last_id = rows[0].id, rows[-1].id
        # From stored data, not the clock: a retry after a crash writes the same text.
        stamp = rows[-1].created_at.strftime("%Y-%m-%d %H:%M")
        tag = " [RAW]" if raw else ""
        entry = (
            f"\n## [{stamp}]{tag} {len(rows)} messages #{first_id}-#{last_id}\n"
            f"<!-- batch {first_id}-{last_id} -->\n\n{conversation}\n"
        )
        return self._write_and_commit(job, cursor, (first_id, last_id, memory, entry, raw))

    def _write_and_commit(
        self, job: Job, cursor: int, batch: tuple[int, int, str, str, bool] | None
    ) -> bool:
        """Write the files, then commit; or, with no ``batch``, check the files and finish.

        Runs under the root's file lock and only while the job is still this
        claim's, so a stale runner never writes over the new owner's files, and a
        session forgotten meanwhile (its jobs are deleted first) gets none back.
        """
        with self._files_locked():
            state = self.backup.run(self._hold_plan(job), write=True)
            if state is None:  # claimed again by another worker, or forgotten: hands off
                logger.warning(
                    "consolidation job %d of session %r is no longer this worker's; "
                    "leaving it to its new owner",
                    job.id,
                    job.session_id,
                )
                return False
            stored_cursor, stored_memory, last = state
            if stored_cursor != cursor:  # the batch read is stale: read again
                self.queue.release([job])
                return False
            folder = self.folder(job.session_id)
            if batch is None:  # nothing to consolidate: leave the files as committed
                self._write_files(job.session_id, stored_memory, last, "")
                self.queue.done([job])
                return True
            first_id, last_id, memory, entry, raw = batch
            self._write_files(job.session_id, memory, last, entry)
            committed = self.backup.run(
                self._commit_plan(job, cursor, last_id, first_id, memory, entry, raw), write=True
            )
            if not committed:  # another worker took the job over: files back to the database
                _, stored_memory, last = self.backup.run(self._state_plan(job.session_id))
                self._write_files(job.session_id, stored_memory, last, "")
                with _disk(folder):
                    if folder.is_dir() and not any(folder.iterdir()):
                        folder.rmdir()  # its first batch: no folder before it
            return committed

    def _files_locked(self) -> AbstractContextManager[None]:
        """The root's lock (threads and processes): one writer of its files at a time."""
        return _root_locked(self.root)

    def _write_files(self, session_id: str, memory: str, last: str | None, new: str) -> None:
        """MEMORY.md := ``memory``; HISTORY.md := committed entries (newest ``last``) + ``new``."""
        folder = self.folder(session_id)
        with _disk(folder):
            path = folder / "MEMORY.md"
            if memory:
                # Bytes, not text: a file another program left undecodable is rewritten,
                # not taken for a failure of the LLM.
                try:
                    same = path.read_bytes() == memory.encode()
                except FileNotFoundError:
                    same = False
                if not same:
                    atomic_write(path, memory)
            else:
                path.unlink(missing_ok=True)
            if last is None and not new and not folder.exists():
                return
            folder.mkdir(parents=True, exist_ok=True)
            write_history(
                folder / "HISTORY.md", last, lambda: self.history_entries(session_id), new
            )

    def _state_plan(self, session_id: str) -> Plan[tuple[int | None, str, str | None]]:
        """The session's cursor (``None`` before its first batch), MEMORY.md and newest entry."""
        c, h = self.tables.consolidation.c, self.tables.history_log.c
        state = yield select(c.cursor, c.memory_md).where(c.session_id == session_id)
        row = state.first()
        newest = yield (
            select(h.entry).where(h.session_id == session_id).order_by(h.first_id.desc()).limit(1)
        )
        last = newest.scalar()
        return (row.cursor, row.memory_md, last) if row else (None, "", last)

    def _hold_plan(self, job: Job) -> Plan[tuple[int, str, str | None] | None]:
        """Renew the job's lease; ``None`` if it is no longer this claim's, else the state."""
        held = yield from self.queue._renew_plan([job])
        if job.id not in held:
            return None
        cursor, memory, last = yield from self._state_plan(job.session_id)
        return cursor or 0, memory, last

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
        c, h, j = self.tables.consolidation, self.tables.history_log, self.tables.jobs
        now = utcnow()
        gone = yield delete(j).where(held_by(j, [job]))
        if gone.rowcount == 0:
            return False  # claimed again by another worker, or forgotten: commit nothing
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
        _remove_folders(self.root, session_ids)


def _remove_folders(root: Path, session_ids: Sequence[str]) -> None:
    """Remove the sessions' folders: MEMORY.md, HISTORY.md and a killed writer's ``.tmp``.

    Under the files' lock: a runner that still held a job of these sessions finishes
    its write first (their jobs are gone, so no runner starts one).
    """
    if not root.is_dir():
        return
    with _root_locked(root):
        for session_id in session_ids:
            folder = root / safe_filename(session_id)
            if folder.is_dir():
                shutil.rmtree(folder)


def erase_from_record(locator: dict[str, Any]) -> ForgetHook:
    """The eraser of a recorded consolidation root (entry point ``consolidation``)."""
    root = Path(locator["root"])

    def erase(session_ids: Sequence[str], session_id: str | None, user_id: str | None) -> None:
        _remove_folders(root, session_ids)

    return erase


register_eraser("consolidation", erase_from_record)


@contextmanager
def _root_locked(root: Path) -> Iterator[None]:
    """The root's lock (threads and processes): one writer of its files at a time."""
    with _disk(root):
        root.mkdir(parents=True, exist_ok=True)
        handle = open(root / ".lock", "a")  # noqa: SIM115 - closed below
    with handle:
        with _disk(root):
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _disk(where: Path) -> Iterator[None]:
    """Turn an OSError of the files into :class:`FilesUnwritableError`."""
    try:
        yield
    except OSError as exc:
        msg = f"{where}: {exc}"
        raise FilesUnwritableError(msg) from exc
