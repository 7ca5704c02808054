"""``FinishReasonHandler``: answers cut by the token limit are continued and stitched.

A model that runs into its output limit stops mid-sentence and says so in its
response metadata, each provider in its own words (see
:mod:`~langchain_tiered_memory.core.finish`, which reads every known spelling).

The handler asks the model to go on where it stopped, up to ``max_continuations``
times, and returns one message. The final message records what happened under
``response_metadata["tiered_memory"]``: ``{"continuations": n, "truncated": bool}``.
``response_metadata`` survives ``message_to_dict``, so the archive keeps the mark.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    convert_to_messages,
    message_chunk_to_message,
)
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig

from langchain_tiered_memory.core import steps
from langchain_tiered_memory.core.finish import is_truncated
from langchain_tiered_memory.core.prompts import prompts_for
from langchain_tiered_memory.core.steps import Emit, StepPlan, arun, arun_stream, run, run_stream

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForChainRun,
        CallbackManagerForChainRun,
    )

#: The ``response_metadata`` key of the mark left on every answer.
MARK_KEY = "tiered_memory"


def _as_messages(value: Any) -> list[BaseMessage]:
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return [HumanMessage(value)]
    if isinstance(value, BaseMessage):
        return [value]
    return convert_to_messages(value)


def as_ai(value: Any) -> AIMessage:
    """``value`` as a complete ``AIMessage``.

    A chunk (or a sum of chunks) becomes a message; another message keeps its
    content and response metadata; anything else is its ``str``.
    """
    if isinstance(value, AIMessageChunk):
        value = message_chunk_to_message(value)
    if isinstance(value, AIMessage):
        return value
    if isinstance(value, BaseMessage):
        return AIMessage(content=value.content, response_metadata=value.response_metadata)
    return AIMessage(content=str(value))


def _as_chunk(value: Any) -> AIMessageChunk:
    """``value`` as an ``AIMessageChunk`` that keeps every field of the message.

    A model that does not stream (``disable_streaming``, no ``_stream``, a
    ``RunnableLambda``) yields one whole ``AIMessage`` from ``stream``; its tool
    calls, usage, id and ``additional_kwargs`` must survive, or a tool call would
    vanish from the stream and a cut one would be continued.
    """
    if isinstance(value, AIMessageChunk):
        return value
    # The chunk's validator turns ``tool_calls`` into ``tool_call_chunks``, so a
    # sum of chunks parses them back.
    return AIMessageChunk(**as_ai(value).model_dump(exclude={"type"}))


def _mark(continuations: int, truncated: bool) -> dict[str, Any]:
    return {MARK_KEY: {"continuations": continuations, "truncated": truncated}}


#: ``response_metadata`` keys sent with every chunk: chunk addition keeps one of two
#: equal values of these, and a chunk's ``content_blocks`` reads them.
_LIVE_KEYS = ("model_provider", "output_version")


def _moved(index: Any, offset: int, part: int) -> Any:
    """A block ``index`` of the ``part``-th part (from 0), moved past earlier parts' indexes.

    ``merge_lists`` merges list items whose ``index`` is equal and an int or an
    ``"lc_"`` string; ints are shifted by ``offset``, ``"lc_"`` strings (OpenAI
    Responses in v1) get the part's number.
    """
    if isinstance(index, int) and not isinstance(index, bool):
        return index + offset
    if part and isinstance(index, str) and index.startswith("lc_"):
        return f"{index}_{part}"
    return index


def _renumbered(chunk: AIMessageChunk, offset: int, part: int) -> AIMessageChunk:
    """``chunk`` with the indexes of its content blocks and tool-call chunks moved.

    Every part numbers its blocks from 0, and ``AIMessageChunk`` addition merges
    blocks with the same index: a continuation's thinking block would be merged
    into the first part's, their signatures concatenated.
    """
    if part == 0:
        return chunk
    content = chunk.content
    if isinstance(content, list):
        content = [
            {**block, "index": _moved(block["index"], offset, part)}
            if isinstance(block, dict) and "index" in block
            else block
            for block in content
        ]
    tool_call_chunks = [
        {**tc, "index": _moved(tc["index"], offset, part)} if tc.get("index") is not None else tc
        for tc in chunk.tool_call_chunks
    ]
    return chunk.model_copy(update={"content": content, "tool_call_chunks": tool_call_chunks})


def _top_index(chunk: AIMessageChunk) -> int:
    """The largest int ``index`` of ``chunk``'s content blocks and tool-call chunks; -1 if none."""
    blocks = chunk.content if isinstance(chunk.content, list) else []
    indexes = [block.get("index") for block in blocks if isinstance(block, dict)]
    indexes += [tc.get("index") for tc in chunk.tool_call_chunks]
    return max(
        (i for i in indexes if isinstance(i, int) and not isinstance(i, bool)),
        default=-1,
    )


