"""The memory catalog: the SQL record of every memory, as plans the archive runs.

A plan is a generator that yields statements and returns its answer
(:class:`~langchain_tiered_memory.storage.base.Plan`); the archive's ``run``
drives it, so each query is written once.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage
from sqlalchemy import delete, func, insert, select, update

from langchain_tiered_memory.core.encoding import well_formed
from langchain_tiered_memory.core.turns import turn_starts
from langchain_tiered_memory.storage.archive import MySQLBackup, scope_conditions
from langchain_tiered_memory.storage.base import Plan, utcnow
from langchain_tiered_memory.storage.jobs import Job, held_by
from langchain_tiered_memory.tiers.long_memory.chroma import PAGE
from langchain_tiered_memory.tiers.long_memory.subjects import OWNER_SEPARATOR, family_of

#: A memory is cut to this many characters (the archive keeps the whole turn): a
#: 16 MB turn or a runaway answer would not fit a prompt, nor one MySQL packet.
MEMORY_CHARS = 8000
TURN_SCAN = 500  # messages looked at to find where a turn starts
#: Lookups of the batch's ids and content hashes are sent this many at a time.
LOOKUP_CHUNK = 400


def digest(*parts: str) -> str:
    """A stable hex SHA-256 of text parts (ids and dedupe keys are cut from it)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def storable(text: str, limit: int = MEMORY_CHARS) -> str:
    """Text that Chroma and the catalog accept: lone surrogates replaced, at most ``limit``.

    The text is cut before it is scanned: a regex holds the GIL for the whole
    string, and an LLM answer of many megabytes would stall the chat's threads.
    """
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return well_formed(text)


def chronology(row: Any) -> tuple[datetime, int]:
    """Where a catalog row stands in time: when its turn happened, then its seq.

    Older and newer mean this wherever memories are compared: superseding and
    the order of near-duplicates. A session imported late is as old as its turns;
    turns of one session often share a date, and the catalog's order breaks the tie.
    """
    return row.turn_at, int(row.seq)


def context_ids(row: Any) -> list[int] | None:
    """The archive ids of a memory's context; ``None`` when it shows none.

    Rows written by an older version have a context but not its ids: they are
    searched and shown by their own text only.
    """
    ids = getattr(row, "context_ids", None)
    return None if row.context is None or ids is None else json.loads(ids)


def shown(row: Any) -> str:
    """What a search result shows of a memory, and what BM25 indexes: the same text.

    The turn before (``context``) comes first, so a hit earned by the previous
    turn's words shows those words (and lists their ids in ``context_ids``).
    """
    return str(row.text) if context_ids(row) is None else f"{row.context}\n{row.text}"


def to_bytes(vector: Sequence[float]) -> bytes:
    """A vector as the catalog keeps it (float32 bytes)."""
    import numpy as np  # comes with chromadb

    return np.asarray(vector, dtype=np.float32).tobytes()


def from_bytes(data: bytes) -> Any:
    """A catalog vector as a float32 array."""
    import numpy as np

    return np.frombuffer(data, dtype=np.float32)


def row_metadata(row: Any) -> dict[str, Any]:
    """The vector index metadata of a catalog row."""
    return {
        "session_id": row.session_id,
        "user_id": row.user_id or "",
        "kind": row.kind,
        "source_ids": row.source_ids,
        "turn_at": row.turn_at.isoformat(),
        "content_hash": row.content_hash,
    }


def replaces(newer: str, older: str, owners: int) -> bool:
    """Whether a newer memory of subject ``newer`` supersedes an older one of ``older``.

    Both are of one family (:func:`~.subjects.family_of`) and one scope, whose
    memories up to the newer one have named ``owners`` owners (ourselves counted). One that
    names an owner ("ACME's IBAN", "our IBAN") supersedes that owner's. One that
    names nobody ("the IBAN is now ...") is about the scope's one owner, if it has
    only one: it supersedes, and is superseded by, that owner's and those naming
    nobody; with several owners, whose it is is unknown, and it supersedes nothing.
    """
    nobody = family_of(newer)
    if newer == older and newer != nobody:
        return True
    return owners <= 1 and nobody in (newer, older)


