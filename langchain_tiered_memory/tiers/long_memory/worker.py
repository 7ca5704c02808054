"""The background extraction worker: turns into memories, in batches, deduped by text.

Write path: ``TieredChatMessageHistory.add_messages`` queues an ``extract`` job in
the archive's transaction; this worker claims it, asks the extractor (or keeps the
raw turn), dedupes, upserts the vector into the vector index, then records the
memory in the archive's catalog and deletes the job in one transaction. A crash
anywhere re-drives the job; ids are deterministic, so a re-run overwrites rather
than duplicates.

Dedupe is decided by text, never by an embedding's similarity: a turn is merged
only into a memory of its session with the same text (raw) or the same words and
values (extracted), so every archived message listed by a memory is in its text. A
turn that grows (another AI message) keeps one memory, replaced by the fuller one.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from langchain_tiered_memory.core.lifecycle import DRAIN_TIMEOUT
from langchain_tiered_memory.core.prompts import Prompts, prompts_in_use
from langchain_tiered_memory.core.turns import role_of
from langchain_tiered_memory.core.validation import InvalidSessionDateError, session_date
from langchain_tiered_memory.storage.archive import ArchiveUnavailableError
from langchain_tiered_memory.storage.base import Plan, WrittenBatch
from langchain_tiered_memory.storage.jobs import (
    Job,
    JobQueue,
    QueueWorker,
    TurnJobs,
    backoff,
    call_with_timeout,
)
from langchain_tiered_memory.text.embeddings import model_name
from langchain_tiered_memory.text.tokens import prompt_budget
from langchain_tiered_memory.tiers.extraction import (
    check_extraction_prompts,
    extraction_prompt,
    format_turn,
    offerable,
    parse_extraction,
    parse_update,
    turn_prompts,
)
from langchain_tiered_memory.tiers.long_memory.catalog import (
    Catalog,
    Memory,
    TurnRow,
    digest,
    from_bytes,
    row_metadata,
    storable,
)
from langchain_tiered_memory.tiers.long_memory.subjects import subject_of
from langchain_tiered_memory.tiers.long_memory.vectors import VectorIndex

logger = logging.getLogger(__name__)

CONTEXT_CHARS = 2000
#: Seconds at least before a turn that could not be read is read again: it is not a
#: passing fault, and with no backoff (``retry_base_delay=0``) ``run_pending`` would
#: claim it again at once, forever.
UNREADABLE_PARK = 60.0
#: Earlier ends of a turn whose raw memory is looked up when the turn grows.
PREFIXES = 16
# Numbers (signed, with separators: amounts, dates, times), words, and the symbols that
# change a value; everything else (punctuation, case, articles) says nothing new.
_WORDS = re.compile(r"[-+\u2212]?\d(?:[\d.,:/-]*\d)?|[^\W\d_]+|[$€£¥₹%‰]")
_ARTICLES = frozenset({"a", "an", "the"})
#: Jobs claimed per round by default. Raw turns are bound by the embedding model,
#: which pads each batch to its longest text: a larger batch, sorted by length,
#: pads less. Extraction is bound by the LLM: a smaller batch commits sooner.
RAW_BATCH = 512
EXTRACT_BATCH = 64


def turn_time(turn: Sequence[TurnRow]) -> datetime:
    """When a turn happened: the first session date its messages carry, else its archive time.

    A stored date that does not parse (archived before dates were validated) is
    passed over, so it never blocks the memory.
    """
    for row in turn:
        try:
            found = session_date(row.message)
        except InvalidSessionDateError:
            continue
        if found is not None:
            return found
    return turn[0].created_at


def default_batch_size(extractor: BaseChatModel | None) -> int:
    """Jobs a worker claims per round: :data:`RAW_BATCH` or :data:`EXTRACT_BATCH`."""
    return RAW_BATCH if extractor is None else EXTRACT_BATCH


@dataclass
class _Entry:
    """A catalog row as the batch sees it (``memory`` when the batch writes it)."""

    id: str
    session_id: str
    content_hash: str
    text: str
    sources: set[int]
    memory: Memory | None = None


class Batch:
    """Where each memory of a batch goes: dedupe decided by text, never by vector.

    Invariant: every turn listed in a memory's ``source_ids`` has its text in that
    memory's text. A turn is merged only into a memory with the same dedupe key
    (:func:`_content_hash`); a turn that grew replaces its own memory (keyed by the
    turn's first message) and takes its ids back from the memories of its earlier
    ends; every archived message stays the source of exactly one memory.
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self.entries: dict[str, _Entry] = {}
        self.by_hash: dict[tuple[str, str], str] = {}
        self.writes: dict[str, Memory] = {}
        #: Stored memories' source ids to add and to remove.
        self.provenance: dict[str, tuple[set[int], set[int]]] = {}
        for row in rows:
            self.entries[row.id] = _Entry(
                row.id, row.session_id, row.content_hash, row.text, set(json.loads(row.source_ids))
            )
            self.by_hash[(row.session_id, row.content_hash)] = row.id

    def _lookup(self, session_id: str, content_hash: str) -> _Entry | None:
        found = self.by_hash.get((session_id, content_hash))
        return None if found is None else self.entries[found]

    def _same(self, memory: Memory) -> _Entry | None:
        """A memory of the session that says the same thing (legacy hashes re-checked)."""
        session_id = memory.job.session_id
        for key in (memory.content_hash, legacy_hash(memory.text)):
            entry = self._lookup(session_id, key)
            if entry is not None and content_hash(entry.text, memory.kind) == memory.content_hash:
                return entry
        return None

    def place(self, memory: Memory) -> None:
        """Decide where a memory of the batch goes (written, merged, or replacing its turn's)."""
        session_id = memory.job.session_id
        turn = set(memory.turn_ids)
        own = self.entries.get(memory.id)
        if own is not None and turn <= own.sources:
            return  # a re-run: this turn is stored as it is already
        earlier = {
            entry.id: entry
            for key in memory.prefix_hashes
            if (entry := self._lookup(session_id, key)) is not None and entry.id != memory.id
        }
        placed = set().union(*(e.sources & turn for e in (own, *earlier.values()) if e))
        same = self._same(memory)
        if same is not None:  # the same text: it lists the turn's ids not listed yet
            self._change(same, added=turn - placed)
            return
        grown = own is None or own.sources <= turn or spaced(own.text) in spaced(memory.text)
        if not grown:
            # The turn's memory also stands for other turns its new text no longer
            # holds: keep it, and store the rest of the turn beside it.
            ends = (str(memory.turn_ids[0]), str(memory.job.last_message_id))
            memory.id = digest(session_id, *ends)[:32]
            memory.source_ids = sorted(turn - placed)
            own = None
        else:
            memory.source_ids = sorted(turn | (own.sources if own else set()))
            for entry in earlier.values():
                self._change(entry, removed=turn)
        self._write(memory, own)

    def _write(self, memory: Memory, own: _Entry | None) -> None:
        session_id = memory.job.session_id
        if own is not None:
            memory.replaces = own.memory.replaces if own.memory else True
            if self.by_hash.get((session_id, own.content_hash)) == own.id:
                del self.by_hash[(session_id, own.content_hash)]
            self.provenance.pop(own.id, None)  # the new row carries the sources
        self.entries[memory.id] = _Entry(
            memory.id,
            session_id,
            memory.content_hash,
            memory.text,
            set(memory.source_ids),
            memory,
        )
        self.by_hash[(session_id, memory.content_hash)] = memory.id
        self.writes[memory.id] = memory

    def _change(
        self, entry: _Entry, added: set[int] | None = None, removed: set[int] | None = None
    ) -> None:
        added = (added or set()) - entry.sources
        removed = (removed or set()) & entry.sources
        if removed == entry.sources | added:
            removed = set()  # a memory never loses its last source
        if not added and not removed:
            return
        entry.sources = (entry.sources | added) - removed
        if entry.memory is not None:
            entry.memory.source_ids = sorted(entry.sources)
            return
        to_add, to_remove = self.provenance.setdefault(entry.id, (set(), set()))
        to_add.difference_update(removed)
        to_add.update(added)
        to_remove.difference_update(added)
        to_remove.update(removed)


def spaced(text: str) -> str:
    """Text with every run of whitespace as one space."""
    return " ".join(text.split())


def words(text: str) -> list[str]:
    """The words of a text: case, punctuation and articles ignored, numbers kept as written."""
    words = []
    for token in _WORDS.findall(unicodedata.normalize("NFKC", text)):
        if token[0].isalpha():
            token = token.lower()
            if token in _ARTICLES:
                continue
        words.append(token.replace("\u2212", "-"))
    return words


def content_hash(text: str, kind: str) -> str:
    """The dedupe key of a memory text: equal keys say the same thing.

    A raw turn is only ever a duplicate of the same text (spacing aside), so a merged
    turn's words are always in the memory that lists it. An extracted summary may
    also differ in case, punctuation and articles; a single other word, number,
    date, amount, identifier or name makes it a memory of its own.
    """
    if kind == "raw":
        return digest("text", spaced(text))
    return digest("words", " ".join(words(text)))


def legacy_hash(text: str) -> str:
    """The content hash of memories written before :func:`_content_hash` (a lookup only)."""
    return digest(normalise(text))


def normalise(text: str) -> str:
    """Spaced, lowercased text (the legacy dedupe key)."""
    return " ".join(text.split()).lower()


class ExtractionWorker(QueueWorker):
    """Claims ``extract`` jobs and turns each into a memory in the catalog and the index.

    Args:
        catalog: The memory catalog (beside the job queue, in the archive).
        vectors: Where memory vectors are written.
        embedding: Embeds memory texts.
        extractor: A chat model that extracts what matters from each turn;
            ``None`` stores the raw turn.
        language: ``"en"``, ``"zh"`` or ``None`` (picked per turn).
        prompts: The extraction prompt and raw-turn labels for every turn;
            ``None`` picks them by ``language``.
        max_attempts: Extractor attempts before the raw turn is stored instead.
        extract_timeout: Seconds one extractor call may take.
        max_prompt_tokens: The extraction prompt's budget (see
            :func:`~langchain_tiered_memory.text.tokens.prompt_budget`).
        retry_base_delay: First backoff delay in seconds.
        idle_seconds: How long a turn without an answer waits before extraction.
        queue: The job queue of ``extract`` jobs.
        poll_interval: Seconds between queue polls when idle.
        batch_size: Jobs claimed per round.
        start: Start the worker thread now.
        drain_timeout: Seconds :meth:`shutdown` (a ``with`` block's end, the
            interpreter's exit) may spend on queued jobs.
    """

    warm_up_label = "the embedding model"

    def __init__(
        self,
        *,
        catalog: Catalog,
        vectors: VectorIndex,
        embedding: Embeddings,
        extractor: BaseChatModel | None,
        language: Literal["en", "zh"] | None,
        prompts: Prompts | None,
        max_attempts: int,
        extract_timeout: float,
        retry_base_delay: float,
        idle_seconds: float,
        max_prompt_tokens: int | None = None,
        queue: JobQueue,
        poll_interval: float,
        batch_size: int,
        start: bool,
        drain_timeout: float = DRAIN_TIMEOUT,
    ) -> None:
        self.catalog = catalog
        self.backup = catalog.backup
        self.vectors = vectors
        self.embedding = embedding
        self.extractor = extractor
        self.language = language
        self.prompts = prompts
        self.max_attempts = max_attempts
        self.extract_timeout = extract_timeout
        self.max_prompt_tokens = prompt_budget(extractor, max_prompt_tokens)
        if extractor is not None:
            for each in prompts_in_use(prompts):
                check_extraction_prompts(each, self.max_prompt_tokens)
        self.retry_base_delay = retry_base_delay
        self.idle_seconds = idle_seconds
        super().__init__(
            queue,
            poll_interval=poll_interval,
            batch_size=batch_size,
            start=start,
            drain_timeout=drain_timeout,
        )

    def _warm_up(self) -> None:
        """Load the embedding model in the worker thread, before its first job."""
        warm_up = getattr(self.embedding, "warm_up", None)
        if callable(warm_up):
            warm_up()

    def enqueue_plan(self, batch: WrittenBatch) -> Plan[None]:
        """Queue one extraction per turn of a write, in the write's transaction.

        A last turn still open (no AI answer yet) waits ``idle_seconds`` for its
        answer, then is extracted as it is (see
        :class:`~langchain_tiered_memory.storage.jobs.TurnJobs`).
        """
        return TurnJobs("extract", self.idle_seconds).enqueue_plan(batch)

    def nearest(self, job: Job, text: str, own_id: str) -> list[tuple[str, str]]:
        """``(id, text)`` of live memories of the job's scope near ``text`` (none here).

        The extractor is offered these for ``UPDATE``; a tier that can search
        (``ChromaLongMemory``) overrides it.
        """
        return []

    def _extract(
        self, job: Job, turn: Sequence[BaseMessage], own_id: str
    ) -> tuple[str | None, str, tuple[str, ...]]:
        """The memory text of a turn, its kind (``extracted`` or ``raw``) and what it updates."""
        prompts = turn_prompts(turn, self.language, self.prompts)
        if self.extractor is None or job.attempts >= self.max_attempts:
            raw = format_turn(turn, prompts)
            return (storable(raw) if raw else None), "raw", ()
        conversation = format_turn(turn, prompts)  # a pasted document: formatted once
        offered = offerable(
            prompts, self.nearest(job, conversation, own_id), self.max_prompt_tokens
        )
        prompt = extraction_prompt(conversation, prompts, offered, self.max_prompt_tokens)
        extractor = self.extractor
        answer = call_with_timeout(lambda: extractor.invoke(prompt), self.extract_timeout)
        text = parse_extraction(answer)
        if text is None:
            return None, "extracted", ()
        text, updates = parse_update(text, {memory_id for memory_id, _ in offered})
        return (storable(text) if text else None), "extracted", updates

    def _process(self, jobs: Sequence[Job]) -> int:
        failed_sessions: set[str] = set()
        skipped: list[int] = []
        empty: list[Job] = []
        fresh: list[Memory] = []
        turns = self._turns(jobs)
        for job in jobs:
            if job.session_id in failed_sessions:
                skipped.append(job.id)  # keeps the session's order
                continue
            read = turns[job.id]
            if isinstance(read, Exception):  # a stored message this process cannot decode
                failed_sessions.add(job.session_id)
                self._unreadable(job, read)
                continue
            before, turn = read
            if not turn:  # its messages were deleted (clear or forget)
                empty.append(job)
                continue
            messages = [r.message for r in turn if role_of(r.message) in ("human", "ai")]
            # One memory per turn, keyed by where the turn starts: a turn that
            # grows (another AI message) replaces it with the fuller text.
            memory_id = digest(job.session_id, str(turn[0].id))[:32]
            try:
                text, kind, updates = (
                    self._extract(job, messages, memory_id) if messages else (None, "raw", ())
                )
            except Exception as exc:
                failed_sessions.add(job.session_id)
                self._fail(job, exc)
                continue
            if text is None:
                empty.append(job)
                continue
            # A raw turn is found by, and shown with, the turn before it: an answer
            # often shares its words with the question before it. A summary stands
            # alone (prepending raw dialogue would undo what extraction saves).
            context = self._context(before) if kind == "raw" else None
            fresh.append(
                Memory(
                    id=memory_id,
                    job=job,
                    text=text,
                    kind=kind,
                    source_ids=[r.id for r in turn],
                    turn_at=turn_time(turn),
                    content_hash=content_hash(text, kind),
                    context=context,
                    context_ids=[r.id for r in before if role_of(r.message) in ("human", "ai")],
                    turn_ids=[r.id for r in turn],
                    prefix_hashes=self._prefix_hashes(messages),
                    subject=subject_of(text),
                    supersedes=updates,
                )
            )
        self.queue.release([job for job in jobs if job.id in skipped])
        return self._store(fresh, empty)

    def _turns(
        self, jobs: Sequence[Job]
    ) -> dict[int, tuple[list[TurnRow], list[TurnRow]] | Exception]:
        """Each job's turn and the turn before it, read a session at a time.

        A session whose read fails is read again job by job, so that the error
        stays with the job whose turn cannot be read; an outage is raised (the
        batch is claimed again later).
        """
        sessions: dict[str, list[Job]] = {}
        for job in jobs:
            sessions.setdefault(job.session_id, []).append(job)
        found: dict[int, tuple[list[TurnRow], list[TurnRow]] | Exception] = {}
        for group in sessions.values():
            try:
                read = self.backup.run(self.catalog.turns_plan(group))
            except ArchiveUnavailableError:
                raise
            except Exception:
                read = None  # read again job by job, below
            if read is not None:
                found.update(zip((job.id for job in group), read, strict=True))
                continue
            for job in group:
                try:
                    found[job.id] = self.backup.run(self.catalog.turns_plan([job]))[0]
                except ArchiveUnavailableError:
                    raise
                except Exception as exc:
                    found[job.id] = exc
        return found

    def _prefix_hashes(self, messages: Sequence[BaseMessage]) -> list[str]:
        """Content hashes of the raw memories that earlier jobs of this turn may have left.

        Each earlier end of a growing turn may have been stored (or merged into an
        identical memory) as the turn so far; the fuller memory takes its ids over.
        """
        hashes = []
        for end in range(max(1, len(messages) - PREFIXES), len(messages)):
            prefix = messages[:end]
            text = format_turn(prefix, turn_prompts(prefix, self.language, self.prompts))
            if text:
                hashes.append(content_hash(storable(text), "raw"))
        return hashes

    def _context(self, before: Sequence[TurnRow]) -> str | None:
        messages = [r.message for r in before if role_of(r.message) in ("human", "ai")]
        if not messages:
            return None
        text = format_turn(messages, turn_prompts(messages, self.language, self.prompts))
        return storable(text[:CONTEXT_CHARS]) if text else None

    def _unreadable(self, job: Job, exc: BaseException) -> None:
        """Park a job whose turn cannot be read, so it holds up only its own session."""
        error = f"{type(exc).__name__}: {exc}"
        delay = max(backoff(self.retry_base_delay, job.attempts), UNREADABLE_PARK)
        logger.error(
            "cannot read the turn of job %d (session %r): %s; retry in %.0f s",
            job.id,
            job.session_id,
            error,
            delay,
        )
        self.queue.retry(job, error, delay)

    def _fail(self, job: Job, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        attempt = job.attempts + 1
        if attempt >= self.max_attempts:
            logger.warning(
                "extraction failed %d times for session %r (%s); storing the raw turn",
                attempt,
                job.session_id,
                error,
            )
            delay = 0.0
        else:
            delay = backoff(self.retry_base_delay, job.attempts)
            logger.info("extraction attempt %d failed (%s); retry in %.1fs", attempt, error, delay)
        self.queue.retry(job, error, delay)

    def _store(self, fresh: list[Memory], empty: list[Job]) -> int:
        """Write and commit a batch's memories; returns how many jobs it finished."""
        # Renew the leases right before writing: a job another worker claimed after
        # our lease ran out is its business now, not ours to write.
        held = self.queue.renew([m.job for m in fresh] + empty)
        fresh = [m for m in fresh if m.job.id in held]
        empty = [job for job in empty if job.id in held]
        jobs = [m.job for m in fresh] + empty
        latest: dict[str, Memory] = {}
        for memory in fresh:  # a later job of a turn that grew supersedes an earlier one
            latest[memory.id] = memory
        writes, provenance = self._dedupe(list(latest.values())) if latest else ([], {})
        if writes:
            # Longest first, as sentence-transformers orders a call: an embedding
            # that batches texts in the order given pads each batch less.
            by_length = sorted(writes, key=lambda m: -len(m.text))
            vectors = self.embedding.embed_documents([m.text for m in by_length])
            model = model_name(self.embedding)
            for memory, vector in zip(by_length, vectors, strict=True):
                memory.vector = vector
                memory.model = model
            self.vectors.upsert(
                [m.id for m in writes],
                [m.vector for m in writes],
                [m.text for m in writes],
                [m.metadata() for m in writes],
            )
        refused = self.backup.run(self.catalog.commit_plan(writes, provenance, jobs), write=True)
        self._settle_vectors(fresh, writes, refused)
        if provenance:
            self._refresh_provenance(list(provenance))
        return len(jobs) - len(refused)

    def _dedupe(
        self, fresh: Sequence[Memory]
    ) -> tuple[list[Memory], dict[str, tuple[set[int], set[int]]]]:
        """What the batch writes: memories to store, and provenance changes of stored ones.

        Only index lookups: the batch's turn ids and content hashes (its own, the
        legacy one, and those of its turns' earlier ends) against the catalog's
        unique keys; the work never depends on how many memories a session holds.
        """
        sessions = sorted({m.job.session_id for m in fresh})
        keys = sorted(
            {m.id for m in fresh}
            | {h for m in fresh for h in (m.content_hash, legacy_hash(m.text), *m.prefix_hashes)}
        )

        batch = Batch(self.backup.run(self.catalog.known_plan(sessions, keys), read_only=True))
        for memory in fresh:
            batch.place(memory)
        return list(batch.writes.values()), batch.provenance

    def _settle_vectors(
        self, fresh: Sequence[Memory], new: Sequence[Memory], refused: set[int]
    ) -> None:
        """Make Chroma agree with the catalog for the memories of a batch.

        A memory merged into another one has no catalog row, and its job is gone
        with our commit, so nobody will ever commit it: a vector an earlier,
        interrupted run wrote for it is dropped. A memory whose commit was refused
        (its job was claimed again after our lease ran out, or forgotten) is decided
        by what the database holds, never by the missing job row alone: a catalog
        row (the new owner's commit) is written back over our vector; no catalog
        row and no job means no commit can come, so our vector goes; a job still
        queued belongs to its new owner, who writes or drops that vector itself.
        """
        written = {m.id for m in new}
        dropped = [m.id for m in fresh if m.id not in written and m.job.id not in refused]
        mine = [m for m in new if m.job.id in refused]
        if mine:
            rows, queued = self.backup.run(self.catalog.refused_plan(mine))
            if rows:
                self.vectors.upsert(
                    [row.id for row in rows],
                    [
                        from_bytes(row.vector).tolist()
                        if row.vector is not None
                        else self.embedding.embed_documents([row.text])[0]
                        for row in rows
                    ],
                    [row.text for row in rows],
                    [row_metadata(row) for row in rows],
                )
            stored = {row.id for row in rows}
            dropped += [m.id for m in mine if m.id not in stored and m.job.id not in queued]
        if dropped:
            self.vectors.delete(dropped)

    def _refresh_provenance(self, memory_ids: Sequence[str]) -> None:
        rows = self.backup.run(self.catalog.provenance_plan(memory_ids), read_only=True)
        if rows:
            self.vectors.update_metadata(
                [row.id for row in rows],
                [{"source_ids": row.source_ids} for row in rows],
            )
        # No cache reset: search reads provenance fresh from the catalog (_fresh_rows).
