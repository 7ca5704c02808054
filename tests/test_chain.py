"""create_tiered_chain: the assembled pipeline, sync and async, on real tiers.

Real archives (SQLite and MariaDB through the ``backup`` fixture), real Chroma
(embedded, and a ``chroma run`` server that a test stops), real background workers;
the scripted fake chat model of ``test_finish_reason.py`` stands in for the LLM and
records every prompt it is sent.
"""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_tiered_memory import (
    ContextCompressor,
    FinishReasonHandler,
    KnowledgeBase,
    MemoryConsolidator,
    MySQLBackup,
    SessionOwnershipError,
    TieredChatMessageHistory,
    create_tiered_chain,
    estimate_tokens,
)
from langchain_tiered_memory.core.prompts import PROMPTS
from langchain_tiered_memory.core.turns import tool_calls_of
from langchain_tiered_memory.core.validation import SESSION_DATE_KEY, InvalidSessionDateError
from langchain_tiered_memory.integrations.chain import (
    NOT_RUN,
    RetrievalFailedWarning,
    TieredChain,
)
from langchain_tiered_memory.integrations.finish_reason import MARK_KEY
from langchain_tiered_memory.tiers.compression import SUMMARY_KEY, validate_conversation
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .conftest import _free_port, chroma_settings
from .fakes import HashEmbeddings, ScriptedChatModel, cut, done, replies

MakeMemory = Callable[..., ChromaLongMemory]


@pytest.fixture
async def abackup(backup: MySQLBackup) -> AsyncIterator[MySQLBackup]:
    """The ``backup`` fixture, its async engine closed in the test's own event loop."""
    yield backup
    await backup.adispose()


def model(*answers: AIMessage | str, **kwargs: Any) -> ScriptedChatModel:
    """The given answers, then ``reply N`` forever; records every prompt."""

    def script() -> Iterator[AIMessage | str]:
        yield from answers
        yield from replies()

    return ScriptedChatModel(messages=script(), **kwargs)


def config(session_id: str, user_id: str | None = None) -> dict[str, Any]:
    configurable = {"session_id": session_id}
    if user_id is not None:
        configurable["user_id"] = user_id
    return {"configurable": configurable}


def texts(messages: list[BaseMessage]) -> list[str]:
    return [m.text for m in messages]


def archived(backup: MySQLBackup, session_id: str) -> list[BaseMessage]:
    return backup.get_messages(session_id)


def system_text(prompt: list[BaseMessage]) -> str:
    assert isinstance(prompt[0], SystemMessage)
    return prompt[0].text


# -- the recall promise ------------------------------------------------------------


