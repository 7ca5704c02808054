"""Load benchmark: 2 processes x 8 threads write 50,000 turns into 200 sessions.

Every writer process has its own ``MySQLBackup`` and ``ChromaLongMemory`` (background
worker running, raw-turn extraction, a hashing embedding so that the embedding model
is not what is measured) against one MySQL/MariaDB database and one Chroma server
that this script starts (``chroma run`` on a free port of 127.0.0.1). Each thread owns
its sessions and writes their turns round-robin with
``TieredChatMessageHistory.add_messages``, timing every call.

When the writers are done, this process drains what the workers left, then checks
the archive message by message: every session must hold exactly its turns 0..n-1 in
order (nothing lost, duplicated or reordered), one memory per turn in the catalog and
in Chroma, and no job left. It prints one table: throughput, add_messages latency
(p50/p99/max), the extraction drain time and the verification counts.

Run from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks.bench_load                 # 50,000 turns
    .venv/bin/python -m benchmarks.bench_load --turns 2000    # a quick check

MySQL comes from ``--mysql-url`` (default ``$TIERED_MEMORY_MYSQL_URL`` or
``mysql+pymysql://root@127.0.0.1:3306/test``); the run uses fresh tables
(``bench_load_<random>``), dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, HumanMessage

from benchmarks.stats import percentile

DEFAULT_URL = os.environ.get("TIERED_MEMORY_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
WORDS = "invoice ledger deploy friday dashboard budget alpha warehouse payroll audit".split()
_NUMBERS = re.compile(r"<s(\d+)\.t(\d+)>")


class HashingEmbeddings(Embeddings):
    """Deterministic bag-of-words vectors (256 dims): cheap, similar texts similar."""

    dims = 256

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for token in re.findall(r"\w+", text.lower()) or [text]:
            digest = hashlib.md5(token.encode("utf-8", "surrogatepass")).digest()
            vector[int.from_bytes(digest[:4], "little") % self.dims] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)


def turn(session: int, n: int) -> list[Any]:
    """Turn ``n`` of session ``session``; its label says which, its words vary."""
    label = f"<s{session}.t{n}>"
    a, b = WORDS[n % 10], WORDS[(n * 7 + session) % 10]
    return [
        HumanMessage(f"question {label} about {a} and {b} number {n * 31 + session}"),
        AIMessage(f"answer {label}: the {b} of {a} is {n * 17 + session}"),
    ]


def session_id(session: int) -> str:
    return f"load-{session:03d}"


# -- the writer processes ----------------------------------------------------------------


def child(spec: dict[str, Any]) -> None:
    """One writer process: its threads write their sessions' turns, timing each call."""
    from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

    backup = MySQLBackup(spec["url"], table_name=spec["table"])
    memory = ChromaLongMemory(
        host="127.0.0.1",
        port=spec["chroma_port"],
        collection_name=spec["collection"],
        embedding=HashingEmbeddings(),
        backup=backup,
        poll_interval=0.2,
    )
    workers = spec["processes"] * spec["threads"]
    latencies: list[list[float]] = [[] for _ in range(spec["threads"])]
    errors: list[str] = []

    def write(thread: int) -> None:
        slot = spec["process"] * spec["threads"] + thread
        mine = [s for s in range(spec["sessions"]) if s % workers == slot]
        quota = {s: spec["turns_per_session"][s] for s in mine}
        histories = {
            s: TieredChatMessageHistory(
                session_id(s), user_id=f"user-{s % 20}", backup=backup, long_memory=memory
            )
            for s in mine
        }
        for n in range(max(quota.values(), default=0)):
            for s in mine:
                if n >= quota[s]:
                    continue
                began = time.perf_counter()
                try:
                    histories[s].add_messages(turn(s, n))
                except Exception as exc:  # reported, and the verification will see it
                    errors.append(f"{session_id(s)} turn {n}: {type(exc).__name__}: {exc}")
                latencies[thread].append(time.perf_counter() - began)

    started = time.time()
    threads = [threading.Thread(target=write, args=(t,)) for t in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = time.time()
    memory.close()
    print(
        json.dumps(
            {
                "started": started,
                "ended": ended,
                "latencies": [x for part in latencies for x in part],
                "errors": errors[:20],
                "error_count": len(errors),
            }
        ),
        flush=True,
    )


# -- the run -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_chroma(path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``chroma run`` on a free port; returns the process and the port once it answers."""
    import chromadb
    from chromadb.config import Settings

    port = _free_port()
    executable = Path(sys.executable).with_name("chroma")
    log = (path.parent / "chroma.log").open("wb")
    process = subprocess.Popen(
        [str(executable), "run", "--path", str(path), "--port", str(port), "--host", "127.0.0.1"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            chromadb.HttpClient(
                host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
            ).heartbeat()
            return process, port
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                msg = f"chroma run did not start (see {path.parent / 'chroma.log'})"
                raise RuntimeError(msg) from None
            time.sleep(0.2)


def quota(turns: int, sessions: int) -> list[int]:
    """Turns per session: as even as possible, summing to ``turns``."""
    base, extra = divmod(turns, sessions)
    return [base + (1 if s < extra else 0) for s in range(sessions)]


@dataclass
class Verdict:
    """What the verification found."""

    stored_turns: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    torn: int = 0
    memories: int = 0
    memories_wrong: int = 0  # sessions whose memories do not cover each turn exactly once
    vectors: int = 0
    jobs_left: int = 0


def verify(backup: Any, memory: Any, per_session: list[int]) -> Verdict:
    """Compare the archive, the catalog and Chroma with what the writers wrote."""
    from sqlalchemy import select

    t, m = backup.table, backup.tables.memories
    verdict = Verdict()
    seen: dict[int, list[int]] = {}
    archived: dict[str, set[int]] = {}  # session -> its archive ids

    def rows_plan(after: int) -> Any:
        result = yield (
            select(t.c.id, t.c.session_id, t.c.role, t.c.message)
            .where(t.c.id > after)
            .order_by(t.c.id)
            .limit(20_000)
        )
        return result.all()

    after = 0
    pending: dict[int, tuple[int, str]] = {}  # session -> (turn, role) of its last message
    while rows := backup.run(rows_plan(after), read_only=True):
        after = rows[-1].id
        for row in rows:
            archived.setdefault(row.session_id, set()).add(row.id)
            content = json.loads(row.message)["data"]["content"]
            found = _NUMBERS.search(content)
            if found is None or session_id(int(found.group(1))) != row.session_id:
                verdict.torn += 1
                continue
            s, n = int(found.group(1)), int(found.group(2))
            if row.role == "human":
                if s in pending and pending[s][1] == "human":
                    verdict.torn += 1  # a question without its answer
                pending[s] = (n, "human")
            else:
                if pending.get(s) != (n, "human"):
                    verdict.torn += 1  # an answer without its question
                pending[s] = (n, "ai")
                seen.setdefault(s, []).append(n)
    for s, expected in enumerate(per_session):
        got = seen.get(s, [])
        verdict.stored_turns += len(got)
        verdict.lost += len(set(range(expected)) - set(got))
        verdict.duplicated += len(got) - len(set(got))
        verdict.reordered += sum(1 for a, b in itertools.pairwise(got) if b <= a)

    def memory_plan() -> Any:
        result = yield select(m.c.session_id, m.c.source_ids)
        return result.all()

    # A turn identical to an earlier one is merged into its memory (dedupe), which
    # then lists both turns' message ids: every archived message must be the
    # source of exactly one memory of its own session.
    covered: dict[str, list[int]] = {}
    for row in backup.run(memory_plan(), read_only=True):
        verdict.memories += 1
        covered.setdefault(row.session_id, []).extend(json.loads(row.source_ids))
    verdict.memories_wrong = sum(
        1
        for sid in set(archived) | set(covered)
        if sorted(covered.get(sid, [])) != sorted(archived.get(sid, ()))
    )
    verdict.vectors = memory.collection.count()
    verdict.jobs_left = memory.queue.depth()
    return verdict


def run(args: argparse.Namespace) -> None:
    from sqlalchemy import make_url

    from langchain_tiered_memory import MySQLBackup
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

    table = f"bench_load_{uuid.uuid4().hex[:8]}"
    per_session = quota(args.turns, args.sessions)
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp:
        chroma_path = Path(tmp) / "chroma"
        chroma, port = start_chroma(chroma_path)
        backup = MySQLBackup(args.mysql_url, table_name=table)  # creates the tables once
        try:
            spec = {
                "url": args.mysql_url,
                "table": table,
                "chroma_port": port,
                "collection": "load",
                "processes": args.processes,
                "threads": args.threads,
                "sessions": args.sessions,
                "turns_per_session": per_session,
            }
            children = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.bench_load",
                        "--child",
                        json.dumps({**spec, "process": p}),
                    ],
                    stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONWARNINGS": "ignore"},
                )
                for p in range(args.processes)
            ]
            results = []
            for process in children:
                out, _ = process.communicate()
                if process.returncode != 0:
                    msg = f"a writer process exited with {process.returncode}"
                    raise RuntimeError(msg)
                results.append(json.loads(out.decode().strip().splitlines()[-1]))
            # From the first write of any process to the last one.
            wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
            memory = ChromaLongMemory(
                host="127.0.0.1",
                port=port,
                collection_name="load",
                embedding=HashingEmbeddings(),
                backup=backup,
                start_worker=False,
            )
            left = memory.queue.depth()
            drain_started = time.perf_counter()
            memory.flush(timeout=3600)
            drain = time.perf_counter() - drain_started
            verdict = verify(backup, memory, per_session)
            memory.close()
        finally:
            if not args.keep:
                backup.metadata.drop_all(backup.engine, checkfirst=True)
            backup.dispose()
            chroma.send_signal(signal.SIGTERM)
            try:
                chroma.wait(15)
            except subprocess.TimeoutExpired:
                chroma.kill()
    latencies = [x for r in results for x in r["latencies"]]
    errors = sum(r["error_count"] for r in results)
    where = make_url(args.mysql_url).render_as_string(hide_password=True)
    rows = [
        (
            "setup",
            f"{args.processes} processes x {args.threads} threads, {args.sessions} "
            f"sessions, MySQL {where} + chroma run",
        ),
        ("turns written (acknowledged / raised)", f"{len(latencies) - errors:,} / {errors:,}"),
        ("wall time of the writers", f"{wall:.1f} s"),
        (
            "throughput",
            f"{(len(latencies) - errors) / wall:,.0f} turns/s "
            f"({2 * (len(latencies) - errors) / wall:,.0f} messages/s)",
        ),
        (
            "add_messages p50 / p99 / max",
            f"{percentile(latencies, 50) * 1000:.1f} / "
            f"{percentile(latencies, 99) * 1000:.1f} / {max(latencies, default=0) * 1000:.1f} ms",
        ),
        ("extraction jobs left when the writers ended", f"{left:,} (drained in {drain:.1f} s)"),
        (
            "lost / duplicated / reordered turns",
            f"{verdict.lost} / {verdict.duplicated} / {verdict.reordered}",
        ),
        ("torn turns (a question without its answer)", str(verdict.torn)),
        ("turns in the archive", f"{verdict.stored_turns:,} of {args.turns:,}"),
        (
            "memories (catalog / Chroma / turns)",
            f"{verdict.memories:,} / {verdict.vectors:,} / {args.turns:,} "
            f"({args.turns - verdict.memories:,} near-duplicate turns merged)",
        ),
        (
            "sessions whose memories miss or repeat a turn",
            str(verdict.memories_wrong),
        ),
        ("jobs left after the drain", str(verdict.jobs_left)),
    ]
    print_table(rows)
    ok = (
        errors == 0
        and verdict.lost == verdict.duplicated == verdict.reordered == verdict.torn == 0
        and verdict.memories == verdict.vectors
        and verdict.memories_wrong == verdict.jobs_left == 0
    )
    print("verification:", "PASS" if ok else "FAIL")
    if args.json:
        acknowledged = len(latencies) - errors
        setup = f"{args.processes} processes x {args.threads} threads, {args.sessions} sessions"
        # Rows for the one-table summary of ``python -m benchmarks``.
        summary = [
            {
                "metric": f"load throughput, {args.turns:,} turns ({setup})",
                "ours": f"{acknowledged / wall:,.0f} turns/s",
            },
            {
                "metric": "load add_messages p50 / p99",
                "ours": f"{percentile(latencies, 50) * 1000:.1f} / "
                f"{percentile(latencies, 99) * 1000:.1f} ms",
            },
            {
                "metric": "load: lost / duplicated / reordered turns",
                "ours": f"{verdict.lost} / {verdict.duplicated} / {verdict.reordered}",
                "target": "0 / 0 / 0",
                "passed": ok,
            },
        ]
        payload = {"rows": dict(rows), "verified": ok, "summary": summary, "args": vars(args)}
        Path(args.json).write_text(json.dumps(payload, indent=2), encoding="utf-8")
    if not ok:
        sys.exit(1)


def print_table(rows: list[tuple[str, str]]) -> None:
    """The result table, with ``rich``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Load: concurrent writers on MySQL + a Chroma server", show_lines=False)
    table.add_column("Measure")
    table.add_column("Result")
    for measure, result in rows:
        table.add_row(measure, result)
    Console(width=140).print(table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50_000, help="turns in all (default 50,000)")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8, help="writer threads per process")
    parser.add_argument("--mysql-url", default=DEFAULT_URL)
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="2,000 turns: checks the plumbing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.turns = min(args.turns, 2000)
    if args.child:
        child(json.loads(args.child))
        return
    if args.turns < 1 or args.sessions < 1 or args.processes < 1 or args.threads < 1:
        parser.error("--turns, --sessions, --processes and --threads must be positive")
    run(args)


if __name__ == "__main__":
    main()
