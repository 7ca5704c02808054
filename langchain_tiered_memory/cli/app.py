"""The ``tiered-memory`` command line: a demo, and tools to inspect and manage the tiers.

The options that say where the tiers are come before the command, once for all:
``--url`` (or ``$TIERED_MEMORY_URL``; default a SQLite file in the home folder),
``--home`` (or ``$TIERED_MEMORY_HOME``; default ``./.tiered_memory``) and
``--chroma-host`` (or ``$TIERED_MEMORY_CHROMA_HOST``; default an embedded Chroma in the
home folder), e.g. ``tiered-memory --home demo sessions``. Errors are one line on
stderr and exit code 1; ``TIERED_MEMORY_DEBUG=1`` shows the traceback instead. Output
whose reader has gone (``tiered-memory show s1 | head -1``) ends the command quietly
with exit code 141, as a process that SIGPIPE ends.
"""

from __future__ import annotations

import functools
import os
import select
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from langchain_tiered_memory.cli.render import (
    export_jsonl,
    export_md,
    folder_size,
    for_terminal,
    message_text,
    out,
    print_memories,
    role_style,
    shorten,
    size,
    stamp,
    tolerant_output,
)
from langchain_tiered_memory.cli.store import (
    CliError,
    Store,
    all_history,
    first_line,
    require_session,
)
from langchain_tiered_memory.core.validation import validate_optional_id
from langchain_tiered_memory.storage.archive import (
    ArchiveUnavailableError,
    SessionOwnershipError,
    default_home,
)
from langchain_tiered_memory.tiers.long_memory import make_chroma_client

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="tiered-memory",
    help=(
        "Tiered memory for LangChain: play the demo, inspect sessions, search long-term "
        "memories, export, forget, reindex and count. The options below say where the "
        "tiers are; give them before the command."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich panels show every flag as `--yes <bool>`, as if it took a value.
    rich_markup_mode=None,
)


# -- errors -------------------------------------------------------------------


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


#: The exit code of a command whose output's reader has gone: a shell's for a process
#: that SIGPIPE ends (128 + 13), as ``yes | head -1`` gives.
PIPE_CLOSED = 141


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no real stdout
        return False


def _discard_stdout() -> None:
    """Point stdout at the null device: what it still buffers would fail again at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


def friendly_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report a command's exceptions as one red line and exit code 1, never a traceback.

    Output whose reader has gone (``| head``) ends the command quietly instead,
    with :data:`PIPE_CLOSED`.
    """

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            # Another pipe or socket broken is an error of its own.
            if isinstance(exc, BrokenPipeError) and _stdout_closed():
                _discard_stdout()
                raise typer.Exit(PIPE_CLOSED) from None
            if hasattr(exc, "exit_code") and hasattr(exc, "show"):
                raise  # a usage error: typer/click prints it the usual way
            if os.environ.get("TIERED_MEMORY_DEBUG"):
                raise
            message = first_line(exc)
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


