"""The archive database's tables, all derived from one base name.

``<name>`` holds the messages, ``<name>_parts`` the pieces of large ones,
``<name>_jobs`` the durable work queue, ``<name>_memories`` the catalog of long-term
memories (Chroma holds their vectors and is rebuilt from it), ``<name>_locks`` the
rows that serialise queue claims across processes, ``<name>_consolidation`` each
session's MEMORY.md and consolidation cursor, ``<name>_history_log`` the
consolidated batches (HISTORY.md), ``<name>_tiers`` the stores that derived tiers
keep data in (so ``forget`` reaches them from any process), ``<name>_forgets`` the
forgets that could not reach every store yet, and ``<name>_sessions`` each session's
owner (the user of its first write, for good) and the row that serialises its writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.schema import CreateColumn

logger = logging.getLogger(__name__)

#: MySQL's (and MariaDB's) limit on the length of a table, index or constraint name.
MAX_IDENTIFIER = 64

# Dialect keyword arguments of ``Table`` (typed ``**kw: Any`` by SQLAlchemy).
_MYSQL: dict[str, Any] = {
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mysql_engine": "InnoDB",
}
# Ids are never reused on SQLite either: cursors and caches rely on them growing.
_GROWING: dict[str, Any] = {"sqlite_autoincrement": True}


def _id() -> BigInteger:
    # SQLite only autoincrements an INTEGER PRIMARY KEY.
    return BigInteger().with_variant(Integer, "sqlite")


def _long_text() -> Text:
    return Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _timestamp() -> DateTime:
    return DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _ident() -> String:
    return String(255)


@dataclass(frozen=True)
class Tables:
    """The archive's tables."""

    messages: Table
    parts: Table
    jobs: Table
    memories: Table
    locks: Table
    consolidation: Table
    history_log: Table
    tiers: Table
    forgets: Table

    def scoped(self) -> tuple[Table, ...]:
        """The tables of per-session rows that ``forget`` deletes, besides messages and parts.

        Each has ``session_id`` and ``user_id`` columns; this is the one list of them.
        """
        return (self.jobs, self.memories, self.consolidation, self.history_log, self.sessions)

    def whole_session(self) -> tuple[Table, ...]:
        """Those of :meth:`scoped` whose rows summarise all of a session's messages.

        Their ``user_id`` is only the writer that queued the work, so ``forget``
        drops them for every session in scope, whoever they are tagged with; they
        are rebuilt from the messages that are left.
        """
        return (self.consolidation, self.history_log)

    sessions: Table


