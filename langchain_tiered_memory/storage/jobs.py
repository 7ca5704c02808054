"""The durable job queue that lives beside the archive.

A job row is written in the same transaction as the messages it is about, so a
crash can never lose it. Workers in any number of processes claim jobs under a
lease; a session's jobs run in order, one at a time; a job that fails waits with
exponential backoff. Finished jobs are deleted, so the table stays small.

Leases cannot expire under a live worker: :class:`QueueWorker` renews the leases
of the batch it is running every third of a lease. Should a worker stall past
its lease anyway (a frozen process, a database outage longer than the lease),
another one may claim the job again; each claim writes a new random
``lease_token`` into the row, and every statement that finishes a job (a tier's
commit, :meth:`JobQueue.done`, ``retry``, ``release``) matches that token
(:func:`held_by`), so the stale runner's commit changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.messages import BaseMessage
from sqlalchemy import Table, and_, delete, exists, false, func, insert, or_, select, update

from langchain_tiered_memory.core.lifecycle import (
    DRAIN_TIMEOUT,
    Lifecycle,
    drain_at_exit,
    forget_at_exit,
)
from langchain_tiered_memory.core.turns import role_of, tool_calls_of, turn_ends, turn_starts
from langchain_tiered_memory.core.validation import check_int, check_seconds
from langchain_tiered_memory.storage.base import Plan, PlanRunner, WrittenBatch, utcnow

if TYPE_CHECKING:
    from langchain_tiered_memory.storage.schema import Tables

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000
#: A failed job never waits longer than a day between attempts.
MAX_BACKOFF = 24 * 3600.0
#: The state of a job that waits for its turn to finish (an answer that may still
#: come): it is neither claimed nor holds up its session's later jobs until it is
#: due (``not_before``) or made runnable by :meth:`JobQueue.make_ready`.
DELAYED = "delayed"
#: Messages looked at to tell whether a batch continues the turn a delayed job waits on.
SETTLE_SCAN = 500
T = TypeVar("T")


def backoff(base: float, attempts: int) -> float:
    """``base`` doubled per earlier attempt, at most :data:`MAX_BACKOFF` seconds."""
    return min(base * 2 ** min(attempts, 40), MAX_BACKOFF)


@dataclass(frozen=True)
class Job:
    """A claimed job."""

    id: int
    kind: str
    session_id: str
    user_id: str | None
    last_message_id: int
    attempts: int
    #: The claim's lease token: the job is still this claim's while its row holds it.
    token: str = ""


def held_by(jobs: Table, claimed: Sequence[Job]) -> Any:
    """WHERE clause: the rows of ``claimed`` that still carry their claim's token.

    A tier's commit deletes its jobs with it, so a runner whose lease was taken
    over (or whose jobs were forgotten) commits nothing.
    """
    by_token: dict[str, list[int]] = {}
    for job in claimed:
        by_token.setdefault(job.token, []).append(job.id)
    return or_(
        false(),
        *(and_(jobs.c.id.in_(ids), jobs.c.lease_token == token) for token, ids in by_token.items()),
    )


def enqueue_statement(
    jobs: Table,
    kind: str,
    session_id: str,
    user_id: str | None,
    last_message_id: int,
    now: datetime,
    delay: float = 0.0,
) -> Any:
    """The INSERT that queues one job (run inside the archive's write transaction).

    With a ``delay`` the job is :data:`DELAYED`: it runs ``delay`` seconds from
    ``now`` unless something makes it runnable (or replaces it) earlier.
    """
    return insert(jobs).values(
        kind=kind,
        session_id=session_id,
        user_id=user_id,
        last_message_id=last_message_id,
        state=DELAYED if delay > 0 else "pending",
        attempts=0,
        not_before=now + timedelta(seconds=delay) if delay > 0 else now,
        created_at=now,
    )


def backlog_enqueue_plan(
    tables: Tables,
    kind: str,
    session_id: str,
    user_id: str | None,
    last_message_id: int,
    threshold: int,
    now: datetime,
) -> Plan[bool]:
    """Queue a ``kind`` job when a session's backlog passes ``threshold`` messages.

    The backlog is what lies past the session's consolidation cursor; nothing is
    queued while such a job is still pending. A running one does not count: its
    commit may not see a write that races with it, so that write queues the next
    job (per-session order runs it after; it finds nothing to do if the backlog
    has shrunk).
    """
    m, c, j = tables.messages, tables.consolidation, tables.jobs
    cursor = yield select(c.c.cursor).where(c.c.session_id == session_id)
    after = cursor.scalar() or 0
    backlog = yield select(func.count()).select_from(
        select(m.c.id)
        .where(m.c.session_id == session_id, m.c.id > after)
        .limit(threshold + 1)
        .subquery()
    )
    if backlog.scalar_one() <= threshold:
        return False
    waiting = (
        yield select(j.c.id)
        .where(j.c.session_id == session_id, j.c.kind == kind, j.c.state == "pending")
        .limit(1)
    )
    if waiting.first() is not None:
        return False
    yield enqueue_statement(j, kind, session_id, user_id, last_message_id, now)
    return True


def answered(message: BaseMessage) -> bool:
    """Whether a turn ending with ``message`` is finished: an AI answer without tool calls.

    Invalid tool calls count (:func:`~langchain_tiered_memory.core.turns.tool_calls_of`):
    their results and the real answer follow.
    """
    return role_of(message) == "ai" and not tool_calls_of(message)


def settle_plan(kind: str, batch: WrittenBatch) -> Plan[None]:
    """Resolve a session's delayed ``kind`` jobs once ``batch`` is written.

    A delayed job waits for the answer to the turn ending at its message. If no
    turn starts between that message and the batch's first one (included), the
    batch continues that turn and its first job covers all of it: the delayed job
    is dropped. If a new turn starts, the waiting turn is over: its job becomes
    runnable now.
    """
    j, t = batch.tables.jobs, batch.tables.messages
    first_id = batch.ids[0]
    result = yield select(j.c.id, j.c.last_message_id).where(
        j.c.session_id == batch.session_id,
        j.c.kind == kind,
        j.c.state == DELAYED,
        j.c.last_message_id < first_id,
    )
    waiting = result.all()
    if not waiting:
        return
    oldest = min(row.last_message_id for row in waiting)
    result = yield (
        select(t.c.id, t.c.role)
        .where(t.c.session_id == batch.session_id, t.c.id >= oldest, t.c.id < first_id)
        .order_by(t.c.id)
        .limit(SETTLE_SCAN + 1)
    )
    rows = result.all()
    complete = len(rows) <= SETTLE_SCAN  # else the turns in between are not all known
    roles = [row.role for row in rows] + [batch.roles[0]]
    position = {row.id: index for index, row in enumerate(rows)}
    last_start = max((i for i in turn_starts(roles) if i > 0), default=0)
    continued, closed = [], []
    for row in waiting:
        at = position.get(row.last_message_id)
        if complete and at is not None and last_start <= at:
            continued.append(row.id)
        else:
            closed.append(row.id)
    if continued:
        yield delete(j).where(j.c.id.in_(continued), j.c.state == DELAYED)
    if closed:
        yield (
            update(j)
            .where(j.c.id.in_(closed), j.c.state == DELAYED)
            .values(state="pending", not_before=batch.now)
        )


@dataclass(frozen=True)
class TurnJobs:
    """Queue one ``kind`` job per turn of a written batch (an :class:`EnqueuePlanner`).

    The job of a turn the batch leaves open (it ends with a human or tool message,
    or an AI message that calls tools) waits ``idle_seconds`` for the answer: the
    next batch either continues that turn (the waiting job is dropped, the new
    one covers the whole turn) or starts a new one (the waiting job runs now).
    ``idle_seconds=0`` queues it runnable at once.

    Args:
        kind: The job kind.
        idle_seconds: How long an open turn's job waits for its answer.
    """

    kind: str
    idle_seconds: float = 0.0

    def __post_init__(self) -> None:
        # Checked here, so a bad value fails before anything is written.
        seconds = check_seconds("idle_seconds", self.idle_seconds, zero_ok=True)
        object.__setattr__(self, "idle_seconds", seconds)

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[None]:
        """Settle the session's delayed jobs of this kind, then queue one per turn."""
        yield from settle_plan(self.kind, batch)
        last = len(batch.messages) - 1
        for end in turn_ends(batch.roles):
            is_open = end == last and not answered(batch.messages[end])
            yield enqueue_statement(
                batch.tables.jobs,
                self.kind,
                batch.session_id,
                batch.user_id,
                batch.ids[end],
                batch.now,
                self.idle_seconds if is_open else 0.0,
            )


def call_with_timeout(fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` in a daemon thread so a hung LLM call cannot hold the worker.

    Raises:
        TimeoutError: If ``fn`` has not returned after ``timeout`` seconds (it is
            left to finish on its own; its result is dropped).
        RuntimeError: If ``fn`` raised a ``BaseException`` that is no
            ``Exception`` (``asyncio.CancelledError``, ``SystemExit``...), chained.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="tiered-memory-llm-call")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        msg = f"the LLM did not answer within {timeout:g} s"
        raise TimeoutError(msg)
    if "error" in box:
        error = box["error"]
        if isinstance(error, Exception):
            raise error
        # Raised in the call's own thread, a cancellation or an exit is that call's
        # failure, not a signal to the worker: raised as such, it killed the worker.
        msg = f"the LLM call raised {type(error).__name__}: {error}"
        raise RuntimeError(msg) from error
    return box["value"]


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
        self, backup: PlanRunner, kinds: Sequence[str], *, lease_seconds: float = 300.0
    ) -> None:
        self.backup = backup
        self.kinds = tuple(kinds)
        self.lease = timedelta(seconds=check_seconds("lease_seconds", lease_seconds))
        self.worker_id = new_worker_id()
        self.jobs = backup.tables.jobs

    # -- plans ----------------------------------------------------------------

    def _claim_plan(self, limit: int) -> Plan[list[Job]]:
        j, locks = self.jobs, self.backup.tables.locks
        now = utcnow()
        # One claimer at a time across processes: claims are short, and this keeps
        # the per-session order exact without relying on SKIP LOCKED semantics.
        yield select(locks.c.name).where(locks.c.name == "claim").with_for_update()
        earlier = j.alias("earlier")
        # Claims run under the worker's lock, so a job still marked as ours is left
        # over from a batch that raised (the database or Chroma went away): take it
        # again now instead of waiting out the lease.
        claimable = or_(
            and_(j.c.state == "pending", j.c.not_before <= now),
            and_(j.c.state == "running", j.c.lease_until < now),
            and_(j.c.state == "running", j.c.worker == self.worker_id),
        )
        blocked = exists().where(
            earlier.c.session_id == j.c.session_id,
            earlier.c.id < j.c.id,
            or_(
                and_(
                    earlier.c.state == "running",
                    earlier.c.lease_until >= now,
                    earlier.c.worker != self.worker_id,
                ),
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
        # A new token per claim fences off whoever held these jobs before.
        token = uuid.uuid4().hex
        yield (
            update(j)
            .where(j.c.id.in_([row.id for row in rows]))
            .values(
                state="running",
                worker=self.worker_id,
                lease_until=now + self.lease,
                lease_token=token,
            )
        )
        return [
            Job(
                id=row.id,
                kind=row.kind,
                session_id=row.session_id,
                user_id=row.user_id,
                last_message_id=row.last_message_id,
                attempts=row.attempts,
                token=token,
            )
            for row in rows
        ]

    def _ready_plan(self, due_only: bool) -> Plan[int]:
        """Make :data:`DELAYED` jobs of this queue runnable: the due ones, or all."""
        j = self.jobs
        now = utcnow()
        conditions = [j.c.state == DELAYED, j.c.kind.in_(self.kinds)]
        if due_only:
            conditions.append(j.c.not_before <= now)
        result = yield update(j).where(*conditions).values(state="pending", not_before=now)
        return int(result.rowcount)

    def _ready_and_claim_plan(self, limit: int) -> Plan[list[Job]]:
        yield from self._ready_plan(due_only=True)
        return (yield from self._claim_plan(limit))

    def _done_plan(self, jobs: Sequence[Job]) -> Plan[None]:
        yield delete(self.jobs).where(held_by(self.jobs, jobs))

    def _release_plan(self, jobs: Sequence[Job]) -> Plan[None]:
        yield (
            update(self.jobs)
            .where(held_by(self.jobs, jobs))
            .values(state="pending", worker=None, lease_until=None, lease_token=None)
        )

    def _retry_plan(self, job: Job, error: str, delay: float, count: bool) -> Plan[None]:
        yield (
            update(self.jobs)
            .where(held_by(self.jobs, [job]))
            .values(
                state="pending",
                attempts=self.jobs.c.attempts + (1 if count else 0),
                not_before=utcnow() + timedelta(seconds=delay),
                worker=None,
                lease_until=None,
                lease_token=None,
                last_error=error[:MAX_ERROR_CHARS],
            )
        )

    def _renew_plan(self, jobs: Sequence[Job]) -> Plan[set[int]]:
        held = and_(held_by(self.jobs, jobs), self.jobs.c.state == "running")
        yield update(self.jobs).where(held).values(lease_until=utcnow() + self.lease)
        result = yield select(self.jobs.c.id).where(held)
        return set(result.scalars())

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
            .values(state="pending", worker=None, lease_until=None, lease_token=None)
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
        """Claim up to ``limit`` jobs, oldest first, at most the runnable ones per session.

        Jobs this queue claimed earlier and never finished are claimed again, so a
        caller must not claim while a batch of its own is in flight
        (:class:`QueueWorker` holds a lock for that). Delayed jobs whose time has
        come become runnable first.
        """
        return self.backup.run(self._ready_and_claim_plan(limit), write=True)

    def make_ready(self) -> int:
        """Make every delayed job of this queue's kinds runnable now; returns how many."""
        return self.backup.run(self._ready_plan(due_only=False), write=True)

    def done(self, jobs: Sequence[Job]) -> None:
        """Delete finished jobs (those still held by their claim)."""
        if jobs:
            self.backup.run(self._done_plan(jobs), write=True)

    def release(self, jobs: Sequence[Job]) -> None:
        """Give claimed jobs back untouched (they run later, in order)."""
        if jobs:
            self.backup.run(self._release_plan(jobs), write=True)

    def retry(self, job: Job, error: str, delay: float, *, count: bool = True) -> None:
        """Make a failed job wait ``delay`` seconds.

        Args:
            job: The job, as claimed (a job claimed since by another worker is
                left alone).
            error: What went wrong, kept in the row.
            delay: Seconds before the job may run again.
            count: Count the failure as an attempt (``max_attempts`` of the LLM);
                ``False`` for failures that are not the LLM's, such as a full disk.
        """
        self.backup.run(self._retry_plan(job, error, delay, count), write=True)

    def renew(self, jobs: Sequence[Job]) -> set[int]:
        """Extend the lease of claimed jobs; returns the ids still held by their claim.

        A job missing from the answer was claimed by another worker after its
        lease ran out, or deleted (finished elsewhere, or forgotten): its runner
        must leave it alone.
        """
        if not jobs:
            return set()
        return self.backup.run(self._renew_plan(jobs), write=True)

    def reclaim_dead(self) -> int:
        """Re-drive jobs whose worker process on this host has died."""
        return self.backup.run(self._reclaim_plan(), write=True)

    def depth(self) -> int:
        """How many jobs of this queue's kinds are not finished."""
        return self.backup.run(self._depth_plan())


class QueueWorker(Lifecycle):
    """Runs the jobs of a :class:`JobQueue` in a background thread.

    Subclasses implement :meth:`_process`, and may implement :meth:`_warm_up`
    (load a model), which the thread runs once before its first claim. The thread
    re-drives the jobs of dead workers on start, wakes at once on :meth:`notify`
    (jobs of this process) and polls every ``poll_interval`` seconds (jobs of
    other processes).

    A script ends it with :meth:`shutdown` or a ``with`` block (``async with``
    too): what is queued is processed for at most ``drain_timeout`` seconds, then
    the thread stops. A worker whose thread runs is shut down the same way at
    interpreter exit if the script did not do it (held weakly: this keeps nothing
    alive). Jobs left over stay queued in the archive, one line says how many, and
    the next process that opens the archive with this tier finishes them.

    Args:
        queue: The queue to drain.
        poll_interval: Seconds between polls when idle.
        batch_size: Jobs claimed per round.
        start: Start the thread now.
        drain_timeout: Seconds :meth:`shutdown` (and the exit drain) may spend on
            queued jobs, the model load included.
    """

    def __init__(
        self,
        queue: JobQueue,
        *,
        poll_interval: float,
        batch_size: int,
        start: bool,
        drain_timeout: float = DRAIN_TIMEOUT,
    ) -> None:
        self.queue = queue
        self.drain_timeout = check_seconds("drain_timeout", drain_timeout, zero_ok=True)
        self.poll_interval = check_seconds("poll_interval", poll_interval)
        self.batch_size = check_int("batch_size", batch_size)
        #: Seconds between lease renewals of the running batch (a third of the
        #: lease, at least 50 ms); ``None`` renews nothing (tests of a stale worker).
        self.heartbeat_interval: float | None = max(queue.lease.total_seconds() / 3, 0.05)
        self._work_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warmed = threading.Event()
        self._warm_started: float | None = None
        if start:
            self.start()

    #: What :meth:`_warm_up` loads, for the message of a flush that times out.
    warm_up_label = "the worker's warm-up"

    def _process(self, jobs: Sequence[Job]) -> int:
        """Handle claimed jobs; return how many were finished."""
        raise NotImplementedError

    def _warm_up(self) -> None:
        """Load what the first job would otherwise load (nothing by default)."""

    @property
    def loading(self) -> float | None:
        """Seconds the worker thread has spent in its warm-up so far; ``None`` once done."""
        if self._warmed.is_set() or self._warm_started is None:
            return None
        return time.monotonic() - self._warm_started

    def _run(self) -> None:
        if not self._warmed.is_set():
            self._warm_started = time.monotonic()
            try:
                self._warm_up()
            except Exception:
                # Not fatal: the first job loads again and, if that fails, retries.
                logger.exception("%s: warm-up failed", type(self).__name__)
            finally:
                self._warmed.set()
        self._loop()

    def start(self) -> None:
        """Start the background worker (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"tiered-memory-{type(self).__name__}", daemon=True
        )
        self._thread.start()
        drain_at_exit(self)

    def notify(self) -> None:
        """Tell the worker that new jobs were queued."""
        self._wake.set()

    def close(self, timeout: float = 30.0, *, drain: bool = False) -> None:
        """Stop the worker after its current batch; pending jobs stay queued.

        Args:
            timeout: Seconds to wait for the thread (and, with ``drain``, for the
                queue) to finish.
            drain: First :meth:`flush` (delayed jobs included), so that everything
                queued so far is processed before the worker stops.

        Raises:
            TimeoutError: With ``drain``, if jobs are still queued after
                ``timeout`` seconds (the worker is stopped all the same).
        """
        try:
            if drain:
                self.flush(timeout)
        finally:
            self._stop.set()
            self._wake.set()
            forget_at_exit(self)
            thread = self._thread  # read once: another thread may close it meanwhile
            if thread is not None:
                thread.join(timeout)
                self._thread = None

    def drain(self, timeout: float | None = None) -> int:
        """Process what is queued for at most ``timeout`` seconds in all; never raises a timeout.

        Unlike :meth:`flush`, the bound includes the worker's warm-up (a model
        load). Without a worker thread, batches run in this thread and the bound
        is checked between them. Jobs still queued at the bound stay in the
        archive for the next process; one warning line says how many.

        Args:
            timeout: Seconds; ``None`` is :attr:`drain_timeout`.

        Returns:
            How many jobs of this worker's kinds are still queued (0 when drained).
        """
        timeout = (
            self.drain_timeout
            if timeout is None
            else check_seconds("timeout", timeout, zero_ok=True)
        )
        started = time.monotonic()
        if self.queue.depth() == 0:
            return 0
        alive = self._thread is not None and self._thread.is_alive()
        try:
            if alive and not self._warmed.wait(timeout):
                raise TimeoutError
            self.flush(max(0.0, timeout - (time.monotonic() - started)), load_timeout=0)
            return 0
        except TimeoutError:
            left = self.queue.depth()
        if left:
            logger.warning(
                "%d %s jobs still queued after %.3g s; they stay in %r and the next process "
                "that opens it with this tier finishes them",
                left,
                "/".join(self.queue.kinds),
                timeout,
                self.queue.backup,
            )
        return left

    def shutdown(self, drain_timeout: float | None = None) -> int:
        """:meth:`drain` for at most ``drain_timeout`` seconds, then stop the worker.

        What leaving a ``with`` block does, and what runs at interpreter exit for a
        worker that is still running.

        Args:
            drain_timeout: Seconds; ``None`` is :attr:`drain_timeout`.

        Returns:
            How many jobs were left queued for the next process.
        """
        started = time.monotonic()
        try:
            return self.drain(drain_timeout)
        finally:
            # The bound covers the join too. A batch still running (a slow LLM) is
            # not waited for past it: the thread is a daemon, and its claimed jobs go
            # back to the queue when this process is gone (JobQueue.reclaim_dead).
            bound = self.drain_timeout if drain_timeout is None else drain_timeout
            self.close(timeout=max(0.0, bound - (time.monotonic() - started)))

    def _loop(self) -> None:
        try:
            self.queue.reclaim_dead()
        except Exception:
            logger.exception("could not re-drive the jobs of dead workers")
        last_error = ""
        while not self._stop.is_set():
            try:
                # Busy while anything was claimed, finished or not (a batch whose
                # jobs all failed or were handed back): idle only on an empty queue.
                busy = self._run_batch() is not None
                last_error = ""
            except Exception as exc:
                # An outage fails every poll the same way: the first in full, then
                # one line each, so the log is not a wall of identical tracebacks.
                if str(exc) != last_error:
                    logger.exception("%s failed; retrying", type(self).__name__)
                else:
                    logger.warning("%s still failing: %s", type(self).__name__, exc)
                last_error = str(exc)
                busy = False
            if not busy:
                self._wake.wait(self.poll_interval)
                self._wake.clear()

    def run_pending(self, max_batches: int | None = None) -> int:
        """Process queued jobs in this thread; returns how many were finished."""
        finished = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            done = self._run_batch()
            if done is None:
                break
            finished += done
            batches += 1
        return finished

    def _run_batch(self) -> int | None:
        """Claim and process one batch: how many jobs it finished; ``None`` if none was claimed."""
        with self._work_lock:
            jobs = self.queue.claim(self.batch_size)
            if not jobs:
                return None
            with self._heartbeat(jobs):
                return self._process(jobs)

    @contextmanager
    def _heartbeat(self, jobs: Sequence[Job]) -> Iterator[None]:
        """Renew the leases of ``jobs`` while the block runs.

        A daemon thread renews every :attr:`heartbeat_interval` seconds, so a
        batch that takes longer than the lease (slow LLM calls) is not claimed a
        second time. A failed renewal (a database outage) is logged and tried
        again at the next beat; the thread stops with the block, without waiting
        for a renewal in flight.
        """
        interval = self.heartbeat_interval
        if not interval:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.queue.renew(jobs)
                except Exception as exc:
                    logger.warning("could not renew the leases of %d jobs: %s", len(jobs), exc)

        threading.Thread(
            target=beat, name=f"tiered-memory-{type(self).__name__}-heartbeat", daemon=True
        ).start()
        try:
            yield
        finally:
            stop.set()

    def flush(self, timeout: float = 30.0, *, load_timeout: float = 600.0) -> None:
        """Wait until every queued job of this worker's kinds is processed.

        Delayed jobs (a turn that waits for its answer) are made runnable first.
        The worker thread's warm-up (loading the embedding model in a cold
        process) does not count against ``timeout``: it has ``load_timeout``.

        Raises:
            TimeoutError: If the warm-up is still running after ``load_timeout``
                seconds, or jobs are still queued ``timeout`` seconds after it;
                the message says which.
        """
        load_timeout = check_seconds("load_timeout", load_timeout, zero_ok=True)
        alive = self._thread is not None and self._thread.is_alive()
        if alive and not self._warmed.is_set() and self.queue.depth() == 0:
            return  # nothing to wait for
        if alive and not self._warmed.wait(load_timeout):
            loading = self.loading or 0.0
            msg = (
                f"{self.warm_up_label} is still loading ({loading:.0f} s so far); "
                f"{self.queue.depth()} {'/'.join(self.queue.kinds)} jobs wait for it"
            )
            raise TimeoutError(msg)
        deadline = time.monotonic() + timeout
        if not alive:
            self.queue.reclaim_dead()
        self.queue.make_ready()
        readied = time.monotonic()
        while True:
            if self._thread is None or not self._thread.is_alive():
                self.run_pending(max_batches=1)  # the deadline is checked between batches
            depth = self.queue.depth()
            if depth == 0:
                return
            now = time.monotonic()
            if now >= deadline:
                msg = f"{depth} {'/'.join(self.queue.kinds)} jobs still queued after {timeout:g} s"
                raise TimeoutError(msg)
            if now - readied >= 0.5:  # turns left open by writes since the flush began
                self.queue.make_ready()
                readied = now
            self._wake.set()
            time.sleep(0.02)