@app.callback()
def where(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="TIERED_MEMORY_URL",
            help="Archive database URL, e.g. mysql+pymysql://user:pw@host:3306/db or "
            "sqlite:///chat.db (SQLite and MySQL/MariaDB). Default: archive.sqlite3 in "
            "the home folder, as MySQLBackup() without a URL.",
            show_default=False,
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            "--home",
            envvar="TIERED_MEMORY_HOME",
            help="Folder of the embedded defaults (SQLite archive, Chroma, MEMORY.md files). "
            "Default: ./.tiered_memory",
            show_default=False,
        ),
    ] = None,
    chroma_host: Annotated[
        str | None,
        typer.Option(
            "--chroma-host",
            envvar="TIERED_MEMORY_CHROMA_HOST",
            help="A Chroma server (host, host:port or http://host:port). Default: the "
            "embedded Chroma in the home folder.",
            show_default=False,
        ),
    ] = None,
    chroma_port: Annotated[
        int,
        typer.Option(
            "--chroma-port", envvar="TIERED_MEMORY_CHROMA_PORT", help="Chroma server port."
        ),
    ] = 8000,
    collection: Annotated[
        str, typer.Option("--collection", help="Chroma collection of the long-term memories.")
    ] = "longMemory",
    table: Annotated[
        str, typer.Option("--table", help="Base name of the archive's tables.")
    ] = "chat_messages",
    language: Annotated[
        str | None,
        typer.Option(
            "--language",
            envvar="TIERED_MEMORY_LANGUAGE",
            help="The tier's language, as ChromaLongMemory(language=...): it picks the "
            "embedding model (zh: multilingual-E5 when its extra is installed). Give the "
            "application's, so search and reindex use its model.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Where the tiers are: one store for the command, closed when it ends."""
    tolerant_output()
    store = Store(
        url=url or None,
        home=home or default_home(),
        chroma_host=chroma_host or None,
        chroma_port=chroma_port,
        collection=collection,
        table=table,
        language=language or None,
    )
    ctx.obj = store
    ctx.call_on_close(store.close)


def _store(ctx: typer.Context) -> Store:
    store = ctx.find_object(Store)
    if store is None:  # a command invoked without the app's callback
        msg = "no store: run the command through the tiered-memory app"
        raise CliError(msg)
    return store


def chars_option(item: str) -> typer.models.OptionInfo:
    """The ``--chars`` option of a command that shows ``item``s cut to a length."""
    return typer.Option("--chars", help=f"Characters shown per {item}; 0 for all.")


# -- commands -----------------------------------------------------------------


@app.command()
@friendly_errors
def sessions(
    ctx: typer.Context,
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user's sessions.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
) -> None:
    """List sessions, most recent first, with message and memory counts."""
    store = _store(ctx)
    backup = store.backup()
    found = backup.sessions(user_id=validate_optional_id(user, "user"))
    console = out()
    if not found:
        console.print(Text(f"no sessions in {backup!r}" + (f" for user {user!r}" if user else "")))
        return
    grid = Table(title=f"{len(found)} sessions in {backup!r}", title_justify="left")
    for column in ("session", "user", "messages", "memories", "first message", "last active"):
        grid.add_column(column, justify="right" if column in ("messages", "memories") else "left")
    for info in found[:limit]:
        grid.add_row(
            Text(info.session_id),
            Text(info.user_id or "-"),
            f"{info.message_count:,}",
            f"{backup.stats(info.session_id).memory_count:,}",
            stamp(info.first_at),
            stamp(info.last_active),
        )
    console.print(grid)
    if len(found) > limit:
        console.print(Text(f"... and {len(found) - limit} more (--limit)"))


@app.command()
@friendly_errors
def show(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="The session id.")],
    limit: Annotated[int, typer.Option("--limit", min=1, help="Messages per page.")] = 20,
    before: Annotated[
        int | None,
        typer.Option(
            "--before", help="Only messages older than this id (page back).", show_default=False
        ),
    ] = None,
    chars: Annotated[int, chars_option("message")] = 300,
) -> None:
    """Show a page of a session's archived messages, oldest first (newest page by default)."""
    store = _store(ctx)
    backup = store.backup()
    counts = require_session(backup, session)
    page = backup.history(session, before_id=before, limit=limit)
    console = out()
    title = f"session {session!r}"
    if counts.user_id:
        title += f" of user {counts.user_id!r}"
    title += f": {counts.messages:,} messages, {counts.memory_count:,} long-term memories"
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
            stamp(row.created_at),
            Text(row.role, style=role_style(row.role)),
            Text(shorten(message_text(row.message), chars)),
        )
    console.print(grid)
    older = backup.history(session, before_id=page[0].id, limit=1)
    if older:
        console.print(
            Text(
                # Quoted: the id is untrusted and this line is meant to be pasted.
                f"older messages: tiered-memory show {shlex.quote(session)} --before {page[0].id}",
                style="dim",
            )
        )


