"""What every storage module shares: plans, the clock, and the seams to the tiers.

A plan is a generator that yields SQLAlchemy statements and receives their
results; a sync or an async driver runs it inside one transaction, so the sync and
async methods of the archive and the job queue share all of their logic.

The seams: :class:`Archive` is what the history and the entry points need of an
archive (both :class:`~langchain_tiered_memory.MySQLBackup` and
:class:`~langchain_tiered_memory.SessionFileArchive` implement it);
:class:`EnqueuePlanner` is what a tier declares it queues on a write, so the
archive runs the tiers' plans in its write transaction without naming any tier.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from langchain_core.messages import BaseMessage
from sqlalchemy.sql import Executable

from langchain_tiered_memory.core.turns import roles_of

if TYPE_CHECKING:
    from langchain_tiered_memory.storage.schema import Tables

T = TypeVar("T")

Plan = Generator[Executable, Any, T]

#: The largest statement a server is sure to take: MariaDB's default
#: ``max_allowed_packet`` (MySQL 8's is 64 MiB). Writes size their statements from it:
#: a larger one fails as if the server had gone away.
MAX_PACKET_BYTES = 16 * 1024 * 1024


def utcnow() -> datetime:
    """Naive UTC now, as stored in the archive's timestamp columns."""
    return datetime.now(UTC).replace(tzinfo=None)


class UndeclaredWriteError(RuntimeError):
    """A plan wrote after reading without being run with ``write=True``.

    SQLite cannot turn a read transaction into a write one when another
    connection wrote meanwhile ("database is locked", at once, with no wait);
    MySQL would write on a stale read. Such a plan must declare itself a writer.
    """


class _Declared:
    """Refuses a write that follows a read in a transaction not declared a writer."""

    def __init__(self, write: bool) -> None:
        self.write = write
        self.read = False

    def __call__(self, statement: Executable) -> Executable:
        if not self.write:
            if getattr(statement, "is_dml", False) and self.read:
                msg = f"the plan wrote after reading; run it with write=True: {statement}"
                raise UndeclaredWriteError(msg)
            self.read = self.read or bool(getattr(statement, "is_select", False))
        return statement


def drive(plan: Plan[T], execute: Callable[[Executable], Any], *, write: bool = True) -> T:
    """Run ``plan`` to its end, sending each statement to ``execute``.

    Args:
        plan: The plan.
        execute: Runs one statement and returns its result.
        write: The transaction was opened as a writer; if not, a write after a
            read raises :class:`UndeclaredWriteError`.
    """
    check = _Declared(write)
    try:
        statement = next(plan)
        while True:
            statement = plan.send(execute(check(statement)))
    except StopIteration as stop:
        return stop.value


async def adrive(plan: Plan[T], conn: Any, *, write: bool = True) -> T:
    """Run ``plan`` to its end on an async connection (see :func:`drive`)."""
    check = _Declared(write)
    try:
        statement = next(plan)
        while True:
            statement = plan.send(await conn.execute(check(statement)))
    except StopIteration as stop:
        return stop.value


class PlanRunner(Protocol):
    """What the job queue needs of a database: its tables and a plan driver."""

    @property
    def tables(self) -> Tables:
        """The database's tables."""
        ...

    def run(
        self,
        plan: Plan[T] | Callable[[], Plan[T]],
        *,
        write: bool = False,
        read_only: bool = False,
    ) -> T:
        """Run ``plan`` (or the plan a function makes) in one transaction; its result."""
        ...


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


@dataclass(frozen=True)
class WrittenBatch:
    """A batch of messages the archive has just inserted, still inside its transaction.

    What an :class:`EnqueuePlanner` is given to decide which jobs to queue.

    Attributes:
        tables: The archive's tables (the job queue among them).
        session_id: The session written to.
        user_id: The session's owner (``None``: no user).
        messages: The batch, in order.
        ids: The archive ids of ``messages``, in order.
        now: The write's timestamp (naive UTC).
    """

    tables: Tables
    session_id: str
    user_id: str | None
    messages: Sequence[BaseMessage]
    ids: Sequence[int]
    now: datetime

    @cached_property
    def roles(self) -> list[str]:
        """The role of each message (:func:`~langchain_tiered_memory.core.turns.role_of`)."""
        return roles_of(self.messages)