def test_a_fact_from_an_early_session_is_recalled_in_a_later_one(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    long_memory = make_memory(start_worker=True, poll_interval=0.05)  # raw turns, no extractor
    llm = model()
    chat = create_tiered_chain(
        llm, backup=backup, long_memory=long_memory, memory_scope="user", window_turns=2, k=3
    )
    chat.invoke({"input": "My warehouse code is WH-7731, please remember it."}, config("s1", "u1"))
    for question in ("What is the capital of France?", "Write a haiku", "How do I sort a list?"):
        chat.invoke(question, config("s1", "u1"))
    long_memory.flush(timeout=30)

    window = TieredChatMessageHistory("s1", user_id="u1", backup=backup, window_turns=2).messages
    assert window and not any("WH-7731" in text for text in texts(window))  # moved past it

    chat.invoke({"input": "Which warehouse code did I give you?"}, config("s2", "u1"))
    prompt = llm.prompts[-1]
    assert "WH-7731" in system_text(prompt)  # recalled from the long-term tier
    assert not any("WH-7731" in text for text in texts(prompt[1:]))  # not from any window
    assert prompt[-1] == HumanMessage("Which warehouse code did I give you?")

    chat.invoke("And my warehouse code again?", config("s1", "u1"))  # same session, window past it
    assert "WH-7731" in system_text(llm.prompts[-1])
    # Another user never sees it.
    chat.invoke("Which warehouse code did I give you?", config("s3", "u2"))
    assert "WH-7731" not in " ".join(texts(llm.prompts[-1]))


# -- input, output, archive --------------------------------------------------------


def test_invoke_accepts_dicts_strings_and_messages_and_archives_each_turn(
    backup: MySQLBackup,
) -> None:
    llm = model("first", "second", "third")
    chat = create_tiered_chain(llm, backup=backup)
    answer = chat.invoke({"input": "q1", "other": "ignored"}, config("s"))
    assert isinstance(answer, AIMessage) and answer.content == "first"
    assert chat.invoke("q2", config("s")).content == "second"
    assert chat.invoke(HumanMessage("q3"), config("s")).content == "third"
    stored = archived(backup, "s")
    assert [(m.type, m.text) for m in stored] == [
        ("human", "q1"), ("ai", "first"), ("human", "q2"), ("ai", "second"),
        ("human", "q3"), ("ai", "third"),
    ]  # fmt: skip
    # The window of earlier turns is in the third prompt, between system and question.
    third = llm.prompts[2]
    assert texts(third[1:]) == ["q1", "first", "q2", "second", "q3"]
    assert "Recent conversation" in system_text(third)

    custom = create_tiered_chain(model("ok"), backup=backup, input_key="question")
    assert custom.invoke({"question": "q"}, config("t")).content == "ok"


def test_a_human_message_input_is_sent_and_archived_whole(backup: MySQLBackup) -> None:
    llm = model("A cat.", "Yes.")
    knowledge = InMemoryVectorStore(HashEmbeddings())
    knowledge.add_texts(["Cats are small felines."])
    chat = create_tiered_chain(llm, backup=backup, knowledge=knowledge.as_retriever(k=1))
    image = {"type": "image", "url": "https://example.com/cat.png"}
    question = HumanMessage(
        [{"type": "text", "text": "What is in this picture?"}, image],
        id="q-1",
        additional_kwargs={SESSION_DATE_KEY: "2023-05-08"},
    )
    chat.invoke(question, config("s"))

    sent = llm.prompts[0][-1]
    assert image in sent.content  # the model sees the picture, after the knowledge block
    assert "Cats are small felines." in sent.text and "What is in this picture?" in sent.text
    [human, _] = archived(backup, "s")
    assert human == question  # its blocks, id and session date, as given
    with pytest.raises(InvalidSessionDateError):
        bad = HumanMessage("hi", additional_kwargs={SESSION_DATE_KEY: "someday"})
        chat.invoke(bad, config("s"))
    assert len(llm.prompts) == 1  # refused before the model


def test_bad_input_and_config_are_clear_errors_and_write_nothing(backup: MySQLBackup) -> None:
    llm = model()
    chat = create_tiered_chain(llm, backup=backup)
    with pytest.raises(ValueError, match="session_id"):
        chat.invoke("q")
    with pytest.raises(ValueError, match="session_id"):
        chat.invoke("q", {"configurable": {"user_id": "u"}})
    with pytest.raises(KeyError, match="no 'input' key"):
        chat.invoke({"question": "q"}, config("s"))
    with pytest.raises(TypeError, match="must be a str"):
        chat.invoke({"input": 42}, config("s"))
    with pytest.raises(ValueError, match="control character"):
        chat.invoke("q", config("bad\x00id"))
    with pytest.raises(ValueError, match="session_id must not be empty"):
        list(chat.stream("q", config("")))
    assert llm.prompts == []
    assert archived(backup, "s") == []


@pytest.mark.usefixtures("abackup")
async def test_async_missing_session_is_a_clear_error(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model(), backup=backup)
    with pytest.raises(ValueError, match="session_id"):
        await chat.ainvoke("q")
    with pytest.raises(ValueError, match="session_id"):
        [chunk async for chunk in chat.astream("q")]


def test_bad_settings_are_typed_errors(
    backup: MySQLBackup, make_memory: MakeMemory, tmp_path: Path
) -> None:
    llm = model()
    for kwargs, error in (
        ({"language": "fr"}, ValueError),
        ({"memory_scope": "global"}, ValueError),
        ({"k": 0}, ValueError),
        ({"knowledge_k": True}, TypeError),
        ({"retrieval_errors": "ignore"}, ValueError),
        ({"window_turns": 0}, ValueError),
        ({"knowledge": ["not", "a", "retriever"]}, TypeError),
        ({"compressor": "small"}, TypeError),
        ({"input_key": ""}, ValueError),
    ):
        with pytest.raises(error):
            create_tiered_chain(llm, backup=backup, **kwargs)
    with pytest.raises(TypeError, match="llm must be"):
        create_tiered_chain("gpt-4o", backup=backup)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="windw_turns"):  # a misspelt option is refused
        create_tiered_chain(llm, backup=backup, windw_turns=3)  # type: ignore[call-arg]
    other = MySQLBackup(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        with pytest.raises(ValueError, match="same backup"):
            create_tiered_chain(llm, backup=other, long_memory=make_memory())
    finally:
        other.dispose()
    user_scoped = create_tiered_chain(
        llm, backup=backup, long_memory=make_memory(), memory_scope="user"
    )
    with pytest.raises(ValueError, match="user_id"):
        user_scoped.invoke("q", config("s"))


def test_defaults_wrap_the_llm_and_pick_the_tiers_archive(make_memory: MakeMemory) -> None:
    long_memory = make_memory()
    chat = create_tiered_chain(model(), long_memory=long_memory, max_continuations=5)
    assert isinstance(chat, TieredChain)
    assert chat.backup is long_memory.backup  # no backup=: the tiers' archive
    assert isinstance(chat.llm, FinishReasonHandler) and chat.llm.max_continuations == 5
    assert isinstance(chat.compressor, ContextCompressor)
    handler = FinishReasonHandler(model(), max_continuations=1)
    assert create_tiered_chain(handler, long_memory=long_memory).llm is handler


# -- streaming and the write-after-complete rule -----------------------------------


def test_stream_yields_chunks_and_archives_only_after_the_last(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model("the answer is forty two"), backup=backup)
    chunks: list[AIMessageChunk] = []
    for chunk in chat.stream({"input": "q"}, config("s")):
        assert isinstance(chunk, AIMessageChunk)
        if not chunks:
            assert archived(backup, "s") == []  # nothing written while streaming
        chunks.append(chunk)
    assert len(chunks) > 3
    assert "".join(c.text for c in chunks) == "the answer is forty two"
    stored = archived(backup, "s")
    assert [(m.type, m.text) for m in stored] == [
        ("human", "q"),
        ("ai", "the answer is forty two"),
    ]
    assert isinstance(stored[1], AIMessage)  # a full message, not a chunk


@pytest.mark.usefixtures("abackup")
async def test_astream_yields_chunks_and_archives_only_after_the_last(
    backup: MySQLBackup,
) -> None:
    chat = create_tiered_chain(model("streamed asynchronously here"), backup=backup)
    chunks = []
    async for chunk in chat.astream("q", config("s")):
        if not chunks:
            assert await backup.aget_messages("s") == []
        chunks.append(chunk)
    assert "".join(c.text for c in chunks) == "streamed asynchronously here"
    assert texts(await backup.aget_messages("s")) == ["q", "streamed asynchronously here"]


@pytest.mark.usefixtures("abackup")
async def test_a_caller_that_stops_at_the_last_chunk_finds_the_turn_archived(
    backup: MySQLBackup,
) -> None:
    """The last chunk (``chunk_position="last"``) goes out after the turn is archived: a
    caller that stops there, or a client that disconnects after the last event, had the
    whole answer while the turn was never kept."""
    chat = create_tiered_chain(model("the answer is 42", "the answer is 43"), backup=backup)
    for chunk in chat.stream("what is it?", config("s")):
        if chunk.chunk_position == "last":
            assert texts(archived(backup, "s")) == ["what is it?", "the answer is 42"]
            break
    else:
        pytest.fail("no last chunk")
    async for chunk in chat.astream("and now?", config("s")):
        if chunk.chunk_position == "last":
            stored = texts(await backup.aget_messages("s"))
            assert stored[-2:] == ["and now?", "the answer is 43"]
            break
    else:
        pytest.fail("no last chunk")


def test_an_llm_error_mid_stream_writes_nothing(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model("one two three four", fail_after=3), backup=backup)
    received = []
    with pytest.raises(ConnectionError, match="mid-stream"):
        for chunk in chat.stream("q", config("s")):
            received.append(chunk)
    assert received  # the answer had started
    assert archived(backup, "s") == []


@pytest.mark.usefixtures("abackup")
async def test_an_llm_error_mid_astream_writes_nothing(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model("one two three four", fail_after=3), backup=backup)
    with pytest.raises(ConnectionError, match="mid-stream"):
        async for _ in chat.astream("q", config("s")):
            pass
    assert await backup.aget_messages("s") == []


def test_an_llm_error_in_invoke_and_an_abandoned_stream_write_nothing(
    backup: MySQLBackup,
) -> None:
    class Broken(ScriptedChatModel):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            msg = "provider returned 500"
            raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="500"):
        create_tiered_chain(Broken(messages=iter([])), backup=backup).invoke("q", config("s"))
    stream = create_tiered_chain(model("a b c d e"), backup=backup).stream("q", config("s"))
    next(stream)
    stream.close()  # the consumer went away (a closed HTTP connection)
    del stream
    gc.collect()
    assert archived(backup, "s") == []