@app.command()
@friendly_errors
def search(
    ctx: typer.Context,
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
    chars: Annotated[int, chars_option("memory")] = 300,
) -> None:
    """Search long-term memories (hybrid dense + BM25) of a session or of its user."""
    store = _store(ctx)
    backup = store.backup()
    owner = require_session(backup, session).user_id
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
    print_memories(
        docs,
        f"{len(docs)} memories for {query!r} "
        + (f"in session {session!r}" if scope is Scope.session else f"of user {user_id!r}"),
        chars,
    )


@app.command()
@friendly_errors
def export(
    ctx: typer.Context,
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
) -> None:
    """Export every archived message of a session as Markdown or JSON lines."""
    store = _store(ctx)
    backup = store.backup()
    require_session(backup, session)
    rows = all_history(backup, session)
    if not rows:
        msg = f"session {session!r} has memories but no archived messages"
        raise CliError(msg)
    document = export_md(session, rows) if fmt is ExportFormat.md else export_jsonl(rows)
    if output is None:
        # To a terminal its controls are escaped; to a pipe or a file it is data, exact.
        sys.stdout.write(for_terminal(document) if sys.stdout.isatty() else document)
        sys.stdout.flush()
        return
    output.write_text(document, encoding="utf-8", errors="backslashreplace")
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        Text(f"wrote {len(rows)} messages of session {session!r} to {output}")
    )