def _family(subject: str | None) -> str | None:
    return None if subject is None else family_of(subject)


@dataclass
class Memory:
    """A memory a batch may write (its job, text, provenance and vector)."""

    id: str
    job: Job
    text: str
    kind: str
    source_ids: list[int]
    turn_at: datetime
    content_hash: str
    context: str | None = None
    context_ids: list[int] = field(default_factory=list)
    #: When the context's turn happened (:func:`~.worker.turn_time` of it).
    context_at: datetime | None = None
    vector: list[float] = field(default_factory=list)
    #: The embedding model that made ``vector`` (``model_name``).
    model: str | None = None
    #: The archive ids of the turn (``source_ids`` may gain merged turns).
    turn_ids: list[int] = field(default_factory=list)
    #: Content hashes of the raw memories of the turn's earlier ends.
    prefix_hashes: list[str] = field(default_factory=list)
    #: The turn's memory exists and is replaced by this fuller one.
    replaces: bool = False
    #: What it states a value of (:func:`~.subjects.subject_of`), if anything.
    subject: str | None = None
    #: Memories of its scope it replaces (an extractor's ``UPDATE <id>`` lines).
    supersedes: tuple[str, ...] = ()

    def metadata(self) -> dict[str, Any]:
        """The vector index metadata of this memory."""
        return {
            "session_id": self.job.session_id,
            "user_id": self.job.user_id or "",
            "kind": self.kind,
            "source_ids": json.dumps(self.source_ids),
            "turn_at": self.turn_at.isoformat(),
            "content_hash": self.content_hash,
        }


@dataclass(frozen=True)
class TurnRow:
    """An archived message of a turn."""

    id: int
    message: BaseMessage
    created_at: datetime


class Version(NamedTuple):
    """What a scope holds, in three numbers: an insert, a deletion or a re-insert changes one.

    A grown turn's row is re-inserted under a new seq; on a server, a transaction
    may commit a lower seq after a higher one. The sum of the seqs changes either way.
    """

    size: int  #: how many memories
    top: int  #: the highest seq
    total: int  #: the sum of the seqs


class CommitRefusedError(Exception):
    """Jobs of a batch that are no longer ours: nothing of the batch was committed.

    Another worker claimed them after our lease ran out, or a forget deleted them.

    Attributes:
        jobs: The ids of those jobs.
    """

    def __init__(self, jobs: set[int]) -> None:
        super().__init__(f"jobs {sorted(jobs)} are no longer held by this worker")
        self.jobs = jobs