# -- truncation --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_the_archive_keeps_the_truncation_mark(backup: MySQLBackup, mode: str) -> None:
    llm = model(cut("The report"), cut(" goes on"), cut(" and on"))
    chat = create_tiered_chain(llm, backup=backup, max_continuations=2)
    if mode == "invoke":
        answer: BaseMessage = chat.invoke("write a report", config("s"))
    else:
        chunks = list(chat.stream("write a report", config("s")))
        answer = chunks[0]
        for chunk in chunks[1:]:
            answer = answer + chunk  # type: ignore[operator]
    assert answer.text == "The report goes on and on"
    assert answer.response_metadata[MARK_KEY] == {"continuations": 2, "truncated": True}
    stored = archived(backup, "s")[-1]
    assert stored.text == "The report goes on and on"
    assert stored.response_metadata[MARK_KEY] == {"continuations": 2, "truncated": True}
    assert stored.response_metadata["finish_reason"] == "length"
    # Continuations resend the assembled prompt, then the partial answer.
    assert llm.prompts[1][: len(llm.prompts[0])] == llm.prompts[0]


@pytest.mark.usefixtures("abackup")
async def test_ainvoke_continues_a_truncated_answer(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model(cut("half"), done(" and the rest")), backup=backup)
    answer = await chat.ainvoke("q", config("s"))
    assert answer.content == "half and the rest"
    stored = (await backup.aget_messages("s"))[-1]
    assert stored.response_metadata[MARK_KEY] == {"continuations": 1, "truncated": False}


