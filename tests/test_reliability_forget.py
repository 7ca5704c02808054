"""Forget leaves nothing, from any process: every store a tier ever wrote is reached.

Tiers record in the archive where they keep data (``<name>_tiers``), so an admin
script that opens only ``MySQLBackup(url)`` and calls ``forget`` erases the Chroma
vectors and the MEMORY.md/HISTORY.md folders that tier objects of other processes
wrote, the temporary files of a consolidation killed mid-write included. A store that
cannot be reached makes ``forget`` raise ``ForgetIncompleteError`` after removing
everything else; the archive records the forget and a retry finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
import uuid
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.storage.archive import (
    _ERASERS,
    ERASER_GROUP,
    ForgetIncompleteError,
    find_eraser,
    register_eraser,
)
from langchain_tiered_memory.tiers.consolidation import erase_from_record as erase_folders
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from langchain_tiered_memory.tiers.long_memory import erase_from_record as erase_vectors

from .conftest import chroma_settings
from .fakes import HashEmbeddings
from .reliability_support import REPO, ChromaServer, archive_rows, files_under, table_rows

# -- child processes --------------------------------------------------------------------

_WRITER = """
import json, sys
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from tests.fakes import HashEmbeddings
from tests.reliability_support import MemoryWriter

cfg = json.loads(sys.argv[1])
backup = MySQLBackup(cfg["url"], table_name=cfg["table"])
memory = ChromaLongMemory(
    persist_directory=cfg["chroma"], collection_name=cfg["collection"],
    embedding=HashEmbeddings(), backup=backup, start_worker=False,
)
consolidator = MemoryConsolidator(
    MemoryWriter(padding=0), root=cfg["root"], backup=backup, threshold=4, batch=2,
    start_worker=False,
)
for n, (session_id, user_id) in enumerate(cfg["writes"]):
    chat = TieredChatMessageHistory(
        session_id, user_id=user_id, backup=backup, long_memory=memory,
        consolidator=consolidator,
    )
    for k in range(3):
        chat.add_messages([
            HumanMessage(f"secret <t{n}.{k}> of {user_id} about invoice {k}"),
            AIMessage(f"noted <t{n}.{k}> of {user_id}"),
        ])
memory.flush(timeout=120)
consolidator.flush(timeout=120)
found = memory.collection.get(include=["metadatas"])
print(json.dumps(sorted(
    [i, m["session_id"], m["user_id"]] for i, m in zip(found["ids"], found["metadatas"])
)))
"""

#: A consolidation SIGKILLed between writing MEMORY.md's temporary file and its rename.
_KILLED_CONSOLIDATION = """
import json, os, signal, sys
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from tests.reliability_support import MemoryWriter

cfg = json.loads(sys.argv[1])
backup = MySQLBackup(cfg["url"], table_name=cfg["table"])
consolidator = MemoryConsolidator(
    MemoryWriter(padding=0), root=cfg["root"], backup=backup, threshold=4, batch=2,
    start_worker=False,
)
session_id, user_id = cfg["killed"]
chat = TieredChatMessageHistory(
    session_id, user_id=user_id, backup=backup, consolidator=consolidator
)
chat.add_messages([HumanMessage(f"secret <t9.0> of {user_id}"), AIMessage("noted <t9.0>")])
real_replace = os.replace

