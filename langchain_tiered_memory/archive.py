"""The archive tier: every message, durably, in MySQL (or SQLite embedded).

The archive is the source of truth; every other tier is derived from it. Statements
are built once by small query builders and run by either a sync or an async driver,
so the sync and async methods share all of their logic.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.sql import Executable

from langchain_tiered_memory._validation import (
    validate_batch,
    validate_id,
    validate_optional_id,
)
from langchain_tiered_memory.jobs import backlog_enqueue_plan, enqueue_statement
from langchain_tiered_memory.schema import build_tables, ensure_columns

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: ``hook(session_ids, session_id, user_id)``: a tier's part of :meth:`MySQLBackup.forget`.
ForgetHook = Callable[[Sequence[str], "str | None", "str | None"], None]

#: Pieces of a large payload are stored in their own rows, so that no single
#: statement passes the server's ``max_allowed_packet`` (16 MB on MariaDB).
CHUNK_CHARS = 512 * 1024

_ASYNC_DRIVERS = {"sqlite": "aiosqlite", "mysql": "aiomysql", "mariadb": "aiomysql"}
_ROLE_OF_TYPE = {
    "HumanMessageChunk": "human",
    "AIMessageChunk": "ai",
    "ToolMessageChunk": "tool",
    "SystemMessageChunk": "system",
    "FunctionMessageChunk": "function",
    "ChatMessageChunk": "chat",
}


class ArchiveUnavailableError(RuntimeError):
    """The archive database could not be reached or refused the write."""


@dataclass(frozen=True)
class ArchivedMessage:
    """One archived message with its bookkeeping columns."""

    id: int
    session_id: str
    user_id: str | None
    role: str
    message: BaseMessage
    created_at: datetime


@dataclass(frozen=True)
class SessionInfo:
    """A session in the archive: how many messages and when it was active."""

    session_id: str
    user_id: str | None
    message_count: int
    first_at: datetime
    last_active: datetime


def default_home() -> Path:
    """The embedded defaults' folder: ``$TIERED_MEMORY_HOME`` or ``./.tiered_memory``."""
    return Path(os.environ.get("TIERED_MEMORY_HOME") or ".tiered_memory")


def role_of(message: BaseMessage) -> str:
    """The archive's role column for a message (chunks count as their full type)."""
    return _ROLE_OF_TYPE.get(message.type, message.type)


def utcnow() -> datetime:
    """Naive UTC now, as stored in the archive's timestamp columns."""
    return datetime.now(UTC).replace(tzinfo=None)


# -- plans: the shared logic of sync and async methods ------------------------
#
# A plan is a generator that yields statements and receives their results; a sync
# or an async driver runs it inside one transaction.

Plan = Generator[Executable, Any, T]


def _drive(plan: Plan[T], execute: Callable[[Executable], Any]) -> T:
    try:
        statement = next(plan)
        while True:
            statement = plan.send(execute(statement))
    except StopIteration as stop:
        return stop.value


def _run_sync(engine: Engine, plan: Plan[T], options: dict[str, Any], read_only: bool) -> T:
    with engine.connect() as conn:
        conn.execution_options(**options)
        if read_only:  # no BEGIN/COMMIT round trips; the pool rolls back on return
            return _drive(plan, conn.execute)
        with conn.begin():
            return _drive(plan, conn.execute)


async def _run_async(
    engine: AsyncEngine, plan: Plan[T], options: dict[str, Any], read_only: bool
) -> T:
    async with engine.connect() as conn:
        await conn.execution_options(**options)
        if read_only:
            return await _adrive(plan, conn)
        async with conn.begin():
            return await _adrive(plan, conn)


async def _adrive(plan: Plan[T], conn: Any) -> T:
    try:
        statement = next(plan)
        while True:
            statement = plan.send(await conn.execute(statement))
    except StopIteration as stop:
        return stop.value


def _encode(message: BaseMessage) -> list[str]:
    data = message_to_dict(message)
    payload = json.dumps(data, ensure_ascii=False)
    try:
        payload.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: kept exactly, as \udXXX escapes
        payload = json.dumps(data)
    return [payload[i : i + CHUNK_CHARS] for i in range(0, len(payload), CHUNK_CHARS)] or [""]