# -- the v3 prompt -----------------------------------------------------------------


def test_knowledge_documents_go_into_the_prompt(backup: MySQLBackup, chroma_client: Any) -> None:
    store = InMemoryVectorStore(HashEmbeddings())
    store.add_documents(
        [
            Document("Invoices are due thirty days after issue.", metadata={"source": "ar.md"}),
            Document("Deployments happen on Fridays.", metadata={"source": "ops.md"}),
        ]
    )
    llm = model()
    retriever = store.as_retriever(search_kwargs={"k": 1})
    chat = create_tiered_chain(llm, backup=backup, knowledge=retriever)
    chat.invoke("When are invoices due?", config("s"))
    question = llm.prompts[-1][-1]
    assert isinstance(question, HumanMessage)
    assert question.text == (
        "## Reference material (knowledge base)\n"
        "[1] ar.md\nInvoices are due thirty days after issue.\n\n"
        "## User question\nWhen are invoices due?"
    )
    assert archived(backup, "s")[0] == HumanMessage("When are invoices due?")  # not the docs

    kb = KnowledgeBase(
        client=chroma_client, embedding=HashEmbeddings(), collection_name=f"kb_{uuid.uuid4().hex}"
    )
    try:
        kb.add_texts(["The AP table lists vendors.", "Reminders go out on Mondays."])
        with_kb = create_tiered_chain(llm, backup=backup, knowledge=kb, knowledge_k=1)
        with_kb.invoke("Which day do reminders go out?", config("t"))
        assert "Reminders go out on Mondays." in llm.prompts[-1][-1].text
        assert "vendors" not in llm.prompts[-1][-1].text
    finally:
        chroma_client.delete_collection(kb.collection.name)


@pytest.mark.usefixtures("abackup")
async def test_chinese_labels_and_layout(backup: MySQLBackup, make_memory: MakeMemory) -> None:
    long_memory = make_memory()
    knowledge = KnowledgeBase.from_long_memory(
        long_memory, collection_name=f"kb_{uuid.uuid4().hex}"
    )
    try:
        knowledge.add_texts(["应收账款表 ar_invoice 有发票号、金额和到期日。"])
        llm = model("好的，记住了。", "ar_invoice 表。")
        chat = create_tiered_chain(
            llm, backup=backup, long_memory=long_memory, knowledge=knowledge, language="zh"
        )
        await chat.ainvoke({"input": "我负责应收账款模块"}, config("s"))
        long_memory.flush(timeout=30)
        await chat.ainvoke({"input": "应收账款表叫什么？"}, config("s"))
        prompt = llm.prompts[-1]
        system = system_text(prompt)
        assert system.startswith(PROMPTS["zh"].chain.system)
        assert system.index("## 历史对话摘要") < system.index("## 最近通话记录")
        assert "我负责应收账款模块" in system  # the first turn, recalled
        assert texts(prompt[1:-1]) == ["我负责应收账款模块", "好的，记住了。"]  # the window
        last = prompt[-1].text
        assert last.startswith("## 资料（知识库）\n[1]\n应收账款表 ar_invoice")
        assert last.endswith("## 用户问题\n应收账款表叫什么？")
        assert not any(label in system + last for label in astuple(PROMPTS["en"].chain))
        assert chat.compressor.language == "zh"  # type: ignore[attr-defined]
        assert chat.llm.continue_prompt == PROMPTS["zh"].continue_prompt
    finally:
        knowledge.client.delete_collection(knowledge.collection.name)


