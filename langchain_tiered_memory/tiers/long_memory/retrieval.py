"""Search over one scope: CJK-aware BM25 fused with dense similarity, and a retriever.

Small scopes are searched exactly, in process, from the vectors kept in the
catalog. A scope larger than ``exact_limit`` asks the vector index (Chroma's HNSW,
filtered by the scope) for its nearest memories instead, so its vectors are never
loaded into the process. Either way every id is checked against the scope's
catalog rows before it is shown: nothing leaks from another scope.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever

from langchain_tiered_memory.core.encoding import well_formed
from langchain_tiered_memory.core.validation import check_int, time_window, validate_id
from langchain_tiered_memory.storage.base import Plan
from langchain_tiered_memory.text.embeddings import (
    OtherModelWarning,
    knows,
    model_name,
    similarity_floor,
)
from langchain_tiered_memory.text.lexical import BM25Index, cjk_share, fuse, tokenize
from langchain_tiered_memory.text.similarity import similarities, unit_rows
from langchain_tiered_memory.tiers.long_memory.catalog import (
    LOOKUP_CHUNK,
    Catalog,
    Version,
    chronology,
    context_ids,
    from_bytes,
    shown,
)
from langchain_tiered_memory.tiers.long_memory.vectors import VectorIndex

logger = logging.getLogger(__name__)

Scope = Literal["session", "user"]
#: Scopes of at most this many memories are searched exactly in process; larger
#: ones ask the vector index. Measured with ``python -m benchmarks.bench_long_memory``
#: (110k memories, embedded Chroma): a filtered HNSW query costs more than the exact
#: dot products of a 10,000-memory scope (about 1 ms), so the index pays off by the
#: memory it saves (a scope's float32 vectors, 30 MB at 20,000 x 384), not by speed.
EXACT_LIMIT = 20_000
#: A time window of a scope searched through the vector index is scored exactly,
#: from its memories' catalog vectors, when it holds at most this many (read by
#: id, about 1.5 kB each at 384 dimensions). A larger window asks the index for
#: ever more of the nearest until it yields enough of its own.
WINDOW_EXACT = 2_000
#: Scope indexes kept in process (least recently searched dropped first).
CACHED_SCOPES = 64
#: Seconds between two counts of a scope's models while it holds another model's
#: rows (a reindex elsewhere rewrites rows in place, unseen by the scope's version).
MODELS_RECHECK = 10.0
#: How the memories of another model are embedded again.
REINDEX = "call reindex() (CLI: tiered-memory --language <the tier's language> reindex)"
#: The cosine above which a stored vector is what the model makes of its text.
SAME_MODEL = 0.99
#: Word overlap (Jaccard, numbers masked) from which two results count as near-duplicates.
NEAR_DUPLICATE = 0.6
#: How many of the best results are compared for near-duplicates (pairwise).
NEAR_POOL = 60
#: Near-duplicates whose scores are within this share of each other count as tied:
#: the newest goes first. A query naming one value (an invoice number, the old
#: price) scores that memory further ahead, and it stays ahead.
RECENCY_MARGIN = 0.1
#: Links followed from a superseded memory to the one that stands now.
SUPERSEDE_HOPS = 8
#: A ``since``/``until`` bound: a datetime, a date, or an ISO (or LoCoMo) date string.
TimeBound = datetime | date | str | None
_LABEL = re.compile(r"^[^:\n]{1,40}: ", re.MULTILINE)


@dataclass
class ScopeIndex:
    """A scope's cached BM25 index and rows (and vectors, when searched exactly).

    One index is shared by every thread that searches its scope, and a search
    brings it up to date in place: read it while holding ``lock`` (``add`` takes it).
    """

    #: The catalog's version of the scope the index holds (none yet: never read).
    version: Version = field(default_factory=lambda: Version(-1, -1, -1))
    exact: bool = True
    bm25: BM25Index = field(default_factory=BM25Index)
    rows: dict[str, Any] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    vectors: list[bytes | None] = field(default_factory=list)
    _matrix: Any = None
    position: dict[str, int] = field(default_factory=dict)
    #: How many of the rows each embedding model embedded (``None``: written
    #: before the catalog recorded models).
    models: Counter[str | None] = field(default_factory=Counter)
    #: By the search's model: the rows another model embedded (see ``foreign``).
    foreign: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Read again, whole, at the next search (a reindex elsewhere changed rows in place).
    stale: bool = False
    #: When its models were last counted in the catalog (``time.monotonic()``).
    models_counted: float = -MODELS_RECHECK
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def reset(self, exact: bool) -> None:
        """Forget every row (hold ``lock``): the scope is about to be read again, whole.

        New containers, not cleared ones: a reader of the old ``rows`` keeps them.
        """
        self.exact = exact
        self.bm25 = BM25Index()
        self.rows = {}
        self.ids = []
        self.vectors = []
        self.position = {}
        self.models = Counter()
        self.foreign = {}
        self._matrix = None
        self.stale = False

    def add(self, rows: Sequence[Any]) -> None:
        """Index rows; a row already indexed (a turn that grew) replaces its old version."""
        with self.lock:
            self._add(rows)

    def _add(self, rows: Sequence[Any]) -> None:
        for row in rows:
            vector = getattr(row, "vector", None) if self.exact else None
            old = self.rows.get(row.id)
            if old is None:
                self.position[row.id] = len(self.ids)
                self.ids.append(row.id)
                self.vectors.append(vector)
            else:
                self.bm25.remove(row.id, shown(old))
                self.vectors[self.position[row.id]] = vector
                self.models[old.model] -= 1
            self.bm25.add(row.id, shown(row))
            self.rows[row.id] = row
            self.models[row.model] += 1
        self.models = +self.models  # drops the models no row has any more
        self.foreign = {}
        self._matrix = None

    def not_made_by(self, model: str) -> tuple[frozenset[str], set[str | None]]:
        """The ids of the rows ``model`` did not embed (or may not have), and their models.

        Unnamed rows (``None``) count as another model's.
        """
        with self.lock:
            others = {name for name in self.models if name != model}
            found = self.foreign.get(model)
            if found is None:
                found = frozenset(i for i, row in self.rows.items() if row.model in others)
                self.foreign[model] = found
            return found, others

    def matrix(self) -> Any:
        """The scope's unit vectors as a float32 matrix; ``None`` if any is missing."""
        if self._matrix is None and self.vectors:
            present = [v for v in self.vectors if v is not None]
            if len(present) == len(self.vectors):
                self._matrix = unit_rows([from_bytes(v) for v in present])
        return self._matrix


