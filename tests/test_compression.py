"""ContextCompressor: the ERP design's first layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.tools import tool

from langchain_tiered_memory import ContextCompressor, ContextOverflowError, estimate_tokens
from langchain_tiered_memory.core.prompts import PROMPTS
from langchain_tiered_memory.tiers.compression import SUMMARY_KEY, validate_conversation

from .fakes import RecordingChatModel, image_base64, replies


def document(chars: int, seed: str) -> str:
    """A synthetic ERP document of about ``chars`` characters."""
    row = f'{{"invoice_no": "{seed}-00042", "customer": "上海华东贸易", "amount": 1234.5}}\n'
    return (f"{seed} 文档内容:\n" + row * (chars // len(row) + 1))[:chars]


def lookup(n: int, name: str, output: str, question: str, answer: str) -> list[BaseMessage]:
    call = f"call-{n}"
    return [
        HumanMessage(question),
        AIMessage("让我检索...", tool_calls=[{"name": name, "args": {"q": question}, "id": call}]),
        ToolMessage(output, tool_call_id=call, name=name),
        AIMessage(answer),
    ]


def ar_ap_conversation() -> list[BaseMessage]:
    """The design's example: AR (210k chars), AP (150k chars), then a summary request."""
    return [
        SystemMessage("你是 ERP 助手。"),
        *lookup(1, "search_knowledge_base", document(210_000, "AR"), "查询 AR 表", "根据文档..."),
        *lookup(2, "get_document_by_name", document(150_000, "AP"), "再查询 AP 表", "根据文档..."),
        HumanMessage("总结一下"),
        AIMessage("AR 在 ar_invoice, AP 在 ap_bill。"),
    ]


def summaries(messages: list[BaseMessage]) -> list[SystemMessage]:
    return [
        m for m in messages if isinstance(m, SystemMessage) and SUMMARY_KEY in m.additional_kwargs
    ]


def test_small_prompts_pass_unchanged() -> None:
    messages = [SystemMessage("s"), HumanMessage("hi"), AIMessage("hello")]
    assert ContextCompressor().compress(messages) == messages


def test_the_design_example_is_compressed_with_a_structured_summary() -> None:
    messages = ar_ap_conversation()
    assert estimate_tokens(messages) > 100_000  # the design's failing prompt
    compressed = ContextCompressor().compress(messages)
    assert estimate_tokens(compressed) <= 60_000
    assert compressed[0] == messages[0]
    (summary,) = summaries(compressed)
    assert compressed[1] is summary
    text = summary.content
    assert "[上下文压缩摘要]" in text
    # The 150k-character AP result alone would keep the prompt over 60k: its turn
    # is folded into the summary too, and the last turn is kept, as in the design.
    assert "共 8 条消息被压缩（用户=2, 助手=4, 工具=2）" in text
    assert "search_knowledge_base, get_document_by_name" in text
    assert "• 查询 AR 表" in text
    assert compressed[2:] == messages[9:]
    validate_conversation(compressed)


def test_english_conversations_get_english_labels() -> None:
    messages = [
        SystemMessage("You are an ERP assistant."),
        *lookup(1, "search_kb", document(200_000, "AR"), "Query the AR table", "It has ..."),
        HumanMessage("Summarise"),
        AIMessage("Done"),
    ]
    (summary,) = summaries(ContextCompressor(compress_threshold=1000).compress(messages))
    assert summary.content.startswith("[Context compression summary]")
    assert "Tools used: search_kb" in summary.content


def test_the_cut_never_orphans_a_tool_message() -> None:
    messages = [SystemMessage("s")]
    for n in range(6):
        messages += lookup(n, "search_kb", document(3000, f"D{n}"), f"question {n}", f"answer {n}")
    for threshold in (1000, 6000):
        for preserve in range(1, 9):
            compressor = ContextCompressor(compress_threshold=threshold, preserve_count=preserve)
            compressed = compressor.compress(messages)
            validate_conversation(compressed)
            kept = [m for m in compressed if not isinstance(m, SystemMessage)]
            assert kept and not isinstance(kept[0], ToolMessage)
            if threshold == 6000:  # room for the tail: at least preserve_count are kept
                assert len(kept) >= preserve
                assert compressor.measure(compressed) <= threshold


