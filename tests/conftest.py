"""Shared fixtures: the same suite runs against SQLite and a real MySQL/MariaDB.

MySQL comes from ``TIERED_MEMORY_MYSQL_URL`` (default: root on 127.0.0.1:3306,
database ``test``). Locally an unreachable server skips the MySQL cases; in CI
(``CI=true``) it fails them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

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


def _drop(backup: MySQLBackup) -> None:
    backup.metadata.drop_all(backup.engine, checkfirst=True)
    backup.dispose()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own TIERED_MEMORY_HOME."""
    home = tmp_path / "home"
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(home))
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