@dataclass(frozen=True)
class TimeWindow:
    """When the turns of the memories searched happened (bounds inclusive)."""

    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def of(cls, since: TimeBound, until: TimeBound) -> TimeWindow:
        """A validated window; a bare-date ``until`` includes that whole day.

        Raises:
            InvalidSessionDateError: A bound is not a date, or ``since`` is after ``until``.
        """
        return cls(*time_window(since, until))

    @property
    def bounded(self) -> bool:
        """Whether it excludes anything."""
        return self.since is not None or self.until is not None

    def holds(self, row: Any) -> bool:
        """Whether a memory's ``turn_at`` falls in the window."""
        return (self.since is None or row.turn_at >= self.since) and (
            self.until is None or row.turn_at <= self.until
        )


@dataclass(frozen=True)
class ResolvedScope:
    """A validated scope: its SQL condition, cache key and metadata filter values."""

    condition: Any
    key: tuple[str, str]
    session_id: str | None
    user_id: str | None

    def holds(self, row: Any) -> bool:
        """Whether a catalog row belongs to this scope (the SQL condition, in Python)."""
        return (self.session_id is None or row.session_id == self.session_id) and (
            self.user_id is None or row.user_id == self.user_id
        )

    def heads_plan(
        self, catalog: Catalog, rows: Sequence[Any], window: TimeWindow
    ) -> Plan[dict[str, Any]]:
        """For each superseded row, the memory of this scope that stands in its place.

        The ``superseded_by`` links are followed (at most :data:`SUPERSEDE_HOPS`)
        while they stay in the scope and the time window; a link to a memory that
        is gone (forgotten) or outside them ends the walk.
        """
        current = {row.id: row.superseded_by for row in rows if row.superseded_by}
        heads: dict[str, Any] = {}
        for _ in range(SUPERSEDE_HOPS):
            if not current:
                break
            fetched = yield from self.fresh_plan(catalog, sorted(set(current.values())))
            following: dict[str, str] = {}
            for origin, target in current.items():
                row = fetched.get(target)
                if row is None or not window.holds(row):
                    continue
                heads[origin] = row
                if row.superseded_by and row.superseded_by != origin:
                    following[origin] = row.superseded_by
            current = following
        return heads

    def fresh_plan(self, catalog: Catalog, ids: Sequence[str]) -> Plan[dict[str, Any]]:
        """The scope's rows among ``ids``, as they are now.

        Looked up by id alone, then kept if they are the scope's: with the scope's
        condition in SQL, SQLite would scan a large scope's index instead.
        """
        rows = yield from catalog.fresh_plan(ids)
        return {doc_id: row for doc_id, row in rows.items() if self.holds(row)}