class Catalog:
    """The plans over the memories table (and the archive rows a job reads).

    Args:
        backup: The archive holding the catalog.
    """

    def __init__(self, backup: MySQLBackup) -> None:
        self.backup = backup
        self.table = backup.tables.memories

    # -- the worker's reads and writes -------------------------------------------

    def turns_plan(self, jobs: Sequence[Job]) -> Plan[list[tuple[list[TurnRow], list[TurnRow]]]]:
        """Each job's turn and the turn before it (for context), oldest first.

        A turn is a run of human messages and everything after it up to the job's
        message, so two questions sent before one answer belong to one turn. The
        jobs are of one session and are read together: three queries whatever
        their number, and every message is decoded once.
        """
        t = self.backup.table
        session_id = jobs[0].session_id
        lowest = min(job.last_message_id for job in jobs)
        highest = max(job.last_message_id for job in jobs)
        in_session = t.c.session_id == session_id
        recent = yield (
            select(t.c.id, t.c.role)
            .where(in_session, t.c.id <= lowest)
            .order_by(t.c.id.desc())
            .limit(TURN_SCAN)
        )
        ids_roles = recent.all()[::-1]
        if highest > lowest:
            later = yield (
                select(t.c.id, t.c.role)
                .where(in_session, t.c.id > lowest, t.c.id <= highest)
                .order_by(t.c.id)
            )
            ids_roles += later.all()
        ids = [row_id for row_id, _ in ids_roles]
        # Per job: where the turn before its turn starts, where its turn starts, its end.
        spans: list[tuple[int, int, int] | None] = []
        for job in jobs:
            end = bisect_right(ids, job.last_message_id)
            window = ids_roles[max(0, end - TURN_SCAN) : end]
            starts = turn_starts([role for _, role in window])
            if not starts:
                spans.append(None)
                continue
            first = window[starts[-2] if len(starts) > 1 else starts[-1]][0]
            spans.append((first, window[starts[-1]][0], job.last_message_id))
        found = [span for span in spans if span is not None]
        if not found:
            return [([], []) for _ in jobs]
        result = yield (
            select(t.c.id, t.c.message, t.c.parts, t.c.created_at)
            .where(in_session, t.c.id >= min(span[0] for span in found), t.c.id <= highest)
            .order_by(t.c.id)
        )
        rows = result.all()
        messages = yield from self.backup.load_plan(rows)
        loaded = [TurnRow(r.id, m, r.created_at) for r, m in zip(rows, messages, strict=True)]
        loaded_ids = [row.id for row in loaded]
        turns: list[tuple[list[TurnRow], list[TurnRow]]] = []
        for span in spans:
            if span is None:
                turns.append(([], []))
                continue
            before, start, end = span
            lo, at = bisect_left(loaded_ids, before), bisect_left(loaded_ids, start)
            turns.append((loaded[lo:at], loaded[at : bisect_right(loaded_ids, end)]))
        return turns

    def known_plan(self, sessions: Sequence[str], keys: Sequence[str]) -> Plan[list[Any]]:
        """The sessions' memories whose id or content hash is one of ``keys``.

        One lookup per unique key (``id``; ``session_id, content_hash``), the id's
        filtered to the sessions here: given the session too, a planner may walk
        the session's rows instead, and each batch would cost more as it grows.
        Each row comes with its ``turn_at``: a turn is merged only into a memory of
        its own day.
        """
        c = self.table.c
        columns = (c.id, c.session_id, c.content_hash, c.text, c.source_ids, c.turn_at)
        wanted = set(sessions)
        found: dict[str, Any] = {}
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = list(keys[start : start + LOOKUP_CHUNK])
            by_id = yield select(*columns).where(c.id.in_(chunk))
            by_hash = yield select(*columns).where(
                c.session_id.in_(list(sessions)), c.content_hash.in_(chunk)
            )
            for row in (*by_id.all(), *by_hash.all()):
                if row.session_id in wanted:
                    found[row.id] = row
        return list(found.values())

    def commit_plan(
        self,
        new: Sequence[Memory],
        merges: dict[str, tuple[set[int], set[int]]],
        jobs: Sequence[Job],
    ) -> Plan[None]:
        """Record the batch and delete its jobs, all of it or nothing.

        A job is deleted only while it still carries our claim's token (``held_by``).
        If one was claimed again by another worker, or forgotten, the batch raises
        :class:`CommitRefusedError` and its transaction rolls back: where a batch
        put each turn depends on its other turns, so none of it may land.
        """
        j, c = self.backup.tables.jobs, self.table.c
        refused: set[int] = set()
        for job in jobs:
            result = yield delete(j).where(held_by(j, [job]))
            if result.rowcount == 0:
                refused.add(job.id)
        if refused:
            raise CommitRefusedError(refused)
        now = utcnow()
        # A grown turn's row is re-inserted (a new seq tells search caches to re-read
        # it); old rows go first, as a later memory of the batch may reuse their hash.
        replaced = [m.id for m in new if m.replaces]
        kept: dict[str, str] = {}  # a grown turn stays superseded by what superseded it
        if replaced:
            marks = yield select(c.id, c.superseded_by).where(
                c.id.in_(replaced), c.superseded_by.is_not(None)
            )
            kept = {row.id: row.superseded_by for row in marks}
            yield delete(self.table).where(c.id.in_(replaced))
        for memory in new:
            yield insert(self.table).values(
                id=memory.id,
                session_id=memory.job.session_id,
                user_id=memory.job.user_id,
                content_hash=memory.content_hash,
                text=memory.text,
                context=memory.context,
                context_ids=None if memory.context is None else json.dumps(memory.context_ids),
                context_at=None if memory.context is None else memory.context_at,
                vector=to_bytes(memory.vector),
                model=memory.model,
                kind=memory.kind,
                source_ids=json.dumps(memory.source_ids),
                turn_at=memory.turn_at,
                created_at=now,
                subject=memory.subject,
                superseded_by=kept.get(memory.id),
            )
        for memory_id, (added, removed) in merges.items():
            result = yield select(c.source_ids).where(c.id == memory_id)
            row = result.first()
            merged = sorted((set(json.loads(row.source_ids)) | added) - removed) if row else []
            if merged:  # a memory never loses its last source
                yield (
                    update(self.table)
                    .where(c.id == memory_id)
                    .values(source_ids=json.dumps(merged))
                )
        yield from self.supersede_plan(new)

    def supersede_plan(self, written: Sequence[Memory]) -> Plan[None]:
        """Mark the memories that the batch's memories supersede (nothing is deleted).

        An extractor's ``UPDATE <id>`` lines mark those memories, if they are of
        the same scope (checked again here, in SQL). A memory with a subject marks the
        live memories of its scope it replaces (:func:`replaces`): the older ones
        are superseded by it, and it is superseded by a newer one if the scope
        already holds one (a session imported out of order). Older and newer are by
        ``(turn_at, seq)``: turns of one session often share a date, and the
        catalog's order breaks the tie, so two memories never supersede each other
        and a batch that states a value twice ends with the last one live. One
        indexed lookup per memory with a subject.
        """
        c = self.table.c
        updates = {each: memory.id for memory in written for each in memory.supersedes}
        # Subjects first, as the catalog stood: a memory imported out of order is
        # linked to the value that stood, even if this batch's UPDATE replaces it
        # (but never to one it updates itself: the two would supersede each other).
        yield from self._subjects_plan(
            [(m.id, m.subject, m.job.session_id, m.job.user_id) for m in written], updates
        )
        for memory in sorted(written, key=lambda m: m.turn_at):
            replaced = [each for each in memory.supersedes if each != memory.id]
            if replaced:
                scope = self.owner_condition(memory.job.session_id, memory.job.user_id)
                yield (
                    update(self.table)
                    .where(c.id.in_(replaced), scope)
                    .values(superseded_by=memory.id)
                )

    def _subjects_plan(
        self,
        memories: Sequence[tuple[str, str | None, str, str | None]],
        updates: Mapping[str, str] | None = None,
    ) -> Plan[None]:
        """Run :meth:`_subject_plan` once per scope and subject family.

        ``memories`` are ``(id, subject, session_id, user_id)``; a user's scope is
        all of the user's sessions (see :meth:`owner_condition`).
        """
        groups: dict[tuple[str, str | None, str], list[str]] = {}
        for memory_id, subject, session_id, user_id in memories:
            if subject is not None:
                where = ("", user_id) if user_id is not None else (session_id, None)
                groups.setdefault((*where, family_of(subject)), []).append(memory_id)
        for (session_id, user_id, family), memory_ids in groups.items():
            scope = self.owner_condition(session_id, user_id)
            yield from self._subject_plan(family, memory_ids, scope, updates)

    def _subject_plan(
        self,
        family: str,
        memory_ids: Sequence[str],
        scope: Any,
        updates: Mapping[str, str] | None = None,
    ) -> Plan[None]:
        """Link memories of one family and scope with the live ones they replace.

        ``updates`` maps the memories this batch's ``UPDATE`` lines supersede to the
        memory that does (they are applied after): no link is made that would lead,
        through them and the links already made, back to where it starts, so no
        two memories ever supersede each other, directly or through others.

        See :meth:`supersede_plan`: taken in time order, each one supersedes the
        older live ones it replaces, and is superseded by the newest live one that
        replaces it. The family is read once, whatever the number of memories.
        """
        c = self.table.c
        # Every memory of the family, superseded ones too: a value that named
        # nobody and superseded ACME's is still ACME's, so owners named are
        # counted over all of them, up to each memory's own time.
        result = yield select(c.id, c.turn_at, c.seq, c.superseded_by, c.subject).where(
            scope,
            (c.subject == family) | c.subject.startswith(family + OWNER_SEPARATOR, autoescape=True),
        )
        rows = sorted(result.all(), key=chronology)
        order = {row.id: chronology(row) for row in rows}
        subject = {row.id: row.subject for row in rows}
        successor = {row.id: row.superseded_by for row in rows}
        named: set[str] = set()
        owners: dict[str, int] = {}  # owners named up to each memory, by its id
        for row in rows:
            if row.subject != family:
                named.add(row.subject)
            owners[row.id] = len(named)
        changed: dict[str, str] = {}
        planned = dict(updates or {})

        def leads_to(start: str, goal: str) -> bool:
            """Whether the links from ``start`` reach ``goal`` (an UPDATE line's first)."""
            seen: set[str] = set()
            node: str | None = start
            while node is not None and node not in seen:
                if node == goal:
                    return True
                seen.add(node)
                node = planned.get(node, successor.get(node))
            return False

        # Not in this scope's catalog (merged away): nothing to link.
        for memory_id in sorted((m for m in memory_ids if m in order), key=order.__getitem__):
            mine = order[memory_id]
            live = [other for other in order if other != memory_id and successor[other] is None]
            for other in live:
                if (
                    order[other] < mine
                    and replaces(subject[memory_id], subject[other], owners[memory_id])
                    and not leads_to(memory_id, other)
                ):
                    successor[other] = changed[other] = memory_id
            newer = [
                other
                for other in live
                if order[other] > mine
                and replaces(subject[other], subject[memory_id], owners[other])
                and not leads_to(other, memory_id)
            ]
            if newer:
                successor[memory_id] = changed[memory_id] = max(newer, key=order.__getitem__)
        by_target: dict[str, list[str]] = {}
        for memory_id, target in changed.items():
            by_target.setdefault(target, []).append(memory_id)
        for target, linked in by_target.items():
            for start in range(0, len(linked), 500):
                chunk = linked[start : start + 500]
                yield update(self.table).where(c.id.in_(chunk)).values(superseded_by=target)

    def owner_condition(self, session_id: str, user_id: str | None) -> Any:
        """The scope a memory of a session supersedes in: its user's, else its session's."""
        c = self.table.c
        if user_id is not None:
            return c.user_id == user_id
        return (c.session_id == session_id) & c.user_id.is_(None)

    def refused_plan(self, mine: Sequence[Memory]) -> Plan[tuple[list[Any], set[int]]]:
        """The catalog rows of a refused batch's memories, and which of their jobs are queued."""
        c, j = self.table.c, self.backup.tables.jobs.c
        rows = yield select(self.table).where(c.id.in_([m.id for m in mine]))
        queued = yield select(j.id).where(j.id.in_([m.job.id for m in mine]))
        return rows.all(), set(queued.scalars())

    def provenance_plan(self, memory_ids: Sequence[str]) -> Plan[list[Any]]:
        """``(id, source_ids)`` of memories."""
        c = self.table.c
        result = yield select(c.id, c.source_ids).where(c.id.in_(list(memory_ids)))
        return result.all()

    # -- search --------------------------------------------------------------------

    def version_plan(self, condition: Any) -> Plan[Version]:
        """A scope's :class:`Version`: it changes whenever the scope does."""
        c = self.table.c
        result = yield select(
            func.count(), func.coalesce(func.max(c.seq), 0), func.coalesce(func.sum(c.seq), 0)
        ).where(condition)
        count, top, total = result.one()
        return Version(int(count), int(top), int(total))

    def rows_plan(self, condition: Any, after: int, *, vectors: bool) -> Plan[list[Any]]:
        """A scope's rows past ``after`` (by seq), with their vectors or without."""
        c = self.table.c
        columns = [col for col in self.table.c if vectors or col.name != "vector"]
        result = yield select(*columns).where(condition, c.seq > after).order_by(c.seq)
        return result.all()

    def snapshot_plan(
        self, condition: Any, after: int, exact_limit: int
    ) -> Plan[tuple[Version, list[Any]]]:
        """A scope's version and its rows past ``after``, as of one moment.

        Run as one transaction, the rows are those the version counts. They carry
        their vectors when the scope is at most ``exact_limit`` memories (searched
        exactly, in process).
        """
        version = yield from self.version_plan(condition)
        rows = yield from self.rows_plan(condition, after, vectors=version.size <= exact_limit)
        return version, rows

    def models_plan(self, condition: Any) -> Plan[dict[str | None, int]]:
        """How many of a scope's rows each embedding model embedded."""
        c = self.table.c
        result = yield select(c.model, func.count()).where(condition).group_by(c.model)
        return {model: int(count) for model, count in result.all()}

    def fresh_plan(self, ids: Sequence[str], condition: Any = None) -> Plan[dict[str, Any]]:
        """Rows by id as they are now (provenance may have grown since caching)."""
        c = self.table.c
        where = [c.id.in_(list(ids))] + ([] if condition is None else [condition])
        result = yield select(self.table).where(*where)
        return {row.id: row for row in result}

    # -- forget and rebuild --------------------------------------------------------

    def scope_page_plan(self, session_id: str | None, user_id: str | None) -> Plan[list[str]]:
        """Up to :data:`PAGE` ids of a forgotten scope."""
        c = self.table.c
        result = yield (
            select(c.id).where(*scope_conditions(self.table, session_id, user_id)).limit(PAGE)
        )
        return [row.id for row in result]

    def delete_plan(self, ids: Sequence[str]) -> Plan[None]:
        """Delete memories by id.

        A memory another one is superseded by hands that link on to its own
        successor (when that one stays and states a value of the same family, or
        neither states one), else the other one stands again, unless a newer
        memory of its subject replaces it: no link points at a deleted memory.
        """
        c = self.table.c
        gone = set(ids)
        result = yield select(c.id, c.superseded_by).where(c.id.in_(list(gone)))
        successor = {row.id: row.superseded_by for row in result}

        def standing(memory_id: str | None) -> str | None:
            seen: set[str] = set()
            while memory_id in gone and memory_id not in seen:
                seen.add(memory_id)
                memory_id = successor.get(memory_id)
            return None if memory_id in gone else memory_id

        result = yield select(c.id, c.superseded_by, c.subject, c.session_id, c.user_id).where(
            c.superseded_by.in_(list(gone)), c.id.not_in(list(gone))
        )
        linked_rows = result.all()
        targets = {standing(row.superseded_by) for row in linked_rows} - {None}
        result = yield select(c.id, c.subject).where(c.id.in_(list(targets)))
        subject = {row.id: row.subject for row in result}
        relink: dict[str | None, list[str]] = {}
        for row in linked_rows:  # usually none: one update per memory that stands in their place
            target = standing(row.superseded_by)
            # Handed on only to a value of the same kind: a memory that held several
            # facts was superseded for one of them, not for this one's.
            if target is not None and _family(subject.get(target)) != _family(row.subject):
                target = None
            relink.setdefault(target, []).append(row.id)
        for target, linked in relink.items():
            yield update(self.table).where(c.id.in_(linked)).values(superseded_by=target)
        yield delete(self.table).where(c.id.in_(list(gone)))
        # Those that stand again: a newer value of their own subject may replace them.
        again = set(relink.get(None, ()))
        yield from self._subjects_plan(
            [(r.id, r.subject, r.session_id, r.user_id) for r in linked_rows if r.id in again]
        )

    def count_plan(self) -> Plan[int]:
        """How many memories the catalog holds."""
        result = yield select(func.count()).select_from(self.table)
        return int(result.scalar_one())

    def page_plan(self, after: int, size: int = 256) -> Plan[list[Any]]:
        """The next ``size`` rows after seq ``after``."""
        c = self.table.c
        result = yield select(self.table).where(c.seq > after).order_by(c.seq).limit(size)
        return result.all()

    def name_plan(self, condition: Any, model: str) -> Plan[None]:
        """Name ``model`` as the maker of a scope's rows of no recorded model."""
        c = self.table.c
        yield update(self.table).where(condition, c.model.is_(None)).values(model=model)

    def vectors_plan(
        self, rows: Sequence[Any], vectors: Sequence[Sequence[float]], model: str
    ) -> Plan[None]:
        """Store the vectors of rows, made by the embedding model named ``model``."""
        c = self.table.c
        for row, vector in zip(rows, vectors, strict=True):
            yield (
                update(self.table)
                .where(c.id == row.id)
                .values(vector=to_bytes(vector), model=model)
            )