def test_tool_schemas_and_system_prompt_count() -> None:
    @tool
    def query_erp(sql: str, database: str = "erp") -> str:
        """Run a read-only SQL query against the ERP database and return rows as JSON."""
        return "[]"

    big_system = SystemMessage("规则：" + "请严格遵守财务制度。" * 300)
    messages = [
        big_system,
        HumanMessage("q1"),
        AIMessage("a1 " + "detail " * 100),  # long enough that a summary saves tokens
        HumanMessage("q2"),
        AIMessage("a2 " + "detail " * 100),
        HumanMessage("q3"),
        AIMessage("a3"),
    ]
    body_only = estimate_tokens(messages[1:])
    threshold = estimate_tokens(messages) + 5
    assert body_only < threshold
    assert ContextCompressor(compress_threshold=threshold).compress(messages) == messages
    with_tools = ContextCompressor(compress_threshold=threshold, tools=[query_erp])
    assert with_tools.measure(messages) > threshold
    assert summaries(with_tools.compress(messages))


def test_repeated_tool_outputs_are_counted_not_repeated() -> None:
    same = "检索到 5 个文档：ar_invoice, ar_receipt, customer, ..." + "x" * 5000
    messages = [SystemMessage("s")]
    for n in range(4):
        messages += lookup(n, "search_knowledge_base", same + str(n), f"查询 {n}", "好的")
    messages += [HumanMessage("最后"), AIMessage("完")]
    (summary,) = summaries(ContextCompressor(compress_threshold=500).compress(messages))
    assert "重复的工具输出（只计数不重复）：3" in summary.content
    timeline_tools = [line for line in summary.content.splitlines() if "工具(search" in line]
    assert len(timeline_tools) <= 1


def test_repeats_are_recognised_across_re_compressions() -> None:
    same = "检索到 5 个文档：ar_invoice ..." + "x" * 5000
    compressor = ContextCompressor(compress_threshold=300)
    history = [SystemMessage("s"), *lookup(0, "kb", same, "查询 0", "好的")]
    history += [HumanMessage("下一个"), AIMessage("好")]
    history = compressor.compress(history)  # the app carries the compressed history on
    assert summaries(history)
    history += [*lookup(1, "kb", same + "again", "查询 1", "好的")]
    history += [HumanMessage("完"), AIMessage("完")]
    (summary,) = summaries(compressor.compress(history))
    assert summary.additional_kwargs[SUMMARY_KEY]["repeats"] == 1


def test_timeline_entries_are_short_and_omissions_counted() -> None:
    messages = [SystemMessage("s")]
    for n in range(30):
        messages += [HumanMessage(f"question {n} " + "word " * 100), AIMessage(f"answer {n}")]
    (summary,) = summaries(ContextCompressor(compress_threshold=500).compress(messages))
    timeline = [line for line in summary.content.splitlines() if line.startswith("    •")]
    assert all(len(line) <= 170 for line in timeline)
    assert "messages omitted" in summary.content


def test_compressing_again_flattens_the_summary() -> None:
    compressor = ContextCompressor(compress_threshold=2000, language="en")
    messages = [SystemMessage("s")]
    for n in range(5):
        messages += lookup(n, "search_kb", document(4000, f"D{n}"), f"q{n}", f"a{n}")
    first = compressor.compress(messages)
    more = list(first)
    for n in range(5, 10):
        more += lookup(n, "search_kb", document(4000, f"D{n}"), f"q{n}", f"a{n}")
    second = compressor.compress(more)
    (summary,) = summaries(second)
    assert summary.content.count("[Context compression summary]") == 1
    stats = summary.additional_kwargs[SUMMARY_KEY]
    kept = [m for m in second if not isinstance(m, SystemMessage)]
    assert stats["user"] + stats["ai"] + stats["tool"] + len(kept) == 10 * 4  # nothing lost
    validate_conversation(second)


