"""The background extraction worker: turns into memories, in batches, deduped by text.

Write path: ``TieredChatMessageHistory.add_messages`` queues an ``extract`` job in
the archive's transaction; this worker claims it, asks the extractor (or keeps the
raw turn), dedupes, upserts the vector into the vector index, then records the
memory in the archive's catalog and deletes the job in one transaction. A crash
anywhere re-drives the job; ids are deterministic, so a re-run overwrites rather
than duplicates.

Dedupe is decided by text, never by an embedding's similarity: a turn is merged
only into a memory of its session with the same text (raw) or the same words and
values (extracted) of the same day, so every archived message listed by a memory is
in its text and happened on its date. A turn that grows (another AI message) keeps
one memory, replaced by the fuller one.

A batch that fails on its data (an embedding or an index refusing a text, the
database refusing a value) is stored again job by job, so the error stays with its
job; an outage (:func:`is_outage`) stops the batch, counted against no job.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
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
    CommitRefusedError,
    Memory,
    TurnRow,
    digest,
    from_bytes,
    row_metadata,
    storable,
)
from langchain_tiered_memory.tiers.long_memory.chroma import is_unreachable
from langchain_tiered_memory.tiers.long_memory.subjects import subject_of
from langchain_tiered_memory.tiers.long_memory.vectors import VectorIndex

logger = logging.getLogger(__name__)

CONTEXT_CHARS = 2000
#: Seconds at least before a job that failed on its own data (a turn that could not
#: be read, a memory that could not be stored) runs again: it is not a passing fault,
#: and with no backoff (``retry_base_delay=0``) ``run_pending`` would claim it again
#: at once, forever.
UNREADABLE_PARK = 60.0
#: Names (in an error's class hierarchy) of the errors a client raises when it cannot
#: reach its service: httpx's (Chroma's ``HttpClient``), requests', and those of hosted
#: model APIs (``openai.APIConnectionError`` and its ``APITimeoutError``).
_UNREACHABLE = frozenset(
    {
        "ConnectionError",
        "TimeoutError",
        "Timeout",
        "TransportError",
        "APIConnectionError",
        "RateLimitError",
        "ServiceUnavailableError",
    }
)
#: HTTP statuses of a service too busy or unreachable to answer now (a timeout, too
#: early, rate limited, a gateway or the service down). Any other status is the
#: job's: a 500 may answer one input (Ollama's to a text over its context), and an
#: outage counted against a job costs it an attempt, never its turn.
_BUSY = frozenset({408, 425, 429, 502, 503, 504})
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


def _days(turn: Sequence[TurnRow]) -> set[date]:
    """The days an earlier end of a turn may be dated by (see :func:`turn_time`).

    An end before the turn's first session date is dated by its archive time.
    """
    return {turn[0].created_at.date(), turn_time(turn).date()}


def http_status(error: BaseException) -> int | None:
    """The HTTP status an API client's error carries, if any.

    Its ``status_code`` or ``status``, or its ``response``'s: as httpx, requests,
    aiohttp and the OpenAI client put it.
    """
    for holder in (error, getattr(error, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def is_outage(exc: BaseException) -> bool:
    """Whether a failure is a service's outage rather than the job's own.

    The archive unreachable (:class:`ArchiveUnavailableError`, not a refusal of the
    data), a Chroma server or a hosted embedding API that does not answer (its
    client's connection or timeout error, or the cause of the error raised), or
    answers that it is busy or down (429, 408, 425, 502, 503, 504): the batch is
    claimed again later and no attempt is counted. Anything else (a text
    an embedding refuses, a value the database refuses) is the job's.
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ArchiveUnavailableError):
            return True
        if {cls.__name__ for cls in type(error).__mro__} & _UNREACHABLE:
            return True
        if http_status(error) in _BUSY:
            return True
        if is_unreachable(error):
            return True
        error = error.__cause__
    return False


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
    #: The UTC day its turn happened (the day of ``turn_at``).
    day: date
    memory: Memory | None = None


