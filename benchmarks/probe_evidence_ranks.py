"""Where LoCoMo's evidence turns rank: how far the misses of recall@10 are from the top 10.

``bench_recall`` counts the evidence turns a question's top 10 results hold. This
probe asks the same questions (same protocol: one user per conversation, raw turns,
user scope, MiniLM) for the top ``--depth`` results and reports, per question
category, how many evidence turns rank 1-10, 11-20, 21-50, 51-``depth`` or lower.
Evidence just below the top 10 is what a reranker could lift; evidence far below
shares little with the question in words or in the embedding's sense.

Run from the repository root::

    .venv/bin/python -m benchmarks.probe_evidence_ranks --eval-dir ../shared/eval
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.bench_recall import LOCOMO_CATEGORIES, evidence, ingest_locomo, recall_store
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

BANDS = ((1, 10), (11, 20), (21, 50))


def band(rank: int | None, depth: int) -> str:
    """The rank band of an evidence turn (``None``: below ``depth``)."""
    for low, high in BANDS:
        if rank is not None and low <= rank <= high:
            return f"{low}-{high}"
    return f"51-{depth}" if rank is not None else f"> {depth}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument("--depth", type=int, default=100, help="results asked per question")
    args = parser.parse_args(argv)
    samples = json.loads((args.eval_dir / "locomo_dev.json").read_text(encoding="utf-8"))
    counts = {category: Counter[str]() for category in LOCOMO_CATEGORIES}
    with tempfile.TemporaryDirectory(prefix="probe_ranks_") as folder:
        memory = recall_store(Path(folder), "ranks", MiniLMEmbeddings())
        for number, sample in enumerate(samples):
            user = f"locomo-{number}"
            dia_of = ingest_locomo(memory, sample, user)
            memory.flush(timeout=3600)
            for qa in sample["qa"]:
                gold = evidence(qa)
                if qa.get("category") not in LOCOMO_CATEGORIES or not gold:
                    continue
                docs = memory.search(qa["question"], user_id=user, scope="user", k=args.depth)
                rank: dict[str | None, int] = {}
                for position, doc in enumerate(docs, 1):
                    for message_id in doc.metadata["source_ids"]:
                        rank.setdefault(dia_of.get(message_id), position)
                for turn in gold:
                    counts[qa["category"]][band(rank.get(turn), args.depth)] += 1
        memory.close()
    bands = [f"{low}-{high}" for low, high in BANDS] + [f"51-{args.depth}", f"> {args.depth}"]
    print("| category | evidence turns | " + " | ".join(f"rank {b}" for b in bands) + " |")
    print("|---" * (len(bands) + 2) + "|")
    for category, label in LOCOMO_CATEGORIES.items():
        total = sum(counts[category].values())
        shares = " | ".join(
            f"{counts[category][b]} ({counts[category][b] / total:.0%})" for b in bands
        )
        print(f"| {label} | {total} | {shares} |")


if __name__ == "__main__":
    main()