class MySQLBackup:
    """Append-only archive of every chat message, in MySQL or SQLite.

    Each message is stored with ``message_to_dict`` (tool calls, ids,
    ``additional_kwargs`` and ``response_metadata`` survive), its session and user,
    its role and its creation time to the microsecond, ordered by an autoincrement
    id. Tables are created idempotently on first use. A batch of messages is
    written in one transaction.

    Args:
        url: A SQLAlchemy URL or ``Engine``: ``mysql+pymysql://user:pw@host/db`` in
            production, ``sqlite:///path.db`` embedded. ``None`` means a SQLite file
            under ``$TIERED_MEMORY_HOME`` (default ``./.tiered_memory``).
        table_name: Name of the messages table (letters, digits and underscores).
        engine_kwargs: Extra keyword arguments for ``create_engine``.

    Example:
        .. code-block:: python

            backup = MySQLBackup("mysql+pymysql://app:secret@db:3306/chat")
            backup.add_messages("s1", [HumanMessage("hi"), AIMessage("hello")])
            backup.history("s1", limit=50)

    """

    def __init__(
        self,
        url: str | URL | Engine | None = None,
        *,
        table_name: str = "chat_messages",
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,48}", table_name):
            msg = f"table_name {table_name!r} must be letters, digits and underscores"
            raise ValueError(msg)
        if url is None:
            home = default_home()
            home.mkdir(parents=True, exist_ok=True)
            url = f"sqlite:///{home / 'archive.sqlite3'}"
        if isinstance(url, Engine):
            self.engine = url
        else:
            self.engine = create_engine(url, **_engine_defaults(make_url(url), engine_kwargs))
        self.url: URL = self.engine.url
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine)
        self.metadata = MetaData()
        self.tables = build_tables(self.metadata, table_name)
        self.table, self.parts_table = self.tables.messages, self.tables.parts
        self._async_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncEngine] = (
            weakref.WeakKeyDictionary()
        )
        self._async_lock = threading.Lock()
        self._forget_hooks: list[Callable[[], ForgetHook | None]] = []
        self.create_tables()

    def __repr__(self) -> str:
        return f"MySQLBackup({self.url.render_as_string(hide_password=True)!r})"

    # -- engines --------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the archive's tables if they do not exist (idempotent)."""
        self._guard(lambda: self.metadata.create_all(self.engine, checkfirst=True))
        self._guard(lambda: ensure_columns(self.engine, self.tables))
        self.run(self._lock_rows_plan())

    def _lock_rows_plan(self) -> Plan[None]:
        locks = self.tables.locks
        existing = yield select(locks.c.name).where(locks.c.name == "claim")
        if existing.first() is None:
            yield insert(locks).values(name="claim")

    def async_engine(self) -> AsyncEngine:
        """The async engine for the running event loop (one per loop).

        Pooled async connections belong to the loop that opened them, so each loop
        gets its own engine: ``aiosqlite`` for SQLite, ``aiomysql`` (PyMySQL
        underneath) for MySQL.
        """
        loop = asyncio.get_running_loop()
        with self._async_lock:
            engine = self._async_engines.get(loop)
            if engine is None:
                engine = create_async_engine(
                    _async_url(self.url), **_engine_defaults(self.url, asynchronous=True)
                )
                if self.dialect == "sqlite":
                    _configure_sqlite(engine.sync_engine)
                self._async_engines[loop] = engine
            return engine

    def _options(self, write: bool, read_only: bool) -> dict[str, Any]:
        if self.dialect == "sqlite":
            if read_only:
                return {"sqlite_begin": None}
            return {"sqlite_begin": "BEGIN IMMEDIATE" if write else "BEGIN"}
        # Writers that read first must see what other processes committed.
        return {"isolation_level": "READ COMMITTED"} if write else {}

    def run(self, plan: Plan[T], *, write: bool = False, read_only: bool = False) -> T:
        """Run a plan in one transaction on the sync engine.

        Args:
            plan: A generator of statements (see the module docstring).
            write: The plan reads, then writes on what it read: take the write lock
                up front on SQLite, read committed data on MySQL.
            read_only: The plan only reads: no explicit transaction.
        """
        options = self._options(write, read_only)
        return self._guard(lambda: _run_sync(self.engine, plan, options, read_only))

    async def arun(self, plan: Plan[T], *, write: bool = False, read_only: bool = False) -> T:
        """Run a plan in one transaction on this loop's async engine."""
        options = self._options(write, read_only)
        try:
            return await _run_async(self.async_engine(), plan, options, read_only)
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from exc

    def _guard(self, action: Any) -> Any:
        try:
            return action()
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: SQLAlchemyError) -> ArchiveUnavailableError:
        where = self.url.render_as_string(hide_password=True)
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return ArchiveUnavailableError(f"archive {where} failed: {reason}")

    # -- plans ----------------------------------------------------------------

    def _add_plan(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        user_id: str | None,
        jobs: Sequence[str] = (),
        consolidate_after: int | None = None,
    ) -> Plan[list[int]]:
        now = utcnow()
        ids: list[int] = []
        for message in messages:
            pieces = _encode(message)
            result = yield insert(self.table).values(
                session_id=session_id,
                user_id=user_id,
                role=role_of(message),
                message=pieces[0],
                parts=len(pieces) - 1,
                created_at=now,
            )
            message_id = int(result.inserted_primary_key[0])
            for seq, piece in enumerate(pieces[1:], start=1):
                yield insert(self.parts_table).values(message_id=message_id, seq=seq, data=piece)
            ids.append(message_id)
        for kind in jobs if ids else ():
            # One extraction per finished turn of the batch, not only the last one.
            ends = _turn_ends(messages) if kind == "extract" else [len(ids) - 1]
            for end in ends:
                yield enqueue_statement(self.tables.jobs, kind, session_id, user_id, ids[end], now)
        if consolidate_after is not None and ids:
            yield from backlog_enqueue_plan(
                self.tables, "consolidate", session_id, user_id, ids[-1], consolidate_after, now
            )
        return ids

    def _load_plan(self, rows: Sequence[Any]) -> Plan[list[BaseMessage]]:
        """Decode rows of (id, message, parts), fetching the pieces of large ones."""
        extra: dict[int, list[str]] = {}
        chunked = [row.id for row in rows if row.parts]
        if chunked:
            result = yield (
                select(self.parts_table.c.message_id, self.parts_table.c.data)
                .where(self.parts_table.c.message_id.in_(chunked))
                .order_by(self.parts_table.c.message_id, self.parts_table.c.seq)
            )
            for message_id, data in result:
                extra.setdefault(message_id, []).append(data)
        payloads = [json.loads(row.message + "".join(extra.get(row.id, ()))) for row in rows]
        return messages_from_dict(payloads)

    def _tail_plan(self, session_id: str, turns: int) -> Plan[list[BaseMessage]]:
        # Two steps, so that MySQL can range-scan (session_id, id) from the start.
        t = self.table
        start = yield (
            select(t.c.id)
            .where(t.c.session_id == session_id, t.c.role == "human")
            .order_by(t.c.id.desc())
            .limit(1)
            .offset(turns - 1)
        )
        first = start.scalar() or 0
        result = yield (
            select(t.c.id, t.c.message, t.c.parts)
            .where(t.c.session_id == session_id, t.c.id >= first)
            .order_by(t.c.id)
        )
        return (yield from self._load_plan(result.all()))

    def _all_plan(self, session_id: str) -> Plan[list[BaseMessage]]:
        t = self.table
        result = yield (
            select(t.c.id, t.c.message, t.c.parts)
            .where(t.c.session_id == session_id)
            .order_by(t.c.id)
        )
        return (yield from self._load_plan(result.all()))

    def _history_plan(
        self, session_id: str, before_id: int | None, limit: int
    ) -> Plan[list[ArchivedMessage]]:
        t = self.table
        query = select(t).where(t.c.session_id == session_id)
        if before_id is not None:
            query = query.where(t.c.id < before_id)
        result = yield query.order_by(t.c.id.desc()).limit(limit)
        rows = list(reversed(result.all()))
        messages = yield from self._load_plan(rows)
        return [
            ArchivedMessage(
                id=row.id,
                session_id=row.session_id,
                user_id=row.user_id,
                role=row.role,
                message=message,
                created_at=row.created_at,
            )
            for row, message in zip(rows, messages, strict=True)
        ]

    def _sessions_plan(self, user_id: str | None) -> Plan[list[SessionInfo]]:
        t = self.table
        query = select(
            t.c.session_id,
            func.max(t.c.user_id).label("user_id"),
            func.count().label("message_count"),
            func.min(t.c.created_at).label("first_at"),
            func.max(t.c.created_at).label("last_active"),
        ).group_by(t.c.session_id)
        if user_id is not None:
            query = query.where(t.c.user_id == user_id)
        result = yield query.order_by(func.max(t.c.id).desc())
        return [SessionInfo(**row._mapping) for row in result]

    def _delete_plan(
        self, session_id: str | None, user_id: str | None, derived: bool = False
    ) -> Plan[int]:
        """Delete a scope's messages; with ``derived``, also its jobs and derived rows."""
        t, p = self.table, self.parts_table
        if session_id is None and user_id is None:
            msg = "deleting from the archive needs a session_id or a user_id"
            raise ValueError(msg)
        tables = self.tables
        for table in (
            (tables.jobs, tables.memories, tables.consolidation, tables.history_log)
            if derived
            else ()
        ):
            yield delete(table).where(*scope_conditions(table, session_id, user_id))
        scope = scope_conditions(t, session_id, user_id)
        yield delete(p).where(p.c.message_id.in_(select(t.c.id).where(*scope)))
        result = yield delete(t).where(*scope)
        return int(result.rowcount)

    def _sessions_in_scope_plan(
        self, session_id: str | None, user_id: str | None
    ) -> Plan[list[str]]:
        found: set[str] = set()
        for table in (
            self.table,
            self.tables.jobs,
            self.tables.memories,
            self.tables.consolidation,
        ):
            result = (
                yield select(table.c.session_id)
                .where(*scope_conditions(table, session_id, user_id))
                .distinct()
            )
            found.update(result.scalars())
        return sorted(found)

    # -- public API -----------------------------------------------------------

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str] = (),
        consolidate_after: int | None = None,
    ) -> list[int]:
        """Archive a batch of messages in one transaction.

        Args:
            session_id: The conversation the messages belong to.
            messages: The messages, in order.
            user_id: The user who owns the session, if known.
            jobs: Kinds of background jobs (``"extract"``, ``"consolidate"``) to
                queue, in the same transaction, for the batch's last message.
            consolidate_after: Also queue a ``consolidate`` job when the session
                has more than this many messages not yet consolidated.

        Returns:
            The archive ids of the new rows, in order.

        Raises:
            ArchiveUnavailableError: If the database cannot be reached; nothing of
                the batch is stored then.

        """
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        return self.run(self._add_plan(session_id, messages, user_id, jobs, consolidate_after))

    async def aadd_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str] = (),
        consolidate_after: int | None = None,
    ) -> list[int]:
        """Async :meth:`add_messages`."""
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        return await self.arun(
            self._add_plan(session_id, messages, user_id, jobs, consolidate_after)
        )

    def tail(self, session_id: str, turns: int) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns (a turn starts at a human message)."""
        return self.run(
            self._tail_plan(validate_id(session_id), _positive(turns, "turns")), read_only=True
        )

    async def atail(self, session_id: str, turns: int) -> list[BaseMessage]:
        """Async :meth:`tail`."""
        return await self.arun(self._tail_plan(validate_id(session_id), _positive(turns, "turns")))

    def get_messages(self, session_id: str) -> list[BaseMessage]:
        """Every archived message of a session, oldest first."""
        return self.run(self._all_plan(validate_id(session_id)), read_only=True)

    async def aget_messages(self, session_id: str) -> list[BaseMessage]:
        """Async :meth:`get_messages`."""
        return await self.arun(self._all_plan(validate_id(session_id)), read_only=True)

    def history(
        self, session_id: str, before_id: int | None = None, limit: int = 50
    ) -> list[ArchivedMessage]:
        """One page of a session's archive, oldest first, for a front end or an audit.

        Args:
            session_id: The session to read.
            before_id: Only messages with a smaller id (pass the ``id`` of the first
                message of the previous page to go back in time).
            limit: At most this many messages: the newest ones before ``before_id``.

        """
        return self.run(
            self._history_plan(validate_id(session_id), before_id, _positive(limit, "limit"))
        )

    async def ahistory(
        self, session_id: str, before_id: int | None = None, limit: int = 50
    ) -> list[ArchivedMessage]:
        """Async :meth:`history`."""
        return await self.arun(
            self._history_plan(validate_id(session_id), before_id, _positive(limit, "limit"))
        )

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions with their message counts and last activity, most recent first."""
        return self.run(self._sessions_plan(validate_optional_id(user_id)))

    async def asessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Async :meth:`sessions`."""
        return await self.arun(self._sessions_plan(validate_optional_id(user_id)))

    def clear(self, session_id: str) -> int:
        """Delete a session's messages from the archive; returns how many."""
        return self.run(self._delete_plan(validate_id(session_id), None))

    async def aclear(self, session_id: str) -> int:
        """Async :meth:`clear`."""
        return await self.arun(self._delete_plan(validate_id(session_id), None))

    def on_forget(self, hook: ForgetHook) -> None:
        """Register a tier's cleanup for :meth:`forget` (Chroma vectors, files)."""
        # Weakly, so a closed tier can be collected; its hook then falls away.
        ref = weakref.WeakMethod(hook) if inspect.ismethod(hook) else (lambda: hook)
        self._forget_hooks.append(ref)

    def forget(self, *, session_id: str | None = None, user_id: str | None = None) -> int:
        """Remove a session, a user, or one user's session from every tier.

        Jobs go first, so nothing new is derived; then each registered tier
        removes its part (Chroma memories page by page, MEMORY.md files); then the
        memory catalog, the consolidated documents and the archived messages.

        Returns:
            How many archived messages were removed.
        """
        session_id = validate_optional_id(session_id, "session_id")
        user_id = validate_optional_id(user_id, "user_id")
        if session_id is None and user_id is None:
            msg = "forget needs a session_id or a user_id"
            raise ValueError(msg)
        jobs = self.tables.jobs
        sessions = self.run(self._sessions_in_scope_plan(session_id, user_id))

        def drop_jobs() -> Plan[None]:
            yield delete(jobs).where(*scope_conditions(jobs, session_id, user_id))

        self.run(drop_jobs(), write=True)
        for ref in list(self._forget_hooks):
            hook = ref()
            if hook is not None:
                hook(sessions, session_id, user_id)
        return self.run(self._delete_plan(session_id, user_id, derived=True), write=True)

    def dispose(self) -> None:
        """Close the sync engine's pooled connections."""
        self.engine.dispose()

    async def adispose(self) -> None:
        """Close the running loop's async engine and its pooled connections."""
        with self._async_lock:
            engine = self._async_engines.pop(asyncio.get_running_loop(), None)
        if engine is not None:
            await engine.dispose()


