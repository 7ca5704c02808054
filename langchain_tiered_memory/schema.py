"""The archive database's tables, all derived from one base name.

``<name>`` holds the messages, ``<name>_parts`` the pieces of large ones,
``<name>_jobs`` the durable work queue, ``<name>_memories`` the catalog of long-term
memories (Chroma holds their vectors and is rebuilt from it), ``<name>_locks`` the
rows that serialise queue claims across processes, ``<name>_consolidation`` each
session's MEMORY.md and consolidation cursor, and ``<name>_history_log`` the
consolidated batches (HISTORY.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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

_MYSQL = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}
# Ids are never reused on SQLite either: cursors and caches rely on them growing.
_GROWING = {"sqlite_autoincrement": True}


def _id() -> Any:
    # SQLite only autoincrements an INTEGER PRIMARY KEY.
    return BigInteger().with_variant(Integer, "sqlite")


def _long_text() -> Any:
    return Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _timestamp() -> Any:
    return DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _ident() -> Any:
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
        Column("context", Text, nullable=True),
        Column("context_ids", Text, nullable=True),
        Column("kind", String(16), nullable=False),
        # float32 bytes of the embedding: scoped dense search runs in-process,
        # since Chroma's filtered queries slow down as the collection grows.
        Column("vector", LargeBinary, nullable=True),
        Column("source_ids", Text, nullable=False),
        Column("turn_at", _timestamp(), nullable=False),
        Column("created_at", _timestamp(), nullable=False),
        UniqueConstraint("session_id", "content_hash", name=f"uq_{name}_memories_hash"),
        Index(f"ix_{name}_memories_user_id_seq", "user_id", "seq"),
        Index(f"ix_{name}_memories_session_id_seq", "session_id", "seq"),
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
    return Tables(
        messages=messages,
        parts=parts,
        jobs=jobs,
        memories=memories,
        locks=locks,
        consolidation=consolidation,
        history_log=history_log,
    )


def ensure_columns(engine: Engine, tables: Tables) -> None:
    """Add the nullable columns that tables created by an older version lack.

    ``metadata.create_all`` creates missing tables, never missing columns. Two
    processes may race here: the loser's ``ALTER TABLE`` fails, and the column is
    there all the same.
    """
    for table in (getattr(tables, f.name) for f in fields(tables)):
        present = _column_names(engine, table)
        for column in table.columns:
            if column.name in present or not column.nullable:
                continue
            preparer = engine.dialect.identifier_preparer
            statement = (
                f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN "
                f"{preparer.format_column(column)} {column.type.compile(engine.dialect)}"
            )
            try:
                with engine.begin() as connection:
                    connection.exec_driver_sql(statement)
            except SQLAlchemyError:
                if column.name not in _column_names(engine, table):
                    raise


def _column_names(engine: Engine, table: Table) -> set[str]:
    return {column["name"] for column in inspect(engine).get_columns(table.name)}
