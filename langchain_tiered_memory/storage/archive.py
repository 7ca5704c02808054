"""The archive tier: every message, durably, in MySQL (or SQLite embedded).

The archive is the source of truth; every other tier is derived from it. Statements
are built once by small query builders and run by either a sync or an async driver,
so the sync and async methods share all of their logic.

The archive names no tier: a write runs the enqueue plans of the tiers it is
given (:class:`~langchain_tiered_memory.storage.base.EnqueuePlanner`) in its own
transaction, and a forget runs the erasers the tiers registered
(:meth:`MySQLBackup.register_tier`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import random
import re
import socket
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote_plus

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    StaticPool,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from langchain_tiered_memory.core.encoding import exact_json
from langchain_tiered_memory.core.lifecycle import Lifecycle
from langchain_tiered_memory.core.turns import role_of, turn_starts
from langchain_tiered_memory.core.validation import (
    check_int,
    check_number,
    validate_batch,
    validate_id,
    validate_optional_id,
    validate_page,
)
from langchain_tiered_memory.storage.base import (
    MAX_PACKET_BYTES,
    ArchivedMessage,
    EnqueuePlanner,
    Plan,
    SessionInfo,
    WrittenBatch,
    adrive,
    drive,
    utcnow,
)
from langchain_tiered_memory.storage.jobs import TurnJobs
from langchain_tiered_memory.storage.schema import (
    build_tables,
    ensure_columns,
    max_table_name_length,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: ``hook(session_ids, session_id, user_id)``: a tier's part of :meth:`MySQLBackup.forget`.
ForgetHook = Callable[[Sequence[str], "str | None", "str | None"], None]
#: ``factory(locator)``: the :data:`ForgetHook` of a store recorded by a tier.
EraserFactory = Callable[[dict[str, Any]], ForgetHook]
#: Entry-point group of tier erasers: ``<kind> = "module:factory"`` (an EraserFactory).
ERASER_GROUP = "langchain_tiered_memory.erasers"
#: Longest wait for another process creating the tables (MySQL's ``GET_LOCK``).
SCHEMA_LOCK_SECONDS = 60
#: Erasers registered by the tier modules on import: the fallback of the entry points.
_ERASERS: dict[str, EraserFactory] = {}

#: Pieces of a large payload are stored in their own rows, so that no single
#: statement passes the server's ``max_allowed_packet``: 512 Ki characters, at most
#: 4 bytes each in utf8mb4 and twice that escaped, are a quarter of a packet.
CHUNK_CHARS = MAX_PACKET_BYTES // 4 // 8
#: Default of ``MySQLBackup(timeout=...)``: how long, in seconds, an archive call
#: may wait on a database that stopped answering before it raises.
DEFAULT_TIMEOUT = 30.0
#: Longest accepted ``timeout`` (a day; PyMySQL refuses socket timeouts over a year).
MAX_TIMEOUT = 24 * 3600.0
#: Query parameters whose values are never shown: ``?password=``, ``?passwd=``,
#: ``?ssl_key=``, ``?token=``...
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|cred", re.IGNORECASE)
#: Rows of (id, role) read per step while :meth:`MySQLBackup.tail` looks for where its
#: turns start (the first step reads fewer, the later ones more).
TAIL_SCAN = 4096

_ASYNC_DRIVERS = {"sqlite": "aiosqlite", "mysql": "aiomysql", "mariadb": "aiomysql"}


#: The sync driver the archive runs each database with: its timeouts are PyMySQL's.
#: A URL naming the async twin (``_ASYNC_DRIVERS``) or no driver gets this one.
_SYNC_DRIVERS = {"sqlite": "pysqlite", "mysql": "pymysql", "mariadb": "pymysql"}

#: The databases the archive runs on (SQLAlchemy backend names), and how to name them.
SUPPORTED_DATABASES = {
    "sqlite": "sqlite:///path.db",
    "mysql": "mysql+pymysql://user:pw@host/db",
    "mariadb": "mariadb+pymysql://user:pw@host/db",
}


class UnsupportedDatabaseError(ValueError):
    """The archive URL names a database the archive does not run on.

    Attributes:
        backend: The database the URL named, e.g. ``"postgresql"``.
    """

    def __init__(self, backend: str, driver: str | None = None) -> None:
        self.backend = backend
        self.driver = driver
        supported = ", ".join(SUPPORTED_DATABASES.values())
        if driver is None:
            problem = f"the archive does not run on {backend!r}"
        else:
            problem = (
                f"the archive does not run {backend} through {driver!r}: it uses "
                f"{_SYNC_DRIVERS[backend]!r} (and {_ASYNC_DRIVERS[backend]!r} for async calls)"
            )
        super().__init__(f"{problem}; supported databases: SQLite and MySQL/MariaDB ({supported})")


class ArchiveUnavailableError(RuntimeError):
    """The archive database could not be reached, or failed (not on the data it was given)."""


class ArchiveRefusedError(ValueError):
    """The archive database answered, and refused the data of a write.

    A value too long for its column, or a constraint it breaks (SQLAlchemy's
    ``DataError``, or an ``IntegrityError`` not run again): not an outage, and the
    same write would be refused again. Nothing of the refused transaction is stored.
    """


#: PEP 249 names of the errors of a database that refuses the data it was given.
_REFUSALS = frozenset({"DataError", "IntegrityError"})


class ForgetIncompleteError(RuntimeError):
    """``forget`` removed all it could, but some tier's store still holds the scope.

    Everything reachable is gone (the archive's rows included); the stores named in
    :attr:`unfinished` could not be erased (a Chroma server down, no eraser installed
    for a recorded tier). The archive keeps a record of the forget (see
    :meth:`MySQLBackup.pending_forgets`): calling ``forget`` again with the same scope
    erases the rest and clears the record.

    Attributes:
        session_id: The forget's ``session_id`` argument.
        user_id: The forget's ``user_id`` argument.
        session_ids: The sessions in scope.
        unfinished: One ``"<store>: <error>"`` line per store left.
    """

    def __init__(
        self,
        session_id: str | None,
        user_id: str | None,
        session_ids: Sequence[str],
        unfinished: Sequence[str],
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.session_ids = list(session_ids)
        self.unfinished = list(unfinished)
        scope = ", ".join(
            f"{name}={value!r}"
            for name, value in (("session_id", session_id), ("user_id", user_id))
            if value is not None
        )
        super().__init__(
            f"forget({scope}) is incomplete: {'; '.join(unfinished)}. Everything else is "
            "removed; the forget is recorded, call it again with the same scope to finish"
        )


@dataclass(frozen=True)
class TierRecord:
    """A store that a tier keeps derived data of the archive's sessions in."""

    kind: str
    locator: dict[str, Any]

    @property
    def key(self) -> str:
        """One key per store: a hash of the kind and the canonical locator."""
        canonical = json.dumps([self.kind, self.locator], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()

    def __str__(self) -> str:
        return f"{self.kind} {json.dumps(self.locator, sort_keys=True, ensure_ascii=False)}"


@dataclass(frozen=True)
class PendingForget:
    """A forget that could not erase every store yet (see :class:`ForgetIncompleteError`)."""

    session_id: str | None
    user_id: str | None
    session_ids: list[str]
    unfinished: list[str]
    created_at: datetime


def register_eraser(kind: str, factory: EraserFactory) -> None:
    """Make ``factory`` this process's eraser of recorded stores of ``kind``.

    The tier modules call it on import. It is the fallback of the entry points of
    :data:`ERASER_GROUP`, which let an installed package name its erasers without
    being imported first.
    """
    _ERASERS[kind] = factory


def find_eraser(
    kind: str, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None
) -> EraserFactory | None:
    """The eraser factory of a recorded tier ``kind``, or ``None`` if none is known.

    Args:
        kind: The tier's kind, as recorded.
        entry_points: Where to look first; default the installed entry points of
            :data:`ERASER_GROUP`. Then the erasers of :func:`register_eraser`.
    """
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ERASER_GROUP)
    for entry_point in entry_points:
        if entry_point.group == ERASER_GROUP and entry_point.name == kind:
            try:
                return entry_point.load()
            except Exception:
                if kind not in _ERASERS:
                    raise
    return _ERASERS.get(kind)


class SessionOwnershipError(PermissionError):
    """A session was used by a user it does not belong to; nothing was read or written.

    A session belongs, for good, to the ``user_id`` of its first write (``None`` for
    a session created without a user). Writes must carry that ``user_id``; reads
    that carry a ``user_id`` must name it (reads without one are not checked).

    Attributes:
        session_id: The session.
        user_id: The user who was refused (the owner is not disclosed).
    """

    def __init__(self, session_id: str, user_id: str | None) -> None:
        self.session_id = session_id
        self.user_id = user_id
        if user_id is None:
            msg = f"session {session_id!r} belongs to a user: pass its user_id"
        else:
            msg = f"session {session_id!r} does not belong to user {user_id!r}"
        super().__init__(msg)


def default_home() -> Path:
    """The embedded defaults' folder: ``$TIERED_MEMORY_HOME`` or ``./.tiered_memory``."""
    return Path(os.environ.get("TIERED_MEMORY_HOME") or ".tiered_memory")


def default_url(home: str | Path | None = None) -> str:
    """The archive of ``MySQLBackup()`` and of the ``tiered-memory`` command.

    ``$TIERED_MEMORY_URL`` if set, else the SQLite file ``archive.sqlite3`` in the
    home folder: a script and the command line run in the same folder (or with
    the same variables) see the same archive.

    Args:
        home: The home folder (the command's ``--home``); ``None`` is
            :func:`default_home`.
    """
    folder = Path(home) if home is not None else default_home()
    return os.environ.get("TIERED_MEMORY_URL") or f"sqlite:///{folder / 'archive.sqlite3'}"


def check_supported(url: URL, *, driver: bool = True) -> URL:
    """``url`` with the archive's sync driver, if its database is one the archive runs on.

    The names are read case-insensitively; no driver, or the async twin of the
    archive's own (``sqlite+aiosqlite``, ``mysql+aiomysql``), means the archive's
    sync driver (PyMySQL for MySQL/MariaDB): the archive derives its async engine itself.

    Args:
        url: The archive's URL.
        driver: Also check and set the driver (``False`` for an ``Engine`` the
            caller built, whose driver is theirs).

    Raises:
        UnsupportedDatabaseError: For any other database (PostgreSQL, Oracle...),
            or another driver of a supported one (``mysql+mysqlconnector``).
    """
    backend, _, named = url.drivername.lower().partition("+")
    if backend not in SUPPORTED_DATABASES:
        raise UnsupportedDatabaseError(backend)
    if not driver:
        return url
    if named not in ("", _SYNC_DRIVERS[backend], _ASYNC_DRIVERS[backend]):
        raise UnsupportedDatabaseError(backend, named)
    return url.set(drivername=f"{backend}+{_SYNC_DRIVERS[backend]}")


def _run_sync(
    engine: Engine, plan: Plan[T], options: dict[str, Any], read_only: bool, write: bool
) -> T:
    with engine.connect() as conn:
        conn.execution_options(**options)
        if read_only:  # no COMMIT round trip; closing the connection rolls back
            return drive(plan, conn.execute, write=False)
        with conn.begin():
            return drive(plan, conn.execute, write=write)


async def _run_async(
    engine: AsyncEngine, plan: Plan[T], options: dict[str, Any], read_only: bool, write: bool
) -> T:
    async with engine.connect() as conn:
        try:
            await conn.execution_options(**options)
            if read_only:
                return await adrive(plan, conn, write=False)
            async with conn.begin():
                return await adrive(plan, conn, write=write)
        except asyncio.CancelledError:
            # Cut off mid-conversation (the deadline, or the caller): the server's
            # reply may still arrive, so the connection is discarded, never pooled.
            await conn.invalidate()
            raise


class _LoopEngine:
    """The async engine of one event loop, the thread that ran it, its connections."""

    def __init__(self, engine: AsyncEngine, thread: threading.Thread) -> None:
        self.engine = engine
        self.thread = thread
        # The driver's connections (aiomysql, aiosqlite), to close them without the loop.
        self.drivers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.guard: AsyncGenerator[None, None] | None = None

    def opened(self, dbapi_connection: Any, _record: Any) -> None:
        """The engine's ``connect`` event."""
        self.drivers.add(dbapi_connection.driver_connection)

    def watch(self, guard: AsyncGenerator[None, None]) -> None:
        """Start ``guard`` on the running loop, which closes it when it ends.

        Its first step runs here: that registers it with the loop (the loop's
        ``firstiter`` hook) as ``loop.shutdown_asyncgens()`` will find it.
        """
        self.guard = guard
        with contextlib.suppress(StopIteration):
            guard.__anext__().send(None)

    def unwatch(self) -> None:
        """End the guard now (it does nothing once the engine is taken off)."""
        if self.guard is not None:
            with contextlib.suppress(StopIteration):
                self.guard.aclose().send(None)
            self.guard = None

    async def aclose(self, dialect: str, timeout: float) -> None:
        """Close the connections of a loop that will not run again, from another loop."""
        self.unwatch()
        for driver in list(self.drivers):
            if dialect == "sqlite":
                # An aiosqlite connection is a thread: any loop can ask it to close. A
                # thread that died with its loop closed mid-call never answers, and
                # wait_for waits for its cancelled close too.
                thread = getattr(driver, "_thread", None)  # aiosqlite: no public name
                if thread is None or thread.is_alive():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(driver.close(), timeout)
                elif (orphan := getattr(driver, "_connection", None)) is not None:
                    # Closed here (check_same_thread=False), or the write its call
                    # had begun would hold the database's lock until collected.
                    with contextlib.suppress(Exception):
                        orphan.close()
            else:
                _close_socket(driver)
        # The pool holds only closed connections now; nothing else to release.
        self.engine.sync_engine.dispose(close=False)


async def _aclose_all(ended: Sequence[_LoopEngine], dialect: str, timeout: float) -> None:
    for held in ended:
        await held.aclose(dialect, timeout)


def _close_socket(driver: Any) -> None:
    """Close an aiomysql connection whose loop will not run again, without the loop.

    The server frees the connection as soon as the socket is shut down; the loop's
    transport cannot close it (a closed loop refuses the callback: "Event loop is
    closed"), so its file is closed when the transport is collected.
    """
    writer = getattr(driver, "_writer", None)  # aiomysql has no public transport
    sock = writer.transport.get_extra_info("socket") if writer is not None else None
    if sock is not None:
        # Through a socket object of our own on the same connection: uvloop's
        # transports give a stand-in whose shutdown() raises TypeError.
        with (
            contextlib.suppress(OSError, ValueError),
            socket.socket(fileno=os.dup(sock.fileno())) as same,
        ):
            same.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(RuntimeError):  # the closed loop refuses the callback
        driver.close()


def _encode(message: BaseMessage) -> list[str]:
    payload = exact_json(message_to_dict(message), stand_ins=True)
    return [payload[i : i + CHUNK_CHARS] for i in range(0, len(payload), CHUNK_CHARS)] or [""]


class MySQLBackup(Lifecycle):
    """Append-only archive of every chat message, in MySQL or SQLite.

    Each message is stored with ``message_to_dict`` (tool calls, ids,
    ``additional_kwargs`` and ``response_metadata`` survive), its session and user,
    its role and its creation time to the microsecond, ordered by an autoincrement
    id. Tables are created idempotently on first use. A batch of messages is
    written in one transaction.

    Args:
        url: A SQLAlchemy URL or ``Engine``: ``mysql+pymysql://user:pw@host/db`` in
            production, ``sqlite:///path.db`` embedded. ``None`` means
            :func:`default_url`: ``$TIERED_MEMORY_URL``, else a SQLite file under
            ``$TIERED_MEMORY_HOME`` (default ``./.tiered_memory``), as the
            ``tiered-memory`` command reads it. Any other database raises
            :class:`UnsupportedDatabaseError`.
        table_name: Base name of the archive's tables: letters, digits and
            underscores, at most :func:`max_table_name_length`
            (37) characters, so that every derived table and index name fits MySQL's
            64-character limit.
        engine_kwargs: Extra keyword arguments for ``create_engine`` (its
            ``connect_args`` are merged into the defaults).
        timeout: Seconds (default 30) an archive call may wait on a database that
            stops answering before it raises ``ArchiveUnavailableError``. Async calls
            run under this deadline; sync calls wait at most ``timeout / 2`` for any
            one thing (a pooled connection, the connect, each socket read or write),
            and against a silent server at most twice: the ping of a pooled
            connection, then one reconnect. On SQLite it is the wait for a lock.
            A given ``Engine`` keeps its own settings for sync calls.

    Example:
        .. code-block:: python

            with MySQLBackup("mysql+pymysql://app:secret@db:3306/chat") as backup:
                backup.add_messages("s1", [HumanMessage("hi"), AIMessage("hello")])
                backup.history("s1", limit=50)
            # the pooled connections are closed (``async with`` closes the loop's too)

    """

    def __init__(
        self,
        url: str | URL | Engine | None = None,
        *,
        table_name: str = "chat_messages",
        engine_kwargs: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        validate_table_name(table_name)
        self.timeout = check_number("timeout", timeout, 0, MAX_TIMEOUT, low_ok=False)
        if url is None:
            url = default_url()
            if "TIERED_MEMORY_URL" not in os.environ:
                default_home().mkdir(parents=True, exist_ok=True)
        if isinstance(url, Engine):
            check_supported(url.url, driver=False)
            if in_memory(url.url) and not isinstance(url.pool, StaticPool):
                # Not probed from another thread: a refused probe invalidates the one
                # connection (the database with it) and rolls back its transaction.
                msg = (
                    f"an in-memory SQLite Engine needs StaticPool, not {type(url.pool).__name__} "
                    "(and connect_args={'check_same_thread': False}): otherwise each thread "
                    "has its own empty database, or none at all; pass the URL 'sqlite://' "
                    "and MySQLBackup sets it up"
                )
                raise ValueError(msg)
            self.engine = url
        else:
            parsed = _password_in_userinfo(check_supported(make_url(url)))
            self.engine = create_engine(
                parsed, **_engine_defaults(parsed, engine_kwargs, timeout=self.timeout)
            )
        self.url: URL = self.engine.url
        self.dialect = self.engine.dialect.name
        # An in-memory SQLite database is one connection shared by every thread:
        # one plan at a time on it, or one thread's statements join another's
        # transaction.
        self._serial: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if in_memory(self.url) else contextlib.nullcontext()
        )
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine, self.timeout)
        self.metadata = MetaData()
        self.tables = build_tables(self.metadata, table_name)
        self.table, self.parts_table = self.tables.messages, self.tables.parts
        # The async engine of each loop that used the archive, until the loop ends.
        self._async_engines: dict[asyncio.AbstractEventLoop, _LoopEngine] = {}
        self._async_lock = threading.Lock()
        # (weak hook, key of the recorded store it erases or None, what it is).
        self._forget_hooks: list[tuple[Callable[[], ForgetHook | None], str | None, str]] = []
        self.create_tables()

    def __repr__(self) -> str:
        return f"MySQLBackup({render_url(self.url)!r})"

    # -- engines --------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the archive's tables if they do not exist (idempotent).

        Tables made by an earlier version get the nullable columns added since.
        """
        with self._schema_lock():
            self._create(self.metadata)
            self.run(self._lock_rows_plan(), write=True)

    def create_all(self, metadata: MetaData) -> None:
        """Create the tables of ``metadata`` in the archive's database if missing (idempotent).

        For stores that live beside the archive (``TieredStore``); tables made by an
        earlier version get the nullable columns added since.
        """
        with self._schema_lock():
            self._create(metadata)

    def _create(self, metadata: MetaData) -> None:
        # Checking for a table reads, then creating it writes: on SQLite that must
        # hold the write lock from the start, as every read-then-write plan does.
        engine = self.engine
        if self.dialect == "sqlite":
            engine = engine.execution_options(**self._options(write=True, read_only=False))
        with self._serial:
            self._guard(lambda: metadata.create_all(engine, checkfirst=True))
            self._guard(lambda: ensure_columns(engine, metadata.sorted_tables))

    @contextlib.contextmanager
    def _schema_lock(self) -> Iterator[None]:
        """Hold the database's schema lock: processes starting at once create tables in turn.

        ``create_all`` checks for a table, then creates it: on MySQL a table another
        process created in between failed the start with "already exists". A named
        server lock (``GET_LOCK``) orders them; SQLite's write lock already does.
        """
        if self.dialect == "sqlite":
            yield
            return
        digest = hashlib.sha256((self.url.database or "").encode()).hexdigest()[:16]
        name = f"langchain_tiered_memory.schema.{digest}"  # at most 64 characters
        # A connection of its own, beside the pool (same creator and settings): the
        # tables are created through the pool, which may hold a single connection.
        beside = create_engine(self.url, pool=self.engine.pool.recreate())
        with contextlib.ExitStack() as stack:
            stack.callback(beside.dispose)
            connection = stack.enter_context(self._guard(beside.connect))
            got = self._guard(
                lambda: connection.execute(
                    text("SELECT GET_LOCK(:name, :seconds)"),
                    {"name": name, "seconds": SCHEMA_LOCK_SECONDS},
                ).scalar()
            )
            if got != 1:
                msg = (
                    f"archive {render_url(self.url)}: another process held the schema lock "
                    f"for {SCHEMA_LOCK_SECONDS} s while creating tables"
                )
                raise ArchiveUnavailableError(msg)
            try:
                yield
            finally:
                self._guard(
                    lambda: connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
                )

    def _lock_rows_plan(self) -> Plan[None]:
        locks = self.tables.locks
        existing = yield select(locks.c.name).where(locks.c.name == "claim")
        if existing.first() is None:
            yield insert(locks).values(name="claim")

    def async_engine(self) -> AsyncEngine:
        """The async engine for the running event loop (one per loop).

        Pooled async connections belong to the loop that opened them, so each loop
        gets its own engine: ``aiosqlite`` for SQLite, ``aiomysql`` (PyMySQL
        underneath) for MySQL. Its connections are closed when the loop ends
        (``asyncio.run`` returns, or ``loop.shutdown_asyncgens()``); those of a loop
        closed without that, or left by its ended thread, at the next async call;
        those of any loop not running (one dropped unclosed) at :meth:`dispose`.
        """
        loop = asyncio.get_running_loop()
        with self._async_lock:
            held = self._async_engines.get(loop)
            if held is not None:
                return held.engine
            engine = create_async_engine(
                _async_url(self.url),
                **_engine_defaults(self.url, asynchronous=True, timeout=self.timeout),
            )
            if self.dialect == "sqlite":
                _configure_sqlite(engine.sync_engine, self.timeout)
            held = self._async_engines[loop] = _LoopEngine(engine, threading.current_thread())
        event.listen(engine.sync_engine, "connect", held.opened)
        held.watch(self._until_loop_ends(loop, held))
        return engine

    async def _until_loop_ends(
        self, loop: asyncio.AbstractEventLoop, held: _LoopEngine
    ) -> AsyncGenerator[None, None]:
        """Closes ``held``'s connections when ``loop`` shuts down its async generators.

        That is the last thing a loop runs (``asyncio.run``, ``asyncio.Runner``,
        pytest-asyncio): its connections can still say goodbye to the server.
        """
        try:
            yield
        finally:
            if self._release(loop, held):  # not already released (adispose, a sweep)
                await held.engine.dispose()

    def _release(self, loop: asyncio.AbstractEventLoop, held: _LoopEngine) -> bool:
        """Take ``loop``'s engine off the archive if it is still ``held``."""
        with self._async_lock:
            if self._async_engines.get(loop) is not held:
                return False
            del self._async_engines[loop]
            return True

    def _ended_loops(self, *, idle: bool = False) -> list[_LoopEngine]:
        """Take off the engines of loops that can no longer end on their own.

        A loop closed without shutting down its async generators, or not running
        while the thread that used it has ended: no one will run it again to close
        its connections (each would hold a server connection, a SQLite thread).
        With ``idle`` (:meth:`dispose`), every loop not running: one dropped
        unclosed looks like one paused between ``run_until_complete`` calls, whose
        task may be in the middle of a query, so only a dispose takes it.
        """
        with self._async_lock:
            ended = [
                loop
                for loop, held in self._async_engines.items()
                if loop.is_closed()
                or (not loop.is_running() and (idle or not held.thread.is_alive()))
            ]
            return [self._async_engines.pop(loop) for loop in ended]

    def _close_ended_loops(self, *, wait: bool = True, idle: bool = False) -> None:
        """Close the connections of the loops :meth:`_ended_loops` takes off.

        In a thread of its own, on a fresh loop (aiosqlite closes through a loop,
        and this thread may be running another), waited for at most ``timeout``
        per loop, or not at all (``wait=False``: an async call goes on at once). A
        close that never ends (an aiosqlite thread that died after it was asked)
        holds up only that daemon thread.
        """
        ended = self._ended_loops(idle=idle)
        if ended:
            done = threading.Thread(
                target=asyncio.run,
                args=(_aclose_all(ended, self.dialect, self.timeout),),
                name="tiered-memory-close-loops",
                daemon=True,
            )
            done.start()
            if wait:
                done.join(self.timeout * len(ended))

    def _options(self, write: bool, read_only: bool) -> dict[str, Any]:
        if self.dialect == "sqlite":
            # Every plan is one snapshot, as under MySQL's REPEATABLE READ: a read-only
            # plan too is one deferred transaction (its rows and their pieces come from
            # one commit, never half of a clear), which in WAL blocks no writer.
            return {"sqlite_begin": "BEGIN IMMEDIATE" if write else "BEGIN"}
        # Writers that read first must see what other processes committed.
        return {"isolation_level": "READ COMMITTED"} if write else {}

    def run(
        self,
        plan: Plan[T] | Callable[[], Plan[T]],
        *,
        write: bool = False,
        read_only: bool = False,
    ) -> T:
        """Run a plan in one transaction on the sync engine.

        Args:
            plan: A generator of statements (see the module docstring), or a
                function making it: then a transaction the server rolled back on a
                deadlock or a lock wait timeout runs again from a fresh plan, up to
                :data:`RERUN_DELAYS` times.
            write: The plan reads, then writes on what it read: take the write lock
                up front on SQLite, read committed data on MySQL. A plan that
                writes after reading without it raises ``UndeclaredWriteError``.
            read_only: The plan only reads: it ends with a rollback, not a commit
                (no COMMIT round trip). It is still one snapshot: on SQLite one
                deferred transaction, on MySQL one REPEATABLE READ transaction.

        Raises:
            ArchiveUnavailableError: If the database fails (after the reruns).
        """
        options = self._options(write, read_only)
        attempt = 0
        while True:
            try:
                with self._serial:
                    return _run_sync(self.engine, _fresh(plan), options, read_only, write)
            except _database_errors(self.engine) as exc:
                delay = _rerun_delay(plan, exc, attempt)
                if delay is None:
                    raise self._database_error(exc) from exc
            time.sleep(delay)
            attempt += 1

    async def arun(
        self,
        plan: Plan[T] | Callable[[], Plan[T]],
        *,
        write: bool = False,
        read_only: bool = False,
    ) -> T:
        """Run a plan in one transaction on this loop's async engine (see :meth:`run`).

        On a server, the whole call (pool checkout, ping, connect, every statement,
        the reruns) runs under the ``timeout`` deadline: aiomysql has no read
        timeout of its own.
        """
        options = self._options(write, read_only)
        # SQLite waits only for locks, bounded by its busy timeout; and a statement
        # cut off in aiosqlite's thread would run on after the call had failed.
        deadline = asyncio.timeout(None if self.dialect == "sqlite" else self.timeout)
        self._close_ended_loops(wait=False)
        engine = self.async_engine()
        errors = _database_errors(engine.sync_engine)
        try:
            async with deadline:
                attempt = 0
                while True:
                    try:
                        return await _run_async(engine, _fresh(plan), options, read_only, write)
                    except errors as exc:
                        delay = _rerun_delay(plan, exc, attempt)
                        if delay is None:
                            raise
                    await asyncio.sleep(delay)
                    attempt += 1
        except errors as exc:
            raise self._database_error(exc) from exc
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            msg = f"archive {render_url(self.url)} did not answer within {self.timeout:g} s"
            raise ArchiveUnavailableError(msg) from exc

    def _guard(self, action: Any) -> Any:
        try:
            return action()
        except _database_errors(self.engine) as exc:
            raise self._database_error(exc) from exc

    def _database_error(self, exc: BaseException) -> ArchiveUnavailableError | ArchiveRefusedError:
        """The error to raise for a database error: a refusal of the data, else an outage."""
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        if {cls.__name__ for cls in type(exc).__mro__} & _REFUSALS:  # wrapped or the driver's
            return ArchiveRefusedError(f"archive {render_url(self.url)} refused: {reason}")
        return ArchiveUnavailableError(f"archive {render_url(self.url)} failed: {reason}")

    # -- plans ----------------------------------------------------------------

    def _known_owner_plan(self, session_id: str) -> Plan[tuple[bool, str | None]]:
        """``(known, owner)`` of a session that has no row in the sessions table.

        Sessions written before that table existed take the user of their first
        message (or, once cleared, of their MEMORY.md or memories). One round trip.
        """
        tables = self.tables
        firsts = [
            select(literal(rank).label("rank"), table.c.user_id)
            .where(table.c.session_id == session_id)
            .order_by(order)
            .limit(1)
            .subquery()
            for rank, (table, order) in enumerate(
                (
                    (tables.messages, tables.messages.c.id),
                    (tables.consolidation, tables.consolidation.c.session_id),
                    (tables.memories, tables.memories.c.seq),
                )
            )
        ]
        found = union_all(*(select(first) for first in firsts)).subquery()
        result = yield select(found.c.user_id).order_by(found.c.rank).limit(1)
        row = result.first()
        return (True, row.user_id) if row is not None else (False, None)

    def owner_check_plan(
        self, session_id: str, user_id: str | None, write: bool = False
    ) -> Plan[None]:
        """Refuse ``user_id`` a session that is not theirs.

        A read without a user is not checked; a ``write`` check asks what a write
        would: that ``user_id`` is exactly the owner (``None`` included).

        Raises:
            SessionOwnershipError: If the session belongs to another user or to none.
        """
        if user_id is None and not write:
            return
        s = self.tables.sessions
        result = yield select(s.c.user_id).where(s.c.session_id == session_id)
        row = result.first()
        if row is not None:
            known, owner = True, row.user_id
        else:
            known, owner = yield from self._known_owner_plan(session_id)
        if known and owner != user_id:
            raise SessionOwnershipError(session_id, user_id)

    def _bind_owner_plan(self, session_id: str, user_id: str | None) -> Plan[None]:
        """Lock the session's row for this write, binding its owner on the first one.

        The row lock (``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` locks
        the whole database) makes writers of one session take turns, so each batch
        gets consecutive ids: a tool call is never separated from its result.

        Raises:
            SessionOwnershipError: If the session belongs to another user, or to a
                user while ``user_id`` is ``None``, or to none while it is not.
        """
        s = self.tables.sessions
        locked = select(s.c.user_id).where(s.c.session_id == session_id).with_for_update()
        row = (yield locked).first()
        if row is None:
            known, owner = yield from self._known_owner_plan(session_id)
            values = {
                "session_id": session_id,
                "user_id": owner if known else user_id,
                "created_at": utcnow(),
            }
            if self.dialect == "sqlite":
                yield sqlite_insert(s).values(values).on_conflict_do_nothing()
            else:
                # A racing first write may have inserted it: keep theirs. (Not INSERT
                # IGNORE: its shared lock would deadlock with the FOR UPDATE below.)
                statement = mysql_insert(s).values(values)
                yield statement.on_duplicate_key_update(user_id=s.c.user_id)
            row = (yield locked).one()
        if row.user_id != user_id:
            raise SessionOwnershipError(session_id, user_id)

    def _add_plan(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        user_id: str | None,
        planners: Sequence[EnqueuePlanner] = (),
    ) -> Plan[list[int]]:
        yield from self._bind_owner_plan(session_id, user_id)
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
        if ids and planners:
            # In this transaction: a job is never lost while its messages are kept.
            batch = WrittenBatch(self.tables, session_id, user_id, messages, ids, now)
            for planner in planners:
                yield from planner.enqueue_plan(batch)
        return ids

    def load_plan(self, rows: Sequence[Any]) -> Plan[list[BaseMessage]]:
        """Decode rows of ``(id, message, parts)``, fetching the pieces of large ones.

        For the tiers' own plans that read messages from the archive's tables.
        """
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

    def _tail_plan(
        self, session_id: str, turns: int, user_id: str | None = None, write: bool = False
    ) -> Plan[list[BaseMessage]]:
        yield from self.owner_check_plan(session_id, user_id, write)
        first = yield from self._tail_start_plan(session_id, turns)
        t = self.table
        result = yield (
            select(t.c.id, t.c.message, t.c.parts)
            .where(t.c.session_id == session_id, t.c.id >= first)
            .order_by(t.c.id)
        )
        return (yield from self.load_plan(result.all()))

    def _tail_start_plan(self, session_id: str, turns: int) -> Plan[int]:
        """The id where the last ``turns`` turns start (0: the whole session).

        Reads only ids and roles, newest first, in growing steps, until ``turns``
        turn starts are certain (:func:`~langchain_tiered_memory.core.turns.turn_starts`):
        the oldest row read may continue a run of human messages, so it is never
        counted until an older row is known.
        """
        t = self.table
        ids: list[int] = []
        roles: list[str] = []
        step = min(TAIL_SCAN, 2 * turns + 8)
        while True:
            query = select(t.c.id, t.c.role).where(t.c.session_id == session_id)
            if ids:
                query = query.where(t.c.id < ids[0])
            result = yield query.order_by(t.c.id.desc()).limit(step)
            rows = result.all()[::-1]
            ids[:0] = [row.id for row in rows]
            roles[:0] = [row.role for row in rows]
            if len(rows) < step:  # the session's first message is read
                starts = turn_starts(roles)
                return ids[starts[-turns]] if len(starts) >= turns else 0
            starts = [start for start in turn_starts(roles) if start > 0]
            if len(starts) >= turns:
                return ids[starts[-turns]]
            step = min(TAIL_SCAN, step * 4)

    def _all_plan(self, session_id: str, user_id: str | None = None) -> Plan[list[BaseMessage]]:
        yield from self.owner_check_plan(session_id, user_id)
        t = self.table
        result = yield (
            select(t.c.id, t.c.message, t.c.parts)
            .where(t.c.session_id == session_id)
            .order_by(t.c.id)
        )
        return (yield from self.load_plan(result.all()))

    def _history_plan(
        self, session_id: str, before_id: int | None, limit: int, user_id: str | None = None
    ) -> Plan[list[ArchivedMessage]]:
        yield from self.owner_check_plan(session_id, user_id)
        t = self.table
        query = select(t).where(t.c.session_id == session_id)
        if before_id is not None:
            query = query.where(t.c.id < before_id)
        result = yield query.order_by(t.c.id.desc()).limit(limit)
        rows = list(reversed(result.all()))
        messages = yield from self.load_plan(rows)
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
        self,
        session_id: str | None,
        user_id: str | None,
        derived: bool = False,
        keep_owner: bool = False,
    ) -> Plan[int]:
        """Delete a scope's messages; with ``derived``, also its jobs and derived rows.

        With ``keep_owner`` the sessions' owner rows stay (recorded first for a
        session from before the sessions table, whose owner its rows told).
        """
        t, p = self.table, self.parts_table
        if session_id is None and user_id is None:
            msg = "deleting from the archive needs a session_id or a user_id"
            raise ValueError(msg)
        if keep_owner and session_id is not None:
            s = self.tables.sessions
            found = yield select(s.c.user_id).where(s.c.session_id == session_id)
            if found.first() is None:
                known, owner = yield from self._known_owner_plan(session_id)
                if known:
                    yield from self._bind_owner_plan(session_id, owner)
        if derived:
            yield from self._unlink_plan(session_id, user_id)
        for table in self.tables.scoped() if derived else ():
            if keep_owner and table is self.tables.sessions:
                continue
            yield delete(table).where(*scope_conditions(table, session_id, user_id))
        scope = scope_conditions(t, session_id, user_id)
        yield delete(p).where(p.c.message_id.in_(select(t.c.id).where(*scope)))
        result = yield delete(t).where(*scope)
        return int(result.rowcount)

    def _unlink_plan(self, session_id: str | None, user_id: str | None) -> Plan[None]:
        """Let memories superseded by one of the scope's stand again before it goes.

        A tier that is open relinks them first (to a newer value of their subject);
        this holds on every other path (an archive forgetting alone, a memory written
        meanwhile): no link points at a deleted memory.
        """
        m = self.tables.memories.c
        linked = select(m.superseded_by).where(m.superseded_by.is_not(None))
        result = yield select(m.id).where(
            *scope_conditions(self.tables.memories, session_id, user_id), m.id.in_(linked)
        )
        targets = list(result.scalars())
        for start in range(0, len(targets), 500):
            chunk = targets[start : start + 500]
            yield (
                update(self.tables.memories)
                .where(m.superseded_by.in_(chunk))
                .values(superseded_by=None)
            )

    def _sessions_in_scope_plan(
        self, session_id: str | None, user_id: str | None
    ) -> Plan[list[str]]:
        found: set[str] = set()
        for table in (self.table, *self.tables.scoped()):
            result = (
                yield select(table.c.session_id)
                .where(*scope_conditions(table, session_id, user_id))
                .distinct()
            )
            found.update(result.scalars())
        forgets = self.tables.forgets  # an unfinished forget of this scope: its sessions too
        result = yield select(forgets.c.session_ids).where(
            *scope_conditions(forgets, session_id, user_id)
        )
        for ids in result.scalars():
            found.update(json.loads(ids))
        return sorted(found)

    def _record_tier_plan(self, record: TierRecord) -> Plan[None]:
        tiers = self.tables.tiers
        found = yield select(tiers.c.key).where(tiers.c.key == record.key)
        if found.first() is None:
            # Two processes may open the same store at once: the second insert is a no-op.
            yield (
                insert(tiers)
                .values(
                    key=record.key,
                    kind=record.kind,
                    locator=json.dumps(record.locator, sort_keys=True, ensure_ascii=False),
                    created_at=utcnow(),
                )
                .prefix_with("OR IGNORE", dialect="sqlite")
                .prefix_with("IGNORE", dialect="mysql")
                .prefix_with("IGNORE", dialect="mariadb")
            )

    def _tiers_plan(self) -> Plan[list[TierRecord]]:
        tiers = self.tables.tiers
        result = yield select(tiers.c.kind, tiers.c.locator).order_by(tiers.c.key)
        return [TierRecord(kind, json.loads(locator)) for kind, locator in result]

    def _finish_forget_plan(
        self,
        session_id: str | None,
        user_id: str | None,
        sessions: Sequence[str],
        unfinished: Sequence[str],
        keep_owner: bool = False,
    ) -> Plan[int]:
        removed = yield from self._delete_plan(
            session_id, user_id, derived=True, keep_owner=keep_owner
        )
        for table in self.tables.whole_session():  # another writer's summary holds ours too
            for start in range(0, len(sessions), 500):
                chunk = sessions[start : start + 500]
                yield delete(table).where(table.c.session_id.in_(chunk))
        forgets = self.tables.forgets
        yield delete(forgets).where(*scope_conditions(forgets, session_id, user_id))
        if unfinished:  # the record a retry finishes from
            yield insert(forgets).values(
                session_id=session_id,
                user_id=user_id,
                session_ids=json.dumps(list(sessions), ensure_ascii=False),
                unfinished=json.dumps(list(unfinished), ensure_ascii=False),
                created_at=utcnow(),
            )
        return removed

    # -- public API -----------------------------------------------------------

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """Archive a batch of messages in one transaction.

        The first write of a session binds it to its ``user_id`` (or to no user)
        for good; writers of one session take turns, so a batch's ids are
        consecutive (a tool call stays next to its result).

        Args:
            session_id: The conversation the messages belong to.
            messages: The messages, in order.
            user_id: The user who owns the session (``None``: a session without
                a user).
            jobs: What to queue in the same transaction: the tiers (or any
                :class:`~langchain_tiered_memory.storage.base.EnqueuePlanner`) whose
                jobs this write feeds, each planning its own; a job kind (a str) is
                shorthand for :class:`~langchain_tiered_memory.storage.jobs.TurnJobs`
                of that kind: one job per turn of the batch.

        Returns:
            The archive ids of the new rows, in order.

        Raises:
            SessionOwnershipError: If the session belongs to another user (or to
                none, or to one while ``user_id`` is ``None``); nothing is stored.
            ArchiveUnavailableError: If the database cannot be reached; nothing of
                the batch is stored then.
            ArchiveRefusedError: If the database refuses a value of the batch (a
                ``ValueError``); nothing of the batch is stored.

        """
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        plan = self._add_plan(session_id, messages, user_id, planners_of(jobs))
        return self.run(plan, write=True)

    async def aadd_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """Async :meth:`add_messages`."""
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        plan = self._add_plan(session_id, messages, user_id, planners_of(jobs))
        return await self.arun(plan, write=True)

    def check_owner(self, session_id: str, user_id: str | None, *, write: bool = False) -> None:
        """Refuse ``user_id`` access to a session that is not theirs.

        A session with no message yet belongs to no one and passes. A read with
        ``user_id=None`` (an administrator's) always passes.

        Args:
            session_id: The session.
            user_id: The user.
            write: Check as for a write: ``user_id`` must be the owner exactly,
                ``None`` for a session without a user. Lets a caller that will
                write refuse before it does any work.

        Raises:
            SessionOwnershipError: If the session belongs to another user, or was
                created without a user (or, with ``write``, to a user while
                ``user_id`` is ``None``).
        """
        plan = self.owner_check_plan(validate_id(session_id), validate_optional_id(user_id), write)
        self.run(plan, read_only=True)

    async def acheck_owner(
        self, session_id: str, user_id: str | None, *, write: bool = False
    ) -> None:
        """Async :meth:`check_owner`."""
        plan = self.owner_check_plan(validate_id(session_id), validate_optional_id(user_id), write)
        await self.arun(plan, read_only=True)

    def tail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns, oldest first.

        Turns are those of :func:`~langchain_tiered_memory.core.turns.turn_starts`:
        a run of human messages and what follows it; messages before the first
        human message count as one turn.

        Args:
            session_id: The session.
            turns: How many turns.
            user_id: The reading user, checked as in :meth:`check_owner`.
            write: Check as for a write (``None`` then reads only a session without
                a user): a history's window, which goes into a prompt, is read so.

        Raises:
            SessionOwnershipError: If ``user_id`` is given and the session is not
                theirs (see :meth:`check_owner`), or with ``write`` if it has a
                user while ``user_id`` is ``None``.
        """
        return self.run(self._tail_args(session_id, turns, user_id, write), read_only=True)

    async def atail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """Async :meth:`tail`."""
        return await self.arun(self._tail_args(session_id, turns, user_id, write), read_only=True)

    def _tail_args(
        self, session_id: str, turns: int, user_id: str | None, write: bool
    ) -> Plan[list[BaseMessage]]:
        """:meth:`tail`'s plan, its arguments checked."""
        return self._tail_plan(
            validate_id(session_id),
            check_int("turns", turns),
            validate_optional_id(user_id),
            write,
        )

    def get_messages(self, session_id: str, *, user_id: str | None = None) -> list[BaseMessage]:
        """Every archived message of a session, oldest first (``user_id``: as :meth:`tail`)."""
        plan = self._all_plan(validate_id(session_id), validate_optional_id(user_id))
        return self.run(plan, read_only=True)

    async def aget_messages(
        self, session_id: str, *, user_id: str | None = None
    ) -> list[BaseMessage]:
        """Async :meth:`get_messages`."""
        plan = self._all_plan(validate_id(session_id), validate_optional_id(user_id))
        return await self.arun(plan, read_only=True)

    def history(
        self,
        session_id: str,
        before_id: int | None = None,
        limit: int = 50,
        *,
        user_id: str | None = None,
    ) -> list[ArchivedMessage]:
        """One page of a session's archive, oldest first, for a front end or an audit.

        Args:
            session_id: The session to read.
            before_id: Only messages with a smaller id (pass the ``id`` of the first
                message of the previous page to go back in time).
            limit: At most this many messages: the newest ones before ``before_id``.
            user_id: The reading user, checked as in :meth:`check_owner`.

        Raises:
            TypeError: If ``before_id`` or ``limit`` is not an int.
            ValueError: If ``before_id`` is not in ``[1, 2**63 - 1]`` or ``limit`` not
                in ``[1, 10**9]``.

        """
        return self.run(
            self._history_plan(
                *validate_page(session_id, before_id, limit), validate_optional_id(user_id)
            )
        )

    async def ahistory(
        self,
        session_id: str,
        before_id: int | None = None,
        limit: int = 50,
        *,
        user_id: str | None = None,
    ) -> list[ArchivedMessage]:
        """Async :meth:`history`."""
        return await self.arun(
            self._history_plan(
                *validate_page(session_id, before_id, limit), validate_optional_id(user_id)
            )
        )

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions with their message counts and last activity, most recent first."""
        return self.run(self._sessions_plan(validate_optional_id(user_id)))

    async def asessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Async :meth:`sessions`."""
        return await self.arun(self._sessions_plan(validate_optional_id(user_id)))

    def _clear_plan(self, session_id: str, user_id: str | None, write: bool) -> Plan[int]:
        yield from self.owner_check_plan(session_id, user_id, write)
        return (yield from self._delete_plan(session_id, None))

    def clear(self, session_id: str, *, user_id: str | None = None, write: bool = False) -> int:
        """Delete a session's messages from the archive; returns how many.

        The session keeps its owner (its MEMORY.md and memories are kept too; use
        :meth:`forget` to remove everything). Without ``write``, ``user_id=None``
        is an administrator's and clears any session.

        Args:
            session_id: The session.
            user_id: The clearing user, checked as in :meth:`check_owner`.
            write: Check as for a write: ``user_id`` must be the owner exactly
                (``None`` then clears only a session without a user), as a
                history's ``clear`` asks.

        Raises:
            SessionOwnershipError: If ``user_id`` is given and the session is not
                theirs (with ``write``, also if it has a user while ``user_id`` is
                ``None``).
        """
        plan = self._clear_plan(validate_id(session_id), validate_optional_id(user_id), write)
        return self.run(plan, write=True)

    async def aclear(
        self, session_id: str, *, user_id: str | None = None, write: bool = False
    ) -> int:
        """Async :meth:`clear`."""
        plan = self._clear_plan(validate_id(session_id), validate_optional_id(user_id), write)
        return await self.arun(plan, write=True)

    def on_forget(self, hook: ForgetHook) -> None:
        """Register a cleanup for :meth:`forget` in this process only.

        A tier that keeps data in a store of its own uses :meth:`register_tier`
        instead, so that a forget run by any process reaches that store.
        """
        self._add_hook(hook, None, repr(getattr(hook, "__self__", hook)))

    def _add_hook(self, hook: ForgetHook, key: str | None, what: str) -> None:
        # Weakly, so a closed tier can be collected; its hook then falls away.
        ref = weakref.WeakMethod(hook) if inspect.ismethod(hook) else (lambda: hook)
        self._forget_hooks.append((ref, key, what))

    def register_tier(self, kind: str, locator: dict[str, Any] | None, hook: ForgetHook) -> None:
        """Record durably that a tier keeps data of this archive's sessions in a store.

        The record (in ``<name>_tiers``, written once per store) lets :meth:`forget`
        erase the store from any process, even one that never built the tier: it
        calls the eraser factory of ``kind`` (an entry point of
        :data:`ERASER_GROUP`, else one of :func:`register_eraser`) with ``locator``.
        In this process ``hook`` erases the store instead.

        Args:
            kind: The kind of store, which names its eraser (``"chroma"``).
            locator: JSON-able, process-independent place of the store (absolute
                paths, host and port, collection), without secrets; ``None`` when no
                other process can reach it (an in-memory client): ``hook`` only.
            hook: This tier's own eraser.

        Raises:
            ArchiveUnavailableError: If the record cannot be written.
        """
        if locator is None:
            self._add_hook(hook, None, repr(getattr(hook, "__self__", hook)))
            return
        record = TierRecord(kind, locator)
        self.run(self._record_tier_plan(record), write=True)
        self._add_hook(hook, record.key, str(record))

    def tiers(self) -> list[TierRecord]:
        """The stores that tiers recorded on this archive (see :meth:`register_tier`)."""
        return self.run(self._tiers_plan(), read_only=True)

    def drop_tier(self, record: TierRecord) -> bool:
        """Delete the record of a store that is gone for good (moved, decommissioned).

        :meth:`forget` then stops trying to erase it. A tier that opens the store
        again records it again. Returns whether a record was deleted.
        """
        tiers = self.tables.tiers

        def plan() -> Plan[bool]:
            result = yield delete(tiers).where(tiers.c.key == record.key)
            return bool(result.rowcount)

        return self.run(plan(), write=True)

    def pending_forgets(self) -> list[PendingForget]:
        """Forgets that could not erase every store yet, oldest first."""
        forgets = self.tables.forgets

        def plan() -> Plan[list[PendingForget]]:
            result = yield select(forgets).order_by(forgets.c.id)
            return [
                PendingForget(
                    session_id=row.session_id,
                    user_id=row.user_id,
                    session_ids=json.loads(row.session_ids),
                    unfinished=json.loads(row.unfinished),
                    created_at=row.created_at,
                )
                for row in result
            ]

        return self.run(plan(), read_only=True)

    def forget(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        keep_owner: bool = False,
    ) -> int:
        """Remove a session, a user, or one user's session from every tier.

        Jobs go first, so nothing new is derived. Then every store a tier keeps
        data in is erased: by the tier's own hook when it lives in this process,
        else by an eraser built from the tier's record in the archive (see
        :meth:`register_tier`), so an admin script that only opened the archive
        reaches Chroma and the MEMORY.md folders too. Then the memory catalog, the
        archived messages and the consolidated documents (MEMORY.md, HISTORY.md) of
        every session in scope: a session another user wrote to as well loses its
        summary, which holds the forgotten messages too, and is consolidated again
        from the messages left.

        Args:
            session_id: The session to remove.
            user_id: The user whose sessions (or whose part of ``session_id``) to remove.
            keep_owner: Keep ``session_id``'s owner: the session is emptied, not
                erased, and stays its user's (another user cannot take the id over).
                What a memory's ``clear`` asks; an erasure request leaves it ``False``.

        Returns:
            How many archived messages were removed.

        Raises:
            ForgetIncompleteError: If a store could not be erased (a server down,
                no eraser for a recorded kind). Everything else is removed and the
                forget is recorded; calling it again with the same scope finishes.
            ArchiveUnavailableError: If the archive cannot be reached.
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
        unfinished: list[str] = []
        failed: set[object] = set()  # stores that could not be erased: reported once

        def erase_recorded(record: TierRecord) -> None:
            _eraser(record)(sessions, session_id, user_id)

        def attempt(store: object, what: str, erase: Callable[[], None]) -> None:
            if store in failed:
                return
            try:
                erase()
            except Exception as exc:  # the others are still erased; this one is reported
                logger.warning("forget could not erase %s: %s", what, exc)
                failed.add(store)
                unfinished.append(f"{what}: {type(exc).__name__}: {exc}")

        def erase_stores() -> None:
            erased: set[str] = set()  # stores erased (or tried) by an in-process hook
            for ref, key, what in list(self._forget_hooks):
                hook = ref()
                if hook is None or (key is not None and key in erased):
                    continue
                if key is not None:
                    erased.add(key)
                attempt(key or ref, what, partial(hook, sessions, session_id, user_id))
            for record in self.tiers():
                if record.key not in erased:
                    attempt(record.key, str(record), partial(erase_recorded, record))

        erase_stores()
        finish = partial(
            self._finish_forget_plan, session_id, user_id, sessions, unfinished, keep_owner
        )
        removed = self.run(finish(), write=True)
        # A turn written and extracted while the stores were erased reached them
        # after that: its messages and catalog row went with the delete above, so
        # the stores are erased once more (a store never keeps what the catalog lost).
        left = len(unfinished)
        erase_stores()
        if len(unfinished) > left:
            self.run(finish(), write=True)  # records the forget, to be finished
        if unfinished:
            raise ForgetIncompleteError(session_id, user_id, sessions, unfinished)
        return removed

    def _stats_plan(self, session_id: str | None) -> Plan[ArchiveStats]:
        t = self.tables

        def scope(table: Any) -> list[Any]:
            return [] if session_id is None else [table.c.session_id == session_id]

        m = t.messages
        result = yield select(
            func.count(),
            func.count(func.distinct(m.c.session_id)),
            func.count(func.distinct(m.c.user_id)),
            func.min(m.c.created_at),
            func.max(m.c.created_at),
            func.max(m.c.user_id),
        ).where(*scope(m))
        messages, sessions, users, first_at, last_at, user_id = result.one()
        parts = select(func.count()).select_from(t.parts)
        if session_id is not None:
            parts = parts.where(t.parts.c.message_id.in_(select(m.c.id).where(*scope(m))))
        result = yield parts
        part_count = result.scalar_one()
        mem = t.memories
        result = yield (
            select(mem.c.kind, func.count(), func.max(mem.c.user_id))
            .where(*scope(mem))
            .group_by(mem.c.kind)
        )
        memories: dict[str, int] = {}
        for kind, count, memory_user in result:
            memories[kind] = int(count)
            user_id = user_id or memory_user
        j = t.jobs
        result = yield (
            select(
                j.c.kind,
                j.c.state,
                func.count(),
                func.coalesce(func.sum(j.c.attempts), 0),
                func.min(j.c.created_at),
            )
            .where(*scope(j))
            .group_by(j.c.kind, j.c.state)
            .order_by(j.c.kind, j.c.state)
        )
        jobs = tuple(
            JobCount(kind, state, int(n), int(tries), oldest)
            for kind, state, n, tries, oldest in result
        )
        result = yield select(func.count()).select_from(j).where(j.c.attempts > 0, *scope(j))
        retrying = result.scalar_one()
        result = (
            yield select(func.count()).select_from(t.consolidation).where(*scope(t.consolidation))
        )
        consolidated = result.scalar_one()
        h = t.history_log
        result = yield select(func.count(), func.coalesce(func.sum(h.c.raw), 0)).where(*scope(h))
        batches, raw_batches = result.one()
        table_bytes = None
        if session_id is None and self.dialect in ("mysql", "mariadb"):
            names = [table.name for table in self.metadata.sorted_tables]
            result = yield text(
                "SELECT COALESCE(SUM(data_length + index_length), 0) "
                "FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name IN :names"
            ).bindparams(bindparam("names", value=names, expanding=True))
            table_bytes = int(result.scalar() or 0)
        return ArchiveStats(
            messages=int(messages),
            sessions=int(sessions),
            users=int(users),
            first_at=first_at,
            last_at=last_at,
            user_id=user_id,
            parts=int(part_count),
            memories=memories,
            jobs=jobs,
            retrying=int(retrying),
            consolidated=int(consolidated),
            history_batches=int(batches),
            raw_batches=int(raw_batches),
            table_bytes=table_bytes,
        )

    def stats(self, session_id: str | None = None) -> ArchiveStats:
        """Counts of the archive and of the tiers' tables, for a report or a dashboard.

        Args:
            session_id: Count this session only; ``None`` counts everything.

        Returns:
            The counts; ``table_bytes`` only for the whole archive on MySQL.
        """
        plan = self._stats_plan(validate_optional_id(session_id, "session_id"))
        return self.run(plan, read_only=True)

    async def astats(self, session_id: str | None = None) -> ArchiveStats:
        """Async :meth:`stats`."""
        plan = self._stats_plan(validate_optional_id(session_id, "session_id"))
        return await self.arun(plan, read_only=True)

    def dispose(self) -> None:
        """Close the sync engine's pooled connections, and those of loops not running."""
        self._close_ended_loops(idle=True)
        self.engine.dispose()

    def shutdown(self) -> None:
        """Close the pooled connections (what leaving a ``with`` block does).

        The archive stays usable: a later call connects again.
        """
        self.dispose()

    async def ashutdown(self) -> None:
        """Close the running loop's async connections, then the sync ones."""
        await self.adispose()
        self.dispose()

    async def adispose(self) -> None:
        """Close the running loop's async engine and its pooled connections.

        Those of ended loops (see :meth:`async_engine`) are closed too.
        """
        self._close_ended_loops(wait=False)
        with self._async_lock:
            held = self._async_engines.pop(asyncio.get_running_loop(), None)
        if held is not None:
            held.unwatch()
            await held.engine.dispose()


