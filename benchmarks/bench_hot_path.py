"""Hot-path benchmark: ``TieredChatMessageHistory`` beside ``SQLChatMessageHistory``.

Two measurements, on SQLite (a file in the temp folder) and on MySQL/MariaDB:

1. **Per-turn hot path**: ``add_messages([HumanMessage, AIMessage])`` then
   ``.messages``, p50/p95 over ``--turns`` turns, in tables pre-filled to each of
   ``--sizes`` rows (spread over 1000 sessions). The measured session starts with
   20 turns, so our 10-turn window is full from the first measured turn.
2. **Window read**: ``.messages`` on one session holding 10k messages (5k turns):
   our 10-turn window against the peer, which reads and decodes all 10k.

Each implementation gets the engine it would build from the URL itself:
``MySQLBackup(url)`` for ours, ``create_engine(url)`` for the peer (what
``SQLChatMessageHistory(connection=url)`` does). Each has its own tables
(``bench_ours_<rows>``, ``bench_peer_<rows>``, ``bench_*_window``), filled with bulk
Core inserts of its own row format and reused by later runs when they hold the right
number of rows (``--fresh`` rebuilds them). Every table is filled before anything is
timed, and on MySQL the run waits for InnoDB to write the fill back first.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_hot_path
    .venv/bin/python -m benchmarks.bench_hot_path --sizes 10000 --turns 100 --skip-mysql
    .venv/bin/python -m benchmarks.bench_hot_path --json bench.json --fresh

MySQL comes from ``--mysql-url`` (default ``$TIERED_MEMORY_MYSQL_URL`` or
``mysql+pymysql://root@127.0.0.1:3306/test``). Filling 1M rows takes a minute or two
per implementation on MySQL the first time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict

from benchmarks.stats import percentile
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory

with warnings.catch_warnings():
    # langchain-community warns on import that it is being sunset; the peer still works.
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_message_histories import SQLChatMessageHistory

DEFAULT_MYSQL_URL = os.environ.get(
    "TIERED_MEMORY_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)
DEFAULT_SQLITE_PATH = Path(tempfile.gettempdir()) / "tiered_memory_bench.sqlite3"

FILL_SESSIONS = 1000  # filler rows are spread round-robin over this many sessions
SEED_TURNS = 20  # turns the measured session holds before the first measured turn
WARMUP = 20  # unmeasured iterations before each measurement
WINDOW_TURNS = 10
WINDOW_MAX_TOKENS = 8000
WINDOW_MESSAGES = 10_000  # messages of the single session of the window-read test
WINDOW_READS = 30
INSERT_CHUNK_ROWS = 10_000  # rows per executemany
TRANSACTION_ROWS = 50_000  # rows per transaction while filling

TARGET_ROWS = 1_000_000  # the hot-path targets apply at this table size
HOT_PATH_TARGET_MS = {"sqlite": 2.0, "mysql": 5.0}
WINDOW_SPEEDUP_TARGET = 10.0

Row = dict[str, Any]


def log(text: str) -> None:
    """Progress goes to stderr so the table on stdout stays clean."""
    print(text, file=sys.stderr, flush=True)


# -- messages -----------------------------------------------------------------


def turn_texts(turn: int) -> tuple[str, str]:
    """A question and an answer of a realistic length (~80 characters each)."""
    return (
        f"Question {turn}: what changed in the deployment, and why did p95 latency go up?",
        f"Answer {turn}: the cache was cold after the rollout; warm it before moving traffic.",
    )


def turn_messages(turn: int) -> list[BaseMessage]:
    """One turn: a human message and the AI's answer."""
    question, answer = turn_texts(turn)
    return [HumanMessage(question), AIMessage(answer)]


@functools.cache
def _dict_template(role: str) -> dict[str, Any]:
    message = HumanMessage("") if role == "human" else AIMessage("")
    return message_to_dict(message)


