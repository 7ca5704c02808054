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
import random
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
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)
from rich.console import Console
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from sqlalchemy import bindparam, func, select, text

from langchain_tiered_memory._validation import validate_id, validate_optional_id
from langchain_tiered_memory.archive import (
    ArchivedMessage,
    ArchiveUnavailableError,
    MySQLBackup,
    Plan,
)
from langchain_tiered_memory.tokens import estimate_tokens

if TYPE_CHECKING:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.language_models import BaseChatModel

    from langchain_tiered_memory.consolidation import MemoryConsolidator
    from langchain_tiered_memory.long_memory import ChromaLongMemory

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
    function (``langchain_tiered_memory.cli.make_embedding = ...``) to run the
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


_KNOWN = (CliError, ValueError, TypeError, ArchiveUnavailableError, ImportError, TimeoutError)


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

    def long_memory(self, **kwargs: Any) -> ChromaLongMemory:
        """The long-term tier on this store's archive (no worker unless asked)."""
        from langchain_tiered_memory.long_memory import ChromaLongMemory

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
        from langchain_tiered_memory.consolidation import MemoryConsolidator
        from langchain_tiered_memory.llms import ScriptedChatModel

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
        typer.Option("--user", help="The user (default: the session's owner).", show_default=False),
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
        user_id = validate_optional_id(user, "user") or owner
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
            store.long_memory()  # registers the removal of its Chroma vectors
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
        memory = store.long_memory()
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
    from langchain_tiered_memory.long_memory import ChromaLongMemory

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


# -- the demo -----------------------------------------------------------------

DEMO_USER = "alice"
DEMO_TODAY = "2024-04-01"  # the scripted ERP's today, so that its figures never change
DEMO_WINDOW_TURNS = 3
DEMO_WINDOW_TOKENS = 8_000
# The design's 60k / 100k / 120k thresholds, scaled down so that a few tool outputs pass them.
DEMO_COMPRESS = 8_000
DEMO_FORCE_DELETE = 13_000
DEMO_ERROR = 16_000
DEMO_CONSOLIDATE_AFTER = 8  # messages past the cursor (the design: 100)
DEMO_CONSOLIDATE_BATCH = 6
DEMO_ROWS = 48  # rows of each query_erp result (~4k tokens)
DEMO_MATCH_LINES = 150  # lines of the three-way match document (~4k tokens)


def _ar_open_invoices() -> tuple[str, str]:
    rng = random.Random(1024)
    rows, total, overdue = [], 0.0, 0
    for n in range(1, DEMO_ROWS + 1):
        amount = round(rng.uniform(80, 25_000), 2)
        due = f"2024-{rng.randint(1, 6):02d}-{rng.randint(1, 28):02d}"
        total += amount
        overdue += due < DEMO_TODAY
        rows.append(
            {
                "invoice_no": f"INV-24{n:05d}",
                "customer_id": "C-1024",
                "customer_name": "华东贸易有限公司",
                "amount": f"{amount:.2f}",
                "currency": "CNY",
                "due_date": due,
                "status": "open",
                "memo": f"第{n}期货款 instalment {n}",
            }
        )
    output = json.dumps({"row_count": len(rows), "rows": rows}, ensure_ascii=False)
    answer = (
        f"Customer C-1024 has {len(rows)} open invoices, CNY {total:,.2f} in total; "
        f"{overdue} of them are overdue (status = 'open' and due_date < {DEMO_TODAY})."
    )
    return output, answer


def _ap_unpaid_bills() -> tuple[str, str]:
    rng = random.Random(88)
    rows, total = [], 0.0
    for n in range(1, DEMO_ROWS + 1):
        amount = round(rng.uniform(150, 40_000), 2)
        total += amount
        rows.append(
            {
                "bill_no": f"AP-2404-{n:04d}",
                "vendor_id": "V-88",
                "vendor_name": "江南精密机械",
                "po_no": f"PO-24{rng.randint(1000, 9999)}",
                "amount": f"{amount:.2f}",
                "currency": "CNY",
                "due_date": f"2024-04-{rng.randint(1, 30):02d}",
                "paid_at": None,
                "status": "unpaid",
            }
        )
    output = json.dumps({"row_count": len(rows), "rows": rows}, ensure_ascii=False)
    answer = f"V-88 has {len(rows)} unpaid bills this month, CNY {total:,.2f} in total."
    return output, answer