class Batch:
    """Where each memory of a batch goes: dedupe decided by text, never by vector.

    Invariant: every turn listed in a memory's ``source_ids`` has its text in that
    memory's text. A turn is merged only into a memory with the same dedupe key
    (:func:`content_hash`: the same text, the same day), or into one written before
    days were part of the key whose text and day are the same; a turn that grew
    replaces its own memory (keyed by the turn's first message) and takes its ids
    back from the memories of its earlier ends; every archived message stays the
    source of exactly one memory.
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self.entries: dict[str, _Entry] = {}
        self.by_hash: dict[tuple[str, str], str] = {}
        self.writes: dict[str, Memory] = {}
        #: Stored memories' source ids to add and to remove.
        self.provenance: dict[str, tuple[set[int], set[int]]] = {}
        for row in rows:
            self.entries[row.id] = _Entry(
                row.id,
                row.session_id,
                row.content_hash,
                row.text,
                set(json.loads(row.source_ids)),
                row.turn_at.date(),
            )
            self.by_hash[(row.session_id, row.content_hash)] = row.id

    def _lookup(self, session_id: str, content_hash: str) -> _Entry | None:
        found = self.by_hash.get((session_id, content_hash))
        return None if found is None else self.entries[found]

    def _same(self, memory: Memory) -> _Entry | None:
        """A memory of the session that says the same thing of the same day.

        Found by any key it may be stored under (:func:`same_keys`), and checked
        against its own text and day: a memory written before days were part of
        the key is merged into only when its day is the turn's.
        """
        session_id = memory.job.session_id
        for key in same_keys(memory):
            entry = self._lookup(session_id, key)
            if (
                entry is not None
                and content_hash(entry.text, memory.kind, entry.day) == memory.content_hash
            ):
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
            memory.turn_at.date(),
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


def content_hash(text: str, kind: str, day: date | None) -> str:
    """The dedupe key of a memory text of a day: equal keys say the same thing that day.

    A raw turn is only ever a duplicate of the same text (spacing aside), so a merged
    turn's words are always in the memory that lists it. An extracted summary may
    also differ in case, punctuation and articles; a single other word, number,
    date, amount, identifier or name makes it a memory of its own. The same text
    on another day (the UTC day its turn happened) is a memory of its own too, dated
    by its turn, so a time window finds it.

    Args:
        text: The memory text.
        kind: ``"raw"`` or ``"extracted"``.
        day: The day its turn happened; ``None`` gives the key of memories written
            before days were part of it (a lookup only).
    """
    said = spaced(text) if kind == "raw" else " ".join(words(text))
    key = digest("text" if kind == "raw" else "words", said)
    return key if day is None else digest(key, day.isoformat())


def legacy_hash(text: str) -> str:
    """The content hash of memories written before :func:`content_hash` (a lookup only)."""
    return digest(normalise(text))


def same_keys(memory: Memory) -> tuple[str, str, str]:
    """The keys a stored memory saying what ``memory`` says may be found by.

    Its own key, and those of memories written by earlier versions (no day in the
    key; the legacy one): what is found by them is checked by text and day.
    """
    return (
        memory.content_hash,
        content_hash(memory.text, memory.kind, None),
        legacy_hash(memory.text),
    )


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
                self._park(job, read, "read the turn")
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
            turn_at = turn_time(turn)
            fresh.append(
                Memory(
                    id=memory_id,
                    job=job,
                    text=text,
                    kind=kind,
                    source_ids=[r.id for r in turn],
                    turn_at=turn_at,
                    content_hash=content_hash(text, kind, turn_at.date()),
                    context=context,
                    context_ids=[r.id for r in before if role_of(r.message) in ("human", "ai")],
                    context_at=None if context is None else turn_time(before),
                    turn_ids=[r.id for r in turn],
                    prefix_hashes=self._prefix_hashes(messages, _days(turn)),
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

    def _prefix_hashes(self, messages: Sequence[BaseMessage], days: set[date]) -> list[str]:
        """Content hashes of the raw memories that earlier jobs of this turn may have left.

        Each earlier end of a growing turn may have been stored (or merged into an
        identical memory) as the turn so far, dated by that end (one of ``days``),
        or by an earlier version without a day; the fuller memory takes its ids over.
        """
        hashes: list[str] = []
        for end in range(max(1, len(messages) - PREFIXES), len(messages)):
            prefix = messages[:end]
            text = format_turn(prefix, turn_prompts(prefix, self.language, self.prompts))
            if text:
                hashes.extend(content_hash(storable(text), "raw", day) for day in (*days, None))
        return hashes

    def _context(self, before: Sequence[TurnRow]) -> str | None:
        messages = [r.message for r in before if role_of(r.message) in ("human", "ai")]
        if not messages:
            return None
        text = format_turn(messages, turn_prompts(messages, self.language, self.prompts))
        return storable(text[:CONTEXT_CHARS]) if text else None

    def _park(self, job: Job, exc: BaseException, what: str) -> None:
        """Park a job that failed on its own data, so it holds up only its own session.

        Its attempt is counted and its error kept; it runs again after a backoff
        of at least :data:`UNREADABLE_PARK` seconds.
        """
        error = f"{type(exc).__name__}: {exc}"
        delay = max(backoff(self.retry_base_delay, job.attempts), UNREADABLE_PARK)
        logger.error(
            "cannot %s of job %d (session %r): %s; retry in %.0f s",
            what,
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
        """Write and commit a batch's memories; returns how many jobs it finished.

        A batch that fails on its data (not an outage: :func:`is_outage`) is
        stored again job by job, so the error stays with its job.
        """
        # Renew the leases right before writing: a job another worker claimed after
        # our lease ran out is its business now, not ours to write.
        held = self.queue.renew([m.job for m in fresh] + empty)
        fresh = [m for m in fresh if m.job.id in held]
        empty = [job for job in empty if job.id in held]
        try:
            return self._write(fresh, empty)
        except Exception as exc:
            if is_outage(exc):
                raise  # not the jobs' failure: the batch is claimed again later
            if len(fresh) + len(empty) == 1:
                self._park(fresh[0].job if fresh else empty[0], exc, "store the memory")
                return 0
            logger.warning(
                "storing a batch of %d jobs failed (%s: %s); storing them one by one",
                len(fresh) + len(empty),
                type(exc).__name__,
                exc,
            )
        return self._store_each(fresh, empty)

    def _store_each(self, fresh: Sequence[Memory], empty: Sequence[Job]) -> int:
        """Store a batch job by job: a job that fails is parked, alone.

        The jobs of a session run in order: once one fails, the session's later
        jobs of the batch are given back to wait for it (as :meth:`_process` does).
        """
        items = [(m.job, m) for m in fresh] + [(job, None) for job in empty]
        failed_sessions: set[str] = set()
        waiting: list[Job] = []
        finished = 0
        for job, memory in sorted(items, key=lambda item: item[0].id):
            if job.session_id in failed_sessions:
                waiting.append(job)
                continue
            try:
                finished += self._write([memory] if memory else [], [] if memory else [job])
            except Exception as exc:
                if is_outage(exc):
                    raise
                failed_sessions.add(job.session_id)
                self._park(job, exc, "store the memory")
        self.queue.release(waiting)
        return finished

    def _write(self, fresh: Sequence[Memory], empty: Sequence[Job]) -> int:
        """Dedupe, embed, index and commit memories of held jobs; how many jobs finished."""
        given = fresh
        # Copies: dedupe rewrites ids and provenance, and a failed batch is placed again.
        fresh = [replace(memory) for memory in given]
        jobs = [m.job for m in fresh] + list(empty)
        latest: dict[str, Memory] = {}
        for memory in fresh:  # a later job of a turn that grew supersedes an earlier one
            latest[memory.id] = memory
        writes, provenance, kept = (
            self._dedupe(list(latest.values())) if latest else ([], {}, set())
        )
        indexed: list[str] = []
        try:
            if writes:
                # Longest first, as sentence-transformers orders a call: an embedding
                # that batches texts in the order given pads each batch less.
                by_length = sorted(writes, key=lambda m: -len(m.text))
                vectors = self.embedding.embed_documents([m.text for m in by_length])
                model = model_name(self.embedding)
                for memory, vector in zip(by_length, vectors, strict=True):
                    memory.vector = vector
                    memory.model = model
                indexed = [m.id for m in writes]  # a failed upsert may have written some
                self.vectors.upsert(
                    indexed,
                    [m.vector for m in writes],
                    [m.text for m in writes],
                    [m.metadata() for m in writes],
                )
            self.backup.run(self.catalog.commit_plan(writes, provenance, jobs), write=True)
        except CommitRefusedError as refused:
            # Nothing was committed. The lost jobs are another worker's now; the rest
            # are placed again without them (where a turn goes depends on the batch).
            self._give_back(writes, refused.jobs)
            return self._write(
                [m for m in given if m.job.id not in refused.jobs],
                [job for job in empty if job.id not in refused.jobs],
            )
        except Exception as exc:
            if indexed and not is_outage(exc):
                self._restore_vectors(indexed)
            raise
        try:
            # A memory merged into another has no catalog row, and its job is gone with
            # our commit: a vector an earlier, interrupted run wrote for it is dropped.
            # Only then: a turn merged into its own stored memory (its summary did not
            # change as it grew), or stored beside it, leaves that memory's row in place.
            self.vectors.delete([m.id for m in fresh if m.id not in kept])
            if provenance:
                self._refresh_provenance(list(provenance))
        except Exception as exc:
            # Committed: the catalog is right, and search checks every vector's id
            # against it; storing the batch again would merge its turns twice.
            logger.warning(
                "a batch of %d jobs is stored, but Chroma was not brought in line (%s: %s); "
                "reindex() repairs it",
                len(jobs),
                type(exc).__name__,
                exc,
            )
        return len(jobs)

    def _restore_vectors(self, memory_ids: Sequence[str]) -> None:
        """Make the index agree with the catalog again after a commit that failed.

        The vectors of a failed commit are put back as the catalog holds them, or
        dropped if it holds none. Best effort: the job's next run writes them anyway.
        """
        try:
            rows = self.backup.run(self.catalog.fresh_plan(memory_ids), read_only=True)
            self._index_rows(list(rows.values()))
            self.vectors.delete([each for each in memory_ids if each not in rows])
        except Exception as exc:
            logger.warning("could not restore %d vectors: %s", len(memory_ids), exc)

    def _index_rows(self, rows: Sequence[Any]) -> None:
        """Write catalog rows into the vector index as the catalog holds them."""
        if not rows:
            return
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

    def _dedupe(
        self, fresh: Sequence[Memory]
    ) -> tuple[list[Memory], dict[str, tuple[set[int], set[int]]], set[str]]:
        """What the batch writes: memories to store, and provenance changes of stored ones.

        Also the ids of every memory the catalog holds once the batch commits: the
        stored ones it found (none is deleted) and those it writes.

        Only index lookups: the batch's turn ids and content hashes (its own, those
        of earlier versions, and those of its turns' earlier ends) against the catalog's
        unique keys; the work never depends on how many memories a session holds.
        """
        sessions = sorted({m.job.session_id for m in fresh})
        keys = sorted(
            {m.id for m in fresh} | {h for m in fresh for h in (*same_keys(m), *m.prefix_hashes)}
        )

        batch = Batch(self.backup.run(self.catalog.known_plan(sessions, keys), read_only=True))
        for memory in fresh:
            batch.place(memory)
        return list(batch.writes.values()), batch.provenance, set(batch.entries)

    def _give_back(self, writes: Sequence[Memory], lost: set[int]) -> None:
        """Make Chroma agree with the catalog after a commit refused for ``lost`` jobs.

        A vector of a lost job's memory is decided by what the database holds, never
        by the missing job row alone: a catalog row (the new owner's commit) is
        written back over our vector; no catalog row and no job means no commit can
        come, so our vector goes; a job still queued belongs to its new owner, who
        writes or drops that vector itself. The other vectors are put back as the
        catalog holds them; placing the batch again writes its own.
        """
        mine = [m for m in writes if m.job.id in lost]
        if mine:
            rows, queued = self.backup.run(self.catalog.refused_plan(mine))
            self._index_rows(rows)
            stored = {row.id for row in rows}
            self.vectors.delete(
                [m.id for m in mine if m.id not in stored and m.job.id not in queued]
            )
        self._restore_vectors([m.id for m in writes if m.job.id not in lost])

    def _refresh_provenance(self, memory_ids: Sequence[str]) -> None:
        rows = self.backup.run(self.catalog.provenance_plan(memory_ids), read_only=True)
        if rows:
            self.vectors.update_metadata(
                [row.id for row in rows],
                [{"source_ids": row.source_ids} for row in rows],
            )
        # No cache reset: search reads provenance fresh from the catalog (_fresh_rows).
