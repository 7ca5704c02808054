"""Concurrent writers never interleave a batch; concurrent searches never see half an update.

Each process archives 50 batches ``[AIMessage(tool_calls=[...]), ToolMessage(...)...]``
(one or two calls each) into the same session at the same moment (they start together
on a signal); one process uses the async driver. In archive order every AI tool call
must be followed at once by its ToolMessages: a provider rejects a history where
anything comes in between. Threads searching one scope while it grows each get
a whole answer, and a slow or damaged Chroma holds up no other search.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from langchain_tiered_memory import MySQLBackup

REPO = Path(__file__).resolve().parent.parent
PROCESSES = 3
BATCHES = 50
SESSION = "shared-session"
USER = "u1"


def _batch(process: int, n: int, calls: int = 1) -> list[BaseMessage]:
    ids = [f"call-{process}-{n}-{j}" for j in range(calls)]
    return [
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"n": n}, "id": i} for i in ids]),
        *(ToolMessage(f"result of {i}", tool_call_id=i) for i in ids),
    ]


def _writer(url: str, table: str, process: int) -> None:
    """Child process: wait for ``go`` on stdin, then archive the batches."""
    backup = MySQLBackup(url, table_name=table)
    backup.add_messages(f"warm-up-{process}", _batch(process, -1), user_id=USER)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    assert sys.stdin.readline().strip() == "go"
    batches = [_batch(process, n, calls=1 + n % 2) for n in range(BATCHES)]
    if process == 1:

        async def write() -> None:
            for batch in batches:
                await backup.aadd_messages(SESSION, batch, user_id=USER)
            await backup.adispose()

        asyncio.run(write())
    else:
        for batch in batches:
            backup.add_messages(SESSION, batch, user_id=USER)
    backup.dispose()


def _unanswered(messages: list[BaseMessage]) -> list[str]:
    """Tool call ids whose ToolMessage does not come right after their AI message."""
    broken = []
    for i, message in enumerate(messages):
        for j, call in enumerate(getattr(message, "tool_calls", None) or ()):
            following = messages[i + 1 + j] if i + 1 + j < len(messages) else None
            if not isinstance(following, ToolMessage) or following.tool_call_id != call["id"]:
                broken.append(call["id"])
    return broken


def _run_together(commands: list[list[str]]) -> None:
    """Run ``python -c`` children that print ``ready``, then all go at once; all must succeed."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", *command],
            cwd=REPO,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        for child in children:  # every child ready before any goes
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == "ready\n", child.communicate(timeout=60)[1]
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        errors = [child.communicate(timeout=240)[1] for child in children]
        assert [child.returncode for child in children] == [0] * len(children), errors
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_writer_processes_keep_tool_calls_next_to_their_results(
    backup: MySQLBackup, backend_url: str, table_name: str
) -> None:
    _run_together([[_CHILD, backend_url, table_name, str(n)] for n in range(PROCESSES)])

    messages = backup.get_messages(SESSION)
    calls = [c["id"] for m in messages for c in getattr(m, "tool_calls", None) or ()]
    assert len(calls) == len(set(calls)) == PROCESSES * (BATCHES + BATCHES // 2)
    assert len(messages) == PROCESSES * BATCHES + len(calls)
    broken = _unanswered(messages)
    assert not broken, f"{len(broken)} of {len(calls)} tool calls not followed by their result"


_CHILD = (
    "import sys; from tests.test_reliability_concurrency import _writer; "
    "_writer(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
)


@pytest.mark.parametrize(
    ("messages", "broken"),
    [
        (_batch(0, 0) + _batch(1, 0, calls=2), []),
        ([*_batch(0, 0)[:1], *_batch(1, 0), _batch(0, 0)[1]], ["call-0-0-0"]),
        ([*_batch(0, 0, calls=2)[:2], *_batch(1, 0), _batch(0, 0, calls=2)[2]], ["call-0-0-1"]),
        (_batch(0, 0)[:1], ["call-0-0-0"]),
    ],
)
def test_the_check_sees_a_separated_tool_call(
    messages: list[BaseMessage], broken: list[str]
) -> None:
    assert _unanswered(messages) == broken


def _starter(url: str, table: str) -> None:
    """Child process: wait for ``go`` on stdin, then open an archive and a store."""
    from langchain_tiered_memory import TieredStore

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    assert sys.stdin.readline().strip() == "go"
    backup = MySQLBackup(url, table_name=table)
    TieredStore(backup).put(("ns",), f"pid-{os.getpid()}", {"started": True})
    backup.dispose()


_STARTER = (
    "import sys; from tests.test_reliability_concurrency import _starter; "
    "_starter(sys.argv[1], sys.argv[2])"
)


def test_processes_starting_at_once_on_a_fresh_database_all_start(
    backend_url: str, table_name: str
) -> None:
    """Six workers of a deployment start together: on MySQL all but one failed with
    "Table ... already exists" (each checked for the tables, then created them)."""
    _run_together([[_STARTER, backend_url, table_name]] * 6)
    from langchain_tiered_memory import TieredStore

    backup = MySQLBackup(backend_url, table_name=table_name)
    store = TieredStore(backup)
    try:
        assert len(store.search(("ns",), limit=10)) == 6
    finally:
        store.metadata.drop_all(backup.engine)
        backup.metadata.drop_all(backup.engine)
        backup.dispose()


def test_creating_tables_beside_a_busy_writer_waits_instead_of_failing(tmp_path: Path) -> None:
    """A store's tables are created while another thread archives (the README's Quickstart).

    SQLite fails a deferred transaction that read before another connection wrote
    ("database is locked", with no wait); creating tables must wait for the writer.
    """
    import threading

    from sqlalchemy import Column, Integer, MetaData, Table

    backup = MySQLBackup(f"sqlite:///{tmp_path / 'busy.db'}")
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            backup.add_messages("busy", [AIMessage(f"reply {n}")], user_id=USER)
            written.append(n)
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for n in range(15):
            metadata = MetaData()
            Table(f"beside_{n}", metadata, Column("id", Integer, primary_key=True))
            backup.create_all(metadata)
            MySQLBackup(backup.engine).create_tables()
    finally:
        stop.set()
        writer.join()
    assert written and len(backup.history("busy", limit=len(written) + 1)) == len(written)
    backup.dispose()


@pytest.mark.parametrize("exact_limit", [20_000, 1], ids=["exact", "index"])
def test_searches_of_a_scope_that_grows_meanwhile_all_answer(
    make_memory: Any, backup: MySQLBackup, exact_limit: int
) -> None:
    """Threads search one user while the worker adds to it (an app beside its worker).

    Each search brings the scope's cached index up to date; another thread may be
    reading that index at the same moment. Every search must answer with memories
    of the scope, never an ``IndexError`` or a ``BufferError`` from a half-done update.
    """
    import threading
    import time

    from langchain_tiered_memory import TieredChatMessageHistory

    memory = make_memory(exact_limit=exact_limit)
    chat = TieredChatMessageHistory("s", user_id=USER, backup=backup, long_memory=memory)
    for n in range(600):
        chat.add_messages(
            [HumanMessage(f"invoice {n} for client {n % 13} is due"), AIMessage(f"noted {n}")]
        )
    memory.run_pending()
    stop = threading.Event()
    errors: list[BaseException] = []
    answers: list[int] = []

    def grow() -> None:
        n = 600
        while not stop.is_set():
            chat.add_messages([HumanMessage(f"invoice {n} is paid"), AIMessage(f"ok {n}")])
            memory.run_pending()
            n += 1

    def search(worker: int) -> None:
        queries = ["which invoice is due", "client 7 invoice", "paid invoices", "noted"]
        n = 0
        while not stop.is_set():
            try:
                found = memory.search(
                    queries[(n + worker) % len(queries)],
                    user_id=USER,
                    scope="user",
                    k=5,
                    since="2000-01-01" if n % 2 else None,
                )
                assert len(found) == 5
                assert {doc.metadata["user_id"] for doc in found} == {USER}
                answers.append(1)
            except BaseException as exc:
                errors.append(exc)
                return
            n += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: every interleaving gets its chance
    threads = [threading.Thread(target=grow)] + [
        threading.Thread(target=search, args=(w,)) for w in range(3)
    ]
    try:
        for thread in threads:
            thread.start()
        time.sleep(6)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(answers) > 50


class StalledQueries:
    """A Chroma collection whose first query (of one user, if given) stalls, then acts.

    ``then`` is called in the stalled query: it may raise, as a damaged collection does.
    """

    def __init__(self, collection: Any, user: str | None = None, then: Any = None) -> None:
        import threading

        self.collection = collection
        self.user = user
        self.then = then
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collection, name)

    def query(self, **kwargs: Any) -> Any:
        mine = self.user is None or kwargs.get("where") == {"user_id": self.user}
        if mine and not self.entered.is_set():
            self.entered.set()
            self.release.wait(20)
            if self.then is not None:
                self.then()
        return self.collection.query(**kwargs)


