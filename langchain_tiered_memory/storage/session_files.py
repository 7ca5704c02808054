"""The ERP design's short-term layout as an archive backend: one JSON file per session.

``<root>/{session}.json`` holds the messages (``message_to_dict``, each with the
user who wrote it) and ``<root>/{session}.meta.json`` the session's creation time,
last activity, message count, last writer and every user who wrote to it. Every
write goes to a temporary file that is renamed over the old one, so a crash
mid-write leaves the previous file whole. Session ids become safe
file names (:func:`~langchain_tiered_memory.core.validation.safe_filename`), so
``../x``, absolute paths and odd characters never leave ``root``.

It serves ``TieredChatMessageHistory`` (window, restart recovery) without a
database; the long-term and consolidation tiers need ``MySQLBackup`` (their job
queue lives in the database).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from langchain_tiered_memory.core.encoding import exact_json
from langchain_tiered_memory.core.turns import role_of, turn_starts
from langchain_tiered_memory.core.validation import (
    check_int,
    safe_filename,
    validate_batch,
    validate_id,
    validate_optional_id,
    validate_page,
)
from langchain_tiered_memory.storage.archive import SessionOwnershipError, default_home
from langchain_tiered_memory.storage.base import (
    ArchivedMessage,
    EnqueuePlanner,
    InlineAsyncArchive,
    SessionInfo,
    utcnow,
)

#: The temporary files of :func:`atomic_write`: ``.{name}.{pid}.{thread id}.tmp``.
TMP_FILE = re.compile(r"\..+\.\d+\.\d+\.tmp")


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file, fsync and rename: readers see old or new, whole.

    A writer killed before the rename leaves its temporary file (see
    :data:`TMP_FILE`) beside ``path``; ``forget`` removes such leftovers.
    """
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


def _users(meta: dict[str, Any] | None) -> set[str]:
    """Every user who wrote to a session (meta files of older versions: the last one)."""
    meta = meta or {}
    return set(meta.get("users") or ()) | ({meta["user_id"]} if meta.get("user_id") else set())


