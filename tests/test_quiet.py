"""A quiet library: no third-party progress bar or banner in a user's output unless asked.

A real script in its own interpreter builds the default embedding (all-MiniLM-L6-v2 from
its package, which transformers loads with a ``Loading weights`` bar) and the default
long-term tier, uses them, and exits; everything it wrote to stdout and stderr is checked.
Also here: an unsupported database (or driver) is one typed error naming the supported
ones, and a supported one works however its URL spells the driver.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from sqlalchemy.engine import make_url

from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.storage.archive import UnsupportedDatabaseError

from .scripts import run_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = """
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import ChromaLongMemory, TieredChatMessageHistory
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

vector = MiniLMEmbeddings({arguments}).embed_query("Which fields has ar_invoice?")
long_memory = ChromaLongMemory()          # the embedded defaults: MiniLM, SQLite, Chroma
history = TieredChatMessageHistory("s1", long_memory=long_memory)
history.add_messages([HumanMessage("Invoices are due in 30 days."), AIMessage("Noted.")])
long_memory.shutdown(drain_timeout=120)
found = long_memory.search("when are invoices due?", session_id="s1")
print("RESULT", len(vector), len(found))
"""


def test_the_default_embedding_and_tier_print_nothing(tmp_path: Path) -> None:
    done = run_python(SCRIPT.format(arguments=""), tmp_path)
    assert done.stdout == "RESULT 384 1\n"
    assert done.stderr == ""  # no progress bar, no banner, no warning


def test_progress_true_shows_the_bar(tmp_path: Path) -> None:
    # The same script, asking for it: the bar the default hides is really there.
    done = run_python(SCRIPT.format(arguments="progress=True"), tmp_path)
    assert "Loading weights" in done.stderr
    assert done.stdout.endswith("RESULT 384 1\n")


#: How every refusal ends: the databases the archive runs on, one line.
SUPPORTED = (
    "; supported databases: SQLite and MySQL/MariaDB (sqlite:///path.db, "
    "mysql+pymysql://user:pw@host/db, mariadb+pymysql://user:pw@host/db)"
)


@pytest.mark.parametrize(
    ("url", "backend", "driver"),
    [
        ("postgresql://app:secret@db/chat", "postgresql", None),
        ("postgresql+psycopg://app:secret@db/chat", "postgresql", None),
        ("mssql+pyodbc://app:secret@dsn", "mssql", None),
        # Another driver of a supported database.
        ("mysql+mysqlconnector://app:secret@db/chat", "mysql", "mysqlconnector"),
        ("mariadb+mariadbconnector://app:secret@db/chat", "mariadb", "mariadbconnector"),
        ("sqlite+pysqlcipher://:secret@/chat.db", "sqlite", "pysqlcipher"),
    ],
)
def test_an_unsupported_database_or_driver_is_one_typed_error(
    url: str, backend: str, driver: str | None
) -> None:
    with pytest.raises(UnsupportedDatabaseError) as caught:
        MySQLBackup(url)
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.backend, error.driver) == (backend, driver)
    message = str(error)
    assert "\n" not in message and "secret" not in message
    if driver is None:
        assert message == f"the archive does not run on {backend!r}{SUPPORTED}"
    else:
        assert message.startswith(f"the archive does not run {backend} through {driver!r}")
        assert message.endswith(SUPPORTED)


@pytest.mark.parametrize(
    "spelling",
    [
        "{backend}",  # no driver: the archive's own
        "{BACKEND}",  # names are case-insensitive
        "{backend}+{async_driver}",  # the async twin: the archive derives it itself
        "{BACKEND}+{SYNC_DRIVER}",
    ],
)
def test_a_supported_database_works_however_its_url_spells_the_driver(
    backend_url: str, table_name: str, spelling: str
) -> None:
    url = make_url(backend_url)
    backend = url.get_backend_name()
    names = {
        "backend": backend,
        "BACKEND": backend.upper(),
        "async_driver": {"sqlite": "aiosqlite", "mysql": "aiomysql"}[backend],
        "SYNC_DRIVER": {"sqlite": "pysqlite", "mysql": "pymysql"}[backend].upper(),
    }
    spelled = url.set(drivername=spelling.format(**names))
    archive = MySQLBackup(spelled, table_name=table_name)
    try:
        archive.add_messages("s1", [HumanMessage("kept")])

        async def read() -> list[str]:
            try:
                return [str(m.content) for m in await archive.aget_messages("s1")]
            finally:
                await archive.adispose()

        assert asyncio.run(read()) == ["kept"]
        assert [str(m.content) for m in archive.get_messages("s1")] == ["kept"]
    finally:
        archive.metadata.drop_all(archive.engine)
        archive.dispose()
