"""``TieredMemoryMiddleware``: tiered memory for ``langchain.agents.create_agent`` (LangChain v1).

Before each model call the session's ``MEMORY.md`` and the long-term memories
relevant to the latest user message are added to the system message of that call
only (the agent state is not touched), and the call's prompt is compressed by a
:class:`~langchain_tiered_memory.ContextCompressor` when it is over budget. Before
each model call and after the run, the thread's messages not archived yet are
archived, once, into the session's
:class:`~langchain_tiered_memory.TieredChatMessageHistory`, which queues their
extraction into long-term memory.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelCallResult,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langgraph.config import get_config
from langgraph.runtime import Runtime
from typing_extensions import override

from langchain_tiered_memory.core import steps
from langchain_tiered_memory.core.encoding import exact_json
from langchain_tiered_memory.core.steps import Call, StepPlan, arun, run
from langchain_tiered_memory.core.turns import role_of, tool_call_ids, tool_calls_of
from langchain_tiered_memory.core.validation import (
    InvalidSessionDateError,
    check_int,
    validate_id,
    validate_messages,
    validate_optional_id,
)
from langchain_tiered_memory.memory.history import (
    TieredChatMessageHistory,
    format_memory_context,
    resolve_backup,
)
from langchain_tiered_memory.storage.base import Archive
from langchain_tiered_memory.tiers.compression import ContextCompressor
from langchain_tiered_memory.tiers.window import split_turns

logger = logging.getLogger(__name__)

# Final, so that the TypedDict state is indexed by its literal key.
ARCHIVED_KEY: Final = "tiered_memory_archived"
REFUSED_KEY: Final = "tiered_memory_refused"
#: The errors a refused message is reported with (by name: the state is serialised).
REFUSALS: Final[dict[str, type[Exception]]] = {
    error.__name__: error for error in (TypeError, ValueError, InvalidSessionDateError)
}
MAX_CACHED_COMPRESSORS = 32

if TYPE_CHECKING:
    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory


class TieredMemoryState(AgentState[Any]):
    """The agent state plus the fingerprints of the thread's messages already archived.

    With a checkpointer the list survives between runs on a thread, so a message
    is archived once however many runs see it (see :func:`fingerprint`).
    """

    tiered_memory_archived: NotRequired[Annotated[list[str], PrivateStateAttr]]
    tiered_memory_refused: NotRequired[Annotated[dict[str, str] | None, PrivateStateAttr]]


def _field(context: Any, name: str) -> Any:
    """``context.name`` or ``context[name]``; ``None`` when absent."""
    if context is None:
        return None
    if isinstance(context, Mapping):
        return context.get(name)
    return getattr(context, name, None)


def _last_human_text(messages: Sequence[BaseMessage]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            text = message.text
            return text if text.strip() else None
    return None


def _merge_system(messages: Sequence[SystemMessage]) -> SystemMessage | None:
    """One system message from several, in order (providers differ on several)."""
    if not messages:
        return None
    first = messages[0]
    if len(messages) == 1:
        return first
    parts = [m.content for m in messages]
    texts = [part for part in parts if isinstance(part, str)]
    if len(texts) == len(parts):
        content: Any = "\n\n".join(texts)
    else:  # content blocks (e.g. with cache control): keep them, append ours as blocks
        content = []
        for part in parts:
            if isinstance(part, str):
                content.append({"type": "text", "text": part})
            else:
                content.extend(part)
    return first.model_copy(update={"content": content})


def fingerprint(message: BaseMessage) -> str:
    """A message's id and what it says.

    A message edited under its id (LangGraph's time travel: ``update_state`` with
    the id of the message to replace) is another message: it is archived too.
    """
    said = exact_json(
        [
            message.type,
            message.content,
            getattr(message, "tool_calls", None) or [],
            getattr(message, "tool_call_id", None),
        ],
        stand_ins=True,
    )
    content = hashlib.sha256(said.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{message.id}#{content}"


def _archivable(message: BaseMessage) -> bool:
    # Instructions and a summarisation middleware's stand-in summary are not
    # conversation: the archive keeps what was said.
    if isinstance(message, SystemMessage):
        return False
    return message.additional_kwargs.get("lc_source") != "summarization"


def _refusals(messages: Sequence[BaseMessage]) -> list[tuple[BaseMessage, Exception]]:
    """The messages the archive would refuse, each with its error."""
    refusals: list[tuple[BaseMessage, Exception]] = []
    for message in messages:
        try:
            validate_messages([message])
        except (TypeError, ValueError) as exc:
            refusals.append((message, exc))
    return refusals


def _placeholder(message: BaseMessage, exc: Exception) -> BaseMessage | None:
    """What is archived for a message of the run the archive refused.

    A tool result or a tool call keeps its place, and its pair stays whole (a
    provider refuses a call without its answer); any other message is left out.
    """
    note = f"[not archived: {type(exc).__name__}: {exc}]"[:1000]
    if isinstance(message, ToolMessage):
        return ToolMessage(note, tool_call_id=message.tool_call_id, id=message.id)
    if isinstance(message, AIMessage) and tool_calls_of(message):
        # Invalid calls and calls given as content blocks are calls too: their
        # answers follow them.
        calls = [
            tool_call(name=c.get("name") or "tool", args={}, id=c.get("id"))
            for c in tool_calls_of(message)
            if c not in message.invalid_tool_calls
        ]
        invalid = [
            invalid_tool_call(name=c.get("name"), args=None, id=c.get("id"), error=None)
            for c in message.invalid_tool_calls
        ]
        return AIMessage(note, tool_calls=calls, invalid_tool_calls=invalid, id=message.id)
    return None


def _exchange(messages: Sequence[BaseMessage], first: BaseMessage) -> list[BaseMessage]:
    """``first`` and what follows it, with the tool call it answers (if among ``messages``).

    Removing a tool result without its call, or a call without its results,
    would leave the thread with a call no provider accepts.
    """
    at = next(i for i, m in enumerate(messages) if m is first)
    if isinstance(first, ToolMessage):
        for i in range(at - 1, -1, -1):
            candidate = messages[i]
            if first.tool_call_id in tool_call_ids(candidate):
                at = i
                break
    return list(messages[at:])


def _tool_key(tool: Any) -> str:
    name = getattr(tool, "name", None)
    return name if isinstance(name, str) else repr(tool)


class TieredMemoryMiddleware(AgentMiddleware[TieredMemoryState, Any]):
    """Tiered memory for LangChain v1 agents (``langchain.agents.create_agent``).

    * **Before each model call** (``wrap_model_call``): the session's
      ``MEMORY.md`` and the ``k`` long-term memories most relevant to the latest
      user message are appended to the system message of this call only; then,
      if the call's prompt (system message, messages and tool schemas) is over
      the compressor's budget, older messages are replaced by its structured
      summary, never separating a tool result from its call. The agent state
      keeps every message.
    * **Before each model call and after the run** (``before_model``,
      ``after_agent``): the human, AI and tool messages of the thread not archived
      yet are archived into the session's
      :class:`~langchain_tiered_memory.TieredChatMessageHistory` (durably, in
      order, so tool pairs stay together), which queues their extraction into
      long-term memory. Before a call, the messages up to the last model answer
      are archived: what a middleware listed after this one (summarization,
      trimming) removes from the state is kept, so list this one first. The
      messages after that answer (the run's input, this step's tool results) wait
      for the next call or the end of the run, so a middleware listed after this
      one (PII redaction) rewrites them before they are archived. The messages'
      ids and contents are kept in a private state key, so with a checkpointer a
      message is archived once across runs; without one, messages re-sent with
      their ids are recognised in the archive's last turns.
      A message edited under its id is archived as a new one.

    The session is ``config["configurable"]["session_id"]``, falling back to
    ``config["configurable"]["thread_id"]``; a runtime context (``context=`` of
    ``invoke``) with a ``session_id`` attribute or key overrides both. The user
    is the context's ``user_id``, else ``config["configurable"]["user_id"]``.
    Short-term memory stays the agent's thread state (a checkpointer); this
    middleware adds the archive, long-term memory and compression.

    Args:
        backup: The archive; a URL string is a shortcut for ``MySQLBackup(url)``.
            ``None`` means the archive of ``long_memory`` or ``consolidator``, or
            else the embedded SQLite default under ``$TIERED_MEMORY_HOME``.
        long_memory: Long-term memory to search before each call and to feed
            after each run; ``None`` for none.
        consolidator: The MEMORY.md tier; ``None`` for none.
        compressor: The compressor for each call's prompt; ``None`` means
            ``ContextCompressor()`` (60k compress, 100k force delete, 120k error)
            and ``False`` turns compression off. When it was built without
            ``tools``, the tools of each call are counted in its budget.
        scope: ``"session"`` searches the session's memories; ``"user"`` every
            session of the run's user (a ``user_id`` is then required).
        k: How many long-term memories to add per call.

    Raises:
        ValueError: If a tier uses another archive than ``backup``, ``scope`` is
            unknown or ``k`` is not a positive int. At run time: if the run has
            no session (or ``scope="user"`` and no user), or an id is unusable
            (empty, over 255 characters, control characters).

    Example:
        .. code-block:: python

            from langchain.agents import create_agent
            from langgraph.checkpoint.memory import InMemorySaver

            agent = create_agent(
                model,
                tools,
                middleware=[TieredMemoryMiddleware(backup=backup, long_memory=long_memory)],
                checkpointer=InMemorySaver(),
            )
            agent.invoke(
                {"messages": [{"role": "user", "content": "AR 表结构?"}]},
                config={"configurable": {"thread_id": "s1", "user_id": "u1"}},
            )
    """

    state_schema = TieredMemoryState

    def __init__(
        self,
        *,
        backup: Archive | str | None = None,
        long_memory: ChromaLongMemory | None = None,
        consolidator: MemoryConsolidator | None = None,
        compressor: ContextCompressor | Literal[False] | None = None,
        scope: Literal["session", "user"] = "session",
        k: int = 5,
    ) -> None:
        super().__init__()
        if scope not in ("session", "user"):
            msg = f"scope must be 'session' or 'user', got {scope!r}"
            raise ValueError(msg)
        check_int("k", k)
        backup = resolve_backup(backup, long_memory, consolidator, "middleware")
        off_or_default = compressor is None or compressor is False
        if not off_or_default and not isinstance(compressor, ContextCompressor):
            msg = (
                "compressor must be a ContextCompressor, None or False, "
                f"got {type(compressor).__name__}"
            )
            raise TypeError(msg)
        self.backup = backup
        self.long_memory = long_memory
        self.consolidator = consolidator
        self.compressor: ContextCompressor | None = (
            None if compressor is False else compressor or ContextCompressor()
        )
        self.scope = scope
        self.k = k
        self._compressors: dict[tuple[str, ...], ContextCompressor] = {}

    def __repr__(self) -> str:
        return (
            f"TieredMemoryMiddleware(backup={self.backup!r}, long_memory={self.long_memory!r}, "
            f"scope={self.scope!r}, k={self.k})"
        )

    # -- the session ------------------------------------------------------------

    def session(self, runtime: Runtime[Any] | None) -> tuple[str, str | None]:
        """The run's ``(session_id, user_id)``, validated.

        Args:
            runtime: The hook's runtime (its ``context`` may name the session).

        Raises:
            ValueError: If no session is given, two sources disagree, an id is
                unusable, or ``scope="user"`` and no user is given.
            TypeError: If an id is not a string.
        """
        context = getattr(runtime, "context", None)
        try:
            configurable = get_config().get("configurable") or {}
        except RuntimeError:  # called outside a graph run
            configurable = {}
        from_context = _field(context, "session_id")
        from_config = configurable.get("session_id")
        if from_context is not None and from_config is not None and from_context != from_config:
            msg = (
                f"the runtime context's session_id {from_context!r} and "
                f"config['configurable']['session_id'] {from_config!r} disagree"
            )
            raise ValueError(msg)
        candidates = (from_context, from_config, configurable.get("thread_id"))
        session_id = next((v for v in candidates if v is not None), None)
        if session_id is None:
            msg = (
                "TieredMemoryMiddleware needs a session: pass "
                "config={'configurable': {'thread_id': ...}} (or 'session_id'), or a "
                "runtime context with a session_id"
            )
            raise ValueError(msg)
        user_id = _field(context, "user_id")
        if user_id is None:
            user_id = configurable.get("user_id")
        session_id = validate_id(session_id, "session_id")
        user_id = validate_optional_id(user_id, "user_id")
        if self.scope == "user" and user_id is None:
            msg = (
                "scope='user' needs a user_id: pass config={'configurable': {'user_id': ...}} "
                "or a runtime context with a user_id"
            )
            raise ValueError(msg)
        return session_id, user_id

    def history(self, runtime: Runtime[Any] | None) -> TieredChatMessageHistory:
        """The run's session as a :class:`TieredChatMessageHistory` over the tiers."""
        session_id, user_id = self.session(runtime)
        return TieredChatMessageHistory.on_tiers(self, session_id, user_id=user_id)

    # -- before each model call -------------------------------------------------

    def _context(self, history: TieredChatMessageHistory, query: str | None) -> str:
        # The owner was checked in before_model: another user's session is refused
        # before anything is sent or read.
        memories: list[Document] = []
        if self.long_memory is not None and query is not None:
            memories = history.search_memories(query, k=self.k, scope=self.scope)
        return format_memory_context(history.consolidated_memory, memories)

    def _compressor_for(self, tools: Sequence[Any]) -> ContextCompressor | None:
        """The compressor, counting the call's tool schemas when it was built without."""
        base = self.compressor
        if base is None or base.tools or not tools:
            return base
        key = tuple(_tool_key(tool) for tool in tools)
        compressor = self._compressors.get(key)
        if compressor is None:
            try:
                compressor = ContextCompressor(
                    compress_threshold=base.compress_threshold,
                    preserve_count=base.preserve_count,
                    force_delete_threshold=base.force_delete_threshold,
                    error_threshold=base.error_threshold,
                    token_counter=base.count_tokens,
                    tools=tools,
                    language=base.language,
                    prompts=base.prompts,
                    timeline_entries=base.timeline_entries,
                    entry_chars=base.entry_chars,
                )
            except Exception:  # a tool with no OpenAI schema: measure without tools
                logger.debug("tool schemas not measurable; compressing without them")
                compressor = base
            if len(self._compressors) >= MAX_CACHED_COMPRESSORS:
                self._compressors.clear()
            self._compressors[key] = compressor
        return compressor

    def _prepare(self, request: ModelRequest[Any], context: str) -> ModelRequest[Any]:
        """The request with the memory context and, if over budget, compressed."""
        system = request.system_message
        if context:
            system = _merge_system([*([system] if system else []), SystemMessage(context)])
        messages: list[AnyMessage] = list(request.messages)
        compressor = self._compressor_for(request.tools)
        if compressor is not None:
            prompt = [system, *messages] if system is not None else messages
            compressed = compressor.compress(prompt)
            unchanged = len(compressed) == len(prompt) and all(
                a is b for a, b in zip(compressed, prompt, strict=True)
            )
            if not unchanged:
                # The summary comes back as a system message after the head: fold the
                # leading system messages into the one system message of the call.
                start = next(
                    (i for i, m in enumerate(compressed) if not isinstance(m, SystemMessage)),
                    len(compressed),
                )
                system = _merge_system(compressed[:start])  # type: ignore[arg-type]
                messages = compressed[start:]  # type: ignore[assignment]
        if system is request.system_message and messages == request.messages:
            return request
        return request.override(system_message=system, messages=messages)

    def _request_plan(self, request: ModelRequest[Any]) -> StepPlan[ModelRequest[Any]]:
        history = self.history(request.runtime)
        query = _last_human_text(request.messages)
        # The search is sync (embedding, in-process scoring): an executor on the async path.
        context = yield steps.offload(lambda: self._context(history, query))
        return self._prepare(request, context)

    @override
    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult:
        """Add MEMORY.md and relevant memories to this call; compress it if over budget."""
        return handler(run(self._request_plan(request)))

    @override
    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult:
        """Async :meth:`wrap_model_call` (the search runs in an executor)."""
        return await handler(await arun(self._request_plan(request)))

    # -- before the run ---------------------------------------------------------

    def _refuse(self, state: TieredMemoryState) -> dict[str, Any] | None:
        """Take the new messages the archive would refuse out of the thread.

        The first refused message goes with what follows it and with the tool call
        it answers, so the thread keeps no call without its answer; the refusal is
        raised before the model is called (``before_model``). Left in a checkpointed
        thread, such a message would fail every later run's archiving.
        """
        fresh = self._unarchived(state)[0]
        refusals = _refusals(fresh)
        if not refusals:
            return {REFUSED_KEY: None} if state.get(REFUSED_KEY) else None
        first = refusals[0][1]
        error = type(first).__name__ if type(first).__name__ in REFUSALS else "ValueError"
        reason = "; ".join(f"message {m.id!r} refused: {exc}" for m, exc in refusals)
        removed = _exchange(fresh, refusals[0][0])
        return {
            "messages": [RemoveMessage(id=m.id) for m in removed if m.id is not None],
            REFUSED_KEY: {"error": error, "message": reason},
        }

    @override
    def before_agent(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Refuse the run's new messages that the archive could not keep."""
        return self._refuse(state)

    @override
    async def abefore_agent(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async :meth:`before_agent` (no I/O: the same check)."""
        return self._refuse(state)

    @staticmethod
    def _raise_refusal(state: TieredMemoryState) -> None:
        # Raised from a graph node, not from inside the model call: a retry or
        # fallback middleware around the model would take it for a model error.
        refused: Mapping[str, str] | None = state.get(REFUSED_KEY)
        if refused:
            raise REFUSALS.get(refused["error"], ValueError)(refused["message"])

    def _before_model_plan(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> StepPlan[dict[str, Any] | None]:
        # Raised from a graph node, not from inside the model call (a retry
        # middleware would take them for model errors): a refused input, a missing
        # or unusable session, another user's session.
        self._raise_refusal(state)
        history = self.history(runtime)
        yield Call(
            lambda: history.check_owner(write=True),
            lambda: history.acheck_owner(write=True),
        )
        return (yield from self._archive_plan(state, history, settled_only=True))

    @override
    def before_model(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Check the run's input and session; archive the thread up to the last answer."""
        return run(self._before_model_plan(state, runtime))

    @override
    async def abefore_model(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async :meth:`before_model`, on the archive's async driver."""
        return await arun(self._before_model_plan(state, runtime))

    # -- after the run ----------------------------------------------------------

    @staticmethod
    def _unarchived(
        state: TieredMemoryState, *, settled_only: bool = False
    ) -> tuple[list[BaseMessage], list[str]]:
        """The thread's messages not archived yet; the fingerprints once they are.

        With ``settled_only``, only the messages up to the last model answer: those
        after it (the run's input, this step's tool results) may still be rewritten
        under their ids by a middleware listed after this one (PII redaction)
        before the model sees them; they are archived at the next call or after
        the run. A last answer that calls tools waits with its results, so a run
        that stops before them (a model error, a cancelled stream) never leaves
        the archive a call without its result; once a question follows it (the
        thread's next run), that run is over: the answer and its results are
        settled, before a middleware listed after this one can summarise them away.
        """
        messages = state["messages"]
        # A bare id: recorded by a version that kept ids only.
        archived = set(state.get(ARCHIVED_KEY) or ())
        # Hashed once per message: this runs before every model call, on the whole thread.
        prints = [None if m.id is None else fingerprint(m) for m in messages]
        known = [m.id in archived or p in archived for m, p in zip(messages, prints, strict=True)]
        settled = len(messages)
        if settled_only:
            answers = [i for i, m in enumerate(messages) if isinstance(m, AIMessage)]
            settled = answers[-1] + 1 if answers else 0
            if answers and tool_calls_of(messages[answers[-1]]):
                if any(role_of(m) == "human" for m in messages[settled:]):
                    while settled < len(messages) and isinstance(messages[settled], ToolMessage):
                        settled += 1
                else:
                    settled -= 1
        fresh: list[BaseMessage] = [
            m
            for i, m in enumerate(messages[:settled])
            if (m.id is None or not known[i]) and _archivable(m)
        ]
        ids = [p for i, p in enumerate(prints) if p is not None and (i < settled or known[i])]
        return fresh, ids

    @staticmethod
    def _tail_turns(fresh: Sequence[BaseMessage]) -> int:
        # As many turns as were sent (a stateless caller re-sends them all), and one
        # more for a turn the first of them continues.
        return len(split_turns(fresh, keep_leading=True)) + 1

    @staticmethod
    def _drop_known(fresh: list[BaseMessage], tail: Sequence[BaseMessage]) -> list[BaseMessage]:
        # Without a checkpointer a caller may re-send earlier messages (with their
        # ids) as input: those are in the archive already.
        known = {fingerprint(m) for m in tail if m.id is not None}
        return [m for m in fresh if m.id is None or fingerprint(m) not in known]

    def _archive_plan(
        self,
        state: TieredMemoryState,
        history: TieredChatMessageHistory,
        *,
        settled_only: bool = False,
    ) -> StepPlan[dict[str, Any] | None]:
        session_id, user_id = history.session_id, history.user_id
        fresh, ids = self._unarchived(state, settled_only=settled_only)
        # A message made during the run (a tool's) that the archive refuses is
        # logged and left out, not raised: the run has answered, and raising would
        # fail every later run of the thread on the same message.
        placeholders: dict[int, BaseMessage | None] = {}
        for message, exc in _refusals(fresh):
            logger.error("not archived: %s message %r: %s", message.type, message.id, exc)
            placeholders[id(message)] = _placeholder(message, exc)
        kept = (placeholders.get(id(m), m) for m in fresh)
        fresh = [m for m in kept if m is not None]
        if fresh:
            turns = self._tail_turns(fresh)
            tail = yield Call(
                lambda: self.backup.tail(session_id, turns, user_id=user_id),
                lambda: self.backup.atail(session_id, turns, user_id=user_id),
            )
            fresh = self._drop_known(fresh, tail)
        if fresh:
            new = fresh
            yield Call(lambda: history.add_messages(new), lambda: history.aadd_messages(new))
        if ids == list(state.get(ARCHIVED_KEY) or ()):
            return None
        return {ARCHIVED_KEY: ids}

    @override
    def after_agent(self, state: TieredMemoryState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Archive the thread's messages not archived yet (which queues extraction)."""
        return run(self._archive_plan(state, self.history(runtime)))

    @override
    async def aafter_agent(
        self, state: TieredMemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async :meth:`after_agent`, on the archive's async driver."""
        return await arun(self._archive_plan(state, self.history(runtime)))