def _users(make_memory: Any, backup: MySQLBackup, users: str) -> Any:
    """A tier searched through Chroma, with memories of each user, every scope cached."""
    from langchain_tiered_memory import TieredChatMessageHistory

    memory = make_memory(exact_limit=0)  # every search asks Chroma
    for user in users:
        chat = TieredChatMessageHistory(
            f"s-{user}", user_id=user, backup=backup, long_memory=memory
        )
        for n in range(10):
            chat.add_messages([HumanMessage(f"invoice {n} is due"), AIMessage(f"noted {n}")])
    memory.run_pending()
    for user in users:
        memory.search("invoice", user_id=user, scope="user", k=3)
    return memory


def _grow(memory: Any, backup: MySQLBackup, user: str) -> None:
    backup.add_messages(
        f"s-{user}",
        [HumanMessage("invoice 99 is paid"), AIMessage("ok")],
        user_id=user,
        jobs=["extract"],
    )
    memory.run_pending()


def test_a_repair_of_chroma_during_a_search_holds_up_no_other_search(
    make_memory: Any, backup: MySQLBackup
) -> None:
    """A search finds the collection damaged and rebuilds it (the rebuild clears the
    scope cache) while another search of the same scope brings that scope up to date."""
    import threading

    from chromadb.errors import InternalError

    memory = _users(make_memory, backup, "a")

    def damaged() -> None:
        msg = "Error in compaction: Failed to apply logs to the hnsw segment writer"
        raise InternalError(msg)

    stalled = StalledQueries(memory.collection, then=damaged)
    memory.collection = stalled
    found: dict[str, list[Any]] = {}

    def search(name: str, query: str) -> None:
        found[name] = memory.search(query, user_id="a", scope="user", k=3)

    first = threading.Thread(target=search, args=("first", "invoice due"), daemon=True)
    first.start()
    assert stalled.entered.wait(20)
    _grow(memory, backup, "a")  # the second search adds to the cached scope
    second = threading.Thread(target=search, args=("second", "invoice paid"), daemon=True)
    second.start()
    second.join(0.5)  # let it reach the scope (or finish)
    stalled.release.set()
    first.join(30)
    second.join(30)

    assert not first.is_alive() and not second.is_alive(), "deadlocked"
    assert len(found["first"]) == 3 and len(found["second"]) == 3
    assert memory.collection.count() == 11  # rebuilt from the catalog, nothing lost