def _three_way_match() -> tuple[str, str]:
    rng = random.Random(3)
    lines = ["# Three-way match, April 2024 (PO line / goods receipt / bill)", ""]
    counts = {"matched": 0, "quantity differs": 0, "awaiting goods receipt": 0}
    for n in range(DEMO_MATCH_LINES):
        state = rng.choices(list(counts), weights=(8, 1, 1))[0]
        counts[state] += 1
        ordered = rng.randint(1, 500)
        received = ordered if state == "matched" else rng.randint(0, ordered)
        lines.append(
            f"- AP-2404-{n % DEMO_ROWS + 1:04d} line {n // DEMO_ROWS + 1}: "
            f"PO-24{rng.randint(1000, 9999)} ordered {ordered} units, received {received}, "
            f"billed {ordered}; {state}."
        )
    answer = (
        f"Of the {DEMO_MATCH_LINES} PO lines on those {DEMO_ROWS} bills, {counts['matched']} "
        f"match their goods receipt, {counts['quantity differs']} differ in quantity and "
        f"{counts['awaiting goods receipt']} await the goods receipt."
    )
    return "\n".join(lines), answer


@dataclass(frozen=True)
class DemoTurn:
    """One scripted turn: a question, maybe a tool round trip, and the scripted answer."""

    question: str
    answer: str | None = None  # None: the model answers from its prompt (recalled memories)
    tool: str | None = None
    tool_args: dict[str, Any] = field(default_factory=dict)
    tool_output: Callable[[], tuple[str, str]] | None = None


DEMO_SESSIONS: list[tuple[str, str, list[DemoTurn]]] = [
    (
        "ar",
        "accounts receivable",
        [
            DemoTurn(
                "In our ERP an AR invoice is overdue when status = 'open' and due_date < "
                "CURRENT_DATE; receivables live in ar_invoice (invoice_no, customer_id, "
                "amount, currency, due_date, status).",
                "Noted: ar_invoice holds invoice_no, customer_id, amount, currency, due_date "
                "and status, and an invoice is overdue when status = 'open' and due_date < "
                "CURRENT_DATE.",
            ),
            DemoTurn(
                "I prefer amounts in CNY with two decimals, please.",
                "Understood: amounts in CNY with two decimals from now on.",
            ),
            DemoTurn(
                "List the open invoices of customer C-1024.",
                tool="query_erp",
                tool_args={
                    "sql": "SELECT * FROM ar_invoice WHERE customer_id = 'C-1024' "
                    "AND status = 'open'"
                },
                tool_output=_ar_open_invoices,
            ),
            DemoTurn(
                "Which table links receipts to invoices?",
                "ar_receipt_alloc links ar_receipt.receipt_no to ar_invoice.invoice_no, with "
                "the amount allocated to each invoice.",
            ),
        ],
    ),
    (
        "ap",
        "accounts payable",
        [
            DemoTurn(
                "应付账款表 ap_bill 有哪些字段？",
                "ap_bill 有 bill_no、vendor_id、po_no、amount、due_date、paid_at 和 status "
                "字段；付款记录在 ap_payment 表。",
            ),
            DemoTurn(
                "Show this month's unpaid bills of vendor V-88.",
                tool="query_erp",
                tool_args={
                    "sql": "SELECT * FROM ap_bill WHERE vendor_id = 'V-88' AND paid_at IS NULL "
                    "AND due_date >= '2024-04-01'"
                },
                tool_output=_ap_unpaid_bills,
            ),
            DemoTurn(
                "And what is their three-way match status?",
                tool="get_document_by_name",
                tool_args={"name": "three_way_match_2024_04"},
                tool_output=_three_way_match,
            ),
        ],
    ),
    (
        "month-end",
        "month-end close",
        [DemoTurn("Before I close the month: how do we decide that an AR invoice is overdue?")],
    ),
]


@dataclass
class _Compression:
    session_id: str
    before: int
    after: int
    messages_before: int
    messages_after: int
    summary: str


