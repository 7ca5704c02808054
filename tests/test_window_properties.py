"""Property test of the window: any stored sequence gives a window providers accept.

Generated sessions mix questions, answers, tool calls (ids ``""``, ``None`` and
repeated ones, content-block calls of each shape, invalid calls), results right,
wrong, missing and repeated, the older result shapes (``FunctionMessage``,
``ChatMessage`` "tool"/"function") and system messages anywhere. For each, the
window of a ``TieredChatMessageHistory`` must pass :func:`validate_conversation`,
hold every stored message of the turns it covers (stand-ins only for calls
without a result), keep their order but for what the rules move, respect its
budget and ``window_turns``, read the same from a new history, and not raise.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core import messages as lc
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory, estimate_tokens
from langchain_tiered_memory.core.turns import answerable_calls, role_of, split_turns
from langchain_tiered_memory.tiers.compression import ContextCompressor, validate_conversation
from langchain_tiered_memory.tiers.window import UNANSWERED

from .conftest import MYSQL_URL, _drop, require_mysql

IDS = ["a", "b", "", None]
NAMES = ["f", "g", None]
BLOCK_SHAPES = {
    "tool_use": ("id", "input"),
    "tool_call": ("id", "args"),
    "function_call": ("call_id", "arguments"),
}
counter = itertools.count()


def _text() -> st.SearchStrategy[str]:
    return st.builds(lambda n: f"m{next(counter)}" + " word" * n, st.integers(0, 30))


@st.composite
def ai_with_calls(draw: st.DrawFn) -> AIMessage:
    calls = [
        {"name": draw(st.sampled_from(["f", "g"])), "args": {}, "id": draw(st.sampled_from(IDS))}
        for _ in range(draw(st.integers(0, 3)))
    ]
    invalid = [
        {
            "name": draw(st.sampled_from(NAMES)),
            "args": "{not json",
            "id": draw(st.sampled_from(IDS)),
            "error": "bad",
        }
        for _ in range(draw(st.integers(0, 1)))
    ]
    blocks: list[Any] = []
    for _ in range(draw(st.integers(0, 2))):
        shape = draw(st.sampled_from(list(BLOCK_SHAPES)))
        id_key, args_key = BLOCK_SHAPES[shape]
        block = {"type": shape, "name": draw(st.sampled_from(["f", "g"])), args_key: {}}
        call_id = draw(st.sampled_from(IDS))
        if call_id is not None:
            block[id_key] = call_id
        blocks.append(block)
    content: Any = [{"type": "text", "text": draw(_text())}, *blocks] if blocks else draw(_text())
    return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid)  # type: ignore[arg-type]


MESSAGE = st.one_of(
    st.builds(HumanMessage, _text()),
    st.builds(AIMessage, _text()),
    ai_with_calls(),
    ai_with_calls(),
    st.builds(
        lambda text, call_id: ToolMessage(text, tool_call_id=call_id),
        _text(),
        st.sampled_from(["a", "b", "", "zz"]),
    ),
    st.builds(
        lambda text, name: lc.FunctionMessage(content=text, name=name),
        _text(),
        st.sampled_from(["f", "g"]),
    ),
    st.builds(
        lambda text, role, name: lc.ChatMessage(content=text, role=role, name=name),
        _text(),
        st.sampled_from(["tool", "function", "system", "developer", "user", "assistant", "critic"]),
        st.sampled_from(NAMES),
    ),
    st.builds(SystemMessage, _text()),
)


def is_standin(message: BaseMessage) -> bool:
    return isinstance(message, ToolMessage) and message.content == UNANSWERED


def check_window(
    window: list[BaseMessage], stored: list[BaseMessage], turns: int, budget: int | None
) -> None:
    # (a) what providers accept, after a prompt's system message, before the next question
    validate_conversation([SystemMessage("prompt"), *window, HumanMessage("next")])
    # (d) the budget and the number of turns
    if budget is not None:
        assert estimate_tokens(window) <= budget
    assert len(split_turns(window)) <= turns
    # (b) the turns covered, whole: the newest turns whose messages are all there
    stored_turns = split_turns(stored)
    real = [m for m in window if not is_standin(m)]
    covered_turns: list[list[BaseMessage]] = []
    for turn in reversed(stored_turns):
        rest = list(real)
        try:
            for message in turn:
                if not isinstance(message, ToolMessage):
                    rest.remove(message)
        except ValueError:
            break
        real = rest
        covered_turns.insert(0, turn)
    covered = [message for turn in covered_turns for message in turn]
    # every message of the window but stand-ins comes from the covered turns
    leftover = list(window)
    for turn in covered_turns:
        for message in turn:
            if message in leftover:
                leftover.remove(message)
            else:
                # only a result may be left out: one answering no call still open
                assert isinstance(message, ToolMessage), message
                assert not _answers_open_call(turn, message), (message, turn)
    assert all(is_standin(m) for m in leftover), leftover
    # (c) order: the others as stored, system messages first
    system = [m for m in window if role_of(m) == "system"]
    assert window[: len(system)] == [m for m in covered if role_of(m) == "system"]
    kept_order = [m for m in window[len(system) :] if not isinstance(m, ToolMessage)]
    assert kept_order == [
        m for m in covered if role_of(m) != "system" and not isinstance(m, ToolMessage)
    ]


def _answers_open_call(turn: list[BaseMessage], result: ToolMessage) -> bool:
    """Whether ``result`` answers a call that no earlier result of the turn answered.

    A result belongs to the latest message before it with a call of its id; that
    message's calls of the id take as many results as it makes.
    """
    owner: int | None = None
    position = next(i for i, m in enumerate(turn) if m is result)
    for index in range(position):
        if result.tool_call_id in [call_id for call_id, _ in answerable_calls(turn[index])]:
            owner = index
    if owner is None:
        return False
    calls = [c for c, _ in answerable_calls(turn[owner])].count(result.tool_call_id)
    earlier = [
        m
        for m in turn[owner + 1 : position]
        if isinstance(m, ToolMessage) and m.tool_call_id == result.tool_call_id
    ]
    # A FunctionMessage or ChatMessage "tool" may have answered the call already.
    older_shapes = [
        m
        for m in turn[owner + 1 : position]
        if role_of(m) in ("function", "tool") and not isinstance(m, ToolMessage)
    ]
    return len(earlier) + len(older_shapes) < calls


@pytest.fixture(scope="module", params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def archive(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MySQLBackup]:
    if request.param == "mysql":
        require_mysql()
        url = MYSQL_URL
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('window') / 'archive.sqlite3'}"
    backup = MySQLBackup(url, table_name=f"t_window_props_{request.param}")
    yield backup
    _drop(backup)


sessions = itertools.count()


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    stored=st.lists(MESSAGE, min_size=1, max_size=14),
    turns=st.integers(1, 4),
    budget=st.one_of(st.none(), st.integers(20, 400)),
)
def test_any_stored_session_gives_a_sendable_whole_window(
    archive: MySQLBackup, stored: list[BaseMessage], turns: int, budget: int | None
) -> None:
    session = f"p{next(sessions)}"
    history = TieredChatMessageHistory(
        session, backup=archive, window_turns=turns, window_max_tokens=budget
    )
    history.add_messages(stored)
    window = history.messages
    reloaded = history.all_messages()
    check_window(window, reloaded, turns, budget)
    # (e) the same from a new history object over the same archive, and from the messages as given
    again = TieredChatMessageHistory(
        session, backup=archive, window_turns=turns, window_max_tokens=budget
    )
    assert again.messages == window
    assert reloaded == stored
    # The compressor keeps it sendable.
    compressor = ContextCompressor(
        compress_threshold=30, force_delete_threshold=60, error_threshold=10**6, preserve_count=2
    )
    validate_conversation(
        [*compressor.compress([SystemMessage("prompt"), *window]), HumanMessage("next")]
    )
