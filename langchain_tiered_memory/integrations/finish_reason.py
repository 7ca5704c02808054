"""``FinishReasonHandler``: answers cut by the token limit are continued and stitched.

A model that runs into its output limit stops mid-sentence and says so in its
response metadata, each provider in its own words. langchain-core 1.x does not
normalise that signal: the provider's raw ``finish_reason`` / ``stop_reason`` is
passed through in ``response_metadata`` (with ``generation_info`` merged in), so
this module reads every known spelling:

======================  ==========================================  ===================
provider                key in ``response_metadata``                truncated value
======================  ==========================================  ===================
OpenAI, Mistral, Groq   ``finish_reason``                           ``"length"``
OpenAI Responses API    ``incomplete_details["reason"]``            ``"max_output_tokens"``
Anthropic               ``stop_reason``                             ``"max_tokens"``
Bedrock Converse        ``stopReason``                              ``"max_tokens"``
Google (Gemini/Vertex)  ``finish_reason`` (a str or an enum)        ``"MAX_TOKENS"``
Ollama                  ``done_reason``                             ``"length"``
======================  ==========================================  ===================

The handler asks the model to go on where it stopped, up to ``max_continuations``
times, and returns one message. The final message records what happened under
``response_metadata["tiered_memory"]``: ``{"continuations": n, "truncated": bool}``.
``response_metadata`` survives ``message_to_dict``, so the archive keeps the mark.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from functools import reduce
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
from langchain_core.messages.ai import add_usage
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig

from langchain_tiered_memory.core import steps
from langchain_tiered_memory.core.prompts import prompts_for
from langchain_tiered_memory.core.steps import Emit, StepPlan, arun, arun_stream, run, run_stream

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForChainRun,
        CallbackManagerForChainRun,
    )

#: The ``response_metadata`` key of the mark left on every answer.
MARK_KEY = "tiered_memory"

#: Where providers put their finish reason in ``response_metadata``.
FINISH_KEYS = ("finish_reason", "stop_reason", "done_reason", "stopReason", "finishReason")
#: Values (lower-cased) that mean "stopped at the output-token limit".
TRUNCATED_REASONS = frozenset({"length", "max_tokens", "max_output_tokens"})
# The OpenAI Responses API reports the limit here instead.
_INCOMPLETE_KEYS = ("status", "incomplete_details")


def _reason_text(value: Any) -> str | None:
    """A finish reason as text; enums (Gemini's ``FinishReason.MAX_TOKENS``) by name."""
    if value is None or value == "":
        return None
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def finish_reason(message: BaseMessage) -> str | None:
    """The provider's reason for ending ``message``, as text, if it gave one.

    Args:
        message: A chat model's answer (or an aggregated stream of chunks).

    Returns:
        The raw value (``"length"``, ``"max_tokens"``, ``"MAX_TOKENS"``,
        ``"stop"``...) of the first known key present, ``None`` if there is none.
    """
    metadata = message.response_metadata or {}
    for key in FINISH_KEYS:
        reason = _reason_text(metadata.get(key))
        if reason is not None:
            return reason
    details = metadata.get("incomplete_details")
    if isinstance(details, dict):
        return _reason_text(details.get("reason"))
    return None


def is_truncated(message: BaseMessage) -> bool:
    """Whether the provider says ``message`` was cut by its output-token limit."""
    reason = finish_reason(message)
    return reason is not None and reason.lower() in TRUNCATED_REASONS


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
    if isinstance(value, AIMessageChunk):
        return value
    if isinstance(value, BaseMessage):
        return AIMessageChunk(content=value.content, response_metadata=value.response_metadata)
    return AIMessageChunk(content=str(value))


def _blocks(content: str | list[Any]) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _join_content(contents: Sequence[str | list[Any]]) -> str | list[Any]:
    if all(isinstance(content, str) for content in contents):
        return "".join(contents)  # type: ignore[arg-type]
    return [block for content in contents for block in _blocks(content)]


def _finish_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if k in FINISH_KEYS or k in _INCOMPLETE_KEYS}


def _mark(continuations: int, truncated: bool) -> dict[str, Any]:
    return {MARK_KEY: {"continuations": continuations, "truncated": truncated}}


def stitch(parts: Sequence[AIMessage]) -> AIMessage:
    """Join an answer and its continuations into one marked ``AIMessage``.

    Content is concatenated; usage is summed; the finish reason, tool calls and
    other response metadata are the last part's; id, name and
    ``additional_kwargs`` are the first part's.
    """
    if not parts:
        msg = "stitch needs at least one part"
        raise ValueError(msg)
    first, last = parts[0], parts[-1]
    mark = _mark(len(parts) - 1, is_truncated(last))
    if len(parts) == 1:
        return first.model_copy(update={"response_metadata": {**first.response_metadata, **mark}})
    usages = [part.usage_metadata for part in parts if part.usage_metadata]
    return AIMessage(
        content=_join_content([part.content for part in parts]),
        id=first.id,
        name=first.name,
        additional_kwargs=dict(first.additional_kwargs),
        response_metadata={**last.response_metadata, **mark},
        tool_calls=list(last.tool_calls),
        invalid_tool_calls=list(last.invalid_tool_calls),
        usage_metadata=reduce(add_usage, usages) if usages else None,
    )


class _StreamParts:
    """Rewrites the chunks of successive parts so that their sum is the stitched answer.

    ``AIMessageChunk`` addition concatenates string metadata, so a ``"length"`` of
    one part and a ``"stop"`` of the next would add up to ``"lengthstop"``, and a
    model name would appear twice. Finish fields are therefore held back and sent
    once, with the mark, in a final empty chunk; later parts do not repeat the
    metadata keys an earlier part already sent.
    """

    def __init__(self) -> None:
        self.sent_keys: set[str] = set()
        self.part_keys: set[str] = set()
        self.current: AIMessageChunk | None = None
        self.continuations = 0

    def start_part(self) -> None:
        self.sent_keys |= self.part_keys
        self.part_keys = set()
        self.current = None

    def outgoing(self, chunk: AIMessageChunk) -> AIMessageChunk:
        self.current = chunk if self.current is None else self.current + chunk
        metadata = {
            key: value
            for key, value in chunk.response_metadata.items()
            if key not in FINISH_KEYS and key not in _INCOMPLETE_KEYS and key not in self.sent_keys
        }
        self.part_keys |= metadata.keys()
        return chunk.model_copy(update={"response_metadata": metadata, "chunk_position": None})

    def part(self) -> AIMessage:
        return as_ai(self.current) if self.current is not None else AIMessage("")

    def final(self) -> AIMessageChunk:
        last = self.part()
        return AIMessageChunk(
            content="",
            response_metadata={
                **_finish_metadata(last.response_metadata),
                **_mark(self.continuations, is_truncated(last)),
            },
            chunk_position="last",
        )


class FinishReasonHandler(Runnable[LanguageModelInput, AIMessage]):
    """Continues answers cut by the output-token limit and stitches the parts.

    A Runnable over chat-model input (a message list, a ``PromptValue`` or a
    string) with ``invoke``, ``ainvoke``, ``stream`` and ``astream``. When an
    answer comes back truncated (see :func:`is_truncated`), the handler sends the
    conversation again with the partial answer and a request to continue, up to
    ``max_continuations`` times. Streaming yields every part's chunks as they
    arrive; their sum is the stitched answer.

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
        state = _StreamParts()
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
            state.continuations += 1
            prompt = self._continuation(messages, self._text(parts))
        if streaming:
            yield Emit(state.final())
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
        """Stream every part's chunks; the last chunk carries the finish reason and mark."""
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
