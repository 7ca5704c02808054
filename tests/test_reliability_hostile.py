"""Hostile input, property-based: each input gets a typed error or is stored as plain data.

The world: an archive (SQLite or MariaDB) with long-term memory (embedded Chroma),
consolidation (MEMORY.md files) and the design's JSON session files, holding a few
bystander sessions whose ids differ from likely attacks by case, a trailing space,
or a SQL wildcard. For every generated session id, user id, message, search query or
setting, either the call raises ``ValueError``/``TypeError`` with a message and
nothing anywhere changes, or the input is stored and read back exactly, flows
through extraction and consolidation without leaving a stuck job, stays in its own
scope and folder, and ``forget`` returns every tier to what it was before.
"""

from __future__ import annotations

import contextlib
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import (
    ArchiveUnavailableError,
    MySQLBackup,
    SessionFileArchive,
    TieredChatMessageHistory,
)
from langchain_tiered_memory.storage.archive import render_url
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import MEMORY_CHARS, ChromaLongMemory

from .fakes import HOSTILE, HashEmbeddings
from .long_memory_support import FakeExtractor
from .reliability_support import MemoryWriter, files_under

TYPED = (ValueError, TypeError)
SETTINGS = settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
BYSTANDERS = {  # session -> user: neighbours of likely attacks
    "alice": "u-alice",
    "Alice": "u-Alice",
    "alice%": "u-alice",
    "ali_e": None,
    "会话 1": "用户",
    "$and": "$or",
}
ATTACKS = [
    *HOSTILE,
    "alice ",  # MySQL's PAD SPACE collations compare 'alice ' equal to 'alice'
    "alice  ",
    "ALICE",
    "alice\u200b",
    "Alice\t",
    "alice'--",
    "' OR '1'='1",
    "'; DROP TABLE chat_messages; --",
    '"; DELETE FROM x; --',
    "\\",
    "%",
    "_",
    "*",
    "$ne",
    '{"$ne": ""}',
    '{"session_id": {"$ne": "x"}}',
    "../../../../etc/passwd",
    "..\\..\\windows\\system32",
    "/dev/null",
    "C:\\x",
    "~/.ssh/id_rsa",
    "%2e%2e%2f",
    "con",
    "nul.txt",
    "\u202eevil",
    "\ufeffbom",
    "😀" * 64,
    "x" * 256,
    "a\x00b",
    "a\nb",
    "lone \ud800",
    "",
]
#: Any code point, with the dangerous ones (NUL, lone surrogates, quotes...) often.
SPECIALS = ["\x00", " ", "'", '"', "\\", "/", ".", "%", "_", "$", "\u202e", "😀", "应"]
ALPHABET = st.one_of(st.characters(), st.sampled_from([*SPECIALS, "\ud800", "\udfff"]))
NOT_TEXT = st.one_of(
    st.integers(),
    st.binary(max_size=8),
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.sampled_from(["$ne", "$in"]), st.text(max_size=3), max_size=1),
)
IDS = st.one_of(
    st.sampled_from(ATTACKS),
    st.text(ALPHABET, min_size=1, max_size=12),
    st.text(ALPHABET, max_size=300),
    NOT_TEXT,
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(ALPHABET, max_size=30),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(ALPHABET, max_size=10), children, max_size=4)
    ),
    max_leaves=25,
)
CONTENT = st.one_of(
    st.text(ALPHABET, max_size=400),
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(ALPHABET)}),
            st.fixed_dictionaries(
                {
                    "type": st.just("image_url"),
                    "image_url": st.fixed_dictionaries({"url": st.text()}),
                }
            ),
            st.text(ALPHABET, max_size=20),
        ),
        max_size=3,
    ),
)