class MemorySearch:
    """Searches the catalog's scopes: BM25 in process, dense exact or from the index.

    Args:
        catalog: The memory catalog.
        vectors: The vector index asked for scopes above ``exact_limit``.
        exact_limit: The scope size up to which dense search is exact, in process.
    """

    def __init__(self, catalog: Catalog, vectors: VectorIndex, exact_limit: int) -> None:
        self.catalog = catalog
        self.vectors = vectors
        self.exact_limit = exact_limit
        self._scopes: OrderedDict[tuple[str, str], ScopeIndex] = OrderedDict()
        self._lock = threading.Lock()
        self._other_models = OtherModelWarning(REINDEX)
        # (scope, model) whose unnamed rows another model made: not probed again.
        self._not_made: set[tuple[tuple[str, str], str]] = set()

    def clear(self) -> None:
        """Drop every cached scope index."""
        with self._lock:
            self._scopes.clear()

    def resolve(self, scope: str, session_id: str | None, user_id: str | None) -> ResolvedScope:
        """Validate a scope (no unscoped search exists)."""
        c = self.catalog.table.c
        if scope == "session":
            if session_id is None:
                msg = "scope='session' needs a session_id"
                raise ValueError(msg)
            session_id = validate_id(session_id, "session_id")
            condition = c.session_id == session_id
            if user_id is not None:
                user_id = validate_id(user_id, "user_id")
                condition = condition & (c.user_id == user_id)
            key = ("session", f"{session_id}\x1f{user_id or ''}")
            return ResolvedScope(condition, key, session_id, user_id)
        if scope == "user":
            if user_id is None:
                msg = "scope='user' needs a user_id"
                raise ValueError(msg)
            user_id = validate_id(user_id, "user_id")
            return ResolvedScope(c.user_id == user_id, ("user", user_id), None, user_id)
        msg = f"scope must be 'session' or 'user', got {scope!r}"
        raise ValueError(msg)

    def scope_index(self, resolved: ResolvedScope) -> ScopeIndex:
        """The scope's index, brought up to date with the catalog.

        The cache's lock guards the mapping only. A scope is brought up to date
        under its own lock, so one slow scope never holds up the others, and
        from a version read under that lock together with its rows, so the index
        only moves forward and holds exactly the rows its version counts.
        """
        backup, condition = self.catalog.backup, resolved.condition
        version = backup.run(self.catalog.version_plan(condition))
        with self._lock:
            index = self._scopes.get(resolved.key)
            if index is None:
                index = ScopeIndex()
                self._scopes[resolved.key] = index
            self._scopes.move_to_end(resolved.key)
            while len(self._scopes) > CACHED_SCOPES:
                self._scopes.popitem(last=False)
        with index.lock:
            if index.version == version and not index.stale:
                return index
            after = 0 if index.stale else max(index.version.top, 0)
            version, rows = backup.run(
                self.catalog.snapshot_plan(condition, after, self.exact_limit)
            )
            if index.version == version and not index.stale:
                return index  # another search brought it here meanwhile
            exact = version.size <= self.exact_limit
            if after and index.exact == exact and follows(index, version, rows):
                index.add(rows)
                index.version = version
                return index
            if after:  # memories were deleted (or the scope crossed exact_limit): read it whole
                version, rows = backup.run(
                    self.catalog.snapshot_plan(condition, 0, self.exact_limit)
                )
                exact = version.size <= self.exact_limit
            index.reset(exact)
            index.add(rows)
            index.version = version
            return index

    def search(
        self,
        query: str,
        *,
        session_id: str | None,
        user_id: str | None,
        scope: Scope,
        k: int,
        embedding: Embeddings,
        dense_weight: float,
        since: TimeBound = None,
        until: TimeBound = None,
    ) -> list[tuple[Any, float]]:
        """The ``k`` best ``(catalog row, score)`` pairs of a scope for ``query``.

        Only memories whose turn happened between ``since`` and ``until`` count.
        A memory superseded by a newer one of the scope (same subject, or an
        extractor's ``UPDATE``) is preceded by the one that stands now.
        """
        if not isinstance(query, str):
            msg = f"query must be a str, got {type(query).__name__}"
            raise TypeError(msg)
        # Every search enters here (search, asearch, retrievers, the extractor's
        # nearest memories): a lone surrogate would break the embedding's tokenizer.
        query = well_formed(query)
        check_int("k", k)
        window = TimeWindow.of(since, until)
        resolved = self.resolve(scope, session_id, user_id)
        if cjk_share(query) > 0.3 and not knows(embedding, "zh"):
            dense_weight = 0.0  # a model that knows no Chinese would only add noise
        backup = self.catalog.backup
        for _ in range(2):
            index, ranked = self.ranked(query, resolved, k, embedding, dense_weight, window)
            ids = [doc_id for doc_id, _ in ranked]
            rows = backup.run(resolved.fresh_plan(self.catalog, ids), read_only=True)
            if not dense_weight or not remodelled(index, rows):
                break
            # Another process embedded the scope again in place (a reindex with
            # another model): its rows, cached with their old models, are read again.
            self.reload(resolved, index)
        found = [
            (rows[doc_id], score)
            for doc_id, score in ranked
            if doc_id in rows and window.holds(rows[doc_id])
        ]
        ordered = newer_first(found, values(query))
        if any(row.superseded_by for row, _ in ordered[:k]):
            heads = backup.run(
                resolved.heads_plan(self.catalog, [row for row, _ in ordered[:k]], window),
                read_only=True,
            )
            ordered = updates_first(ordered, heads)
        return ordered[:k]

    def ranked(
        self,
        query: str,
        resolved: ResolvedScope,
        k: int,
        embedding: Embeddings,
        dense_weight: float,
        window: TimeWindow,
    ) -> tuple[ScopeIndex, list[tuple[str, float]]]:
        """The scope's index, and the ids of its best memories for ``query`` with their scores.

        A few more than ``k``: a correction ranked just below the value it corrects
        moves up (see :func:`newer_first`).
        """
        index = self.scope_index(resolved)
        if dense_weight:
            index, _ = self.foreign_rows(resolved, index, embedding)
        pool = max(6 * k, 60)
        # The index is read under its lock (another search may be adding to it),
        # never while the query is embedded or Chroma and the catalog are asked.
        with index.lock:
            allowed: set[str] | None = None
            if window.bounded:  # the cached rows hold turn_at: filtered in process
                allowed = {doc_id for doc_id, row in index.rows.items() if window.holds(row)}
            if not index.rows or allowed == set():
                return index, []
            if allowed is None:
                lexical = dict(index.bm25.search(query, pool))
            else:
                hits = index.bm25.search(query, len(index.rows))
                lexical = dict([(i, score) for i, score in hits if i in allowed][:pool])
        dense: dict[str, float] = {}
        foreign: frozenset[str] = frozenset()
        if dense_weight:
            vector = query_vector(embedding, query)
            exact: dict[str, float] | None = None
            with index.lock:  # as of now: rows may have come since
                foreign, _ = index.not_made_by(model_name(embedding))
                if index.exact:
                    exact = self.exact_dense(index, vector, pool, lexical, allowed, foreign)
            dense = (
                self.index_dense(index, resolved, vector, pool, lexical, allowed, foreign)
                if exact is None
                else exact
            )
        fused = fuse(
            dense,
            lexical,
            dense_weight=dense_weight,
            floor=similarity_floor(embedding),
            words_only=foreign,
        )
        ranked = fused[: k + max(k, 10)]
        if not ranked:  # nothing matches at all: the newest memories
            with index.lock:
                newest = [i for i in reversed(index.ids) if allowed is None or i in allowed]
            ranked = [(doc_id, 0.0) for doc_id in newest[:k]]
        return index, ranked

    def foreign_rows(
        self, resolved: ResolvedScope, index: ScopeIndex, embedding: Embeddings
    ) -> tuple[ScopeIndex, frozenset[str]]:
        """The scope's index, and the ids of its rows another model embedded.

        Their vectors cannot be compared with the query's (two models of one size
        would rank by noise): they are ranked by their words alone until
        ``reindex()`` embeds them again, and a warning says so once per scope.
        Rows written before the catalog recorded models are this model's if it
        remakes the vectors of the oldest and the newest of them: they are then
        named so in the catalog, once.
        """
        model = model_name(embedding)
        if index.models[None] and (resolved.key, model) not in self._not_made:
            index = self.adopt_unnamed(resolved, index, embedding, model)
        found, others = index.not_made_by(model)
        if found and self.remodelled_elsewhere(resolved, index):
            index = self.reload(resolved, index)
            found, others = index.not_made_by(model)
        if found:
            where = f"the {resolved.key[0]} {resolved.key[1].split(chr(31))[0]!r}"
            self._other_models(len(found), where, others, model)
        return index, found

    def remodelled_elsewhere(self, resolved: ResolvedScope, index: ScopeIndex) -> bool:
        """Whether the scope's rows now count other models than the cached ones.

        A reindex elsewhere rewrites rows in place, unseen by the scope's version.
        Asked while a scope holds another model's rows, whose words alone rank
        them, so a search may never reach them to see it (see :func:`remodelled`);
        at most once per :data:`MODELS_RECHECK` seconds, as the count reads the
        whole scope.
        """
        now = time.monotonic()
        with index.lock:
            if now - index.models_counted < MODELS_RECHECK:
                return False
            index.models_counted = now
        counts = self.catalog.backup.run(self.catalog.models_plan(resolved.condition))
        with index.lock:
            cached = {name: n for name, n in index.models.items() if n}
            settled = sum(counts.values()) == index.version.size  # no memory came meanwhile
        return settled and counts != cached

    def reload(self, resolved: ResolvedScope, index: ScopeIndex) -> ScopeIndex:
        """The scope's index read again from the catalog, whole."""
        with index.lock:
            index.stale = True
        return self.scope_index(resolved)

    def adopt_unnamed(
        self, resolved: ResolvedScope, index: ScopeIndex, embedding: Embeddings, model: str
    ) -> ScopeIndex:
        """Name the scope's unnamed rows ``model`` if it made them (two embeddings, once)."""
        with index.lock:
            unnamed = sorted(
                (row for row in index.rows.values() if row.model is None), key=lambda row: row.seq
            )
        if not unnamed:  # named meanwhile
            return index
        # The shortest of the oldest and of the newest few: a row of the earliest
        # model and one of the latest, embedded quickly.
        probes = {
            min(group, key=lambda row: len(row.text)).id for group in (unnamed[:3], unnamed[-3:])
        }
        backup = self.catalog.backup
        rows = backup.run(resolved.fresh_plan(self.catalog, sorted(probes)), read_only=True)
        if len(rows) < len(probes) or any(row.model is not None for row in rows.values()):
            return self.reload(resolved, index)  # forgotten or named meanwhile: read it again
        stored = [row for row in rows.values() if row.vector is not None]
        made = embedding.embed_documents([row.text for row in stored]) if stored else []
        if stored and all(
            len(vector) == len(row.vector) // 4
            and float(similarities(unit_rows([from_bytes(row.vector)]), unit_rows([vector])[0])[0])
            > SAME_MODEL
            for row, vector in zip(stored, made, strict=True)
        ):
            backup.run(self.catalog.name_plan(resolved.condition, model), write=True)
            return self.reload(resolved, index)
        self._not_made.add((resolved.key, model))
        return index

    def exact_dense(
        self,
        index: ScopeIndex,
        vector: Sequence[float],
        pool: int,
        lexical: dict[str, float],
        allowed: set[str] | None = None,
        foreign: frozenset[str] = frozenset(),
    ) -> dict[str, float] | None:
        """Cosine similarity of the best ``pool`` memories and of every lexical hit, exactly.

        From the scope's cached vectors (hold ``index.lock``). With ``allowed`` (a
        time window), only those memories are candidates; ``foreign`` memories
        (another model's vectors) never are. ``None`` when some vectors are not in
        the catalog: the vector index is asked instead (:meth:`index_dense`).
        """
        if foreign:  # this model's vectors only
            kept: list[tuple[str, bytes]] = []
            for i in index.ids:
                stored = index.vectors[index.position[i]]
                if stored is not None and i not in foreign and (allowed is None or i in allowed):
                    kept.append((i, stored))
            if not kept:
                return {}
            sims = similarities(unit_rows([from_bytes(v) for _, v in kept]), unit_rows([vector])[0])
            return {i: float(sim) for (i, _), sim in zip(kept, sims, strict=True)}
        matrix = index.matrix()
        if matrix is None:
            return None
        import numpy as np

        query = unit_rows([vector])[0]
        sims = similarities(matrix, query)
        if allowed is not None:
            outside = np.fromiter((i not in allowed for i in index.ids), bool, len(index.ids))
            sims = np.where(outside, -np.inf, sims)
        best = np.argpartition(-sims, min(pool, len(sims)) - 1)[:pool]
        dense = {index.ids[i]: float(sims[i]) for i in best if np.isfinite(sims[i])}
        position = index.position
        dense.update((i, float(sims[position[i]])) for i in lexical if i in position)
        return dense

    def index_dense(
        self,
        index: ScopeIndex,
        resolved: ResolvedScope,
        vector: Sequence[float],
        pool: int,
        lexical: dict[str, float],
        allowed: set[str] | None = None,
        foreign: frozenset[str] = frozenset(),
    ) -> dict[str, float]:
        """Cosine similarity of the vector index's nearest memories and of every lexical hit.

        The index's hits are kept only if they are the scope's own (and ``allowed``,
        and not ``foreign``); the lexical hits' similarities come from their catalog
        vectors. A time window (``allowed``) of at most :data:`WINDOW_EXACT`
        memories is scored exactly from their catalog vectors instead, and so is
        the rest of a larger one when the index runs out before it yields ``pool``
        of the window's (HNSW does not reach every memory): a window holding ``k``
        memories yields ``k``, the best of the window, however far the rest of the
        scope lies nearer the query. Called without ``index.lock``: a slow index or
        a repair of it must not hold up the scope's other searches.
        """
        dense: dict[str, float] = {}
        complete = False  # every memory of the window scored from the catalog
        if allowed is not None and len(allowed) <= WINDOW_EXACT:
            candidates = sorted(allowed - foreign)
            found = self.scored(resolved, vector, candidates)
            dense = highest(found, pool)
            dense.update((i, found[i]) for i in lexical if i in found)
            # Memories older than the catalog's vectors: the index has theirs.
            complete = len(found) == len(candidates)
        if not complete:
            try:
                hits = self.index_hits(index, resolved, vector, pool, allowed, foreign)
            except Exception as exc:
                # The index is unreachable, or refuses the query (another model's size):
                # the lexical hits are still compared with their catalog vectors below,
                # which names a change of model size instead of hiding it.
                logger.warning("dense search unavailable (%s); using the lexical hits only", exc)
            else:
                if allowed is not None and len(allowed) > WINDOW_EXACT and len(hits) < pool:
                    # HNSW does not reach every memory: the rest of a large window
                    # is read from the catalog, so the window still yields its best.
                    rest = sorted(allowed - foreign - hits.keys())
                    hits.update(highest(self.scored(resolved, vector, rest), pool - len(hits)))
                dense = {**hits, **dense}
        missing = [i for i in lexical if i not in dense and i not in foreign]
        dense.update(self.scored(resolved, vector, missing))
        return dense

    def index_hits(
        self,
        index: ScopeIndex,
        resolved: ResolvedScope,
        vector: Sequence[float],
        pool: int,
        allowed: set[str] | None,
        foreign: frozenset[str],
    ) -> dict[str, float]:
        """The vector index's ``pool`` nearest memories of the scope (``allowed``, not ``foreign``).

        Without a window, one query of ``pool``. With one, the nearest memories
        outside it are left out: more are asked for (four times as many each
        time) until ``pool`` of the window's are found or the index has no more.
        """
        size = len(index.rows)
        scoped = index.rows if allowed is None else allowed  # membership only
        wanted = pool if allowed is None else 4 * pool
        while True:
            asked = min(wanted, size)
            hits = self.vectors.query(vector, asked, resolved.session_id, resolved.user_id)
            dense = {i: score for i, score in hits if i in scoped and i not in foreign}
            if allowed is None or len(dense) >= pool or asked >= size or len(hits) < asked:
                return dense
            wanted *= 4

    def scored(
        self, resolved: ResolvedScope, vector: Sequence[float], ids: Sequence[str]
    ) -> dict[str, float]:
        """Cosine similarity of memories by id, from their catalog vectors.

        Read :data:`~.catalog.LOOKUP_CHUNK` at a time (a window's may be many),
        so only one chunk's vectors are held at once.
        """
        query = unit_rows([vector])[0]
        scores: dict[str, float] = {}
        for start in range(0, len(ids), LOOKUP_CHUNK):
            chunk = ids[start : start + LOOKUP_CHUNK]
            rows = self.catalog.backup.run(resolved.fresh_plan(self.catalog, chunk), read_only=True)
            stored = [row for row in rows.values() if row.vector is not None]
            if stored:
                sims = similarities(unit_rows([from_bytes(row.vector) for row in stored]), query)
                scores.update((row.id, float(s)) for row, s in zip(stored, sims, strict=True))
        return scores


