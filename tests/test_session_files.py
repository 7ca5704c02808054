"""SessionFileArchive: the design's ``{session}.json`` files as the archive backend.

Real files under ``tmp_path``; crashes are real child processes killed with SIGKILL
or write failures injected with ``monkeypatch`` (``os.fsync``, ``os.replace``, a
write that stops halfway).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
    messages_to_dict,
)

import langchain_tiered_memory.storage.session_files as session_files
from langchain_tiered_memory import (
    MemoryConsolidator,
    MySQLBackup,
    SessionFileArchive,
    SessionOwnershipError,
    TieredChatMessageHistory,
)
from langchain_tiered_memory.core.validation import safe_filename
from langchain_tiered_memory.storage.jobs import TurnJobs

from .fakes import HOSTILE, replies, turn

REPO = Path(__file__).resolve().parents[1]


def rich_messages() -> list[BaseMessage]:
    """Messages whose every field must survive the round trip."""
    return [
        SystemMessage("你是 ERP 助手 🤖"),
        HumanMessage("订单表里 2024 年的销售额是多少？😀", id="h-1", name="张三"),
        AIMessage(
            "",
            id="ai-1",
            tool_calls=[
                {"name": "run_sql", "args": {"sql": "SELECT SUM(amount) FROM 订单"}, "id": "c1"}
            ],
            additional_kwargs={"reasoning": "查询 🧮"},
            response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
        ),
        ToolMessage('[{"sum": 1234.5}]', tool_call_id="c1", name="run_sql", artifact={"rows": 1}),
        AIMessage([{"type": "text", "text": "总额是 1234.5 元 ✅"}], id="ai-2"),
        HumanMessage('line one\nline two\ttab "quotes" \\ backslash \u2028 sep'),
    ]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (the lock file aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _run(script: str, *args: str, **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        text=True,
        **kwargs,
    )


# -- 1. window, restart, layout, round trip ----------------------------------------------

_READ_WINDOW = r"""
import json, sys
from langchain_core.messages import messages_to_dict
from langchain_tiered_memory import SessionFileArchive, TieredChatMessageHistory

root, session = sys.argv[1:3]
history = TieredChatMessageHistory(
    session, user_id="u1", backup=SessionFileArchive(root), window_turns=2
)
print(json.dumps({"window": messages_to_dict(history.messages),
                  "all": messages_to_dict(history.all_messages())}))
"""


def test_window_restart_and_the_files_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    session = "订单/会话 1"
    history = TieredChatMessageHistory(
        session, user_id="u1", backup=SessionFileArchive(root), window_turns=2
    )
    turns = [turn(0), turn(1, tool=True), turn(2), turn(3, tool=True)]
    history.add_messages(turns[0])
    name = safe_filename(session)
    data_path, meta_path = root / f"{name}.json", root / f"{name}.meta.json"
    assert history.backup.paths(session) == (data_path, meta_path)
    first_meta = read_json(meta_path)
    for messages in turns[1:]:
        history.add_messages(messages)
    expected = turns[2] + turns[3]
    assert history.messages == expected

    # A new instance, and a fresh process, see the same window.
    again = TieredChatMessageHistory(
        session, user_id="u1", backup=SessionFileArchive(root), window_turns=2
    )
    assert again.messages == expected
    done = _run(
        _READ_WINDOW, str(root), session, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ).communicate(timeout=120)
    child = json.loads(done[0])
    assert messages_from_dict(child["window"]) == expected
    assert messages_from_dict(child["all"]) == [m for t in turns for m in t]

    # The layout: {session}.json and {session}.meta.json, and nothing else.
    assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == sorted(
        [data_path.name, meta_path.name]
    )
    data = read_json(data_path)
    assert data["session_id"] == session
    assert messages_from_dict([m["data"] for m in data["messages"]]) == [
        m for t in turns for m in t
    ]
    assert [m["role"] for m in data["messages"][:4]] == ["human", "ai", "human", "ai"]
    meta = read_json(meta_path)
    assert meta["session_id"] == session and meta["user_id"] == "u1"
    assert meta["message_count"] == 12
    assert meta["created_at"] == first_meta["created_at"]  # kept from the first write
    created = datetime.fromisoformat(meta["created_at"])
    assert created <= datetime.fromisoformat(meta["last_active"])
    assert first_meta["message_count"] == 2
    [info] = history.backup.sessions()
    assert (info.session_id, info.user_id, info.message_count) == (session, "u1", 12)
    assert info.first_at == created


def test_messages_round_trip_exactly(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    originals = rich_messages()
    assert files.add_messages("rt", originals[:3]) == [1, 2, 3]
    assert files.add_messages("rt", originals[3:]) == [4, 5, 6]
    fresh = SessionFileArchive(tmp_path)
    for archive in (files, fresh):
        restored = archive.get_messages("rt")
        assert restored == originals
        assert messages_to_dict(restored) == messages_to_dict(originals)
        assert restored[2].tool_calls == originals[2].tool_calls
        assert restored[2].usage_metadata == originals[2].usage_metadata
        assert restored[3].artifact == {"rows": 1}
    text = files.paths("rt")[0].read_text(encoding="utf-8")
    assert "订单" in text and "😀" in text  # stored readable, not \u-escaped
    page = files.history("rt")
    assert [m.id for m in page] == [1, 2, 3, 4, 5, 6]
    assert [m.role for m in page] == ["system", "human", "ai", "tool", "ai", "human"]
    assert [m.message for m in page] == originals


async def test_async_methods_match_the_sync_ones(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    history = TieredChatMessageHistory("a", backup=files, window_turns=1)
    await history.aadd_messages(turn(1))
    await history.aadd_messages(turn(2, tool=True))
    assert await history.aget_messages() == turn(2, tool=True)
    assert await files.aget_messages("a") == turn(1) + turn(2, tool=True)
    assert await files.aclear("a") == 6
    assert await history.aget_messages() == []


# -- 2. atomic writes ------------------------------------------------------------------


def _seed(root: Path) -> tuple[SessionFileArchive, dict[str, bytes], list[BaseMessage]]:
    files = SessionFileArchive(root)
    before = turn(1, tool=True) + turn(2)
    files.add_messages("s", before, user_id="u")
    return files, tree(root), before


def _assert_unchanged(
    files: SessionFileArchive, root: Path, snapshot: dict[str, bytes], before: list[BaseMessage]
) -> None:
    data_path, meta_path = files.paths("s")
    for path in (data_path, meta_path):
        assert snapshot[path.name] == path.read_bytes()  # the old file, whole
        read_json(path)  # and parseable
    assert files.get_messages("s") == before
    assert SessionFileArchive(root).get_messages("s") == before
    assert read_json(meta_path)["message_count"] == len(before)
    # Whatever was left behind is a temporary file, never a final path.
    extra = set(tree(root)) - set(snapshot)
    assert all(name.endswith(".tmp") and name.startswith(".") for name in extra)


def test_a_failing_fsync_leaves_the_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, snapshot, before = _seed(tmp_path)

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):
        files.add_messages("s", turn(3), user_id="u")
    monkeypatch.undo()
    _assert_unchanged(files, tmp_path, snapshot, before)
    files.add_messages("s", turn(3), user_id="u")  # and the archive works again
    assert files.get_messages("s") == [*before, *turn(3)]


def test_a_failing_rename_leaves_the_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, snapshot, before = _seed(tmp_path)

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        files.add_messages("s", turn(3), user_id="u")
    monkeypatch.undo()
    _assert_unchanged(files, tmp_path, snapshot, before)


def test_a_write_that_stops_halfway_leaves_the_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, snapshot, before = _seed(tmp_path)
    real_open = open

    class HalfWriter:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, text: str) -> int:
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            raise OSError(28, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

    def half_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        return HalfWriter(handle) if "w" in mode else handle

    monkeypatch.setattr(session_files, "open", half_open, raising=False)
    with pytest.raises(OSError, match="No space"):
        files.add_messages("s", turn(3), user_id="u")
    monkeypatch.undo()
    _assert_unchanged(files, tmp_path, snapshot, before)


def test_an_add_that_raises_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If add_messages raises, the caller retries: the messages must not be stored already.

    The session file's rename is the commit: if it fails, the add raises and nothing
    changed; if only the meta file's copy fails after it, the add stands and returns
    (it is stored: raising would have the caller store it twice), and the copy is
    put right when the archive is next opened.
    """
    files, snapshot, before = _seed(tmp_path)
    real_replace = os.replace
    renames: list[str] = []

    def replace_failing(nth: int) -> Any:
        def replace(src: Any, dst: Any) -> None:
            renames.append(Path(dst).name)
            if len(renames) == nth:
                raise OSError(28, "No space left on device")
            real_replace(src, dst)

        return replace

    data_path, meta_path = files.paths("s")
    monkeypatch.setattr(os, "replace", replace_failing(1))
    with pytest.raises(OSError, match="No space"):
        files.add_messages("s", turn(3), user_id="u")
    assert renames == [data_path.name]
    _assert_unchanged(files, tmp_path, snapshot, before)

    renames.clear()
    monkeypatch.setattr(os, "replace", replace_failing(2))
    assert files.add_messages("s", turn(3), user_id="u") == [len(before) + 1, len(before) + 2]
    monkeypatch.undo()
    assert renames == [data_path.name, meta_path.name]
    after = [*before, *turn(3)]
    assert files.get_messages("s") == after
    [info] = files.sessions()
    assert info.message_count == len(after)
    assert read_json(meta_path)["message_count"] == len(before)  # the copy, behind
    SessionFileArchive(tmp_path)  # opening puts it right
    assert read_json(meta_path)["message_count"] == len(after)
    assert {k: v for k, v in read_json(data_path).items() if k != "messages"} == read_json(
        meta_path
    )
    assert not any(name.endswith(".tmp") for name in tree(tmp_path))