@dataclass
class World:
    """Every tier on one archive, and a fingerprint of all it holds."""

    backup: MySQLBackup
    memory: ChromaLongMemory
    consolidator: MemoryConsolidator
    files: SessionFileArchive
    root: Path

    def history(self, session_id: Any, user_id: Any = None) -> TieredChatMessageHistory:
        return TieredChatMessageHistory(
            session_id,
            user_id=user_id,
            backup=self.backup,
            long_memory=self.memory,
            consolidator=self.consolidator,
        )

    def process(self) -> None:
        """Run the queues dry in this thread (a stuck job fails the flush)."""
        self.memory.flush(timeout=30)
        self.consolidator.flush(timeout=30)

    def snapshot(self) -> dict[str, Any]:
        """Everything the tiers hold: every row of every table, Chroma, the files."""
        tables: dict[str, Any] = {}
        for name, table in vars(self.backup.tables).items():

            def plan(table: Any = table) -> Any:
                result = yield sa.select(table)
                return sorted(tuple(map(repr, row)) for row in result)

            tables[name] = self.backup.run(plan(), read_only=True)
        found = self.memory.collection.get(include=["metadatas", "documents"])
        metadatas = [repr(sorted(m.items())) for m in found["metadatas"]]
        tables["chroma"] = sorted(zip(found["ids"], metadatas, found["documents"], strict=True))
        tables["files"] = files_under(self.root)
        # This world's tables only: other tests may share the MySQL database.
        base = self.backup.tables.messages.name
        with self.backup.engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
        tables["schema"] = sorted(n for n in names if n == base or n.startswith(f"{base}_"))
        return tables


TOPICS = ["invoice ledger", "deploy friday", "budget audit", "payroll warehouse"]


def _add(history: TieredChatMessageHistory, messages: list[BaseMessage]) -> None:
    """Add a turn at a time: a finished turn queues its extraction job."""
    for k in range(0, len(messages), 2):
        history.add_messages(messages[k : k + 2])


def _turns(tag: str, count: int = 3) -> list[BaseMessage]:
    """Turns whose memories differ enough not to be merged as near-duplicates."""
    return [
        message
        for n in range(count)
        for message in (
            HumanMessage(f"{tag} question {n} about {TOPICS[n % len(TOPICS)]}"),
            AIMessage(f"{tag} answer {n}"),
        )
    ]


@pytest.fixture
def world(backup: MySQLBackup, make_memory: Callable[..., ChromaLongMemory], tmp_path: Path):
    root = tmp_path / "world"
    memory = make_memory(extractor=FakeExtractor())
    consolidator = MemoryConsolidator(
        MemoryWriter(),
        root=root / "memory",
        backup=backup,
        threshold=4,
        batch=2,
        start_worker=False,
        retry_base_delay=0.01,
    )
    files = SessionFileArchive(root / "sessions")
    made = World(backup, memory, consolidator, files, root)
    for session_id, user_id in BYSTANDERS.items():
        _add(made.history(session_id, user_id), _turns(f"bystander {session_id}"))
        files.add_messages(session_id, _turns(f"bystander {session_id}"), user_id=user_id)
    made.process()
    yield made
    consolidator.close()


def _exact_rows(world: World, name: str, session_id: str) -> list[Any]:
    table = getattr(world.backup.tables, name)

    def plan() -> Any:
        result = yield sa.select(table)
        return [row for row in result if row.session_id == session_id]

    return world.backup.run(plan(), read_only=True)


def _refused(world: World, before: dict[str, Any], calls: list[Callable[[], Any]]) -> None:
    for call in calls:
        with pytest.raises(TYPED) as caught:
            call()
        assert str(caught.value), "a typed error must say what is wrong"
    assert world.snapshot() == before


# -- session and user ids -------------------------------------------------------------------


