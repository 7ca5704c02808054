"""Why Chroma's upsert grows with the session: its insert cost, part by part.

``bench_ingest`` shows the package's own cost outside the vector index flat and
Chroma's upsert growing with the collection. This probe grows one Chroma
collection by batches of ``--batch`` vectors (LoCoMo turns of up to 1,500
characters, the cheap hashed-words embedding, the metadata the package writes)
and reports the process CPU time per vector of each ``--every`` vectors, for
variants that each take one suspect away:

* ``package``: as the package writes (``HNSW_METADATA``, documents, six metadata keys);
* ``ephemeral``: the same in an in-memory client (no HNSW file, no SQLite file);
* ``no-sync``: ``hnsw:sync_threshold`` and ``hnsw:batch_size`` at 1,000,000 (no
  index persisted while the collection grows);
* ``no-documents``: no documents (no FTS5 trigram index of the texts);
* ``scope-only``: no documents, only the ``session_id`` and ``user_id`` metadata;
* ``tiny-graph``: as ``scope-only`` with ``construction_ef`` 8 and ``M`` 4 (an
  HNSW graph too poor to search well: it shows what the graph's construction costs);
* ``ef64``, ``ef32``: as ``package`` with ``construction_ef`` 64 or 32 (the package
  writes 128): a cheaper graph, at the price of the index's recall.

After the last window each variant reports the index's recall@10 against exact
search, for 200 queries that are noisy copies of stored vectors (how much a
cheaper graph loses).

CPU time, not wall time, so that other processes on the machine matter less.

Run from the repository root::

    .venv/bin/python -m benchmarks.probe_chroma_insert --eval-dir ../shared/eval --size 20000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_ingest import WordHashEmbedding, long_turns
from langchain_tiered_memory.tiers.long_memory.chroma import HNSW_METADATA, chroma_settings

VARIANTS = (
    "package",
    "ephemeral",
    "no-sync",
    "no-documents",
    "scope-only",
    "tiny-graph",
    "ef64",
    "ef32",
)
QUERIES = 200


def probe(
    variant: str, texts: Sequence[str], vectors: Sequence[Any], batch: int, every: int
) -> tuple[list[float], float]:
    """CPU ms per vector of each ``every`` vectors upserted, and the index's recall@10."""
    import chromadb

    config: dict[str, Any] = dict(HNSW_METADATA)
    if variant == "no-sync":
        config.update({"hnsw:sync_threshold": 1_000_000, "hnsw:batch_size": 1_000_000})
    if variant == "tiny-graph":
        config.update({"hnsw:construction_ef": 8, "hnsw:M": 4})
    if variant in ("ef64", "ef32"):
        config["hnsw:construction_ef"] = int(variant[2:])
    with tempfile.TemporaryDirectory(prefix="probe_chroma_") as folder:
        if variant == "ephemeral":
            client = chromadb.EphemeralClient(settings=chroma_settings())
        else:
            client = chromadb.PersistentClient(path=folder, settings=chroma_settings())
        collection = client.get_or_create_collection(
            f"probe-{variant}", embedding_function=None, metadata=config
        )
        lean = variant in ("no-documents", "scope-only", "tiny-graph")
        windows: list[float] = []
        spent = 0.0
        for start in range(0, len(texts), batch):
            end = min(start + batch, len(texts))
            metadatas: list[dict[str, Any]] = []
            for n in range(start, end):
                metadata: dict[str, Any] = {"session_id": "grow", "user_id": "user"}
                if variant not in ("scope-only", "tiny-graph"):
                    metadata.update(
                        kind="raw",
                        source_ids=json.dumps([2 * n, 2 * n + 1]),
                        turn_at="2026-01-01T00:00:00",
                        content_hash=hashlib.sha256(texts[n].encode()).hexdigest(),
                    )
                metadatas.append(metadata)
            began = time.process_time()
            collection.upsert(
                ids=[
                    hashlib.blake2b(str(n).encode(), digest_size=16).hexdigest()
                    for n in range(start, end)
                ],
                embeddings=list(vectors[start:end]),
                documents=None if lean else list(texts[start:end]),
                metadatas=metadatas,  # type: ignore[arg-type]
            )
            spent += time.process_time() - began
            if end % every == 0:
                windows.append(spent * 1000 / every)
                spent = 0.0
        recall = index_recall(collection, np.asarray(vectors, dtype=np.float32))
        client.delete_collection(f"probe-{variant}")
    return windows, recall


def index_recall(collection: Any, stored: np.ndarray) -> float:
    """Recall@10 of the collection's HNSW against exact cosine search."""
    rng = np.random.default_rng(0)
    picked = rng.choice(len(stored), min(QUERIES, len(stored)), replace=False)
    noise = rng.standard_normal((len(picked), stored.shape[1])).astype(np.float32)
    queries = stored[picked] + 0.3 * float(stored.std()) * noise
    unit = stored / np.linalg.norm(stored, axis=1, keepdims=True)
    asked = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(asked @ unit.T), axis=1)[:, :10]
    found = collection.query(query_embeddings=queries, n_results=10)["ids"]
    order = {
        hashlib.blake2b(str(n).encode(), digest_size=16).hexdigest(): n for n in range(len(stored))
    }
    hits = sum(
        len({order[i] for i in ids} & set(row)) for ids, row in zip(found, exact, strict=True)
    )
    return hits / exact.size


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument(
        "--size", type=int, default=20000, help="vectors in the collection at the end"
    )
    parser.add_argument("--batch", type=int, default=500, help="vectors per upsert")
    parser.add_argument("--every", type=int, default=2000, help="vectors per reported window")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args(argv)
    turns = long_turns(args.eval_dir, args.size, 1500, args.seed)
    texts = [f"User: {human}\nAssistant: {ai}" for human, ai in turns]
    vectors = WordHashEmbedding().embed_documents(texts)
    marks = list(range(args.every, args.size + 1, args.every))
    print("CPU ms per vector upserted, by collection size (vectors)")
    print(f"{'variant':<14}" + "".join(f"{m:>9,}" for m in marks) + "  recall@10 vs exact")
    for variant in args.variants:
        windows, recall = probe(variant, texts, vectors, args.batch, args.every)
        shown = "".join(f"{w:>9.2f}" for w in windows)
        print(f"{variant:<14}{shown}  {recall:.3f}", flush=True)


if __name__ == "__main__":
    main()
