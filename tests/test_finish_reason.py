"""FinishReasonHandler: truncated answers are detected, continued and stitched.

``ScriptedChatModel`` (tests/fakes.py: a ``GenericFakeChatModel`` whose replies keep
their ``response_metadata`` when streamed, the finish reason on the last chunk as real
providers send it) stands in for the LLM; ``ChunkedChatModel`` streams replies in shapes
it cannot make (indexed content blocks, reasoning in ``additional_kwargs``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from langchain_tiered_memory import FinishReasonHandler
from langchain_tiered_memory.core.finish import finish_reason, is_truncated
from langchain_tiered_memory.core.prompts import PROMPTS
from langchain_tiered_memory.integrations.finish_reason import MARK_KEY

from .fakes import USAGE, ChunkedChatModel, ScriptedChatModel, cut, done


def scripted(*answers: AIMessage | str, **kwargs: Any) -> ScriptedChatModel:
    return ScriptedChatModel(messages=iter(answers), **kwargs)


def mark(message: BaseMessage) -> dict[str, Any]:
    return message.response_metadata[MARK_KEY]


def total(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    result = chunks[0]
    for chunk in chunks[1:]:
        result = result + chunk
    return result


def invoke_and_stream(
    model: Callable[[], BaseChatModel], question: str = "q"
) -> tuple[AIMessage, AIMessageChunk]:
    """The handler's answer by ``invoke`` and by summing its ``stream``, each on a fresh model."""
    invoked = FinishReasonHandler(model()).invoke(question)
    streamed = total(list(FinishReasonHandler(model()).stream(question)))
    return invoked, streamed


class GeminiFinishReason(enum.Enum):
    STOP = 1
    MAX_TOKENS = 2


# -- detection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "reason", "truncated"),
    [
        ({"finish_reason": "length"}, "length", True),  # OpenAI, Mistral, Groq
        ({"stop_reason": "max_tokens"}, "max_tokens", True),  # Anthropic
        ({"stopReason": "max_tokens"}, "max_tokens", True),  # Bedrock Converse
        ({"finish_reason": "MAX_TOKENS"}, "MAX_TOKENS", True),  # Gemini, as text
        ({"finish_reason": GeminiFinishReason.MAX_TOKENS}, "MAX_TOKENS", True),  # as an enum
        ({"done_reason": "length"}, "length", True),  # Ollama
        (
            {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
            "max_output_tokens",
            True,
        ),  # OpenAI Responses API
        ({"finish_reason": "stop"}, "stop", False),
        ({"stop_reason": "end_turn"}, "end_turn", False),
        ({"finish_reason": GeminiFinishReason.STOP}, "STOP", False),
        ({"finish_reason": "tool_calls"}, "tool_calls", False),
        ({"done_reason": "stop"}, "stop", False),
        ({}, None, False),
        ({"finish_reason": None, "stop_reason": "max_tokens"}, "max_tokens", True),
    ],
)
def test_every_provider_spelling_of_the_token_limit(
    metadata: dict[str, Any], reason: str | None, truncated: bool
) -> None:
    message = AIMessage("partial", response_metadata=metadata)
    assert finish_reason(message) == reason
    assert is_truncated(message) is truncated


# -- invoke ------------------------------------------------------------------------


def test_invoke_continues_and_stitches_the_parts() -> None:
    model = scripted(cut("The AR table has"), cut(" columns id,"), done(" amount and due_date."))
    handler = FinishReasonHandler(model)
    question = [SystemMessage("be brief"), HumanMessage("Describe the AR table")]
    answer = handler.invoke(question)

    assert isinstance(answer, AIMessage)
    assert answer.content == "The AR table has columns id, amount and due_date."
    assert mark(answer) == {"continuations": 2, "truncated": False}
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.response_metadata["model_name"] == "fake-1"
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 3 * USAGE["output_tokens"]
    # Each continuation resends the conversation, the whole answer so far, and the request.
    assert len(model.prompts) == 3
    assert model.prompts[0] == question
    second, third = model.prompts[1], model.prompts[2]
    assert second[:2] == question and third[:2] == question
    assert second[2] == AIMessage("The AR table has")
    assert third[2] == AIMessage("The AR table has columns id,")
    assert second[3] == third[3] == HumanMessage(PROMPTS["en"].continue_prompt)


async def test_ainvoke_continues_and_stitches_the_parts() -> None:
    model = scripted(cut("one"), done(" two"))
    answer = await FinishReasonHandler(model).ainvoke("count")
    assert answer.content == "one two"
    assert mark(answer) == {"continuations": 1, "truncated": False}
    assert model.prompts[1][-2:] == [AIMessage("one"), HumanMessage(PROMPTS["en"].continue_prompt)]