@SETTINGS
@given(session_id=IDS, user_id=st.one_of(st.none(), IDS))
@example(session_id="alice ", user_id="u-alice ")  # equal to a bystander under PAD SPACE
@example(session_id="ALICE", user_id="U-ALICE")  # equal under a case-insensitive collation
@example(session_id="alic%", user_id="u-%")  # a LIKE pattern would match bystanders
@example(session_id="../../alice", user_id="$ne")
@example(session_id="'; DROP TABLE chat_messages; --", user_id="' OR '1'='1")
def test_any_session_and_user_id_is_refused_or_kept_to_its_own_scope(
    world: World, session_id: Any, user_id: Any
) -> None:
    assume(not (isinstance(session_id, str) and session_id in BYSTANDERS))
    before = world.snapshot()
    try:
        history = world.history(session_id, user_id)
    except TYPED:
        turn = _turns("refused", 1)
        calls = [
            lambda: world.backup.add_messages(session_id, turn, user_id=user_id),
            lambda: world.files.add_messages(session_id, turn, user_id=user_id),
            lambda: world.memory.search("question", session_id=session_id, user_id=user_id),
        ]
        try:
            world.history(session_id)
        except TYPED:  # the session id itself is refused, wherever it goes
            calls += [
                lambda: world.consolidator.folder(session_id),
                lambda: world.files.paths(session_id),
                lambda: world.backup.forget(session_id=session_id),
            ]
        else:  # the user id is refused, wherever it goes
            calls += [
                lambda: world.memory.search("question", user_id=user_id, scope="user"),
                lambda: world.backup.forget(user_id=user_id),
                lambda: world.backup.sessions(user_id=user_id),
            ]
        _refused(world, before, calls)
        event("refused")
        return
    event("stored")
    tag = f"tag{uuid.uuid4().hex[:8]}"
    messages = _turns(tag)
    try:
        _add(history, messages)
        world.files.add_messages(session_id, messages, user_id=user_id)
        world.process()

        # Stored as plain data, read back exactly, and only its own.
        assert world.backup.get_messages(session_id) == messages
        assert history.messages == messages
        assert world.files.get_messages(session_id) == messages
        assert [r.user_id for r in _exact_rows(world, "messages", session_id)] == [user_id] * 6
        catalog = {row.id for row in _exact_rows(world, "memories", session_id)}
        assert len(catalog) == 3
        docs = world.memory.search(f"{tag} question", session_id=session_id, k=50)
        assert {doc.id for doc in docs} == catalog
        assert all(doc.metadata["session_id"] == session_id for doc in docs)
        # Its files stay under their roots.
        folder = world.consolidator.folder(session_id).resolve()
        assert folder.parent == (world.root / "memory").resolve()
        assert (folder / "MEMORY.md").is_file()
        for path in world.files.paths(session_id):
            assert path.resolve().parent == (world.root / "sessions").resolve()
            assert path.is_file()
    finally:
        # Forget takes it out of every tier and leaves everything else as it was.
        world.memory.forget(session_id=session_id)
        world.files.forget(session_id=session_id)
    assert world.snapshot() == before


# -- message contents -------------------------------------------------------------------------


@SETTINGS
@given(content=CONTENT, kwargs=st.dictionaries(st.text(ALPHABET, max_size=10), JSON, max_size=4))
def test_any_message_content_is_refused_or_stored_exactly(
    world: World, content: Any, kwargs: dict[str, Any]
) -> None:
    session_id = f"content-{uuid.uuid4().hex[:8]}"
    history = world.history(session_id, "u")
    before = world.snapshot()
    messages = [
        HumanMessage(content=content, additional_kwargs=kwargs),
        AIMessage(content=content, additional_kwargs={"nested": kwargs}),
        *_turns(session_id, 2),
    ]
    try:
        _add(history, messages)
    except TYPED as exc:
        assert str(exc)
        assert world.snapshot() == before
        event(f"refused: {type(exc).__name__}")
        return
    event("stored")
    assert world.backup.get_messages(session_id) == messages
    assert history.messages[-4:] == messages[-4:]
    world.process()  # extraction and consolidation finish: nothing is stuck on it
    assert world.memory.search("question", session_id=session_id, k=10)
    world.memory.forget(session_id=session_id)
    assert world.snapshot() == before


@SETTINGS
@given(query=st.text(ALPHABET, max_size=2000))
def test_any_search_query_stays_in_its_scope(world: World, query: str) -> None:
    for session_id in ("alice", "$and"):
        docs = world.memory.search(query, session_id=session_id, k=50)
        assert {d.metadata["session_id"] for d in docs} == {session_id}
    docs = world.memory.search(query, user_id="u-alice", scope="user", k=50)
    assert {d.metadata["session_id"] for d in docs} == {"alice", "alice%"}