def test_oversized_tails_fold_whole_oldest_turns() -> None:
    messages = [SystemMessage("s")]
    for n in range(3):
        messages += [HumanMessage(f"q{n} " + "data " * 3000), AIMessage(f"a{n}")]
    compressor = ContextCompressor(
        compress_threshold=100,
        preserve_count=6,
        force_delete_threshold=4000,
        error_threshold=8000,
    )
    compressed = compressor.compress(messages)
    kept = [m for m in compressed if not isinstance(m, SystemMessage)]
    assert [m.content.split()[0] for m in kept if isinstance(m, HumanMessage)] == ["q2"]
    assert compressor.measure(compressed) <= 4000
    validate_conversation(compressed)


def test_level_two_force_deletes_inside_a_huge_last_turn() -> None:
    turn: list[BaseMessage] = [HumanMessage("compare all documents")]
    for n in range(4):
        call = f"c{n}"
        turn += [
            AIMessage("", tool_calls=[{"name": "fetch", "args": {"n": n}, "id": call}]),
            ToolMessage(f"doc {n} " + "row " * 3000, tool_call_id=call, name="fetch"),
        ]
    turn.append(AIMessage("They differ in amount."))
    compressor = ContextCompressor(
        compress_threshold=1000,
        preserve_count=20,  # level 1 keeps the whole turn: level 2 must act
        force_delete_threshold=7000,
        error_threshold=20_000,
        language="en",
    )
    compressed = compressor.compress([SystemMessage("s"), *turn])
    assert compressor.measure(compressed) <= 7000
    assert compressed[-1] == turn[-1]
    (summary,) = summaries(compressed)
    dropped = summary.additional_kwargs[SUMMARY_KEY]["dropped"]
    assert dropped > 0 and "force-deleted to fit the context" in summary.content
    assert len(compressed) - 2 + dropped == len(turn)
    assert compressed[2] == turn[0]  # the question stays; the oldest pairs after it go
    validate_conversation(compressed)


def test_a_cut_inside_a_turn_keeps_the_question_that_opened_it() -> None:
    old = [HumanMessage("earlier question"), AIMessage("earlier answer " * 200)]
    turn: list[BaseMessage] = [HumanMessage("compare the AR and AP documents")]
    for n in range(3):
        call = f"c{n}"
        turn += [
            AIMessage("", tool_calls=[{"name": "fetch", "args": {"n": n}, "id": call}]),
            ToolMessage(f"doc {n} " + "row " * 300, tool_call_id=call, name="fetch"),
        ]
    compressor = ContextCompressor(
        compress_threshold=500,
        preserve_count=2,  # the cut lands inside the last turn
        force_delete_threshold=5000,
        error_threshold=10_000,
        language="en",
    )
    compressed = compressor.compress([SystemMessage("s"), *old, *turn])
    validate_conversation(compressed)
    assert [m.type for m in compressed] == ["system", "system", "human", "ai", "tool"]
    assert compressed[2] == turn[0]
    assert compressed[-2:] == turn[-2:]
    digest = compressed[1].additional_kwargs[SUMMARY_KEY]
    assert (digest["user"], digest["ai"], digest["tool"]) == (1, 3, 2)  # question not counted
    assert "earlier question" in compressed[1].content


def _tool_round(call: str, words: int) -> list[BaseMessage]:
    return [
        AIMessage("", tool_calls=[{"name": "sql", "args": {"q": call}, "id": call}]),
        ToolMessage("row " * words, tool_call_id=call, name="sql"),
    ]


