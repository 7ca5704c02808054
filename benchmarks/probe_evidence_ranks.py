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
session already taken (multi-hop evidence lies in several sessions). With
``--fuse-e5`` the same conversations are also stored with multilingual-e5 and each
question's two rankings are fused (reciprocal rank fusion, ``fuse k`` rows): a second
embedding's view of the same turns.

Run from the repository root::

    .venv/bin/python -m benchmarks.probe_evidence_ranks --eval-dir ../shared/eval
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from langchain_core.documents import Document

from benchmarks.bench_recall import LOCOMO_CATEGORIES, evidence, ingest_locomo, recall_store
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings, MultilingualE5Embeddings

BANDS = ((1, 10), (11, 20), (21, 50))
#: Second passes over sessions, each with the strengths tried.
REORDERS = {"lift": (1, 3, 5), "spread": (1, 2, 4, 8)}
#: Reciprocal rank fusion's k for ``--fuse-e5``.
FUSIONS = (5, 20, 60)
#: A result as the turns it holds (two stores give one turn different memory ids).
Turns = frozenset[str | None]


def fuse(rankings: list[list[Turns]], k: int) -> list[Turns]:
    """The first 10 of ``rankings`` fused: each result scores 1 / (k + rank) per ranking."""
    scores = defaultdict[Turns, float](float)
    for ranking in rankings:
        for rank, turns in enumerate(ranking, 1):
            scores[turns] += 1 / (k + rank)
    return sorted(scores, key=lambda turns: -scores[turns])[:10]


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
    parser.add_argument("--fuse-e5", action="store_true", help="also fuse with E5's ranking")
    args = parser.parse_args(argv)
    samples = json.loads((args.eval_dir / "locomo_dev.json").read_text(encoding="utf-8"))
    counts = {category: Counter[str]() for category in LOCOMO_CATEGORIES}
    variants = [("as searched", 0), *((how, n) for how, ns in REORDERS.items() for n in ns)]
    fusions = [("fuse", k) for k in FUSIONS] if args.fuse_e5 else []
    recalls = {v: {c: list[float]() for c in LOCOMO_CATEGORIES} for v in variants + fusions}
    with tempfile.TemporaryDirectory(prefix="probe_ranks_") as folder:
        memory = recall_store(Path(folder), "ranks", MiniLMEmbeddings())
        e5 = recall_store(Path(folder), "e5", MultilingualE5Embeddings()) if fusions else None
        for number, sample in enumerate(samples):
            user = f"locomo-{number}"
            dia_of = ingest_locomo(memory, sample, user)
            memory.flush(timeout=3600)
            if e5 is not None:
                e5_dia_of = ingest_locomo(e5, sample, user)
                e5.flush(timeout=3600)
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
                if e5 is not None:
                    rankings = [
                        [frozenset(map(dia_of.get, d.metadata["source_ids"])) for d in docs],
                        [
                            frozenset(map(e5_dia_of.get, d.metadata["source_ids"]))
                            for d in e5.search(
                                qa["question"], user_id=user, scope="user", k=args.depth
                            )
                        ],
                    ]
                    for how, k in fusions:
                        own = set().union(*fuse(rankings, k))
                        recalls[how, k][qa["category"]].append(len(gold & own) / len(gold))
        memory.close()
        if e5 is not None:
            e5.close()
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
