"""Time in the long-term tier: when each memory's turn happened, and search by it.

Issue 13 item 3. A message may carry its conversation's date
(``additional_kwargs["session_date"]``); the memory of its turn is dated by it,
otherwise by when the turn was archived. ``search`` (sync and async) and the
retriever filter on that date, and every prompt shows it beside the memory, so a
"when did ..." question can be answered.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory, create_tiered_chain
from langchain_tiered_memory.core.prompts import memory_line
from langchain_tiered_memory.core.validation import (
    SESSION_DATE_KEY,
    InvalidSessionDateError,
    parse_session_date,
    time_bound,
)
from langchain_tiered_memory.storage.base import utcnow
from langchain_tiered_memory.tiers.long_memory import EXACT_LIMIT, ChromaLongMemory, retrieval

from .fakes import ScriptedChatModel, replies
from .long_memory_support import catalog, without_column

MakeMemory = Callable[..., ChromaLongMemory]
EVAL = Path(
    os.environ.get("TIERED_MEMORY_EVAL", Path(__file__).resolve().parents[2] / "shared/eval")
)


def dated(text: str, when: str, *, ai: str = "Noted.") -> list[Any]:
    """A turn whose messages say when their conversation took place."""
    return [
        HumanMessage(text, additional_kwargs={SESSION_DATE_KEY: when}),
        AIMessage(ai, additional_kwargs={SESSION_DATE_KEY: when}),
    ]


def history(backup: MySQLBackup, memory: ChromaLongMemory, session_id: str, user_id: str = "u1"):
    return TieredChatMessageHistory(session_id, user_id=user_id, backup=backup, long_memory=memory)


# -- the date of a memory ------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2023-05-08", datetime(2023, 5, 8)),
        ("2023-05-08T13:56:00", datetime(2023, 5, 8, 13, 56)),
        ("2023-05-08T15:56:00+02:00", datetime(2023, 5, 8, 13, 56)),  # stored as UTC
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),  # LoCoMo's form
        ("12:05 am on 1 January, 2024", datetime(2024, 1, 1, 0, 5)),
        ("8 May 2023", datetime(2023, 5, 8)),
        ("May 8, 2023", datetime(2023, 5, 8)),
        ("1:56 pm on May 8, 2023", datetime(2023, 5, 8, 13, 56)),
        ("2023年5月8日", datetime(2023, 5, 8)),  # the year first, as Chinese writes it
        ("2023年5月8日 13:56", datetime(2023, 5, 8, 13, 56)),
        ("2023/05/08", datetime(2023, 5, 8)),
        ("2023-5-8", datetime(2023, 5, 8)),
        ("2023年5月11日13:56", datetime(2023, 5, 11, 13, 56)),
    ],
)
def test_session_dates_in_iso_and_locomo_form_are_read(given: str, expected: datetime) -> None:
    assert parse_session_date(given) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "yesterday",
        "2023-13-01",
        "31 February, 2023",
        "13:00 pm on 8 May, 2023",
        20230508,
        "08.05.2023",  # 8 May or 5 August: refused, not guessed
        "2023年2月31日",
        "2023/5/8 25:00",
        "May 2023",
        "2023/5/113:56",  # 1 May 13:56 or 11 May 3:56: refused
    ],
)
def test_a_bad_session_date_is_a_typed_error_naming_it(bad: Any) -> None:
    with pytest.raises(InvalidSessionDateError, match=str(bad)):
        parse_session_date(bad)


@pytest.mark.parametrize(
    "bad",
    # Valid dates whose UTC is outside the years 1-9999.
    ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00", "0001-01-01T03:00:00+03:01"],
)
def test_a_date_that_leaves_the_calendar_in_utc_is_a_typed_error(
    make_memory: MakeMemory, backup: MySQLBackup, bad: str
) -> None:
    with pytest.raises(InvalidSessionDateError, match=re.escape(bad)):
        parse_session_date(bad)
    memory = make_memory()
    with pytest.raises(InvalidSessionDateError, match=re.escape(bad)):
        history(backup, memory, "s1").add_messages(dated("Book the room.", bad))
    assert backup.get_messages("s1") == []
    moment = datetime.fromisoformat(bad)
    for window in ({"since": moment}, {"until": moment}, {"until": bad}):
        with pytest.raises(InvalidSessionDateError, match=r"since|until"):
            memory.search("room", session_id="s1", **window)


MONTHS = "January February March April May June July August September October November December"


@pytest.mark.parametrize("month", MONTHS.split())
def test_until_a_day_without_a_time_includes_that_whole_day(month: str) -> None:
    number = MONTHS.split().index(month) + 1
    end = datetime(2023, number, 8, 23, 59, 59, 999999)
    for given in (
        f"8 {month} 2023",
        f"8 {month}, 2023",
        f"8 {month[:3]} 2023",
        f"2023-{number:02}-08",
    ):
        assert time_bound("until", given, end=True) == end, given
        assert time_bound("since", given) == datetime(2023, number, 8), given
    # With a time of day, the bound is that moment.
    assert time_bound("until", f"2:10 pm on 8 {month}, 2023", end=True) == datetime(
        2023, number, 8, 14, 10
    )


def test_a_session_date_dates_the_memory_else_the_archive_time(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(dense_weight=0.0)
    chat = history(backup, memory, "s1")
    chat.add_messages(dated("I went to a support group yesterday.", "1:56 pm on 8 May, 2023"))
    # Only the AI message carries it, in response_metadata (as a provider's would).
    chat.add_messages(
        [
            HumanMessage("I ran a charity race last Saturday."),
            AIMessage("Well done!", response_metadata={SESSION_DATE_KEY: "2023-05-25"}),
        ]
    )
    before = utcnow()
    chat.add_messages([HumanMessage("I adopted a puppy."), AIMessage("Lovely!")])
    after = utcnow()
    memory.run_pending()

    rows = {row.text.splitlines()[0]: row for row in catalog(backup, "s1")}
    assert rows["User: I went to a support group yesterday."].turn_at == datetime(
        2023, 5, 8, 13, 56
    )
    assert rows["User: I ran a charity race last Saturday."].turn_at == datetime(2023, 5, 25)
    undated = rows["User: I adopted a puppy."].turn_at
    assert before - timedelta(seconds=1) <= undated <= after + timedelta(seconds=1)
    # Every search result carries its date.
    found = memory.search("support group charity race puppy", session_id="s1", k=10)
    assert sorted(doc.metadata["turn_at"][:10] for doc in found) == sorted(
        ["2023-05-08", "2023-05-25", undated.date().isoformat()]
    )


def test_a_bad_session_date_is_refused_before_anything_is_stored(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    chat = history(backup, memory, "s1")
    with pytest.raises(InvalidSessionDateError, match="next tuesday") as raised:
        chat.add_messages(dated("Book the room.", "next tuesday"))
    assert "messages[0]" in str(raised.value)  # which message
    with pytest.raises(InvalidSessionDateError, match="list"):
        chat.add_messages([HumanMessage("x", additional_kwargs={SESSION_DATE_KEY: ["2023"]})])
    assert backup.get_messages("s1") == []
    assert memory.queue.depth() == 0


# -- search by time ------------------------------------------------------------------

MEETINGS = [
    ("2023-05-08", "Budget meeting: we agreed the Q2 budget for the warehouse."),
    ("2023-05-25", "Budget meeting: the warehouse budget was cut by ten percent."),
    ("2023-06-09", "Budget meeting: the warehouse budget was restored."),
]


@pytest.fixture
def meetings(make_memory: MakeMemory, backup: MySQLBackup) -> ChromaLongMemory:
    memory = make_memory()
    for n, (day, text) in enumerate(MEETINGS):
        history(backup, memory, f"meeting-{n}").add_messages(dated(text, day))
    memory.run_pending()
    return memory


def days(found: list[Document]) -> list[str]:
    return sorted(doc.metadata["turn_at"][:10] for doc in found)


def test_search_since_and_until_filter_on_when_the_turn_happened(
    meetings: ChromaLongMemory,
) -> None:
    def search(**window: Any) -> list[str]:
        return days(
            meetings.search("warehouse budget meeting", user_id="u1", scope="user", **window)
        )

    assert search() == ["2023-05-08", "2023-05-25", "2023-06-09"]
    assert search(since="2023-05-20") == ["2023-05-25", "2023-06-09"]
    assert search(until="2023-05-25") == ["2023-05-08", "2023-05-25"]  # the whole day counts
    assert search(until="2023-05-25T00:00:00") == ["2023-05-08", "2023-05-25"]
    assert search(until="2023-05-24T23:59:59") == ["2023-05-08"]
    assert search(since=date(2023, 5, 9), until=datetime(2023, 6, 1)) == ["2023-05-25"]
    assert search(since="1:00 pm on 1 June, 2023") == ["2023-06-09"]
    assert search(since="2024-01-01") == []
    # No word matches "zzz", yet HashEmbeddings gives every memory a dense score: these
    # are the window's memories ranked by it, still inside it (the fallback for when
    # nothing scores at all is tested without the dense side, below).
    assert days(meetings.search("zzz", user_id="u1", scope="user", until="2023-05-30")) == [
        "2023-05-08",
        "2023-05-25",
    ]
    with pytest.raises(InvalidSessionDateError, match="since"):
        meetings.search("budget", user_id="u1", scope="user", since="last week")
    # A LoCoMo date as a bare-day bound: its whole day, whatever the month's letters.
    assert search(until="25 May, 2023") == search(until="2023-05-25")
    assert search(since="9 June 2023", until="9 June 2023") == ["2023-06-09"]
    # A window that ends before it starts is bad input, not an empty answer.
    with pytest.raises(InvalidSessionDateError, match="after until"):
        meetings.search(
            "budget", user_id="u1", scope="user", since="2023-06-01", until="2023-05-01"
        )


def test_search_memories_passes_its_window_on(meetings: ChromaLongMemory) -> None:
    chat = history(meetings.backup, meetings, "meeting-2")
    for window in ({"until": "2023-05-25"}, {"since": "2023-05-20", "until": "2023-06-01"}):
        found = chat.search_memories("warehouse budget", k=5, scope="user", **window)
        direct = meetings.search("warehouse budget", user_id="u1", scope="user", k=5, **window)
        assert [doc.id for doc in found] == [doc.id for doc in direct], window
        assert all(doc.metadata["turn_at"][:10] <= window["until"] for doc in found), window
    assert days(chat.search_memories("budget", scope="user", until="2023-05-25")) == [
        "2023-05-08",
        "2023-05-25",
    ]
    assert days(
        chat.search_memories("budget", scope="user", since="2023-05-20", until="2023-06-01")
    ) == ["2023-05-25"]


def test_when_no_memory_scores_the_newest_memories_inside_the_window_are_returned(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory(dense_weight=0.0)  # words alone score
    chat = history(backup, memory, "fallback")
    for n, day in enumerate(["2020-02-01", "2020-02-02", "2020-02-03"]):  # inside the window
        chat.add_messages(dated(f"Old turn about tea {n}.", day))
    for n in range(4):  # newer than the window, and stored last
        chat.add_messages(dated(f"New turn about bikes {n}.", "2024-03-01"))
    memory.run_pending()

    found = memory.search("zzz-no-word-matches", session_id="fallback", k=2, until="2020-12-31")
    assert len(found) == 2
    assert all(doc.metadata["turn_at"] <= "2020-12-31" for doc in found)
    assert days(found) == ["2020-02-02", "2020-02-03"]  # the window's newest two


def test_a_window_holding_no_memory_answers_without_embedding_the_query(
    meetings: ChromaLongMemory,
) -> None:
    # The query embedding may be a paid or remote call, and it may be down.
    asked: list[str] = []
    embed = meetings.embedding.embed_query
    meetings.embedding.embed_query = lambda text: asked.append(text) or embed(text)  # type: ignore[method-assign]

    assert meetings.search("budget", user_id="u1", scope="user", since="2024-01-01") == []
    assert asked == []
    assert meetings.search("budget", user_id="u1", scope="user", since="2023-06-01")
    assert asked == ["budget"]


async def test_asearch_and_the_retriever_take_the_same_window(meetings: ChromaLongMemory) -> None:
    found = await meetings.asearch(
        "warehouse budget", user_id="u1", scope="user", since="2023-05-20", until="2023-06-01"
    )
    assert days(found) == ["2023-05-25"]
    retriever = meetings.as_retriever(user_id="u1", scope="user", until="2023-05-08")
    assert days(retriever.invoke("warehouse budget")) == ["2023-05-08"]
    assert days(await retriever.ainvoke("warehouse budget", since="2023-05-01")) == ["2023-05-08"]
    chat = history(meetings.backup, meetings, "meeting-2")
    assert days(chat.search_memories("budget", scope="user", since="2023-06-01")) == ["2023-06-09"]
    assert days(retriever.invoke("warehouse budget", until="2023-06-30")) == [
        "2023-05-08",
        "2023-05-25",
        "2023-06-09",
    ]


OLD_TURNS = ["I sold my old bike", "I like tea", "Paris trip was great", "My dog barks"]


@pytest.fixture
def bikes(make_memory: MakeMemory, backup: MySQLBackup) -> ChromaLongMemory:
    """One session: 800 new turns about bikes, then four old ones, one about a bike."""
    memory = make_memory()
    chat = history(backup, memory, "bikes")
    chat.add_messages(
        [m for n in range(800) for m in dated(f"My bike number {n} is fast.", "2024-03-01")]
    )
    for text in OLD_TURNS:
        chat.add_messages(dated(text, "2020-02-01"))
    memory.run_pending()
    return memory


@pytest.mark.parametrize("window_exact", ["scored exactly", "asked of the index"])
async def test_a_window_of_a_large_scope_yields_k_memories_when_it_holds_k(
    bikes: ChromaLongMemory, monkeypatch: pytest.MonkeyPatch, window_exact: str
) -> None:
    """Above ``exact_limit`` the vector index is asked: its nearest lie outside the window."""
    if window_exact == "asked of the index":  # a window larger than WINDOW_EXACT, in effect
        monkeypatch.setattr(retrieval, "WINDOW_EXACT", 0, raising=False)
    scopes = [{"session_id": "bikes"}, {"user_id": "u1", "scope": "user"}]
    old = "2020-12-31"
    found: dict[int, list[list[str | None]]] = {}
    for limit in (EXACT_LIMIT, 0):  # in process, then from the index
        bikes.exact_limit = limit
        found[limit] = []
        for scope in scopes:
            docs = bikes.search("bike", k=4, until=old, **scope)
            assert days(docs) == ["2020-02-01"] * 4, (limit, scope)
            assert "I sold my old bike" in docs[0].page_content
            found[limit].append([doc.id for doc in docs])
            assert [d.id for d in await bikes.asearch("bike", k=4, until=old, **scope)] == [
                doc.id for doc in docs
            ]
            retriever = bikes.as_retriever(k=3, since="2019-01-01", until=old, **scope)
            assert [d.id for d in retriever.invoke("bike")] == [doc.id for doc in docs[:3]]
        newest = bikes.search("tea Paris dog", k=5, since="2024-01-01", **scopes[0])
        assert days(newest) == ["2024-03-01"] * 5
    # The same memories (orthogonal ones tie at 0: the index's float noise may swap them).
    assert [set(ids) for ids in found[0]] == [set(ids) for ids in found[EXACT_LIMIT]]


# -- the date in the prompt ------------------------------------------------------------


def test_memory_line_puts_the_day_before_the_text_and_indents_its_lines() -> None:
    doc = Document("User: hi\nAI: hello", metadata={"turn_at": "2023-05-08T13:56:00"})
    assert memory_line(doc) == "- (2023-05-08) User: hi\n  AI: hello"
    assert memory_line(Document("a fact")) == "- a fact"  # a document of another store


def cat_then_job(memory: ChromaLongMemory, backup: MySQLBackup) -> ChromaLongMemory:
    """Session s1 of user u1: a cat adopted on 2023-05-08, a new job on 2023-06-20."""
    chat = history(backup, memory, "s1")
    chat.add_messages(dated("I adopted a cat called Miso.", "2023-05-08", ai="Congratulations!"))
    chat.add_messages(dated("I started a new job at ACME.", "2023-06-20", ai="Good luck!"))
    memory.run_pending()
    return memory


def test_the_turn_shown_before_a_memory_carries_its_own_date(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    # A raw memory shows the turn before it first. That turn has a date of its own:
    # the later one, or an earlier one when older chats were imported after newer.
    memory = cat_then_job(make_memory(), backup)
    imported = history(backup, memory, "s2", user_id="u2")
    imported.add_messages(dated("I moved to Lyon.", "2024-02-01", ai="Nice!"))
    imported.add_messages(dated("I sold my bike.", "2023-01-15", ai="Why?"))
    memory.run_pending()

    def bullets(user: str, session: str) -> list[str]:
        text = memory.as_context(k=2, scope="user").invoke(
            "cat Miso job ACME Lyon bike",
            {"configurable": {"session_id": session, "user_id": user}},
        )
        return sorted(re.split(r"\n(?=- )", text))

    assert bullets("u1", "s1") == [
        "- (2023-05-08) User: I adopted a cat called Miso.\n  AI: Congratulations!",
        "- (2023-05-08) User: I adopted a cat called Miso.\n  AI: Congratulations!\n"
        "  (2023-06-20) User: I started a new job at ACME.\n  AI: Good luck!",
    ]
    assert bullets("u2", "s2") == [
        "- (2024-02-01) User: I moved to Lyon.\n  AI: Nice!",
        "- (2024-02-01) User: I moved to Lyon.\n  AI: Nice!\n"
        "  (2023-01-15) User: I sold my bike.\n  AI: Why?",
    ]


def test_a_catalog_of_an_older_version_gains_the_contexts_date(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    cat_then_job(make_memory(), backup)
    table = backup.tables.memories.name
    reopened = without_column(backup, "context_at")
    try:
        columns = {c["name"] for c in sa.inspect(reopened.engine).get_columns(table)}
        assert "context_at" in columns  # added back, empty
        upgraded = make_memory(backup=reopened)
        old = upgraded.search("job ACME", session_id="s1", k=1)[0]
        assert old.metadata["context_at"] is None
        assert memory_line(old).startswith("- User: I adopted a cat")  # no day claimed
        chat = history(reopened, upgraded, "s1")
        chat.add_messages(dated("I bought a bike.", "2023-07-02", ai="Fun!"))
        upgraded.run_pending()
        new = upgraded.search("bought a bike", session_id="s1", k=1)[0]
        assert new.metadata["context_at"].startswith("2023-06-20")
        assert memory_line(new).startswith("- (2023-06-20) User: I started a new job")
    finally:
        reopened.dispose()


def test_a_memory_of_an_older_version_shows_its_context_undated() -> None:
    # Written before the context's date was kept: no day is claimed for it.
    doc = Document(
        "User: hi\nAI: hello\nUser: bye",
        metadata={"turn_at": "2023-05-08T13:56:00", "context_chars": 18, "context_at": None},
    )
    assert memory_line(doc) == "- User: hi\n  AI: hello\n  (2023-05-08) User: bye"


#: The example in LoCoMo's own format, for a checkout without the eval data beside it
#: (the real file is read when it is there, see :func:`locomo`).
LOCOMO_EXAMPLE: dict[str, Any] = {
    "conversation": {
        "speaker_a": "Caroline",
        "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hey Mel! Good to see you!"},
            {"speaker": "Melanie", "dia_id": "D1:2", "text": "Hey Caroline! How have you been?"},
            {
                "speaker": "Caroline",
                "dia_id": "D1:3",
                "text": "I went to a LGBTQ support group yesterday and it was so powerful.",
            },
            {"speaker": "Melanie", "dia_id": "D1:4", "text": "Wow, that's cool! How was it?"},
        ],
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_2": [
            {"speaker": "Melanie", "dia_id": "D2:1", "text": "I ran a charity race last Saturday."},
            {"speaker": "Caroline", "dia_id": "D2:2", "text": "That's great, Mel!"},
        ],
    },
    "qa": [
        {
            "question": "When did Caroline go to the LGBTQ support group?",
            "answer": "7 May 2023",
            "evidence": ["D1:3"],
            "category": 2,
        }
    ],
}


def locomo() -> dict[str, Any]:
    path = EVAL / "locomo_dev.json"
    if not path.exists():
        return LOCOMO_EXAMPLE
    sample: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))[0]
    return sample


def test_a_locomo_temporal_question_gets_the_date_beside_the_fact(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """LoCoMo conversation 0, category 2: "When did Caroline go to the LGBTQ support group?"

    The gold answer is 7 May 2023: the fact was said on 8 May ("yesterday"). The
    prompt must put the session's date on the line of that fact.
    """
    sample = locomo()
    conversation = sample["conversation"]
    qa = next(
        q for q in sample["qa"] if q["question"].startswith("When did Caroline go to the LGBTQ")
    )
    assert qa["category"] == 2 and qa["evidence"] == ["D1:3"]
    memory = make_memory()
    for n in (1, 2):
        when = conversation[f"session_{n}_date_time"]
        messages = [
            (HumanMessage if turn["speaker"] == conversation["speaker_a"] else AIMessage)(
                turn["text"], name=turn["speaker"], additional_kwargs={SESSION_DATE_KEY: when}
            )
            for turn in conversation[f"session_{n}"]
        ]
        history(backup, memory, f"locomo-{n}", user_id="caroline").add_messages(messages)
    memory.run_pending()

    llm = ScriptedChatModel(messages=replies())
    chat = create_tiered_chain(llm, backup=backup, long_memory=memory, memory_scope="user", k=3)
    chat.invoke(qa["question"], {"configurable": {"session_id": "ask", "user_id": "caroline"}})

    system = llm.prompts[-1][0]
    assert isinstance(system, SystemMessage)
    # A raw turn's bullet shows the turn before it too: the fact may be in two.
    bullets = re.split(r"\n(?=- )", system.text)
    holding = [b for b in bullets if "Caroline: I went to a LGBTQ support group yesterday" in b]
    assert holding, system.text
    assert all(b.startswith("- (2023-05-08) ") for b in holding), holding