def message_dict(role: str, content: str) -> dict[str, Any]:
    """``message_to_dict`` of a message, built from a cached template (fast in bulk)."""
    template = _dict_template(role)
    return {"type": template["type"], "data": {**template["data"], "content": content}}


def filler_messages(total: int, sessions: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(session_id, role, message dict)`` rows, round-robin over ``sessions``.

    Each session alternates human and AI messages, like real turns; rows of a
    session are spread over the whole table, like concurrent conversations.
    """
    for i in range(total):
        session = f"fill-{i % sessions:04d}"
        turn, is_ai = divmod(i // sessions, 2)
        role = "ai" if is_ai else "human"
        yield session, role, message_dict(role, turn_texts(turn)[is_ai])


# -- the two implementations --------------------------------------------------


@dataclass
class Impl:
    """One chat-history implementation bound to one table."""

    name: str
    engine: sa.Engine
    table: sa.Table
    make_row: Callable[[str, str, dict[str, Any], datetime], Row]
    new_history: Callable[[str], BaseChatMessageHistory]
    create: Callable[[], None]
    drop: Callable[[], None]


def ours(url: str, table_name: str) -> Impl:
    """``TieredChatMessageHistory`` over ``MySQLBackup``, with its own engine."""
    backup = MySQLBackup(url, table_name=table_name)

    def make_row(session_id: str, role: str, payload: dict[str, Any], at: datetime) -> Row:
        return {
            "session_id": session_id,
            "user_id": None,
            "role": role,
            "message": json.dumps(payload, ensure_ascii=False),
            "parts": 0,
            "created_at": at,
        }

    def new_history(session_id: str) -> BaseChatMessageHistory:
        return TieredChatMessageHistory(
            session_id,
            backup=backup,
            window_turns=WINDOW_TURNS,
            window_max_tokens=WINDOW_MAX_TOKENS,
        )

    return Impl(
        name="ours",
        engine=backup.engine,
        table=backup.table,
        make_row=make_row,
        new_history=new_history,
        create=backup.create_tables,
        drop=lambda: backup.metadata.drop_all(backup.engine, checkfirst=True),
    )


def peer(url: str, table_name: str) -> Impl:
    """langchain-community's ``SQLChatMessageHistory`` (columns id, session_id, message)."""
    engine = sa.create_engine(url)  # what SQLChatMessageHistory(connection=url) does

    def new_history(session_id: str) -> SQLChatMessageHistory:
        return SQLChatMessageHistory(
            session_id=session_id, connection=engine, table_name=table_name
        )

    # Constructing a history creates the table; its ORM model holds the schema.
    table: sa.Table = new_history("bench-probe").sql_model_class.__table__

    def make_row(session_id: str, role: str, payload: dict[str, Any], at: datetime) -> Row:
        del role, at  # the peer stores neither
        return {"session_id": session_id, "message": json.dumps(payload)}

    return Impl(
        name="peer",
        engine=engine,
        table=table,
        make_row=make_row,
        new_history=new_history,
        create=lambda: table.create(engine, checkfirst=True),
        drop=lambda: table.drop(engine, checkfirst=True),
    )


IMPLS: dict[str, Callable[[str, str], Impl]] = {"ours": ours, "peer": peer}


# -- filling tables -----------------------------------------------------------


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of up to ``size`` items (``itertools.batched`` is Python 3.12+)."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def row_count(impl: Impl) -> int:
    """How many rows the implementation's table holds."""
    with impl.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(impl.table)).scalar_one())


def bulk_fill(impl: Impl, total: int, sessions: int) -> None:
    """Insert ``total`` filler rows: executemany chunks, one transaction per 50k rows."""
    start = datetime(2024, 1, 1)
    rows = (
        impl.make_row(session, role, payload, start + timedelta(milliseconds=i))
        for i, (session, role, payload) in enumerate(filler_messages(total, sessions))
    )
    statement = sa.insert(impl.table)
    done = 0
    began = time.perf_counter()
    with impl.engine.connect() as conn:
        for transaction_rows in batched(rows, TRANSACTION_ROWS):
            with conn.begin():
                for chunk in batched(transaction_rows, INSERT_CHUNK_ROWS):
                    conn.execute(statement, chunk)
            done += len(transaction_rows)
            if total > TRANSACTION_ROWS:
                log(f"    {done:>9,} / {total:,} rows  {time.perf_counter() - began:6.1f} s")


