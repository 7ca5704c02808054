"""``create_tiered_chain``: the v3 design's whole chat pipeline as one Runnable.

Per call::

    input ──► long-term memories (scoped search) + MEMORY.md + window + knowledge docs
          ──► v3 prompt ──► ContextCompressor (if over budget)
          ──► LLM (FinishReasonHandler) ──► answer (or stream)
          ──► the turn is archived; extraction and consolidation are queued

The prompt follows the v3 layout (long-term memories, recent conversation,
knowledge base, question), as chat messages so that the compressor can summarise
old turns and never splits a tool call from its result:

* a system message: the system prompt, then the long-term memories (MEMORY.md and
  the memories retrieved for the question), then a line announcing the recent
  conversation;
* the window's messages, oldest first;
* a human message: the knowledge-base documents, then the question (just the
  question when there are no documents, like the archived questions in the window).

Empty sections are left out.
"""

from __future__ import annotations

import logging
import operator
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack, cast

from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config

from langchain_tiered_memory.core import steps
from langchain_tiered_memory.core.prompts import Prompts, memory_line, prompts_for
from langchain_tiered_memory.core.steps import (
    Call,
    Emit,
    Gather,
    StepPlan,
    arun,
    arun_stream,
    run,
    run_stream,
)
from langchain_tiered_memory.core.turns import call_id_of, name_calls, tool_calls_of
from langchain_tiered_memory.core.validation import check_int, validate_messages
from langchain_tiered_memory.integrations.finish_reason import FinishReasonHandler, as_ai
from langchain_tiered_memory.integrations.knowledge import KnowledgeBase
from langchain_tiered_memory.memory.history import TieredChatMessageHistory, resolve_backup
from langchain_tiered_memory.storage.archive import SessionOwnershipError
from langchain_tiered_memory.storage.base import Archive
from langchain_tiered_memory.tiers.compression import ContextCompressor

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForChainRun,
        CallbackManagerForChainRun,
    )

    from langchain_tiered_memory.text.tokens import TokenCounter
    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

logger = logging.getLogger(__name__)


class RetrievalFailedWarning(RuntimeWarning):
    """A context tier failed and the chain answered without it.

    The tiers are the long-term memory search, MEMORY.md and the knowledge base.
    """


@dataclass
class _Context:
    window: list[BaseMessage] = field(default_factory=list)
    memories: list[Document] = field(default_factory=list)
    consolidated: str = ""
    documents: list[Document] = field(default_factory=list)


def _document_block(position: int, doc: Document) -> str:
    source = doc.metadata.get("source") or doc.metadata.get("filename")
    head = f"[{position}] {source}" if source else f"[{position}]"
    return f"{head}\n{doc.page_content.strip()}"


#: The result archived for a tool call of the chain's answer: the chain runs no tools.
NOT_RUN = "[not run: create_tiered_chain runs no tools; use create_agent for tools]"


def _with_not_run(answer: AIMessage) -> list[AIMessage | ToolMessage]:
    """``answer`` and a stand-in result for each of its tool calls, as archived.

    A model bound to tools may answer with calls, which the chain does not run;
    without a result, every later prompt of the session would carry a call that
    providers refuse. A call without an id gets one, so its result can name it.
    """
    if any(call_id_of(call) is None for call in tool_calls_of(answer)):
        answer = name_calls(answer, lambda: f"call_{uuid.uuid4().hex[:24]}")
    results = [
        ToolMessage(NOT_RUN, tool_call_id=call["id"], name=call.get("name") or "tool")
        for call in tool_calls_of(answer)
    ]
    return [answer, *results]


def _as_documents(value: Any) -> list[Document]:
    """A retriever's result as documents: a document, a text, or a list of them.

    Raises:
        TypeError: For anything else (``None``, a dict): a tier failure, reported
            as any other.
    """
    if isinstance(value, Document):
        return [value]
    if isinstance(value, str):
        return [Document(page_content=value)]
    if isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
        items = list(value)  # a generator is read once
        if all(isinstance(item, Document | str) for item in items):
            return [i if isinstance(i, Document) else Document(page_content=i) for i in items]
    msg = f"it returned {type(value).__name__}, not documents"
    raise TypeError(msg)


