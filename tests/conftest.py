"""Shared fixtures: the same suite runs against SQLite and a real MySQL/MariaDB.

MySQL comes from ``TIERED_MEMORY_MYSQL_URL`` (default: root on 127.0.0.1:3306,
database ``test``). Locally an unreachable server skips the MySQL cases; in CI
(``CI=true``) it fails them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa

from langchain_tiered_memory import MySQLBackup

MYSQL_URL = os.environ.get("TIERED_MEMORY_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def mysql_reachable() -> str | None:
    """None when the server answers, else the reason it does not."""
    engine = sa.create_engine(MYSQL_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except sa.exc.SQLAlchemyError as exc:
        return str(exc).splitlines()[0]
    finally:
        engine.dispose()


def require_mysql() -> None:
    """Skip locally, fail in CI, when the MySQL server cannot be reached."""
    reason = mysql_reachable()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"MySQL at {MYSQL_URL} is unreachable in CI: {reason}")
    pytest.skip(f"MySQL at {MYSQL_URL} is unreachable (CI would fail): {reason}")


def rows_read(backup: MySQLBackup, table: str, run: Callable[[], Any]) -> int:
    """How many rows of ``table`` the SELECTs that ``run`` sends return (counted again after).

    Only ``table`` itself is matched (a word: ``<name>_parts`` is another table); a
    ``SELECT ... FOR UPDATE`` is a lock, not a read, and is left out.
    """
    name = re.compile(rf"\b{re.escape(table)}\b")
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and name.search(statement):
            seen.append((statement, parameters))

    sa.event.listen(backup.engine, "before_cursor_execute", record)
    try:
        run()
    finally:
        sa.event.remove(backup.engine, "before_cursor_execute", record)
    assert seen, f"no SELECT on {table} at all"
    with backup.engine.connect() as conn:
        return sum(
            conn.exec_driver_sql(f"SELECT COUNT(*) FROM ({statement}) AS q", parameters).scalar()
            for statement, parameters in seen
            if "FOR UPDATE" not in statement.upper()
        )


def require_module(name: str, extra: str) -> ModuleType:
    """Import ``name``, an optional dependency: skip locally, fail in CI, when it is missing.

    For a test module's top level, in place of ``pytest.importorskip`` (which skips in CI too).
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        error = str(exc)
    if IN_CI:
        pytest.fail(f"{name} is missing in CI (the {extra!r} extra): {error}", pytrace=False)
    pytest.skip(f"{name} is missing (the {extra!r} extra; CI would fail)", allow_module_level=True)


def _drop(backup: MySQLBackup) -> None:
    backup.metadata.drop_all(backup.engine, checkfirst=True)
    backup.dispose()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own TIERED_MEMORY_HOME (and no TIERED_MEMORY_URL)."""
    home = tmp_path / "home"
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(home))
    monkeypatch.delenv("TIERED_MEMORY_URL", raising=False)
    return home


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for each backend: a fresh SQLite file, or the MySQL server."""
    if request.param == "mysql":
        require_mysql()
        return MYSQL_URL
    return f"sqlite:///{tmp_path / 'archive.sqlite3'}"


@pytest.fixture
def table_name() -> str:
    """A table name of its own, so tests never see each other's rows."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def backup(backend_url: str, table_name: str) -> Iterator[MySQLBackup]:
    """A fresh archive on each backend, dropped afterwards."""
    archive = MySQLBackup(backend_url, table_name=table_name)
    yield archive
    _drop(archive)


@pytest.fixture
def sqlite_backup(tmp_path: Path) -> Iterator[MySQLBackup]:
    """A SQLite archive, for tests where the backend does not matter or is SQLite's."""
    archive = MySQLBackup(f"sqlite:///{tmp_path / 'lm.sqlite3'}", table_name="lm")
    yield archive
    archive.dispose()


# -- long-term memory: Chroma (embedded and a real server) ---------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def chroma_settings() -> Any:
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