@app.command()
@friendly_errors
def forget(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="The session id.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove a session from every tier: jobs, Chroma vectors, MEMORY.md, catalog, archive."""
    store = _store(ctx)
    backup = store.backup()
    counts = require_session(backup, session)
    messages, memories = counts.messages, counts.memory_count
    what = f"session {session!r} ({messages:,} messages, {memories:,} long-term memories)"
    if not yes and not typer.confirm(f"Forget {what} from every tier?"):
        # Declining is an answer, not a failure: exit 0, and say nothing changed.
        out().print(Text(f"kept {what}: nothing was forgotten"))
        return
    notes: list[str] = []
    try:
        store.long_memory(connect=True)  # registers the removal of its Chroma vectors
    except ImportError:
        if memories:
            raise
        notes.append("no chroma extra installed: no vectors to remove")
    store.consolidator()  # registers the removal of the MEMORY.md files
    removed = backup.forget(session_id=session)
    console = out()
    console.print(Text(f"forgot {what}: {removed:,} archived messages removed"))
    for note in notes:
        console.print(Text(note, style="dim"))


@app.command()
@friendly_errors
def reindex(ctx: typer.Context) -> None:
    """Embed the memory catalog again with the tier's model and rebuild Chroma from it."""
    store = _store(ctx)
    store.backup()
    memory = store.long_memory(connect=True)
    started = time.perf_counter()
    done = memory.reindex(progress=True)
    out().print(
        Text(
            f"reindexed {done:,} memories into the {store.chroma_location()} "
            f"in {time.perf_counter() - started:.1f} s"
        )
    )


def _chroma_vectors(store: Store) -> str:
    server = store.chroma_server()
    if server is None and not store.chroma_path.exists():
        return "0 (no embedded Chroma store yet)"
    try:
        client = make_chroma_client(
            None,
            None if server else store.chroma_path,
            server[0] if server else None,
            server[1] if server else store.chroma_port,
        )
    except ImportError:
        return "? (the chroma extra is not installed)"
    except Exception as exc:  # an unreachable server: the other figures still count
        return f"? ({first_line(exc)})"
    try:
        collection = client.get_collection(store.collection)
    except Exception:  # NotFoundError, or a ValueError on older chromadb
        return f"0 (no collection {store.collection!r})"
    return f"{collection.count():,}"


@app.command()
@friendly_errors
def stats(ctx: typer.Context) -> None:
    """Counts per tier, the job queue's depth and the storage sizes."""
    store = _store(ctx)
    backup = store.backup()
    numbers = backup.stats()
    grid = Table(title=Text(f"tiered memory: {backup!r}"), title_justify="left")
    grid.add_column("tier")
    grid.add_column("what")
    grid.add_column("value", overflow="fold")

    def row(tier: str, what: str, value: str) -> None:
        grid.add_row(tier, what, Text(value))

    row("archive", "messages", f"{numbers.messages:,}")
    row("archive", "sessions", f"{numbers.sessions:,}")
    row("archive", "users", f"{numbers.users:,}")
    row("archive", "pieces of large messages", f"{numbers.parts:,}")
    if numbers.first_at is not None and numbers.last_at is not None:
        row(
            "archive",
            "first / last message",
            f"{stamp(numbers.first_at)} / {stamp(numbers.last_at)}",
        )
    kinds = numbers.memories
    detail = ", ".join(f"{count:,} {kind}" for kind, count in sorted(kinds.items()))
    row(
        "long-term",
        "memories (catalog)",
        f"{numbers.memory_count:,}" + (f" ({detail})" if detail else ""),
    )
    row("long-term", "vectors in Chroma", _chroma_vectors(store))
    row("long-term", "location", store.chroma_location())
    row("consolidation", "sessions with MEMORY.md", f"{numbers.consolidated:,}")
    row(
        "consolidation",
        "HISTORY.md batches",
        f"{numbers.history_batches:,} ({numbers.raw_batches:,} archived raw)",
    )
    row("queue", "depth (jobs not finished)", f"{numbers.queue_depth:,}")
    for job in numbers.jobs:
        since = f" (oldest queued {stamp(job.oldest)} UTC)" if job.oldest else ""
        row("queue", f"{job.kind} {job.state}", f"{job.count:,}{since}")
    row("queue", "jobs that failed at least once", f"{numbers.retrying:,}")
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
        row("storage", "archive (SQLite file + WAL)", f"{size(total)} in {path}")
    else:
        tables = numbers.table_bytes
        row("storage", "archive tables (data + indexes)", "?" if tables is None else size(tables))
    for what, folder in (
        ("embedded Chroma", None if store.chroma_server() else store.chroma_path),
        ("MEMORY.md / HISTORY.md files", store.memory_root),
    ):
        if folder is not None:
            found = folder.exists()
            row("storage", what, f"{size(folder_size(folder))} in {folder}" if found else "-")
    out().print(grid)


@app.command()
@friendly_errors
def demo(
    ctx: typer.Context,
    scripted: Annotated[
        bool,
        typer.Option("--scripted", help="Use the scripted model even when a real LLM is found."),
    ] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary home folder to explore it.")
    ] = False,
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
    console = out()
    given = _store(ctx)
    # The demo plays in a fresh folder unless --home (or $TIERED_MEMORY_HOME) names one.
    temporary = ctx.find_root().params.get("home") is None
    home = Path(tempfile.mkdtemp(prefix="tiered-memory-demo-")) if temporary else given.home
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
    store = replace(given, home=home)
    try:
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
        store.close()
        console.print()
        console.print(Text(f"demo finished in {time.perf_counter() - started:.1f} s", style="bold"))
        if temporary and not keep:
            console.print(
                Text("the temporary home is removed; --keep keeps it to explore", style="dim")
            )
        else:
            console.print(
                Text(
                    f"explore: tiered-memory --home {shlex.quote(str(home))} sessions; "
                    f"tiered-memory --home {shlex.quote(str(home))} search "
                    f"{DEMO_USER}-month-end{run_id} overdue --scope user",
                    style="dim",
                )
            )
    finally:
        store.close()
        if temporary and not keep:
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    """Entry point of ``python -m langchain_tiered_memory.cli.app``."""
    app()


if __name__ == "__main__":
    main()
