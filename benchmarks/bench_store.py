"""Store benchmark: ``TieredStore`` beside LangGraph's ``InMemoryStore`` and ``SqliteStore``.

Each store is pre-filled with ``--items`` memories (English and Chinese, spread
over 50 users' namespaces, in batches of 500), then timed one call at a time
over ``--ops`` calls each:

* ``put``: a new item in a user's namespace (one transaction);
* ``get``: an existing item;
* ``search filter``: a user's namespace, ``filter={"kind": ...}``, ``limit=10``;
* ``search query``: a user's namespace, ``query=`` a word of the corpus, ``limit=10``.
  TieredStore ranks by BM25 (no embedding configured); InMemoryStore and SqliteStore
  without an index ignore ``query`` and return the first items, so that row compares
  a ranking with a scan, and says so.

TieredStore runs on SQLite (a file in the temp folder) and on MySQL/MariaDB (unless
``--skip-mysql``, or ``--quick`` without ``--mysql-url``); SqliteStore (the
``langgraph-checkpoint-sqlite`` package) on a file in the same folder, in its own
autocommit mode. p50/p95 in milliseconds.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_store
    .venv/bin/python -m benchmarks.bench_store --quick --json store.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore

from benchmarks.bench_hot_path import mysql_unreachable
from benchmarks.stats import percentile
from langchain_tiered_memory import MySQLBackup, TieredStore

USERS = 50
WORDS_EN = (
    "invoice ledger payment customer supplier tea cat report budget order shipment refund "
    "warehouse contract tax audit salary meeting holiday project deadline"
).split()
WORDS_ZH = (
    "应收账款 发票 客户 供应商 乌龙茶 报表 预算 订单 发货 退款 仓库 合同 税务 审计 工资 会议"
).split()
KINDS = ["fact", "preference", "schema", "event"]
OPERATIONS = ("put", "get", "search filter", "search query")


def memory(rng: random.Random) -> dict[str, Any]:
    words = rng.sample(WORDS_EN, 4) + rng.sample(WORDS_ZH, 2)
    rng.shuffle(words)
    return {"text": " ".join(words), "kind": rng.choice(KINDS), "n": rng.randint(0, 99)}


def fill(store: BaseStore, items: int, rng: random.Random) -> None:
    ops = [
        PutOp(("users", f"u{i % USERS}", "memories"), f"m{i}", memory(rng)) for i in range(items)
    ]
    for start in range(0, len(ops), 500):
        store.batch(ops[start : start + 500])


def timed(call: Callable[[int], Any], ops: int) -> list[float]:
    for i in range(min(10, ops)):  # warm the pool, the caches, the statements
        call(-1 - i)
    spent = []
    for i in range(ops):
        started = time.perf_counter()
        call(i)
        spent.append((time.perf_counter() - started) * 1000)
    return spent


def measure(store: BaseStore, items: int, ops: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    fill(store, items, rng)
    user = lambda i: ("users", f"u{i % USERS}", "memories")  # noqa: E731
    calls: dict[str, Callable[[int], Any]] = {
        "put": lambda i: store.put(user(i), f"new-{uuid.uuid4().hex}", memory(rng)),
        "get": lambda i: store.get(user(i), f"m{abs(i) * 7 % items}"),
        "search filter": lambda i: store.search(
            user(i), filter={"kind": KINDS[i % len(KINDS)]}, limit=10
        ),
        "search query": lambda i: store.search(
            user(i), query=rng.choice(WORDS_EN + WORDS_ZH), limit=10
        ),
    }
    out = {}
    for name, call in calls.items():
        spent = timed(call, ops)
        out[name] = {"p50": percentile(spent, 50), "p95": percentile(spent, 95)}
    return out


def sqlite_store(path: Path) -> BaseStore | None:
    try:
        from langgraph.store.sqlite import SqliteStore
    except ImportError:
        return None
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    store = SqliteStore(conn)
    store.setup()
    return store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5000, help="items pre-filled per store")
    parser.add_argument("--ops", type=int, default=300, help="timed calls per operation")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="500 items, 60 calls, no MySQL")
    parser.add_argument("--skip-mysql", action="store_true")
    parser.add_argument(
        "--mysql-url",
        default=None,
        help="default $TIERED_MEMORY_MYSQL_URL or mysql+pymysql://root@127.0.0.1:3306/test",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.items, opts.ops = 500, 60
    mysql_url = opts.mysql_url or os.environ.get(
        "TIERED_MEMORY_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
    )
    use_mysql = not opts.skip_mysql and not (opts.quick and opts.mysql_url is None)

    results: dict[str, dict[str, dict[str, float]]] = {}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        results["InMemoryStore"] = measure(InMemoryStore(), opts.items, opts.ops, opts.seed)
        peer = sqlite_store(root / "peer.sqlite3")
        if peer is None:
            notes["SqliteStore"] = "langgraph-checkpoint-sqlite is not installed"
        else:
            results["SqliteStore"] = measure(peer, opts.items, opts.ops, opts.seed)
        ours = TieredStore(f"sqlite:///{root / 'ours.sqlite3'}")
        results["TieredStore sqlite"] = measure(ours, opts.items, opts.ops, opts.seed)
        ours.backup.dispose()
        if use_mysql:
            reason = mysql_unreachable(mysql_url)
            if reason:
                notes["TieredStore mysql"] = f"MySQL unreachable: {reason}"
            else:
                backup = MySQLBackup(mysql_url, table_name=f"bench_store_{uuid.uuid4().hex[:8]}")
                ours = TieredStore(backup)
                try:
                    results["TieredStore mysql"] = measure(ours, opts.items, opts.ops, opts.seed)
                finally:
                    ours.metadata.drop_all(backup.engine)
                    backup.metadata.drop_all(backup.engine)
                    backup.dispose()

    names = list(results)
    print(f"{opts.items} items over {USERS} namespaces, {opts.ops} calls each; p50 / p95 ms")
    print(f"{'operation':<14}" + "".join(f"{name:>24}" for name in names))
    for operation in OPERATIONS:
        cells = [
            f"{results[n][operation]['p50']:.2f} / {results[n][operation]['p95']:.2f}"
            for n in names
        ]
        print(f"{operation:<14}" + "".join(f"{cell:>24}" for cell in cells))
    print("search query: TieredStore ranks by BM25; the others, without an index, ignore query")
    for name, note in notes.items():
        print(f"{name}: {note}")

    summary = []
    peer_name = "SqliteStore" if "SqliteStore" in results else "InMemoryStore"
    for backend in ("TieredStore sqlite", "TieredStore mysql"):
        if backend not in results:
            continue
        for operation in OPERATIONS:
            ours_ms = results[backend][operation]
            peer_ms = results[peer_name][operation]
            summary.append(
                {
                    "metric": f"{backend.split()[1]} {operation} p50/p95 ms",
                    "ours": f"{ours_ms['p50']:.2f} / {ours_ms['p95']:.2f}",
                    "peer": peer_name,
                    "peer_figure": f"{peer_ms['p50']:.2f} / {peer_ms['p95']:.2f}",
                    "ratio": f"{peer_ms['p50'] / ours_ms['p50']:.2f}x" if ours_ms["p50"] else "",
                    "target": "",
                    "passed": None,
                }
            )
    if opts.json:
        payload = {
            "items": opts.items,
            "ops": opts.ops,
            "results": results,
            "notes": notes,
            "summary": summary,
            "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
            "load": os.getloadavg(),
        }
        opts.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