@dataclass(frozen=True)
class JobCount:
    """Jobs of one kind in one state (see :meth:`MySQLBackup.stats`)."""

    kind: str
    state: str
    count: int
    attempts: int
    oldest: datetime | None


@dataclass(frozen=True)
class ArchiveStats:
    """What :meth:`MySQLBackup.stats` counts, for the whole archive or one session.

    Attributes:
        messages: Archived messages.
        sessions: Sessions with archived messages.
        users: Distinct users of those messages.
        first_at: The first message's time (naive UTC), ``None`` if there is none.
        last_at: The last message's time.
        user_id: A user of the scope's messages, else of its memories (for one
            session: its owner), ``None`` if none has one.
        parts: Stored pieces of large messages.
        memories: Long-term memories in the catalog, by kind.
        jobs: The job queue by kind and state.
        retrying: Jobs that failed at least once.
        consolidated: Sessions with a MEMORY.md.
        history_batches: HISTORY.md batches.
        raw_batches: Those of them archived raw (the LLM failed).
        table_bytes: Data and indexes of the archive's tables where the database
            reports it (MySQL, whole archive), else ``None``.
    """

    messages: int
    sessions: int
    users: int
    first_at: datetime | None
    last_at: datetime | None
    user_id: str | None
    parts: int
    memories: dict[str, int]
    jobs: tuple[JobCount, ...]
    retrying: int
    consolidated: int
    history_batches: int
    raw_batches: int
    table_bytes: int | None

    @property
    def memory_count(self) -> int:
        """Long-term memories of every kind."""
        return sum(self.memories.values())

    @property
    def queue_depth(self) -> int:
        """Jobs not finished."""
        return sum(job.count for job in self.jobs if job.state != "done")