@pytest.fixture(scope="session")
def chroma_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One embedded PersistentClient for the session; tests isolate by collection name."""
    import chromadb

    path = tmp_path_factory.mktemp("chroma-embedded")
    return chromadb.PersistentClient(path=str(path), settings=chroma_settings())


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real ``chroma run`` server on a free port, for the whole session."""
    import chromadb

    executable = Path(sys.executable).with_name("chroma")
    if not executable.exists():  # pragma: no cover - the venv always has it
        pytest.fail(f"no chroma executable next to {sys.executable}")
    data = tmp_path_factory.mktemp("chroma-server")
    log_path = data.parent / f"{data.name}.log"
    port = _free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(executable),
                "run",
                "--path",
                str(data),
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"chroma run exited with {process.returncode}: {log_path.read_text()}")
            try:
                chromadb.HttpClient(
                    host="127.0.0.1", port=port, settings=chroma_settings()
                ).heartbeat()
                break
            except Exception:
                if time.monotonic() > deadline:
                    pytest.fail(f"chroma server did not answer within 60 s: {log_path.read_text()}")
                time.sleep(0.2)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture
def collection_name() -> str:
    """A Chroma collection of its own."""
    return f"lm_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_memory(
    backup: MySQLBackup, chroma_client: Any, collection_name: str
) -> Iterator[Callable[..., Any]]:
    """Build ``ChromaLongMemory`` instances on the test's archive; closed afterwards.

    Defaults: the session's embedded client, the test's collection, ``HashEmbeddings``,
    no worker thread (call ``run_pending``/``flush``).
    """
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

    from .fakes import HashEmbeddings

    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        if not {"client", "host", "persist_directory"} & kwargs.keys():
            kwargs["client"] = chroma_client
        kwargs.setdefault("backup", backup)
        kwargs.setdefault("embedding", HashEmbeddings())
        kwargs.setdefault("collection_name", collection_name)
        kwargs.setdefault("start_worker", False)
        memory = ChromaLongMemory(**kwargs)
        made.append(memory)
        return memory

    yield make
    for memory in made:
        memory.close(timeout=10)
    dropped: set[tuple[int, str]] = set()
    for memory in made:
        key = (id(memory.client), memory.collection.name)
        if key in dropped:
            continue
        dropped.add(key)
        with contextlib.suppress(Exception):  # already gone, or the server is down
            memory.client.delete_collection(memory.collection.name)


# -- a MariaDB user with a password ---------------------------------------------------


@pytest.fixture
def mysql_user() -> Iterator[tuple[str, str]]:
    """A MariaDB user of the test's own with a password: ``(user, password)``."""
    require_mysql()
    user, password = f"tm_{uuid.uuid4().hex[:10]}", f"Pw-{uuid.uuid4().hex}"
    root = sa.create_engine(MYSQL_URL)
    database = sa.make_url(MYSQL_URL).database
    hosts = ("%%", "localhost")  # %% is PyMySQL's escape for the wildcard host %
    with root.begin() as conn:
        for host in hosts:
            conn.exec_driver_sql(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{password}'")
            conn.exec_driver_sql(f"GRANT ALL ON `{database}`.* TO '{user}'@'{host}'")
    try:
        yield user, password
    finally:
        with root.begin() as conn:
            for host in hosts:
                conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'{host}'")
        root.dispose()


@pytest.fixture
def make_consolidator(backup: MySQLBackup, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Build ``MemoryConsolidator`` instances on the test's archive; closed afterwards.

    Defaults: files under ``tmp_path/memory``, no worker thread, threshold 4, batch 2.
    """
    from langchain_tiered_memory import MemoryConsolidator

    made: list[Any] = []

    def make(llm: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("root", tmp_path / "memory")
        kwargs.setdefault("backup", backup)
        kwargs.setdefault("start_worker", False)
        kwargs.setdefault("retry_base_delay", 0.01)
        kwargs.setdefault("threshold", 4)
        kwargs.setdefault("batch", 2)
        consolidator = MemoryConsolidator(llm, **kwargs)
        made.append(consolidator)
        return consolidator

    yield make
    for consolidator in made:
        consolidator.close(timeout=10)
