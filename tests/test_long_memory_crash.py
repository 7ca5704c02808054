"""Crashes: a writer killed with SIGKILL, a worker dying between Chroma and the catalog.

Each child is a real process (``python -c``) on the same archive (SQLite file or the
MariaDB server) and the same embedded Chroma folder; the parent recovers with a
fresh ``ChromaLongMemory`` and checks that nothing was lost or duplicated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import HashEmbeddings
from .long_memory_support import catalog, job_rows, sources, turn_ids

REPO = Path(__file__).resolve().parents[1]
TURNS = 40
KILL_AFTER = 29  # the parent kills the writer once this turn is acknowledged


def _child(script: str, *args: str, **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        text=True,
        **kwargs,  # type: ignore[arg-type]
    )


def _recover(backup: MySQLBackup, chroma_dir: Path, collection: str) -> ChromaLongMemory:
    """A fresh memory on the same archive and Chroma folder; its worker re-drives jobs."""
    memory = ChromaLongMemory(
        persist_directory=chroma_dir,
        collection_name=collection,
        embedding=HashEmbeddings(),
        backup=backup,
        poll_interval=0.05,
    )
    memory.flush(timeout=60)
    return memory


def _assert_one_memory_per_turn(
    backup: MySQLBackup, memory: ChromaLongMemory, sessions: list[str]
) -> None:
    assert job_rows(backup) == []
    total = 0
    for session_id in sessions:
        turns = turn_ids(backup, session_id)
        rows = catalog(backup, session_id)
        # Exactly one memory per turn, whose provenance is that turn, in turn order.
        assert [sources(row) for row in rows] == turns
        total += len(rows)
        found = memory.collection.get(ids=[row.id for row in rows], include=[])["ids"]
        assert sorted(found) == sorted(row.id for row in rows)
    assert len(catalog(backup)) == total
    assert memory.collection.count() == total  # no orphan or duplicate vectors


_WRITER = r"""
import sys, time
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from tests.fakes import HashEmbeddings, replies


class SlowExtractor(GenericFakeChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        time.sleep(0.05)
        tail = str(messages[-1].content).rsplit("User: ", 1)[-1]
        message = AIMessage("Summary: " + tail.split("\n")[0])
        return ChatResult(generations=[ChatGeneration(message=message)])


url, table, chroma_dir, collection, turns = sys.argv[1:6]
backup = MySQLBackup(url, table_name=table)
memory = ChromaLongMemory(
    persist_directory=chroma_dir, collection_name=collection, embedding=HashEmbeddings(),
    backup=backup, extractor=SlowExtractor(messages=replies()), poll_interval=0.05,
)
for n in range(int(turns)):
    chat = TieredChatMessageHistory(f"c{n % 2}", user_id="u", backup=backup, long_memory=memory)
    chat.add_messages([HumanMessage(f"crash question {n}"), AIMessage(f"crash answer {n}")])
    print(f"ack {n}", flush=True)
    time.sleep(0.01)
time.sleep(600)
"""


@pytest.mark.slow
def test_writer_killed_while_jobs_are_pending(backup: MySQLBackup, tmp_path: Path) -> None:
    url = backup.url.render_as_string(hide_password=False)
    chroma_dir = tmp_path / "chroma"
    writer = _child(
        _WRITER,
        url,
        backup.table.name,
        str(chroma_dir),
        "crash",
        str(TURNS),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    acknowledged = -1
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            if line.startswith("ack "):
                acknowledged = int(line.split()[1])
                if acknowledged >= KILL_AFTER:
                    break
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    assert acknowledged >= KILL_AFTER
    assert len(job_rows(backup)) > 0  # killed while extraction jobs were pending

    # Every acknowledged turn is archived exactly once; an unacknowledged one wholly or not at all.
    for n in range(TURNS):
        contents = [str(m.content) for m in backup.get_messages(f"c{n % 2}")]
        questions = contents.count(f"crash question {n}")
        assert questions == contents.count(f"crash answer {n}")
        assert questions == 1 if n <= acknowledged else questions <= 1

    memory = _recover(backup, chroma_dir, "crash")
    try:
        _assert_one_memory_per_turn(backup, memory, ["c0", "c1"])
    finally:
        memory.close()


_DIES_AFTER_UPSERT = r"""
import os, sys
from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from tests.fakes import HashEmbeddings

url, table, chroma_dir, collection = sys.argv[1:5]
memory = ChromaLongMemory(
    persist_directory=chroma_dir, collection_name=collection, embedding=HashEmbeddings(),
    backup=MySQLBackup(url, table_name=table), start_worker=False,
)
upsert = memory.collection.upsert


def upsert_then_die(**kwargs):
    upsert(**kwargs)
    os._exit(17)  # Chroma has the vector; the catalog commit never happens


memory.collection.upsert = upsert_then_die
memory.run_pending()
"""


def test_worker_dying_between_chroma_and_the_catalog_loses_nothing(
    backup: MySQLBackup, tmp_path: Path
) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    chroma_dir = tmp_path / "chroma"
    backup.add_messages(
        "d",
        [HumanMessage("what is the AR table?"), AIMessage("a ledger of invoices")],
        user_id="u",
        jobs=["extract"],
    )
    url = backup.url.render_as_string(hide_password=False)
    child = _child(_DIES_AFTER_UPSERT, url, backup.table.name, str(chroma_dir), "dies")
    assert child.wait(timeout=120) == 17
    [job] = job_rows(backup)
    assert job.state == "running"  # claimed by the dead process
    assert catalog(backup) == []

    memory = _recover(backup, chroma_dir, "dies")
    try:
        _assert_one_memory_per_turn(backup, memory, ["d"])
        [doc] = memory.search("AR table", session_id="d")
        assert doc.page_content == "User: what is the AR table?\nAI: a ledger of invoices"
    finally:
        memory.close()
