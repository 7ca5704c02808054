"""Isolation: 1,000 random sessions of ~100 users, no read or forget ever crosses a scope.

Session and user ids are drawn at random, many of them near twins of one another: a
trailing space, another case, a SQL wildcard, a zero-width space, another Unicode
normal form, a path prefix, one character more or less. Ids that the library
refuses (a ``ValueError``) are left out; every other one must be its own scope:

* the window, the archive's pages (what an export reads), long-term search (session
  and user scope) and MEMORY.md of each session hold its own data and all of it;
* after ``forget`` of 100 sessions, 10 users and 10 user-and-session pairs, no trace
  of them is left in any tier (messages, jobs, memory catalog, Chroma vectors,
  consolidation rows, HISTORY.md rows, MEMORY.md folders), compared in Python so no
  collation can hide a row, and everything of every other scope is as it was.

``RELIABILITY_SEED`` replays a run (the seed is in every failure).
"""

from __future__ import annotations

import os
import random
import re
import unicodedata
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .reliability_support import MemoryWriter, archive_rows, files_under, table_rows

SESSIONS = 1000
USERS = 100
WORDS = "invoice ledger deploy friday dashboard budget alpha warehouse payroll audit".split()
_LABEL = re.compile(r"<t(\d+)\.\d+>")


def _twin(rng: random.Random, base: str) -> str:
    """An id that a careless comparison could take for ``base``."""
    variants = [
        base + " ",
        base + "  ",
        base.upper(),
        base.lower(),
        base.swapcase(),
        base + "\u200b",
        base[:-1] + "%",
        base[:-1] + "_",
        base + base[-1],
        base[:-1] or base + "0",
        unicodedata.normalize("NFD", base + "é"),
        unicodedata.normalize("NFC", base + "é"),
        "../" + base,
        base + "/..",
        base.replace("-", "_"),
        "$ne" + base,
    ]
    return rng.choice(variants)[:255]


def _random_ids(rng: random.Random, count: int, kind: str) -> list[str]:
    templates: list[Callable[[int], str]] = [
        lambda k: f"{kind}-{k}",
        lambda k: f"{kind}{k}",
        lambda k: f"{kind}_{k}",
        lambda k: f"会话{k}" if kind == "s" else f"用户{k}",
        lambda k: f"{kind} {k} 😀",
        lambda k: f"'{kind}{k}' OR '1'='1",
        lambda k: f"{kind}-{k}".ljust(255, "x"),
        lambda k: f"Ünïcödé-{kind}-{k}",
    ]
    ids: list[str] = []
    seen: set[str] = set()
    while len(ids) < count:
        if ids and rng.random() < 0.4:
            candidate = _twin(rng, rng.choice(ids))
        else:
            candidate = rng.choice(templates)(len(ids))
        if candidate not in seen:
            seen.add(candidate)
            ids.append(candidate)
    return ids


def _turns(k: int, count: int) -> list[list[BaseMessage]]:
    """Turns that share their words with every other session, told apart by a label."""
    return [
        [
            HumanMessage(f"question <t{k}.{n}> about {WORDS[n]} and {WORDS[(k + n) % 10]}"),
            AIMessage(f"answer <t{k}.{n}>: {WORDS[(k * 3 + n) % 10]} {WORDS[n]}"),
        ]
        for n in range(count)
    ]


def _fingerprints(backup: MySQLBackup, memory: ChromaLongMemory, root: Path) -> dict[str, Any]:
    """Everything each session holds in every tier, grouped by exact session id."""
    prints: dict[str, dict[str, Any]] = {}

    def of(session_id: str) -> dict[str, Any]:
        return prints.setdefault(session_id, {})

    for row in archive_rows(backup):
        of(row.session_id).setdefault("messages", []).append(
            (row.id, row.user_id, str(row.content))
        )
    for name in ("jobs", "memories", "consolidation", "history_log"):
        for row in table_rows(backup, name):
            of(row.session_id).setdefault(name, []).append(repr(tuple(row)))
    found = memory.collection.get(include=["metadatas"])
    for doc_id, metadata in zip(found["ids"], found["metadatas"], strict=True):
        of(metadata["session_id"]).setdefault("chroma", []).append(
            (doc_id, metadata.get("user_id"))
        )
    for data in prints.values():
        for value in data.values():
            value.sort()
    return {"sessions": prints, "files": files_under(root)}


