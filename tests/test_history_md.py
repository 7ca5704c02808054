"""HISTORY.md holds whole entries, equal to the database, whatever stops an append.

A kill in the middle of an append (a real SIGKILL of a worker process, and a torn
tail written by hand), a full disk, a missing file and a retry in another minute
all end with HISTORY.md equal to the history_log rows and MEMORY.md equal to the
database. A disk error is never counted as an LLM failure, so it never turns a
batch into a ``[RAW]`` one.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import langchain_tiered_memory.tiers.consolidation as consolidation_module
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator

from .long_memory_support import job_rows
from .test_consolidation import FakeLLM, chat, log_rows, message_ids

REPO = Path(__file__).resolve().parents[1]


def assert_files_match(consolidator: MemoryConsolidator, session_id: str, batches: int) -> None:
    """HISTORY.md is the database's entries, whole; MEMORY.md the database's; no RAW."""
    rows = log_rows(consolidator.backup, session_id)
    assert len(rows) == batches
    assert [row.raw for row in rows] == [0] * batches
    folder = consolidator.folder(session_id)
    history_md = (folder / "HISTORY.md").read_text(encoding="utf-8")
    assert history_md == "".join(row.entry for row in rows)
    assert (folder / "MEMORY.md").read_text(encoding="utf-8") == consolidator.memory(session_id)
    assert job_rows(consolidator.backup) == []


def tearing_fsync(size_before: int, times: int, then: Callable[[], None]) -> Any:
    """``os.fsync`` that tears the next ``times`` appends to HISTORY.md.

    At an fsync of HISTORY.md it keeps only half of the bytes written past
    ``size_before`` (what a kill or a full disk in the middle of the write leaves),
    then calls ``then`` (which kills the process or raises).
    """
    real = os.fsync
    left = [times]

    def fsync(fd: int) -> None:
        if left[0] and os.readlink(f"/proc/self/fd/{fd}").endswith("/HISTORY.md"):
            left[0] -= 1
            size = os.fstat(fd).st_size
            os.ftruncate(fd, size - (size - size_before) // 2)
            real(fd)
            then()
        real(fd)

    return fsync


# -- torn entries ----------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["torn-first", "torn-second", "missing", "foreign"])
def test_a_damaged_history_md_is_repaired_to_the_database(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator], damage: str
) -> None:
    consolidator = make_consolidator(FakeLLM())
    history = TieredChatMessageHistory("t", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    path = consolidator.folder("t") / "HISTORY.md"
    if damage != "torn-first":
        consolidator.flush(timeout=30)  # batch 1 is whole on disk and committed
        history.add_messages(chat(6, 7))  # batch 2 is due
    ids = message_ids(backup, "t")
    first, last = (ids[0], ids[1]) if damage == "torn-first" else (ids[2], ids[3])
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage.startswith("torn"):  # a kill mid-append: header and marker, half a body
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(
                f"\n## [2001-01-01 00:00] 2 messages #{first}-#{last}\n"
                f"<!-- batch {first}-{last} -->\n\nUser: M00"
            )
    elif damage == "missing":
        path.unlink()
    else:  # a file that holds none of the database's entries
        path.write_text("# notes someone typed here\n", encoding="utf-8")
    consolidator.flush(timeout=30)
    assert_files_match(consolidator, "t", 1 if damage == "torn-first" else 2)


_CHILD = r"""
import os, signal, sys
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from tests import test_history_md as support

url, table, root, size = sys.argv[1:5]