@pytest.mark.usefixtures("abackup")
async def test_custom_prompts_reach_the_llm(backup: MySQLBackup) -> None:
    en = PROMPTS["en"]
    labels = replace(en.chain, system="HOUSE RULES", recent="EARLIER", recent_note="(turns)")
    labels = replace(labels, knowledge="DOCS", question="ASKED")
    house = replace(en, continue_prompt="GO ON", chain=labels)
    llm = model("first", cut("half"), done(" whole"))
    docs = RunnableLambda(lambda _: [Document("AR lives in ar_invoice.")])
    chat = create_tiered_chain(llm, backup=backup, knowledge=docs, prompts=house)
    chat.invoke({"input": "hello"}, config("house"))
    answer = await chat.ainvoke({"input": "Where is AR?"}, config("house"))
    assert answer.text == "half whole"
    prompt = llm.prompts[1]
    assert system_text(prompt) == "HOUSE RULES\n\n## EARLIER\n(turns)"
    assert prompt[-1].text == "## DOCS\n[1]\nAR lives in ar_invoice.\n\n## ASKED\nWhere is AR?"
    assert llm.prompts[2][-1] == HumanMessage("GO ON")
    with pytest.raises(TypeError, match="prompts must be a Prompts"):
        create_tiered_chain(llm, backup=backup, prompts={"system": "x"})  # type: ignore[typeddict-item]


def test_consolidated_memory_md_goes_into_the_prompt(backup: MySQLBackup, tmp_path: Path) -> None:
    consolidator = MemoryConsolidator(
        model("## User preferences\n- prefers the dark mode"),
        root=tmp_path / "memory",
        backup=backup,
        threshold=2,
        batch=2,
        start_worker=False,
    )
    try:
        llm = model()
        chat = create_tiered_chain(llm, backup=backup, consolidator=consolidator)
        chat.invoke("I like dark mode", config("s"))
        chat.invoke("Anything else?", config("s"))
        consolidator.flush(timeout=30)
        chat.invoke("Which mode do I prefer?", config("s"))
        system = system_text(llm.prompts[-1])
        assert (
            "### Consolidated memory (MEMORY.md)\n## User preferences\n- prefers the dark mode"
        ) in system
    finally:
        consolidator.close()


def long_turn(n: int) -> list[BaseMessage]:
    return [HumanMessage(f"question {n} " + "detail " * 60), AIMessage(f"answer {n} " + "x " * 120)]


@pytest.mark.usefixtures("abackup")
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_compression_kicks_in_over_budget(backup: MySQLBackup, mode: str) -> None:
    history = TieredChatMessageHistory("s", backup=backup)
    for n in range(6):
        history.add_messages(long_turn(n))
    small = ContextCompressor(
        compress_threshold=1_000,
        force_delete_threshold=5_000,
        error_threshold=10_000,
        preserve_count=2,
    )
    llm = model()
    roomy = create_tiered_chain(llm, backup=backup, window_max_tokens=None)
    tight = create_tiered_chain(llm, backup=backup, window_max_tokens=None, compressor=small)
    full = roomy.get_prompt("final question", config("s"))
    assert len(full) == 1 + 12 + 1 and small.measure(full) > 1_000  # over the small budget
    if mode == "invoke":
        tight.invoke("final question", config("s"))
    else:
        await tight.ainvoke("final question", config("s"))
    sent = llm.prompts[-1]
    summaries = [m for m in sent if SUMMARY_KEY in m.additional_kwargs]
    assert len(summaries) == 1 and summaries[0].text.startswith("[Context compression summary]")
    assert sent[0].text == full[0].text  # the system prompt stays first, intact
    assert sent[-2:] == full[-2:]  # the newest messages are kept verbatim
    assert len(sent) < len(full) and small.measure(sent) <= 1_000
    assert len(archived(backup, "s")) == 14  # compression never touches the archive


