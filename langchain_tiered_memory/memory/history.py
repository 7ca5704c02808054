"""``TieredChatMessageHistory``: the per-session view that composes the tiers."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage

from langchain_tiered_memory.core.lifecycle import Drainable, Lifecycle
from langchain_tiered_memory.core.prompts import CONSOLIDATED_HEADER, MEMORIES_HEADER, memory_line
from langchain_tiered_memory.core.validation import (
    check_int,
    check_optional_int,
    validate_id,
    validate_messages,
    validate_optional_id,
)
from langchain_tiered_memory.storage.archive import MySQLBackup, default_backup
from langchain_tiered_memory.storage.base import Archive, EnqueuePlanner
from langchain_tiered_memory.text.tokens import TokenCounter, resolve_token_counter
from langchain_tiered_memory.tiers.window import select_window

if TYPE_CHECKING:
    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory


class QueuedTier(EnqueuePlanner, Protocol):
    """A tier fed by the history's writes: it plans its jobs, then is woken up."""

    @property
    def backup(self) -> MySQLBackup:
        """The archive whose job queue the tier works from."""
        ...

    def notify(self) -> None:
        """Wake the tier's worker: new jobs may be queued."""
        ...


class TierOwner(Protocol):
    """What owns a set of tiers and opens sessions on them (a chain, a middleware)."""

    @property
    def backup(self) -> Archive | str | None:
        """The archive, as its owner was given it."""
        ...

    @property
    def long_memory(self) -> ChromaLongMemory | None:
        """The long-term tier, if any."""
        ...

    @property
    def consolidator(self) -> MemoryConsolidator | None:
        """The MEMORY.md tier, if any."""
        ...


def resolve_backup(
    backup: Archive | str | None,
    long_memory: ChromaLongMemory | None,
    consolidator: MemoryConsolidator | None,
    owner: str,
) -> Archive:
    """The archive an entry point uses; the tiers must share it (their job queue lives there).

    A URL string becomes a ``MySQLBackup`` once; ``None`` means the tiers' archive or
    the embedded default.

    Raises:
        ValueError: If a tier uses another archive.
    """
    if isinstance(backup, str):
        backup = MySQLBackup(backup)
    tiers: dict[str, QueuedTier] = {
        name: tier
        for name, tier in (("long_memory", long_memory), ("consolidator", consolidator))
        if tier is not None
    }
    if backup is None:
        backup = next(iter(tiers.values())).backup if tiers else default_backup()
    for name, tier in tiers.items():
        if tier.backup is not backup:
            msg = (
                f"{name} must use the {owner}'s archive (its job queue lives there): "
                "pass the same backup= to both"
            )
            raise ValueError(msg)
    return backup


def format_memory_context(consolidated: str, memories: Sequence[Document]) -> str:
    """A session's memory context as text: MEMORY.md, then the relevant memories.

    Returns ``""`` when there is neither, so nothing is added to a prompt.
    """
    parts = []
    if consolidated.strip():
        parts.append(f"{CONSOLIDATED_HEADER}\n{consolidated.strip()}")
    if memories:
        items = [memory_line(doc) for doc in memories]
        parts.append(MEMORIES_HEADER + "\n" + "\n".join(items))
    return "\n\n".join(parts)


