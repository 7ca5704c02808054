"""The ERP design's short-term layout as an archive backend: one JSON file per session.

``<root>/{session}.json`` holds the session: its fields (creation time, last
activity, message count, owner and every user who wrote to it), then its messages
(``message_to_dict``, each with the user who wrote it). Its rename is the one
commit point of every write: a process killed before it leaves the session as it
was, in every file; killed after it, the write is stored (as a database commit
whose reply was lost). ``<root>/{session}.meta.json`` is a copy of the fields for
other readers, renamed after the commit; the archive never believes it over the
session file, and a copy a kill left behind is rewritten at the session's next
write, at the next opening of the archive and by ``forget``. Every file is
written to a temporary file that is renamed over the old one, so a crash mid-write
leaves the previous file whole. Session ids become safe file names
(:func:`~langchain_tiered_memory.core.validation.safe_filename`), so ``../x``,
absolute paths and odd characters never leave ``root``.

It serves ``TieredChatMessageHistory`` (window, restart recovery) without a
database; the long-term and consolidation tiers need ``MySQLBackup`` (their job
queue lives in the database).
"""

from __future__ import annotations

import fcntl
import json
import logging
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

logger = logging.getLogger(__name__)

#: The temporary files of :func:`atomic_write`: ``.{name}.{pid}.{thread id}.tmp``.
TMP_FILE = re.compile(r"\..+\.\d+\.\d+\.tmp")

# A session's file names: safe_filename ends every name with "-" and 12 hex digits,
# so "{name}.json" and "{name}.meta.json" of two sessions never collide.
_SESSION_FILE = re.compile(r"(?P<name>.+-[0-9a-f]{12})(?P<meta>\.meta)?\.json")
_SESSION_TMP = re.compile(r"\.(?P<name>.+-[0-9a-f]{12})(?:\.meta)?\.json\.\d+\.\d+\.tmp")

#: What the lock file holds once every session file of the folder holds its fields
#: (see ``SessionFileArchive._upgrade``); older versions left it empty.
LAYOUT_MARK = "layout 2\n"

# The session's fields, in the order they open ``{session}.json`` (and fill the meta file).
_FIELDS = ("session_id", "user_id", "users", "created_at", "last_active", "message_count")
_FIELDS_END = b', "messages": '  # where the fields end: a quote inside a JSON string is \"


def _write_temporary(path: Path, text: str) -> Path:
    """Write ``text`` to a fsynced temporary file beside ``path``; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file, fsync and rename: readers see old or new, whole.

    A writer killed before the rename leaves its temporary file (see
    :data:`TMP_FILE`) beside ``path``; ``forget`` removes such leftovers.
    """
    tmp = _write_temporary(path, text)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _users(meta: dict[str, Any] | None) -> set[str]:
    """Every user who wrote to a session (meta files of older versions: the last one)."""
    meta = meta or {}
    return set(meta.get("users") or ()) | ({meta["user_id"]} if meta.get("user_id") else set())


def _fields(values: dict[str, Any], message_count: int) -> dict[str, Any]:
    """The session's fields in ``_FIELDS`` order, with its message count."""
    return {**{key: values.get(key) for key in _FIELDS}, "message_count": message_count}