# -- failing tiers -----------------------------------------------------------------


class FlakyEmbeddings(HashEmbeddings):
    """An embedding service that can go down (queries fail; stored vectors remain)."""

    down = False

    def embed_query(self, text: str) -> list[float]:
        if self.down:
            msg = "embedding service unreachable"
            raise ConnectionError(msg)
        return super().embed_query(text)


def test_a_failing_memory_search_warns_and_answers_without_memories(
    backup: MySQLBackup, make_memory: MakeMemory, caplog: pytest.LogCaptureFixture
) -> None:
    embedding = FlakyEmbeddings()
    long_memory = make_memory(embedding=embedding)
    llm = model()
    chat = create_tiered_chain(llm, backup=backup, long_memory=long_memory)
    chat.invoke("My warehouse code is WH-7731", config("s"))
    long_memory.flush(timeout=30)
    embedding.down = True
    with (
        caplog.at_level(logging.WARNING, logger="langchain_tiered_memory.integrations.chain"),
        pytest.warns(RetrievalFailedWarning, match="long-term memory search failed"),
    ):
        answer = chat.invoke("What is my warehouse code?", config("s"))
    assert answer.content == "reply 2"
    assert "embedding service unreachable" in caplog.text
    assert "WH-7731" not in system_text(llm.prompts[-1]).split("## Recent")[0]
    assert len(archived(backup, "s")) == 4  # the turn is archived all the same

    strict = create_tiered_chain(
        llm, backup=backup, long_memory=long_memory, retrieval_errors="raise"
    )
    with pytest.raises(ConnectionError, match="unreachable"):
        strict.invoke("again?", config("s"))
    assert len(archived(backup, "s")) == 4


@pytest.fixture
def stoppable_chroma(tmp_path: Path) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    """A ``chroma run`` server of this test's own, which the test may stop."""
    import chromadb

    port = _free_port()
    log = (tmp_path / "chroma.log").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("chroma")), "run", "--path", str(tmp_path / "data"),
         "--port", str(port), "--host", "127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                probe = chromadb.HttpClient(host="127.0.0.1", port=port, settings=chroma_settings())
                probe.heartbeat()
                probe.close()
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    log_text = (tmp_path / "chroma.log").read_text()
                    pytest.fail(f"chroma run did not start: {log_text}")
                time.sleep(0.1)
        yield "127.0.0.1", port, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=15)
        log.close()


@pytest.mark.usefixtures("abackup")
async def test_a_chroma_server_gone_only_warns(
    backup: MySQLBackup,
    make_memory: MakeMemory,
    stoppable_chroma: tuple[str, int, subprocess.Popen[bytes]],
) -> None:
    host, port, server = stoppable_chroma
    long_memory = make_memory(host=host, port=port)
    try:
        await _chroma_gone(backup, long_memory, server)
    finally:
        long_memory.client.close()  # its HTTP connections


async def _chroma_gone(
    backup: MySQLBackup, long_memory: ChromaLongMemory, server: subprocess.Popen[bytes]
) -> None:
    knowledge = KnowledgeBase.from_long_memory(long_memory)
    knowledge.add_texts(["Warehouse codes start with WH."])
    llm = model()
    chat = create_tiered_chain(llm, backup=backup, long_memory=long_memory, knowledge=knowledge)
    chat.invoke("My warehouse code is WH-7731", config("s"))
    long_memory.flush(timeout=30)
    assert "Warehouse codes start with WH." in llm.prompts[-1][-1].text

    server.terminate()
    server.wait(timeout=15)
    with pytest.warns(RetrievalFailedWarning, match="knowledge base retrieval failed"):
        answer = chat.invoke("What is my warehouse code?", config("s"))
    assert answer.content == "reply 2"
    prompt = llm.prompts[-1]
    assert prompt[-1] == HumanMessage("What is my warehouse code?")  # no documents section
    assert "WH-7731" in system_text(prompt)  # memories are served from the archive's catalog
    with pytest.warns(RetrievalFailedWarning, match="knowledge base retrieval failed"):
        answer = await chat.ainvoke("And in async?", config("s"))
    assert answer.content == "reply 3"
    assert texts(archived(backup, "s"))[-2:] == ["And in async?", "reply 3"]


def test_a_knowledge_retriever_may_return_any_iterable_of_documents(backup: MySQLBackup) -> None:
    llm = model()
    knowledge = RunnableLambda(lambda q: (Document(text) for text in ["AR lives in ar_invoice."]))
    create_tiered_chain(llm, backup=backup, knowledge=knowledge).invoke("q", config("s"))
    assert "AR lives in ar_invoice." in llm.prompts[-1][-1].text