def highest(scores: dict[str, float], n: int) -> dict[str, float]:
    """The ``n`` highest of ``scores`` (equal scores by id, as :func:`fuse` ranks them)."""
    return dict(sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:n])


def document(row: Any, score: float) -> Document:
    """A search result as a LangChain ``Document`` (its metadata: id, scope, provenance)."""
    return Document(
        page_content=shown(row),
        id=row.id,
        metadata={
            "id": row.id,
            "session_id": row.session_id,
            "user_id": row.user_id,
            "kind": row.kind,
            "source_ids": json.loads(row.source_ids),
            "context_ids": context_ids(row) or [],
            "context_chars": 0 if context_ids(row) is None else len(row.context),
            "context_at": None
            if context_ids(row) is None or row.context_at is None
            else row.context_at.isoformat(),
            "turn_at": row.turn_at.isoformat(),
            "subject": row.subject,
            "superseded_by": row.superseded_by,
            "score": score,
        },
    )


def query_vector(embedding: Embeddings, query: str) -> list[float]:
    """The query's vector: a query of several lines also leans on its last line.

    A query of several lines is a conversation, or a message with its question at
    the end; the last line is what is asked now, the rest its context. The vector
    is the normalised sum of the whole query's and the last line's, so a memory
    close to both ranks first. MADial-zh dev with multilingual-e5 (its queries are
    whole dialogues): recall@5 0.624 -> 0.647, and 0.64-0.66 across floors
    0.78-0.84 and dense weights 0.6-0.8, not one lucky setting. A one-line query
    (LoCoMo's, LongMemEval's) costs one embedding, as before.
    """
    whole = embedding.embed_query(query)
    lines = [line for line in query.splitlines() if line.strip()]
    if len(lines) < 2:
        return whole
    last = embedding.embed_query(lines[-1])
    both = unit_rows([whole, last]).sum(axis=0)
    return [float(x) for x in unit_rows([both])[0]]


