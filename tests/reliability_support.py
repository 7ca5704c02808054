"""Helpers for the reliability tests: private servers, the crash writer, table readers.

* :class:`PrivateMariaDB`: a MariaDB of the test's own (its data directory in a temp
  folder, a free port on 127.0.0.1) that a test may stop, kill and restart.
* :class:`ChromaServer`: a ``chroma run`` of the test's own, likewise.
* :func:`crash_writer`: the child process of the SIGKILL test; it writes numbered
  turns through every tier and prints ``ack <session> <turn>`` after each one.
* Readers that pull every row of the archive's tables, compared in Python (never in
  SQL, so a collation cannot hide a row from the check).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field
from sqlalchemy import select

from langchain_tiered_memory import MySQLBackup

from .conftest import IN_CI, _free_port, chroma_settings

REPO = Path(__file__).resolve().parents[1]


def _missing(what: str) -> None:
    """Skip locally, fail in CI, when a server binary is missing."""
    if IN_CI:
        pytest.fail(f"{what} is missing in CI")
    pytest.skip(f"{what} is missing (CI would fail)")


def _wait(check: Any, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            msg = f"{what} did not come up within {timeout:g} s\n{tail}"
            raise TimeoutError(msg)
        time.sleep(0.05)


# -- a private MariaDB ---------------------------------------------------------------


class PrivateMariaDB:
    """A MariaDB server of the test's own: its data directory, socket and port.

    ``stop()`` is a clean shutdown (SIGTERM), ``kill()`` a crash (SIGKILL); ``start()``
    brings the server back on the same data directory and port, so clients that
    reconnect find the data they had.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.datadir = base / "data"
        self.socket = base / "mysqld.sock"
        self.log = base / "mariadbd.log"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")
        self.install_db = shutil.which("mariadb-install-db")
        if self.server is None or self.install_db is None:
            _missing("mariadbd / mariadb-install-db")

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/test"

    def _root_args(self) -> list[str]:
        # mariadbd refuses to run as root unless told to.
        return ["--user=root"] if os.geteuid() == 0 else []

    def install(self) -> None:
        """Create the system tables in a fresh data directory."""
        self.base.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.install_db),
            "--no-defaults",  # the host's my.cnf names another user and data directory
            f"--datadir={self.datadir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *self._root_args(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            msg = f"mariadb-install-db failed:\n{done.stdout}\n{done.stderr}"
            raise RuntimeError(msg)

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (on the same data directory and port) and wait for it."""
        assert self.process is None or self.process.poll() is not None, "already running"
        command = [
            str(self.server),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            f"--socket={self.socket}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.base / 'mariadbd.pid'}",
            f"--log-error={self.log}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            "--max-connections=200",
            *self._root_args(),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait(self._ping, timeout, "the private MariaDB", self.log)
        with self._connect() as conn, conn.cursor() as cursor:
            cursor.execute("CREATE DATABASE IF NOT EXISTS test")

    def _connect(self) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2)

    def _ping(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            msg = f"mariadbd exited with {self.process.returncode}"
            raise RuntimeError(msg)
        # Ours, not another server that took the free port first (ours then fails to
        # bind and exits, after this ping could have reached the other one).
        with self._connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT @@pid_file")
            (pid_file,) = cursor.fetchone()
        if pid_file != str(self.base / "mariadbd.pid"):
            msg = f"port {self.port} answers for another server ({pid_file})"
            raise RuntimeError(msg)
        return True

    def _end(self, sig: int, timeout: float) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)

    def stop(self, timeout: float = 60.0) -> None:
        """A clean shutdown (SIGTERM)."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """A crash (SIGKILL): InnoDB recovers on the next start."""
        self._end(signal.SIGKILL, 30)

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections, nothing answers.

        Returns once every thread of the server is stopped. The stop is taken up by
        one thread first; if that one is in an uninterruptible disk wait (an fsync
        on a loaded machine), the others go on answering until it comes back (a
        CI run's write went through the "frozen" server that way).
        """
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        _wait(self._all_stopped, 60, "every thread of the frozen MariaDB to stop")

    def _all_stopped(self) -> bool:
        """Whether every thread of the server is in the stopped state (``T``)."""
        assert self.process is not None
        states = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended
                stat = (task / "stat").read_text()
                states.append(stat.rsplit(")", 1)[1].split()[0])
        return bool(states) and all(state in "tT" for state in states)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def private_mariadb(base: Path) -> Iterator[PrivateMariaDB]:
    """A started :class:`PrivateMariaDB`, shut down afterwards."""
    server = PrivateMariaDB(base)
    server.install()
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.thaw()
        server.stop()


# -- a proxy that stops answering -------------------------------------------------------