class TieredChatMessageHistory(Lifecycle, BaseChatMessageHistory):
    """A chat history whose ``messages`` is a bounded window over a durable archive.

    Every message is archived before :meth:`add_messages` returns. ``messages`` is
    the window: the last ``window_turns`` turns, trimmed further, whole turns at a
    time, to ``window_max_tokens``. A window never starts with an AI or tool message
    and never keeps a tool result without the AI message that called it; a system
    message stored mid-conversation comes first in it (providers take system
    messages at the start only), the other messages in their order. The
    archive is the source of truth, so a new instance or a new process shows the
    same window.

    A session belongs to the user of its first write, for good (``None``: to no
    user). A history whose ``user_id`` is not the session's owner reads and writes
    nothing: every method raises
    :class:`~langchain_tiered_memory.SessionOwnershipError`. A history without a
    ``user_id`` may read any session's archive (an administrator's view:
    :meth:`all_messages`), but its window, which goes into a prompt, and its writes
    only a session without a user.

    Args:
        session_id: The conversation. Untrusted input is fine: it is validated.
        user_id: The user who owns the session (``None`` for a session without
            a user).
        backup: The archive; ``None`` means a SQLite file under
            ``$TIERED_MEMORY_HOME`` (default ``./.tiered_memory``). A URL string is
            accepted as a shortcut for ``MySQLBackup(url)``; a
            ``SessionFileArchive`` keeps the design's JSON session files instead.
        long_memory: The long-term tier; each turn queues an extraction job in
            the same transaction as its messages. A turn still open at the end of
            a batch (no AI answer yet) waits the tier's ``idle_seconds`` for it,
            then is extracted as it is. Must share this history's archive.
        consolidator: The MEMORY.md tier; a consolidation job is queued when the
            session's unconsolidated backlog passes its threshold. Must share this
            history's archive.
        window_turns: How many recent turns the window holds.
        window_max_tokens: The window's token budget; ``None`` for no budget.
        token_counter: Counts tokens of a message list: a function of a list, a
            function of one ``BaseMessage``, or a chat model. Defaults to
            :func:`~langchain_tiered_memory.estimate_tokens`.

    Example:
        .. code-block:: python

            from langchain_core.runnables.history import RunnableWithMessageHistory

            chat = RunnableWithMessageHistory(
                chain,
                lambda session_id: TieredChatMessageHistory(session_id, backup=backup),
                input_messages_key="input",
                history_messages_key="history",
            )

    """

    def __init__(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        backup: Archive | str | None = None,
        long_memory: ChromaLongMemory | None = None,
        consolidator: MemoryConsolidator | None = None,
        window_turns: int = 10,
        window_max_tokens: int | None = 8000,
        token_counter: TokenCounter | None = None,
    ) -> None:
        self.session_id = validate_id(session_id, "session_id")
        self.user_id = validate_optional_id(user_id, "user_id")
        self.backup = resolve_backup(backup, long_memory, consolidator, "history")
        # An archive made here from a URL is this history's to release at its end.
        self._own_backup = isinstance(backup, str)
        self.long_memory = long_memory
        self.consolidator = consolidator
        #: The tiers each write feeds, in the order their jobs are queued.
        self.tiers: list[QueuedTier] = [
            tier for tier in (long_memory, consolidator) if tier is not None
        ]
        self.window_turns = check_int("window_turns", window_turns)
        self.window_max_tokens = check_optional_int("window_max_tokens", window_max_tokens)
        self._count_tokens = resolve_token_counter(token_counter)

    @classmethod
    def on_tiers(
        cls,
        owner: TierOwner,
        session_id: str,
        *,
        user_id: str | None = None,
        window_turns: int = 10,
        window_max_tokens: int | None = 8000,
        token_counter: TokenCounter | None = None,
    ) -> TieredChatMessageHistory:
        """The session's history over ``owner``'s archive and tiers.

        Args:
            owner: Whatever holds the ``backup``, ``long_memory`` and
                ``consolidator`` (a chain, a middleware).
            session_id: The session.
            user_id: The user who owns it.
            window_turns: As in the constructor.
            window_max_tokens: As in the constructor.
            token_counter: As in the constructor.

        Returns:
            A new history; nothing is read until it is used.
        """
        return cls(
            session_id,
            user_id=user_id,
            backup=owner.backup,
            long_memory=owner.long_memory,
            consolidator=owner.consolidator,
            window_turns=window_turns,
            window_max_tokens=window_max_tokens,
            token_counter=token_counter,
        )

    def __repr__(self) -> str:
        return (
            f"TieredChatMessageHistory(session_id={self.session_id!r}, "
            f"user_id={self.user_id!r}, backup={self.backup!r})"
        )

    def _window(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        return select_window(
            messages,
            max_turns=self.window_turns,
            max_tokens=self.window_max_tokens,
            count_tokens=self._count_tokens,
        )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The window, oldest first."""
        return self._window(self.backup.tail(**self._tail))

    async def aget_messages(self) -> list[BaseMessage]:
        """Async read of the window, oldest first."""
        return self._window(await self.backup.atail(**self._tail))

    @property
    def _tail(self) -> dict[str, Any]:
        """The archive's arguments for the window's read."""
        # Checked as a write: the window goes into a prompt, so a history without a
        # user must not put a user's session there (RunnableWithMessageHistory reads
        # it before the model and writes after, where a refusal is only logged).
        return {
            "session_id": self.session_id,
            "turns": self.window_turns,
            "user_id": self.user_id,
            "write": True,
        }

    def check_owner(self, *, write: bool = False) -> None:
        """Raise if this history's user may not use its session (see the class docs).

        Args:
            write: Check as for a write (a history without a ``user_id`` may read
                a user's session but not write it): for callers that will write
                and want to refuse before doing any work.

        Raises:
            SessionOwnershipError: If the session belongs to another user.
        """
        self.backup.check_owner(self.session_id, self.user_id, write=write)

    async def acheck_owner(self, *, write: bool = False) -> None:
        """Async :meth:`check_owner`."""
        await self.backup.acheck_owner(self.session_id, self.user_id, write=write)

    def add_messages(self, messages: Iterable[BaseMessage]) -> None:
        """Archive messages; returns only once they are durably stored.

        Any iterable of messages (a generator too) is read once, here.

        Raises:
            TypeError: If an element is not a ``BaseMessage``.
            SessionOwnershipError: If the session belongs to another user (or to
                none while this history has a ``user_id``, or to one while it has
                none); nothing is stored.
            ArchiveUnavailableError: If the archive cannot be reached.

        """
        self.backup.add_messages(**self._write(messages))
        self._notify()

    async def aadd_messages(self, messages: Iterable[BaseMessage]) -> None:
        """Async :meth:`add_messages`."""
        await self.backup.aadd_messages(**self._write(messages))
        self._notify()

    def _write(self, messages: Iterable[BaseMessage]) -> dict[str, Any]:
        """The archive's arguments for a write (each tier plans its own jobs)."""
        return {
            "session_id": self.session_id,
            "messages": validate_messages(messages),
            "user_id": self.user_id,
            "jobs": self.tiers,
        }

    def _notify(self) -> None:
        for tier in self.tiers:
            tier.notify()

    @property
    def consolidated_memory(self) -> str:
        """The session's MEMORY.md ("" without a consolidator or before its first run).

        Checked as a write, as the window: it goes into a prompt.

        Raises:
            SessionOwnershipError: If the session belongs to another user (or to
                one while this history has no ``user_id``).
        """
        if self.consolidator is None:
            return ""
        return self.consolidator.memory(self.session_id, user_id=self.user_id, write=True)

    def search_memories(
        self,
        query: str,
        k: int = 10,
        scope: Literal["session", "user"] = "session",
        *,
        since: Any = None,
        until: Any = None,
    ) -> list[Document]:
        """Long-term memories of this session (or, with ``scope="user"``, its user).

        ``since``/``until`` keep the memories whose turn happened in that window
        (see :meth:`ChromaLongMemory.search`).

        Raises:
            ValueError: If no ``long_memory`` was given, or ``scope="user"`` without
                a ``user_id``.
            SessionOwnershipError: If the session belongs to another user.
        """
        if self.long_memory is None:
            msg = "search_memories needs a long_memory (ChromaLongMemory)"
            raise ValueError(msg)
        self.check_owner(write=True)  # as the window: what it finds goes into a prompt
        return self.long_memory.search(
            query,
            session_id=self.session_id,
            user_id=self.user_id,
            scope=scope,
            k=k,
            since=since,
            until=until,
        )

    def clear(self) -> None:
        """Delete this session's messages from the archive (it keeps its owner).

        Checked as a write: a history without a ``user_id`` clears only a session
        without a user.

        Raises:
            SessionOwnershipError: If this history may not write the session;
                nothing is deleted.
        """
        self.backup.clear(self.session_id, user_id=self.user_id, write=True)

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await self.backup.aclear(self.session_id, user_id=self.user_id, write=True)

    def shutdown(self, drain_timeout: float | None = None) -> int:
        """Let the tiers finish what is queued, within a bound (what a ``with`` block's end does).

        Waits at most ``drain_timeout`` seconds in all (``None``: the largest of
        the tiers' own ``drain_timeout``) for the tiers to process the queued jobs,
        this session's turns among them, then releases an archive this history
        opened from a URL string. The tiers keep running, since other histories
        may share them: end them with their own ``with`` block or ``shutdown()``.
        Jobs left over stay queued for the next process (one line says so).

        Returns:
            How many jobs were left queued.
        """
        tiers = [tier for tier in self.tiers if isinstance(tier, Drainable)]
        bound = max((tier.drain_timeout for tier in tiers), default=0.0)
        deadline = time.monotonic() + (bound if drain_timeout is None else drain_timeout)
        left = sum(tier.drain(max(0.0, deadline - time.monotonic())) for tier in tiers)
        if self._own_backup and isinstance(self.backup, Lifecycle):
            self.backup.shutdown()
        return left

    def all_messages(self) -> list[BaseMessage]:
        """Every archived message of the session, not just the window."""
        return self.backup.get_messages(self.session_id, user_id=self.user_id)
