"""The ``tiered-memory`` command line: a demo, and tools to inspect and manage the tiers.

Every command finds the archive and Chroma the same way: ``--url`` (or
``$TIERED_MEMORY_MYSQL_URL``; default a SQLite file in the home folder), ``--home``
(or ``$TIERED_MEMORY_HOME``; default ``./.tiered_memory``) and ``--chroma-host`` (or
``$TIERED_MEMORY_CHROMA_HOST``; default an embedded Chroma in the home folder).
Errors are one line on stderr and exit code 1; ``TIERED_MEMORY_DEBUG=1`` shows the
traceback instead.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import urlsplit

import typer
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    message_to_dict,
)
from rich.console import Console
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from sqlalchemy import bindparam, func, select, text

from langchain_tiered_memory.core.validation import validate_id, validate_optional_id
from langchain_tiered_memory.storage.archive import (
    ArchivedMessage,
    ArchiveUnavailableError,
    MySQLBackup,
    SessionOwnershipError,
)
from langchain_tiered_memory.storage.base import Plan

if TYPE_CHECKING:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.language_models import BaseChatModel

    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="tiered-memory",
    help=(
        "Tiered memory for LangChain: play the demo, inspect sessions, search long-term "
        "memories, export, forget, reindex and count."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def make_embedding() -> Embeddings | None:
    """The long-term tier's embedding for every command.

    ``None`` (the default) selects the offline all-MiniLM-L6-v2. Replace this
    function (``langchain_tiered_memory.cli.app.make_embedding = ...``) to run the
    commands with another LangChain ``Embeddings``, as the tests do.
    """
    return None


class CliError(Exception):
    """An error the command line reports as one line."""


# -- errors -------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _fail(message: str) -> NoReturn:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(Text(f"error: {message}", style="bold red"))
    raise typer.Exit(1)


_KNOWN = (
    CliError,
    ValueError,
    TypeError,
    ArchiveUnavailableError,
    SessionOwnershipError,
    ImportError,
    TimeoutError,
)


def friendly_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report a command's exceptions as one red line and exit code 1, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if hasattr(exc, "exit_code") and hasattr(exc, "show"):
                raise  # a usage error: typer/click prints it the usual way
            if os.environ.get("TIERED_MEMORY_DEBUG"):
                raise
            message = _first_line(exc)
            if not isinstance(exc, _KNOWN):
                message = f"{type(exc).__name__}: {message}"
            _fail(message)

    return wrapper


# -- where the tiers live -----------------------------------------------------


class ExportFormat(StrEnum):
    """Formats of ``export``."""

    md = "md"
    jsonl = "jsonl"


class Scope(StrEnum):
    """Scopes of ``search``."""

    session = "session"
    user = "user"


UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="TIERED_MEMORY_MYSQL_URL",
        help="Archive database URL, e.g. mysql+pymysql://user:pw@host:3306/db or "
        "sqlite:///chat.db. Default: archive.sqlite3 in the home folder.",
        show_default=False,
    ),
]
HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        envvar="TIERED_MEMORY_HOME",
        help="Folder of the embedded defaults (SQLite archive, Chroma, MEMORY.md files). "
        "Default: ./.tiered_memory",
        show_default=False,
    ),
]
ChromaHostOption = Annotated[
    str | None,
    typer.Option(
        "--chroma-host",
        envvar="TIERED_MEMORY_CHROMA_HOST",
        help="A Chroma server (host, host:port or http://host:port). Default: the "
        "embedded Chroma in the home folder.",
        show_default=False,
    ),
]
ChromaPortOption = Annotated[
    int,
    typer.Option("--chroma-port", envvar="TIERED_MEMORY_CHROMA_PORT", help="Chroma server port."),
]
CollectionOption = Annotated[
    str, typer.Option("--collection", help="Chroma collection of the long-term memories.")
]
TableOption = Annotated[str, typer.Option("--table", help="Base name of the archive's tables.")]


@dataclass
class Store:
    """Where one command finds the tiers; opens them on demand and closes them at the end.

    Args:
        url: The archive URL; ``None`` for SQLite under ``home``.
        home: The embedded defaults' folder.
        chroma_host: A Chroma server, or ``None`` for the embedded Chroma under ``home``.
        chroma_port: The server's port when ``chroma_host`` names none.
        collection: The Chroma collection.
        table: The archive's base table name.
    """

    url: str | None = None
    home: Path = field(default_factory=lambda: Path(".tiered_memory"))
    chroma_host: str | None = None
    chroma_port: int = 8000
    collection: str = "longMemory"
    table: str = "chat_messages"
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _backup: MySQLBackup | None = field(default=None, repr=False)

    @property
    def sqlite_path(self) -> Path | None:
        """The embedded archive file when no URL is given."""
        return None if self.url else self.home / "archive.sqlite3"

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
                    msg = (
                        f"no archive at {path}: pass --home or --url (or set "
                        "TIERED_MEMORY_HOME or TIERED_MEMORY_MYSQL_URL)"
                    )
                    raise CliError(msg)
                path.parent.mkdir(parents=True, exist_ok=True)
            backup = MySQLBackup(self.url or f"sqlite:///{path}", table_name=self.table)
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
        # The offline model loads from disk: a download progress bar would only be noise.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
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
            msg = f"{self.chroma_location()}: {_first_line(exc)}"
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


@contextmanager
def open_store(
    url: str | None,
    home: Path | None,
    chroma_host: str | None,
    chroma_port: int,
    collection: str,
    table: str,
) -> Iterator[Store]:
    """A :class:`Store` from the command's options, closed on exit."""
    store = Store(
        url=url or None,
        home=home or Path(".tiered_memory"),
        chroma_host=chroma_host or None,
        chroma_port=chroma_port,
        collection=collection,
        table=table,
    )
    try:
        yield store
    finally:
        store.close()


