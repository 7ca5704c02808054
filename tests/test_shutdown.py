"""Scripts end cleanly: context managers, a bounded drain, and the drain at interpreter exit.

The exit cases run real scripts in their own interpreter, on a SQLite archive and an
embedded Chroma in a temporary folder, and end without closing anything: afterwards the
memory must exist, or, with an extractor slower than the bound, the job must still be
queued, the script must have printed one line saying so, and the next process must
finish it.
"""

from __future__ import annotations

import gc
import json
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langchain_tiered_memory import (
    ChromaLongMemory,
    MySQLBackup,
    TieredChatMessageHistory,
)
from langchain_tiered_memory.cli.llms import ScriptedChatModel
from langchain_tiered_memory.core.lifecycle import DRAIN_TIMEOUT, drain_at_exit, drain_live
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

from .fakes import HashEmbeddings, turn
from .long_memory_support import catalog, wait_until
from .scripts import run_python

pytestmark = pytest.mark.timeout(600)


def workers() -> set[threading.Thread]:
    """The package's worker threads alive in this process."""
    return {t for t in threading.enumerate() if t.name.startswith("tiered-memory-")}


def _batch_helper(thread: threading.Thread) -> bool:
    """A thread that lives for one batch: its lease heartbeat, or an LLM call."""
    return thread.name.endswith("-heartbeat") or thread.name == "tiered-memory-llm-call"


def new_workers(before: set[threading.Thread]) -> list[str]:
    """The names of the workers alive now that were not in ``before``.

    An earlier test's worker may still be ending in this process (a batch it did not
    wait for), so a test counts only the threads it started.

    A batch's heartbeat thread is told to stop as the batch ends, and is not joined:
    it ends a moment later, on its own schedule. A drain can return (its jobs
    committed) and a worker be joined while it is still alive, so the helpers this
    test started get a bounded wait to end first (one that never ends is listed).
    """
    wait_until(lambda: not any(_batch_helper(t) for t in workers() - before), timeout=10)
    return sorted(t.name for t in workers() - before)


def queued(backup: MySQLBackup, kind: str = "extract") -> list[Any]:
    jobs = backup.tables.jobs

    def plan() -> Any:
        result = yield jobs.select().where(jobs.c.kind == kind)
        return result.all()

    return backup.run(plan())


#: Seconds an extraction of the slow extractor takes: far more than any drain bound here.
SLOW = 30.0


class SleepyModel(ScriptedChatModel):
    """An extractor far slower than any drain bound of these tests."""

    delay: float = SLOW

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay)
        return super()._generate(*args, **kwargs)


# -- scripts that exit without closing -------------------------------------------------

SCRIPT = """
import json, sys, time
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import ChromaLongMemory, MySQLBackup, TieredChatMessageHistory
{setup}
backup = MySQLBackup("sqlite:///archive.sqlite3")
long_memory = ChromaLongMemory(persist_directory="chroma", backup=backup, {arguments})
history = TieredChatMessageHistory("s1", user_id="u1", backup=backup, long_memory=long_memory)
history.add_messages([HumanMessage("Our fiscal year closes on March 31."),
                      AIMessage("Noted: the fiscal year closes on March 31.")])
print("WRITTEN " + json.dumps(time.monotonic()), flush=True)
# no flush, no close, no with: the interpreter's exit has to deal with it
"""


def run_script(folder: Path, arguments: str, setup: str = "") -> tuple[str, str, float]:
    """Run a one-shot script in ``folder``: (stdout, stderr, seconds from its write to its end)."""
    done = run_python(SCRIPT.format(arguments=arguments, setup=textwrap.dedent(setup)), folder)
    ended = time.monotonic()
    [written] = [line for line in done.stdout.splitlines() if line.startswith("WRITTEN ")]
    return done.stdout, done.stderr, ended - json.loads(written.removeprefix("WRITTEN "))


def reopen(folder: Path, **kwargs: Any) -> tuple[MySQLBackup, ChromaLongMemory]:
    backup = MySQLBackup(f"sqlite:///{folder / 'archive.sqlite3'}")
    kwargs.setdefault("embedding", HashEmbeddings())
    memory = ChromaLongMemory(
        persist_directory=folder / "chroma", backup=backup, start_worker=False, **kwargs
    )
    return backup, memory