def dying_replace(src, dst):
    if str(dst).endswith("MEMORY.md"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

os.replace = dying_replace
consolidator.run_pending()
"""

_ADMIN = """
import json, sys
from langchain_tiered_memory import MySQLBackup

cfg = json.loads(sys.argv[1])
backup = MySQLBackup(cfg["url"], table_name=cfg["table"])
removed = [backup.forget(**scope) for scope in cfg["forget"]]
print(json.dumps(removed))
"""


def _child(script: str, cfg: dict[str, Any], *, killed: bool = False) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if killed:
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def _tmp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp"))


def _fresh_vectors(path: Path, collection: str) -> Any:
    """A PersistentClient opened for the first time in this process: what is on disk."""
    import chromadb

    client = chromadb.PersistentClient(path=str(path), settings=chroma_settings())
    return client.get_collection(collection, embedding_function=None)


# -- an admin process reaches every tier --------------------------------------------------


@pytest.mark.slow
def test_an_admin_process_forgets_what_tiers_of_other_processes_stored(
    backend_url: str, table_name: str, tmp_path: Path
) -> None:
    """Only ``MySQLBackup(url).forget(...)``: no vector, row, folder or tmp file of u1 is left."""
    cfg: dict[str, Any] = {
        "url": backend_url,
        "table": table_name,
        "chroma": str(tmp_path / "chroma"),
        "collection": f"lm_{uuid.uuid4().hex[:12]}",
        "root": str(tmp_path / "memory"),
        "writes": [["a", "u1"], ["b", "u1"], ["shared", "u1"], ["c", "u2"]],
        "killed": ["a", "u1"],
    }
    root = Path(cfg["root"])
    backup = MySQLBackup(backend_url, table_name=table_name)  # reads rows only, never Chroma
    try:
        vectors = [tuple(v) for v in json.loads(_child(_WRITER, cfg))]
        _child(_KILLED_CONSOLIDATION, cfg, killed=True)
        folder_of = {s: p.name for s, p in _folders(root, ["a", "b", "shared", "c"]).items()}
        assert {s for _, s, _ in vectors} == {"a", "b", "shared", "c"}
        assert {u for _, _, u in vectors} == {"u1", "u2"}
        assert _tmp_files(root) == [f"{folder_of['a']}/" + name for name in _names(root, "a")]
        assert "<t0." in (root / _tmp_files(root)[0]).read_text()  # the killed write: a's data
        kept_files = {
            name: text
            for name, text in files_under(root).items()
            if name.startswith(folder_of["c"] + "/")
        }
        assert kept_files  # c's MEMORY.md and HISTORY.md
        kept_rows = _rows_of(backup, "u2")
        assert {name for name, rows in kept_rows.items() if rows} >= {"messages", "memories"}

        removed = json.loads(
            _child(
                _ADMIN,
                {**cfg, "forget": [{"user_id": "u1"}, {"session_id": "c", "user_id": "u1"}]},
            )
        )
        assert removed == [20, 0]  # a (8), b (6), shared (6); c is not u1's

        collection = _fresh_vectors(Path(cfg["chroma"]), cfg["collection"])
        assert collection.get(where={"user_id": "u1"})["ids"] == []
        for session_id in ("a", "b"):
            assert collection.get(where={"session_id": session_id})["ids"] == []
        left = collection.get(include=["metadatas", "documents"])
        assert sorted(
            (i, m["session_id"], m["user_id"])
            for i, m in zip(left["ids"], left["metadatas"], strict=True)
        ) == sorted(v for v in vectors if v[2] == "u2")
        assert not any("of u1" in doc for doc in left["documents"])
        assert _rows_of(backup, "u1") == {name: [] for name in kept_rows}
        after = _rows_of(backup, "u2")
        assert after["messages"] == kept_rows["messages"]
        assert after["memories"] == kept_rows["memories"]
        for session_id in ("a", "b", "shared"):
            assert not (root / folder_of[session_id]).exists()
            assert not [
                row for row in table_rows(backup, "consolidation") if row.session_id == session_id
            ]
            assert not [
                row for row in table_rows(backup, "history_log") if row.session_id == session_id
            ]
        assert _tmp_files(root) == []
        assert files_under(root) == kept_files  # c's files, byte for byte
        assert not any("<t0." in text or "of u1" in text for text in files_under(root).values())
        assert backup.pending_forgets() == []
    finally:
        backup.metadata.drop_all(backup.engine, checkfirst=True)
        backup.dispose()


def _folders(root: Path, sessions: list[str]) -> dict[str, Path]:
    from langchain_tiered_memory.core.validation import safe_filename

    return {s: root / safe_filename(s) for s in sessions}


def _names(root: Path, session_id: str) -> list[str]:
    folder = _folders(root, [session_id])[session_id]
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _rows_of(backup: MySQLBackup, user_id: str) -> dict[str, list[Any]]:
    """Every row of the user in every table, compared in Python (no collation)."""
    rows = {"messages": sorted(r.id for r in archive_rows(backup) if r.user_id == user_id)}
    for name in ("jobs", "memories", "consolidation", "history_log"):
        rows[name] = sorted(
            repr(tuple(r)) for r in table_rows(backup, name) if r.user_id == user_id
        )
    return rows


# -- a store that cannot be reached: a loud, recorded, retryable forget ------------------


def _turn(text: str) -> list[Any]:
    return [HumanMessage(text), AIMessage(f"noted: {text}")]


def test_a_store_without_an_eraser_fails_the_forget_and_a_retry_finishes(
    backup: MySQLBackup, backend_url: str, table_name: str
) -> None:
    kind = f"test-store-{uuid.uuid4().hex[:8]}"
    locator = {"where": "a store no eraser is installed for"}
    backup.register_tier(kind, locator, lambda *_: None)  # this process's hook
    backup.register_tier(kind, locator, lambda *_: None)  # idempotent: one record
    assert [(t.kind, t.locator) for t in backup.tiers()] == [(kind, locator)]
    backup.add_messages("s1", _turn("secret of u"), user_id="u")
    backup.add_messages("s2", _turn("more of u"), user_id="u")
    backup.add_messages("keep", _turn("of v"), user_id="v")
    admin = MySQLBackup(backend_url, table_name=table_name)  # no tier in this instance
    try:
        for _ in range(2):  # still unreachable on the retry: still loud, one record
            with pytest.raises(ForgetIncompleteError) as caught:
                admin.forget(user_id="u")
            assert kind in str(caught.value) and "no eraser" in str(caught.value)
            assert caught.value.session_ids == ["s1", "s2"]
            assert caught.value.user_id == "u"
            # Everything reachable is gone all the same.
            assert [r.session_id for r in archive_rows(admin)] == ["keep", "keep"]
            pending = admin.pending_forgets()
            assert [(p.session_id, p.user_id, p.session_ids) for p in pending] == [
                (None, "u", ["s1", "s2"])
            ]
            assert kind in pending[0].unfinished[0]
        calls: list[tuple[Any, ...]] = []
        register_eraser(kind, lambda loc: lambda *args: calls.append((loc, *args)))
        try:
            assert admin.forget(user_id="u") == 0
        finally:
            _ERASERS.pop(kind)
        # The retry knew the sessions from the record, though their rows were gone
        # (each store is erased before and after the archive's delete).
        assert calls == [(locator, ["s1", "s2"], None, "u")] * 2
        assert admin.pending_forgets() == []
        assert admin.get_messages("keep") == _turn("of v")
        # A store gone for good: its record is dropped, and forget no longer tries it.
        with pytest.raises(ForgetIncompleteError):
            admin.forget(session_id="keep")
        assert admin.drop_tier(admin.tiers()[0]) is True
        assert admin.tiers() == []
        assert admin.forget(session_id="keep") == 0  # the retry of the recorded forget
        assert admin.pending_forgets() == []
    finally:
        admin.dispose()


def test_a_failing_hook_of_this_process_fails_the_forget_too(backup: MySQLBackup) -> None:
    def broken(*_: Any) -> None:
        raise OSError("the disk is read-only")

    backup.register_tier("test-broken", {"at": "nowhere"}, broken)
    backup.add_messages("s", _turn("secret"), user_id="u")
    with pytest.raises(ForgetIncompleteError, match=r"test-broken .*read-only"):
        backup.forget(session_id="s")
    assert backup.get_messages("s") == []
    assert [p.session_ids for p in backup.pending_forgets()] == [["s"]]


@pytest.mark.slow
def test_forget_with_the_chroma_server_down_raises_and_a_retry_erases_the_vectors(
    backup: MySQLBackup, backend_url: str, table_name: str, tmp_path: Path
) -> None:
    import chromadb

    server = ChromaServer(tmp_path / "chroma-server")
    server.start()
    admin = MySQLBackup(backend_url, table_name=table_name)  # an admin: the record's eraser
    name = f"lm_{uuid.uuid4().hex[:12]}"
    try:
        memory = ChromaLongMemory(
            host="127.0.0.1",
            port=server.port,
            collection_name=name,
            embedding=HashEmbeddings(),
            backup=backup,
            start_worker=False,
        )
        for session_id, user_id in [("s-u", "u"), ("s-w", "w"), ("s-v", "v")]:
            chat = TieredChatMessageHistory(
                session_id, user_id=user_id, backup=backup, long_memory=memory
            )
            chat.add_messages(_turn(f"secret of {user_id} about the ledger"))
        memory.flush(timeout=60)
        server.stop()

        with pytest.raises(ForgetIncompleteError, match=rf"chroma .*{server.port}") as caught:
            admin.forget(user_id="u")  # the eraser built from the record
        assert caught.value.session_ids == ["s-u"]
        with pytest.raises(ForgetIncompleteError, match=rf"chroma .*{server.port}"):
            backup.forget(user_id="w")  # this process's tier, through its own hook
        for user_id in ("u", "w"):  # nothing is served from the archive side meanwhile
            assert memory.search("ledger", user_id=user_id, scope="user") == []
            assert [r for r in archive_rows(admin) if r.user_id == user_id] == []
        assert sorted(p.user_id for p in admin.pending_forgets()) == ["u", "w"]

        server.start()
        collection = chromadb.HttpClient(
            host="127.0.0.1", port=server.port, settings=chroma_settings()
        ).get_collection(name, embedding_function=None)
        assert collection.get(where={"user_id": "u"})["ids"]  # honestly left, and said so
        assert admin.forget(user_id="u") == 0
        assert backup.forget(user_id="w") == 0
        assert collection.get(where={"user_id": "u"})["ids"] == []
        assert collection.get(where={"user_id": "w"})["ids"] == []
        assert len(collection.get(where={"user_id": "v"})["ids"]) == 1
        assert admin.pending_forgets() == []
        memory.close()
    finally:
        admin.dispose()
        server.stop()


# -- the entry points of erasers ----------------------------------------------------------


def _custom_factory(locator: dict[str, Any]) -> Any:
    return lambda *_: None


def test_erasers_are_found_through_the_declared_entry_points() -> None:
    """The installed route: ``find_eraser`` with the entry points pyproject.toml declares."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = project["entry-points"][ERASER_GROUP]
    points = [EntryPoint(name, value, ERASER_GROUP) for name, value in declared.items()]
    assert find_eraser("chroma", points) is erase_vectors
    assert find_eraser("consolidation", points) is erase_folders
    assert find_eraser("no-such-kind", points) is None
    # An installed entry point wins over the modules' registry ...
    custom = EntryPoint("chroma", f"{__name__}:_custom_factory", ERASER_GROUP)
    assert find_eraser("chroma", [custom]) is _custom_factory
    # ... which answers when nothing is installed, or only for another group.
    assert find_eraser("chroma", []) is erase_vectors
    assert find_eraser("chroma", [EntryPoint("chroma", custom.value, "other")]) is erase_vectors


def test_an_erased_store_that_is_gone_is_not_created_again(tmp_path: Path) -> None:
    """A recorded folder or collection that no longer exists holds nothing: no error, no file."""
    erase_vectors({"persist_directory": str(tmp_path / "gone"), "collection": "x"})(
        ["s"], "s", None
    )
    erase_folders({"root": str(tmp_path / "also-gone")})(["s"], "s", None)
    assert list(tmp_path.iterdir()) == []


def test_a_turn_extracted_while_a_forget_runs_leaves_no_vector_behind(
    backup: MySQLBackup, make_memory: Any
) -> None:
    memory = make_memory()
    history = TieredChatMessageHistory("s1", user_id="u1", backup=backup, long_memory=memory)
    history.add_messages([HumanMessage("My IBAN is DE89 3704 0044 0532 0130 00"), AIMessage("ok")])
    memory.run_pending()
    raced: list[str] = []

    def writer_and_worker(*scope: Any) -> None:
        # Another thread and the worker, between the erase of the vectors and the
        # archive's delete: a turn is written, extracted and committed.
        if not raced:
            raced.append("done")
            history.add_messages([HumanMessage("My phone is +49 170 1234567"), AIMessage("ok")])
            memory.run_pending()

    backup.on_forget(writer_and_worker)
    backup.forget(user_id="u1")

    assert raced and backup.get_messages("s1") == []
    assert backup.stats().memory_count == 0
    assert memory.collection.get(where={"user_id": "u1"})["ids"] == []


def test_a_store_that_fails_does_not_keep_another_of_the_same_name_from_being_erased(
    backup: MySQLBackup,
) -> None:
    erased: list[str] = []

    class Store:
        def __init__(self, fails: bool) -> None:
            self.fails = fails

        def __repr__(self) -> str:
            return "Store()"  # two stores, one name

        def erase(self, *scope: Any) -> None:
            if self.fails:
                raise ConnectionError("down")
            erased.append("erased")

    stores = [Store(fails=True), Store(fails=False)]
    for store in stores:
        backup.on_forget(store.erase)
    backup.add_messages("s1", _turn("secret"), user_id="u")
    with pytest.raises(ForgetIncompleteError, match="down"):
        backup.forget(user_id="u")
    assert erased == ["erased", "erased"]  # before and after the archive's delete