# -- queries the library has no method for ----------------------------------------


def _session_counts(backup: MySQLBackup, session_id: str) -> tuple[int, int, str | None]:
    """``(messages, memories, user_id)`` of a session."""
    t, m = backup.tables.messages, backup.tables.memories

    def plan() -> Plan[tuple[int, int, str | None]]:
        messages = yield select(func.count(), func.max(t.c.user_id)).where(
            t.c.session_id == session_id
        )
        count, user = messages.one()
        memories = yield select(func.count(), func.max(m.c.user_id)).where(
            m.c.session_id == session_id
        )
        memory_count, memory_user = memories.one()
        return int(count), int(memory_count), user or memory_user

    return backup.run(plan(), read_only=True)


def _require_session(backup: MySQLBackup, session_id: str) -> tuple[int, int, str | None]:
    counts = _session_counts(backup, validate_id(session_id, "session_id"))
    if counts[0] == 0 and counts[1] == 0:
        msg = f"session {session_id!r} not found in {backup!r}"
        raise CliError(msg)
    return counts


def _all_history(backup: MySQLBackup, session_id: str, page: int = 500) -> list[ArchivedMessage]:
    rows: list[ArchivedMessage] = []
    before: int | None = None
    while chunk := backup.history(session_id, before_id=before, limit=page):
        rows[:0] = chunk
        before = chunk[0].id
        if len(chunk) < page:
            break
    return rows


# -- rendering ----------------------------------------------------------------


def _out() -> Console:
    return Console(highlight=False)


def _message_text(message: BaseMessage) -> str:
    content = message.text if isinstance(message.text, str) else str(message.content)
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = "; ".join(
            f"-> {call['name']}({json.dumps(call['args'], ensure_ascii=False)})"
            for call in message.tool_calls
        )
        content = f"{content}\n{calls}" if content else calls
    if isinstance(message, ToolMessage):
        content = f"[{message.name or 'tool'} result, {len(content):,} chars] {content}"
    return content


def _shorten(value: str, limit: int) -> str:
    value = " ".join(value.split())
    if limit <= 0 or len(value) <= limit:
        return value
    return value[: limit - 1] + "…"


def _stamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _size(num: float) -> str:
    if num < 1024:
        return f"{num:,.0f} B"
    for unit in ("KB", "MB", "GB"):
        num /= 1024
        if num < 1024 or unit == "GB":
            break
    return f"{num:,.1f} {unit}"


def _folder_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _role_style(role: str) -> str:
    return {"human": "cyan", "ai": "green", "tool": "magenta", "system": "yellow"}.get(role, "")


# -- commands -----------------------------------------------------------------