@pytest.mark.parametrize("question_type", [HumanMessage, ChatMessage])
@pytest.mark.parametrize("force_delete_threshold", [100_000, 2000])
def test_a_turn_opened_by_several_questions_keeps_them_all(
    question_type: type[BaseMessage], force_delete_threshold: int
) -> None:
    # A question whose model call failed, then the one asked after it: one turn, and
    # the latest is the one to answer. Level 1 (cut inside the turn) and level 2
    # (force-deleting inside it) keep both verbatim; a ChatMessage of role "user" is
    # a user message as well.
    def ask(text: str) -> BaseMessage:
        return (
            HumanMessage(text) if question_type is HumanMessage else ChatMessage(text, role="user")
        )

    questions = [ask("old question, left unanswered"), ask("LATEST: open invoices of 42?")]
    messages = [*questions, *_tool_round("c1", 3000), *_tool_round("c2", 30)]
    compressor = ContextCompressor(
        compress_threshold=2000,
        force_delete_threshold=force_delete_threshold,
        error_threshold=100_000,
        language="en",
    )
    compressed = compressor.compress(messages)
    validate_conversation(compressed)
    start = next(i for i, m in enumerate(compressed) if m is questions[0])
    assert compressed[start : start + 2] == questions
    assert compressed[-1] == messages[-1]
    if force_delete_threshold == 2000:  # level 2 deleted the oldest tool round
        assert compressor.measure(compressed) <= 2000
        digest = compressed[0].additional_kwargs[SUMMARY_KEY]
        assert digest["user"] == 0 and digest["dropped"] == 2
    else:  # nothing before the question to fold: a summary would only add to it
        assert compressed == messages


def test_chat_messages_are_counted_and_labelled_as_the_role_they_name() -> None:
    folded: list[BaseMessage] = [
        ChatMessage("What were the totals? " * 30, role="user"),
        ChatMessage("The totals are 1,234 EUR. " * 30, role="assistant"),
    ]
    compressor = ContextCompressor(compress_threshold=50, preserve_count=1, language="en")
    compressed = compressor.compress([*folded, HumanMessage("And last year?")])
    digest = compressed[0].additional_kwargs[SUMMARY_KEY]
    assert (digest["user"], digest["ai"], digest["tool"]) == (1, 1, 0)
    assert [entry.split(":")[0] for entry in digest["timeline"]] == ["User", "Assistant"]


def test_every_folded_message_is_counted_whatever_its_role() -> None:
    folded: list[BaseMessage] = [
        HumanMessage("What were the totals? " * 30),
        ChatMessage("Check the ledger first. " * 30, role="critic"),
        ChatMessage("ledger: 1,234 EUR " * 30, role="tool"),
        FunctionMessage("fx: 1.08 " * 30, name="fx"),
        AIMessage("The totals are 1,234 EUR. " * 30),
    ]
    compressor = ContextCompressor(compress_threshold=50, preserve_count=1, language="en")
    compressed = compressor.compress([*folded, HumanMessage("And last year?")])
    digest = compressed[0].additional_kwargs[SUMMARY_KEY]
    assert (digest["user"], digest["ai"], digest["tool"], digest["other"]) == (1, 1, 2, 1)
    assert "- 5 messages compressed" in compressed[0].content


@pytest.mark.parametrize("as_", ["FunctionMessage", "ChatMessage"])
def test_level_two_deletes_results_that_name_no_call(as_: str) -> None:
    # Two huge results of an older function_call: nothing pairs them with their call,
    # so level 2 deletes them (52c5fa6 kept them with it and refused the prompt).
    def result(text: str) -> BaseMessage:
        return (
            FunctionMessage(text, name="get")
            if as_ == "FunctionMessage"
            else ChatMessage(text, role="tool")
        )

    big = "word " * 8000
    call = AIMessage("", additional_kwargs={"function_call": {"name": "get", "arguments": "{}"}})
    messages = [
        SystemMessage("sys"),
        HumanMessage("old q"),
        AIMessage("old a"),
        HumanMessage("fetch both pages"),
        call,
        result(big),
        result(big),
        result("short answer of page 3"),
    ]
    compressor = ContextCompressor(
        compress_threshold=2000, force_delete_threshold=5000, error_threshold=10_000
    )
    compressed = compressor.compress(messages)
    assert compressor.measure(compressed) <= 5000
    assert compressed[-1] == messages[-1] and messages[3] in compressed