def build_tables(metadata: MetaData, name: str) -> Tables:
    """Define the archive's tables on ``metadata`` under the base name ``name``."""
    messages = Table(
        name,
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("session_id", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=True),
        Column("role", String(32), nullable=False),
        Column("message", _long_text(), nullable=False),
        Column("parts", Integer, nullable=False, default=0),
        Column("created_at", _timestamp(), nullable=False),
        Index(f"ix_{name}_session_id_id", "session_id", "id"),
        Index(f"ix_{name}_user_id", "user_id"),
        **_MYSQL,
        **_GROWING,
    )
    parts = Table(
        f"{name}_parts",
        metadata,
        Column("message_id", _id(), primary_key=True, autoincrement=False),
        Column("seq", Integer, primary_key=True, autoincrement=False),
        Column("data", _long_text(), nullable=False),
        **_MYSQL,
    )
    jobs = Table(
        f"{name}_jobs",
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("kind", String(32), nullable=False),
        Column("session_id", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=True),
        Column("last_message_id", BigInteger, nullable=False),
        Column("state", String(16), nullable=False, default="pending"),
        Column("attempts", Integer, nullable=False, default=0),
        Column("not_before", _timestamp(), nullable=False),
        Column("lease_until", _timestamp(), nullable=True),
        Column("worker", String(128), nullable=True),
        # A new random token per claim: a worker's commit, done, retry or release
        # counts only while the row still carries its token (see jobs.JobQueue).
        Column("lease_token", String(64), nullable=True),
        Column("last_error", Text, nullable=True),
        Column("created_at", _timestamp(), nullable=False),
        Index(f"ix_{name}_jobs_state_id", "state", "id"),
        Index(f"ix_{name}_jobs_session_id_id", "session_id", "id"),
        **_MYSQL,
        **_GROWING,
    )
    memories = Table(
        f"{name}_memories",
        metadata,
        Column("seq", _id(), primary_key=True, autoincrement=True),
        Column("id", String(64), nullable=False, unique=True),
        Column("session_id", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=True),
        Column("content_hash", String(64), nullable=False),
        Column("text", _long_text(), nullable=False),
        # A raw turn's previous turn, indexed for lexical search (answers often share
        # their words with the question that came before them) and shown with the
        # memory; ``context_ids`` are its archive ids (JSON). A row without them
        # (written by an older version) is searched and shown by its own text only.
        Column("context", Text, nullable=True),  # at most CONTEXT_CHARS characters
        # Lists of ids are LONGTEXT on MySQL: a memory that keeps absorbing repeated
        # turns lists them all, past TEXT's 64 KB.
        Column("context_ids", _long_text(), nullable=True),
        # When the context's turn happened (its own date: a session imported out of
        # order has a turn before it of a later date). None: an older version's row.
        Column("context_at", _timestamp(), nullable=True),
        Column("kind", String(16), nullable=False),
        # float32 bytes of the embedding: scoped dense search runs in-process,
        # since Chroma's filtered queries slow down as the collection grows.
        Column("vector", LargeBinary, nullable=True),
        # The embedding model that made ``vector`` (``model_name``): another model's
        # vectors are not compared with a query's. None: written by an older version.
        Column("model", String(191), nullable=True),
        Column("source_ids", _long_text(), nullable=False),
        Column("turn_at", _timestamp(), nullable=False),
        Column("created_at", _timestamp(), nullable=False),
        # What the memory states a value of ("iban", "price:widget"), and the newer
        # memory that states another value of it: the old one is kept, ranked after.
        Column("subject", String(191), nullable=True),
        Column("superseded_by", String(64), nullable=True),
        UniqueConstraint("session_id", "content_hash", name=f"uq_{name}_memories_hash"),
        Index(f"ix_{name}_memories_user_id_seq", "user_id", "seq"),
        Index(f"ix_{name}_memories_session_id_seq", "session_id", "seq"),
        Index(f"ix_{name}_memories_subject_u", "user_id", "subject"),
        Index(f"ix_{name}_memories_subject_s", "session_id", "subject"),
        Index(f"ix_{name}_memories_superseded", "superseded_by"),
        **_MYSQL,
        **_GROWING,
    )
    locks = Table(
        f"{name}_locks",
        metadata,
        Column("name", String(64), primary_key=True),
        **_MYSQL,
    )
    consolidation = Table(
        f"{name}_consolidation",
        metadata,
        Column("session_id", _ident(), primary_key=True),
        Column("user_id", _ident(), nullable=True),
        Column("cursor", BigInteger, nullable=False, default=0),
        Column("memory_md", _long_text(), nullable=False, default=""),
        Column("updated_at", _timestamp(), nullable=False),
        **_MYSQL,
    )
    history_log = Table(
        f"{name}_history_log",
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("session_id", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=True),
        Column("first_id", BigInteger, nullable=False),
        Column("last_id", BigInteger, nullable=False),
        Column("raw", Integer, nullable=False, default=0),
        Column("entry", _long_text(), nullable=False),
        Column("created_at", _timestamp(), nullable=False),
        UniqueConstraint("session_id", "first_id", name=f"uq_{name}_history_log_batch"),
        **_MYSQL,
        **_GROWING,
    )
    tiers = Table(
        f"{name}_tiers",
        metadata,
        # sha256 of kind and locator: one row per store, however often it is opened.
        Column("key", String(64), primary_key=True),
        Column("kind", String(64), nullable=False),
        Column("locator", Text, nullable=False),  # JSON: where the store lives
        Column("created_at", _timestamp(), nullable=False),
        **_MYSQL,
    )
    forgets = Table(
        f"{name}_forgets",
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("session_id", _ident(), nullable=True),
        Column("user_id", _ident(), nullable=True),
        Column("session_ids", _long_text(), nullable=False),  # JSON: the sessions in scope
        Column("unfinished", _long_text(), nullable=False),  # JSON: stores left, and why
        Column("created_at", _timestamp(), nullable=False),
        **_MYSQL,
        **_GROWING,
    )
    sessions = Table(
        f"{name}_sessions",
        metadata,
        Column("session_id", _ident(), primary_key=True),
        # NULL: a session created without a user, which stays user-less.
        Column("user_id", _ident(), nullable=True),
        Column("created_at", _timestamp(), nullable=False),
        **_MYSQL,
    )
    return Tables(
        messages=messages,
        parts=parts,
        jobs=jobs,
        memories=memories,
        locks=locks,
        consolidation=consolidation,
        history_log=history_log,
        tiers=tiers,
        forgets=forgets,
        sessions=sessions,
    )


def derived_identifiers(tables: Tables) -> list[str]:
    """Every table, index and named constraint name of the archive."""
    names = []
    for table in vars(tables).values():
        names.append(table.name)
        names.extend(index.name for index in table.indexes if isinstance(index.name, str))
        names.extend(c.name for c in table.constraints if isinstance(c.name, str))
    return names


@cache
def max_table_name_length() -> int:
    """The longest base name whose derived names all fit :data:`MAX_IDENTIFIER`.

    Computed from the schema itself (the longest is an index name such as
    ``ix_<name>_memories_session_id_seq``), so it follows any new index.
    """
    probe = "x"
    longest = max(map(len, derived_identifiers(build_tables(MetaData(), probe))))
    return MAX_IDENTIFIER - (longest - len(probe))


