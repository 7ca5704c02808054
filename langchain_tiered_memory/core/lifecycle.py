"""How scripts end: context managers, and a bounded drain of live workers at exit.

A one-shot script that writes a turn and exits must not leave its long-term memory
for "some later process". Every object that owns a worker or connections is a
:class:`Lifecycle`: ``with`` / ``async with`` call its :meth:`Lifecycle.shutdown`
(for a tier: process what is queued, for a bounded time, then stop). A tier whose
worker runs is also registered with :func:`drain_at_exit`: if the script never
shuts it down, the interpreter's exit does, within the same bound. Jobs that do not
finish in time stay durably queued in the archive; one line says how many, and the
next process that opens the archive with the tier finishes them.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import logging
import threading
import time
import weakref
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

#: Default bound, in seconds, of a drain at ``with`` exit, at ``shutdown()`` and at
#: interpreter exit (each tier's ``drain_timeout`` changes it).
DRAIN_TIMEOUT = 10.0
#: Standard modules that call ``threading._register_atexit`` on import.
EXIT_HOOKED_MODULES = ("concurrent.futures.thread", "concurrent.futures.process")


class Lifecycle:
    """Sync and async context-manager support around :meth:`shutdown`.

    Subclasses implement :meth:`shutdown`; :meth:`ashutdown` runs it in a thread
    unless they have a native async way.
    """

    def shutdown(self) -> Any:
        """End the object's work: what leaving a ``with`` block does."""
        raise NotImplementedError

    async def ashutdown(self) -> Any:
        """:meth:`shutdown` without blocking the event loop."""
        return await asyncio.to_thread(self.shutdown)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()


@runtime_checkable
class Drainable(Protocol):
    """A tier whose queued work can be drained within a bound, then stopped."""

    drain_timeout: float

    def drain(self, timeout: float | None = None) -> int:
        """Process queued work for at most ``timeout`` seconds; how many jobs are left."""
        ...

    def shutdown(self, drain_timeout: float | None = None) -> int:
        """:meth:`drain`, then stop the worker; how many jobs are left."""
        ...


_live: weakref.WeakSet[Drainable] = weakref.WeakSet()
_live_lock = threading.Lock()
_hooked = False


def drain_at_exit(tier: Drainable) -> None:
    """Shut ``tier`` down at interpreter exit unless it was shut down first.

    The registry holds it weakly: registering keeps nothing alive.
    """
    global _hooked
    with _live_lock:
        _live.add(tier)
        if not _hooked:
            # The drain runs among the interpreter's thread-exit hooks, before the
            # standard thread pools refuse work (the model load and Chroma use them;
            # in a plain atexit hook they fail with "cannot schedule new futures
            # after interpreter shutdown"). It is registered after the pools' own
            # hooks, so it runs before them (last in, first out), and the modules
            # that add such hooks on import are imported now, while they still may.
            for module in EXIT_HOOKED_MODULES:
                importlib.import_module(module)
            # CPython's hook for what must run before threads are joined (what
            # concurrent.futures uses); elsewhere, a plain atexit hook.
            register = getattr(threading, "_register_atexit", atexit.register)
            register(drain_live)
            _hooked = True


def forget_at_exit(tier: Drainable) -> None:
    """Take ``tier`` off the exit drain (it was shut down or closed)."""
    with _live_lock:
        _live.discard(tier)


def drain_live() -> None:
    """Shut down every live tier, within the largest of their bounds in all.

    Runs at interpreter exit, among the thread-exit hooks (before the standard
    thread pools stop); callable directly. A tier that fails to shut down (its
    database is gone) is logged and the others still run.
    """
    with _live_lock:
        tiers = list(_live)
    if not tiers:
        return
    deadline = time.monotonic() + max(tier.drain_timeout for tier in tiers)
    for tier in tiers:
        left = max(0.0, min(tier.drain_timeout, deadline - time.monotonic()))
        try:
            tier.shutdown(drain_timeout=left)
        except Exception as exc:
            logger.warning("could not drain %r at exit: %s", tier, exc)