@pytest.mark.slow
def test_1000_random_sessions_never_cross_scopes(
    backup: MySQLBackup, make_memory: Callable[..., ChromaLongMemory], tmp_path: Path
) -> None:
    seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**31))
    rng = random.Random(seed)
    root = tmp_path / "memory"
    memory = make_memory()  # raw turns, hash embeddings, no worker thread
    consolidator = MemoryConsolidator(
        MemoryWriter(padding=0),
        root=root,
        backup=backup,
        threshold=4,
        batch=2,
        start_worker=False,
    )
    users = _random_ids(rng, USERS, "u")
    owners: dict[str, str | None] = {}
    index: dict[str, int] = {}
    expected: dict[str, list[BaseMessage]] = {}
    refused: list[str] = []
    histories: dict[str, TieredChatMessageHistory] = {}
    for k, session_id in enumerate(_random_ids(rng, SESSIONS, "s")):
        user_id = rng.choice(users) if rng.random() < 0.9 else None
        try:
            histories[session_id] = TieredChatMessageHistory(
                session_id,
                user_id=user_id,
                backup=backup,
                long_memory=memory,
                consolidator=consolidator,
            )
        except ValueError:
            refused.append(session_id)
            continue
        owners[session_id], index[session_id] = user_id, k
    assert len(owners) >= SESSIONS * 0.8, (len(refused), refused[:5], seed)

    def write(session_id: str) -> None:
        turns = _turns(index[session_id], 1 + index[session_id] % 3)
        for turn in turns:
            histories[session_id].add_messages(turn)
        expected[session_id] = [m for turn in turns for m in turn]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, owners))
    memory.flush(timeout=300)
    consolidator.flush(timeout=300)

    # Every read of a session or a user sees its own data, and all of it.
    catalog: dict[str, set[str]] = {}
    for row in table_rows(backup, "memories"):
        catalog.setdefault(row.session_id, set()).add(row.id)
    for session_id, user_id in owners.items():
        k, mine = index[session_id], expected[session_id]
        assert histories[session_id].messages == mine, (session_id, seed)
        page = backup.history(session_id, limit=100)
        assert [(m.session_id, m.user_id, m.message) for m in page] == [
            (session_id, user_id, m) for m in mine
        ], (session_id, seed)
        docs = memory.search(f"{WORDS[0]} {WORDS[k % 10]} question", session_id=session_id, k=50)
        assert {d.id for d in docs} == catalog[session_id], (session_id, seed)
        assert len(catalog[session_id]) == len(mine) // 2
        text = consolidator.memory(session_id)
        assert {int(x) for x in _LABEL.findall(text)} <= {k}, (session_id, text, seed)
        assert bool(text) == (len(mine) > 4), (session_id, seed)
    for user_id in set(owners.values()) - {None}:
        docs = memory.search("question budget", user_id=user_id, scope="user", k=500)
        sessions = [s for s, u in owners.items() if u == user_id]
        assert {d.id for d in docs} == set().union(*(catalog[s] for s in sessions)), seed
        assert {d.metadata["user_id"] for d in docs} == {user_id}

    # Forget 100 sessions, 10 users and 10 of a user's sessions.
    before = _fingerprints(backup, memory, root)
    sessions = sorted(owners)
    gone_sessions = set(rng.sample(sessions, 100))
    gone_users = set(rng.sample(sorted(set(owners.values()) - {None}), 10))
    pairs = [(s, owners[s]) for s in rng.sample(sessions, 40) if owners[s] is not None][:10]
    for session_id in sorted(gone_sessions):
        memory.forget(session_id=session_id)
    for user_id in sorted(gone_users):
        memory.forget(user_id=user_id)
    for session_id, user_id in pairs:
        memory.forget(session_id=session_id, user_id=user_id)
    gone = gone_sessions | {s for s, u in owners.items() if u in gone_users} | {s for s, _ in pairs}
    after = _fingerprints(backup, memory, root)
    for session_id in gone:  # no trace left in any tier
        assert session_id not in after["sessions"], (session_id, after["sessions"][session_id])
        assert backup.history(session_id) == []
        assert memory.search("question", session_id=session_id) == []
        assert not consolidator.folder(session_id).exists(), (session_id, seed)
    for user_id in gone_users:
        assert memory.search("question", user_id=user_id, scope="user") == []
        assert backup.sessions(user_id=user_id) == []
    # Everything of every other scope is exactly as it was.
    kept = {s: v for s, v in before["sessions"].items() if s not in gone}
    assert after["sessions"] == kept, seed
    gone_folders = {consolidator.folder(s).name for s in gone}
    kept_files = {
        name: text
        for name, text in before["files"].items()
        if name.split("/", 1)[0] not in gone_folders
    }
    assert after["files"] == kept_files, seed
    print(
        f"\n[isolation] {backup.dialect}: seed {seed}, {len(owners)} sessions of "
        f"{len({u for u in owners.values() if u})} users ({len(refused)} ids refused), "
        f"{sum(len(m) for m in expected.values())} messages; {len(owners)} windows, pages and "
        f"session searches, {len(set(owners.values()) - {None})} user searches; forgot "
        f"{len(gone_sessions)} sessions, {len(gone_users)} users, {len(pairs)} pairs "
        f"({len(gone)} sessions gone, {len(kept)} untouched)"
    )
    consolidator.close()