# -- helpers ------------------------------------------------------------------


#: MySQL/MariaDB errors after which the server has rolled the transaction back (or
#: only its statement, which the driver's rollback completes) and running it again
#: may succeed: 1213 a deadlock ("try restarting transaction"), 1205 a lock wait
#: timeout.
RERUNNABLE_ERRORS = frozenset({1205, 1213})
#: Seconds before each rerun of a transaction that failed with one of
#: :data:`RERUNNABLE_ERRORS` (each scaled by a random 0.5-1.5, so that the
#: transactions that deadlocked do not meet again in step).
RERUN_DELAYS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)


def _fresh(plan: Plan[T] | Callable[[], Plan[T]]) -> Plan[T]:
    """The plan to run: ``plan``, or a new one made by it."""
    return plan() if callable(plan) else plan


def _rerun_delay(
    plan: Plan[T] | Callable[[], Plan[T]], exc: BaseException, attempt: int
) -> float | None:
    """Seconds to wait before running ``plan`` again after ``exc``; ``None``: do not.

    Only a plan given as a function can run again (a generator is spent), and only
    after an error of :data:`RERUNNABLE_ERRORS`, at most ``len(RERUN_DELAYS)`` times.
    """
    error = getattr(exc, "orig", None) or exc
    code = error.args[0] if getattr(error, "args", None) else None
    if not callable(plan) or code not in RERUNNABLE_ERRORS or attempt >= len(RERUN_DELAYS):
        return None
    logger.debug("rerunning a transaction after error %s (attempt %d)", code, attempt + 1)
    return RERUN_DELAYS[attempt] * random.uniform(0.5, 1.5)


