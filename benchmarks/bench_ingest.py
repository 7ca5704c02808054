"""Ingest drain rate as a session grows: is raw ingest bound by the embedding model alone?

One session (one user) grows to each of ``--sizes`` turns of long text (LoCoMo
utterances joined into turns of up to ``--max-chars`` characters, read in place).
Every turn is written with ``TieredChatMessageHistory.add_messages([Human, AI])``
and drained with ``ChromaLongMemory.run_pending()`` (raw mode, no extractor), in
windows of ``--window`` turns, so the queue never holds more than a window.

At each size the last window is measured three ways, in the same run:

* **pipeline, real model**: the window drained with the offline default embedding
  (MiniLM), into a copy of the store that already holds the session's earlier
  turns;
* **the model alone**: ``embed_documents`` on the same memory texts, all in one
  call (the model's best: it sorts them by length itself);
* **pipeline, cheap embedding**: the window drained with a deterministic hash
  embedding: the package's own cost alone. By default (``--cheap words``) a
  bag of hashed words, so that texts sharing words get neighbouring vectors, as
  with a real model; ``--cheap random`` uses langchain-core's
  ``DeterministicFakeEmbedding`` instead, whose unrelated random vectors are the
  vector index's worst case (every insert searches a graph without neighbourhoods).

The session's earlier turns are ingested through the same pipeline with the cheap
embedding (their vectors' values do not change what the package does: dedupe is
by text). Targets (issue 16): the pipeline within 10 % of the model's own rate at
every size, and the package's own rate flat (+-20 %) from the smallest size to the
largest.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_ingest --eval-dir ../shared/eval
    .venv/bin/python -m benchmarks.bench_ingest --quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.messages import AIMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings
from langchain_tiered_memory.text.lexical import tokenize
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

warnings.filterwarnings("ignore", message=".*BaseChatMessageHistory.*")

SESSION = "grow"
USER = "user"
MODEL_TOLERANCE = 0.10  # the pipeline within 10 % of the model's own rate
FLAT_TOLERANCE = 0.20  # the package's own rate flat within +-20 %


def log(text: str) -> None:
    print(f"[bench_ingest] {text}", file=sys.stderr, flush=True)


def long_turns(eval_dir: Path, count: int, max_chars: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (human, ai) turns of LoCoMo utterances, each side up to ``max_chars / 2``."""
    path = eval_dir / "locomo_dev.json"
    if not path.exists():
        sys.exit(f"LoCoMo not found at {path} (pass --eval-dir)")
    utterances: list[str] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        for key, turns in sample["conversation"].items():
            if key.startswith("session_") and isinstance(turns, list):
                utterances += [t["text"].strip() for t in turns if t.get("text", "").strip()]
    rng = np.random.default_rng(seed)
    half = max_chars // 2

    def side() -> str:
        target = int(rng.integers(40, half + 1))
        start = int(rng.integers(0, len(utterances)))
        text = ""
        for i in range(start, start + 50):
            candidate = f"{text} {utterances[i % len(utterances)]}".strip()
            if len(candidate) > target and text:
                break
            text = candidate[:half]
        return text

    return [(side(), side()) for _ in range(count)]


def new_store(folder: Path, embedding: Embeddings, batch_size: int | None) -> ChromaLongMemory:
    folder.mkdir(exist_ok=True)
    options = {} if batch_size is None else {"batch_size": batch_size}
    return ChromaLongMemory(
        persist_directory=folder / "chroma",
        collection_name="ingest",
        embedding=embedding,
        backup=MySQLBackup(f"sqlite:///{folder / 'archive.sqlite3'}"),
        start_worker=False,
        **options,
    )


def write(lm: ChromaLongMemory, turns: Sequence[tuple[str, str]]) -> None:
    history = TieredChatMessageHistory(SESSION, user_id=USER, backup=lm.backup, long_memory=lm)
    for human, ai in turns:
        history.add_messages([HumanMessage(human), AIMessage(ai)])


class Recording(Embeddings):
    """An embedding that remembers the texts it was asked to embed."""

    def __init__(self, inner: Embeddings) -> None:
        self.inner = inner
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.texts += texts
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


def drain(lm: ChromaLongMemory) -> tuple[float, float]:
    """Seconds ``run_pending`` takes to empty the queue, and of those the vector index's."""
    upsert = lm.vectors.upsert
    in_index = 0.0

    def timed(*args: Any) -> None:
        nonlocal in_index
        start = time.perf_counter()
        upsert(*args)
        in_index += time.perf_counter() - start

    lm.vectors.upsert = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    try:
        lm.run_pending()
    finally:
        del lm.vectors.upsert
    elapsed = time.perf_counter() - start
    if lm.queue.depth():
        sys.exit(f"{lm.queue.depth()} jobs left after run_pending")
    return elapsed, in_index