@pytest.mark.parametrize("as_", ["ToolMessage", "FunctionMessage", "ChatMessage"])
def test_tool_results_of_every_shape_are_folded_alike(as_: str) -> None:
    # A repeated output is counted, not repeated, and a tool's "next page" is no
    # pending work of the conversation's.
    def result(n: int) -> BaseMessage:
        text = "Result page 1 of 9; next page token abc " * 20
        if as_ == "ToolMessage":
            return ToolMessage(text, tool_call_id=f"c{n}", name="pages")
        if as_ == "FunctionMessage":
            return FunctionMessage(text, name="pages")
        return ChatMessage(text, role="tool")

    folded: list[BaseMessage] = []
    for n in range(3):
        folded += [HumanMessage(f"page {n}?"), *_tool_round(f"c{n}", 1)[:1], result(n)]
    compressor = ContextCompressor(compress_threshold=50, preserve_count=1, language="en")
    compressed = compressor.compress([*folded, HumanMessage("done?")])
    digest = compressed[0].additional_kwargs[SUMMARY_KEY]
    assert digest["pending"] == []
    if as_ == "ChatMessage":  # names neither its tool nor its call: no repeat of any tool's
        assert (digest["tool"], digest["repeats"], digest["tools"]) == (3, 0, ["sql"])
    else:
        assert (digest["tool"], digest["repeats"]) == (3, 2)


def test_a_tool_result_of_every_shape_keeps_its_call_when_cut() -> None:
    call = AIMessage(
        "Let me look. " * 200, tool_calls=[{"name": "get_weather", "args": {}, "id": "w"}]
    )
    for result in (
        ToolMessage("sunny", tool_call_id="w"),
        FunctionMessage("sunny", name="get_weather"),
        ChatMessage("sunny", role="tool"),
    ):
        messages = [HumanMessage("Weather?"), call, result, AIMessage("It is sunny.")]
        compressor = ContextCompressor(compress_threshold=50, preserve_count=2, language="en")
        kept = [m for m in compressor.compress(messages) if not isinstance(m, SystemMessage)]
        assert kept[-3:] == [call, result, messages[-1]], type(result).__name__


def test_folding_short_messages_never_makes_the_prompt_larger() -> None:
    # A summary has a size of its own: folding "hi"/"hello" would grow this prompt,
    # which must then not be deleted from (level 2) or refused (level 3).
    messages: list[BaseMessage] = [
        HumanMessage("hi"),
        AIMessage("hello"),
        HumanMessage("What were the totals for customer 42 last month? " * 20),
    ]
    size = estimate_tokens(messages)
    compressor = ContextCompressor(
        compress_threshold=size - 1, force_delete_threshold=size, error_threshold=size
    )
    assert compressor.compress(messages) == messages


