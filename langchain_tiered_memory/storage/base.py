"""What every storage module shares: plans, the clock, and the runner protocol.

A plan is a generator that yields SQLAlchemy statements and receives their
results; a sync or an async driver runs it inside one transaction, so the sync and
async methods of the archive and the job queue share all of their logic.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.sql import Executable

if TYPE_CHECKING:
    from langchain_tiered_memory.storage.schema import Tables

T = TypeVar("T")

Plan = Generator[Executable, Any, T]


def utcnow() -> datetime:
    """Naive UTC now, as stored in the archive's timestamp columns."""
    return datetime.now(UTC).replace(tzinfo=None)


def drive(plan: Plan[T], execute: Callable[[Executable], Any]) -> T:
    """Run ``plan`` to its end, sending each statement to ``execute``."""
    try:
        statement = next(plan)
        while True:
            statement = plan.send(execute(statement))
    except StopIteration as stop:
        return stop.value


async def adrive(plan: Plan[T], conn: Any) -> T:
    """Run ``plan`` to its end on an async connection."""
    try:
        statement = next(plan)
        while True:
            statement = plan.send(await conn.execute(statement))
    except StopIteration as stop:
        return stop.value


class PlanRunner(Protocol):
    """What the job queue needs of a database: its tables and a plan driver."""

    @property
    def tables(self) -> Tables:
        """The database's tables."""
        ...

    def run(self, plan: Plan[T], *, write: bool = False, read_only: bool = False) -> T:
        """Run ``plan`` in one transaction and return its result."""
        ...