def test_a_complete_answer_is_returned_as_is_and_marked() -> None:
    model = scripted(done("All done."))
    answer = FinishReasonHandler(model).invoke("hi")
    assert answer.content == "All done."
    assert mark(answer) == {"continuations": 0, "truncated": False}
    assert len(model.prompts) == 1


def test_gives_up_after_max_continuations_and_says_still_truncated() -> None:
    model = scripted(*(cut(f"p{i} ") for i in range(10)))
    answer = FinishReasonHandler(model, max_continuations=2).invoke("a very long report")
    assert answer.content == "p0 p1 p2 "
    assert mark(answer) == {"continuations": 2, "truncated": True}
    assert answer.response_metadata["finish_reason"] == "length"
    assert len(model.prompts) == 3


def test_zero_continuations_only_marks() -> None:
    model = scripted(cut("half"))
    answer = FinishReasonHandler(model, max_continuations=0).invoke("q")
    assert answer.content == "half"
    assert mark(answer) == {"continuations": 0, "truncated": True}
    assert len(model.prompts) == 1


def test_anthropic_and_ollama_spellings_are_continued() -> None:
    anthropic = scripted(
        AIMessage("a", response_metadata={"stop_reason": "max_tokens"}),
        AIMessage("b", response_metadata={"stop_reason": "end_turn"}),
    )
    ollama = scripted(
        AIMessage("c", response_metadata={"done_reason": "length"}),
        AIMessage("d", response_metadata={"done_reason": "stop"}),
    )
    assert FinishReasonHandler(anthropic).invoke("q").content == "ab"
    assert FinishReasonHandler(ollama).invoke("q").content == "cd"


def test_tool_call_answers_are_never_continued() -> None:
    call = AIMessage(
        "",
        tool_calls=[{"name": "lookup", "args": {"table": "ar"}, "id": "call-1"}],
        response_metadata={"finish_reason": "length"},
    )
    model = scripted(call, done("unused"))
    answer = FinishReasonHandler(model).invoke("look it up")
    assert answer.tool_calls == call.tool_calls
    assert mark(answer) == {"continuations": 0, "truncated": True}
    assert len(model.prompts) == 1


def test_chinese_continue_prompt() -> None:
    model = scripted(cut("应收账款表"), done("有三列。"))
    answer = FinishReasonHandler(model, language="zh").invoke("描述应收账款表")
    assert answer.content == "应收账款表有三列。"
    assert model.prompts[1][-1] == HumanMessage(PROMPTS["zh"].continue_prompt)
    custom = scripted(cut("x"), done("y"))
    FinishReasonHandler(custom, continue_prompt="go on").invoke("q")
    assert custom.prompts[1][-1] == HumanMessage("go on")


def test_accepts_every_chat_model_input_form() -> None:
    prompt = ChatPromptTemplate.from_messages([("system", "sys"), ("human", "{q}")])
    forms: list[Any] = [
        "plain string",
        [("system", "sys"), ("human", "tuples")],
        [HumanMessage("messages")],
        prompt.invoke({"q": "prompt value"}),
    ]
    for form in forms:
        model = scripted(cut("x"), done("y"))
        assert FinishReasonHandler(model).invoke(form).content == "xy"
        assert isinstance(model.prompts[0][-1], HumanMessage)
        assert model.prompts[0] == model.prompts[1][: len(model.prompts[0])]


# -- streaming ---------------------------------------------------------------------


def test_stream_yields_every_part_and_sums_to_the_stitched_answer() -> None:
    model = scripted(cut("The AR table"), cut(" has three"), done(" columns."))
    handler = FinishReasonHandler(model)
    chunks: list[AIMessageChunk] = []
    calls_at_first_chunk = None
    for chunk in handler.stream("Describe the AR table"):
        if calls_at_first_chunk is None:
            calls_at_first_chunk = len(model.prompts)
        assert isinstance(chunk, AIMessageChunk)
        chunks.append(chunk)
    assert calls_at_first_chunk == 1  # streamed as it came, not after all parts
    assert len(chunks) > 3
    answer = total(chunks)
    assert answer.content == "The AR table has three columns."
    # Summing chunks concatenates metadata strings: no "lengthlengthstop", no "fake-1fake-1".
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.response_metadata["model_name"] == "fake-1"
    assert mark(answer) == {"continuations": 2, "truncated": False}
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 3 * USAGE["output_tokens"]
    assert chunks[-1].content == "" and MARK_KEY in chunks[-1].response_metadata
    assert all(MARK_KEY not in c.response_metadata for c in chunks[:-1])
    assert model.prompts[2][-2] == AIMessage("The AR table has three")


