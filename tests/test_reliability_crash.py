"""Crashes: SIGKILL at random points during 10,000 messages over 50 sessions.

Two child processes share the archive (SQLite or MariaDB), as an app server and a
worker would. The writer writes 100 numbered turns (200 messages) into each of 50
sessions from 4 threads, into the archive (which queues the extraction and
consolidation jobs in the same transaction) and into the design's JSON session files,
and prints ``ack <session> <turn>`` once both hold a turn. The worker runs the
extraction (embedded Chroma, a fake LLM) and consolidation (MEMORY.md, HISTORY.md)
queues. The parent kills the writer, the worker or both with SIGKILL at random
points (the first writer also within its first two seconds), checks what it finds,
and restarts them where the archive and the files stand, until every turn is written.

After every writer kill: each session's archive and session file hold exactly the
turns 0..n-1 in order, once each, n past the last acknowledged turn, and the files
parse. At the end, after a recovery in this process: one extracted memory per turn
(that turn as its provenance) in the catalog and in Chroma, no job left, every
consolidated batch once in the database and in HISTORY.md, MEMORY.md on disk equal
to the database and whole.

``RELIABILITY_SEED`` replays a run's kill points (the seed is in every failure).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from langchain_tiered_memory import MySQLBackup, SessionFileArchive
from langchain_tiered_memory.core.validation import safe_filename
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import HashEmbeddings
from .long_memory_support import FakeExtractor
from .reliability_support import (
    REPO,
    MemoryWriter,
    archive_rows,
    by_session,
    crash_session,
    crash_turn,
    table_rows,
)

SESSIONS = 50
TURNS = 100  # per session: 50 x 100 turns x 2 messages = 10,000 messages
THREADS = 4
KILLS = 8  # random kills of the writer and/or the worker, plus the writer's early death
THRESHOLD, BATCH = 40, 20  # consolidation: 8 batches per session
_MARKER = re.compile(r"<!-- batch (\d+)-(\d+) -->")


def _contents(messages: list) -> list[str]:
    return [str(m.content) for m in messages]


EXPECTED = {i: [_contents(crash_turn(i, n)) for n in range(TURNS)] for i in range(SESSIONS)}


def _turns_of(contents: list[str], index: int, where: str) -> int:
    """How many whole turns ``contents`` holds; fails unless they are turns 0..n-1."""
    n, odd = divmod(len(contents), 2)
    assert not odd, f"{where}: a half turn in session {index}"
    assert n <= TURNS, f"{where}: {n} turns in session {index}"
    expected = [text for pair in EXPECTED[index][:n] for text in pair]
    if contents != expected:
        first = next(k for k, (a, b) in enumerate(zip(contents, expected, strict=True)) if a != b)
        pytest.fail(
            f"{where}: session {index} message {first} is {contents[first]!r}, "
            f"expected {expected[first]!r} (lost, duplicated or reordered)"
        )
    return n


def _check_stores(
    backup: MySQLBackup,
    files: SessionFileArchive,
    acked: dict[int, int],
    seed: int,
    began: dict[str, list[int]],
) -> dict[str, list[int]]:
    """Check the archive and the session files; return where the next writer starts."""
    grouped = by_session(archive_rows(backup))
    assert set(grouped) <= {crash_session(i)[0] for i in range(SESSIONS)}
    start: dict[str, list[int]] = {}
    listed: dict[str, int] = {}
    reopened = SessionFileArchive(files.root)  # the writer is dead: put its leftovers right
    for i in range(SESSIONS):
        session_id, user_id = crash_session(i)
        rows = grouped.get(session_id, [])
        assert all(row.user_id == user_id for row in rows)
        in_archive = _turns_of([str(r.content) for r in rows], i, f"archive (seed {seed})")
        in_files = _turns_of(_contents(files.get_messages(session_id)), i, f"files (seed {seed})")
        for column, (where, n) in enumerate((("archive", in_archive), ("files", in_files))):
            # Every acknowledged turn is there; at most the one in flight more, past
            # the last acknowledged turn or where the killed writer began (a turn the
            # kill before left unacknowledged in the store is not written again).
            most = max(acked[i] + 1, began.get(str(i), [0, 0])[column]) + 1
            assert acked[i] < n <= most, (
                f"{where} of session {i} holds {n} turns, {acked[i] + 1} acknowledged, "
                f"the writer began at turn {began.get(str(i), [0, 0])[column]} (seed {seed})"
            )
        listed[session_id] = 2 * in_files
        data_path, meta_path = reopened.paths(session_id)
        if data_path.exists():
            data = json.loads(data_path.read_text(encoding="utf-8"))  # whole
            assert len(data.pop("messages")) == data["message_count"] == 2 * in_files
            # Reopened, the meta file is the session file's fields (a kill between
            # the two renames left it a batch behind, never ahead).
            assert json.loads(meta_path.read_text(encoding="utf-8")) == data, seed
        start[str(i)] = [in_archive, in_files]
    assert {i.session_id: i.message_count for i in files.sessions()} == {
        session_id: count for session_id, count in listed.items() if count
    }, seed
    return start


def _spawn(kind: str, backup: MySQLBackup, home: Path, start: dict[str, list[int]]) -> Any:
    spec = {
        "sessions": SESSIONS,
        "turns": TURNS,
        "threads": THREADS,
        "threshold": THRESHOLD,
        "batch": BATCH,
        "start": start,
    }
    url = backup.url.render_as_string(hide_password=False)
    args = [kind, url, backup.table.name, str(home), json.dumps(spec)]
    with (home / f"{kind}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.reliability_support", *args],
            cwd=REPO,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            stdout=subprocess.PIPE if kind == "writer" else subprocess.DEVNULL,
            stderr=log,
        )


def _kill(process: Any) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    return process.wait(timeout=60)


@pytest.mark.slow
def test_sigkill_at_random_points_during_10000_messages(
    backup: MySQLBackup, tmp_path: Path
) -> None:
    seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**31))
    rng = random.Random(seed)
    home = tmp_path / "crash"
    home.mkdir()
    files = SessionFileArchive(home / "sessions")
    total = SESSIONS * TURNS
    # Kill points: a number of acknowledged turns, a victim (the writer, the worker or
    # both) and a delay of up to 30 ms, so kills land anywhere in a write, an
    # extraction or a consolidation.
    points = [
        (point, rng.choice(["writer", "worker", "both"]), rng.uniform(0, 0.03))
        for point in sorted(rng.sample(range(100, total - 100), KILLS))
    ]
    kills = list(points)
    acked = dict.fromkeys(range(SESSIONS), -1)
    start = {str(i): [0, 0] for i in range(SESSIONS)}
    done = 0
    writer_codes: list[int] = []
    queued_at_worker_kills: list[int] = []
    worker = _spawn("worker", backup, home, start)
    began = time.monotonic()
    try:
        for run in range(2 * KILLS + 2):
            writer = _spawn("writer", backup, home, start)
            timer = None
            if run == 0:  # the first writer dies before or in its first writes
                timer = threading.Timer(rng.uniform(0.2, 2.0), _kill, args=(writer,))
                timer.start()
            killed = False
            try:
                assert writer.stdout is not None
                for line in writer.stdout:  # after a kill: what it printed before dying
                    word, *rest = line.decode().split()
                    if word != "ack":
                        continue
                    index, turn = int(rest[0]), int(rest[1])
                    # The next turn, or the first this writer writes when turns in
                    # flight at earlier kills reached both stores unacknowledged.
                    first = min(start[str(index)])
                    assert acked[index] < turn <= max(acked[index] + 1, first), (
                        f"writer jumped: {line!r}"
                    )
                    acked[index] = turn
                    done += 1
                    while points and not killed and done >= points[0][0]:
                        _, victim, delay = points.pop(0)
                        time.sleep(delay)
                        if victim in ("worker", "both"):
                            assert _kill(worker) == -signal.SIGKILL
                            queued_at_worker_kills.append(len(table_rows(backup, "jobs")))
                            worker = _spawn("worker", backup, home, start)
                        if victim in ("writer", "both"):
                            _kill(writer)
                            killed = True
            finally:
                if timer is not None:
                    timer.join()
                writer_codes.append(_kill(writer) if killed else writer.wait(timeout=600))
            start = _check_stores(backup, files, acked, seed, start)
            if writer_codes[-1] == 0:
                break
        # The worker catches up on its own; kill it once more, at a random moment.
        time.sleep(rng.uniform(0, 3))
        assert _kill(worker) == -signal.SIGKILL
    finally:
        _kill(worker)
    logs = "".join((home / f"{k}.log").read_text()[-2000:] for k in ("writer", "worker"))
    assert writer_codes[-1] == 0, logs
    assert set(writer_codes[:-1]) == {-signal.SIGKILL}, (writer_codes, seed)
    assert all(n == TURNS - 1 for n in acked.values())
    assert start == {str(i): [TURNS, TURNS] for i in range(SESSIONS)}
    assert max(queued_at_worker_kills, default=1) > 0, "no worker kill found queued work"

    # A recovery here re-drives whatever the dead worker held and processes the rest.
    memory = ChromaLongMemory(
        persist_directory=home / "chroma",
        collection_name="crash",
        embedding=HashEmbeddings(),
        extractor=FakeExtractor(),
        backup=backup,
        start_worker=False,
    )
    consolidator = MemoryConsolidator(
        MemoryWriter(),
        root=home / "memory",
        backup=backup,
        threshold=THRESHOLD,
        batch=BATCH,
        start_worker=False,
    )
    try:
        left = len(table_rows(backup, "jobs"))
        recovery = time.monotonic()
        # Completeness is asserted, not speed: up to thousands of jobs are left, and a
        # loaded 2-core machine drains them three times slower (558 left after 120 s).
        memory.flush(timeout=600)
        consolidator.flush(timeout=600)
        recovery = time.monotonic() - recovery
        _check_derived(backup, memory, consolidator, seed)
        victims = [victim for _, victim, _ in kills]
        print(
            f"\n[crash] {backup.dialect}: seed {seed}, {len(writer_codes) - 1} writer kills "
            f"({victims.count('both')} with the worker) and "
            f"{len(queued_at_worker_kills) + 1} worker kills, jobs queued at those "
            f"{queued_at_worker_kills}; {left} jobs left at the end, recovered in "
            f"{recovery:.1f} s; {time.monotonic() - began:.0f} s in all"
        )
    finally:
        memory.close()
        consolidator.close()


def _check_derived(
    backup: MySQLBackup, memory: ChromaLongMemory, consolidator: MemoryConsolidator, seed: int
) -> None:
    assert table_rows(backup, "jobs") == [], f"jobs left (seed {seed})"
    messages = by_session(archive_rows(backup))
    memories = by_session(table_rows(backup, "memories"))
    logs = by_session(table_rows(backup, "history_log"))
    states = {row.session_id: row for row in table_rows(backup, "consolidation")}
    total = 0
    for i in range(SESSIONS):
        session_id, _ = crash_session(i)
        ids = [row.id for row in messages[session_id]]
        # Extraction: exactly one memory per turn, its provenance that turn, in order.
        rows = sorted(memories.get(session_id, []), key=lambda row: row.seq)
        turns = [ids[k : k + 2] for k in range(0, len(ids), 2)]
        assert [json.loads(row.source_ids) for row in rows] == turns, (i, seed)
        assert [row.kind for row in rows] == ["extracted"] * TURNS, (i, seed)
        total += len(rows)
        # Consolidation: batches of BATCH messages from the start, each once, and the
        # backlog left is within the threshold (no queued consolidation was dropped).
        batches = sorted((row.first_id, row.last_id) for row in logs.get(session_id, []))
        count = len(batches)
        assert batches == [(ids[k * BATCH], ids[k * BATCH + BATCH - 1]) for k in range(count)]
        assert len(ids) - count * BATCH <= THRESHOLD, (i, count, seed)
        state = states[session_id]
        assert state.cursor == batches[-1][1]
        folder = consolidator.root / safe_filename(session_id)
        history_md = (folder / "HISTORY.md").read_text(encoding="utf-8")
        assert [tuple(map(int, m)) for m in _MARKER.findall(history_md)] == batches, (i, seed)
        entries = sorted(logs[session_id], key=lambda row: row.first_id)
        assert history_md == "".join(row.entry for row in entries), (i, seed)  # whole entries
        memory_md = (folder / "MEMORY.md").read_text(encoding="utf-8")
        assert memory_md == state.memory_md, (i, seed)
        assert memory_md.startswith("# Memory\n") and memory_md.endswith("END\n"), (i, seed)
    assert len(table_rows(backup, "memories")) == total == SESSIONS * TURNS
    catalog_ids = sorted(row.id for rows in memories.values() for row in rows)
    assert sorted(memory.collection.get(include=[])["ids"]) == catalog_ids, seed