class StallingProxy:
    """A TCP forwarder on 127.0.0.1 that can stop forwarding and keep its sockets open.

    To the client, a stalled proxy is a server that stopped answering (a dead link
    or a hung host): connections are accepted and writes succeed, but no byte comes
    back. :meth:`resume` forwards what was held back and everything after.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def stall(self) -> None:
        """Stop forwarding in both directions; every socket stays open."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, the held-back data first."""
        self._flowing.set()

    def close(self) -> None:
        """Close the listener and every forwarded connection."""
        self._closed = True
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                self._flowing.wait()  # stalled: hold the data, keep the socket open
                if not data or self._closed:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


# -- a private Chroma server -----------------------------------------------------------


class ChromaServer:
    """A ``chroma run`` of the test's own, which a test may kill and restart."""

    def __init__(self, path: Path, port: int | None = None) -> None:
        self.path = path
        self.port = port or _free_port()
        self.log = path.parent / f"{path.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.executable = Path(sys.executable).with_name("chroma")
        if not self.executable.exists():
            _missing(f"the chroma executable next to {sys.executable}")

    def start(self, timeout: float = 60.0) -> None:
        """Start (or restart, on the same folder and port) and wait for a heartbeat."""
        import chromadb

        self.path.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.executable),
                    "run",
                    "--path",
                    str(self.path),
                    "--port",
                    str(self.port),
                    "--host",
                    "127.0.0.1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def beat() -> bool:
            if self.process is not None and self.process.poll() is not None:
                msg = f"chroma run exited with {self.process.returncode}"
                raise RuntimeError(msg)
            chromadb.HttpClient(
                host="127.0.0.1", port=self.port, settings=chroma_settings()
            ).heartbeat()
            return True

        _wait(beat, timeout, "the Chroma server", self.log)

    def kill(self) -> None:
        """SIGKILL, and wait until the port is free."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)


# -- reading every row -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One archived message as the checks see it."""

    id: int
    session_id: str
    user_id: str | None
    role: str
    content: Any
    message: BaseMessage


def archive_rows(backup: MySQLBackup) -> list[Row]:
    """Every archived message of every session, in id order."""
    t = backup.table

    def plan() -> Any:
        result = yield select(t).order_by(t.c.id)
        rows = result.all()
        messages = yield from backup.load_plan(rows)
        return [
            Row(r.id, r.session_id, r.user_id, r.role, m.content, m)
            for r, m in zip(rows, messages, strict=True)
        ]

    return backup.run(plan(), read_only=True)


def table_rows(backup: MySQLBackup, name: str) -> list[Any]:
    """Every row of one of the archive's tables (``jobs``, ``memories``, ...)."""
    table = getattr(backup.tables, name)

    def plan() -> Any:
        result = yield select(table)
        return result.all()

    return backup.run(plan(), read_only=True)


def by_session(rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Rows grouped by their exact ``session_id`` (compared in Python)."""
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.session_id, []).append(row)
    return grouped


def files_under(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> text), lock files left out."""
    if not root.exists():
        return {}
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8", errors="replace")
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# -- fake LLMs ---------------------------------------------------------------------------


class MemoryWriter(GenericFakeChatModel):
    """A fake MEMORY.md writer: names the newest turn label it was shown, then pads.

    The answer ends with ``END``, so a truncated MEMORY.md shows.
    """

    messages: Any = iter(())
    padding: int = 2000

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        prompt = str(messages[-1].content)
        labels = [word for word in prompt.split() if word.startswith("<t")]
        text = f"# Memory\nlast seen {labels[-1] if labels else '-'}\n{'.' * self.padding}\nEND"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


class ChaosExtractor(GenericFakeChatModel):
    """A fake extractor that misbehaves as the turn asks: ``mode=<name>`` in the question.

    Modes: ``ok`` (``Summary: <question>``), ``raise``, ``hang`` (sleeps ``hang``
    seconds), ``empty`` (``""``), ``blocks`` (content blocks without text),
    ``surrogate`` (a lone surrogate in the answer), ``huge`` (``huge`` characters),
    ``none`` (``NONE``), ``flaky`` (raises on the first call for the turn, then ok).
    """

    messages: Any = iter(())
    hang: float = 3.0
    huge: int = 20 * 1024 * 1024
    seen: dict[str, int] = Field(default_factory=dict)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        prompt = str(messages[-1].content)
        # The last one: the prompt may list existing memories (offered for UPDATE)
        # before the turn, and they quote earlier turns' modes.
        found = ([None, *re.finditer(r"mode=(\w+) #(\d+)", prompt)])[-1]
        mode, key = (found.group(1), found.group(0)) if found else ("ok", prompt)
        self.seen[key] = self.seen.get(key, 0) + 1
        content: Any
        if mode == "raise" or (mode == "flaky" and self.seen[key] == 1):
            msg = f"extractor down for {key}"
            raise RuntimeError(msg)
        if mode == "hang":
            time.sleep(self.hang)
        # Only this mode's answer is built: a 20 MB string made on every call would
        # land in whatever another test is measuring (a hung call wakes late).
        answers: dict[str, Callable[[], Any]] = {
            "empty": lambda: "",
            "blocks": lambda: [{"type": "image_url", "image_url": {"url": "data:,"}}],
            "surrogate": lambda: f"Summary: {key} with a lone \ud800 surrogate",
            "huge": lambda: "y" * self.huge,
            "none": lambda: "NONE",
        }
        content = answers.get(mode, lambda: f"Summary: {key}")()
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=content))])