@pytest.mark.slow
def test_a_script_that_exits_without_closing_leaves_its_memory_written(tmp_path: Path) -> None:
    """The issue's case: the default embedding (MiniLM, loaded at exit if need be), no close."""
    # The bound covers the model load too: generous, for a loaded machine.
    _, stderr, _ = run_script(tmp_path, "drain_timeout=120")
    assert "still queued" not in stderr, stderr
    assert "Traceback" not in stderr and "Loading weights" not in stderr, stderr
    backup, memory = reopen(tmp_path, embedding=MiniLMEmbeddings())
    try:
        assert queued(backup) == []
        [row] = catalog(backup, "s1")
        assert "fiscal year closes on March 31" in row.text
        found = memory.search("when does the fiscal year close?", session_id="s1", user_id="u1")
        assert found and "March 31" in found[0].page_content
    finally:
        memory.close()
        backup.dispose()


@pytest.mark.slow
def test_a_slow_extractor_leaves_the_job_queued_with_one_line(tmp_path: Path) -> None:
    setup = f"""
    import time
    from langchain_tiered_memory.cli.llms import ScriptedChatModel
    from tests.fakes import HashEmbeddings

    class Sleepy(ScriptedChatModel):
        def _generate(self, *args, **kwargs):
            time.sleep({SLOW})
            return super()._generate(*args, **kwargs)
    """
    _, stderr, seconds = run_script(
        tmp_path,
        "embedding=HashEmbeddings(), extractor=Sleepy(), extract_timeout=120, drain_timeout=1",
        setup,
    )
    # Bounded: the script did not wait for the 30 s extraction (1 s bound, margins for load).
    assert seconds < SLOW - 5, seconds
    notices = [line for line in stderr.splitlines() if "still queued" in line]
    assert len(notices) == 1, stderr
    assert notices[0].startswith("1 extract jobs still queued after 1 s")
    assert "next process" in notices[0] and "archive.sqlite3" in notices[0]
    assert "Traceback" not in stderr

    backup, memory = reopen(tmp_path)  # the next process: raw turns, no LLM
    try:
        [job] = queued(backup)
        assert job.session_id == "s1"
        assert catalog(backup, "s1") == []
        memory.flush(timeout=60)  # the dead script's claim is taken back at once
        assert queued(backup) == []
        [row] = catalog(backup, "s1")
        assert "March 31" in row.text
    finally:
        memory.close()
        backup.dispose()


MANY_TIERS = """
import json, time
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import ChromaLongMemory, MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.cli.llms import ScriptedChatModel
from tests.fakes import HashEmbeddings

class Sleepy(ScriptedChatModel):
    def _generate(self, *args, **kwargs):
        time.sleep({slow})
        return super()._generate(*args, **kwargs)

backup = MySQLBackup("sqlite:///archive.sqlite3")
for n in range({tiers}):
    tier = ChromaLongMemory(persist_directory="chroma", collection_name=f"tier{{n}}",
                            backup=backup, embedding=HashEmbeddings(), extractor=Sleepy(),
                            extract_timeout=120, drain_timeout={bound})
    history = TieredChatMessageHistory(f"s{{n}}", backup=backup, long_memory=tier)
    history.add_messages([HumanMessage("hello"), AIMessage("hi")])
time.sleep(1)  # every worker is inside its slow extraction
print("WRITTEN " + json.dumps(time.monotonic()), flush=True)
"""


@pytest.mark.slow
def test_the_exit_drain_of_several_busy_tiers_keeps_one_bound_in_all(tmp_path: Path) -> None:
    """The bound covers every tier's drain and the wait for its thread, together."""
    tiers, bound = 4, 0.5
    done = run_python(MANY_TIERS.format(slow=SLOW, tiers=tiers, bound=bound), tmp_path)
    ended = time.monotonic()
    [written] = [line for line in done.stdout.splitlines() if line.startswith("WRITTEN ")]
    seconds = ended - json.loads(written.removeprefix("WRITTEN "))
    # One bound (0.5 s) plus the interpreter's teardown; a second per busy tier was 4.5 s.
    assert seconds < bound + 2.5, seconds
    assert len([line for line in done.stderr.splitlines() if "still queued" in line]) == tiers
    backup = MySQLBackup(f"sqlite:///{tmp_path / 'archive.sqlite3'}")
    try:
        assert len(queued(backup)) == tiers  # left for the next process, none lost
    finally:
        backup.dispose()


