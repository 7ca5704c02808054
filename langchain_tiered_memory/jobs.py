"""The durable job queue that lives beside the archive.

A job row is written in the same transaction as the messages it is about, so a
crash can never lose it. Workers in any number of processes claim jobs under a
lease; a session's jobs run in order, one at a time; a job that fails waits with
exponential backoff. Finished jobs are deleted, so the table stays small.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, and_, delete, exists, func, insert, or_, select, update

if TYPE_CHECKING:
    from langchain_tiered_memory.archive import MySQLBackup, Plan

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class Job:
    """A claimed job."""

    id: int
    kind: str
    session_id: str
    user_id: str | None
    last_message_id: int
    attempts: int


def enqueue_statement(
    jobs: Table,
    kind: str,
    session_id: str,
    user_id: str | None,
    last_message_id: int,
    now: datetime,
) -> Any:
    """The INSERT that queues one job (run inside the archive's write transaction)."""
    return insert(jobs).values(
        kind=kind,
        session_id=session_id,
        user_id=user_id,
        last_message_id=last_message_id,
        state="pending",
        attempts=0,
        not_before=now,
        created_at=now,
    )


def new_worker_id() -> str:
    """``host:pid:random``: unique, and tells which process holds a lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobQueue:
    """Claims, completes and retries the archive's jobs.

    Args:
        backup: The archive whose ``<name>_jobs`` table holds the queue.
        kinds: The job kinds this queue hands out.
        lease_seconds: How long a claim lasts before another worker may take over.
    """

    def __init__(
        self, backup: MySQLBackup, kinds: Sequence[str], *, lease_seconds: float = 300.0
    ) -> None:
        self.backup = backup
        self.kinds = tuple(kinds)
        self.lease = timedelta(seconds=lease_seconds)
        self.worker_id = new_worker_id()
        self.jobs = backup.tables.jobs

    # -- plans ----------------------------------------------------------------

    def _claim_plan(self, limit: int) -> Plan[list[Job]]:
        from langchain_tiered_memory.archive import utcnow

        j, locks = self.jobs, self.backup.tables.locks
        now = utcnow()
        # One claimer at a time across processes: claims are short, and this keeps
        # the per-session order exact without relying on SKIP LOCKED semantics.
        yield select(locks.c.name).where(locks.c.name == "claim").with_for_update()
        earlier = j.alias("earlier")
        claimable = or_(
            and_(j.c.state == "pending", j.c.not_before <= now),
            and_(j.c.state == "running", j.c.lease_until < now),
        )
        blocked = exists().where(
            earlier.c.session_id == j.c.session_id,
            earlier.c.id < j.c.id,
            or_(
                and_(earlier.c.state == "running", earlier.c.lease_until >= now),
                and_(earlier.c.state == "pending", earlier.c.not_before > now),
            ),
        )
        result = yield (
            select(j)
            .where(j.c.kind.in_(self.kinds), claimable, ~blocked)
            .order_by(j.c.id)
            .limit(limit)
        )
        rows = result.all()
        if not rows:
            return []
        yield (
            update(j)
            .where(j.c.id.in_([row.id for row in rows]))
            .values(state="running", worker=self.worker_id, lease_until=now + self.lease)
        )
        return [
            Job(
                id=row.id,
                kind=row.kind,
                session_id=row.session_id,
                user_id=row.user_id,
                last_message_id=row.last_message_id,
                attempts=row.attempts,
            )
            for row in rows
        ]

    def _done_plan(self, job_ids: Sequence[int]) -> Plan[None]:
        yield delete(self.jobs).where(self.jobs.c.id.in_(list(job_ids)))

    def _release_plan(self, job_ids: Sequence[int]) -> Plan[None]:
        yield (
            update(self.jobs)
            .where(self.jobs.c.id.in_(list(job_ids)), self.jobs.c.worker == self.worker_id)
            .values(state="pending", worker=None, lease_until=None)
        )

    def _retry_plan(self, job: Job, error: str, delay: float) -> Plan[None]:
        from langchain_tiered_memory.archive import utcnow

        yield (
            update(self.jobs)
            .where(self.jobs.c.id == job.id)
            .values(
                state="pending",
                attempts=self.jobs.c.attempts + 1,
                not_before=utcnow() + timedelta(seconds=delay),
                worker=None,
                lease_until=None,
                last_error=error[:MAX_ERROR_CHARS],
            )
        )

    def _reclaim_plan(self) -> Plan[int]:
        """Hand back the jobs of dead processes on this host, without waiting out the lease."""
        j = self.jobs
        host = socket.gethostname()
        result = yield select(j.c.worker).where(j.c.state == "running").distinct()
        dead = []
        for (worker,) in result.all():
            name, _, rest = (worker or "").partition(":")
            pid = rest.partition(":")[0]
            if name == host and pid.isdigit() and not _pid_alive(int(pid)):
                dead.append(worker)
        if not dead:
            return 0
        done = yield (
            update(j)
            .where(j.c.state == "running", j.c.worker.in_(dead))
            .values(state="pending", worker=None, lease_until=None)
        )
        return int(done.rowcount)

    def _depth_plan(self) -> Plan[int]:
        result = (
            yield select(func.count())
            .select_from(self.jobs)
            .where(self.jobs.c.kind.in_(self.kinds))
        )
        return int(result.scalar_one())

    # -- sync API -------------------------------------------------------------

    def claim(self, limit: int = 64) -> list[Job]:
        """Claim up to ``limit`` jobs, oldest first, at most the runnable ones per session."""
        return self.backup.run(self._claim_plan(limit), write=True)

    def done(self, job_ids: Sequence[int]) -> None:
        """Delete finished jobs."""
        if job_ids:
            self.backup.run(self._done_plan(job_ids), write=True)

    def release(self, job_ids: Sequence[int]) -> None:
        """Give claimed jobs back untouched (they run later, in order)."""
        if job_ids:
            self.backup.run(self._release_plan(job_ids), write=True)

    def retry(self, job: Job, error: str, delay: float) -> None:
        """Count a failed attempt and make the job wait ``delay`` seconds."""
        self.backup.run(self._retry_plan(job, error, delay), write=True)

    def reclaim_dead(self) -> int:
        """Re-drive jobs whose worker process on this host has died."""
        return self.backup.run(self._reclaim_plan(), write=True)

    def depth(self) -> int:
        """How many jobs of this queue's kinds are not finished."""
        return self.backup.run(self._depth_plan())
