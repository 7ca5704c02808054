"""Sync and async written once: a plan yields steps, a sync or an async driver runs them.

A plan is a generator. Each step it yields says how to do one thing in both
worlds (a function for the sync driver, a coroutine function for the async one);
the driver performs it and sends the result back into the plan. The entry points'
``invoke``/``ainvoke`` (and ``stream``/``astream``) pairs therefore share one body,
the way the archive's statement plans share theirs (``storage/base.py``).

Steps:

* :class:`Call`: one call; its result is sent back.
* :class:`Gather`: several calls, concurrent in the async driver; the list of
  results is sent back, an exception a call raised standing in its place.
* :class:`Relay`: a stream; each item, mapped by ``each``, goes out to the caller
  of :func:`run_stream`/:func:`arun_stream` as it arrives; ``None`` is sent back.
* :class:`Emit`: one item out to the caller of a stream driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import run_in_executor

T = TypeVar("T")


def _same(item: Any) -> Any:
    return item


@dataclass(frozen=True)
class Call(Generic[T]):
    """One call: ``sync()`` for the sync driver, ``await async_()`` for the async one."""

    sync: Callable[[], T]
    async_: Callable[[], Awaitable[T]]


@dataclass(frozen=True)
class Gather:
    """Calls whose results are sent back as one list (exceptions in place, not raised)."""

    calls: tuple[Call[Any], ...]


@dataclass(frozen=True)
class Relay:
    """A stream whose items, mapped by ``each``, go out to the stream driver's caller.

    With ``hold_last`` the last item is not sent out but back to the plan (``None``
    for an empty stream), which emits it when its work after the stream is done: a
    caller that stops at the last item has then seen that work finished.
    """

    sync: Callable[[], Iterable[Any]]
    async_: Callable[[], AsyncIterable[Any]]
    each: Callable[[Any], Any] = _same
    hold_last: bool = False


@dataclass(frozen=True)
class Emit:
    """One item out to the stream driver's caller."""

    value: Any


Step = Call[Any] | Gather | Relay | Emit
StepPlan = Generator[Step, Any, T]


def invoke(
    runnable: Runnable[Any, Any], input: Any, config: RunnableConfig | None = None, **kwargs: Any
) -> Call[Any]:
    """A :class:`Call` of ``runnable.invoke`` / ``runnable.ainvoke`` with these arguments."""
    return Call(
        lambda: runnable.invoke(input, config, **kwargs),
        lambda: runnable.ainvoke(input, config, **kwargs),
    )


def stream(
    runnable: Runnable[Any, Any],
    input: Any,
    config: RunnableConfig | None = None,
    each: Callable[[Any], Any] = _same,
    *,
    hold_last: bool = False,
    **kwargs: Any,
) -> Relay:
    """A :class:`Relay` of ``runnable.stream`` / ``runnable.astream`` with these arguments."""
    return Relay(
        lambda: runnable.stream(input, config, **kwargs),
        lambda: runnable.astream(input, config, **kwargs),
        each,
        hold_last,
    )


def offload(function: Callable[[], T], config: RunnableConfig | None = None) -> Call[T]:
    """A sync-only call: run in place by the sync driver, in an executor by the async one."""
    return Call(function, lambda: run_in_executor(config, function))


def _attempt(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # sent back to the plan, as asyncio.gather would
        return exc


def _perform(step: Step) -> Any:
    if isinstance(step, Call):
        return step.sync()
    if isinstance(step, Gather):
        return [_attempt(call.sync) for call in step.calls]
    msg = f"{type(step).__name__} steps need a stream driver (run_stream)"
    raise TypeError(msg)


async def _aperform(step: Step) -> Any:
    if isinstance(step, Call):
        return await step.async_()
    if isinstance(step, Gather):
        calls = (call.async_() for call in step.calls)
        return list(await asyncio.gather(*calls, return_exceptions=True))
    msg = f"{type(step).__name__} steps need a stream driver (arun_stream)"
    raise TypeError(msg)


@dataclass(frozen=True)
class _Done:
    """What :func:`_advance` answers when the plan has returned."""

    value: Any


def _advance(plan: StepPlan[Any], result: Any) -> Step | _Done:
    """Send ``result`` into ``plan``: its next step, or its return value."""
    try:
        return plan.send(result)
    except StopIteration as stop:
        return _Done(stop.value)


def run(plan: StepPlan[T]) -> T:
    """Run ``plan`` to its end with the sync side of each step; return its result."""
    step = _advance(plan, None)
    while not isinstance(step, _Done):
        step = _advance(plan, _perform(step))
    return cast("T", step.value)


async def arun(plan: StepPlan[T]) -> T:
    """Run ``plan`` to its end with the async side of each step; return its result."""
    step = _advance(plan, None)
    while not isinstance(step, _Done):
        step = _advance(plan, await _aperform(step))
    return cast("T", step.value)


def _relayed(step: Relay, item: Any, held: list[Any]) -> list[Any]:
    """What goes out for one item of a relay; with ``hold_last``, the item before it."""
    item = step.each(item)
    if not step.hold_last:
        return [item]
    out = held[:]
    held[:] = [item]
    return out


def run_stream(plan: StepPlan[Any]) -> Generator[Any, None, None]:
    """Run ``plan`` with the sync side of each step, yielding what it relays and emits."""
    step = _advance(plan, None)
    while not isinstance(step, _Done):
        result = None
        if isinstance(step, Emit):
            yield step.value
        elif isinstance(step, Relay):
            held: list[Any] = []
            for item in step.sync():
                yield from _relayed(step, item, held)
            result = held[0] if held else None
        else:
            result = _perform(step)
        step = _advance(plan, result)


async def arun_stream(plan: StepPlan[Any]) -> AsyncIterator[Any]:
    """Run ``plan`` with the async side of each step, yielding what it relays and emits."""
    step = _advance(plan, None)
    while not isinstance(step, _Done):
        result = None
        if isinstance(step, Emit):
            yield step.value
        elif isinstance(step, Relay):
            held: list[Any] = []
            async for item in step.async_():
                for out in _relayed(step, item, held):
                    yield out
            result = held[0] if held else None
        else:
            result = await _aperform(step)
        step = _advance(plan, result)


__all__ = [
    "Call",
    "Emit",
    "Gather",
    "Relay",
    "Step",
    "StepPlan",
    "arun",
    "arun_stream",
    "invoke",
    "offload",
    "run",
    "run_stream",
]