class ChildLLM(GenericFakeChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        return ChatResult(generations=[ChatGeneration(message=AIMessage("# child memory"))])


os.fsync = support.tearing_fsync(int(size), 1, lambda: os.kill(os.getpid(), signal.SIGKILL))
consolidator = MemoryConsolidator(
    ChildLLM(messages=iter(())), root=root, backup=MySQLBackup(url, table_name=table),
    threshold=4, batch=2, start_worker=False,
)
consolidator.run_pending()
sys.exit(3)  # not reached: the append above kills this process
"""


@pytest.mark.slow
def test_a_worker_killed_mid_append_leaves_no_torn_entry(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator], tmp_path: Path
) -> None:
    """A real SIGKILL while HISTORY.md holds half of an appended entry."""
    consolidator = make_consolidator(FakeLLM())
    history = TieredChatMessageHistory("k", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)
    history.add_messages(chat(6, 7))  # batch 2 is due: the child appends it and dies
    path = consolidator.folder("k") / "HISTORY.md"
    before = path.read_bytes()
    url = backup.url.render_as_string(hide_password=False)
    args = [url, backup.table.name, str(consolidator.root), str(len(before))]
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    torn = path.read_bytes()
    assert torn.startswith(before) and len(torn) > len(before)  # half an entry
    assert len(log_rows(backup, "k")) == 1  # batch 2 was never committed
    recovered = make_consolidator(FakeLLM(answer="# recovered"))
    recovered.flush(timeout=30)  # re-drives the dead worker's job at once
    assert_files_match(recovered, "k", 2)
    assert recovered.memory("k") == "# recovered\n"


# -- disk errors -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["memory", "history"])
def test_a_full_disk_is_retried_and_never_archives_raw(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """With max_attempts=1 a single counted failure would archive the batch raw."""
    llm = FakeLLM()  # a new MEMORY.md each call
    consolidator = make_consolidator(llm, max_attempts=1)
    history = TieredChatMessageHistory("d", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)
    history.add_messages(chat(6, 7))  # batch 2: an append to HISTORY.md
    failures = [3]
    if where == "memory":  # MEMORY.md cannot be written at all
        write = consolidation_module.atomic_write

        def full(path: Path, text: str) -> None:
            if failures[0]:
                failures[0] -= 1
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            write(path, text)

        monkeypatch.setattr(consolidation_module, "atomic_write", full)
    else:  # the append to HISTORY.md stops half way, three times

        def full() -> None:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")

        size = len((consolidator.folder("d") / "HISTORY.md").read_bytes())
        monkeypatch.setattr(os, "fsync", tearing_fsync(size, 3, full))
    with caplog.at_level(logging.ERROR, logger="langchain_tiered_memory.tiers.consolidation"):
        consolidator.flush(timeout=30)
    monkeypatch.undo()
    assert failures == [0]
    assert llm.calls.count == 1 + 4  # batch 1, then batch 2 three times in vain and once more
    assert_files_match(consolidator, "d", 2)
    assert consolidator.memory("d") == "# Memory v5\n"  # the last call's answer
    disk_errors = [
        r.getMessage() for r in caplog.records if "not counted as an LLM failure" in r.getMessage()
    ]
    assert len(disk_errors) == 3
    assert "No space left on device" in disk_errors[0]


def test_a_memory_md_left_undecodable_is_rewritten_not_counted_against_the_llm(
    backup: MySQLBackup, make_consolidator: Callable[..., MemoryConsolidator]
) -> None:
    """MEMORY.md re-saved by an editor in GBK (or a damaged block): it follows the database.

    Reading it as UTF-8 raised UnicodeDecodeError, a failure of the LLM for the
    queue: every attempt failed alike, even the raw fallback, so the job never finished.
    """
    llm = FakeLLM(answer="# 记忆\n- 用户偏好 CSV")
    consolidator = make_consolidator(llm, max_attempts=1)
    history = TieredChatMessageHistory("gbk", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    consolidator.flush(timeout=30)
    path = consolidator.folder("gbk") / "MEMORY.md"
    path.write_bytes(path.read_text(encoding="utf-8").encode("gbk"))
    history.add_messages(chat(6, 7))
    consolidator.flush(timeout=30)
    assert llm.calls.count == 2  # no failed attempt
    assert_files_match(consolidator, "gbk", 2)
    assert path.read_text(encoding="utf-8") == "# 记忆\n- 用户偏好 CSV\n"


# -- a retry in another minute ---------------------------------------------------------


def test_a_retry_in_another_minute_writes_the_same_entry(
    backup: MySQLBackup,
    make_consolidator: Callable[..., MemoryConsolidator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The files are written, the commit fails, and the clock has moved on at the retry."""
    consolidator = make_consolidator(FakeLLM())
    history = TieredChatMessageHistory("m", backup=backup, consolidator=consolidator)
    history.add_messages(chat(1, 5))
    later = timedelta(0)
    utcnow = consolidation_module.utcnow
    monkeypatch.setattr(consolidation_module, "utcnow", lambda: utcnow() + later)
    commit = consolidator._commit_plan
    crashed: list[int] = []

    def commit_then_crash(*args: Any) -> Any:
        nonlocal later
        done = yield from commit(*args)
        if not crashed:  # rolled back; the retry runs seven minutes later
            crashed.append(1)
            later = timedelta(minutes=7)
            msg = "crash before COMMIT"
            raise RuntimeError(msg)
        return done

    monkeypatch.setattr(consolidator, "_commit_plan", commit_then_crash)
    consolidator.flush(timeout=30)
    assert crashed
    assert_files_match(consolidator, "m", 1)