def _database_errors(engine: Engine) -> tuple[type[BaseException], ...]:
    """What a lost or failing database raises through ``engine``.

    SQLAlchemy wraps the driver's errors, except where it calls the driver directly
    (setting the isolation level of a pooled connection): the driver's own ``Error``
    then comes through unwrapped (PyMySQL's "Lost connection" after a server crash).
    """
    error = getattr(getattr(engine.dialect, "loaded_dbapi", None), "Error", None)
    if isinstance(error, type) and issubclass(error, BaseException):
        return (SQLAlchemyError, error)
    return (SQLAlchemyError,)


def _eraser(record: TierRecord) -> ForgetHook:
    factory = find_eraser(record.kind)
    if factory is None:
        msg = (
            f"no eraser is installed for tier kind {record.kind!r} (entry point group "
            f"{ERASER_GROUP!r})"
        )
        raise LookupError(msg)
    return factory(record.locator)


def planners_of(jobs: Sequence[str | EnqueuePlanner]) -> list[EnqueuePlanner]:
    """The planners of ``add_messages(jobs=...)``: a job kind becomes :class:`TurnJobs`.

    Raises:
        TypeError: If an element is neither a str nor an ``EnqueuePlanner``.
    """
    planners: list[EnqueuePlanner] = []
    for job in jobs:
        if isinstance(job, str):
            planners.append(TurnJobs(job))
        elif isinstance(job, EnqueuePlanner):
            planners.append(job)
        else:
            msg = f"jobs must hold job kinds or enqueue planners, got {type(job).__name__}"
            raise TypeError(msg)
    return planners


