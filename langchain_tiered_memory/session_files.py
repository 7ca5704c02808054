"""The ERP design's short-term layout as an archive backend: one JSON file per session.

``<root>/{session}.json`` holds the messages (``message_to_dict``) and
``<root>/{session}.meta.json`` the session's creation time, last activity and
message count. Every write goes to a temporary file that is renamed over the old
one, so a crash mid-write leaves the previous file whole. Session ids become safe
file names (:func:`~langchain_tiered_memory._validation.safe_filename`), so
``../x``, absolute paths and odd characters never leave ``root``.

It serves ``TieredChatMessageHistory`` (window, restart recovery) without a
database; the long-term and consolidation tiers need ``MySQLBackup`` (their job
queue lives in the database).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from langchain_tiered_memory._validation import safe_filename, validate_batch, validate_id
from langchain_tiered_memory.archive import (
    ArchivedMessage,
    SessionInfo,
    default_home,
    role_of,
    utcnow,
)


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file, fsync and rename: readers see old or new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class SessionFileArchive:
    """Archive backend of JSON session files (the design's ``{session_id}.json``).

    Args:
        root: The folder; default ``$TIERED_MEMORY_HOME/sessions``.

    Example:
        .. code-block:: python

            files = SessionFileArchive("./rag_data/memory")
            history = TieredChatMessageHistory("s1", backup=files, window_turns=10)
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_home() / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SessionFileArchive({str(self.root)!r})"

    def paths(self, session_id: str) -> tuple[Path, Path]:
        """The session's message file and meta file."""
        name = safe_filename(validate_id(session_id))
        return self.root / f"{name}.json", self.root / f"{name}.meta.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # A thread lock for this process, a file lock for the others.
        with self._lock, open(self.root / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self, session_id: str) -> list[dict[str, Any]]:
        path, _ = self.paths(session_id)
        try:  # no exists() check first: a concurrent clear may come in between
            return json.loads(path.read_text(encoding="utf-8"))["messages"]
        except FileNotFoundError:
            return []

    def _meta(self, session_id: str) -> dict[str, Any] | None:
        _, meta = self.paths(session_id)
        try:
            return json.loads(meta.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str] = (),
        consolidate_after: int | None = None,
        idle_seconds: float = 0.0,
    ) -> list[int]:
        """Append messages to the session's file; returns their 1-based positions.

        ``idle_seconds`` is accepted for symmetry with ``MySQLBackup`` (it only
        matters with jobs).

        Raises:
            ValueError: If background jobs are requested (they need a database).
        """
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        if jobs or consolidate_after is not None:
            msg = "SessionFileArchive has no job queue: use MySQLBackup for those tiers"
            raise ValueError(msg)
        now = utcnow().isoformat()
        with self._locked():
            stored = self._read(session_id)
            first = len(stored) + 1
            stored.extend(
                {"created_at": now, "role": role_of(m), "data": message_to_dict(m)}
                for m in messages
            )
            previous = self._meta(session_id)
            meta = dict(previous or {"session_id": session_id, "created_at": now})
            meta.update(user_id=user_id or meta.get("user_id"), last_active=now)
            meta["message_count"] = len(stored)
            path, meta_path = self.paths(session_id)
            # The messages file is renamed last: it is the commit point. If it
            # fails, the meta file is put back, so the session stays as it was.
            atomic_write(meta_path, json.dumps(meta, ensure_ascii=False))
            try:
                atomic_write(
                    path,
                    json.dumps({"session_id": session_id, "messages": stored}, ensure_ascii=False),
                )
            except BaseException:
                if previous is None:
                    meta_path.unlink(missing_ok=True)
                else:
                    atomic_write(meta_path, json.dumps(previous, ensure_ascii=False))
                raise
        return list(range(first, first + len(messages)))

    async def aadd_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str] = (),
        consolidate_after: int | None = None,
        idle_seconds: float = 0.0,
    ) -> list[int]:
        """:meth:`add_messages` (local file writes are not worth a thread hop)."""
        return self.add_messages(
            session_id,
            messages,
            user_id=user_id,
            jobs=jobs,
            consolidate_after=consolidate_after,
            idle_seconds=idle_seconds,
        )

    def get_messages(self, session_id: str) -> list[BaseMessage]:
        """Every message of the session, oldest first."""
        return messages_from_dict([item["data"] for item in self._read(session_id)])

    async def aget_messages(self, session_id: str) -> list[BaseMessage]:
        """:meth:`get_messages`."""
        return self.get_messages(session_id)

    def tail(self, session_id: str, turns: int) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns."""
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            msg = f"turns must be a positive int, got {turns!r}"
            raise ValueError(msg)
        stored = self._read(session_id)
        humans = [i for i, item in enumerate(stored) if item["role"] == "human"]
        start = humans[-turns] if len(humans) >= turns else 0
        return messages_from_dict([item["data"] for item in stored[start:]])

    async def atail(self, session_id: str, turns: int) -> list[BaseMessage]:
        """:meth:`tail`."""
        return self.tail(session_id, turns)

    def history(
        self, session_id: str, before_id: int | None = None, limit: int = 50
    ) -> list[ArchivedMessage]:
        """One page of the session, oldest first (ids are 1-based positions)."""
        meta = self._meta(session_id) or {}
        stored = self._read(session_id)
        end = len(stored) if before_id is None else max(0, min(before_id - 1, len(stored)))
        page = range(max(0, end - limit), end)
        return [
            ArchivedMessage(
                id=i + 1,
                session_id=session_id,
                user_id=meta.get("user_id"),
                role=stored[i]["role"],
                message=messages_from_dict([stored[i]["data"]])[0],
                created_at=datetime.fromisoformat(stored[i]["created_at"]),
            )
            for i in page
        ]

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions from their meta files, most recently active first."""
        infos = []
        for meta_path in self.root.glob("*.meta.json"):
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except FileNotFoundError:  # cleared while we listed
                continue
            if user_id is not None and meta.get("user_id") != user_id:
                continue
            infos.append(
                SessionInfo(
                    session_id=meta["session_id"],
                    user_id=meta.get("user_id"),
                    message_count=meta["message_count"],
                    first_at=datetime.fromisoformat(meta["created_at"]),
                    last_active=datetime.fromisoformat(meta["last_active"]),
                )
            )
        return sorted(infos, key=lambda info: info.last_active, reverse=True)

    def clear(self, session_id: str) -> int:
        """Delete the session's files; returns how many messages they held."""
        with self._locked():
            count = len(self._read(session_id))
            for path in self.paths(session_id):
                path.unlink(missing_ok=True)
        return count

    async def aclear(self, session_id: str) -> int:
        """:meth:`clear`."""
        return self.clear(session_id)

    def forget(self, *, session_id: str | None = None, user_id: str | None = None) -> int:
        """Delete a session's, or all of a user's, files; returns messages removed."""
        if session_id is not None:
            return self.clear(session_id)
        if user_id is None:
            msg = "forget needs a session_id or a user_id"
            raise ValueError(msg)
        return sum(self.clear(info.session_id) for info in self.sessions(user_id=user_id))
