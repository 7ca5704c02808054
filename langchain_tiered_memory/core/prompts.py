"""Every prompt and label the package sends to a model or puts in a prompt, per language.

One :class:`Prompts` per language (``"en"``, ``"zh"``) in :data:`PROMPTS`. The
extraction (``ChromaLongMemory``), the consolidation (``MemoryConsolidator``), the
compressor (``ContextCompressor``), the chain (``create_tiered_chain``) and
``FinishReasonHandler`` take a ``prompts=``
object and otherwise pick one by ``language=``, so a house style is a
``dataclasses.replace`` of a default, and a language is one more entry here.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from langchain_core.documents import Document


@dataclass(frozen=True)
class ChainLabels:
    """The section labels of the chain's prompt (``create_tiered_chain``).

    Attributes:
        system: The default instructions at the top of the system message.
        memories: Heading of the long-term memory section.
        consolidated: Sub-heading of MEMORY.md.
        retrieved: Sub-heading of the memories retrieved for the question.
        recent: Heading announcing the recent conversation.
        recent_note: The line under it (the turns follow as messages).
        knowledge: Heading of the knowledge-base documents.
        question: Heading of the question (when there are documents).
    """

    system: str
    memories: str
    consolidated: str
    retrieved: str
    recent: str
    recent_note: str
    knowledge: str
    question: str


@dataclass(frozen=True)
class CompressionLabels:
    """The labels of the structured summary that ``ContextCompressor`` writes.

    Attributes:
        title: First line of the summary.
        scope: The line introducing what was compressed.
        counts: Formatted with ``{total}``, ``{user}``, ``{ai}``, ``{tool}``.
        tools: Formatted with ``{tools}``.
        requests: Heading of the recent user requests.
        timeline: Heading of the timeline.
        omitted: Formatted with ``{n}``, the timeline entries left out.
        repeats: Formatted with ``{n}``, the repeated tool outputs.
        dropped: Formatted with ``{n}``, the messages force-deleted.
        pending: Heading of the pending work.
        roles: Speaker labels of the timeline, by role.
        overflow_advice: The advice of ``ContextOverflowError``.
    """

    title: str
    scope: str
    counts: str
    tools: str
    requests: str
    timeline: str
    omitted: str
    repeats: str
    dropped: str
    pending: str
    roles: Mapping[str, str]
    overflow_advice: str


def _fields_of(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@dataclass(frozen=True)
class Prompts:
    """The prompts and labels of one language (or house style).

    Attributes:
        extraction: What goes into long-term memory from one turn; formatted with
            ``{conversation}``; the model answers ``NONE`` for nothing.
        extraction_roles: Speaker labels of a turn in the extraction prompt and in
            raw-turn memories, by role (``"human"``, ``"ai"``).
        extraction_update: The extraction prompt when the scope already holds
            memories near the turn; formatted with ``{memories}`` (``[id] text``
            lines) and ``{conversation}``; the model may answer
            ``UPDATE <id>: new text``, a line for each of them the turn changes.
        consolidation: The MEMORY.md update; formatted with ``{memory}`` (the
            current MEMORY.md) and ``{conversation}``.
        consolidation_roles: Speaker labels in the consolidation prompt, by role
            (``"human"``, ``"ai"``, ``"tool"``, ``"system"``).
        continue_prompt: The request to continue an answer cut by the output
            limit (``FinishReasonHandler``).
        chain: The chain prompt's section labels.
        compression: The labels of the compressor's summary.
        context_consolidated: Header of MEMORY.md in the memory context that the
            middleware and the classic memory add to a prompt.
        context_memories: Header of the relevant memories in that context.
        consolidation_limit: Added after the consolidation prompt, formatted with
            ``{tokens}``: how long MEMORY.md may be (an answer past it is a failed
            attempt). Empty: the English line.

    Raises:
        ValueError: If a template lacks a field it is formatted with.
    """

    extraction: str
    extraction_roles: Mapping[str, str]
    consolidation: str
    consolidation_roles: Mapping[str, str]
    continue_prompt: str
    chain: ChainLabels
    compression: CompressionLabels
    context_consolidated: str
    context_memories: str
    extraction_update: str = ""
    consolidation_limit: str = ""

    def __post_init__(self) -> None:
        if not self.extraction_update:  # a house style made before it existed
            object.__setattr__(
                self,
                "extraction_update",
                self.extraction.replace("{conversation}", _EXISTING + "{conversation}", 1),
            )
        if not self.consolidation_limit:  # likewise
            object.__setattr__(self, "consolidation_limit", _LIMIT)
        for name, needed in (
            ("extraction", {"conversation"}),
            ("extraction_update", {"memories", "conversation"}),
            ("consolidation", {"memory", "conversation"}),
            ("consolidation_limit", {"tokens"}),
        ):
            missing = needed - _fields_of(getattr(self, name))
            if missing:
                msg = f"the {name} prompt needs the field(s) {sorted(missing)}"
                raise ValueError(msg)
            try:  # other fields, positional ones or format specs fail here, not in a worker
                getattr(self, name).format(**dict.fromkeys(needed, "1"))
            except (KeyError, IndexError, ValueError, AttributeError) as exc:
                msg = (
                    f"the {name} prompt cannot be formatted with only {sorted(needed)} "
                    f"({type(exc).__name__}: {exc}); write a literal brace as {{{{ or }}}}"
                )
                raise ValueError(msg) from None
        for name in ("extraction_roles", "consolidation_roles"):
            roles = getattr(self, name)
            if not {"human", "ai"} <= roles.keys():
                msg = f"{name} needs labels for 'human' and 'ai', got {sorted(roles)}"
                raise ValueError(msg)
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, str) and not value.strip():
                msg = f"{field.name} must not be empty"
                raise ValueError(msg)


# Added after the consolidation prompt of a house style without its own limit line.
_LIMIT = (
    "Keep the whole document under {tokens} tokens: merge related points and drop what "
    "no longer matters."
)
# Added before the conversation of a house-style extraction prompt without its own
# extraction_update.
_EXISTING = (
    "Existing memories:\n{memories}\n"
    "If the conversation changes one of them, answer only UPDATE <id>: <new text>, "
    "a line for each.\n\n"
)

# The speaker labels of a transcript (the consolidation prompt, the compressor's
# timeline), one table per language.
EN_ROLES: Mapping[str, str] = MappingProxyType(
    {"human": "User", "ai": "Assistant", "tool": "Tool", "system": "System"}
)
ZH_ROLES: Mapping[str, str] = MappingProxyType(
    {"human": "用户", "ai": "助手", "tool": "工具", "system": "系统"}
)

EN = Prompts(
    extraction=(
        "Summarise the core meaning of the conversation below.\n"
        "Keep task goals, problem descriptions, solutions and important constraints;\n"
        "drop courtesies, repetition and confirmations;\n"
        "if there is nothing of substance, answer only NONE.\n\n"
        "{conversation}\n\nSummary:"
    ),
    extraction_update=(
        "Summarise the core meaning of the conversation below.\n"
        "Keep task goals, problem descriptions, solutions and important constraints;\n"
        "drop courtesies, repetition and confirmations;\n"
        "if there is nothing of substance, answer only NONE.\n\n"
        "Existing memories (id in brackets):\n{memories}\n\n"
        "If the conversation gives a new value for what one of these memories states "
        "(a price, an account, an address, terms), answer only\n"
        "UPDATE <id>: <the memory rewritten with the new value>\n"
        "using an id from the list above, a line for each memory it changes; otherwise "
        "answer with the summary.\n\n"
        "{conversation}\n\nSummary:"
    ),
    extraction_roles=MappingProxyType({"human": "User", "ai": "AI"}),
    consolidation=(
        "Analyse the conversation below, extract the key information and update the "
        "long-term memory.\n"
        "## Current long-term memory\n{memory}\n"
        "## Conversation to process\n{conversation}\n"
        "Answer with the updated long-term memory in Markdown, with:\n"
        "1. **User preferences and habits**\n"
        "2. **Known database facts** (tables, fields, connections; write every password, "
        "key or other secret as ***)\n"
        "3. **Solved problems and their answers**\n"
        "4. **Open problems**\n"
    ),
    consolidation_roles=EN_ROLES,
    continue_prompt=(
        "Your previous answer was cut off by the output length limit. Continue exactly "
        "where it stopped: do not repeat anything and do not add a preamble."
    ),
    chain=ChainLabels(
        system=(
            "You are a helpful assistant. Use the memories and the reference material "
            "below when they are relevant; when they do not answer the question, say so "
            "instead of guessing."
        ),
        memories="Summary of earlier conversations (long-term memory)",
        consolidated="Consolidated memory (MEMORY.md)",
        retrieved="Relevant memories",
        recent="Recent conversation",
        recent_note="The most recent turns of this conversation follow as messages.",
        knowledge="Reference material (knowledge base)",
        question="User question",
    ),
    compression=CompressionLabels(
        title="[Context compression summary]",
        scope="Scope:",
        counts="- {total} messages compressed (user={user}, assistant={ai}, tool={tool})",
        tools="- Tools used: {tools}",
        requests="- Recent user requests:",
        timeline="- Timeline:",
        omitted="    ... {n} messages omitted ...",
        repeats="- Repeated tool outputs counted, not repeated: {n}",
        dropped="- Messages force-deleted to fit the context: {n}",
        pending="- Pending work:",
        roles=EN_ROLES,
        overflow_advice=(
            "Start a new session (its memories carry over through the long-term tier)."
        ),
    ),
    context_consolidated="Consolidated memory (MEMORY.md):",
    context_memories="Relevant long-term memories:",
)

# "zh" as in the design document.
ZH = Prompts(
    extraction=(
        "总结以下对话的核心语义。\n"
        "保留任务目标、问题描述、解决方案、重要约束；\n"
        "忽略礼貌用语、重复内容、确认性回复；\n"
        "如果没有任何实质性内容，只返回 NONE。\n\n"
        "{conversation}\n\n总结："
    ),
    extraction_update=(
        "总结以下对话的核心语义。\n"
        "保留任务目标、问题描述、解决方案、重要约束；\n"
        "忽略礼貌用语、重复内容、确认性回复；\n"
        "如果没有任何实质性内容，只返回 NONE。\n\n"
        "已有的记忆（方括号内为 id）：\n{memories}\n\n"
        "如果对话给出了其中某条记忆所述内容（价格、账号、地址、条款等）的新值，只返回\n"
        "UPDATE <id>: <用新值改写后的记忆>\n"
        "id 必须取自上面的列表，改了几条就写几行；否则返回总结。\n\n"
        "{conversation}\n\n总结："
    ),
    extraction_roles=MappingProxyType({"human": "用户", "ai": "AI"}),
    consolidation=(
        "请分析以下对话，提取关键信息并更新长期记忆。\n"
        "## 当前长期记忆\n{memory}\n"
        "## 需要处理的对话\n{conversation}\n"
        "请以 Markdown 格式输出更新后的长期记忆，包括：\n"
        "1. **用户偏好和习惯**\n"
        "2. **已知的数据库信息**（表名、字段名、连接信息；密码、密钥等机密一律写作 ***）\n"
        "3. **已解决的问题和答案**\n"
        "4. **待解决的问题**\n"
    ),
    consolidation_roles=ZH_ROLES,
    consolidation_limit="整个文档不超过 {tokens} 个 token：合并相关内容，删去不再重要的内容。",
    continue_prompt=(
        "你上一条回答因输出长度限制被截断了。"
        "请从中断处继续输出，不要重复已输出的内容，也不要加开场白。"
    ),
    chain=ChainLabels(
        system=(
            "你是一个乐于助人的助手。下面的记忆和资料与问题相关时请参考；"
            "如果它们不能回答问题，请直接说明，不要编造。"
        ),
        memories="历史对话摘要（长期记忆）",
        consolidated="长期记忆（MEMORY.md）",
        retrieved="相关记忆",
        recent="最近通话记录",
        recent_note="以下消息是本会话最近几轮的对话。",
        knowledge="资料（知识库）",
        question="用户问题",
    ),
    compression=CompressionLabels(
        title="[上下文压缩摘要]",
        scope="压缩范围：",
        counts="- 共 {total} 条消息被压缩（用户={user}, 助手={ai}, 工具={tool}）",
        tools="- 使用的工具：{tools}",
        requests="- 最近的用户请求：",
        timeline="- 关键时间线：",
        omitted="    ... 省略 {n} 条消息 ...",
        repeats="- 重复的工具输出（只计数不重复）：{n}",
        dropped="- 为防止超限强制删除的消息：{n}",
        pending="- 待办事项：",
        roles=ZH_ROLES,
        overflow_advice="请新建会话继续。",
    ),
    context_consolidated="长期记忆（MEMORY.md）：",
    context_memories="相关的长期记忆：",
)

#: The default prompts by language.
PROMPTS: Mapping[str, Prompts] = MappingProxyType({"en": EN, "zh": ZH})

#: Headers of the memory context added by the middleware and the classic memory
#: (English whatever the conversation's language, as before there was a choice).
CONSOLIDATED_HEADER = EN.context_consolidated
MEMORIES_HEADER = EN.context_memories


def memory_line(memory: Document) -> str:
    """A long-term memory as one bullet of a prompt: ``- (2023-05-08) text``.

    The date is the day its turn happened (``metadata["turn_at"]``: the session
    date the caller gave, else when the turn was archived), so a model can answer
    "when did ...". A memory spanning lines (a raw turn) is indented under its
    bullet, so one memory stays one item. The turn shown before a raw memory (its
    first ``metadata["context_chars"]`` characters) carries its own date
    (``metadata["context_at"]``; none for a memory of an older version).
    """
    day = str(memory.metadata.get("turn_at") or "")[:10]
    text = memory.page_content.strip()
    chars = memory.metadata.get("context_chars") or 0
    context, own = memory.page_content[:chars], memory.page_content[chars:]
    if day and chars and own.startswith("\n") and context.strip() and own.strip():
        when = str(memory.metadata.get("context_at") or "")[:10]
        text = (f"({when}) " if when else "") + f"{context.strip()}\n({day}) {own.strip()}"
    elif day:
        text = f"({day}) {text}"
    return "- " + text.replace("\n", "\n  ")


def prompts_for(language: str) -> Prompts:
    """The default :class:`Prompts` of ``language``.

    Raises:
        ValueError: If there are none for ``language``.
    """
    try:
        return PROMPTS[language]
    except (KeyError, TypeError):
        known = " or ".join(repr(name) for name in PROMPTS)
        msg = f"language must be {known}, got {language!r}"
        raise ValueError(msg) from None


def prompts_in_use(prompts: Prompts | None) -> list[Prompts]:
    """The prompts a tier may send: its own ``prompts``, else every language's."""
    return [prompts] if prompts is not None else list(PROMPTS.values())


__all__ = [
    "CONSOLIDATED_HEADER",
    "EN",
    "MEMORIES_HEADER",
    "PROMPTS",
    "ZH",
    "ChainLabels",
    "CompressionLabels",
    "Prompts",
    "memory_line",
    "prompts_for",
    "prompts_in_use",
]