async def test_astream_yields_every_part_and_sums_to_the_stitched_answer() -> None:
    model = scripted(cut("first half"), done(" second half"))
    chunks = [chunk async for chunk in FinishReasonHandler(model).astream("q")]
    answer = total(chunks)
    assert answer.content == "first half second half"
    assert answer.response_metadata["finish_reason"] == "stop"
    assert mark(answer) == {"continuations": 1, "truncated": False}


def test_stream_still_truncated_after_the_budget() -> None:
    model = scripted(*(cut(f"p{i} ") for i in range(5)))
    chunks = list(FinishReasonHandler(model, max_continuations=1).stream("q"))
    answer = total(chunks)
    assert answer.content == "p0 p1 "
    assert answer.response_metadata["finish_reason"] == "length"
    assert mark(answer) == {"continuations": 1, "truncated": True}


def test_an_error_mid_stream_propagates() -> None:
    model = scripted(done("one two three four"), fail_after=2)
    handler = FinishReasonHandler(model)
    received: list[AIMessageChunk] = []
    with pytest.raises(ConnectionError, match="mid-stream"):
        for chunk in handler.stream("q"):
            received.append(chunk)
    assert "".join(c.text for c in received) == "one "


def test_streams_inside_an_lcel_sequence() -> None:
    model = scripted(cut("a b"), done(" c d"))
    chain = ChatPromptTemplate.from_messages([("human", "{q}")]) | FinishReasonHandler(model)
    chunks = list(chain.stream({"q": "letters"}))
    assert len(chunks) > 2
    assert total(chunks).content == "a b c d"
    assert model.prompts[0] == [HumanMessage("letters")]


def test_stream_of_a_model_that_does_not_stream_sums_to_invoke() -> None:
    # disable_streaming=True: BaseChatModel.stream falls back to invoke, one whole AIMessage.
    invoked, streamed = invoke_and_stream(
        lambda: scripted(cut("one"), done(" two"), disable_streaming=True)
    )
    assert streamed.content == invoked.content == "one two"
    assert streamed.usage_metadata == invoked.usage_metadata
    assert streamed.usage_metadata is not None
    assert streamed.usage_metadata["output_tokens"] == 2 * USAGE["output_tokens"]
    assert streamed.response_metadata == invoked.response_metadata


@pytest.mark.parametrize("finish", ["tool_calls", "length"])
def test_stream_keeps_the_tool_call_of_a_model_that_does_not_stream_tools(finish: str) -> None:
    # ChatOpenAI(disable_streaming="tool_calling") and the like: with tools bound, stream()
    # falls back to invoke() and yields one whole AIMessage.
    call = AIMessage(
        "",
        tool_calls=[{"name": "lookup", "args": {"table": "ar"}, "id": "call-1"}],
        response_metadata={"finish_reason": finish},
        usage_metadata=USAGE,
        id="chatcmpl-1",
    )
    model = scripted(call, done("unused"), disable_streaming="tool_calling")
    answer = total(list(FinishReasonHandler(model).bind_tools([lookup]).stream("look it up")))
    assert answer.tool_calls == call.tool_calls
    assert answer.usage_metadata == USAGE
    assert answer.id == "chatcmpl-1"
    # A tool call is never continued, not even one the limit cut.
    assert len(model.prompts) == 1
    assert mark(answer) == {"continuations": 0, "truncated": finish == "length"}


def anthropic_reply(thinking: str, signature: str, text: str, stop: str) -> list[AIMessageChunk]:
    """A reply streamed as langchain-anthropic streams it: every block delta carries its index."""
    meta = {"model_provider": "anthropic"}
    return [
        AIMessageChunk(
            [{"type": "thinking", "thinking": thinking, "index": 0}], response_metadata=meta
        ),
        AIMessageChunk(
            [{"type": "thinking", "thinking": "", "signature": signature, "index": 0}],
            response_metadata=meta,
        ),
        AIMessageChunk([{"type": "text", "text": text, "index": 1}], response_metadata=meta),
        AIMessageChunk(
            [],
            response_metadata={**meta, "stop_reason": stop, "stop_sequence": None},
            chunk_position="last",
        ),
    ]


def test_each_part_keeps_its_own_thinking_block_and_signature() -> None:
    invoked, streamed = invoke_and_stream(
        lambda: ChunkedChatModel(
            replies=[
                anthropic_reply("plan A", "SIG_A", "The AR table has", "max_tokens"),
                anthropic_reply("plan B", "SIG_B", " three columns.", "end_turn"),
            ]
        )
    )
    for answer in (invoked, streamed):
        assert answer.text == "The AR table has three columns."
        thinking = [
            (block["thinking"], block["signature"])
            for block in answer.content
            if isinstance(block, dict) and block["type"] == "thinking"
        ]
        # Anthropic rejects a thinking block sent back with another signature ("SIG_ASIG_B").
        assert thinking == [("plan A", "SIG_A"), ("plan B", "SIG_B")]
    assert streamed.content == invoked.content


