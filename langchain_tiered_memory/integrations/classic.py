"""``TieredMemory``: a ``langchain_classic`` memory for ``ConversationChain`` and ``LLMChain``.

It replaces ``ConversationSummaryBufferMemory``. Where that class keeps a moving
LLM summary in process memory and prunes a buffer that a database-backed history
never actually shrinks (langchain#3072, #10078), this one reads a
:class:`~langchain_tiered_memory.TieredChatMessageHistory`: the window is bounded
by the history (``window_turns``, ``window_max_tokens``), every message stays in
the archive, and the summary's place, first in the buffer, goes to the session's
``MEMORY.md`` and the long-term memories relevant to the current input.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_classic.memory.chat_memory import BaseChatMemory
from langchain_classic.memory.utils import get_prompt_input_key
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    get_buffer_string,
)
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field, model_validator

from langchain_tiered_memory.core import steps
from langchain_tiered_memory.core.steps import Call, Gather, StepPlan, arun, run
from langchain_tiered_memory.memory.history import TieredChatMessageHistory, format_memory_context

# ConversationSummaryBufferMemory arguments with no counterpart here, and why.
_REPLACED = {
    "llm": "the LLM belongs to the history's tiers: ChromaLongMemory(extractor=llm) and "
    "MemoryConsolidator(llm)",
    "max_token_limit": "the window's budget is TieredChatMessageHistory(window_max_tokens=...)",
    "moving_summary_buffer": "the summary's place is taken by MEMORY.md "
    "(MemoryConsolidator) and the long-term memories, both derived from the archive",
    "prompt": "extraction and consolidation prompts live in core/prompts.py and are the "
    "prompts= of ChromaLongMemory and MemoryConsolidator",
    "summary_message_cls": "use context_message_cls",
}


class TieredMemory(BaseChatMemory):
    """A drop-in for ``ConversationSummaryBufferMemory`` backed by a tiered history.

    ``load_memory_variables`` returns the history's window, preceded, the way
    ``ConversationSummaryBufferMemory`` puts its moving summary first, by one
    ``context_message_cls`` message (a ``SystemMessage`` by default) holding the
    session's ``MEMORY.md`` and the ``k`` long-term memories most relevant to the
    chain's input. With ``return_messages=False`` the same buffer is rendered as
    text with ``human_prefix`` / ``ai_prefix`` (the context line then starts with
    ``System:``). ``save_context`` writes the turn through the history: archived
    durably, and queued for extraction when the history has a ``long_memory``.

    Args:
        history: The session's :class:`TieredChatMessageHistory` (``chat_memory``
            is accepted as an alias and always names the same object).
        memory_key: The prompt variable the buffer fills.
        input_key: The chain input that is the user's message (and the search
            query); ``None`` picks the only input that is not a memory variable.
        output_key: The chain output that is the AI's reply; ``None`` picks the
            only output (or ``"output"``).
        return_messages: Messages (for a ``MessagesPlaceholder``) instead of text.
        human_prefix: Label of human lines in the text buffer.
        ai_prefix: Label of AI lines in the text buffer.
        k: How many long-term memories to retrieve per input.
        scope: ``"session"`` searches this session's memories; ``"user"`` every
            session of the history's ``user_id``.
        context_message_cls: The message class of the leading context message.

    Raises:
        TypeError: If ``history`` is not a ``TieredChatMessageHistory``, or an
            argument of ``ConversationSummaryBufferMemory`` that has moved is given
            (the message says where it went).
        ValueError: If ``scope="user"`` and the history has no ``user_id``.

    Example:
        .. code-block:: python

            from langchain_classic.chains import ConversationChain

            memory = TieredMemory(history=get_session_history("s1"))
            chain = ConversationChain(llm=llm, memory=memory)
            chain.invoke({"input": "What did we decide about the AR table?"})
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    history: TieredChatMessageHistory
    memory_key: str = "history"
    human_prefix: str = "Human"
    ai_prefix: str = "AI"
    k: int = Field(default=5, ge=1)
    scope: Literal["session", "user"] = "session"
    context_message_cls: type[BaseMessage] = SystemMessage

    @model_validator(mode="before")
    @classmethod
    def _one_history(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        moved = sorted(set(data) & _REPLACED.keys())
        if moved:
            reasons = "; ".join(f"{name}: {_REPLACED[name]}" for name in moved)
            msg = f"TieredMemory does not take {', '.join(moved)} ({reasons})"
            raise TypeError(msg)
        history = data.get("history")
        chat_memory = data.get("chat_memory")
        if history is None:
            history = chat_memory
        elif chat_memory is not None and chat_memory is not history:
            msg = "history and chat_memory name the same thing; pass only history"
            raise ValueError(msg)
        if not isinstance(history, TieredChatMessageHistory):
            msg = (
                "TieredMemory needs history=TieredChatMessageHistory(...), "
                f"got {type(history).__name__}"
            )
            raise TypeError(msg)
        if data.get("scope") == "user" and history.user_id is None:
            msg = "scope='user' needs a history with a user_id"
            raise ValueError(msg)
        return {**data, "history": history, "chat_memory": history}

    @property
    def memory_variables(self) -> list[str]:
        """The one prompt variable this memory fills: ``[memory_key]``."""
        return [self.memory_key]

    @property
    def buffer(self) -> str | list[BaseMessage]:
        """The buffer without an input: MEMORY.md and the window."""
        return self.load_memory_variables({})[self.memory_key]

    async def abuffer(self) -> str | list[BaseMessage]:
        """Async :attr:`buffer`."""
        return (await self.aload_memory_variables({}))[self.memory_key]

    # -- reading --------------------------------------------------------------

    def _query(self, inputs: dict[str, Any]) -> str | None:
        """The user's message, the query for long-term memories (``None``: no input)."""
        if not inputs:
            return None
        key = self.input_key or get_prompt_input_key(inputs, self.memory_variables)
        value = inputs.get(key)
        if value is None:
            return None
        text = value.text if isinstance(value, BaseMessage) else value
        return text if isinstance(text, str) else str(text)

    def _context(self, query: str | None) -> str:
        memories: list[Document] = []
        if query and query.strip() and self.history.long_memory is not None:
            memories = self.history.search_memories(query, k=self.k, scope=self.scope)
        return format_memory_context(self.history.consolidated_memory, memories)

    def _render(self, context: str, window: list[BaseMessage]) -> dict[str, Any]:
        buffer = [self.context_message_cls(content=context), *window] if context else window
        if self.return_messages:
            return {self.memory_key: buffer}
        text = get_buffer_string(buffer, human_prefix=self.human_prefix, ai_prefix=self.ai_prefix)
        return {self.memory_key: text}

    def _load_plan(self, inputs: dict[str, Any]) -> StepPlan[dict[str, Any]]:
        query = self._query(inputs)
        window_read = Call(lambda: self.history.messages, self.history.aget_messages)
        context_read = steps.offload(lambda: self._context(query))
        window, context = yield Gather((window_read, context_read))
        for result in (window, context):
            if isinstance(result, BaseException):
                raise result
        return self._render(context, window)

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The buffer for this input: MEMORY.md and relevant memories, then the window.

        Args:
            inputs: The chain's inputs; the ``input_key`` value is the query for
                long-term memories (no input, no search).

        Returns:
            ``{memory_key: buffer}``: a list of messages with
            ``return_messages=True``, else one string.
        """
        return run(self._load_plan(inputs))

    async def aload_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Async :meth:`load_memory_variables`.

        The window is read with the archive's async driver; the long-term search
        (CPU-bound embedding and in-process scoring) runs in an executor meanwhile.
        """
        return await arun(self._load_plan(inputs))

    # -- writing --------------------------------------------------------------

    def _turn(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> list[BaseMessage]:
        input_str, output_str = self._get_input_output(inputs, outputs)
        return [HumanMessage(content=input_str), AIMessage(content=output_str)]

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Archive the turn through the history (durable before this returns).

        With a ``long_memory`` on the history this also queues the turn's
        extraction; nothing is summarised on this path, so no LLM call is made.
        """
        self.history.add_messages(self._turn(inputs, outputs))

    async def asave_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Async :meth:`save_context`, on the archive's async driver."""
        await self.history.aadd_messages(self._turn(inputs, outputs))

    def clear(self) -> None:
        """Forget this session in every tier.

        ``ConversationSummaryBufferMemory.clear()`` empties the buffer and the
        summary; here that means the archived messages, the session's long-term
        memories, its MEMORY.md and pending jobs (``backup.forget``). Memories of
        the user's other sessions are kept, and so is the session's owner: the
        emptied session stays the user's.

        Checked as a write, as the history's ``clear``: without a ``user_id``, only
        a session without a user is forgotten.

        Raises:
            SessionOwnershipError: If the session belongs to another user (or to
                one while the history has no ``user_id``).
        """
        self.history.check_owner(write=True)
        self.history.backup.forget(session_id=self.history.session_id, keep_owner=True)

    async def aclear(self) -> None:
        """Async :meth:`clear` (the forget cascade runs in an executor)."""
        await run_in_executor(None, self.clear)