@app.command()
@friendly_errors
def sessions(
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user's sessions.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """List sessions, most recent first, with message and memory counts."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        found = backup.sessions(user_id=validate_optional_id(user, "user"))
        m = backup.tables.memories

        def memory_counts() -> Plan[dict[str, int]]:
            result = yield select(m.c.session_id, func.count()).group_by(m.c.session_id)
            return {session_id: int(count) for session_id, count in result}

        memories = backup.run(memory_counts(), read_only=True)
        console = _out()
        if not found:
            console.print(
                Text(f"no sessions in {backup!r}" + (f" for user {user!r}" if user else ""))
            )
            return
        grid = Table(title=f"{len(found)} sessions in {backup!r}", title_justify="left")
        for column in ("session", "user", "messages", "memories", "first message", "last active"):
            grid.add_column(
                column, justify="right" if column in ("messages", "memories") else "left"
            )
        for info in found[:limit]:
            grid.add_row(
                Text(info.session_id),
                Text(info.user_id or "-"),
                f"{info.message_count:,}",
                f"{memories.get(info.session_id, 0):,}",
                _stamp(info.first_at),
                _stamp(info.last_active),
            )
        console.print(grid)
        if len(found) > limit:
            console.print(Text(f"... and {len(found) - limit} more (--limit)"))


@app.command()
@friendly_errors
def show(
    session: Annotated[str, typer.Argument(help="The session id.")],
    limit: Annotated[int, typer.Option("--limit", min=1, help="Messages per page.")] = 20,
    before: Annotated[
        int | None,
        typer.Option(
            "--before", help="Only messages older than this id (page back).", show_default=False
        ),
    ] = None,
    chars: Annotated[
        int, typer.Option("--chars", help="Characters shown per message; 0 for all.")
    ] = 300,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Show a page of a session's archived messages, oldest first (newest page by default)."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        total, memories, user_id = _require_session(backup, session)
        page = backup.history(session, before_id=before, limit=limit)
        console = _out()
        title = f"session {session!r}"
        if user_id:
            title += f" of user {user_id!r}"
        title += f": {total:,} messages, {memories:,} long-term memories"
        if not page:
            console.print(Text(f"{title}; no messages before #{before}"))
            return
        grid = Table(title=Text(title), title_justify="left", show_lines=False)
        grid.add_column("id", justify="right")
        grid.add_column("time")
        grid.add_column("role")
        grid.add_column("content", overflow="fold")
        for row in page:
            grid.add_row(
                str(row.id),
                _stamp(row.created_at),
                Text(row.role, style=_role_style(row.role)),
                Text(_shorten(_message_text(row.message), chars)),
            )
        console.print(grid)
        older = backup.history(session, before_id=page[0].id, limit=1)
        if older:
            console.print(
                Text(
                    f"older messages: tiered-memory show {session} --before {page[0].id}",
                    style="dim",
                )
            )


@app.command()
@friendly_errors
def search(
    session: Annotated[str, typer.Argument(help="The session id.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    scope: Annotated[
        Scope, typer.Option("--scope", help="session: this session; user: all the user's sessions.")
    ] = Scope.session,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            help="The user (default: the session's owner); refused if not the owner.",
            show_default=False,
        ),
    ] = None,
    k: Annotated[int, typer.Option("-k", "--k", min=1, help="How many memories.")] = 10,
    chars: Annotated[
        int, typer.Option("--chars", help="Characters shown per memory; 0 for all.")
    ] = 300,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Search long-term memories (hybrid dense + BM25) of a session or of its user."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        _, _, owner = _require_session(backup, session)
        user_id = validate_optional_id(user, "user")
        backup.check_owner(session, user_id)  # another user's session: refused
        user_id = user_id or owner
        if scope is Scope.user and user_id is None:
            msg = f"--scope user needs --user: session {session!r} has no user"
            raise CliError(msg)
        memory = store.long_memory()
        docs = memory.search(
            query,
            session_id=session,
            user_id=user_id if (scope is Scope.user or user) else None,
            scope=scope.value,
            k=k,
        )
        _print_memories(
            docs,
            f"{len(docs)} memories for {query!r} "
            + (f"in session {session!r}" if scope is Scope.session else f"of user {user_id!r}"),
            chars,
        )


def _print_memories(docs: Sequence[Document], title: str, chars: int = 300) -> None:
    console = _out()
    if not docs:
        console.print(Text(f"{title}: none"))
        return
    grid = Table(title=Text(title), title_justify="left")
    for column in ("#", "score", "session", "kind", "memory", "source ids"):
        grid.add_column(column, overflow="fold", justify="right" if column in "#score" else "left")
    for rank, doc in enumerate(docs, 1):
        meta = doc.metadata
        grid.add_row(
            str(rank),
            f"{meta.get('score', 0.0):.3f}",
            Text(str(meta.get("session_id", ""))),
            str(meta.get("kind", "")),
            Text(_shorten(doc.page_content, chars)),
            ",".join(map(str, meta.get("source_ids", []))),
        )
    console.print(grid)


def _fence(body: str) -> str:
    """A code fence longer than any run of backticks in ``body``."""
    runs = [len(run) for run in re.findall(r"`+", body)]
    return "`" * max(3, max(runs, default=0) + 1)


def _export_md(session: str, rows: Sequence[ArchivedMessage]) -> str:
    users = sorted({row.user_id for row in rows if row.user_id})
    lines = [f"# Session {session}", ""]
    if users:
        lines += [f"User: {', '.join(users)}", ""]
    lines += [
        f"{len(rows)} messages, {_stamp(rows[0].created_at)} to "
        f"{_stamp(rows[-1].created_at)} (UTC)",
        "",
    ]
    for row in rows:
        message = row.message
        label = {"human": "User", "ai": "Assistant", "tool": "Tool", "system": "System"}
        heading = label.get(row.role, row.role)
        if isinstance(message, ToolMessage) and message.name:
            heading += f" ({message.name})"
        lines += [f"## #{row.id} {heading} · {_stamp(row.created_at)}", ""]
        body = message.text if isinstance(message.text, str) else str(message.content)
        if isinstance(message, ToolMessage):
            lines += [_fence(body), body, _fence(body)]
        elif body:
            lines.append(body)
        if isinstance(message, AIMessage) and message.tool_calls:
            for call in message.tool_calls:
                lines += [
                    "",
                    f"Tool call `{call['name']}`:",
                    "```json",
                    json.dumps(call["args"], ensure_ascii=False, indent=2),
                    "```",
                ]
        lines.append("")
    return "\n".join(lines)


def _export_jsonl(rows: Sequence[ArchivedMessage]) -> str:
    return "".join(
        json.dumps(
            {
                "id": row.id,
                "session_id": row.session_id,
                "user_id": row.user_id,
                "role": row.role,
                "created_at": row.created_at.isoformat(),
                "message": message_to_dict(row.message),
            },
            ensure_ascii=False,
        )
        + "\n"
        for row in rows
    )


@app.command()
@friendly_errors
def export(
    session: Annotated[str, typer.Argument(help="The session id.")],
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="md: a readable transcript; jsonl: one archived message per line "
            "(message_to_dict, for messages_from_dict).",
        ),
    ] = ExportFormat.md,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write to this file instead of stdout.", show_default=False
        ),
    ] = None,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Export every archived message of a session as Markdown or JSON lines."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        _require_session(backup, session)
        rows = _all_history(backup, session)
        if not rows:
            msg = f"session {session!r} has memories but no archived messages"
            raise CliError(msg)
        document = _export_md(session, rows) if fmt is ExportFormat.md else _export_jsonl(rows)
        if output is None:
            sys.stdout.write(document)
            sys.stdout.flush()
            return
        output.write_text(document, encoding="utf-8")
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            Text(f"wrote {len(rows)} messages of session {session!r} to {output}")
        )