_KILLED_WRITER = r"""
import os, sys
from langchain_core.messages import HumanMessage
from langchain_tiered_memory import SessionFileArchive

files = SessionFileArchive(sys.argv[1])
pad = "填充 padding " * 200  # a file that takes a while to write
for n in range(100_000):
    files.add_messages("crash", [HumanMessage(f"m{n} {pad}")])
    os.write(1, f"ack {n}\n".encode())  # one write(2): a kill never cuts the line
"""


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    writer = _run(_KILLED_WRITER, str(tmp_path), stdout=subprocess.PIPE)
    acknowledged = -1
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            acknowledged = int(line.split()[1])
            if acknowledged >= 25:
                os.kill(writer.pid, signal.SIGKILL)
                break
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    files = SessionFileArchive(tmp_path)
    data_path, meta_path = files.paths("crash")
    read_json(data_path)
    read_json(meta_path)
    stored = [str(m.content).split()[0] for m in files.get_messages("crash")]
    # Every acknowledged message is there, in order; at most the one in flight more.
    assert stored[: acknowledged + 1] == [f"m{n}" for n in range(acknowledged + 1)]
    assert len(stored) - (acknowledged + 1) in (0, 1, 2)
    files.add_messages("crash", [HumanMessage("after the crash")])
    assert str(files.get_messages("crash")[-1].content) == "after the crash"


# One child imports once and forks a writer per kill point: each writer runs one
# operation of the archive on a fresh copy of a folder and stops before its k-th
# step (a file written to disk, renamed or deleted) until the test kills it.
_STEPPED_WRITER = r"""
import os, sys, time
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import SessionFileArchive

OPS = {
    "add": lambda f: f.add_messages("s", [HumanMessage("q new"), AIMessage("a new")],
                                    user_id="alice"),
    "first": lambda f: f.add_messages("new", [HumanMessage("q new"), AIMessage("a new")],
                                      user_id="alice"),
    "clear": lambda f: f.clear("s", user_id="alice"),
    "keep_owner": lambda f: f.forget(session_id="s", keep_owner=True),
    "forget_session": lambda f: f.forget(session_id="s"),
    "forget_user": lambda f: f.forget(user_id="alice"),
}
for line in sys.stdin:
    root, op, stop = line.split()
    pid = os.fork()
    if pid == 0:
        files = SessionFileArchive(root)
        steps = [0]

        def stepped(real):
            def step(*args, **kwargs):
                steps[0] += 1
                if steps[0] == int(stop):
                    print(f"stopped {os.getpid()}", flush=True)
                    time.sleep(600)  # until the test kills it
                return real(*args, **kwargs)
            return step

        os.fsync, os.replace, os.unlink = map(stepped, (os.fsync, os.replace, os.unlink))
        OPS[op](files)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("done" if status == 0 else f"ended {status}", flush=True)
"""