# -- context managers --------------------------------------------------------------------


def test_with_a_long_memory_drains_then_stops_its_worker(
    make_memory: Any, backup: MySQLBackup
) -> None:
    before = workers()
    with make_memory(start_worker=True, idle_seconds=300) as memory:
        assert new_workers(before) == ["tiered-memory-ChromaLongMemory"]
        history = TieredChatMessageHistory("s1", backup=backup, long_memory=memory)
        history.add_messages(turn(1))
        # An open turn waits 300 s for its answer; the end of the block does not.
        history.add_messages([HumanMessage("The warehouse code is W-17.")])
    assert new_workers(before) == []
    assert queued(backup) == []
    texts = [row.text for row in catalog(backup, "s1")]
    assert len(texts) == 2 and any("W-17" in text for text in texts), texts


async def test_async_with_a_long_memory_drains_then_stops(
    make_memory: Any, backup: MySQLBackup
) -> None:
    before = workers()
    async with backup, make_memory(start_worker=True) as memory:
        history = TieredChatMessageHistory("s1", backup=backup, long_memory=memory)
        await history.aadd_messages(turn(1))
    assert new_workers(before) == []
    assert queued(backup) == []
    assert len(catalog(backup, "s1")) == 1


def sleepy_memory(make_memory: Any, drain_timeout: float) -> Any:
    """A tier with a running worker whose extraction takes 5 s (its timeout is 120 s)."""
    return make_memory(
        start_worker=True,
        extractor=SleepyModel(delay=5.0),
        extract_timeout=120,
        drain_timeout=drain_timeout,
    )


def test_shutdown_is_bounded_and_leaves_the_rest_queued(
    make_memory: Any, backup: MySQLBackup, caplog: pytest.LogCaptureFixture
) -> None:
    before = workers()
    memory = sleepy_memory(make_memory, drain_timeout=0.5)
    TieredChatMessageHistory("s1", backup=backup, long_memory=memory).add_messages(turn(1))
    with caplog.at_level("WARNING"):
        left = memory.shutdown()
    # It returned before the 5 s extraction ended: the job is queued, no memory yet.
    assert left == 1
    assert len(queued(backup)) == 1
    assert catalog(backup, "s1") == []
    notices = [r.getMessage() for r in caplog.records if "still queued" in r.getMessage()]
    assert notices == [
        f"1 extract jobs still queued after 0.5 s; they stay in {backup!r} and the next "
        "process that opens it with this tier finishes them"
    ]
    # The batch it did not wait for ends on its own (a process that exits drops it).
    assert wait_until(lambda: new_workers(before) == [], timeout=120)


def test_drain_keeps_the_worker_and_counts_nothing_left(
    make_memory: Any, backup: MySQLBackup
) -> None:
    before = workers()
    memory = make_memory(start_worker=True)
    assert memory.drain_timeout == DRAIN_TIMEOUT == 10.0
    assert memory.drain() == 0  # nothing queued: returns at once, whatever the model
    TieredChatMessageHistory("s1", backup=backup, long_memory=memory).add_messages(turn(1))
    assert memory.drain(60) == 0
    assert len(catalog(backup, "s1")) == 1
    assert new_workers(before) == ["tiered-memory-ChromaLongMemory"]  # still running
    with pytest.raises(ValueError, match="timeout"):
        memory.drain(-1)


def test_with_a_history_drains_its_tiers_and_keeps_them_running(
    make_memory: Any, backup: MySQLBackup
) -> None:
    before = workers()
    memory = make_memory(start_worker=True)
    with TieredChatMessageHistory("s1", backup=backup, long_memory=memory) as history:
        history.add_messages(turn(1))
    assert len(catalog(backup, "s1")) == 1
    # Other histories may share the tier: it keeps running after this one ends.
    assert new_workers(before) == ["tiered-memory-ChromaLongMemory"]
    TieredChatMessageHistory("s2", backup=backup, long_memory=memory).add_messages(turn(2))
    assert memory.shutdown(30) == 0
    assert len(catalog(backup, "s2")) == 1