@app.command()
@friendly_errors
def forget(
    session: Annotated[str, typer.Argument(help="The session id.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Remove a session from every tier: jobs, Chroma vectors, MEMORY.md, catalog, archive."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        messages, memories, _ = _require_session(backup, session)
        what = f"session {session!r} ({messages:,} messages, {memories:,} long-term memories)"
        if not yes:
            typer.confirm(f"Forget {what} from every tier?", abort=True)
        notes: list[str] = []
        try:
            store.long_memory(connect=True)  # registers the removal of its Chroma vectors
        except ImportError:
            if memories:
                raise
            notes.append("no chroma extra installed: no vectors to remove")
        store.consolidator()  # registers the removal of the MEMORY.md files
        removed = backup.forget(session_id=session)
        console = _out()
        console.print(Text(f"forgot {what}: {removed:,} archived messages removed"))
        for note in notes:
            console.print(Text(note, style="dim"))


@app.command()
@friendly_errors
def reindex(
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Rebuild the Chroma collection from the archive's memory catalog (with a progress bar)."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        store.backup()
        memory = store.long_memory(connect=True)
        started = time.perf_counter()
        done = memory.reindex(progress=True)
        _out().print(
            Text(
                f"reindexed {done:,} memories into the {store.chroma_location()} "
                f"in {time.perf_counter() - started:.1f} s"
            )
        )


def _stats_plan(backup: MySQLBackup) -> Plan[dict[str, Any]]:
    t = backup.tables
    out: dict[str, Any] = {}
    result = yield select(
        func.count(),
        func.count(func.distinct(t.messages.c.session_id)),
        func.count(func.distinct(t.messages.c.user_id)),
        func.min(t.messages.c.created_at),
        func.max(t.messages.c.created_at),
    )
    out["messages"], out["sessions"], out["users"], out["first"], out["last"] = result.one()
    result = yield select(func.count()).select_from(t.parts)
    out["parts"] = result.scalar_one()
    result = yield select(t.memories.c.kind, func.count()).group_by(t.memories.c.kind)
    out["memories"] = {kind: int(count) for kind, count in result}
    result = yield select(
        t.jobs.c.kind,
        t.jobs.c.state,
        func.count(),
        func.sum(func.coalesce(t.jobs.c.attempts, 0)),
        func.min(t.jobs.c.created_at),
    ).group_by(t.jobs.c.kind, t.jobs.c.state)
    out["jobs"] = [tuple(row) for row in result]
    result = yield select(func.count()).select_from(t.jobs).where(t.jobs.c.attempts > 0)
    out["retrying"] = result.scalar_one()
    result = yield select(func.count()).select_from(t.consolidation)
    out["consolidated"] = result.scalar_one()
    result = yield select(func.count(), func.sum(t.history_log.c.raw)).select_from(t.history_log)
    out["batches"], out["raw_batches"] = result.one()
    return out


def _mysql_sizes(backup: MySQLBackup) -> int | None:
    names = [table.name for table in backup.metadata.sorted_tables]

    def plan() -> Plan[int]:
        statement = text(
            "SELECT COALESCE(SUM(data_length + index_length), 0) "
            "FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name IN :names"
        ).bindparams(bindparam("names", value=names, expanding=True))
        result = yield statement
        return int(result.scalar() or 0)

    try:
        return backup.run(plan(), read_only=True)
    except ArchiveUnavailableError:
        return None


def _chroma_vectors(store: Store) -> str:
    server = store.chroma_server()
    if server is None and not store.chroma_path.exists():
        return "0 (no embedded Chroma store yet)"
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

    try:
        client = ChromaLongMemory._make_client(
            None,
            None if server else store.chroma_path,
            server[0] if server else None,
            server[1] if server else store.chroma_port,
        )
    except ImportError:
        return "? (the chroma extra is not installed)"
    except Exception as exc:  # an unreachable server: the other figures still count
        return f"? ({_first_line(exc)})"
    try:
        collection = client.get_collection(store.collection)
    except Exception:  # NotFoundError, or a ValueError on older chromadb
        return f"0 (no collection {store.collection!r})"
    return f"{collection.count():,}"


@app.command()
@friendly_errors
def stats(
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Counts per tier, the job queue's depth and the storage sizes."""
    with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
        backup = store.backup()
        numbers = backup.run(_stats_plan(backup), read_only=True)
        grid = Table(title=Text(f"tiered memory: {backup!r}"), title_justify="left")
        grid.add_column("tier")
        grid.add_column("what")
        grid.add_column("value", overflow="fold")

        def row(tier: str, what: str, value: str) -> None:
            grid.add_row(tier, what, Text(value))

        row("archive", "messages", f"{numbers['messages']:,}")
        row("archive", "sessions", f"{numbers['sessions']:,}")
        row("archive", "users", f"{numbers['users']:,}")
        row("archive", "pieces of large messages", f"{numbers['parts']:,}")
        if numbers["first"] is not None:
            row(
                "archive",
                "first / last message",
                f"{_stamp(numbers['first'])} / {_stamp(numbers['last'])}",
            )
        kinds = numbers["memories"]
        detail = ", ".join(f"{count:,} {kind}" for kind, count in sorted(kinds.items()))
        row(
            "long-term",
            "memories (catalog)",
            f"{sum(kinds.values()):,}" + (f" ({detail})" if detail else ""),
        )
        row("long-term", "vectors in Chroma", _chroma_vectors(store))
        row("long-term", "location", store.chroma_location())
        row("consolidation", "sessions with MEMORY.md", f"{numbers['consolidated']:,}")
        row(
            "consolidation",
            "HISTORY.md batches",
            f"{numbers['batches']:,} ({int(numbers['raw_batches'] or 0):,} archived raw)",
        )
        depth = sum(count for _, state, count, _, _ in numbers["jobs"] if state != "done")
        row("queue", "depth (jobs not finished)", f"{depth:,}")
        for kind, state, count, _attempts, oldest in sorted(numbers["jobs"]):
            since = f" (oldest queued {_stamp(oldest)} UTC)" if oldest else ""
            row("queue", f"{kind} {state}", f"{count:,}{since}")
        row("queue", "jobs that failed at least once", f"{numbers['retrying']:,}")
        path = store.sqlite_path
        if path is not None:
            total = sum(
                p.stat().st_size
                for p in (
                    path,
                    path.with_name(path.name + "-wal"),
                    path.with_name(path.name + "-shm"),
                )
                if p.exists()
            )
            row("storage", "archive (SQLite file + WAL)", f"{_size(total)} in {path}")
        else:
            size = _mysql_sizes(backup)
            row("storage", "archive tables (data + indexes)", "?" if size is None else _size(size))
        for what, folder in (
            ("embedded Chroma", None if store.chroma_server() else store.chroma_path),
            ("MEMORY.md / HISTORY.md files", store.memory_root),
        ):
            if folder is not None:
                found = folder.exists()
                row("storage", what, f"{_size(_folder_size(folder))} in {folder}" if found else "-")
        _out().print(grid)


@app.command()
@friendly_errors
def demo(
    scripted: Annotated[
        bool,
        typer.Option("--scripted", help="Use the scripted model even when a real LLM is found."),
    ] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary home folder to explore it.")
    ] = False,
    url: UrlOption = None,
    home: HomeOption = None,
    chroma_host: ChromaHostOption = None,
    chroma_port: ChromaPortOption = 8000,
    collection: CollectionOption = "longMemory",
    table: TableOption = "chat_messages",
) -> None:
    """Play a scripted ERP conversation and show what each tier holds as it goes.

    Several sessions of one user with AR/AP tables and large tool outputs: the window,
    the archive, the extracted memories, a compression, a consolidation into
    MEMORY.md, and a later session recalling an early fact. With OPENAI_API_KEY or a
    reachable Ollama it uses that model; otherwise a scripted one, offline.
    """
    from langchain_tiered_memory.cli.demo import DEMO_USER, Demo
    from langchain_tiered_memory.cli.llms import detect_llm

    started = time.perf_counter()
    console = _out()
    temporary = home is None
    home = home or Path(tempfile.mkdtemp(prefix="tiered-memory-demo-"))
    run_id = "" if temporary else f"-{uuid.uuid4().hex[:6]}"
    llm, description = (None, "--scripted") if scripted else detect_llm()
    console.print(Rule(Text("tiered-memory demo", style="bold")))
    console.print(Text(f"home: {home}" + (" (temporary)" if temporary and not keep else "")))
    if llm is None:
        console.print(
            Text(
                f"No real LLM ({description}): running with the raw-turn extractor and a "
                "scripted model. Answers are scripted or quoted from the prompt, memories are "
                "the raw turns, and MEMORY.md is assembled from the conversation's lines.",
                style="yellow",
            )
        )
    else:
        console.print(Text(f"LLM: {description}, for answers, extraction and consolidation."))
    try:
        with open_store(url, home, chroma_host, chroma_port, collection, table) as store:
            player = Demo(store, console, llm, run_id)
            console.print(Text(f"archive: {player.backup!r}; long-term: {store.chroma_location()}"))
            loading = time.perf_counter()
            player.long_memory.embedding.embed_query("warm up")
            name = type(player.long_memory.embedding).__name__
            console.print(Text(f"embedding {name} ready in {time.perf_counter() - loading:.1f} s"))
            first, first_history = player.play(0)
            player.show_window(first, first_history)
            player.show_archive(first)
            second, _ = player.play(1)
            player.show_compression()
            player.show_memories([first, second])
            player.show_consolidation(first)
            player.show_recall(2)
            player.show_sessions()
        console.print()
        console.print(Text(f"demo finished in {time.perf_counter() - started:.1f} s", style="bold"))
        if temporary and not keep:
            console.print(
                Text("the temporary home is removed; --keep keeps it to explore", style="dim")
            )
        else:
            console.print(
                Text(
                    f"explore: tiered-memory sessions --home {home}; tiered-memory search "
                    f"{DEMO_USER}-month-end{run_id} overdue --scope user --home {home}",
                    style="dim",
                )
            )
    finally:
        if temporary and not keep:
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    """Entry point of ``python -m langchain_tiered_memory.cli.app``."""
    app()


if __name__ == "__main__":
    main()