SESSIONS = ("s", "s2", "shared", "b", "new")
STEP_OPS = ("add", "first", "clear", "keep_owner", "forget_session", "forget_user")


def _seed_sessions(root: Path) -> None:
    """alice's ``s`` and ``s2``, bob's ``b``, and ``shared``: alice's, with bob's messages too."""
    files = SessionFileArchive(root)
    files.add_messages("s", turn(0) + turn(1), user_id="alice")
    files.add_messages("s2", turn(2), user_id="alice")
    files.add_messages("b", turn(3), user_id="bob")
    files.add_messages("shared", turn(4), user_id="alice")
    # A session two users wrote to (possible before sessions had owners).
    data_path, meta_path = files.paths("shared")
    data = read_json(data_path)
    data["messages"] += [{**item, "user_id": "bob"} for item in messages_to_items(turn(5))]
    fields = {"users": ["alice", "bob"], "message_count": len(data["messages"])}
    if "message_count" in data:  # the session file's own fields
        data.update(fields)
    data_path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    meta_path.write_text(json.dumps({**read_json(meta_path), **fields}), encoding="utf-8")


def messages_to_items(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    return [
        {"created_at": "2026-01-01T00:00:00", "role": m.type, "user_id": None, "data": d}
        for m, d in zip(messages, messages_to_dict(messages), strict=True)
    ]


def session_states(files: SessionFileArchive) -> dict[str, Any]:
    """What a reader sees of each session: its messages and who may write it.

    Asserts that the listing agrees with the messages stored.
    """
    states: dict[str, Any] = {}
    for session in SESSIONS:
        contents = tuple(str(m.content) for m in files.get_messages(session))
        writers = []
        for user in ("alice", "bob", None):
            try:
                files.check_owner(session, user, write=True)
                writers.append(user)
            except SessionOwnershipError:
                pass
        states[session] = (contents, "free" if len(writers) == 3 else writers)
    listed = {i.session_id: (i.message_count, i.user_id) for i in files.sessions()}
    assert listed == {
        session: (len(contents), owner[0])
        for session, (contents, owner) in states.items()
        if contents
    }
    for user in ("alice", "bob"):
        for info in files.sessions(user):
            assert info.session_id in listed
    return states


def assert_files_agree(root: Path, files: SessionFileArchive) -> None:
    """Every meta file is its session file's fields; no other file is left."""
    for session in SESSIONS:
        data_path, meta_path = files.paths(session)
        assert data_path.exists() == meta_path.exists(), session
        if data_path.exists():
            data, meta = read_json(data_path), read_json(meta_path)
            assert meta["message_count"] == len(data.pop("messages")), session
            assert meta == {**meta, **data}, session  # the session file's fields, copied


@pytest.mark.slow
def test_a_writer_killed_at_any_step_leaves_each_session_as_before_or_after(
    tmp_path: Path,
) -> None:
    """SIGKILL before each step of every write: never a session between two states.

    Before the kill, while the writer is stopped, a reader in this process (another
    process than the writer's) sees each session as before or as after the write,
    its listed count that of its messages. After the kill, the same; and once the
    archive is opened again, every meta file is its session file's fields, no
    temporary file is left, and a session as before is so byte for byte: a first
    write that did not reach its commit binds no owner.
    """
    template = tmp_path / "template"
    _seed_sessions(template)
    before_files = tree(template)
    before = session_states(SessionFileArchive(template))
    server = _run(_STEPPED_WRITER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    stopped: int | None = None
    runs = 0
    try:
        for op in STEP_OPS:
            done = tmp_path / f"{op}-done"
            shutil.copytree(template, done)
            server.stdin.write(f"{done} {op} 0\n")
            server.stdin.flush()
            assert server.stdout.readline().strip() == "done"
            after = session_states(SessionFileArchive(done))
            changed = {s for s in SESSIONS if after[s] != before[s]}
            assert changed, op
            flipped: set[str] = set()
            for stop in range(1, 100):
                root = tmp_path / f"{op}-{stop}"
                shutil.copytree(template, root)
                reader = SessionFileArchive(root)  # open before the write
                server.stdin.write(f"{root} {op} {stop}\n")
                server.stdin.flush()
                line = server.stdout.readline().split()
                if line == ["done"]:  # the write has fewer steps: all were tried
                    assert session_states(reader) == after
                    break
                assert line[0] == "stopped", line
                stopped = int(line[1])
                runs += 1
                seen = session_states(reader)  # while the writer is stopped
                for session in SESSIONS:
                    assert seen[session] in (before[session], after[session]), (op, stop)
                os.kill(stopped, signal.SIGKILL)
                assert server.stdout.readline().split() == ["ended", str(signal.SIGKILL)]
                stopped = None
                seen = session_states(reader)
                for session in SESSIONS:
                    assert seen[session] in (before[session], after[session]), (op, stop)
                now_after = {s for s in changed if seen[s] == after[s]}
                assert flipped <= now_after, (op, stop)  # one commit point per session
                flipped = now_after
                reopened = SessionFileArchive(root)
                assert session_states(reopened) == seen
                assert_files_agree(root, reopened)
                left = tree(root)
                for session in SESSIONS:
                    if seen[session] == before[session]:
                        for path in reopened.paths(session):
                            assert left.get(path.name) == before_files.get(path.name)
                if seen["new"] == before["new"]:  # never committed: anyone may take it
                    reopened.add_messages("new", turn(9), user_id="bob")
                else:
                    with pytest.raises(SessionOwnershipError):
                        reopened.add_messages("new", turn(9), user_id="bob")
                assert not any(name.endswith(".tmp") for name in left)  # opening removed them
            else:
                pytest.fail(f"{op} never finished")
            assert flipped == changed, op  # every change was reached by a kill
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGKILL)
        server.kill()
        server.wait(timeout=30)
    assert runs >= 20
    print(f"\n[session files] {runs} kills, at every step of {len(STEP_OPS)} operations")


def test_files_of_the_old_layout_are_read_as_their_messages_and_put_right(tmp_path: Path) -> None:
    """What a kill left with an older version: meta files written before their messages.

    ``s1``'s meta file counts a batch that never reached its messages, ``s2`` has
    a meta file and no message file (a first write killed before its messages).
    """
    item = messages_to_items([HumanMessage("q1"), AIMessage("a1")])
    for entry in item:
        entry["user_id"] = "alice"
    names = {s: safe_filename(s) for s in ("s1", "s2")}
    (tmp_path / f"{names['s1']}.json").write_text(
        json.dumps({"session_id": "s1", "messages": item}), encoding="utf-8"
    )
    for session, count in (("s1", 4), ("s2", 2)):
        meta = {
            "session_id": session,
            "created_at": "2026-01-01T00:00:00",
            "user_id": "alice",
            "last_active": "2026-01-02T00:00:00",
            "users": ["alice"],
            "message_count": count,
        }
        (tmp_path / f"{names[session]}.meta.json").write_text(json.dumps(meta), encoding="utf-8")

    files = SessionFileArchive(tmp_path)
    assert [(i.session_id, i.user_id, i.message_count) for i in files.sessions()] == [
        ("s1", "alice", 2)
    ]
    assert [str(m.content) for m in files.get_messages("s1")] == ["q1", "a1"]
    assert not files.paths("s2")[1].exists()  # a meta file of no session: gone
    # Put right on opening, not at the session's next write: the copy says 2.
    opened = read_json(files.paths("s1")[0])
    opened.pop("messages")
    assert read_json(files.paths("s1")[1]) == opened
    assert opened["message_count"] == 2 and opened["user_id"] == "alice"
    files.add_messages("s2", [HumanMessage("hi")], user_id="bob")  # nobody's session
    with pytest.raises(SessionOwnershipError):
        files.add_messages("s1", [HumanMessage("mine")], user_id="bob")
    files.add_messages("s1", [HumanMessage("q2"), AIMessage("a2")], user_id="alice")
    data_path, meta_path = files.paths("s1")
    data = read_json(data_path)
    assert [m["data"]["data"]["content"] for m in data.pop("messages")] == ["q1", "a1", "q2", "a2"]
    assert read_json(meta_path) == data
    assert data["message_count"] == 4 and data["created_at"] == "2026-01-01T00:00:00"
    assert {i.session_id: i.message_count for i in files.sessions()} == {"s1": 4, "s2": 1}


# The writer forks from a child that imported once; the reader runs all along.
_LOOP_WRITER = r"""
import os, sys
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import SessionFileArchive

def op(files, i):
    kind, cycle = i % 8, i // 8
    pair = [HumanMessage(f"q {i}"), AIMessage(f"a {i}")]
    if kind in (0, 3, 5):
        files.add_messages("s0", pair, user_id="alice")
    elif kind == 1:
        files.add_messages("s1", pair, user_id="alice")
    elif kind == 2:
        files.add_messages("s2", pair, user_id=("bob", "carol")[cycle % 2])
    elif kind == 4:
        files.clear("s1", user_id="alice")
    elif kind == 6:
        files.forget(session_id="s2")
    elif cycle % 3 == 2:
        files.forget(user_id="alice")
    else:
        files.forget(session_id="s0", keep_owner=True)

for line in sys.stdin:
    root, start = line.split()
    pid = os.fork()
    # One write(2) per line, atomic on a pipe: print() may write a line in two, and a
    # kill between them joined "ack 205" to the next line, "ended 9".
    if pid == 0:
        files = SessionFileArchive(root)
        os.write(1, f"writer {os.getpid()}\n".encode())
        for i in range(int(start), 10**6):
            op(files, i)
            os.write(1, f"ack {i}\n".encode())
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    os.write(1, f"ended {status}\n".encode())
"""

_LOOP_READER = r"""
import sys, threading
from langchain_tiered_memory import SessionFileArchive

files = SessionFileArchive(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
reads = 0
while not stop.is_set():
    for info in files.sessions():
        assert info.message_count > 0 and info.message_count % 2 == 0, info
    for session in ("s0", "s1", "s2"):
        contents = [str(m.content) for m in files.get_messages(session)]
        numbers = [int(text.split()[1]) for text in contents]
        assert contents == [f"{'qa'[k % 2]} {n}" for k, n in enumerate(numbers)], contents
        assert numbers[::2] == numbers[1::2] == sorted(set(numbers[::2])), contents
    reads += 1
print(f"reads {reads}", flush=True)
"""

LOOP_SESSIONS = ("s0", "s1", "s2")


def loop_model(count: int) -> dict[str, Any]:
    """The sessions after the loop writer's first ``count`` operations."""
    state: dict[str, Any] = dict.fromkeys(LOOP_SESSIONS)
    for i in range(count):
        kind, cycle = i % 8, i // 8
        pair = [f"q {i}", f"a {i}"]
        add = {0: ("s0", "alice"), 1: ("s1", "alice"), 2: ("s2", ("bob", "carol")[cycle % 2])}
        add |= {3: add[0], 5: add[0]}
        if kind in add:
            session, user = add[kind]
            owner, contents = state[session] or (user, [])
            state[session] = (owner, contents + pair)
        elif kind == 4:
            state["s1"] = (state["s1"][0], [])
        elif kind == 6:
            state["s2"] = None
        elif cycle % 3 == 2:
            state["s0"] = state["s1"] = None
        elif state["s0"] is not None:
            state["s0"] = (state["s0"][0], [])
    return {s: ((), "free") if v is None else (tuple(v[1]), v[0]) for s, v in state.items()}


def loop_states(files: SessionFileArchive) -> dict[str, Any]:
    """Each session's messages and owner, as readers see them; the listing agrees."""
    states = {}
    for session in LOOP_SESSIONS:
        contents = tuple(str(m.content) for m in files.get_messages(session))
        writers = []
        for user in ("alice", "bob", "carol", None):
            try:
                files.check_owner(session, user, write=True)
                writers.append(user)
            except SessionOwnershipError:
                pass
        states[session] = (contents, "free" if len(writers) == 4 else writers[0])
    listed = {i.session_id: (i.message_count, i.user_id) for i in files.sessions()}
    assert listed == {s: (len(c), owner) for s, (c, owner) in states.items() if c}
    return states


@pytest.mark.slow
def test_writers_killed_at_random_moments_leave_every_session_whole(tmp_path: Path) -> None:
    """SIGKILL at random moments of a writer that adds, clears and forgets.

    After each kill every session is as after the acknowledged operations, or
    after the one in flight too (never between: a listed count is the count of
    messages stored, an owner is bound only with the messages; a user's forget,
    over several sessions, may have done some of them); a reader process
    running all along never reads a torn state; reopened, every meta file agrees.
    """
    seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**31))
    rng = random.Random(seed)
    root = tmp_path / "sessions"
    files = SessionFileArchive(root)
    server = _run(_LOOP_WRITER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    reader = _run(
        _LOOP_READER,
        str(root),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None
    assert reader.stdin is not None and reader.stdout is not None
    assert reader.stdout.readline().strip() == "ready"
    start = 0
    try:
        for _ in range(15):
            server.stdin.write(f"{root} {start}\n")
            server.stdin.flush()
            word, pid = server.stdout.readline().split()
            assert word == "writer"
            acked = start - 1
            for _ in range(rng.randrange(3, 25)):  # let it acknowledge a few, then kill
                acked = int(server.stdout.readline().split()[1])
            time.sleep(rng.uniform(0, 0.01))
            os.kill(int(pid), signal.SIGKILL)
            for line in iter(server.stdout.readline, ""):
                if line.startswith("ended"):
                    assert line.split() == ["ended", str(signal.SIGKILL)]
                    break
                acked = int(line.split()[1])
            seen = loop_states(files)
            before, after = loop_model(acked + 1), loop_model(acked + 2)
            for session in LOOP_SESSIONS:  # each session is committed on its own
                assert seen[session] in (before[session], after[session]), (seed, acked, seen)
            if seen not in (before, after):  # a user's forget killed between two sessions
                assert (acked + 1) % 8 == 7 and (acked + 1) // 8 % 3 == 2, (seed, acked, seen)
            # Start again at the operation in flight unless it is all done (a forget
            # finishes where it stopped).
            start = acked + 2 if seen == after else acked + 1
            reopened = SessionFileArchive(root)
            assert loop_states(reopened) == seen
            for session in LOOP_SESSIONS:
                data_path, meta_path = reopened.paths(session)
                assert data_path.exists() == meta_path.exists()
                if data_path.exists():
                    data = read_json(data_path)
                    assert len(data.pop("messages")) == data["message_count"]
                    assert read_json(meta_path) == data
            assert not any(name.endswith(".tmp") for name in tree(root))
        assert start > 45, seed  # at least 3 a run: several rounds of the operations
    finally:
        server.kill()
        server.wait(timeout=30)
        out, err = reader.communicate("stop", timeout=120)
    assert reader.returncode == 0, (err, seed)
    assert int(out.split()[1]) > 0
    print(f"\n[session files] seed {seed}: 15 kills, {start} operations, {out.split()[1]} reads")


# -- 3. path safety, the other methods, and no job queue ----------------------------------


def test_hostile_session_ids_never_leave_root(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = SessionFileArchive(root)
    resolved = root.resolve()
    paths = [files.paths(session) for session in HOSTILE]
    for data_path, meta_path in paths:
        for path in (data_path, meta_path):
            assert path.resolve().is_relative_to(resolved)
            assert path.resolve().parent == resolved
    flat = [p for pair in paths for p in pair]
    assert len(set(flat)) == 2 * len(HOSTILE)  # distinct ids never share a file

    for n, session in enumerate(HOSTILE):
        files.add_messages(session, turn(n), user_id="u1" if n % 2 else "u2")
    on_disk = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert on_disk == {*flat, root / ".lock"}
    for n, session in enumerate(HOSTILE):
        assert files.get_messages(session) == turn(n)
        assert [m.message for m in files.history(session)] == turn(n)
        assert files.history(session)[0].session_id == session
    assert sorted(info.session_id for info in files.sessions()) == sorted(HOSTILE)
    assert not (tmp_path / "x").exists() and not (tmp_path / "b").exists()


def test_history_sessions_clear_and_forget(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    for n in range(5):
        files.add_messages("p", turn(n), user_id="u1")
    files.add_messages("q", turn(9), user_id="u1")
    files.add_messages("r", turn(7), user_id="u2")

    newest = files.history("p", limit=4)
    assert [m.id for m in newest] == [7, 8, 9, 10]
    older = files.history("p", before_id=newest[0].id, limit=4)
    assert [m.id for m in older] == [3, 4, 5, 6]
    assert [str(m.message.content) for m in older] == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
    ]
    assert [m.id for m in files.history("p", before_id=3, limit=50)] == [1, 2]
    assert files.history("p", before_id=1) == []
    assert all(m.user_id == "u1" for m in newest)
    assert files.history("nobody") == []

    assert [i.session_id for i in files.sessions()] == ["r", "q", "p"]  # most recent first
    assert {i.session_id: i.message_count for i in files.sessions("u1")} == {"p": 10, "q": 2}

    assert files.clear("q") == 2
    assert read_json(files.paths("q")[1])["user_id"] == "u1"  # cleared, still u1's
    assert files.clear("q") == 0
    assert files.get_messages("q") == []
    assert [i.session_id for i in files.sessions()] == ["r", "p"]  # as MySQLBackup lists
    assert files.forget(user_id="u1") == 10
    for session in ("p", "q"):  # the cleared session's id is freed too
        assert not any(p.exists() for p in files.paths(session))
    assert [i.session_id for i in files.sessions()] == ["r"]
    assert files.get_messages("r") == turn(7)
    assert files.forget(session_id="r") == 2
    assert files.sessions() == []
    with pytest.raises(ValueError, match="session_id or a user_id"):
        files.forget()


BAD_PAGES: list[dict[str, Any]] = [
    {"limit": -5},
    {"limit": 0},
    {"limit": 10**20},
    {"limit": "5"},
    {"limit": True},
    {"before_id": "abc"},
    {"before_id": 0},
    {"before_id": -1},
    {"before_id": 10**30},
    {"before_id": 3.0},
    {"before_id": False},
    {"session_id": ""},
]


def test_history_refuses_what_mysqlbackup_refuses(tmp_path: Path, backup: MySQLBackup) -> None:
    """``limit=-5`` was an empty page and ``before_id="abc"`` a TypeError deep inside."""
    files = SessionFileArchive(tmp_path)
    for archive in (files, backup):
        archive.add_messages("p", turn(0) + turn(1))
    for bad in BAD_PAGES:
        kwargs = {"session_id": "p", **bad}
        errors = []
        for archive in (files, backup):
            with pytest.raises((TypeError, ValueError)) as caught:
                archive.history(**kwargs)
            errors.append((type(caught.value), str(caught.value)))
        assert errors[0] == errors[1], bad
    for archive in (files, backup):
        with pytest.raises(ValueError, match="turns"):
            archive.tail("p", 10**20)
        assert len(archive.history("p", before_id=2**63 - 1, limit=10**9)) == 4
        assert len(archive.tail("p", 10**9)) == 4


def test_forget_of_a_session_and_the_wrong_user_removes_nothing(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    files.add_messages("s", turn(0), user_id="u1")
    before = tree(tmp_path)
    assert files.forget(session_id="s", user_id="u2") == 0
    assert files.forget(session_id="s", user_id="U1") == 0  # a near twin is another user
    assert tree(tmp_path) == before
    assert files.forget(session_id="s", user_id="u1") == 2
    assert tree(tmp_path) == {}


def test_forget_of_a_user_reaches_every_session_they_wrote(tmp_path: Path) -> None:
    """Sessions last written by someone else included; only the user's messages go."""
    files = SessionFileArchive(tmp_path)
    files.add_messages("shared", turn(0), user_id="u1")
    # A session two users wrote to (before sessions had owners); the last writer is u2.
    shared, shared_meta = files.paths("shared")
    data = read_json(shared)
    data["messages"] += [
        {
            "created_at": "2026-01-01T00:00:00",
            "role": m.type,
            "user_id": "u2",
            "data": message_to_dict(m),
        }
        for m in turn(1)
    ]
    # The session file holds the session's fields (its meta file is a copy of them).
    data.update(user_id="u2", users=["u1", "u2"], message_count=4)
    shared.write_text(json.dumps(data), encoding="utf-8")
    meta = read_json(shared_meta)
    meta.update(user_id="u2", users=["u1", "u2"], message_count=4)
    shared_meta.write_text(json.dumps(meta), encoding="utf-8")
    files.add_messages("mine", turn(2), user_id="u1")
    files.add_messages("theirs", turn(3), user_id="u2")
    files.add_messages("legacy", turn(4), user_id="u1")
    # A session written by an older version: no per-message user, one user in the meta.
    legacy, legacy_meta = files.paths("legacy")
    data = read_json(legacy)
    for item in data["messages"]:
        item.pop("user_id", None)
    data.pop("users", None)
    legacy.write_text(json.dumps(data), encoding="utf-8")
    meta = read_json(legacy_meta)
    meta.pop("users", None)
    legacy_meta.write_text(json.dumps(meta), encoding="utf-8")
    assert {i.session_id for i in files.sessions("u1")} == {"shared", "mine", "legacy"}
    assert {i.session_id for i in files.sessions("u2")} == {"shared", "theirs"}
    theirs = {k: v for k, v in tree(tmp_path).items() if k.startswith(safe_filename("theirs"))}

    assert files.forget(user_id="u1") == 6
    assert files.get_messages("shared") == turn(1)
    assert [m.user_id for m in files.history("shared")] == ["u2", "u2"]
    assert read_json(files.paths("shared")[1])["users"] == ["u2"]
    assert read_json(files.paths("shared")[1])["user_id"] == "u2"
    for session in ("mine", "legacy"):
        assert not any(p.exists() for p in files.paths(session))
    assert files.sessions("u1") == []
    assert {i.session_id for i in files.sessions("u2")} == {"shared", "theirs"}
    left = tree(tmp_path)
    assert {k: v for k, v in left.items() if k.startswith(safe_filename("theirs"))} == theirs
    for n in (0, 2, 4):
        assert not any(f"question {n}".encode() in content for content in left.values())
    assert not any(b"u1" in content for content in left.values())


def _legacy_two_writer_session(root: Path) -> None:
    """``shared`` as an older version left it: messages in its file, the session in its meta.

    Two users wrote to it before sessions had owners: u1 turn 0, then u2 turn 1;
    the meta file names u2 (the last writer) and both writers.
    """
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for user, n in (("u1", 0), ("u2", 1)):
        for item in messages_to_items(turn(n)):
            items.append({**item, "user_id": user})
    name = safe_filename("shared")
    (root / f"{name}.json").write_text(
        json.dumps({"session_id": "shared", "messages": items}), encoding="utf-8"
    )
    meta = {
        "session_id": "shared",
        "created_at": "2026-01-01T00:00:00",
        "user_id": "u2",
        "last_active": "2026-01-01T00:00:00",
        "users": ["u1", "u2"],
        "message_count": 4,
    }
    (root / f"{name}.meta.json").write_text(json.dumps(meta), encoding="utf-8")


def test_a_later_write_keeps_the_earlier_writers_of_a_session(tmp_path: Path) -> None:
    """After the owner writes again, a forget of the other writer still finds the session."""
    _legacy_two_writer_session(tmp_path)
    files = SessionFileArchive(tmp_path)
    files.add_messages("shared", turn(2), user_id="u2")  # the owner (the meta file's user)

    assert files.forget(user_id="u1") == 2
    assert files.get_messages("shared") == turn(1) + turn(2)
    assert [m.user_id for m in files.history("shared")] == ["u2"] * 4
    assert files.sessions("u1") == []
    left = tree(tmp_path)
    assert not any(b"question 0" in content for content in left.values())
    assert not any(b"u1" in content for content in left.values())


def test_history_names_each_writer_of_a_legacy_session(tmp_path: Path) -> None:
    """Each message's user is who wrote it, not the session's owner (the last writer)."""
    _legacy_two_writer_session(tmp_path)
    files = SessionFileArchive(tmp_path)
    assert [(m.user_id, str(m.message.content)) for m in files.history("shared")] == [
        ("u1", "question 0"),
        ("u1", "answer 0"),
        ("u2", "question 1"),
        ("u2", "answer 1"),
    ]
    assert [m.user_id for m in files.history("shared", before_id=3, limit=1)] == ["u1"]


_KILLED_AT_RENAME = r"""
import os, signal, sys
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import SessionFileArchive

root, session, user, target = sys.argv[1:5]
real_replace = os.replace

def dying_replace(src, dst):
    name = os.path.basename(dst)
    if name.endswith(".meta.json") == (target == "meta"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

os.replace = dying_replace
SessionFileArchive(root).add_messages(
    session, [HumanMessage(f"secret of {user} in {session}"), AIMessage("noted")], user_id=user
)
"""


def test_forget_removes_what_killed_writers_left_in_temporary_files(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    files.add_messages("shared", turn(0), user_id="u2")
    files.add_messages("theirs", turn(1), user_id="u2")
    # u1's first write to a new session, killed at its commit (the session file's rename).
    writer = _run(_KILLED_AT_RENAME, str(tmp_path), "fresh", "u1", "messages")
    assert writer.wait(timeout=120) == -signal.SIGKILL
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 2  # the session file and its meta copy
    assert all(re.fullmatch(r"\..+\.json\.\d+\.\d+\.tmp", p.name) for p in leftovers)
    assert sum(b"secret of u1" in p.read_bytes() for p in leftovers) == 1
    assert all(b"u1" in p.read_bytes() for p in leftovers)

    assert files.forget(user_id="u1") == 0  # nothing of u1 was ever stored
    left = tree(tmp_path)
    assert not any(name.endswith(".tmp") for name in left)
    assert not any(b"u1" in content for content in left.values())
    assert files.get_messages("shared") == turn(0)  # u2's session is whole
    assert files.get_messages("theirs") == turn(1)
    assert not any(p.exists() for p in files.paths("fresh"))

    # forget of one session removes its own leftovers (and any killed writer's).
    writer = _run(_KILLED_AT_RENAME, str(tmp_path), "theirs", "u2", "messages")
    assert writer.wait(timeout=120) == -signal.SIGKILL
    assert files.forget(session_id="theirs") == 2
    assert not any(name.endswith(".tmp") for name in tree(tmp_path))


def test_clear_removes_what_a_killed_writer_left_in_temporary_files(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)  # opened first: its opening cleans up leftovers
    files.add_messages("s", turn(0), user_id="u1")
    files.add_messages("other", turn(1), user_id="u2")
    # A second write of u1 to the session, killed at its commit (the session file's rename).
    writer = _run(_KILLED_AT_RENAME, str(tmp_path), "s", "u1", "messages")
    assert writer.wait(timeout=120) == -signal.SIGKILL
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 2, leftovers  # the session file and its meta copy
    assert any(b"secret of u1 in s" in p.read_bytes() for p in tmp_path.iterdir())

    assert files.clear("s", user_id="u1", write=True) == 2
    left = tree(tmp_path)
    assert not any(name.endswith(".tmp") for name in left), sorted(left)
    assert not any(b"secret of u1" in content for content in left.values())
    assert files.get_messages("s") == []
    assert files.get_messages("other") == turn(1)


def test_requesting_background_jobs_is_a_value_error(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    files.add_messages("s", turn(0))
    with pytest.raises(ValueError, match="no job queue"):
        files.add_messages("s", turn(1), jobs=["extract"])
    with pytest.raises(ValueError, match="no job queue"):
        files.add_messages("s", turn(1), jobs=[TurnJobs("consolidate")])

    # A history whose tiers would queue jobs on this archive.
    tier = SimpleNamespace(backup=files, threshold=100, notify=lambda: None)
    with_memory = TieredChatMessageHistory("s", backup=files, long_memory=tier)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no job queue"):
        with_memory.add_messages(turn(1))
    with_consolidator = TieredChatMessageHistory("s", backup=files, consolidator=tier)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no job queue"):
        with_consolidator.add_messages([HumanMessage("q")])
    assert files.get_messages("s") == turn(0)  # nothing of the refused batches

    # A real tier lives on a database archive, which is not this one.
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    database = MySQLBackup(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    consolidator = MemoryConsolidator(
        GenericFakeChatModel(messages=replies()),
        root=tmp_path / "m",
        backup=database,
        start_worker=False,
    )
    try:
        with pytest.raises(ValueError, match="same backup"):
            TieredChatMessageHistory("s", backup=files, consolidator=consolidator)
    finally:
        consolidator.close()
        database.dispose()


@pytest.mark.parametrize("action", ["clear", "forget"])
def test_readers_survive_a_session_cleared_under_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """A session cleared (or forgotten) by another request while it is being read.

    ``sessions()`` lists the folder and then opens each session file, without the
    lock: the file can be emptied or vanish in between. The interleaving is forced
    here by clearing the session just before the file is opened.
    """
    files = SessionFileArchive(tmp_path)
    files.add_messages("stays", turn(1), user_id="u")
    real_open = open
    armed: list[str] = []

    def racing_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if armed and Path(file).name.startswith(safe_filename("goes")):
            armed.clear()
            if action == "clear":  # another thread wins the race right now
                files.clear("goes")
            else:
                files.forget(session_id="goes")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(session_files, "open", racing_open, raising=False)
    outcomes: dict[str, Any] = {}
    for name, read in {
        "sessions": lambda: [i.session_id for i in files.sessions()],
        "get_messages": lambda: files.get_messages("goes"),
        "tail": lambda: files.tail("goes", 2),
        "history": lambda: files.history("goes"),
    }.items():
        files.add_messages("goes", turn(2), user_id="u")
        armed.append("once")
        try:
            outcomes[name] = read()
        except FileNotFoundError as exc:
            outcomes[name] = f"FileNotFoundError: {exc.filename}"
        assert not armed, f"{name} never opened the session file"
    assert outcomes == {"sessions": ["stays"], "get_messages": [], "tail": [], "history": []}


# -- 4. concurrency --------------------------------------------------------------------


def test_eight_threads_eight_sessions_nothing_lost(tmp_path: Path) -> None:
    shared = SessionFileArchive(tmp_path)
    errors: list[BaseException] = []

    def talk(worker: int) -> None:
        # Half the threads share one archive object, half have their own.
        files = shared if worker % 2 else SessionFileArchive(tmp_path)
        history = TieredChatMessageHistory(f"t{worker}", backup=files, window_turns=3)
        try:
            for n in range(15):
                history.add_messages(turn(worker * 100 + n))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=talk, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for worker in range(8):
        expected = [m for n in range(15) for m in turn(worker * 100 + n)]
        assert shared.get_messages(f"t{worker}") == expected
        window = TieredChatMessageHistory(f"t{worker}", backup=shared, window_turns=3).messages
        assert window == expected[-6:]
    assert {i.session_id: i.message_count for i in shared.sessions()} == {
        f"t{w}": 30 for w in range(8)
    }


_SAME_SESSION_WRITER = r"""
import sys
from langchain_core.messages import HumanMessage
from langchain_tiered_memory import SessionFileArchive

root, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = SessionFileArchive(root)
print("ready", flush=True)
sys.stdin.readline()  # start together
for n in range(count):
    files.add_messages("together", [HumanMessage(f"{tag}-{n}")], user_id="u")
"""


@pytest.mark.slow
def test_two_processes_writing_one_session_lose_nothing(tmp_path: Path) -> None:
    count = 30
    writers = [
        _run(
            _SAME_SESSION_WRITER,
            str(tmp_path),
            tag,
            str(count),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for tag in ("A", "B")
    ]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert writer.wait(timeout=120) == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=30)
    files = SessionFileArchive(tmp_path)
    stored = [str(m.content) for m in files.get_messages("together")]
    assert len(stored) == 2 * count
    for tag in ("A", "B"):
        assert [s for s in stored if s.startswith(f"{tag}-")] == [
            f"{tag}-{n}" for n in range(count)
        ]
    [info] = files.sessions()
    assert info.message_count == 2 * count


# -- 5. a session belongs to its user ---------------------------------------------------


async def test_a_session_file_belongs_to_its_first_writer(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    files.add_messages("s", turn(1), user_id="alice")
    files.add_messages("anon", turn(1))
    snapshot = tree(tmp_path)

    for session, intruder in (("s", "bob"), ("s", None), ("anon", "alice")):
        with pytest.raises(SessionOwnershipError):
            files.add_messages(session, turn(2), user_id=intruder)
        with pytest.raises(SessionOwnershipError):
            await files.aadd_messages(session, turn(2), user_id=intruder)
    bob = TieredChatMessageHistory("s", user_id="bob", backup=files)
    for action in (
        lambda: bob.messages,
        bob.all_messages,
        bob.clear,
        lambda: files.history("s", user_id="bob"),
        lambda: files.tail("anon", 1, user_id="alice"),
    ):
        with pytest.raises(SessionOwnershipError):
            action()
    with pytest.raises(SessionOwnershipError):
        await bob.aget_messages()
    assert tree(tmp_path) == snapshot  # not a byte changed
    assert read_json(files.paths("s")[1])["user_id"] == "alice"

    # The owner, and reads without a user, go on; clear keeps the owner, forget frees the id.
    files.add_messages("s", turn(2), user_id="alice")
    assert files.get_messages("s", user_id="alice") == turn(1) + turn(2)
    assert files.tail("s", 1) == turn(2)
    files.clear("s", user_id="alice")
    with pytest.raises(SessionOwnershipError):
        files.add_messages("s", turn(3), user_id="bob")
    files.forget(session_id="s")
    files.add_messages("s", turn(3), user_id="bob")
    assert bob.messages == turn(3)


def test_clear_keeps_the_owner_and_forget_frees_the_session_id(tmp_path: Path) -> None:
    """As ``MySQLBackup``: a cleared session is still its owner's, whoever asks next."""
    files = SessionFileArchive(tmp_path)
    alice = TieredChatMessageHistory("s", user_id="alice", backup=files)
    bob = TieredChatMessageHistory("s", user_id="bob", backup=files)
    alice.add_messages([HumanMessage("my salary is 100k"), AIMessage("noted")])

    alice.clear()

    assert alice.all_messages() == []
    with pytest.raises(SessionOwnershipError):
        bob.add_messages([HumanMessage("bob was here")])
    with pytest.raises(SessionOwnershipError):
        bob.messages  # noqa: B018 - the read is what is refused
    alice.add_messages(turn(2))  # still hers to write
    assert alice.messages == turn(2)
    assert [(i.session_id, i.user_id) for i in files.sessions()] == [("s", "alice")]

    files.forget(user_id="alice")  # forget frees the id
    assert not any(path.exists() for path in files.paths("s"))
    bob.add_messages(turn(3))
    assert bob.messages == turn(3)


def test_forget_keep_owner_empties_the_session_and_keeps_it_its_owners(tmp_path: Path) -> None:
    files = SessionFileArchive(tmp_path)
    files.add_messages("s", turn(1), user_id="alice")
    assert files.forget(session_id="s", keep_owner=True) == len(turn(1))
    assert files.get_messages("s") == []
    with pytest.raises(SessionOwnershipError):
        files.add_messages("s", turn(2), user_id="bob")
    files.add_messages("s", turn(3), user_id="alice")
    assert files.get_messages("s") == turn(3)


def test_a_lone_surrogate_and_a_value_json_cannot_hold_are_kept_as_the_archive_keeps_them(
    tmp_path: Path,
) -> None:
    files, database = SessionFileArchive(tmp_path), MySQLBackup(f"sqlite:///{tmp_path / 'a.db'}")
    message = HumanMessage("half an emoji \ud83d", additional_kwargs={"due": datetime(2023, 6, 1)})
    files.add_messages("s1", [HumanMessage("first")])
    for archive in (files, database):
        archive.add_messages("s1", [message])
    [_, stored] = files.get_messages("s1")
    assert stored.content == "half an emoji \ud83d"
    assert stored == database.get_messages("s1")[0]
    assert stored.additional_kwargs["due"]["type"] == "not_implemented"
    assert SessionFileArchive(tmp_path).get_messages("s1")[0].content == "first"
    database.dispose()