class _Demo:
    """Plays the scripted conversation and shows each tier as it fills."""

    def __init__(
        self, store: Store, console: Console, llm: BaseChatModel | None, run_id: str
    ) -> None:
        from langchain_tiered_memory.compression import ContextCompressor
        from langchain_tiered_memory.llms import ScriptedChatModel

        self.store = store
        self.console = console
        self.real = llm is not None
        # Tool results are made once; their scripted answers are computed from them.
        self.tool_outputs: dict[str, str] = {}
        script: dict[str, str] = {}
        for _, _, turns in DEMO_SESSIONS:
            for turn in turns:
                if turn.tool_output is not None:
                    self.tool_outputs[turn.question], script[turn.question] = turn.tool_output()
                elif turn.answer is not None:
                    script[turn.question] = turn.answer
        self.llm: BaseChatModel = llm or ScriptedChatModel(script=script)
        self.backup = store.backup(create=True)
        self.long_memory = store.long_memory(extractor=llm, start_worker=True, poll_interval=0.2)
        self.consolidator = store.consolidator(
            self.llm,
            threshold=DEMO_CONSOLIDATE_AFTER,
            batch=DEMO_CONSOLIDATE_BATCH,
            start_worker=True,
            poll_interval=0.2,
        )
        self.compressor = ContextCompressor(
            compress_threshold=DEMO_COMPRESS,
            force_delete_threshold=DEMO_FORCE_DELETE,
            error_threshold=DEMO_ERROR,
        )
        self.run_id = run_id
        self.compressions: list[_Compression] = []

    def session_id(self, key: str) -> str:
        return f"{DEMO_USER}-{key}{self.run_id}"

    def history(self, session_id: str) -> Any:
        from langchain_tiered_memory.history import TieredChatMessageHistory

        return TieredChatMessageHistory(
            session_id,
            user_id=DEMO_USER,
            backup=self.backup,
            long_memory=self.long_memory,
            consolidator=self.consolidator,
            window_turns=DEMO_WINDOW_TURNS,
            window_max_tokens=DEMO_WINDOW_TOKENS,
        )

    # -- output ---------------------------------------------------------------

    def say(self, value: str, style: str = "") -> None:
        self.console.print(Text(value, style=style))

    def section(self, title: str) -> None:
        self.console.print()
        self.console.print(Rule(Text(title, style="bold"), align="left"))

    # -- the conversation -----------------------------------------------------

    def prompt(
        self, session_id: str, history: Any, new: list[BaseMessage]
    ) -> tuple[list[BaseMessage], list[Document]]:
        question = _message_text(new[0])
        memories = self.long_memory.search(
            question, session_id=session_id, user_id=DEMO_USER, scope="user", k=3
        )
        lines = ["You are an ERP assistant (AR/AP). Long-term memories, most relevant first:"]
        lines += [f"- {' '.join(doc.page_content.split())}" for doc in memories] or ["(none)"]
        memory_md = history.consolidated_memory
        if memory_md:
            lines += ["", "Consolidated memory of this session (MEMORY.md):", memory_md]
        return [SystemMessage("\n".join(lines)), *history.messages, *new], memories

    def turn(self, session_id: str, history: Any, number: int, turn: DemoTurn) -> list[Document]:
        self.say(f"{DEMO_USER}> {turn.question}", "cyan")
        new: list[BaseMessage] = [HumanMessage(turn.question)]
        if turn.tool and turn.question in self.tool_outputs:
            output = self.tool_outputs[turn.question]
            call_id = f"call_{session_id}_{number}"
            new += [
                AIMessage(
                    "", tool_calls=[{"name": turn.tool, "args": turn.tool_args, "id": call_id}]
                ),
                ToolMessage(output, tool_call_id=call_id, name=turn.tool),
            ]
            self.say(
                f"  tool {turn.tool} -> {len(output):,} characters "
                f"(~{estimate_tokens(output):,} tokens)",
                "magenta",
            )
        prompt, memories = self.prompt(session_id, history, new)
        before = self.compressor.measure(prompt)
        sent = self.compressor.compress(prompt)
        after = self.compressor.measure(sent)
        if sent is not prompt and after < before:
            summary = next(
                (
                    _message_text(m)
                    for m in sent
                    if isinstance(m, SystemMessage) and m is not prompt[0]
                ),
                "",
            )
            self.compressions.append(
                _Compression(session_id, before, after, len(prompt), len(sent), summary)
            )
            self.say(
                f"  compression: the prompt had {before:,} tokens (> {DEMO_COMPRESS:,}); "
                f"sent {after:,} tokens, {len(prompt)} -> {len(sent)} messages",
                "yellow",
            )
        reply = self.llm.invoke(sent)
        answer = reply if isinstance(reply, AIMessage) else AIMessage(_message_text(reply))
        history.add_messages([*new, answer])
        label = "bot" if self.real else "bot (scripted)"
        self.say(f"{label}> {_shorten(_message_text(answer), 600)}", "green")
        return memories

    def play(self, index: int) -> tuple[str, Any]:
        key, title, turns = DEMO_SESSIONS[index]
        session_id = self.session_id(key)
        self.section(f"Session {index + 1}: {session_id} ({title}), user {DEMO_USER}")
        history = self.history(session_id)
        for number, turn in enumerate(turns, 1):
            self.turn(session_id, history, number, turn)
        return session_id, history

    # -- the tiers ------------------------------------------------------------

    def show_window(self, session_id: str, history: Any) -> None:
        self.section("The window (what the next prompt gets)")
        window = history.messages
        archived = len(history.all_messages())
        self.say(
            f"last {DEMO_WINDOW_TURNS} turns within {DEMO_WINDOW_TOKENS:,} tokens, cut on turn "
            f"boundaries: {len(window)} of the {archived} archived messages of {session_id}, "
            f"{estimate_tokens(window):,} tokens"
        )
        for message in window:
            self.say(f"  [{message.type}] {_shorten(_message_text(message), 110)}")

    def show_archive(self, session_id: str) -> None:
        self.section("The archive (every message, durable before add_messages returns)")
        rows = _all_history(self.backup, session_id)
        self.say(f"{self.backup!r}: {len(rows)} messages of {session_id}")
        grid = Table(show_header=True, box=None, pad_edge=False)
        for column in ("id", "role", "content"):
            grid.add_column(column, overflow="fold")
        for row in rows:
            grid.add_row(str(row.id), row.role, Text(_shorten(_message_text(row.message), 100)))
        self.console.print(grid)

    def show_compression(self) -> None:
        self.section("Compression before the LLM call (ContextCompressor, no LLM needed)")
        if not self.compressions:
            self.say("no prompt passed the threshold")
            return
        self.say(
            f"thresholds: compress above {DEMO_COMPRESS:,} tokens, force-delete above "
            f"{DEMO_FORCE_DELETE:,}, refuse above {DEMO_ERROR:,} (the design's 60k/100k/120k, "
            "scaled down)"
        )
        for c in self.compressions:
            self.say(
                f"  {c.session_id}: {c.before:,} -> {c.after:,} tokens "
                f"({c.messages_before} -> {c.messages_after} messages)"
            )
        last = self.compressions[-1]
        lines = last.summary.splitlines()
        body = "\n".join(lines[:14]) + (
            f"\n... ({len(lines) - 14} more lines)" if len(lines) > 14 else ""
        )
        self.console.print(
            Panel(
                Text(body),
                title="the structured summary that replaced older messages",
                title_align="left",
            )
        )

    def show_memories(self, session_ids: Sequence[str]) -> None:
        self.section("Long-term memories (extracted after each turn by a background worker)")
        started = time.perf_counter()
        self.long_memory.flush(timeout=300 if self.real else 60)
        kind = "LLM extraction" if self.real else "raw turns (raw-turn extractor)"
        self.say(f"queue drained in {time.perf_counter() - started:.1f} s; {kind}:")
        grid = Table(box=None, pad_edge=False)
        for column in ("session", "kind", "memory", "source ids"):
            grid.add_column(column, overflow="fold")
        m = self.backup.tables.memories

        def plan() -> Plan[list[Any]]:
            result = yield select(m).where(m.c.session_id.in_(list(session_ids))).order_by(m.c.seq)
            return result.all()

        for row in self.backup.run(plan(), read_only=True):
            grid.add_row(
                Text(row.session_id), row.kind, Text(_shorten(row.text, 110)), row.source_ids
            )
        self.console.print(grid)

    def show_consolidation(self, session_id: str) -> None:
        self.section("Consolidation into MEMORY.md (old history, by the LLM, off the hot path)")
        started = time.perf_counter()
        self.consolidator.flush(timeout=300 if self.real else 60)
        memory_md = self.consolidator.memory(session_id)
        entries = self.consolidator.history_entries(session_id)
        self.say(
            f"more than {DEMO_CONSOLIDATE_AFTER} messages past the cursor queue a job; "
            f"it took the oldest {DEMO_CONSOLIDATE_BATCH} ({len(entries)} batch(es), "
            f"{time.perf_counter() - started:.1f} s to wait for)"
        )
        path = self.consolidator.folder(session_id) / "MEMORY.md"
        title = f"{path}" + ("" if self.real else " (scripted consolidation)")
        self.console.print(
            Panel(Text(memory_md.strip() or "(empty)"), title=Text(title), title_align="left")
        )

    def show_recall(self, index: int) -> None:
        key, title, turns = DEMO_SESSIONS[index]
        session_id = self.session_id(key)
        self.section(f"Recall in a later session: {session_id} ({title}), user {DEMO_USER}")
        history = self.history(session_id)
        self.say(f"a new session: its window is empty ({len(history.messages)} messages)")
        memories: list[Document] = []
        for number, turn in enumerate(turns, 1):
            memories = self.turn(session_id, history, number, turn)
        _print_memories(
            memories, "recalled by the last question (scope=user: all of alice's sessions)", 160
        )
        if memories:
            source = memories[0].metadata
            self.say(
                f"the best memory comes from session {source['session_id']}, archive messages "
                f"{source['source_ids']}, written {source['turn_at'][:19]}",
                "bold",
            )

    def show_sessions(self) -> None:
        self.section(f"Sessions of {DEMO_USER}")
        for info in self.backup.sessions(user_id=DEMO_USER):
            self.say(
                f"  {info.session_id}: {info.message_count} messages, "
                f"last active {_stamp(info.last_active)}"
            )


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
    from langchain_tiered_memory.llms import detect_llm

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
            player = _Demo(store, console, llm, run_id)
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
    """Entry point of ``python -m langchain_tiered_memory.cli``."""
    app()


if __name__ == "__main__":
    main()