def test_a_slow_vector_index_for_one_user_holds_up_no_other_user(
    make_memory: Any, backup: MySQLBackup
) -> None:
    import threading
    import time

    memory = _users(make_memory, backup, "ab")
    stalled = StalledQueries(memory.collection, user="a")  # a far or loaded Chroma server
    memory.collection = stalled
    slow = threading.Thread(
        target=memory.search, args=("invoice due",), kwargs={"user_id": "a", "scope": "user"}
    )
    slow.start()
    assert stalled.entered.wait(20)
    _grow(memory, backup, "a")
    behind = threading.Thread(  # waits for user a's scope, as it should
        target=memory.search, args=("invoice paid",), kwargs={"user_id": "a", "scope": "user"}
    )
    behind.start()
    behind.join(0.3)
    try:
        started = time.monotonic()
        assert memory.search("invoice", user_id="b", scope="user", k=3)
        took = time.monotonic() - started
    finally:
        stalled.release.set()
        slow.join(30)
        behind.join(30)
    assert took < 2.0  # user b's search does not wait for user a's Chroma query


# -- the scope cache: brought up to date by whichever search comes first -------------


def _invoices(make_memory: Any, backup: MySQLBackup, n: int, **options: Any) -> Any:
    memory = make_memory(**options)
    for i in range(n):
        _turn(backup, memory, f"invoice {i} costs {i * 7} euros")
    return memory


def _turn(backup: MySQLBackup, memory: Any, text: str) -> None:
    backup.add_messages("s1", [HumanMessage(text), AIMessage("ok")], user_id=USER, jobs=["extract"])
    memory.run_pending()


def _whole_reads(memory: Any, pause: Any = None) -> list[int]:
    """Count (and optionally hold up) the reads of a whole scope from the catalog."""
    import threading

    catalog = memory.searcher.catalog
    inner = catalog.rows_plan
    reads: list[int] = []

    def rows_plan(condition: Any, after: int, *, vectors: bool) -> Any:
        if after == 0:
            reads.append(threading.get_ident())
            if pause is not None:
                pause()
        return inner(condition, after, vectors=vectors)

    catalog.rows_plan = rows_plan
    return reads


def test_searches_after_a_deletion_elsewhere_read_the_scope_once(
    make_memory: Any, backup: MySQLBackup
) -> None:
    import threading
    import time

    memory = _invoices(make_memory, backup, 30)
    memory.search("invoice", user_id=USER, scope="user")  # cached
    reads = _whole_reads(memory, pause=lambda: time.sleep(0.2))  # a large scope
    catalog = memory.searcher.catalog
    forgotten = backup.run(catalog.scope_page_plan(None, USER))[0]
    backup.run(catalog.delete_plan([forgotten]), write=True)  # by another process

    searches = [
        threading.Thread(
            target=memory.search, args=("invoice 3",), kwargs={"user_id": USER, "scope": "user"}
        )
        for _ in range(8)
    ]
    for thread in searches:
        thread.start()
    for thread in searches:
        thread.join()

    assert len(reads) == 1  # one search reads it again; the others use that