def test_a_16_mb_message_goes_through_every_tier(world: World) -> None:
    session_id = "big"
    history = world.history(session_id, "u")
    before = world.snapshot()
    big = ("应收账款 ar_invoice amount 数据 " * 700_000)[: 16 * 1024 * 1024]
    messages = [HumanMessage(big), AIMessage("noted"), *_turns("after the big one", 2)]
    _add(history, messages)
    assert world.backup.get_messages(session_id) == messages
    # The window's token budget leaves the huge turn out; the archive keeps it.
    assert history.messages == messages[2:]
    world.process()
    rows = sorted(_exact_rows(world, "memories", session_id), key=lambda row: row.seq)
    assert len(rows) == 3 and all(len(row.text) <= MEMORY_CHARS for row in rows)
    assert world.consolidator.memory(session_id)  # consolidated, the batch cut per message
    world.memory.forget(session_id=session_id)
    assert world.snapshot() == before


def _nest(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _from_deeper(frames: int, call: Callable[[], Any]) -> Any:
    return _from_deeper(frames - 1, call) if frames else call()


@pytest.mark.parametrize("depth", [50, 500, 960, 5000])
def test_deeply_nested_additional_kwargs_are_refused_or_readable_everywhere(
    world: World, depth: int
) -> None:
    session_id = f"deep-{depth}"
    history = world.history(session_id)
    before = world.snapshot()
    messages = [HumanMessage("deep", additional_kwargs=_nest(depth)), AIMessage("ok")]
    try:
        history.add_messages(messages)
    except TYPED as exc:
        assert "deep" in str(exc) or "nest" in str(exc), exc
        assert world.snapshot() == before
        return
    # Stored: then it must read back wherever a chat reads it, on deeper call stacks
    # than this test's (a Runnable under callbacks, a worker thread).
    assert _from_deeper(150, lambda: world.backup.get_messages(session_id)) == messages
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{q}")])
    chat = RunnableWithMessageHistory(
        prompt | RunnableLambda(lambda _: AIMessage("fine")),
        lambda sid: world.history(sid),
        input_messages_key="q",
        history_messages_key="history",
    )
    reply = _from_deeper(
        100, lambda: chat.invoke({"q": "hi"}, config={"configurable": {"session_id": session_id}})
    )
    assert reply.content == "fine"
    world.process()
    world.memory.forget(session_id=session_id)
    assert world.snapshot() == before


# -- configuration values ------------------------------------------------------------------------

#: Ints at the edges of SQL's and Python's integer types (LIMIT, BIGINT, C longs).
EDGE_INTS = st.sampled_from(
    [
        2**31 - 1,
        2**31,
        2**32,
        2**53 + 1,
        10**9,
        10**9 + 1,
        2**63 - 1,
        2**63,
        2**64,
        sys.maxsize,
        10**20,
        10**30,
        -(2**63),
        -(2**64),
        2**4000,
    ]
)
VALUES = st.one_of(
    st.integers(-3, 3),
    st.integers(1, 50),
    st.floats(0, 1),
    st.sampled_from(["en", "zh", "memories_2", "session", "user"]),
    st.integers(10**6, 10**12),
    EDGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
MEMORY_SETTINGS = [
    "dedupe_threshold",
    "max_attempts",
    "extract_timeout",
    "retry_base_delay",
    "poll_interval",
    "batch_size",
    "dense_weight",
    "lease_seconds",
    "language",
    "collection_name",
]
CONSOLIDATOR_SETTINGS = [
    "threshold",
    "batch",
    "max_attempts",
    "timeout",
    "retry_base_delay",
    "poll_interval",
    "lease_seconds",
    "language",
]


@pytest.fixture
def sqlite_backup(tmp_path: Path) -> Iterator[MySQLBackup]:
    archive = MySQLBackup(f"sqlite:///{tmp_path / 'config.sqlite3'}")
    yield archive
    archive.dispose()


def _settles(call: Callable[[], Any]) -> Any:
    """Run ``call``; a typed error is an answer, anything else must work."""
    try:
        value = call()
    except TYPED as exc:
        assert str(exc)
        event("refused")
        return None
    event("accepted")
    return value


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=VALUES)
@pytest.mark.parametrize("name", ["window_turns", "window_max_tokens"])
def test_history_settings_are_refused_or_work(
    sqlite_backup: MySQLBackup, name: str, value: Any
) -> None:
    session_id = f"cfg-{uuid.uuid4().hex[:8]}"
    history = _settles(
        lambda: TieredChatMessageHistory(session_id, backup=sqlite_backup, **{name: value})
    )
    if history is None:
        return
    turns = _turns("cfg")
    _add(history, turns)
    window = history.messages
    assert window == turns[len(turns) - len(window) :]  # whole turns, the newest


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=VALUES)
@pytest.mark.parametrize("name", MEMORY_SETTINGS)
def test_long_memory_settings_are_refused_or_work(
    sqlite_backup: MySQLBackup, chroma_client: Any, name: str, value: Any
) -> None:
    kwargs: dict[str, Any] = {
        "client": chroma_client,
        "collection_name": f"cfg_{uuid.uuid4().hex[:8]}",
        "embedding": HashEmbeddings(),
        "extractor": FakeExtractor(),
        "backup": sqlite_backup,
        "retry_base_delay": 0.01,
        "start_worker": name in ("poll_interval", "lease_seconds", "batch_size"),
        name: value,
    }
    memory = _settles(lambda: ChromaLongMemory(**kwargs))
    if memory is None:
        return
    try:
        session_id = f"cfg-{uuid.uuid4().hex[:8]}"
        history = TieredChatMessageHistory(session_id, backup=sqlite_backup, long_memory=memory)
        _add(history, _turns("settings"))
        memory.flush(timeout=10)  # an accepted setting must not stall the queue
        docs = memory.search("settings question", session_id=session_id)
        assert 1 <= len(docs) <= 3  # a low dedupe_threshold merges the three
        assert {doc.metadata["session_id"] for doc in docs} == {session_id}
    finally:
        memory.close(timeout=5)
        with contextlib.suppress(Exception):
            chroma_client.delete_collection(kwargs["collection_name"])


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=VALUES)
@pytest.mark.parametrize("name", CONSOLIDATOR_SETTINGS)
def test_consolidator_settings_are_refused_or_work(
    sqlite_backup: MySQLBackup, tmp_path: Path, name: str, value: Any
) -> None:
    kwargs: dict[str, Any] = {
        "root": tmp_path / "cfg",
        "backup": sqlite_backup,
        "threshold": 4,
        "batch": 2,
        "retry_base_delay": 0.01,
        "start_worker": name in ("poll_interval", "lease_seconds"),
        name: value,
    }
    consolidator = _settles(lambda: MemoryConsolidator(MemoryWriter(), **kwargs))
    if consolidator is None:
        return
    try:
        session_id = f"cfg-{uuid.uuid4().hex[:8]}"
        history = TieredChatMessageHistory(
            session_id, backup=sqlite_backup, consolidator=consolidator
        )
        _add(history, _turns("settings", 4))
        consolidator.flush(timeout=10)  # an accepted setting must not stall the queue
        if consolidator.threshold < 8:
            assert consolidator.memory(session_id)
    finally:
        consolidator.close(timeout=5)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    k=st.booleans().flatmap(lambda valid: st.integers(1, 60) if valid else VALUES),
    scope=st.booleans().flatmap(
        lambda valid: st.sampled_from(["session", "user"]) if valid else VALUES
    ),
)
def test_search_arguments_are_refused_or_work(world: World, k: Any, scope: Any) -> None:
    docs = _settles(
        lambda: world.memory.search(
            "question", session_id="alice", user_id="u-alice", scope=scope, k=k
        )
    )
    if docs is not None:
        assert 0 < len(docs) <= k
        assert {d.metadata["user_id"] for d in docs} == {"u-alice"}