def ensure_filled(impl: Impl, total: int, sessions: int, fresh: bool) -> float:
    """Make the table hold exactly ``total`` filler rows; returns seconds spent filling.

    A table that already holds ``total`` rows is reused; any other is rebuilt.
    """
    if fresh:
        impl.drop()
        impl.create()
    existing = row_count(impl)
    if existing == total:
        log(f"  {impl.table.name}: reusing {total:,} rows")
        return 0.0
    if existing:
        log(f"  {impl.table.name}: holds {existing:,} rows, not {total:,}; rebuilding")
        impl.drop()
        impl.create()
    log(f"  {impl.table.name}: filling {total:,} rows")
    began = time.perf_counter()
    bulk_fill(impl, total, sessions)
    elapsed = time.perf_counter() - began
    log(f"  {impl.table.name}: filled in {elapsed:.1f} s")
    return elapsed


# -- timing -------------------------------------------------------------------


@dataclass
class Result:
    """One line of the report."""

    bench: str
    backend: str
    rows: int
    impl: str
    p50_ms: float
    p95_ms: float
    write_p50_ms: float | None = None
    read_p50_ms: float | None = None
    samples: int = 0
    target: str = ""
    passed: bool | None = None


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def check(condition: bool, what: str) -> None:
    """Stop the benchmark if an implementation returned something wrong."""
    if not condition:
        raise RuntimeError(f"sanity check failed: {what}")


def time_hot_path(
    history: BaseChatMessageHistory, turns: int, first_turn: int, expect_window: bool
) -> tuple[list[float], list[float]]:
    """Write and read seconds of each measured turn, after ``WARMUP`` unmeasured ones."""
    writes: list[float] = []
    reads: list[float] = []
    for i in range(WARMUP + turns):
        messages = turn_messages(first_turn + i)
        began = time.perf_counter()
        history.add_messages(messages)
        written = time.perf_counter()
        window = history.messages
        read = time.perf_counter()
        check(window[-1].content == messages[-1].content, "the read misses the new turn")
        if expect_window:
            check(len(window) == 2 * WINDOW_TURNS, f"window of {len(window)} messages")
        if i >= WARMUP:
            writes.append(written - began)
            reads.append(read - written)
    return writes, reads


def bench_hot_path(impl: Impl, backend: str, rows: int, turns: int) -> Result:
    """The per-turn hot path on a fresh session seeded with ``SEED_TURNS`` turns."""
    session_id = f"bench-hot-{uuid.uuid4().hex[:12]}"
    history = impl.new_history(session_id)
    history.add_messages([m for turn in range(SEED_TURNS) for m in turn_messages(turn)])
    try:
        writes, reads = time_hot_path(history, turns, SEED_TURNS, impl.name == "ours")
    finally:
        history.clear()  # the table goes back to its filler rows, ready for a re-run
    totals = [w + r for w, r in zip(writes, reads, strict=True)]
    result = Result(
        bench="hot path",
        backend=backend,
        rows=rows,
        impl=impl.name,
        p50_ms=ms(percentile(totals, 50)),
        p95_ms=ms(percentile(totals, 95)),
        write_p50_ms=ms(percentile(writes, 50)),
        read_p50_ms=ms(percentile(reads, 50)),
        samples=len(totals),
    )
    if impl.name == "ours" and rows >= TARGET_ROWS:
        limit = HOT_PATH_TARGET_MS[backend]
        result.target = f"p50 <= {limit:g} ms"
        result.passed = result.p50_ms <= limit
    return result