class _Parts:
    """Rewrites the chunks of successive parts so that their sum is the stitched answer.

    The one place where parts are joined: streaming sends every chunk through
    :meth:`outgoing` and ends with :meth:`final`; :func:`stitch` does the same with
    each whole part and adds the results up, so the sum of a stream and the answer
    of ``invoke`` follow the same rules:

    * content, ``additional_kwargs``, usage and id add up as ``AIMessageChunk``
      addition adds them, each later part's block indexes moved past the earlier
      parts' (:func:`_renumbered`) so that no block of one part merges into
      another's;
    * ``response_metadata`` is the last part's, as it describes the final finish:
      addition would concatenate a ``"length"`` and a ``"stop"`` into
      ``"lengthstop"``, so chunks carry only the :data:`_LIVE_KEYS` and the final
      chunk brings the last part's metadata with the mark.
    """

    def __init__(self) -> None:
        self.number = -1  # of the current part, from 0
        self.offset = 0  # added to the current part's int indexes
        self.next_offset = 0  # one past the largest int index sent so far
        self.current: AIMessageChunk | None = None

    def start_part(self) -> None:
        self.number += 1
        self.offset = self.next_offset
        self.current = None

    def outgoing(self, chunk: AIMessageChunk) -> AIMessageChunk:
        self.current = chunk if self.current is None else self.current + chunk
        chunk = _renumbered(chunk, self.offset, self.number)
        self.next_offset = max(self.next_offset, _top_index(chunk) + 1)
        metadata = {k: v for k, v in chunk.response_metadata.items() if k in _LIVE_KEYS}
        # The final chunk is the stream's last, not each part's.
        return chunk.model_copy(update={"response_metadata": metadata, "chunk_position": None})

    def part(self) -> AIMessage:
        """The current part as the model gave it (indexes and metadata untouched)."""
        return as_ai(self.current) if self.current is not None else AIMessage("")

    def final(self) -> AIMessageChunk:
        last = self.part()
        return AIMessageChunk(
            # As BaseChatModel.stream ends: an empty content of the answer's kind.
            content=[] if isinstance(last.content, list) else "",
            response_metadata={
                **last.response_metadata,
                **_mark(self.number, is_truncated(last)),
            },
            chunk_position="last",
        )


def stitch(parts: Sequence[AIMessage]) -> AIMessage:
    """Join an answer and its continuations into one marked ``AIMessage``.

    The parts are joined as a stream of them adds up (see :class:`_Parts`):
    content, ``additional_kwargs`` and usage add up as ``AIMessageChunk`` addition
    adds them, with each later part's block indexes moved past the earlier ones';
    the id is the one addition picks (the first provider-assigned one); response
    metadata, tool calls and invalid tool calls are the last part's; ``name`` is
    the first part's.

    Raises:
        ValueError: If ``parts`` is empty.
    """
    if not parts:
        msg = "stitch needs at least one part"
        raise ValueError(msg)
    first, last = parts[0], parts[-1]
    if len(parts) == 1:  # what the rules give for one part, without a round trip
        mark = _mark(0, is_truncated(first))
        return first.model_copy(update={"response_metadata": {**first.response_metadata, **mark}})
    joiner = _Parts()
    chunks = []
    for part in parts:
        joiner.start_part()
        chunks.append(joiner.outgoing(_as_chunk(part)))
    stitched = as_ai(add_ai_message_chunks(*chunks, joiner.final()))
    # Addition drops ``name`` and parses tool calls back from their JSON text (a
    # cut invalid call could come back valid); the parts' own are exact.
    return stitched.model_copy(
        update={
            "name": first.name,
            "tool_calls": list(last.tool_calls),
            "invalid_tool_calls": list(last.invalid_tool_calls),
        }
    )


