"""Where LoCoMo's evidence turns rank: how far the misses of recall@10 are from the top 10.

``bench_recall`` counts the evidence turns a question's top 10 results hold. This
probe asks the same questions (same protocol: one user per conversation, raw turns,
user scope, MiniLM) for the top ``--depth`` results and reports, per question
category, how many evidence turns rank 1-10, 11-20, 21-50, 51-``depth`` or lower.
Evidence just below the top 10 is what a reranker could lift; evidence far below
shares little with the question in words or in the embedding's sense.

It then reorders the same top results by two second passes over sessions and
reports recall@10 per category for each: ``lift`` puts the memories of the top
``n`` hits' sessions first (the issue's "second retrieval pass over the sessions of
the first hits"), ``spread`` charges each memory ``n`` ranks per memory of its
session already taken (multi-hop evidence lies in several sessions).

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

from langchain_core.documents import Document

from benchmarks.bench_recall import LOCOMO_CATEGORIES, evidence, ingest_locomo, recall_store
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

BANDS = ((1, 10), (11, 20), (21, 50))
#: Second passes over sessions, each with the strengths tried.
REORDERS = {"lift": (1, 3, 5), "spread": (1, 2, 4, 8)}


def reorder(docs: list[Document], how: str, n: int) -> list[Document]:
    """The first 10 of ``docs`` after a second pass over their sessions (see the module doc)."""
    if how == "lift":
        lifted = {doc.metadata["session_id"] for doc in docs[:n]}
        return sorted(docs, key=lambda doc: doc.metadata["session_id"] not in lifted)[:10]
    left = list(enumerate(docs))
    taken: list[Document] = []
    per_session = Counter[str]()
    while left and len(taken) < 10:
        best = min(left, key=lambda item: item[0] + n * per_session[item[1].metadata["session_id"]])
        left.remove(best)
        taken.append(best[1])
        per_session[best[1].metadata["session_id"]] += 1
    return taken


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
    variants = [("as searched", 0), *((how, n) for how, ns in REORDERS.items() for n in ns)]
    recalls = {variant: {c: list[float]() for c in LOCOMO_CATEGORIES} for variant in variants}
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
                for how, n in variants:
                    top = docs[:10] if how == "as searched" else reorder(docs, how, n)
                    own = {dia_of.get(i) for doc in top for i in doc.metadata["source_ids"]}
                    recalls[how, n][qa["category"]].append(len(gold & own) / len(gold))
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
    print()
    print("| recall@10 | overall | " + " | ".join(LOCOMO_CATEGORIES.values()) + " |")
    print("|---" * (len(LOCOMO_CATEGORIES) + 2) + "|")
    for (how, n), by_category in recalls.items():
        every = [score for scores in by_category.values() for score in scores]
        cells = " | ".join(f"{sum(v) / len(v):.3f}" for v in by_category.values())
        name = how if how == "as searched" else f"{how} {n}"
        print(f"| {name} | {sum(every) / len(every):.3f} | {cells} |")


if __name__ == "__main__":
    main()