def follows(index: ScopeIndex, version: Version, rows: Sequence[Any]) -> bool:
    """Whether ``rows`` (past the index's highest seq) are all that changed since its version.

    Each is a new memory or a grown turn (its row re-inserted under a new seq, same
    id); the count and the sum of the seqs must then come out as ``version``'s.
    Otherwise memories were deleted, or a lower seq committed late.
    """
    cached = index.rows
    added = sum(1 for row in rows if row.id not in cached)
    moved = sum(cached[row.id].seq for row in rows if row.id in cached)
    total = index.version.total + sum(row.seq for row in rows) - moved
    return index.version.size + added == version.size and total == version.total


def remodelled(index: ScopeIndex, fresh: dict[str, Any]) -> bool:
    """Whether some of the ``fresh`` catalog rows name another model than the cached ones.

    A reindex rewrites vectors and models in place, unseen by the scope's version.
    """
    cached = index.rows
    return any(
        doc_id in cached and cached[doc_id].model != row.model for doc_id, row in fresh.items()
    )


def skeleton(text: str) -> set[str]:
    """A memory's words with every number masked: what stays when a value changes.

    Line labels (``User:``, ``AI:``, speaker names) are left out: every raw turn has them.
    """
    words = tokenize(_LABEL.sub("", text))
    return {"#" if any(ch.isdigit() for ch in token) else token for token in words}