class SessionFileArchive(InlineAsyncArchive):
    """Archive backend of JSON session files (the design's ``{session_id}.json``).

    ``forget`` follows :meth:`MySQLBackup.forget
    <langchain_tiered_memory.storage.archive.MySQLBackup.forget>`: a user's forget removes
    the messages that user wrote, in every session they ever wrote to (a session
    shared with another user keeps that user's messages), and the temporary files
    of killed writers, which may hold anyone's unacknowledged messages.

    Sessions belong to the user of their first write, as in
    :class:`~langchain_tiered_memory.MySQLBackup` (the meta file keeps the owner).

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

    def check_owner(self, session_id: str, user_id: str | None, *, write: bool = False) -> None:
        """Refuse ``user_id`` access to a session that is not theirs.

        As :meth:`MySQLBackup.check_owner
        <langchain_tiered_memory.MySQLBackup.check_owner>`: a read without a user
        passes; ``write`` asks that ``user_id`` be the owner exactly.

        Raises:
            SessionOwnershipError: If the session belongs to another user, or was
                created without a user.
        """
        session_id = validate_id(session_id)
        user_id = validate_optional_id(user_id)
        if user_id is None and not write:
            return
        meta = self._meta(session_id)
        if meta is not None and meta.get("user_id") != user_id:
            raise SessionOwnershipError(session_id, user_id)

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None = None,
        jobs: Sequence[str | EnqueuePlanner] = (),
    ) -> list[int]:
        """Append messages to the session's file; returns their 1-based positions.

        ``jobs`` is accepted for symmetry with ``MySQLBackup`` and must be empty.

        Raises:
            ValueError: If background jobs are requested (they need a database).
            SessionOwnershipError: If the session belongs to another user (or to
                none, or to one while ``user_id`` is ``None``); nothing is stored.
        """
        session_id, messages, user_id = validate_batch(session_id, messages, user_id)
        if jobs:
            msg = "SessionFileArchive has no job queue: use MySQLBackup for those tiers"
            raise ValueError(msg)
        now = utcnow().isoformat()
        with self._locked():
            stored = self._read(session_id)
            first = len(stored) + 1
            stored.extend(
                {
                    "created_at": now,
                    "role": role_of(m),
                    "user_id": user_id,
                    "data": message_to_dict(m),
                }
                for m in messages
            )
            previous = self._meta(session_id)
            if previous is not None and previous.get("user_id") != user_id:
                raise SessionOwnershipError(session_id, user_id)
            # The first write binds the owner, for good.
            meta = dict(previous or {"session_id": session_id, "created_at": now})
            meta.update(user_id=user_id, last_active=now)
            # Every writer, not only the last: a user's forget must find the session.
            meta["users"] = sorted(_users(previous) | ({user_id} if user_id else set()))
            meta["message_count"] = len(stored)
            self._commit(session_id, stored, meta, previous)
        return list(range(first, first + len(messages)))

    def _commit(
        self,
        session_id: str,
        stored: list[dict[str, Any]],
        meta: dict[str, Any],
        previous: dict[str, Any] | None,
    ) -> None:
        """Write the meta file, then the messages file (the commit point).

        If the messages file cannot be written, the meta file is put back, so the
        session stays as it was.
        """
        path, meta_path = self.paths(session_id)
        atomic_write(meta_path, exact_json(meta))
        try:
            atomic_write(
                path, exact_json({"session_id": session_id, "messages": stored}, stand_ins=True)
            )
        except BaseException:
            if previous is None:
                meta_path.unlink(missing_ok=True)
            else:
                atomic_write(meta_path, exact_json(previous))
            raise

    def get_messages(self, session_id: str, *, user_id: str | None = None) -> list[BaseMessage]:
        """Every message of the session, oldest first (``user_id``: :meth:`check_owner`)."""
        self.check_owner(session_id, user_id)
        return messages_from_dict([item["data"] for item in self._read(session_id)])

    def tail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns (``user_id``, ``write``: :meth:`check_owner`).

        Turns are those of :func:`~langchain_tiered_memory.core.turns.turn_starts`,
        as in :meth:`MySQLBackup.tail <langchain_tiered_memory.MySQLBackup.tail>`.
        """
        turns = check_int("turns", turns)
        self.check_owner(session_id, user_id, write=write)
        stored = self._read(session_id)
        starts = turn_starts([item["role"] for item in stored])
        start = starts[-turns] if len(starts) >= turns else 0
        return messages_from_dict([item["data"] for item in stored[start:]])

    def history(
        self,
        session_id: str,
        before_id: int | None = None,
        limit: int = 50,
        *,
        user_id: str | None = None,
    ) -> list[ArchivedMessage]:
        """One page of the session, oldest first (ids are 1-based positions).

        Raises:
            TypeError, ValueError: As :meth:`MySQLBackup.history
                <langchain_tiered_memory.storage.archive.MySQLBackup.history>`.
        """
        session_id, before_id, limit = validate_page(session_id, before_id, limit)
        self.check_owner(session_id, user_id)
        meta = self._meta(session_id) or {}
        stored = self._read(session_id)
        end = len(stored) if before_id is None else max(0, min(before_id - 1, len(stored)))
        page = range(max(0, end - limit), end)
        return [
            ArchivedMessage(
                id=i + 1,
                session_id=session_id,
                user_id=stored[i].get("user_id", meta.get("user_id")),
                role=stored[i]["role"],
                message=messages_from_dict([stored[i]["data"]])[0],
                created_at=datetime.fromisoformat(stored[i]["created_at"]),
            )
            for i in page
        ]

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions from their meta files, most recently active first.

        With ``user_id``, the sessions that user ever wrote to. A cleared session
        (no message left, its owner kept) is not listed, as in ``MySQLBackup``.
        """
        return [info for info in self._infos(user_id) if info.message_count]

    def _infos(self, user_id: str | None) -> list[SessionInfo]:
        """Every meta file's session, cleared ones included (``forget`` frees those too)."""
        infos = []
        for meta_path in self.root.glob("*.meta.json"):
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except FileNotFoundError:  # forgotten while we listed
                continue
            if user_id is not None and user_id not in _users(meta):
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

    def clear(self, session_id: str, *, user_id: str | None = None, write: bool = False) -> int:
        """Delete the session's messages; returns how many there were.

        The meta file stays, with the owner and no message, so the session keeps
        its owner (as in ``MySQLBackup``); :meth:`forget` frees the id.

        Args:
            session_id: The session.
            user_id: The clearing user, checked as in :meth:`check_owner`.
            write: Check as for a write: ``user_id`` must be the owner exactly
                (``None`` then clears only a session without a user).

        Raises:
            SessionOwnershipError: If the session is not ``user_id``'s (with
                ``write``, also if it has a user while ``user_id`` is ``None``).
        """
        with self._locked():
            self.check_owner(session_id, user_id, write=write)
            return self._remove(session_id, None, keep_owner=True)

    def _remove(self, session_id: str, user_id: str | None, *, keep_owner: bool = False) -> int:
        """Remove a session, or one user's messages of it (under the lock).

        With ``keep_owner`` (``clear``), a session left without messages keeps its
        meta file, and so its owner; otherwise both files go and the id is free.
        """
        stored = self._read(session_id)
        previous = self._meta(session_id)
        writer = (previous or {}).get("user_id")  # who wrote items of older versions
        keep = (
            []
            if user_id is None
            else [item for item in stored if item.get("user_id", writer) != user_id]
        )
        if user_id is not None and len(keep) == len(stored) and user_id not in _users(previous):
            return 0  # not this user's session: nothing of it is touched
        name = self.paths(session_id)[0].name[: -len(".json")]
        if keep:
            for item in keep:  # older items: their writer is written down from now on
                item.setdefault("user_id", writer)
            users = {item["user_id"] for item in keep} - {None}
            meta = dict(previous or {"session_id": session_id, "created_at": utcnow().isoformat()})
            meta.update(message_count=len(keep), users=sorted(users))
            if meta.get("user_id") not in users:
                meta["user_id"] = keep[-1]["user_id"]
            self._commit(session_id, keep, meta, previous)
        elif keep_owner and previous is not None:
            owner = previous.get("user_id")
            # Only the owner is left to find it: a forget of that user frees the id.
            meta = {**previous, "message_count": 0, "users": [owner] if owner else []}
            self._commit(session_id, [], meta, previous)
        else:
            for path in self.paths(session_id):
                path.unlink(missing_ok=True)
        mine = re.compile(rf"\.{re.escape(name)}\.(?:meta\.)?json\.\d+\.\d+\.tmp")
        for leftover in self.root.iterdir():  # a killed writer's copy of the session
            if mine.fullmatch(leftover.name):
                _unlink_tmp(leftover)
        return len(stored) - len(keep)

    def forget(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        keep_owner: bool = False,
    ) -> int:
        """Delete a session, a user's messages, or one user's messages of a session.

        Like :meth:`MySQLBackup.forget
        <langchain_tiered_memory.storage.archive.MySQLBackup.forget>`: with a ``user_id``,
        only the messages that user wrote go, from every session they ever wrote
        to (or from ``session_id`` alone); a session left empty is removed. Every
        temporary file a killed writer left in ``root`` goes too (no live writer
        has one while the archive is locked): an unacknowledged write may hold the
        forgotten messages under any session's name. With ``keep_owner``, an emptied
        ``session_id`` keeps its meta file and so its owner.

        Returns:
            How many messages were removed.
        """
        session_id = None if session_id is None else validate_id(session_id)
        if user_id is not None:
            user_id = validate_id(user_id, "user_id")
        if session_id is None and user_id is None:
            msg = "forget needs a session_id or a user_id"
            raise ValueError(msg)
        with self._locked():
            if session_id is not None:
                removed = self._remove(session_id, user_id, keep_owner=keep_owner)
            else:
                removed = sum(
                    self._remove(info.session_id, user_id) for info in self._infos(user_id)
                )
            for leftover in self.root.iterdir():
                if TMP_FILE.fullmatch(leftover.name):
                    _unlink_tmp(leftover)
        return removed


def _unlink_tmp(path: Path) -> None:
    if TMP_FILE.fullmatch(path.name) and path.is_file():
        path.unlink(missing_ok=True)