def ensure_columns(engine: Engine, tables: Iterable[Table]) -> list[str]:
    """Add the nullable columns that existing tables lack, and widen text columns (idempotent).

    ``create_all`` creates missing tables but never alters an existing one, so a
    database made by an earlier version lacks the columns added since, and on
    MySQL keeps a ``TEXT`` (64 KB) where this version declares a wider text type
    (:func:`widen_columns`). Several processes may start at once: a column another
    one has just added or widened counts as done.

    Args:
        engine: The database.
        tables: The tables as this version defines them.

    Returns:
        ``table.column`` of every column added or widened.

    Raises:
        RuntimeError: If a missing column is NOT NULL (it cannot be added to rows
            that already exist without a migration of their data).
    """
    added: list[str] = []
    widened: list[str] = []
    quote = engine.dialect.identifier_preparer
    inspector = inspect(engine)  # one for all tables: it caches what it read
    for table in tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            if not column.nullable:
                msg = f"{table.name} lacks the NOT NULL column {column.name}: migrate it by hand"
                raise RuntimeError(msg)
            ddl = CreateColumn(column).compile(dialect=engine.dialect)
            statement = f"ALTER TABLE {quote.format_table(table)} ADD COLUMN {ddl}"

            def present_now(table: Table = table, name: str = column.name) -> bool:
                return name in {c["name"] for c in inspect(engine).get_columns(table.name)}

            if not _alter(engine, statement, present_now):
                continue  # another process added it first
            logger.info("added the column %s.%s", table.name, column.name)
            added.append(f"{table.name}.{column.name}")
        if added:  # the indexes of the added columns (create_all skipped the table)
            _ensure_indexes(engine, table)
        widened.extend(widen_columns(engine, table))
    return added + widened


#: MySQL's text types, smallest first.
_MYSQL_TEXTS = ("TINYTEXT", "TEXT", "MEDIUMTEXT", "LONGTEXT")


def _text_rank(type_: Any, engine: Engine) -> int | None:
    """Where a column type stands in :data:`_MYSQL_TEXTS`; ``None`` if it is no MySQL text."""
    try:
        name = str(type_.compile(dialect=engine.dialect)).split()[0].upper()
    except Exception:  # a reflected type the dialect cannot render: leave it be
        return None
    return _MYSQL_TEXTS.index(name) if name in _MYSQL_TEXTS else None


def widen_columns(engine: Engine, table: Table) -> list[str]:
    """On MySQL, widen the text columns of ``table`` declared wider than the database's.

    A table made by an earlier version keeps ``TEXT`` (64 KB) for columns this
    version declares ``LONGTEXT`` (lists of ids that grow), and a longer value
    would be refused. ``ALTER TABLE ... MODIFY`` widens them, keeping every value;
    a column already wide enough (widened by another process) is left alone.

    Returns:
        ``table.column`` of every column widened.
    """
    if engine.dialect.name not in ("mysql", "mariadb"):
        return []  # SQLite's TEXT has no size
    quote = engine.dialect.identifier_preparer
    present = {column["name"]: column for column in inspect(engine).get_columns(table.name)}
    widened = []
    for column in table.columns:
        found = present.get(column.name)
        wanted = _text_rank(column.type, engine)
        if found is None or wanted is None:
            continue
        have = _text_rank(found["type"], engine)
        if have is None or have >= wanted:
            continue
        ddl = CreateColumn(column).compile(dialect=engine.dialect)
        statement = f"ALTER TABLE {quote.format_table(table)} MODIFY COLUMN {ddl}"

        def wide_now(name: str = column.name, wanted: int = wanted) -> bool:
            columns = {c["name"]: c for c in inspect(engine).get_columns(table.name)}
            now = _text_rank(columns[name]["type"], engine)
            return now is not None and now >= wanted

        if not _alter(engine, statement, wide_now):
            continue  # another process widened it first
        logger.info("widened the column %s.%s", table.name, column.name)
        widened.append(f"{table.name}.{column.name}")
    return widened


def _alter(engine: Engine, statement: str, done: Callable[[], bool]) -> bool:
    """Run an ``ALTER TABLE``; ``False`` if it failed because another process did it first.

    ``done`` tells whether the change is in place; a failure it does not explain
    is raised.
    """
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)
    except SQLAlchemyError:
        if not done():
            raise
        return False
    return True


def _ensure_indexes(engine: Engine, table: Table) -> None:
    """Create the indexes of ``table`` that the database lacks (idempotent)."""
    present = {index["name"] for index in inspect(engine).get_indexes(table.name)}
    for index in table.indexes:
        if index.name in present:
            continue
        try:
            index.create(engine)
        except SQLAlchemyError:
            if index.name not in {i["name"] for i in inspect(engine).get_indexes(table.name)}:
                raise
            continue  # another process created it first
        logger.info("added the index %s", index.name)