def test_a_history_shutdown_keeps_its_own_bound_over_the_tiers_longer_one(
    make_memory: Any, backup: MySQLBackup
) -> None:
    """``history.shutdown(0.5)`` returns in about 0.5 s though the tier would wait 60 s."""
    before = workers()
    memory = sleepy_memory(make_memory, drain_timeout=60)
    history = TieredChatMessageHistory("s1", backup=backup, long_memory=memory)
    history.add_messages(turn(1))
    started = time.monotonic()
    left = history.shutdown(0.5)
    seconds = time.monotonic() - started
    # It returned before the 5 s extraction ended: the job is left queued, no memory yet.
    assert seconds < 1.5, seconds
    assert left == 1
    assert len(queued(backup)) == 1
    assert catalog(backup, "s1") == []
    # The tier keeps running (other histories may share it) and finishes the job.
    assert memory.drain(60) == 0
    assert len(catalog(backup, "s1")) == 1
    assert memory.shutdown(30) == 0
    assert wait_until(lambda: new_workers(before) == [], timeout=120)


def test_with_a_history_releases_an_archive_it_opened(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    with TieredChatMessageHistory("s1", backup=url) as history:
        history.add_messages(turn(1))
        assert history.backup.engine.pool.checkedin() == 1
    assert history.backup.engine.pool.checkedin() == 0
    assert len(history.messages) == 2  # the archive reconnects when used again


def test_with_an_archive_closes_its_connections(backup: MySQLBackup) -> None:
    with backup as archive:
        assert archive is backup
        archive.add_messages("s1", turn(1))
        assert backup.engine.pool.checkedin() >= 1
    assert backup.engine.pool.checkedin() == 0
    assert len(backup.get_messages("s1")) == 2


async def test_async_with_an_archive_closes_both_engines(backup: MySQLBackup) -> None:
    async with backup as archive:
        await archive.aadd_messages("s1", turn(1))
        engine = archive.async_engine()
        assert engine.pool.checkedin() >= 1
    assert engine.pool.checkedin() == 0
    assert backup.engine.pool.checkedin() == 0
    async with backup:  # usable again; the block closes what this use opened
        assert len(await backup.aget_messages("s1")) == 2


def test_with_a_consolidator_writes_memory_md_before_it_ends(
    make_consolidator: Any, backup: MySQLBackup
) -> None:
    before = workers()
    with make_consolidator(ScriptedChatModel(), start_worker=True) as consolidator:
        history = TieredChatMessageHistory("s1", backup=backup, consolidator=consolidator)
        for n in range(4):  # 8 messages: past the threshold of 4
            history.add_messages(
                [HumanMessage(f"Remember code K-{n}."), AIMessage(f"Noted: code K-{n}.")]
            )
    assert new_workers(before) == []
    assert queued(backup, "consolidate") == []
    assert "K-0" in consolidator.memory("s1")


# -- the exit hook -----------------------------------------------------------------------


class Tier:
    """A stand-in tier that records its shutdown."""

    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.bounds: list[float] = []

    def drain(self, timeout: float | None = None) -> int:
        return 0

    def shutdown(self, drain_timeout: float | None = None) -> int:
        assert drain_timeout is not None
        self.bounds.append(drain_timeout)
        return 0


def test_the_exit_hook_holds_tiers_weakly_and_bounds_them() -> None:
    gone = Tier(5.0)
    ref = weakref.ref(gone)
    drain_at_exit(gone)
    del gone
    gc.collect()
    assert ref() is None  # registering kept nothing alive

    first, second = Tier(2.0), Tier(7.0)
    drain_at_exit(first)
    drain_at_exit(second)
    drain_live()
    # Each within its own bound, and both within the largest (7 s) in all.
    assert len(first.bounds) == 1 and 0 < first.bounds[0] <= 2.0
    assert len(second.bounds) == 1 and 0 < second.bounds[0] <= 7.0


def test_a_closed_worker_is_not_drained_at_exit(make_memory: Any, backup: MySQLBackup) -> None:
    memory = make_memory(start_worker=True)
    memory.close()
    TieredChatMessageHistory("s1", backup=backup, long_memory=memory).add_messages(turn(1))
    drain_live()  # what the interpreter's exit runs: the closed tier is not restarted
    assert len(queued(backup)) == 1