class ChainOptions(TypedDict, total=False):
    """The keyword options of :func:`create_tiered_chain` (and :class:`TieredChain`).

    Every key is optional; the defaults are given below.

    Attributes:
        backup: The archive: a ``MySQLBackup``, a database URL, a
            ``SessionFileArchive``; ``None`` means the tiers' archive or the
            embedded default (the default).
        long_memory: The long-term tier; ``None`` (default) for none.
        knowledge: Any ``BaseRetriever`` (or a ``KnowledgeBase``) whose documents
            go into the prompt; ``None`` (default) for none.
        consolidator: The MEMORY.md tier; ``None`` (default) for none.
        compressor: Runs on the assembled prompt before the LLM; default
            ``ContextCompressor(language=language, token_counter=token_counter)``.
        system_prompt: Replaces the language's default instructions at the top
            of the prompt.
        language: ``"en"`` (default) or ``"zh"``: section labels, default system prompt,
            the compressor's summary and the continue prompt.
        prompts: The section labels, default system prompt, the default
            compressor's summary labels and the continue prompt (a
            :class:`~langchain_tiered_memory.core.prompts.Prompts`); default the
            ``language``'s.
        input_key: The question's key in a dict input; default ``"input"``.
        window_turns: Recent turns in the window; default 10.
        window_max_tokens: The window's token budget (``None`` for none); default 8000.
        token_counter: Counts tokens for the window and the default compressor.
        k: Long-term memories per question; default 10.
        memory_scope: ``"session"`` (default), or ``"user"`` to recall across the user's
            sessions (then ``user_id`` is required in the config).
        knowledge_k: Documents per question when ``knowledge`` is a
            ``KnowledgeBase``; default 4.
        max_continuations: Continuations of a truncated answer; default 3.
        retrieval_errors: ``"warn"`` (default): a failing long-term memory,
            MEMORY.md or knowledge base is logged, warned about
            (:class:`RetrievalFailedWarning`) and left out; ``"raise"``: the call
            fails.
    """

    backup: Archive | str | None
    long_memory: ChromaLongMemory | None
    knowledge: Runnable[str, Any] | KnowledgeBase | None
    consolidator: MemoryConsolidator | None
    compressor: Runnable[Any, list[BaseMessage]] | None
    system_prompt: str | None
    language: Literal["en", "zh"]
    prompts: Prompts
    input_key: str
    window_turns: int
    window_max_tokens: int | None
    token_counter: TokenCounter | None
    k: int
    memory_scope: Literal["session", "user"]
    knowledge_k: int
    max_continuations: int
    retrieval_errors: Literal["warn", "raise"]


