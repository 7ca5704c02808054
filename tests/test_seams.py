"""The declared seams: the archive protocol, and the jobs a tier plans on a write."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import select

from langchain_tiered_memory import MySQLBackup, SessionFileArchive, TieredChatMessageHistory
from langchain_tiered_memory.storage.base import Archive, EnqueuePlanner, Plan, WrittenBatch
from langchain_tiered_memory.storage.jobs import TurnJobs, enqueue_statement
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

PROTOCOL_METHODS = sorted(
    name for name, value in vars(Archive).items() if callable(value) and not name.startswith("_")
)


def test_the_protocol_lists_what_the_history_uses() -> None:
    assert {"add_messages", "aadd_messages", "tail", "atail", "check_owner", "clear"} <= set(
        PROTOCOL_METHODS
    )


@pytest.mark.parametrize("make", [MySQLBackup, SessionFileArchive], ids=lambda make: make.__name__)
def test_both_archives_implement_the_protocol(make: Callable[[str], Any], tmp_path: Path) -> None:
    where = f"sqlite:///{tmp_path / 'a.sqlite3'}" if make is MySQLBackup else str(tmp_path)
    archive = make(where)
    assert isinstance(archive, Archive)
    for name in PROTOCOL_METHODS:
        declared = inspect.signature(getattr(Archive, name))
        implemented = inspect.signature(getattr(type(archive), name))
        assert list(implemented.parameters.values()) == list(declared.parameters.values()), name
        assert inspect.iscoroutinefunction(
            getattr(type(archive), name)
        ) == inspect.iscoroutinefunction(getattr(Archive, name)), name


def test_the_tiers_are_enqueue_planners() -> None:
    for tier in (ChromaLongMemory, MemoryConsolidator, TurnJobs):
        assert callable(getattr(tier, "enqueue_plan", None)), tier
    assert isinstance(TurnJobs("any"), EnqueuePlanner)


def _jobs(backup: MySQLBackup) -> list[tuple[str, int, str]]:
    j = backup.tables.jobs

    def plan() -> Plan[list[tuple[str, int, str]]]:
        result = yield select(j.c.kind, j.c.last_message_id, j.c.state).order_by(j.c.id)
        return [tuple(row) for row in result]

    return backup.run(plan())


class Audit:
    """A tier the archive has never heard of: one ``audit`` job per write."""

    def __init__(self, backup: MySQLBackup | None = None) -> None:
        self.backup = backup
        self.batches: list[WrittenBatch] = []
        self.notified = 0

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[None]:
        self.batches.append(batch)
        yield enqueue_statement(
            batch.tables.jobs, "audit", batch.session_id, batch.user_id, batch.ids[-1], batch.now
        )

    def notify(self) -> None:
        self.notified += 1


def test_a_tier_of_its_own_plans_its_jobs(backup: MySQLBackup) -> None:
    ids = backup.add_messages("s", [HumanMessage("q")], jobs=[Audit(), "kind"])
    assert _jobs(backup) == [("audit", ids[-1], "pending"), ("kind", ids[-1], "pending")]
    audit = Audit()
    backup.add_messages("s", [HumanMessage("q2"), AIMessage("a2")], user_id=None, jobs=[audit])
    [batch] = audit.batches
    assert batch.roles == ["human", "ai"]
    assert batch.session_id == "s" and batch.user_id is None and len(batch.ids) == 2


def test_a_history_passes_its_tiers_and_wakes_them(backup: MySQLBackup) -> None:
    audit = Audit(backup)
    history = TieredChatMessageHistory("h", backup=backup, long_memory=audit)  # type: ignore[arg-type]
    history.add_messages([HumanMessage("q"), AIMessage("a")])
    assert [row[0] for row in _jobs(backup)] == ["audit"]
    assert audit.notified == 1


class Failing:
    """A planner whose plan fails after queueing a job."""

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[None]:
        yield enqueue_statement(
            batch.tables.jobs, "doomed", batch.session_id, None, batch.ids[-1], batch.now
        )
        raise RuntimeError("planner failed")


def test_jobs_and_messages_share_one_transaction(backup: MySQLBackup) -> None:
    with pytest.raises(RuntimeError, match="planner failed"):
        backup.add_messages("t", [HumanMessage("lost")], jobs=["extract", Failing()])
    assert backup.get_messages("t") == []
    assert _jobs(backup) == []


def test_jobs_must_be_kinds_or_planners(backup: MySQLBackup) -> None:
    with pytest.raises(TypeError, match="jobs must hold"):
        backup.add_messages("t", [HumanMessage("q")], jobs=[object()])  # type: ignore[list-item]
    assert backup.get_messages("t") == []
