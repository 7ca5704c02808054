"""core/steps: one plan, run by the sync and the async drivers alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from langchain_tiered_memory.core.steps import (
    Call,
    Emit,
    Gather,
    Relay,
    StepPlan,
    arun,
    arun_stream,
    run,
    run_stream,
)


def _fail() -> Any:
    msg = "tier down"
    raise RuntimeError(msg)


async def _afail() -> Any:
    _fail()


async def _value(value: Any) -> Any:
    return value


def plan(log: list[str]) -> StepPlan[list[Any]]:
    first = yield Call(lambda: "sync", lambda: _value("async"))
    log.append(first)
    results = yield Gather((Call(lambda: 1, lambda: _value(1)), Call(_fail, _afail)))
    yield Relay(lambda: iter("ab"), _letters, str.upper)
    yield Emit("end")
    return [first, *results]


async def _letters() -> Any:
    for letter in "ab":
        yield letter


def test_the_sync_and_async_drivers_run_one_plan() -> None:
    log: list[str] = []
    assert list(run_stream(plan(log))) == ["A", "B", "end"]

    async def collect() -> list[Any]:
        return [item async for item in arun_stream(plan(log))]

    assert asyncio.run(collect()) == ["A", "B", "end"]
    assert log == ["sync", "async"]


def test_gather_sends_back_exceptions_in_place() -> None:
    def gathered() -> StepPlan[list[Any]]:
        return (yield Gather((Call(lambda: 1, lambda: _value(1)), Call(_fail, _afail))))

    for one, error in (run(gathered()), asyncio.run(arun(gathered()))):
        assert one == 1
        assert isinstance(error, RuntimeError)


def test_the_async_gather_is_concurrent() -> None:
    async def meet(barrier: asyncio.Barrier) -> int:
        await asyncio.wait_for(barrier.wait(), 5)  # both calls must be in flight at once
        return 1

    async def main() -> list[Any]:
        barrier = asyncio.Barrier(2)
        calls = tuple(Call(lambda: 0, lambda: meet(barrier)) for _ in range(2))

        def both() -> StepPlan[list[Any]]:
            return (yield Gather(calls))

        return await arun(both())

    assert asyncio.run(main()) == [1, 1]


def test_streams_need_a_stream_driver() -> None:
    def emits() -> StepPlan[None]:
        yield Emit("x")

    with pytest.raises(TypeError, match="stream driver"):
        run(emits())
    with pytest.raises(TypeError, match="stream driver"):
        asyncio.run(arun(emits()))


def test_a_relay_can_hold_its_last_item_back_for_the_plan() -> None:
    def held(log: list[Any]) -> StepPlan[None]:
        last = yield Relay(lambda: iter("abc"), _abc, str.upper, hold_last=True)
        log.append(f"work after the stream, {last} held")
        yield Emit(last)
        empty = yield Relay(lambda: iter(""), _nothing, hold_last=True)
        log.append(empty)

    log: list[Any] = []
    assert list(run_stream(held(log))) == ["A", "B", "C"]

    async def collect() -> list[Any]:
        return [item async for item in arun_stream(held(log))]

    assert asyncio.run(collect()) == ["A", "B", "C"]
    assert log == ["work after the stream, C held", None] * 2


async def _abc() -> Any:
    for letter in "abc":
        yield letter


async def _nothing() -> Any:
    for letter in "":
        yield letter