def values(text: str) -> frozenset[str]:
    """The numbers and identifiers of a text (its tokens with a digit)."""
    tokens = tokenize(_LABEL.sub("", text))
    return frozenset(token for token in tokens if any(c.isdigit() for c in token))


def newer_first(
    results: Sequence[tuple[Any, float]], named: frozenset[str] = frozenset()
) -> list[tuple[Any, float]]:
    """Results where tied near-duplicates (the same words, other values) are newest first.

    A group of near-duplicates keeps the places and scores its members earned; each
    place goes to the newest member (by when its turn happened, then archive
    order: :func:`~.catalog.chronology`, as superseding orders them) among those
    scoring within :data:`RECENCY_MARGIN` of the best one left, so a correction
    ("the price is now 1250") outranks the value it corrects. A group is left as
    ranked when the query ``named`` a value that only some of its members hold:
    asked about invoice 1234, the memory of invoice 1235 is no tie.
    """
    skeletons = [skeleton(row.text) for row, _ in results[:NEAR_POOL]]
    group = list(range(len(skeletons)))
    for i, a in enumerate(skeletons):
        if group[i] != i or not a:
            continue
        for j in range(i + 1, len(skeletons)):
            b = skeletons[j]
            if group[j] == j and b and len(a & b) >= NEAR_DUPLICATE * len(a | b):
                group[j] = i
    ordered = list(results)
    for leader in set(group):
        members = [i for i, g in enumerate(group) if g == leader]
        if len(members) < 2:
            continue
        if named and len({bool(named & values(results[i][0].text)) for i in members}) > 1:
            continue
        left = list(members)  # best first
        for slot in members:
            best = results[left[0]][1]
            tied = [i for i in left if results[i][1] >= best - RECENCY_MARGIN * abs(best)]
            pick = max(tied, key=lambda i: chronology(results[i][0]))
            left.remove(pick)
            ordered[slot] = (results[pick][0], results[slot][1])
    return ordered