class WordHashEmbedding(Embeddings):
    """Cheap, deterministic, text-like vectors: each word adds 1 to a hashed dimension."""

    def __init__(self, size: int = 384) -> None:
        self.size = size
        self._slots: dict[str, int] = {}

    def _slot(self, word: str) -> int:
        slot = self._slots.get(word)
        if slot is None:
            digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=4)
            slot = self._slots[word] = int.from_bytes(digest.digest(), "little") % self.size
        return slot

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = np.zeros((len(texts), self.size), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in tokenize(text) or [text]:
                vectors[row, self._slot(word)] += 1.0
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
        return vectors.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


@dataclass
class Point:
    """The three rates at one session size."""

    turns: int
    window: int
    pipeline_model: float  # turns/s, the real model through the pipeline
    model_alone: float  # turns/s, the real model on the same texts
    pipeline_cheap: float  # turns/s, the package's own cost
    index_ms: float  # of which, ms per turn in the vector index's upsert (Chroma's HNSW)

    @property
    def without_index(self) -> float:
        """turns/s of the package's own cost, the vector index's upsert left out."""
        return 1000.0 / (1000.0 / self.pipeline_cheap - self.index_ms)

    @property
    def model_share(self) -> float:
        return self.pipeline_model / self.model_alone


def measure(args: argparse.Namespace, tmp: Path) -> list[Point]:
    sizes = sorted(args.sizes)
    window = args.window
    turns = long_turns(args.eval_dir, sizes[-1], args.max_chars, args.seed)
    cheap: Embeddings = (
        WordHashEmbedding() if args.cheap == "words" else DeterministicFakeEmbedding(size=384)
    )
    model = MiniLMEmbeddings()
    started = time.perf_counter()
    model.warm_up()
    log(f"model loaded in {time.perf_counter() - started:.1f} s")
    model.embed_documents([t[0] for t in turns[:64]])  # first-call costs out of the way
    lm = new_store(tmp / "grow", cheap, args.batch_size)
    points: list[Point] = []
    done = 0
    for size in sizes:
        last = max(size - window, done)
        while done < last:  # the session's earlier turns, a window at a time
            step = min(window, last - done)
            write(lm, turns[done : done + step])
            drain(lm)
            done += step
        log(f"session holds {done:,} turns; measuring turns {done:,}..{size:,}")
        write(lm, turns[done:size])
        copy = tmp / f"copy{size}"
        shutil.copytree(tmp / "grow", copy)
        recording = Recording(model)
        real = new_store(copy, recording, args.batch_size)
        # Chroma loads a collection's index on first use: not part of a drain.
        real.vectors.query(cheap.embed_query("warm up"), 1, SESSION, USER)
        real_s, _ = drain(real)
        real.close()
        real.backup.dispose()
        shutil.rmtree(copy)
        texts = recording.texts
        started = time.perf_counter()
        model.embed_documents(list(texts))
        alone_s = time.perf_counter() - started
        cheap_s, index_s = drain(lm)
        measured = size - done
        done = size
        point = Point(
            size,
            measured,
            measured / real_s,
            measured / alone_s,
            measured / cheap_s,
            index_s * 1000 / measured,
        )
        points.append(point)
        log(
            f"{size:,} turns: pipeline {point.pipeline_model:.1f} turns/s, model alone "
            f"{point.model_alone:.1f} ({point.model_share:.0%}), package alone "
            f"{point.pipeline_cheap:,.0f} turns/s, of which Chroma upsert "
            f"{point.index_ms:.2f} ms/turn ({len(texts):,} texts embedded)"
        )
    lm.close()
    lm.backup.dispose()
    return points


def summary(points: list[Point], cheap: str = "words") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = points[0].pipeline_cheap
    for p in points:
        rows.append(
            {
                "metric": f"raw ingest drain, session of {p.turns:,} turns (last {p.window:,})",
                "ours": f"{p.pipeline_model:.1f} turns/s",
                "peer": "the model alone, same texts",
                "peer_figure": f"{p.model_alone:.1f} turns/s",
                "ratio": f"{p.model_share:.2f}",
                "target": f">= {1 - MODEL_TOLERANCE:.2f} of the model",
                "passed": p.model_share >= 1 - MODEL_TOLERANCE,
            }
        )
    for p in points:
        drift = p.pipeline_cheap / base - 1
        rows.append(
            {
                "metric": f"package's own rate ({cheap} embedding), session of {p.turns:,} turns",
                "ours": f"{p.pipeline_cheap:,.0f} turns/s",
                "peer": f"at {points[0].turns:,} turns",
                "peer_figure": f"{base:,.0f} turns/s",
                "ratio": f"{drift:+.0%}",
                "target": f"flat +-{FLAT_TOLERANCE:.0%}",
                "passed": abs(drift) <= FLAT_TOLERANCE,
            }
        )
    first = points[0]
    for p in points:
        drift = p.without_index / first.without_index - 1
        rows.append(
            {
                "metric": (
                    f"  of which outside the vector index, {p.turns:,} turns"
                    f" (Chroma upsert {p.index_ms:.2f} ms/turn)"
                ),
                "ours": f"{p.without_index:,.0f} turns/s",
                "peer": f"at {first.turns:,} turns (Chroma {first.index_ms:.2f} ms/turn)",
                "peer_figure": f"{first.without_index:,.0f} turns/s",
                "ratio": f"{drift:+.0%}",
                "target": f"flat +-{FLAT_TOLERANCE:.0%}",
                "passed": abs(drift) <= FLAT_TOLERANCE,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--window", type=int, default=500, help="turns measured at each size")
    parser.add_argument("--max-chars", type=int, default=1500)
    parser.add_argument(
        "--batch-size", type=int, help="the worker's batch_size (default: the package's)"
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--cheap",
        choices=["words", "random"],
        default="words",
        help="the cheap embedding: hashed words (text-like) or unrelated random vectors",
    )
    parser.add_argument("--quick", action="store_true", help="sizes 200 and 1000, window 100")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.window = [200, 1000], 100
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as folder:
        points = measure(args, Path(folder))
    rows = summary(points, args.cheap)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Raw ingest drain rate (load {load:.1f} at start, {os.cpu_count()} cores)")
    for column in ("metric", "ours", "peer", "peer figure", "ratio", "target", "pass/miss"):
        table.add_column(column)
    for row in rows:
        cells = [str(row[k]) for k in ("metric", "ours", "peer", "peer_figure", "ratio", "target")]
        table.add_row(*cells, "pass" if row["passed"] else "miss")
    Console(width=160).print(table)
    if args.json:
        payload = {"points": [asdict(p) for p in points], "summary": rows, "load": load}
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