def time_reads(history: BaseChatMessageHistory, reads: int, expected: int) -> list[float]:
    """Seconds of each ``.messages`` read, after ``WARMUP`` unmeasured ones."""
    samples: list[float] = []
    for i in range(WARMUP + reads):
        began = time.perf_counter()
        messages = history.messages
        elapsed = time.perf_counter() - began
        check(len(messages) == expected, f"read {len(messages)} messages, not {expected}")
        if i >= WARMUP:
            samples.append(elapsed)
    return samples


def bench_window_read(impls: dict[str, Impl], backend: str) -> list[Result]:
    """``.messages`` on one session of ``WINDOW_MESSAGES`` messages: ours vs the peer."""
    results: dict[str, Result] = {}
    for name, expected in (("ours", 2 * WINDOW_TURNS), ("peer", WINDOW_MESSAGES)):
        samples = time_reads(impls[name].new_history("fill-0000"), WINDOW_READS, expected)
        results[name] = Result(
            bench="window read",
            backend=backend,
            rows=WINDOW_MESSAGES,
            impl=name,
            p50_ms=ms(percentile(samples, 50)),
            p95_ms=ms(percentile(samples, 95)),
            read_p50_ms=ms(percentile(samples, 50)),
            samples=len(samples),
        )
    ours_result, peer_result = results["ours"], results["peer"]
    speedup = peer_result.p50_ms / ours_result.p50_ms
    ours_result.target = f">= {WINDOW_SPEEDUP_TARGET:g}x faster (got {speedup:.1f}x)"
    ours_result.passed = speedup >= WINDOW_SPEEDUP_TARGET
    return [ours_result, peer_result]


# -- one backend --------------------------------------------------------------


def wait_for_mysql_flush(engine: sa.Engine, timeout: float = 180.0) -> None:
    """Let InnoDB write back the pages a bulk fill dirtied, so they do not slow the timings."""
    query = sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
    began = time.perf_counter()
    dirty = -1
    with engine.connect() as conn:
        while time.perf_counter() - began < timeout:
            dirty = int(conn.execute(query).one()[1])
            if dirty < 1000:  # pages of 16 KB: under 16 MB left to write
                break
            time.sleep(2)
    log(f"  waited {time.perf_counter() - began:.0f} s for InnoDB to flush ({dirty} dirty pages)")


def run_backend(
    backend: str, url: str, sizes: list[int], turns: int, fresh: bool
) -> tuple[list[Result], dict[str, float]]:
    """Fill every table, then run every measurement; returns results and fill times."""
    hot = {
        (rows, name): make(url, f"bench_{name}_{rows}")
        for rows in sizes
        for name, make in IMPLS.items()
    }
    window = {name: make(url, f"bench_{name}_window") for name, make in IMPLS.items()}
    fill_seconds: dict[str, float] = {}
    for (rows, _), impl in hot.items():
        fill_seconds[impl.table.name] = ensure_filled(impl, rows, FILL_SESSIONS, fresh)
    for impl in window.values():
        fill_seconds[impl.table.name] = ensure_filled(impl, WINDOW_MESSAGES, 1, fresh)
    if backend == "mysql" and any(fill_seconds.values()):
        wait_for_mysql_flush(hot[sizes[0], "ours"].engine)

    results: list[Result] = []
    for (rows, name), impl in hot.items():
        log(f"  {backend} {rows:,} rows, {name}: {turns} turns")
        results.append(bench_hot_path(impl, backend, rows, turns))
    log(f"  {backend} window read: {WINDOW_MESSAGES:,} messages in one session")
    results.extend(bench_window_read(window, backend))
    for impl in (*hot.values(), *window.values()):
        impl.engine.dispose()
    return results, {f"{backend}/{table}": seconds for table, seconds in fill_seconds.items()}