FIXTURE_TABLE = re.compile(r"[a-z_]+_[0-9a-f]{10,12}(_[a-z_]+)?")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.one_of(st.sampled_from(ATTACKS), st.text(ALPHABET, max_size=60), VALUES))
def test_table_names_are_refused_or_used_verbatim(backend_url: str, name: Any) -> None:
    engine = sa.create_engine(backend_url)

    def table_names() -> set[str]:
        # Other tests' fixture tables (t_<12 hex>...) may come and go meanwhile.
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
        return {n for n in names if not FIXTURE_TABLE.fullmatch(n)}

    try:
        tables = table_names()
        archive = _settles(lambda: MySQLBackup(engine, table_name=name))
        now = table_names()
        if archive is None:
            assert now == tables
            return
        try:
            assert now - tables <= {t.name for t in archive.metadata.sorted_tables}
            assert archive.table.name == name
            archive.add_messages("s", _turns("table"))
            assert archive.get_messages("s") == _turns("table")
        finally:
            archive.metadata.drop_all(engine, checkfirst=True)
    finally:
        engine.dispose()


# -- integers that reach SQL ---------------------------------------------------------------

INTS = st.one_of(st.integers(), EDGE_INTS, st.integers(-3, 12), st.booleans())
INT_ARGUMENTS = [
    "history limit",
    "history before_id",
    "files limit",
    "files before_id",
    "tail turns",
    "files tail turns",
    "window_turns",
    "search k",
]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from(INT_ARGUMENTS), value=INTS)
@example(where="history before_id", value=10**30)
@example(where="history limit", value=10**20)
@example(where="tail turns", value=10**20)
@example(where="window_turns", value=10**20)
@example(where="search k", value=10**20)
def test_any_integer_is_refused_or_answers_exactly(world: World, where: str, value: Any) -> None:
    """Limits, ids and counts: a typed error, or the page a user would expect."""
    archive: Any = world.files if where.startswith("files") else world.backup
    all_ids = [row.id for row in archive.history("alice", limit=1000)]
    turns = len(all_ids) // 2  # the bystander's whole turns
    calls: dict[str, Callable[[], Any]] = {
        "history limit": lambda: archive.history("alice", limit=value),
        "history before_id": lambda: archive.history("alice", before_id=value),
        "tail turns": lambda: archive.tail("alice", value),
        "window_turns": lambda: (
            TieredChatMessageHistory(
                "alice", user_id="u-alice", backup=world.backup, window_turns=value
            ).messages
        ),
        "search k": lambda: world.memory.search(
            "question", session_id="alice", user_id="u-alice", k=value
        ),
    }
    calls["files limit"] = calls["history limit"]
    calls["files before_id"] = calls["history before_id"]
    calls["files tail turns"] = calls["tail turns"]
    answer = _settles(calls[where])
    if answer is None:
        assert isinstance(value, bool) or not 1 <= value <= 10**9 or "before_id" in where
        return
    assert not isinstance(value, bool)
    if where.endswith("limit"):
        assert [row.id for row in answer] == all_ids[len(all_ids) - min(value, len(all_ids)) :]
    elif where.endswith("before_id"):
        assert [row.id for row in answer] == [i for i in all_ids if i < value]
    elif where.endswith("turns"):
        assert len(answer) == 2 * min(value, turns)
    else:
        assert 0 < len(answer) <= value
        assert {doc.metadata["session_id"] for doc in answer} == {"alice"}