def _legacy_fields(data: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    """The fields of a session file of an older version (messages only) and its meta file.

    Those versions wrote the meta file first, so a kill left it ahead: the count is
    the file's, and the owner, bound by the first write, is the meta file's (else
    the first message's writer, as ``MySQLBackup`` rules for sessions of old archives).
    """
    items = data["messages"]
    first = items[0] if items else {}
    last = items[-1] if items else {}
    meta = meta or {}
    created = meta.get("created_at") or first.get("created_at") or utcnow().isoformat()
    owner = meta["user_id"] if "user_id" in meta else first.get("user_id")
    users = _users(meta) | {item["user_id"] for item in items if item.get("user_id")}
    values = {
        "session_id": data["session_id"],
        "user_id": owner,
        "users": sorted(users | ({owner} if owner else set())),
        "created_at": created,
        "last_active": last.get("created_at") or meta.get("last_active") or created,
    }
    return _fields(values, len(items))


def _load(path: Path, *, messages: bool = True) -> tuple[dict[str, Any], list[Any]] | None:
    """A session file's fields and (with ``messages``) its stored messages.

    ``None`` if there is no such file: the session does not exist, whatever meta
    file is left. Without ``messages``, only the fields at the head of the file are
    read (the list is then empty), so listing sessions costs no message; an
    older version's file, which has no fields, is read whole.
    """
    try:
        with open(path, "rb") as handle:  # one open: one version of the file
            if not messages:
                head = b""
                while chunk := handle.read(4096):
                    head += chunk
                    end = head.find(_FIELDS_END)
                    if end >= 0:
                        try:
                            values = json.loads(head[:end] + b"}")
                        except ValueError:
                            break
                        if "message_count" in values:
                            return _fields(values, values["message_count"]), []
                        break  # an older version's file: read it whole
                handle.seek(0)
            data = json.loads(handle.read())
    except FileNotFoundError:
        return None
    return _parsed(path, data)


def _parsed(path: Path, data: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The fields and messages of the session file at ``path``, whose JSON is ``data``."""
    items = data["messages"]
    if "message_count" in data:
        return _fields(data, len(items)), items
    meta_path = path.with_name(f"{path.name[: -len('.json')]}.meta.json")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        meta = None
    return _legacy_fields(data, meta), items


def _refuse(
    fields: dict[str, Any] | None, session_id: str, user_id: str | None, *, write: bool
) -> None:
    """Raise if ``user_id`` may not use the session of ``fields`` (the owner rule)."""
    if user_id is None and not write:
        return
    if fields is not None and fields.get("user_id") != user_id:
        raise SessionOwnershipError(session_id, user_id)


class SessionFileArchive(InlineAsyncArchive):
    """Archive backend of JSON session files (the design's ``{session_id}.json``).

    ``forget`` follows :meth:`MySQLBackup.forget
    <langchain_tiered_memory.storage.archive.MySQLBackup.forget>`: a user's forget removes
    the messages that user wrote, in every session they ever wrote to (a session
    shared with another user keeps that user's messages), and the temporary files
    of killed writers, which may hold anyone's unacknowledged messages.

    Sessions belong to the user of their first write, as in
    :class:`~langchain_tiered_memory.MySQLBackup` (the session file keeps the owner,
    committed with the messages as the owner row is in ``MySQLBackup``).

    Every write is committed by one rename, so a writer killed at any point
    leaves each session as it was before the write or as after it, never between
    (see the module). Opening the archive puts right the meta files a killed
    writer left behind and removes its temporary files.

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
        try:
            with self._locked():
                self._recover()
        except OSError as exc:  # a read-only folder: its readers never read the copies
            logger.warning("SessionFileArchive(%r): meta files not checked: %s", str(root), exc)

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

    def _load(
        self, session_id: str, *, messages: bool = True
    ) -> tuple[dict[str, Any], list[Any]] | None:
        return _load(self.paths(session_id)[0], messages=messages)

    def _owned(self, session_id: str, user_id: str | None, *, write: bool = False) -> list[Any]:
        """The session's stored messages, read once and checked as :meth:`check_owner`."""
        session_id = validate_id(session_id)
        user_id = validate_optional_id(user_id)
        loaded = self._load(session_id)
        _refuse(None if loaded is None else loaded[0], session_id, user_id, write=write)
        return [] if loaded is None else loaded[1]

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
        loaded = self._load(session_id, messages=False)
        _refuse(None if loaded is None else loaded[0], session_id, user_id, write=write)

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
            loaded = self._load(session_id)
            previous, stored = loaded if loaded is not None else (None, [])
            # The first write binds the owner, for good.
            _refuse(previous, session_id, user_id, write=True)
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
            values = previous or {"session_id": session_id, "created_at": now}
            # Every writer, not only the last: a user's forget must find the session.
            users = _users(previous) | ({user_id} if user_id else set())
            values = {**values, "user_id": user_id, "users": sorted(users), "last_active": now}
            self._commit(session_id, values, stored)
        return list(range(first, first + len(messages)))

    def _commit(self, session_id: str, values: dict[str, Any], stored: list[Any]) -> None:
        """Store the session: its fields and ``stored``, committed by one rename.

        The meta file's copy is written first and renamed last: a writer killed
        between the two renames leaves it as evidence, which :meth:`_recover`
        finds. If the copy cannot be renamed, the write stands (it is committed:
        raising would have the caller store it twice) and the copy is put right later.
        """
        path, meta_path = self.paths(session_id)
        fields = _fields(values, len(stored))
        copy = _write_temporary(meta_path, exact_json(fields))
        try:
            atomic_write(path, exact_json({**fields, "messages": stored}, stand_ins=True))
        except BaseException:
            copy.unlink(missing_ok=True)
            raise
        try:
            os.replace(copy, meta_path)
        except OSError as exc:
            logger.warning("%s: not updated (%s); the session file is right", meta_path, exc)

    def _recover(self) -> None:
        """Put right what killed writers left (under the lock: no writer is mid-write).

        Their temporary files go; the meta file of a session one of them was
        writing, or a session missing its meta file, gets its session file's
        fields again; a meta file without a session file (a removal killed between
        its two deletes) goes.
        """
        names = set(os.listdir(self.root))
        check: set[str] = set()
        for name in names:
            if TMP_FILE.fullmatch(name):
                if tmp := _SESSION_TMP.fullmatch(name):
                    check.add(tmp["name"])
                _unlink_tmp(self.root / name)
            elif (found := _SESSION_FILE.fullmatch(name)) is not None:
                other = f"{found['name']}{'' if found['meta'] else '.meta'}.json"
                if other not in names:
                    check.add(found["name"])
        lock = self.root / ".lock"
        if lock.read_text(encoding="utf-8") != LAYOUT_MARK:
            self._upgrade(names)
            # Written in place, under its own lock: replacing the file would leave
            # other processes locking the old one.
            with open(lock, "r+", encoding="utf-8") as handle:
                handle.write(LAYOUT_MARK)
                handle.truncate()
        for name in check:
            path, meta_path = self.root / f"{name}.json", self.root / f"{name}.meta.json"
            loaded = _load(path, messages=False)
            if loaded is None:
                meta_path.unlink(missing_ok=True)
                continue
            text = exact_json(loaded[0])
            try:
                if meta_path.read_text(encoding="utf-8") == text:
                    continue
            except FileNotFoundError:
                pass
            atomic_write(meta_path, text)

    def _upgrade(self, names: set[str]) -> None:
        """Rewrite the session files of older versions (messages only) with their fields.

        Once per folder (then the lock file holds :data:`LAYOUT_MARK`): those
        versions wrote the meta file first, so a kill could leave it ahead of its
        session, and only a whole read tells such a file. A kill midway leaves the
        mark unwritten, and the next opening goes on (a file already rewritten is
        passed over).
        """
        for name in sorted(names):
            found = _SESSION_FILE.fullmatch(name)
            if found is None or found["meta"]:
                continue
            try:
                data = json.loads((self.root / name).read_bytes())
            except FileNotFoundError:
                continue
            if "message_count" in data:
                continue  # written by this version
            if self.paths(data["session_id"])[0].name == name:
                self._commit(data["session_id"], *_parsed(self.root / name, data))

    def get_messages(self, session_id: str, *, user_id: str | None = None) -> list[BaseMessage]:
        """Every message of the session, oldest first (``user_id``: :meth:`check_owner`)."""
        return messages_from_dict([item["data"] for item in self._owned(session_id, user_id)])

    def tail(
        self, session_id: str, turns: int, *, user_id: str | None = None, write: bool = False
    ) -> list[BaseMessage]:
        """The messages of the last ``turns`` turns (``user_id``, ``write``: :meth:`check_owner`).

        Turns are those of :func:`~langchain_tiered_memory.core.turns.turn_starts`,
        as in :meth:`MySQLBackup.tail <langchain_tiered_memory.MySQLBackup.tail>`.
        """
        turns = check_int("turns", turns)
        stored = self._owned(session_id, user_id, write=write)
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
        user_id = validate_optional_id(user_id)
        loaded = self._load(session_id)
        _refuse(None if loaded is None else loaded[0], session_id, user_id, write=False)
        if loaded is None:
            return []
        fields, stored = loaded
        end = len(stored) if before_id is None else max(0, min(before_id - 1, len(stored)))
        page = range(max(0, end - limit), end)
        return [
            ArchivedMessage(
                id=i + 1,
                session_id=session_id,
                user_id=stored[i].get("user_id", fields["user_id"]),
                role=stored[i]["role"],
                message=messages_from_dict([stored[i]["data"]])[0],
                created_at=datetime.fromisoformat(stored[i]["created_at"]),
            )
            for i in page
        ]

    def sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        """Sessions from their files, most recently active first.

        With ``user_id``, the sessions that user ever wrote to. A cleared session
        (no message left, its owner kept) is not listed, as in ``MySQLBackup``.
        """
        return [info for info in self._infos(user_id) if info.message_count]

    def _infos(self, user_id: str | None) -> list[SessionInfo]:
        """Every session file's session, cleared ones included (``forget`` frees those too).

        Read from the session files, not the meta files: a count is always that of
        the messages stored.
        """
        infos = []
        for name in os.listdir(self.root):
            found = _SESSION_FILE.fullmatch(name)
            if found is None or found["meta"]:
                continue
            loaded = _load(self.root / name, messages=False)
            if loaded is None:  # forgotten while we listed
                continue
            fields = loaded[0]
            if user_id is not None and user_id not in _users(fields):
                continue
            infos.append(
                SessionInfo(
                    session_id=fields["session_id"],
                    user_id=fields["user_id"],
                    message_count=fields["message_count"],
                    first_at=datetime.fromisoformat(fields["created_at"]),
                    last_active=datetime.fromisoformat(fields["last_active"]),
                )
            )
        return sorted(infos, key=lambda info: info.last_active, reverse=True)

    def clear(self, session_id: str, *, user_id: str | None = None, write: bool = False) -> int:
        """Delete the session's messages; returns how many there were.

        The session file stays, with the owner and no message (and so its meta
        file), so the session keeps its owner (as in ``MySQLBackup``);
        :meth:`forget` frees the id.

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
        files, and so its owner; otherwise both files go and the id is free.
        """
        path, meta_path = self.paths(session_id)
        loaded = self._load(session_id)
        previous, stored = loaded if loaded is not None else (None, [])
        writer = (previous or {}).get("user_id")  # who wrote items of older versions
        keep = (
            []
            if user_id is None
            else [item for item in stored if item.get("user_id", writer) != user_id]
        )
        if user_id is not None and len(keep) == len(stored) and user_id not in _users(previous):
            return 0  # not this user's session: nothing of it is touched
        if previous is not None and keep:
            for item in keep:  # older items: their writer is written down from now on
                item.setdefault("user_id", writer)
            users = {item["user_id"] for item in keep} - {None}
            values = {**previous, "users": sorted(users)}
            if values["user_id"] not in users:
                values["user_id"] = keep[-1]["user_id"]
            self._commit(session_id, values, keep)
        elif keep_owner and previous is not None:
            owner = previous["user_id"]
            # Only the owner is left to find it: a forget of that user frees the id.
            self._commit(session_id, {**previous, "users": [owner] if owner else []}, [])
        else:
            path.unlink(missing_ok=True)  # the commit point: the session is gone
            meta_path.unlink(missing_ok=True)
        name = path.name[: -len(".json")]
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
        forgotten messages under any session's name. So does a meta file a killed
        removal left without its session. With ``keep_owner``, an emptied
        ``session_id`` keeps its files and so its owner.

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
            self._recover()
        return removed


def _unlink_tmp(path: Path) -> None:
    if TMP_FILE.fullmatch(path.name) and path.is_file():
        path.unlink(missing_ok=True)