@pytest.mark.parametrize("result", [None, {"doc": "text"}, 7])
@pytest.mark.usefixtures("abackup")
async def test_a_knowledge_retriever_that_returns_no_documents_is_a_failed_tier(
    backup: MySQLBackup, result: Any
) -> None:
    """Warned and left out as a raising retriever is (``None`` raised a bare TypeError
    past the warning; a dict became documents of its keys)."""
    llm = model()
    knowledge = RunnableLambda(lambda question: result)
    chat = create_tiered_chain(llm, backup=backup, knowledge=knowledge)
    with pytest.warns(RetrievalFailedWarning, match="knowledge base retrieval failed.*not docu"):
        assert chat.invoke("q", config("s")).content == "reply 1"
    with pytest.warns(RetrievalFailedWarning, match="knowledge base retrieval failed.*not docu"):
        assert (await chat.ainvoke("q2", config("s"))).content == "reply 2"
    assert llm.prompts[-1][-1] == HumanMessage("q2")  # no documents section
    strict = create_tiered_chain(llm, backup=backup, knowledge=knowledge, retrieval_errors="raise")
    with pytest.raises(TypeError, match="not documents"):
        strict.invoke("q3", config("s"))


@pytest.mark.usefixtures("abackup")
async def test_a_tool_call_of_the_answer_is_archived_with_a_not_run_result(
    backup: MySQLBackup,
) -> None:
    """A model bound to tools may answer with calls, which the chain does not run: each
    gets a stand-in result, so later prompts never carry a call without its result
    (providers refuse them)."""
    calls = [{"name": "lookup", "args": {"q": "x"}, "id": "call_1"}]
    idless = [{"name": "lookup", "args": {"q": "y"}, "id": None}]
    llm = model(AIMessage("", tool_calls=calls), "ok", AIMessage("", tool_calls=idless))
    chat = create_tiered_chain(llm, backup=backup)
    answer = chat.invoke("look x up", config("s"))
    assert answer.tool_calls[0]["id"] == "call_1"  # the caller still gets the calls
    chat.invoke("next question", config("s"))
    prompt = llm.prompts[-1]
    [result] = [m for m in prompt if isinstance(m, ToolMessage)]
    assert (result.tool_call_id, result.content) == ("call_1", NOT_RUN)
    validate_conversation(prompt)
    await chat.ainvoke("again", config("s"))  # a call without an id gets one
    stored = await backup.aget_messages("s")
    assert [m.type for m in stored] == ["human", "ai", "tool", "human", "ai", "human", "ai", "tool"]
    call_id = stored[-2].tool_calls[0]["id"]
    assert call_id and stored[-1].tool_call_id == call_id


def _use(call_id: str | None, key: str = "id") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_use", "name": "lookup", "input": {"q": "x"}}
    if call_id is not None:
        block[key] = call_id
    return block


#: Answers making one call each, given both as a tools_calls entry and a content block.
ONE_CALL_TWICE = {
    "both of id ''": ("", ""),
    "an entry without an id, a block of id ''": (None, ""),
    "neither with an id": (None, None),
    "an entry without an id, a block with one": (None, "toolu_1"),
}


@pytest.mark.parametrize("case", list(ONE_CALL_TWICE))
def test_a_call_given_twice_in_the_answer_is_archived_as_one_call_with_one_result(
    backup: MySQLBackup, case: str
) -> None:
    """A call in ``tool_calls`` and as a content block (Anthropic's shape) is one call:
    the chain named the entry of id ``""`` or none anew, not its block, so the archive
    held two calls with two results and the window counted its arguments twice."""
    entry_id, block_id = ONE_CALL_TWICE[case]
    calls = [{"name": "lookup", "args": {"q": "x"}, "id": entry_id}]
    answer = AIMessage([{"type": "text", "text": "checking"}, _use(block_id)], tool_calls=calls)
    chat = create_tiered_chain(model(answer), backup=backup)
    chat.invoke("look x up", config("s"))
    _, stored_answer, *results = backup.get_messages("s")
    assert len(tool_calls_of(stored_answer)) == 1
    [result] = results
    assert result.tool_call_id == tool_calls_of(stored_answer)[0]["id"]
    assert estimate_tokens([stored_answer]) == estimate_tokens([answer])
    validate_conversation(TieredChatMessageHistory("s", backup=backup).messages)