# -- URLs with passwords ---------------------------------------------------------------------

PASSWORDS = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
    st.sampled_from(["p@ss:/?#&=%", "mysql", "127.0.0.1", "***", "test", "root"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    password=PASSWORDS,
    where=st.sampled_from(["userinfo", "password", "passwd", "PASSWORD", "api_token"]),
)
def test_no_password_anywhere_in_a_url_shows(password: str, where: str) -> None:
    """What is shown of a URL, and an error about it, never depends on its password.

    (Only on whether the drivers can send it at all.)
    """

    def shown(secret: str) -> tuple[str, str]:
        base = sa.URL.create(
            "mysql+pymysql",
            username="app",
            host="127.0.0.1",
            port=1,  # refused at once
            database="test",
            query={"charset": "utf8mb4"},
        )
        url = (
            base.set(password=secret)
            if where == "userinfo"
            else base.update_query_dict({where: secret})
        ).render_as_string(hide_password=False)
        with pytest.raises((*TYPED, ArchiveUnavailableError)) as caught:
            MySQLBackup(url)
        return render_url(url), f"{type(caught.value).__name__}: {caught.value}"

    try:  # the drivers take Latin-1 passwords only: compare with one of the same kind
        password.encode("latin-1")
        reference = "another-Secret-9"
    except UnicodeEncodeError:
        reference = "another-Secret-\u0100"
    assert shown(password) == shown(reference)