def updates_first(
    results: Sequence[tuple[Any, float]], heads: dict[str, Any]
) -> list[tuple[Any, float]]:
    """Results where each superseded memory comes right after the memory standing now.

    The standing memory takes the superseded one's place (and score) unless it
    ranked higher already; the superseded one stays, below it, with its provenance.
    """
    ordered: list[tuple[Any, float]] = []
    placed: set[str] = set()
    for row, score in results:
        head = heads.get(row.id)
        if head is not None and head.id not in placed:
            ordered.append((head, score))
            placed.add(head.id)
        if row.id not in placed:
            ordered.append((row, score))
            placed.add(row.id)
    return ordered


class LongMemoryRetriever(BaseRetriever):
    """A retriever over one scope of a :class:`ChromaLongMemory`.

    ``k``, ``since`` and ``until`` may also be passed per call:
    ``retriever.invoke(query, k=3, since="2023-05-01")``.
    """

    long_memory: Any
    session_id: str | None = None
    user_id: str | None = None
    scope: Scope = "session"
    k: int = 10
    since: TimeBound = None
    until: TimeBound = None

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "scope": self.scope,
            "k": kwargs.get("k", self.k),
            "since": kwargs.get("since", self.since),
            "until": kwargs.get("until", self.until),
        }

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return self.long_memory.search(query, **self._options(kwargs))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return await self.long_memory.asearch(query, **self._options(kwargs))