class TieredChain(Runnable[Any, AIMessage]):
    """The assembled pipeline; build it with :func:`create_tiered_chain`.

    Input: ``{"input": "..."}`` (the key is ``input_key``), a plain string, or a
    ``HumanMessage``. Config: ``config["configurable"]["session_id"]`` (required)
    and ``["user_id"]`` (optional; required for ``memory_scope="user"``).
    ``invoke``/``ainvoke`` return the ``AIMessage``; ``stream``/``astream`` yield
    ``AIMessageChunk``. The turn is archived only once the answer is complete; an
    error (or a consumer that stops reading a stream early) leaves the archive as
    it was.
    """

    def __init__(self, llm: Runnable[Any, Any], **options: Unpack[ChainOptions]) -> None:
        unknown = sorted(options.keys() - ChainOptions.__optional_keys__)
        if unknown:
            msg = f"unexpected option(s) {', '.join(unknown)}; see ChainOptions"
            raise TypeError(msg)
        # The defaults documented on ChainOptions.
        backup = options.get("backup")
        long_memory = options.get("long_memory")
        knowledge = options.get("knowledge")
        consolidator = options.get("consolidator")
        compressor = options.get("compressor")
        system_prompt = options.get("system_prompt")
        language = options.get("language", "en")
        input_key = options.get("input_key", "input")
        window_turns = options.get("window_turns", 10)
        window_max_tokens = options.get("window_max_tokens", 8000)
        token_counter = options.get("token_counter")
        k = options.get("k", 10)
        memory_scope = options.get("memory_scope", "session")
        knowledge_k = options.get("knowledge_k", 4)
        max_continuations = options.get("max_continuations", 3)
        retrieval_errors = options.get("retrieval_errors", "warn")
        language_prompts = prompts_for(language)  # checks the language too
        prompts = options.get("prompts") or language_prompts
        if not isinstance(prompts, Prompts):
            msg = f"prompts must be a Prompts, got {type(prompts).__name__}"
            raise TypeError(msg)
        if memory_scope not in ("session", "user"):
            msg = f"memory_scope must be 'session' or 'user', got {memory_scope!r}"
            raise ValueError(msg)
        if retrieval_errors not in ("warn", "raise"):
            msg = f"retrieval_errors must be 'warn' or 'raise', got {retrieval_errors!r}"
            raise ValueError(msg)
        if not isinstance(input_key, str) or not input_key:
            msg = f"input_key must be a non-empty str, got {input_key!r}"
            raise ValueError(msg)
        check_int("k", k)
        check_int("knowledge_k", knowledge_k)
        if system_prompt is not None and not isinstance(system_prompt, str):
            msg = f"system_prompt must be a str or None, got {type(system_prompt).__name__}"
            raise TypeError(msg)
        if isinstance(knowledge, KnowledgeBase):
            knowledge = knowledge.as_retriever(k=knowledge_k)
        if knowledge is not None and not isinstance(knowledge, Runnable):
            msg = (
                "knowledge must be a BaseRetriever (or a KnowledgeBase, or a Runnable from "
                f"a query to documents), got {type(knowledge).__name__}"
            )
            raise TypeError(msg)
        if compressor is not None and not isinstance(compressor, Runnable):
            msg = f"compressor must be a ContextCompressor or a Runnable, got {compressor!r}"
            raise TypeError(msg)
        backup = resolve_backup(backup, long_memory, consolidator, "chain")
        if isinstance(llm, FinishReasonHandler):
            self.llm = llm
        else:
            self.llm = FinishReasonHandler(
                llm,
                max_continuations=max_continuations,
                continue_prompt=prompts.continue_prompt,
                language=language,
            )
        self.backup = backup
        self.long_memory = long_memory
        self.knowledge = knowledge
        self.consolidator = consolidator
        self.compressor = compressor or ContextCompressor(
            token_counter=token_counter, language=language, prompts=options.get("prompts")
        )
        self.language = language
        self.prompts = prompts
        self.labels = prompts.chain
        self.system_prompt = self.labels.system if system_prompt is None else system_prompt
        self.input_key = input_key
        self.window_turns = window_turns
        self.window_max_tokens = window_max_tokens
        self.token_counter = token_counter
        self.k = k
        self.memory_scope = memory_scope
        self.retrieval_errors = retrieval_errors
        # Fail now, not on the first call, on a bad window setting.
        self._history("__check__", None)

    def __repr__(self) -> str:
        return f"TieredChain(llm={self.llm!r}, backup={self.backup!r}, language={self.language!r})"

    # -- per call ---------------------------------------------------------------

    def _history(self, session_id: Any, user_id: Any) -> TieredChatMessageHistory:
        return TieredChatMessageHistory.on_tiers(
            self,
            session_id,
            user_id=user_id,
            window_turns=self.window_turns,
            window_max_tokens=self.window_max_tokens,
            token_counter=self.token_counter,
        )

    def _question(self, input: Any) -> HumanMessage:
        """The turn's human message.

        A ``HumanMessage`` input is kept as it is (its content blocks, id and
        session date are sent and archived); a text becomes one.
        """
        if isinstance(input, HumanMessage):
            validate_messages([input])
            return input
        if isinstance(input, dict):
            if self.input_key not in input:
                msg = f"the input has no {self.input_key!r} key (keys: {sorted(map(str, input))})"
                raise KeyError(msg)
            value = input[self.input_key]
        else:
            value = input
        if not isinstance(value, str):
            msg = (
                f"the question must be a str (input[{self.input_key!r}] or the input itself) "
                f"or a HumanMessage, got {type(value).__name__}"
            )
            raise TypeError(msg)
        return HumanMessage(value)

    def _start(
        self, input: Any, config: RunnableConfig
    ) -> tuple[HumanMessage, TieredChatMessageHistory]:
        question = self._question(input)
        configurable = config.get("configurable") or {}
        session_id = configurable.get("session_id")
        if session_id is None:
            msg = (
                "the tiered chain needs a session: "
                "config={'configurable': {'session_id': '...', 'user_id': '...'}}"
            )
            raise ValueError(msg)
        history = self._history(session_id, configurable.get("user_id"))
        if self.long_memory is not None and self.memory_scope == "user" and not history.user_id:
            msg = "memory_scope='user' needs config['configurable']['user_id']"
            raise ValueError(msg)
        return question, history

    def _failed(self, tier: str, exc: Exception) -> None:
        # A refused session is the caller's error, never a tier to answer without.
        if self.retrieval_errors == "raise" or isinstance(exc, SessionOwnershipError):
            raise exc
        # Logged every time (operators), and a warning (visible in development and
        # filterable by category); the answer goes on without this tier.
        logger.warning("%s failed, answering without it: %s: %s", tier, type(exc).__name__, exc)
        warnings.warn(
            f"{tier} failed, answering without it: {type(exc).__name__}: {exc}",
            RetrievalFailedWarning,
            stacklevel=2,
        )

    def _memory_retriever(self, history: TieredChatMessageHistory) -> Runnable[str, Any]:
        assert self.long_memory is not None
        return self.long_memory.as_retriever(
            session_id=history.session_id,
            user_id=history.user_id,
            scope=self.memory_scope,
            k=self.k,
        )

    def _context_plan(
        self, question: str, history: TieredChatMessageHistory, config: RunnableConfig
    ) -> StepPlan[_Context]:
        """Read the window and the tiers together (concurrently on the async path).

        A failing tier is reported by :meth:`_failed` and left out; a failing window
        read fails the call (the archive is required).
        """
        tiers: dict[str, Call[Any]] = {}
        if self.long_memory is not None:
            # ChromaLongMemory has no async search: BaseRetriever.ainvoke runs the
            # sync one in the executor.
            retriever = self._memory_retriever(history)
            tiers["long-term memory search"] = steps.invoke(retriever, question, config)
        if self.consolidator is not None:  # a sync-only database read
            tiers["MEMORY.md"] = steps.offload(lambda: history.consolidated_memory, config)
        if self.knowledge is not None:
            tiers["knowledge base retrieval"] = steps.invoke(self.knowledge, question, config)
        window_read = Call(lambda: history.messages, history.aget_messages)
        window, *results = yield Gather((window_read, *tiers.values()))
        if isinstance(window, BaseException):
            raise window
        found: dict[str, Any] = {}
        for tier, result in zip(tiers, results, strict=True):
            if isinstance(result, Exception):
                self._failed(tier, result)
            elif isinstance(result, BaseException):  # a cancellation is not a tier failure
                raise result
            else:
                try:
                    found[tier] = result if tier == "MEMORY.md" else _as_documents(result)
                except TypeError as exc:  # a retriever that returned no documents
                    self._failed(tier, exc)
        return _Context(
            window=window,
            memories=found.get("long-term memory search", []),
            consolidated=found.get("MEMORY.md", ""),
            documents=found.get("knowledge base retrieval", []),
        )

    def assemble(self, question: str | HumanMessage, context: _Context) -> list[BaseMessage]:
        """The v3 prompt for ``question`` (before compression)."""
        message = question if isinstance(question, HumanMessage) else HumanMessage(question)
        labels = self.labels
        system = [self.system_prompt] if self.system_prompt else []
        memory_md = context.consolidated.strip()
        if memory_md or context.memories:
            section = [f"## {labels.memories}"]
            if memory_md:
                section.append(f"### {labels.consolidated}\n{memory_md}")
            if context.memories:
                lines = "\n".join(memory_line(doc) for doc in context.memories)
                section.append(f"### {labels.retrieved}\n{lines}" if memory_md else lines)
            system.append("\n".join(section))
        if context.window:
            system.append(f"## {labels.recent}\n{labels.recent_note}")
        messages: list[BaseMessage] = [SystemMessage("\n\n".join(system))] if system else []
        messages.extend(context.window)
        if context.documents:
            blocks = "\n\n".join(
                _document_block(position, doc)
                for position, doc in enumerate(context.documents, start=1)
            )
            header = f"## {labels.knowledge}\n{blocks}\n\n## {labels.question}\n"
            content = message.content
            messages.append(
                message.model_copy(
                    update={
                        "content": header + content
                        if isinstance(content, str)
                        else [{"type": "text", "text": header}, *content]
                    }
                )
            )
        else:
            messages.append(message)
        return messages

    def _prepare_plan(
        self, input: Any, config: RunnableConfig
    ) -> StepPlan[tuple[HumanMessage, TieredChatMessageHistory, list[BaseMessage]]]:
        question, history = self._start(input, config)
        # The turn will be archived: refuse another user's session before any work.
        yield Call(
            lambda: history.check_owner(write=True), lambda: history.acheck_owner(write=True)
        )
        context = yield from self._context_plan(question.text, history, config)
        messages = yield steps.invoke(self.compressor, self.assemble(question, context), config)
        return question, history, messages

    def get_prompt(self, input: Any, config: RunnableConfig | None = None) -> list[BaseMessage]:
        """The messages the LLM would be sent for ``input`` now (after compression).

        Nothing is archived and the LLM is not called: for debugging and tests.
        """
        return run(self._prepare_plan(input, ensure_config(config)))[2]

    async def aget_prompt(
        self, input: Any, config: RunnableConfig | None = None
    ) -> list[BaseMessage]:
        """Async :meth:`get_prompt`."""
        return (await arun(self._prepare_plan(input, ensure_config(config))))[2]

    # -- Runnable ---------------------------------------------------------------

    def _answer_plan(
        self, input: Any, config: RunnableConfig, streaming: bool
    ) -> StepPlan[AIMessage]:
        question, history, messages = yield from self._prepare_plan(input, config)
        last = None
        if streaming:
            chunks: list[AIMessageChunk] = []

            def keep(chunk: AIMessageChunk) -> AIMessageChunk:
                chunks.append(chunk)
                return chunk

            # The last chunk goes out after the turn is archived: a caller that stops
            # at it (or disconnects) has a whole answer only when the turn is kept.
            last = yield steps.stream(self.llm, messages, config, keep, hold_last=True)
            answer = as_ai(reduce(operator.add, chunks) if chunks else AIMessageChunk(content=""))
        else:
            answer = yield steps.invoke(self.llm, messages, config)
        # Reached only when the answer is complete: an error or an abandoned stream
        # never archives half an answer.
        turn = [question, *_with_not_run(answer)]
        yield Call(lambda: history.add_messages(turn), lambda: history.aadd_messages(turn))
        if last is not None:
            yield Emit(last)
        return answer

    # The helpers below take ``run_manager`` to match langchain-core's typed
    # signatures; the run's callbacks reach the model through ``config``.

    def _invoke(
        self, input: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> AIMessage:
        return run(self._answer_plan(input, config, False))

    async def _ainvoke(
        self, input: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> AIMessage:
        return await arun(self._answer_plan(input, config, False))

    def _stream(
        self,
        inputs: Iterator[Any],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> Iterator[AIMessageChunk]:
        yield from run_stream(self._answer_plan(next(iter(inputs)), config, True))

    async def _astream(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AsyncIterator[AIMessageChunk]:
        plan = self._answer_plan(await anext(aiter(inputs)), config, True)
        async for chunk in arun_stream(plan):
            yield chunk

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        """Answer one question of a session and archive the turn."""
        return self._call_with_config(self._invoke, input, config)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        """Async :meth:`invoke`: async archive reads and writes, the model's async path."""
        return await self._acall_with_config(self._ainvoke, input, config)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        """Stream the answer; the turn is archived after the last chunk."""
        chunks = self._transform_stream_with_config(iter([input]), self._stream, config)
        # langchain-core types the helper's output by the class's (AIMessage);
        # it yields what ``_stream`` yields: chunks.
        yield from cast("Iterator[AIMessageChunk]", chunks)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        """Async :meth:`stream`."""

        async def single() -> AsyncIterator[Any]:
            yield input

        chunks = self._atransform_stream_with_config(single(), self._astream, config)
        # As in :meth:`stream`: the helper yields what ``_astream`` yields.
        async for chunk in cast("AsyncIterator[AIMessageChunk]", chunks):
            yield chunk


def create_tiered_chain(llm: Runnable[Any, Any], **options: Unpack[ChainOptions]) -> TieredChain:
    """The v3 design's chat pipeline: memories, window, knowledge, compression, LLM.

    Each call reads ``session_id`` (required) and ``user_id`` from
    ``config["configurable"]``, retrieves the session's (or user's) long-term
    memories for the question, adds the consolidated MEMORY.md, the recent window
    and the knowledge-base documents, assembles the v3 prompt, compresses it when
    over budget and calls the LLM wrapped in a
    :class:`~langchain_tiered_memory.FinishReasonHandler`. Once the answer is
    complete the turn is archived, which queues long-term extraction and
    consolidation.

    The chain answers questions; it does not run tools. For agents, use
    ``TieredMemoryMiddleware`` with ``create_agent``.

    Args:
        llm: A chat model (or a ``FinishReasonHandler`` configured yourself).
        **options: The archive, the tiers and the settings: see
            :class:`ChainOptions` (every key is optional).

    Returns:
        A Runnable with ``invoke``, ``ainvoke``, ``stream``, ``astream`` (and
        ``batch``, ``with_config``...), plus ``get_prompt`` to see the prompt.

    Raises:
        ValueError: On a bad setting, or tiers that do not share the archive.
        TypeError: On an option ``ChainOptions`` does not have.

    Example:
        .. code-block:: python

            chat = create_tiered_chain(llm, backup=backup, long_memory=long_memory,
                                       knowledge=kb.as_retriever(), language="zh")
            config = {"configurable": {"session_id": "s1", "user_id": "u1"}}
            for chunk in chat.stream({"input": "总结一下"}, config=config):
                print(chunk.text, end="")
    """
    return TieredChain(llm, **options)


__all__ = ["ChainOptions", "RetrievalFailedWarning", "TieredChain", "create_tiered_chain"]
