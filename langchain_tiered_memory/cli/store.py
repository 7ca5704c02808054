"""Where the command line finds the tiers: the archive, Chroma and the MEMORY.md folders."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from langchain_tiered_memory.core.validation import validate_id
from langchain_tiered_memory.storage.archive import (
    ArchivedMessage,
    ArchiveStats,
    MySQLBackup,
    check_supported,
    default_home,
    default_url,
    in_memory,
)

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings
    from langchain_core.language_models import BaseChatModel

    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

#: What a missing archive error says: where the command looks, and how to point it elsewhere.
POINT_AT_ARCHIVE = (
    "pass --url (or set TIERED_MEMORY_URL) or --home (or set TIERED_MEMORY_HOME), as the "
    "script that wrote it did"
)


class CliError(Exception):
    """An error the command line reports as one line."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (else its type's name)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def make_embedding() -> Embeddings | None:
    """The long-term tier's embedding for every command.

    ``None`` (the default) selects the offline all-MiniLM-L6-v2. Replace this
    function (``langchain_tiered_memory.cli.store.make_embedding = ...``) to run the
    commands with another LangChain ``Embeddings``, as the tests do.
    """
    return None


@dataclass
class Store:
    """Where the commands find the tiers; opens them on demand and closes them at the end.

    Args:
        url: The archive URL; ``None`` for SQLite under ``home``.
        home: The embedded defaults' folder.
        chroma_host: A Chroma server, or ``None`` for the embedded Chroma under ``home``.
        chroma_port: The server's port when ``chroma_host`` names none.
        collection: The Chroma collection.
        table: The archive's base table name.
        language: The long-term tier's language (it picks the embedding model).
    """

    url: str | None = None
    home: Path = field(default_factory=default_home)
    chroma_host: str | None = None
    chroma_port: int = 8000
    collection: str = "longMemory"
    table: str = "chat_messages"
    language: str | None = None
    # Per store, never copied by ``dataclasses.replace``: what to close, the archive.
    _stack: ExitStack = field(default_factory=ExitStack, init=False, repr=False)
    _backup: MySQLBackup | None = field(default=None, init=False, repr=False)

    @property
    def archive_url(self) -> str:
        """The archive's URL: ``url``, else the library's default for ``home``."""
        return self.url or default_url(self.home)

    @property
    def sqlite_path(self) -> Path | None:
        """The archive's file when it is a SQLite one (``None`` for a server)."""
        parsed = check_supported(make_url(self.archive_url))
        if parsed.get_backend_name() != "sqlite" or in_memory(parsed) or not parsed.database:
            return None
        return Path(parsed.database)

    @property
    def chroma_path(self) -> Path:
        """The embedded Chroma folder."""
        return self.home / "chroma"

    @property
    def memory_root(self) -> Path:
        """The MEMORY.md / HISTORY.md folder."""
        return self.home / "memory"

    def chroma_server(self) -> tuple[str, int] | None:
        """``(host, port)`` of the Chroma server, or ``None`` for the embedded one."""
        if not self.chroma_host:
            return None
        value = self.chroma_host.strip()
        parts = urlsplit(value if "://" in value else f"//{value}")
        if not parts.hostname:
            msg = f"--chroma-host {value!r} names no host"
            raise CliError(msg)
        return parts.hostname, parts.port or self.chroma_port

    def chroma_location(self) -> str:
        """Where the long-term memories are, in words."""
        server = self.chroma_server()
        if server:
            return f"Chroma server {server[0]}:{server[1]}, collection {self.collection!r}"
        return f"embedded Chroma at {self.chroma_path}, collection {self.collection!r}"

    def backup(self, *, create: bool = False) -> MySQLBackup:
        """The archive; unless ``create``, a missing embedded archive is an error."""
        if self._backup is None:
            path = self.sqlite_path
            if path is not None:
                if not create and not path.exists():
                    msg = f"no archive at {path}: {POINT_AT_ARCHIVE}"
                    raise CliError(msg)
                path.parent.mkdir(parents=True, exist_ok=True)
            backup = MySQLBackup(self.archive_url, table_name=self.table)
            self._stack.callback(backup.dispose)
            self._backup = backup
        return self._backup

    def long_memory(self, *, connect: bool = False, **kwargs: Any) -> ChromaLongMemory:
        """The long-term tier on this store's archive (no worker unless asked).

        Args:
            connect: Reach the Chroma collection now (commands that write vectors);
                otherwise a server that is down only means search from the catalog.
            **kwargs: More ``ChromaLongMemory`` arguments.
        """
        from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

        server = self.chroma_server()
        location: dict[str, Any] = (
            {"host": server[0], "port": server[1]}
            if server
            else {"persist_directory": self.chroma_path}
        )
        kwargs.setdefault("embedding", make_embedding())
        kwargs.setdefault("language", self.language)
        kwargs.setdefault("start_worker", False)
        backup = self.backup()
        try:
            memory = ChromaLongMemory(
                **location, collection_name=self.collection, backup=backup, **kwargs
            )
            if connect:
                memory.collection  # noqa: B018 - connect now, to name the server on failure
        except ImportError:
            raise
        except Exception as exc:  # chromadb's errors name no server: say which one
            if server is None:
                raise
            msg = f"{self.chroma_location()}: {first_line(exc)}"
            raise CliError(msg) from exc
        self._stack.callback(memory.close)
        return memory

    def consolidator(self, llm: BaseChatModel | None = None, **kwargs: Any) -> MemoryConsolidator:
        """The MEMORY.md tier on this store's archive (no worker unless asked)."""
        from langchain_tiered_memory.cli.llms import ScriptedChatModel
        from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator

        kwargs.setdefault("start_worker", False)
        consolidator = MemoryConsolidator(
            llm or ScriptedChatModel(), root=self.memory_root, backup=self.backup(), **kwargs
        )
        self._stack.callback(consolidator.close)
        return consolidator

    def close(self) -> None:
        """Stop workers and release connections."""
        self._stack.close()


def require_session(backup: MySQLBackup, session_id: str) -> ArchiveStats:
    """The counts of a session that has messages or memories; else a :class:`CliError`."""
    counts = backup.stats(validate_id(session_id, "session_id"))
    if counts.messages == 0 and counts.memory_count == 0:
        msg = f"session {session_id!r} not found in {backup!r}"
        raise CliError(msg)
    return counts


def all_history(backup: MySQLBackup, session_id: str, page: int = 500) -> list[ArchivedMessage]:
    """Every archived message of a session, oldest first, read page by page."""
    rows: list[ArchivedMessage] = []
    before: int | None = None
    while chunk := backup.history(session_id, before_id=before, limit=page):
        rows[:0] = chunk
        before = chunk[0].id
        if len(chunk) < page:
            break
    return rows