def mysql_unreachable(url: str) -> str | None:
    """``None`` when the server answers, else why not."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except sa.exc.SQLAlchemyError as exc:
        return str(exc).splitlines()[0]
    finally:
        engine.dispose()


# -- report -------------------------------------------------------------------

COLUMNS = (
    "benchmark",
    "backend",
    "rows",
    "impl",
    "p50 ms",
    "p95 ms",
    "write p50",
    "read p50",
    "target",
    "result",
)


def cells(result: Result) -> list[str]:
    """A result as the table's text cells."""

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    verdict = {None: "", True: "PASS", False: "FAIL"}[result.passed]
    return [
        result.bench,
        result.backend,
        f"{result.rows:,}",
        result.impl,
        num(result.p50_ms),
        num(result.p95_ms),
        num(result.write_p50_ms),
        num(result.read_p50_ms),
        result.target,
        verdict,
    ]


def print_table(results: list[Result], title: str) -> None:
    """One table, with ``rich`` when it is installed, else aligned plain text."""
    rows = [cells(r) for r in results]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        print(title)
        for line in (list(COLUMNS), *rows):
            print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        return
    table = Table(title=title)
    for column in COLUMNS:
        numeric = column.endswith(("ms", "p50")) or column == "rows"
        table.add_column(column, justify="right" if numeric else "left")
    for row in rows:
        style = {"PASS": "green", "FAIL": "bold red"}.get(row[-1])
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/]" if style else row[-1])
    Console(width=160).print(table)


def versions() -> dict[str, str]:
    names = ("langchain-tiered-memory", "langchain-core", "langchain-community", "sqlalchemy")
    return {name: version(name) for name in names} | {"python": platform.python_version()}


# -- CLI ----------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_hot_path",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL_URL)
    parser.add_argument(
        "--sqlite-path",
        type=Path,
        default=DEFAULT_SQLITE_PATH,
        help=f"SQLite file holding the tables (default {DEFAULT_SQLITE_PATH})",
    )
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(size) for size in text.split(",")],
        default=[10_000, 1_000_000],
        help="comma-separated table sizes in rows (default 10000,1000000)",
    )
    parser.add_argument("--turns", type=int, default=300, help="measured turns (default 300)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--fresh", action="store_true", help="drop and rebuild every table")
    parser.add_argument("--skip-mysql", action="store_true", help="SQLite only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    backends = {"sqlite": f"sqlite:///{args.sqlite_path}"}
    skipped: dict[str, str] = {}
    if args.skip_mysql:
        skipped["mysql"] = "--skip-mysql"
    elif (reason := mysql_unreachable(args.mysql_url)) is not None:
        skipped["mysql"] = f"unreachable: {reason}"
    else:
        backends["mysql"] = args.mysql_url

    results: list[Result] = []
    fill_seconds: dict[str, float] = {}
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    if load_before[0] > (os.cpu_count() or 1) / 2:
        log(f"note: load average {load_before[0]:.1f} on {os.cpu_count()} CPUs; expect noise")
    began = time.perf_counter()
    for backend, url in backends.items():
        log(f"{backend}: {sa.make_url(url).render_as_string(hide_password=True)}")
        backend_results, backend_fills = run_backend(
            backend, url, args.sizes, args.turns, args.fresh
        )
        results.extend(backend_results)
        fill_seconds.update(backend_fills)
    log(f"done in {time.perf_counter() - began:.0f} s")

    print_table(
        results,
        f"Hot path: add 2 messages + read, {args.turns} turns "
        f"(ours: window {WINDOW_TURNS} turns; peer: SQLChatMessageHistory, all messages)",
    )
    for backend, reason in skipped.items():
        print(f"{backend} skipped: {reason}")
    if args.json:
        report = {
            "started_at": started_at,
            "argv": sys.argv[1:],
            "turns": args.turns,
            "warmup": WARMUP,
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "sizes": args.sizes,
            "versions": versions(),
            "skipped": skipped,
            "fill_seconds": fill_seconds,
            "results": [asdict(result) for result in results],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