@st.composite
def conversations(draw: st.DrawFn) -> list[BaseMessage]:
    """Turns opened by 1-3 questions (some ChatMessage "user"), with tool rounds of any size."""
    sizes = st.sampled_from([1, 5, 40, 400, 3000])
    messages: list[BaseMessage] = []
    calls = 0
    for turn in range(draw(st.integers(1, 5))):
        for n in range(draw(st.integers(1, 3))):
            text = f"question {turn}.{n} " + "word " * draw(sizes)
            if draw(st.booleans()):
                messages.append(HumanMessage(text))
            else:
                messages.append(ChatMessage(text, role="user"))
        for _ in range(draw(st.integers(0, 3))):
            calls += 1
            messages += _tool_round(f"c{calls}", draw(sizes))
        if draw(st.booleans()):
            messages.append(AIMessage("answer " + "word " * draw(sizes)))
    return messages


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    conversation=conversations(),
    shares=st.lists(st.floats(0.05, 1.5), min_size=3, max_size=3).map(sorted),
)
def test_compression_never_grows_a_prompt_nor_loses_the_latest_question(
    conversation: list[BaseMessage], shares: list[float]
) -> None:
    size = estimate_tokens(conversation)
    compress, force, error = (max(1, int(size * share)) for share in shares)
    compressor = ContextCompressor(
        compress_threshold=compress, force_delete_threshold=force, error_threshold=error
    )
    try:
        compressed = compressor.compress(conversation)
    except ContextOverflowError:
        assert size > error  # only a prompt that was over the limit is refused
        return
    assert compressor.measure(compressed) <= size
    validate_conversation(compressed)
    assert compressed[-1] == conversation[-1]
    # Every message kept is the original, in order; the last turn's question is kept whole.
    kept = [m for m in compressed if not summaries([m])]
    positions = [next(i for i, m in enumerate(conversation) if m is k) for k in kept]
    assert positions == sorted(positions)
    roles = [m.type == "human" or getattr(m, "role", "") == "user" for m in conversation]
    last = max(i for i, human in enumerate(roles) if human and (i == 0 or not roles[i - 1]))
    question = range(last, next((i for i in range(last, len(roles)) if not roles[i]), len(roles)))
    assert all(any(m is conversation[i] for m in compressed) for i in question)


def test_level_three_raises_with_the_numbers_and_advice() -> None:
    # The newest message alone is too large: nothing may be dropped to fit it.
    messages = [
        SystemMessage("s"),
        HumanMessage("hi"),
        AIMessage("ok"),
        HumanMessage("x " * 50_000),
    ]
    compressor = ContextCompressor(
        compress_threshold=1000, force_delete_threshold=2000, error_threshold=3000
    )
    with pytest.raises(ContextOverflowError, match="new session") as caught:
        compressor.compress(messages)
    assert caught.value.limit == 3000
    assert caught.value.estimated_tokens > 3000


def test_a_prompt_of_system_messages_only_raises_the_overflow_error() -> None:
    # Nothing after the system prompt to fold or delete: level 3, not an IndexError.
    compressor = ContextCompressor(
        compress_threshold=100, force_delete_threshold=200, error_threshold=300
    )
    with pytest.raises(ContextOverflowError, match="new session"):
        compressor.compress([SystemMessage("word " * 1000)])
    with pytest.raises(ContextOverflowError, match="new session"):
        compressor.compress([SystemMessage("short"), SystemMessage("word " * 1000)])


def test_tool_names_from_the_model_never_outgrow_the_summary() -> None:
    # A model looping in a tool's name (an invalid call), or calling a new tool each
    # step: the summary lists the latest names, each cut short, and stays small.
    looping = "lookup_" * 20_000
    old: list[BaseMessage] = [
        HumanMessage("find the invoice"),
        AIMessage("", tool_calls=[{"name": looping, "args": {}, "id": "c0"}]),
        ToolMessage("unknown tool", tool_call_id="c0", name=looping),
    ]
    for n in range(1, 500):
        name = f"tool_{n:03d}_" + "x" * 40
        old += [
            AIMessage("", tool_calls=[{"name": name, "args": {}, "id": f"c{n}"}]),
            ToolMessage(f"result {n}", tool_call_id=f"c{n}", name=name),
        ]
    old.append(AIMessage("sorry, that failed " + "filler " * 9000))
    new = [HumanMessage("try again please"), AIMessage("ok")]
    compressor = ContextCompressor(
        compress_threshold=6000, force_delete_threshold=8000, error_threshold=10000
    )
    compressed = compressor.compress(old + new)
    assert compressed[-2:] == new
    assert compressor.measure(compressed) < 1500
    summary = compressed[0]
    tools = summary.additional_kwargs[SUMMARY_KEY]["tools"]
    assert len(tools) == 32 and all(len(name) <= 64 for name in tools)
    assert tools[-1].startswith("tool_499_")
    # Compressing again flattens the old list into the new one, still bounded.
    again = compressor.compress([summary, *new, HumanMessage("x " * 7000), AIMessage("done")])
    assert len(again[0].additional_kwargs[SUMMARY_KEY]["tools"]) <= 32