def test_no_warning_when_every_tier_answers(backup: MySQLBackup, make_memory: MakeMemory) -> None:
    chat = create_tiered_chain(model(), backup=backup, long_memory=make_memory())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RetrievalFailedWarning)
        chat.invoke("q", config("s"))


# -- async means async -------------------------------------------------------------


@pytest.mark.usefixtures("abackup")
async def test_async_paths_use_the_async_archive(
    backup: MySQLBackup, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = create_tiered_chain(model("a b", "c d"), backup=backup)
    chat.invoke("warm-up", config("s"))  # leaves a window to read

    def sync_call(*args: Any, **kwargs: Any) -> Any:
        msg = "a sync archive call on the async path"
        raise AssertionError(msg)

    monkeypatch.setattr(MySQLBackup, "tail", sync_call)
    monkeypatch.setattr(MySQLBackup, "add_messages", sync_call)
    answer = await chat.ainvoke("q1", config("s"))
    chunks = [chunk async for chunk in chat.astream("q2", config("s"))]
    assert answer.content == "c d"
    assert "".join(c.text for c in chunks) == "reply 1"
    monkeypatch.undo()
    assert texts(archived(backup, "s")) == ["warm-up", "a b", "q1", "c d", "q2", "reply 1"]


def test_batch_runs_sessions_independently(backup: MySQLBackup) -> None:
    chat = create_tiered_chain(model(), backup=backup)
    answers = chat.batch(["q-a", "q-b"], [config("a"), config("b")])
    assert all(isinstance(answer, AIMessage) for answer in answers)
    assert texts(archived(backup, "a"))[0] == "q-a"
    assert texts(archived(backup, "b"))[0] == "q-b"


@pytest.mark.usefixtures("abackup")
async def test_astream_events_reports_every_step(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    llm = model("hello there friend")
    chat = create_tiered_chain(llm, backup=backup, long_memory=make_memory())
    seen: dict[str, set[str]] = {}
    async for event in chat.astream_events("hi", config("s"), version="v2"):
        seen.setdefault(event["event"], set()).add(event["name"])
    assert {"TieredChain", "ContextCompressor", "FinishReasonHandler"} <= seen["on_chain_start"]
    assert "LongMemoryRetriever" in seen["on_retriever_start"]
    assert "ScriptedChatModel" in seen["on_chat_model_stream"]  # tokens reach a front end
    assert texts(await backup.aget_messages("s")) == ["hi", "hello there friend"]


# -- a session belongs to its user ----------------------------------------------------


@pytest.mark.usefixtures("abackup")
@pytest.mark.parametrize("mode", ["invoke", "stream", "ainvoke", "astream"])
async def test_another_users_session_is_refused_before_the_llm(
    backup: MySQLBackup, make_memory: MakeMemory, tmp_path: Path, mode: str
) -> None:
    memory = make_memory()
    consolidator = MemoryConsolidator(
        model("- alice's cat is Miso"),
        root=tmp_path / "memory",
        backup=backup,
        threshold=1,
        batch=1,
        start_worker=False,
    )
    try:
        llm = model("Miso, your cat.")
        chat = create_tiered_chain(
            llm, backup=backup, long_memory=memory, consolidator=consolidator
        )
        chat.invoke("My cat is Miso.", config("s", "alice"))
        memory.run_pending()
        consolidator.run_pending()
        before = archived(backup, "s")
        calls = len(llm.prompts)

        question = "What is my cat called?"
        for user in ("bob", None):  # None: a call without a user cannot write here
            # A failing MEMORY.md read would only warn: a refusal must not.
            with warnings.catch_warnings():
                warnings.simplefilter("error", RetrievalFailedWarning)
                with pytest.raises(SessionOwnershipError):
                    if mode == "invoke":
                        chat.invoke(question, config("s", user))
                    elif mode == "stream":
                        list(chat.stream(question, config("s", user)))
                    elif mode == "ainvoke":
                        await chat.ainvoke(question, config("s", user))
                    else:
                        [chunk async for chunk in chat.astream(question, config("s", user))]
        assert len(llm.prompts) == calls  # nothing of alice's was sent anywhere
        assert archived(backup, "s") == before
        # Bob's own session works, and alice goes on in hers.
        chat.invoke("hello", config("bob-s", "bob"))
        chat.invoke(question, config("s", "alice"))
        assert "Miso" in system_text(llm.prompts[-1])
    finally:
        consolidator.close()