# -- helpers ------------------------------------------------------------------


def _turn_ends(messages: Sequence[BaseMessage]) -> list[int]:
    """Indexes of the AI answers (no tool calls) that close a turn, and the last one."""
    ends = [
        i
        for i, message in enumerate(messages[:-1])
        if role_of(message) == "ai"
        and not getattr(message, "tool_calls", None)
        and role_of(messages[i + 1]) == "human"
    ]
    return [*ends, len(messages) - 1]


def scope_conditions(table: Any, session_id: str | None, user_id: str | None) -> list[Any]:
    """WHERE conditions selecting a session, a user, or one user's session."""
    conditions = []
    if session_id is not None:
        conditions.append(table.c.session_id == session_id)
    if user_id is not None:
        conditions.append(table.c.user_id == user_id)
    return conditions


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be a positive int, got {value!r}"
        raise ValueError(msg)
    return value


def _engine_defaults(
    url: URL, extra: dict[str, Any] | None = None, *, asynchronous: bool = False
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() in ("mysql", "mariadb"):
        # Reconnect transparently after a server restart or an idle timeout, and
        # never wait forever on a server that stopped answering: PyMySQL has no
        # socket timeout by default (aiomysql knows only the connect timeout).
        kwargs.update(pool_pre_ping=True, pool_recycle=3600)
        kwargs["connect_args"] = {"connect_timeout": 10}
        if not asynchronous:
            kwargs["connect_args"].update(read_timeout=60, write_timeout=60)
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}
    kwargs.update(extra or {})
    return kwargs


def _async_url(url: URL) -> URL:
    backend = url.get_backend_name()
    driver = _ASYNC_DRIVERS.get(backend)
    if driver is None:
        msg = f"no async driver is known for {backend!r}; use the sync methods"
        raise NotImplementedError(msg)
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        msg = "an in-memory SQLite archive cannot be shared with async methods; use a file"
        raise ValueError(msg)
    return url.set(drivername=f"{backend}+{driver}")


def _configure_sqlite(engine: Engine) -> None:
    """WAL for concurrent readers; FULL sync so an acknowledged write survives.

    We emit BEGIN ourselves (SQLAlchemy's documented recipe) so that writers can
    take the write lock up front with BEGIN IMMEDIATE and never fail on a stale
    read snapshot.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        statement = conn.get_execution_options().get("sqlite_begin", "BEGIN")
        if statement:  # None: an autocommit read
            conn.exec_driver_sql(statement)