def deepseek_reply(reasoning: str, text: str, **metadata: Any) -> list[AIMessageChunk]:
    """A reply streamed as langchain-deepseek streams it: the reasoning in additional_kwargs."""
    return [
        AIMessageChunk("", additional_kwargs={"reasoning_content": reasoning}),
        AIMessageChunk(text),
        AIMessageChunk(
            "",
            response_metadata={"model_name": "deepseek-reasoner", **metadata},
            chunk_position="last",
        ),
    ]


def test_stream_and_invoke_keep_every_parts_reasoning_and_the_last_parts_metadata() -> None:
    invoked, streamed = invoke_and_stream(
        lambda: ChunkedChatModel(
            replies=[
                deepseek_reply(
                    "Tables first. ",
                    "The AR table has",
                    finish_reason="length",
                    system_fingerprint="fp_1",
                ),
                deepseek_reply(
                    "Then columns.",
                    " three columns.",
                    finish_reason="stop",
                    system_fingerprint="fp_2",
                ),
            ]
        )
    )
    for answer in (invoked, streamed):
        assert answer.content == "The AR table has three columns."
        assert answer.additional_kwargs == {"reasoning_content": "Tables first. Then columns."}
        assert answer.response_metadata == {
            "model_name": "deepseek-reasoner",
            "finish_reason": "stop",
            "system_fingerprint": "fp_2",  # the last part's, as its finish reason
            MARK_KEY: {"continuations": 1, "truncated": False},
        }


# -- pass-through ------------------------------------------------------------------


@tool
def lookup(table: str) -> str:
    """Look a table up."""
    return table


def test_bind_tools_and_call_kwargs_reach_every_call() -> None:
    model = scripted(cut("x"), done("y"))
    handler = FinishReasonHandler(model, max_continuations=5).bind_tools([lookup])
    assert isinstance(handler, FinishReasonHandler)
    assert handler.max_continuations == 5
    answer = handler.invoke("q", stop=["END"])
    assert answer.content == "xy"
    assert len(model.calls) == 2
    for call in model.calls:
        assert [t["function"]["name"] for t in call["tools"]] == ["lookup"]
        assert call["stop"] == ["END"]
    bound = scripted(cut("x"), done("y"))
    list(FinishReasonHandler(bound).bind(stop=["Z"]).stream("q"))
    assert [call["stop"] for call in bound.calls] == [["Z"], ["Z"]]


def test_bind_tools_on_a_runnable_without_it_is_a_clear_error() -> None:
    handler = FinishReasonHandler(RunnableLambda(lambda _: AIMessage("x")))
    with pytest.raises(NotImplementedError, match="bind_tools"):
        handler.bind_tools([lookup])
    with pytest.raises(NotImplementedError, match="with_structured_output on the model"):
        handler.with_structured_output(dict)


class Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.chains: list[str] = []
        self.model_calls = 0
        self.tags: list[list[str]] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.chains.append(kwargs.get("name") or "")

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.model_calls += 1
        self.tags.append(list(kwargs.get("tags") or []))


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_with_config_reaches_the_handler_run_and_every_model_call(mode: str) -> None:
    runs = Runs()
    handler = FinishReasonHandler(scripted(cut("x"), done("y"))).with_config(
        run_name="answer", callbacks=[runs], tags=["tiered"]
    )
    if mode == "invoke":
        handler.invoke("q")
    else:
        list(handler.stream("q"))
    assert runs.chains == ["answer"]
    assert runs.model_calls == 2
    assert all("tiered" in tags for tags in runs.tags)


def test_the_mark_survives_message_to_dict() -> None:
    answer = FinishReasonHandler(scripted(cut("a"), cut("b")), max_continuations=1).invoke("q")
    (restored,) = messages_from_dict([message_to_dict(answer)])
    assert restored.content == "ab"
    assert mark(restored) == {"continuations": 1, "truncated": True}


def test_bad_arguments_are_typed_errors() -> None:
    model = scripted()
    with pytest.raises(TypeError, match="llm must be"):
        FinishReasonHandler("gpt-4o")  # type: ignore[arg-type]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_continuations"):
            FinishReasonHandler(model, max_continuations=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="language"):
        FinishReasonHandler(model, language="fr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="continue_prompt"):
        FinishReasonHandler(model, continue_prompt="  ")