class FinishReasonHandler(Runnable[LanguageModelInput, AIMessage]):
    """Continues answers cut by the output-token limit and stitches the parts.

    A Runnable over chat-model input (a message list, a ``PromptValue`` or a
    string) with ``invoke``, ``ainvoke``, ``stream`` and ``astream``. When an
    answer comes back truncated (see :func:`is_truncated`), the handler sends the
    conversation again with the partial answer and a request to continue, up to
    ``max_continuations`` times. Streaming yields every part's chunks as they
    arrive; their sum is the stitched answer that ``invoke`` returns (see
    :func:`stitch`), the response metadata coming in the last chunk. A model that
    does not stream (``disable_streaming``) yields whole answers, tool calls kept.

    Every answer carries ``response_metadata["tiered_memory"] =
    {"continuations": n, "truncated": bool}``: ``truncated`` is ``True`` when the
    last part was still cut (the budget of continuations ran out, or the answer was
    a tool call, which is never continued because a half-written call cannot be
    resumed).

    Pass-through: call arguments (``handler.bind(stop=[...])``, ``invoke(...,
    stop=[...])``) and the config (``with_config``, callbacks, tags) reach every
    call of the model; :meth:`bind_tools` binds the tools on the wrapped model and
    returns a new handler. ``with_structured_output`` is not supported: call it on
    the model itself.

    Args:
        llm: The chat model (or any Runnable from chat input to a message, such as
            ``model.bind_tools(...)``).
        max_continuations: How many times to ask for more; ``0`` only marks.
        continue_prompt: The request to continue; default the ``language``'s
            ``Prompts.continue_prompt``.
        language: ``"en"`` or ``"zh"`` for the default continue prompt.

    Example:
        .. code-block:: python

            llm = FinishReasonHandler(ChatOpenAI(model="gpt-4o-mini", max_tokens=256))
            answer = llm.invoke("Write a long report on receivables")
            answer.response_metadata["tiered_memory"]  # {"continuations": 2, "truncated": False}
    """

    def __init__(
        self,
        llm: Runnable[Any, Any],
        *,
        max_continuations: int = 3,
        continue_prompt: str | None = None,
        language: Literal["en", "zh"] = "en",
    ) -> None:
        if not isinstance(llm, Runnable):
            msg = f"llm must be a chat model or another Runnable, got {type(llm).__name__}"
            raise TypeError(msg)
        if (
            isinstance(max_continuations, bool)
            or not isinstance(max_continuations, int)
            or max_continuations < 0
        ):
            msg = f"max_continuations must be an int >= 0, got {max_continuations!r}"
            raise ValueError(msg)
        default_prompt = prompts_for(language).continue_prompt
        if continue_prompt is not None and (
            not isinstance(continue_prompt, str) or not continue_prompt.strip()
        ):
            msg = "continue_prompt must be a non-empty str or None"
            raise ValueError(msg)
        self.llm = llm
        self.max_continuations = max_continuations
        self.language = language
        self.continue_prompt = continue_prompt or default_prompt

    def __repr__(self) -> str:
        return f"FinishReasonHandler(llm={self.llm!r}, max_continuations={self.max_continuations})"

    def _copy(self, llm: Runnable[Any, Any]) -> FinishReasonHandler:
        return FinishReasonHandler(
            llm,
            max_continuations=self.max_continuations,
            continue_prompt=self.continue_prompt,
            language=self.language,
        )

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FinishReasonHandler:
        """A handler around ``llm.bind_tools(tools, **kwargs)``.

        Answers that are tool calls are marked but never continued.

        Raises:
            NotImplementedError: If the wrapped model cannot bind tools.
        """
        bind = getattr(self.llm, "bind_tools", None)
        if bind is None:
            msg = f"{type(self.llm).__name__} has no bind_tools"
            raise NotImplementedError(msg)
        return self._copy(bind(tools, **kwargs))

    def with_structured_output(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: a structured answer cut mid-object cannot be continued.

        Raises:
            NotImplementedError: Always; call it on the wrapped model instead.
        """
        msg = (
            "FinishReasonHandler does not wrap structured output (a JSON object cut by the "
            "token limit cannot be continued); call with_structured_output on the model"
        )
        raise NotImplementedError(msg)

    # -- the loop ---------------------------------------------------------------

    def _should_continue(self, part: AIMessage, continuations: int) -> bool:
        return (
            continuations < self.max_continuations
            and is_truncated(part)
            and not part.tool_calls
            and not part.invalid_tool_calls
        )

    def _continuation(self, messages: list[BaseMessage], so_far: str) -> list[BaseMessage]:
        # The whole partial answer as one AI turn, then the request: every chat
        # provider accepts this shape (an assistant prefill is not universal).
        return [*messages, AIMessage(so_far), HumanMessage(self.continue_prompt)]

    @staticmethod
    def _text(parts: Sequence[AIMessage]) -> str:
        return "".join(part.text for part in parts)

    def _plan(
        self, messages: list[BaseMessage], config: RunnableConfig, streaming: bool, **kwargs: Any
    ) -> StepPlan[AIMessage]:
        """Ask, then ask to continue while the answer is cut; relay chunks when streaming."""
        state = _Parts()
        parts: list[AIMessage] = []
        prompt = messages
        while True:
            if streaming:
                state.start_part()
                yield steps.stream(
                    self.llm,
                    prompt,
                    config,
                    lambda chunk: state.outgoing(_as_chunk(chunk)),
                    **kwargs,
                )
                parts.append(state.part())
            else:
                parts.append(as_ai((yield steps.invoke(self.llm, prompt, config, **kwargs))))
            if not self._should_continue(parts[-1], len(parts) - 1):
                break
            prompt = self._continuation(messages, self._text(parts))
        if streaming:
            yield Emit(state.final())
            return parts[-1]  # unused: a stream's answer is the sum of its chunks
        return stitch(parts)

    # The helpers below take ``run_manager`` to match langchain-core's typed
    # signatures; the run's callbacks reach the model through ``config``.

    def _invoke(
        self,
        input: LanguageModelInput,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> AIMessage:
        return run(self._plan(_as_messages(input), config, False, **kwargs))

    async def _ainvoke(
        self,
        input: LanguageModelInput,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> AIMessage:
        return await arun(self._plan(_as_messages(input), config, False, **kwargs))

    def _stream(
        self,
        inputs: Iterator[LanguageModelInput],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        messages = _as_messages(next(iter(inputs)))
        yield from run_stream(self._plan(messages, config, True, **kwargs))

    async def _astream(
        self,
        inputs: AsyncIterator[LanguageModelInput],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        messages = _as_messages(await anext(aiter(inputs)))
        async for chunk in arun_stream(self._plan(messages, config, True, **kwargs)):
            yield chunk

    # -- Runnable ---------------------------------------------------------------

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        """Call the model, continuing a truncated answer; returns the stitched answer."""
        return self._call_with_config(self._invoke, input, config, **kwargs)

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        """Async :meth:`invoke` (the model's own async path)."""
        return await self._acall_with_config(self._ainvoke, input, config, **kwargs)

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        """Stream every part's chunks; the last brings the last part's metadata and the mark."""
        chunks = self._transform_stream_with_config(iter([input]), self._stream, config, **kwargs)
        # langchain-core types the helper's output by the class's (AIMessage);
        # it yields what ``_stream`` yields: chunks.
        yield from cast("Iterator[AIMessageChunk]", chunks)

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        """Async :meth:`stream` (the model's own ``astream``)."""

        async def single() -> AsyncIterator[LanguageModelInput]:
            yield input

        chunks = self._atransform_stream_with_config(single(), self._astream, config, **kwargs)
        # As in :meth:`stream`: the helper yields what ``_astream`` yields.
        async for chunk in cast("AsyncIterator[AIMessageChunk]", chunks):
            yield chunk