def test_a_search_that_read_an_older_version_does_not_set_the_cache_back(
    make_memory: Any, backup: MySQLBackup
) -> None:
    import threading

    memory = _invoices(make_memory, backup, 6)
    memory.search("invoice", session_id="s1")  # cached
    _turn(backup, memory, "memory seven")
    catalog = memory.searcher.catalog
    reached, go = threading.Event(), threading.Event()
    slow: dict[str, int] = {}
    inner = catalog.version_plan

    def version_plan(condition: Any) -> Any:
        version = yield from inner(condition)
        if threading.get_ident() == slow.get("thread"):
            reached.set()
            go.wait(10)  # read the version, then descheduled
        return version

    catalog.version_plan = version_plan
    reads = _whole_reads(memory)

    def late() -> None:
        slow["thread"] = threading.get_ident()
        memory.search("invoice", session_id="s1")

    thread = threading.Thread(target=late)
    thread.start()
    assert reached.wait(10)
    _turn(backup, memory, "memory eight")
    memory.search("invoice", session_id="s1")  # brings the cache to 8 memories
    (cached,) = memory.searcher._scopes.values()
    newest = cached.version
    go.set()
    thread.join()
    memory.search("invoice", session_id="s1")

    assert cached.version == newest and len(cached.rows) == 8
    assert reads == []  # no memory was deleted: nothing read whole


def test_a_memory_forgotten_elsewhere_never_stays_in_the_cached_scope(
    make_memory: Any, backup: MySQLBackup
) -> None:
    # The version and the rows of a scope are read as of one moment: a rebuild
    # never holds a row its version does not count.
    import threading

    memory = _invoices(make_memory, backup, 6, dense_weight=0.0)
    memory.search("invoice", session_id="s1", k=2)  # cached
    catalog = memory.searcher.catalog
    rows = backup.run(catalog.rows_plan(catalog.table.c.session_id == "s1", 0, vectors=False))
    ids = [row.id for row in rows]  # oldest first
    backup.run(catalog.delete_plan([ids[0]]), write=True)  # forgotten elsewhere: rebuild
    reached, go = threading.Event(), threading.Event()
    slow: dict[str, int] = {}

    def pause() -> None:
        if threading.get_ident() == slow.get("thread"):
            reached.set()
            go.wait(10)

    _whole_reads(memory, pause)

    def rebuild() -> None:
        slow["thread"] = threading.get_ident()
        memory.search("invoice", session_id="s1", k=2)

    thread = threading.Thread(target=rebuild)
    thread.start()
    assert reached.wait(10)  # between reading the version and the rows
    _turn(backup, memory, "a new memory about shipping")
    go.set()
    thread.join()
    backup.run(catalog.delete_plan([ids[-1]]), write=True)  # the newest before it, elsewhere

    (cached,) = memory.searcher._scopes.values()
    found = memory.search("zebra", session_id="s1", k=2)  # no match: the newest two

    assert ids[-1] not in cached.rows
    assert len(found) == 2


def test_a_grown_turn_committed_out_of_seq_order_is_seen(
    make_memory: Any, backup: MySQLBackup
) -> None:
    # On a server, a transaction may commit a lower seq after a higher one. A grown
    # turn (its row re-inserted under a new seq) committed so leaves the scope's
    # count and highest seq as they were: the sum of the seqs still changes.
    from sqlalchemy import delete, insert

    memory = _invoices(make_memory, backup, 4, dense_weight=0.0)
    catalog = memory.searcher.catalog
    table = catalog.table
    rows = backup.run(catalog.rows_plan(table.c.session_id == "s1", 0, vectors=True))
    gap = rows[1]  # its seq goes to a transaction that commits late
    backup.run(catalog.delete_plan([gap.id]), write=True)
    memory.search("invoice", session_id="s1", k=3)  # cached
    grown = rows[0]

    def late_commit() -> Any:
        yield delete(table).where(table.c.id == grown.id)
        values = {column.name: getattr(grown, column.name) for column in table.c}
        values.update(seq=gap.seq, text="invoice 0 costs 0 euros, paid in zanzibar")
        yield insert(table).values(**values)

    backup.run(late_commit(), write=True)
    found = memory.search("zanzibar", session_id="s1", k=1)

    assert "zanzibar" in found[0].page_content
    (cached,) = memory.searcher._scopes.values()
    assert "zanzibar" in cached.rows[grown.id].text