# -- the crash writer (a child process) --------------------------------------------------

WORDS = "invoice ledger deploy friday dashboard budget alpha warehouse payroll audit".split()


def crash_session(index: int) -> tuple[str, str]:
    """The id and the user of crash session ``index``."""
    return f"crash-{index:02d}", f"user-{index % 7}"


def crash_turn(index: int, turn: int) -> list[BaseMessage]:
    """Turn ``turn`` of crash session ``index``: distinct words, so no two dedupe."""
    a, b = WORDS[turn % len(WORDS)], WORDS[(turn * 7 + index) % len(WORDS)]
    label = f"<t{index:02d}.{turn:03d}>"
    return [
        HumanMessage(f"question {label} s{index} n{turn} about {a} and {b}"),
        AIMessage(f"answer {label} s{index} n{turn}: the {b} of {a} is {turn * 31 + index}"),
    ]


def _crash_tiers(
    url: str, table: str, home: Path, spec: dict[str, Any], *, worker: bool
) -> tuple[MySQLBackup, Any, Any]:
    """The crash test's archive, long-term memory and consolidator.

    The worker process runs the queues on the real (embedded) Chroma folder; the
    writer only queues jobs, so it gets an in-memory client it never uses (an
    embedded Chroma folder must have one process at a time).
    """
    import chromadb

    from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
    from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

    from .fakes import HashEmbeddings
    from .long_memory_support import FakeExtractor

    backup = MySQLBackup(url, table_name=table)
    client = (
        chromadb.PersistentClient(path=str(home / "chroma"), settings=chroma_settings())
        if worker
        else chromadb.EphemeralClient(settings=chroma_settings())
    )
    memory = ChromaLongMemory(
        client=client,
        collection_name="crash",
        embedding=HashEmbeddings(),
        extractor=FakeExtractor(),
        backup=backup,
        poll_interval=0.05,
        retry_base_delay=0.01,
        start_worker=worker,
    )
    consolidator = MemoryConsolidator(
        MemoryWriter(),
        root=home / "memory",
        backup=backup,
        threshold=spec["threshold"],
        batch=spec["batch"],
        poll_interval=0.05,
        retry_base_delay=0.01,
        start_worker=worker,
    )
    return backup, memory, consolidator


def crash_worker(argv: Sequence[str]) -> None:
    """Run the extraction and consolidation workers until killed."""
    url, table, home, spec = argv[0], argv[1], Path(argv[2]), json.loads(argv[3])
    _crash_tiers(url, table, home, spec, worker=True)
    os.write(1, b"ready\n")
    threading.Event().wait()


def crash_writer(argv: Sequence[str]) -> None:
    """Write turns into the archive and the session files; ack each on stdout.

    ``argv``: archive URL, table name, home folder, and a JSON spec with ``sessions``,
    ``turns`` (per session), ``threads``, ``threshold``/``batch`` (consolidation)
    and ``start`` (per session, the next turn for the archive and for the files).
    Each turn is acknowledged (``ack <session> <turn>``) once both hold it.
    """
    from langchain_tiered_memory import SessionFileArchive, TieredChatMessageHistory

    url, table, home, spec = argv[0], argv[1], Path(argv[2]), json.loads(argv[3])
    backup, memory, consolidator = _crash_tiers(url, table, home, spec, worker=False)
    files = SessionFileArchive(home / "sessions")
    write_lock = threading.Lock()

    def write(thread: int) -> None:
        mine = [i for i in range(spec["sessions"]) if i % spec["threads"] == thread]
        histories = {}
        for i in mine:
            session_id, user_id = crash_session(i)
            histories[i] = TieredChatMessageHistory(
                session_id,
                user_id=user_id,
                backup=backup,
                long_memory=memory,
                consolidator=consolidator,
            )
        for n in range(spec["turns"]):
            for i in mine:
                archive_next, files_next = spec["start"][str(i)]
                if n < min(archive_next, files_next):
                    continue
                messages = crash_turn(i, n)
                if n >= archive_next:
                    histories[i].add_messages(messages)
                if n >= files_next:
                    files.add_messages(crash_session(i)[0], messages)
                line = f"ack {i} {n}\n".encode()
                with write_lock:  # one write(2) per line: atomic on a pipe
                    os.write(1, line)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.write(1, b"written\n")


if __name__ == "__main__":  # pragma: no cover - run as a child process
    {"writer": crash_writer, "worker": crash_worker}[sys.argv[1]](sys.argv[2:])