def scope_conditions(table: Any, session_id: str | None, user_id: str | None) -> list[Any]:
    """WHERE conditions selecting a session, a user, or one user's session."""
    conditions = []
    if session_id is not None:
        conditions.append(table.c.session_id == session_id)
    if user_id is not None:
        conditions.append(table.c.user_id == user_id)
    return conditions


def validate_table_name(table_name: Any) -> str:
    """``table_name`` if every table and index name derived from it is valid on MySQL.

    Raises:
        TypeError: If it is not a str.
        ValueError: If it is not letters, digits and underscores (not starting with
            a digit), or longer than :func:`max_table_name_length`.
    """
    if not isinstance(table_name, str):
        msg = f"table_name must be a str, got {type(table_name).__name__}"
        raise TypeError(msg)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table_name):
        msg = f"table_name {table_name[:80]!r} must be letters, digits and underscores"
        raise ValueError(msg)
    limit = max_table_name_length()
    if len(table_name) > limit:
        msg = (
            f"table_name is {len(table_name)} characters long; the limit is {limit}, so that "
            "the names derived from it fit MySQL's 64 characters"
        )
        raise ValueError(msg)
    return table_name


def render_url(url: str | URL) -> str:
    """``url`` for display: its password and password-like query parameters as ``***``.

    Used wherever an archive is named: ``repr``, ``ArchiveUnavailableError``, the CLI.
    """
    try:
        parsed = make_url(url)
        shown = parsed.set(query={}).render_as_string(hide_password=True)
        pairs = [
            f"{quote_plus(key)}={'***' if _SECRET_PARAM.search(key) else quote_plus(item)}"
            for key, value in parsed.query.items()
            for item in ((value,) if isinstance(value, str) else value)
        ]
    except (ValueError, TypeError, ArgumentError):  # its text might hold a password
        return "<an unparsable URL>"
    return f"{shown}?{'&'.join(pairs)}" if pairs else shown


