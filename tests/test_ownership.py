"""A session belongs to its user: another user reads and writes nothing of it.

The first write binds a session to its ``user_id`` (or to no user) for good. Real
archives (the ``backup`` fixture: SQLite and MariaDB), a real consolidator and an
embedded Chroma; every refusal is checked against what is stored afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from sqlalchemy import delete, insert, select

from langchain_tiered_memory import (
    MemoryConsolidator,
    MySQLBackup,
    SessionFileArchive,
    SessionOwnershipError,
    TieredChatMessageHistory,
)
from langchain_tiered_memory.storage.base import utcnow
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

from .fakes import RecordingChatModel, replies

MakeMemory = Callable[..., ChromaLongMemory]
ALICE, BOB = "alice", "bob"


def turn(text: str) -> list[BaseMessage]:
    return [HumanMessage(f"question {text}"), AIMessage(f"answer {text}")]


def stored(backup: MySQLBackup) -> list[Any]:
    """Every message row and job row of the archive, to compare before and after."""
    t, j = backup.tables.messages, backup.tables.jobs

    def plan() -> Any:
        messages = yield select(t.c.id, t.c.session_id, t.c.user_id, t.c.message).order_by(t.c.id)
        jobs = yield select(j.c.id, j.c.session_id, j.c.kind).order_by(j.c.id)
        return [*map(tuple, messages), *map(tuple, jobs)]

    return backup.run(plan())


def owners(backup: MySQLBackup) -> dict[str, str | None]:
    s = backup.tables.sessions

    def plan() -> Any:
        result = yield select(s.c.session_id, s.c.user_id)
        return dict(result.all())

    return backup.run(plan())


@pytest.fixture
async def abackup(backup: MySQLBackup) -> AsyncIterator[MySQLBackup]:
    yield backup
    await backup.adispose()


def test_another_user_can_neither_read_nor_write_a_session(backup: MySQLBackup) -> None:
    backup.add_messages("s", turn("1"), user_id=ALICE)
    before = stored(backup)

    for intruder in (BOB, None):  # None: a user-less write to a user's session
        with pytest.raises(SessionOwnershipError) as refused:
            backup.add_messages("s", turn("x"), user_id=intruder, jobs=["extract"])
        assert isinstance(refused.value, PermissionError)
        assert refused.value.session_id == "s"
        assert refused.value.user_id == intruder
        assert ALICE not in str(refused.value)  # the owner is not disclosed
    for read in (
        lambda: backup.tail("s", 5, user_id=BOB),
        lambda: backup.get_messages("s", user_id=BOB),
        lambda: backup.history("s", user_id=BOB),
        lambda: backup.check_owner("s", BOB),
        lambda: backup.clear("s", user_id=BOB),
    ):
        with pytest.raises(SessionOwnershipError, match="does not belong to user 'bob'"):
            read()
    assert stored(backup) == before

    # The owner, and reads without a user (an administrator's), go on as before.
    assert backup.get_messages("s", user_id=ALICE) == turn("1")
    assert backup.tail("s", 5) == turn("1")
    backup.add_messages("s", turn("2"), user_id=ALICE)
    assert backup.get_messages("s") == turn("1") + turn("2")
    assert owners(backup) == {"s": ALICE}


def test_a_session_created_without_a_user_stays_user_less(backup: MySQLBackup) -> None:
    backup.add_messages("anon", turn("1"))
    with pytest.raises(SessionOwnershipError):
        backup.add_messages("anon", turn("2"), user_id=ALICE)
    with pytest.raises(SessionOwnershipError):
        backup.tail("anon", 5, user_id=ALICE)
    backup.add_messages("anon", turn("2"))
    assert backup.get_messages("anon") == turn("1") + turn("2")
    assert owners(backup) == {"anon": None}
    assert [m.user_id for m in backup.history("anon")] == [None] * 4


def test_a_new_session_is_anyones_until_its_first_write(backup: MySQLBackup) -> None:
    assert backup.tail("new", 3, user_id=BOB) == []
    backup.check_owner("new", BOB)
    backup.add_messages("new", turn("1"), user_id=ALICE)
    with pytest.raises(SessionOwnershipError):
        backup.tail("new", 3, user_id=BOB)


def test_clear_keeps_the_owner_and_forget_frees_the_session_id(backup: MySQLBackup) -> None:
    backup.add_messages("s", turn("1"), user_id=ALICE)
    assert backup.clear("s", user_id=ALICE) == 2
    # Cleared, not forgotten: MEMORY.md and memories may remain, so still alice's.
    with pytest.raises(SessionOwnershipError):
        backup.add_messages("s", turn("2"), user_id=BOB)
    backup.forget(session_id="s")
    assert owners(backup) == {}
    backup.add_messages("s", turn("3"), user_id=BOB)
    assert backup.get_messages("s", user_id=BOB) == turn("3")
    backup.forget(user_id=BOB)
    assert owners(backup) == {}


@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "from-before-the-table"])
def test_forget_keep_owner_empties_the_session_and_keeps_it_its_owners(
    backup: MySQLBackup, legacy: bool
) -> None:
    backup.add_messages("s", turn("1"), user_id=ALICE)
    if legacy:  # an archive from before the sessions table: the owner is its first message's
        sessions = backup.tables.sessions

        def drop() -> Any:
            yield delete(sessions)

        backup.run(drop(), write=True)
    assert backup.forget(session_id="s", keep_owner=True) == 2
    assert backup.get_messages("s") == []
    assert owners(backup) == {"s": ALICE}
    with pytest.raises(SessionOwnershipError):
        backup.add_messages("s", turn("2"), user_id=BOB)
    backup.add_messages("s", turn("3"), user_id=ALICE)
    assert backup.get_messages("s") == turn("3")


@pytest.mark.usefixtures("abackup")
async def test_async_methods_check_the_owner_too(backup: MySQLBackup) -> None:
    await backup.aadd_messages("s", turn("1"), user_id=ALICE)
    before = stored(backup)
    with pytest.raises(SessionOwnershipError):
        await backup.aadd_messages("s", turn("x"), user_id=BOB)
    with pytest.raises(SessionOwnershipError):
        await backup.aadd_messages("s", turn("x"))
    for read in (
        backup.atail("s", 5, user_id=BOB),
        backup.aget_messages("s", user_id=BOB),
        backup.ahistory("s", user_id=BOB),
        backup.acheck_owner("s", BOB),
        backup.aclear("s", user_id=BOB),
    ):
        with pytest.raises(SessionOwnershipError):
            await read
    assert stored(backup) == before
    assert await backup.atail("s", 5, user_id=ALICE) == turn("1")


def test_sessions_of_an_older_archive_belong_to_their_first_writer(
    backup: MySQLBackup, backend_url: str, table_name: str
) -> None:
    """An archive from before the sessions table: owners come from the first message."""
    backup.add_messages("mixed", turn("alice"), user_id=ALICE)
    backup.add_messages("anon", turn("anon"))
    t, c = backup.tables.messages, backup.tables.consolidation

    def legacy() -> Any:
        # The old version appended another user's turn to alice's session, and left
        # a cleared session with only its MEMORY.md.
        for message in turn("bob"):
            yield insert(t).values(
                session_id="mixed", user_id=BOB, role=message.type, message="{}",
                parts=0, created_at=utcnow(),
            )  # fmt: skip
        yield insert(c).values(
            session_id="cleared", user_id=ALICE, cursor=0, memory_md="- secret", updated_at=utcnow()
        )

    backup.run(legacy())
    backup.tables.sessions.drop(backup.engine)
    backup.dispose()
    upgraded = MySQLBackup(backend_url, table_name=table_name)  # creates the new table
    try:
        assert owners(upgraded) == {}
        with pytest.raises(SessionOwnershipError):
            upgraded.add_messages("mixed", turn("bob 2"), user_id=BOB)
        with pytest.raises(SessionOwnershipError):
            upgraded.get_messages("mixed", user_id=BOB)
        with pytest.raises(SessionOwnershipError):
            upgraded.check_owner("cleared", BOB)
        with pytest.raises(SessionOwnershipError):
            upgraded.add_messages("anon", turn("alice"), user_id=ALICE)
        upgraded.add_messages("mixed", turn("alice 2"), user_id=ALICE)
        upgraded.add_messages("anon", turn("anon 2"))
        assert owners(upgraded) == {"mixed": ALICE, "anon": None}
    finally:
        upgraded.dispose()


def test_racing_first_writes_bind_exactly_one_user(backup: MySQLBackup) -> None:
    users = [f"user-{n}" for n in range(6)]
    barrier = threading.Barrier(len(users))
    outcome: dict[str, str] = {}

    def write(user: str) -> None:
        barrier.wait()
        try:
            backup.add_messages("contested", turn(user), user_id=user)
            outcome[user] = "written"
        except SessionOwnershipError:
            outcome[user] = "refused"
        except Exception as exc:  # a deadlock or a duplicate key would land here
            outcome[user] = repr(exc)

    threads = [threading.Thread(target=write, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [user for user, result in outcome.items() if result == "written"]
    assert sorted(outcome.values()) == ["refused"] * 5 + ["written"], outcome
    assert owners(backup) == {"contested": winners[0]}
    assert backup.get_messages("contested") == turn(winners[0])
    assert {m.user_id for m in backup.history("contested")} == {winners[0]}


# -- the history: window, writes, MEMORY.md and long-term search ----------------------


def test_a_history_of_another_user_reads_and_writes_nothing(
    backup: MySQLBackup, make_memory: MakeMemory, tmp_path: Path
) -> None:
    memory = make_memory()
    consolidator = MemoryConsolidator(
        RecordingChatModel(messages=replies("- alice's cat is Miso")),
        root=tmp_path / "memory",
        backup=backup,
        threshold=1,
        batch=1,
        start_worker=False,
    )
    try:

        def history(user_id: str | None) -> TieredChatMessageHistory:
            return TieredChatMessageHistory(
                "s", user_id=user_id, backup=backup, long_memory=memory, consolidator=consolidator
            )

        alice = history(ALICE)
        alice.add_messages([HumanMessage("My cat is Miso."), AIMessage("Noted: Miso.")])
        memory.run_pending()
        consolidator.run_pending()
        assert "Miso" in alice.consolidated_memory
        assert alice.search_memories("cat")
        before = stored(backup)

        bob = history(BOB)
        for action in (
            lambda: bob.messages,
            bob.all_messages,
            lambda: bob.consolidated_memory,
            lambda: bob.search_memories("cat"),
            lambda: bob.search_memories("cat", scope="user"),
            lambda: bob.add_messages(turn("bob")),
            bob.clear,
            bob.check_owner,
            lambda: consolidator.memory("s", user_id=BOB),
        ):
            with pytest.raises(SessionOwnershipError):
                action()
        # Searched directly with bob's id, the session's memories are not his.
        assert memory.search("cat", session_id="s", user_id=BOB) == []

        anonymous = history(None)  # reads the archive, nothing a prompt is made of; writes nothing
        for prompt_read in (
            lambda: anonymous.messages,
            lambda: anonymous.consolidated_memory,
            lambda: anonymous.search_memories("cat"),
        ):
            with pytest.raises(SessionOwnershipError, match="belongs to a user"):
                prompt_read()
        assert anonymous.all_messages() == alice.all_messages()
        assert "Miso" in consolidator.memory("s")  # an administrator's read
        assert memory.search("cat", session_id="s")  # an administrator's search
        with pytest.raises(SessionOwnershipError, match="belongs to a user"):
            anonymous.add_messages(turn("anon"))
        assert stored(backup) == before
    finally:
        consolidator.close()


async def test_async_history_of_another_user_reads_and_writes_nothing(
    abackup: MySQLBackup,
) -> None:
    alice = TieredChatMessageHistory("s", user_id=ALICE, backup=abackup)
    await alice.aadd_messages(turn("1"))
    bob = TieredChatMessageHistory("s", user_id=BOB, backup=abackup)
    with pytest.raises(SessionOwnershipError):
        await bob.aget_messages()
    with pytest.raises(SessionOwnershipError):
        await bob.aadd_messages(turn("bob"))
    with pytest.raises(SessionOwnershipError):
        await bob.aclear()
    assert await alice.aget_messages() == turn("1")


def test_rows_of_the_sessions_table_are_removed_by_forget_of_a_user(
    backup: MySQLBackup,
) -> None:
    backup.add_messages("a1", turn("1"), user_id=ALICE)
    backup.add_messages("a2", turn("2"), user_id=ALICE)
    backup.add_messages("b1", turn("3"), user_id=BOB)
    backup.forget(user_id=ALICE)
    assert owners(backup) == {"b1": BOB}
    backup.forget(session_id="b1", user_id=ALICE)  # not alice's: nothing happens
    assert owners(backup) == {"b1": BOB}

    def lose_owners() -> Any:
        yield delete(backup.tables.sessions)

    backup.run(lose_owners())
    backup.add_messages("b1", turn("4"), user_id=BOB)  # re-bound from its messages
    with pytest.raises(SessionOwnershipError):
        backup.add_messages("b1", turn("5"), user_id=ALICE)


async def test_a_user_less_history_never_puts_a_users_session_in_a_prompt(
    abackup: MySQLBackup,
) -> None:
    """RunnableWithMessageHistory with a history made from the session id alone, asked
    for alice's session: refused before the model, sync and async (the window read was
    a read, so her messages reached the model; the write check came after the answer,
    in a listener whose errors langchain-core only logs)."""
    TieredChatMessageHistory("s", user_id=ALICE, backup=abackup).add_messages(
        [HumanMessage("my IBAN is DE89 3704"), AIMessage("noted")]
    )
    model = RecordingChatModel(messages=replies("ok"))
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{input}")]
    )
    chat = RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: TieredChatMessageHistory(session_id, backup=abackup),
        input_messages_key="input",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": "s"}}
    with pytest.raises(SessionOwnershipError, match="belongs to a user"):
        chat.invoke({"input": "what is my IBAN?"}, config)
    with pytest.raises(SessionOwnershipError, match="belongs to a user"):
        await chat.ainvoke({"input": "what is my IBAN?"}, config)
    assert model.prompts == []
    assert abackup.get_messages("s") == [HumanMessage("my IBAN is DE89 3704"), AIMessage("noted")]


async def test_a_history_without_a_user_clears_no_users_session(
    abackup: MySQLBackup, tmp_path: Path
) -> None:
    """A user-less history neither shows alice's session as its window nor wipes it."""
    for archive in (abackup, SessionFileArchive(tmp_path / "files")):
        TieredChatMessageHistory("s", user_id=ALICE, backup=archive).add_messages(turn("1"))
        anonymous = TieredChatMessageHistory("s", backup=archive)
        with pytest.raises(SessionOwnershipError, match="belongs to a user"):
            anonymous.messages  # noqa: B018 - a window goes into a prompt
        assert anonymous.all_messages() == turn("1")  # an administrator's read

        with pytest.raises(SessionOwnershipError, match="belongs to a user"):
            anonymous.clear()
        with pytest.raises(SessionOwnershipError, match="belongs to a user"):
            await anonymous.aclear()

        assert archive.get_messages("s", user_id=ALICE) == turn("1")
        # A session without a user is still the user-less history's to clear.
        anonymous_own = TieredChatMessageHistory("anon", backup=archive)
        anonymous_own.add_messages(turn("2"))
        anonymous_own.clear()
        assert anonymous_own.all_messages() == []