def test_custom_prompts_label_the_summary_and_the_overflow_advice() -> None:
    en = PROMPTS["en"]
    labels = replace(en.compression, title="[SHRUNK]", roles={"human": "Q", "ai": "A"})
    house = replace(en, compression=replace(labels, overflow_advice="Call the desk."))
    messages: list[BaseMessage] = [SystemMessage("s")]
    for n in range(6):
        messages += [HumanMessage(f"问题 {n} " + "数据 " * 400), AIMessage(f"答案 {n}")]
    compressor = ContextCompressor(compress_threshold=500, prompts=house)
    (summary,) = summaries(compressor.compress(messages))  # a Chinese chat, the house labels
    assert summary.text.startswith("[SHRUNK]\nScope:")
    assert "    • Q: 问题 0" in summary.text and "    • A: 答案 0" in summary.text
    tight = ContextCompressor(
        compress_threshold=100, force_delete_threshold=200, error_threshold=300, prompts=house
    )
    with pytest.raises(ContextOverflowError, match="Call the desk"):
        tight.compress([HumanMessage("x " * 5000)])
    chinese = ContextCompressor(compress_threshold=500)  # the default follows the chat
    assert summaries(chinese.compress(messages))[0].text.startswith("[上下文压缩摘要]")


def test_as_a_runnable_in_front_of_a_model() -> None:
    model = RecordingChatModel(messages=replies("fine"))
    prompt = ChatPromptTemplate.from_messages(
        [("system", "ERP"), MessagesPlaceholder("history"), ("human", "{input}")]
    )
    history: list[BaseMessage] = []
    for n in range(4):
        history += lookup(n, "search_kb", document(5000, f"D{n}"), f"q{n}", f"a{n}")
    chain = prompt | ContextCompressor(compress_threshold=3000) | model
    assert chain.invoke({"history": history, "input": "now?"}).content == "fine"
    sent = model.prompts[-1]
    assert summaries(sent) and sent[-1].content == "now?"
    validate_conversation(sent)


async def test_ainvoke() -> None:
    compressor = ContextCompressor(compress_threshold=500)
    messages = [
        SystemMessage("s"),
        *lookup(1, "kb", document(5000, "A"), "q", "a"),
        HumanMessage("next"),
        AIMessage("ok"),
    ]
    assert await compressor.ainvoke(messages) == compressor.invoke(messages)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"compress_threshold": 0},
        {"compress_threshold": 10, "force_delete_threshold": 5},
        {"preserve_count": 0},
        {"language": "fr"},
    ],
)
def test_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ContextCompressor(**kwargs)


def test_screenshots_are_compressed_before_they_overflow_the_model() -> None:
    """200 screenshots of 1280x800 cost about 221k tokens on OpenAI and 273k on Anthropic:
    a 128k model's default compressor must not send them unchanged (at 85 tokens each
    they were estimated at 19k and sent as they were)."""
    shot = image_base64(1280, 800)
    messages: list[BaseMessage] = []
    for step in range(200):
        messages.append(
            HumanMessage(
                [
                    {"type": "text", "text": f"step {step}"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{shot}"}},
                ]
            )
        )
        messages.append(AIMessage(f"clicked {step}"))
    compressor = ContextCompressor()
    assert compressor.measure(messages) > 200 * 1366
    compressed = compressor.compress(messages)
    assert compressor.measure(compressed) <= compressor.compress_threshold
    assert compressed[-2:] == messages[-2:]