def _password_in_userinfo(url: URL) -> URL:
    """Move a MySQL ``?password=``/``?passwd=`` into the URL's password field.

    Both drivers also take the password from the query string, where SQLAlchemy
    does not hide it (``repr(engine)``, logs); as the password field it is hidden
    everywhere. ``password`` wins over ``passwd``, as in PyMySQL.

    Raises:
        ValueError: If the password is not Latin-1 text: both drivers send it so,
            and their own error would quote the offending character.
    """
    if url.get_backend_name() not in ("mysql", "mariadb"):
        return url
    moved = url
    for key in ("passwd", "password"):
        value = url.query.get(key)
        if isinstance(value, str) and value:
            moved = moved.set(password=value).difference_update_query([key])
    try:
        (moved.password or "").encode("latin-1")
    except UnicodeEncodeError:
        msg = "the MySQL password must be Latin-1 text (PyMySQL and aiomysql send it so)"
        raise ValueError(msg) from None
    return moved


def _engine_defaults(
    url: URL,
    extra: dict[str, Any] | None = None,
    *,
    asynchronous: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() in ("mysql", "mariadb"):
        # Reconnect transparently after a server restart or an idle timeout, and
        # never wait forever on a server that stopped answering: PyMySQL has no
        # socket timeout by default, aiomysql only a connect timeout (arun puts
        # the whole async call under the deadline).
        kwargs.update(pool_pre_ping=True, pool_recycle=3600)
        if asynchronous:
            kwargs["pool_timeout"] = timeout
            connect_args["connect_timeout"] = timeout
        else:
            # A silent server costs a sync call two waits at most (the pooled
            # connection's ping, then one reconnect): half the timeout each.
            wait = timeout / 2
            kwargs["pool_timeout"] = wait
            connect_args.update(connect_timeout=wait, read_timeout=wait, write_timeout=wait)
    if url.get_backend_name() == "sqlite":
        connect_args["timeout"] = timeout
        if asynchronous:
            # aiosqlite uses a connection in its thread only; a connection whose
            # thread died with its loop is closed from another (_LoopEngine.aclose).
            connect_args["check_same_thread"] = False
        elif in_memory(url):
            # One database for every thread (SQLAlchemy's default gives each thread
            # its own, empty one); MySQLBackup runs one plan at a time on it.
            kwargs["poolclass"] = StaticPool
            connect_args["check_same_thread"] = False
    extra = dict(extra or {})
    connect_args.update(extra.pop("connect_args", None) or {})
    kwargs.update(extra)
    if connect_args:
        kwargs["connect_args"] = connect_args
    return kwargs


def in_memory(url: URL) -> bool:
    """Whether ``url`` is an in-memory SQLite database.

    ``sqlite://``, ``:memory:``, and with ``uri=true`` the URI forms
    ``file::memory:`` and ``file:name?mode=memory`` (without it, pysqlite opens
    a file of that name).
    """
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    if database in ("", ":memory:"):
        return True
    return (
        url.query.get("uri") == "true"
        and database.startswith("file:")
        and (database.startswith("file::memory:") or url.query.get("mode") == "memory")
    )


def _async_url(url: URL) -> URL:
    backend = url.get_backend_name()
    driver = _ASYNC_DRIVERS.get(backend)
    if driver is None:
        msg = f"no async driver is known for {backend!r}; use the sync methods"
        raise NotImplementedError(msg)
    if in_memory(url):
        msg = "an in-memory SQLite archive cannot be shared with async methods; use a file"
        raise ValueError(msg)
    return url.set(drivername=f"{backend}+{driver}")


_CONFIGURED: weakref.WeakSet[Engine] = weakref.WeakSet()
_CONFIGURED_LOCK = threading.Lock()


def _configure_sqlite(engine: Engine, timeout: float = DEFAULT_TIMEOUT) -> None:
    """WAL for concurrent readers; FULL sync so an acknowledged write survives.

    We emit BEGIN ourselves (SQLAlchemy's documented recipe) so that writers can
    take the write lock up front with BEGIN IMMEDIATE and never fail on a stale
    read snapshot. Once per engine: two archives on one ``Engine`` must not
    emit BEGIN twice.
    """
    with _CONFIGURED_LOCK:
        if engine in _CONFIGURED:
            return
        _CONFIGURED.add(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        statement = conn.get_execution_options().get("sqlite_begin", "BEGIN")
        conn.exec_driver_sql(statement)


_default_lock = threading.Lock()
_default_backups: dict[str, MySQLBackup] = {}


def default_backup() -> MySQLBackup:
    """The archive of :func:`default_url`, one per URL (an embedded one per folder)."""
    key = os.environ.get("TIERED_MEMORY_URL") or str(default_home().resolve())
    with _default_lock:
        backup = _default_backups.get(key)
        if backup is None:
            backup = _default_backups[key] = MySQLBackup()
        return backup