@runtime_checkable
class EnqueuePlanner(Protocol):
    """A tier's declaration of the jobs a write queues for it.

    The archive runs :meth:`enqueue_plan` inside the transaction that inserts the
    messages, so a job can never be lost while its messages are kept.
    """

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[Any]:
        """The statements that queue this tier's jobs for ``batch``."""
        ...


@runtime_checkable
class Archive(Protocol):
    """What a chat history and the entry points need of an archive.

    Sessions belong to the user of their first write; every method taking a
    ``user_id`` refuses another user's session with ``SessionOwnershipError``.
    The background tiers need more than this (a job queue, plans, forget
    registration): they take a :class:`~langchain_tiered_memory.MySQLBackup`.
    """

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """Store a batch durably and queue ``jobs``' work with it; returns its ids."""
        ...

    async def aadd_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """Async :meth:`add_messages`."""
        ...

    def tail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns, oldest first.

        With ``write``, ``user_id`` is checked as for a write (``None`` reads only a
        session without a user): for a window that goes into a prompt.
        """
        ...

    async def atail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """Async :meth:`tail`."""
        ...

    def get_messages(self, session_id: str, *, user_id: str | None = None) -> list[BaseMessage]:
        """Every message of a session, oldest first."""
        ...

    async def aget_messages(
        self, session_id: str, *, user_id: str | None = None
    ) -> list[BaseMessage]:
        """Async :meth:`get_messages`."""
        ...

    def check_owner(self, session_id: str, user_id: str | None, *, write: bool = False) -> None:
        """Raise ``SessionOwnershipError`` if the session is not ``user_id``'s."""
        ...

    async def acheck_owner(
        self, session_id: str, user_id: str | None, *, write: bool = False
    ) -> None:
        """Async :meth:`check_owner`."""
        ...

    def history(
        self,
        session_id: str,
        before_id: int | None = None,
        limit: int = 50,
        *,
        user_id: str | None = None,
    ) -> list[ArchivedMessage]:
        """One page of a session, oldest first, with the archive's bookkeeping."""
        ...

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions, most recently active first."""
        ...

    def clear(self, session_id: str, *, user_id: str | None = None, write: bool = False) -> int:
        """Delete a session's messages (it keeps its owner); returns how many.

        ``write`` checks ``user_id`` as :meth:`check_owner` does for a write.
        """
        ...

    async def aclear(
        self, session_id: str, *, user_id: str | None = None, write: bool = False
    ) -> int:
        """Async :meth:`clear`."""
        ...

    def forget(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        keep_owner: bool = False,
    ) -> int:
        """Remove a session, a user, or one user's session; returns how many messages.

        With ``keep_owner``, ``session_id`` keeps its owner (emptied, not erased).
        """
        ...


class InlineAsyncArchive:
    """The async twins of an archive whose sync methods do only local work.

    Each runs its sync method inline: a local file write is not worth a thread
    hop. Mixed into an implementation of the rest of :class:`Archive`.
    """

    @property
    def _archive(self) -> Archive:
        # The class this is mixed into implements the sync side of the protocol.
        return cast("Archive", self)

    async def acheck_owner(
        self, session_id: str, user_id: str | None, *, write: bool = False
    ) -> None:
        """:meth:`check_owner`."""
        self._archive.check_owner(session_id, user_id, write=write)

    async def aadd_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """:meth:`add_messages`."""
        return self._archive.add_messages(session_id, messages, user_id=user_id, jobs=jobs)

    async def aget_messages(
        self, session_id: str, *, user_id: str | None = None
    ) -> list[BaseMessage]:
        """:meth:`get_messages`."""
        return self._archive.get_messages(session_id, user_id=user_id)

    async def atail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """:meth:`tail`."""
        return self._archive.tail(session_id, turns, user_id=user_id, write=write)

    async def aclear(
        self, session_id: str, *, user_id: str | None = None, write: bool = False
    ) -> int:
        """:meth:`clear`."""
        return self._archive.clear(session_id, user_id=user_id, write=write)
