"""BM25Index: the numpy scoring gives the textbook scores, in a stable order."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from collections import Counter

from langchain_tiered_memory.text.lexical import BM25Index, tokenize

DOCS = [
    "the invoice 1234 was paid in March",
    "invoice for the supplier, paid",
    "payroll runs on the 25th",
    "the supplier sent a refund",
    "invoice invoice invoice",
    "发票已经支付",
    "payroll runs on the 25th",  # a tie with the third document
]


def reference(
    docs: dict[str, str], query: str, k1: float = 1.2, b: float = 0.75
) -> dict[str, float]:
    tokens = {doc_id: tokenize(text) for doc_id, text in docs.items()}
    average = sum(map(len, tokens.values())) / len(tokens)
    scores: dict[str, float] = {}
    for term, query_count in Counter(tokenize(query)).items():
        having = [d for d, t in tokens.items() if term in t]
        if not having:
            continue
        idf = math.log(1 + (len(tokens) - len(having) + 0.5) / (len(having) + 0.5))
        for doc_id in having:
            tf = tokens[doc_id].count(term)
            norm = tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(tokens[doc_id]) / average))
            scores[doc_id] = scores.get(doc_id, 0.0) + idf * (1 + math.log(query_count)) * norm
    return scores


def test_scores_match_the_formula_and_ties_keep_their_order() -> None:
    index = BM25Index()
    docs = {str(i): text for i, text in enumerate(DOCS)}
    index.extend(docs.items())
    for query in ("invoice paid", "payroll 25th", "supplier refund invoice", "发票", "nothing"):
        found = index.search(query, 10)
        expected = reference(docs, query)
        assert all(math.isclose(score, expected[doc_id]) for doc_id, score in found)
        assert {doc_id for doc_id, _ in found} == set(expected)
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    ties = index.search("payroll", 10)
    assert [doc_id for doc_id, _ in ties] == ["2", "6"]
    assert index.search("invoice", 2) == index.search("invoice", 10)[:2]


def test_removed_and_replaced_documents() -> None:
    index = BM25Index()
    docs = {str(i): text for i, text in enumerate(DOCS)}
    index.extend(docs.items())
    index.remove("4", docs.pop("4"))
    index.remove("4", "already gone")  # a no-op
    docs["0"] = "the invoice 1234 was paid in April"
    index.remove("0", DOCS[0])
    index.add("0", docs["0"])
    assert len(index) == len(docs)
    found = dict(index.search("invoice april", 10))
    expected = reference(docs, "invoice april")
    assert found.keys() == expected.keys()
    assert all(math.isclose(found[d], expected[d]) for d in found)
    assert "4" not in dict(index.search("invoice", 10))


def test_fused_ties_rank_the_same_in_every_process() -> None:
    # Equal scores are common (a fake or quantised embedding, one shared keyword);
    # the order must not come from a set, whose order changes with the hash seed.
    code = (
        "from langchain_tiered_memory.text.lexical import fuse\n"
        "ids = [f'mem-{i:02d}' for i in range(30)]\n"
        "dense = dict.fromkeys(ids[:20], 0.5)\n"
        "lexical = dict.fromkeys(ids[10:], 1.0)\n"
        "print([i for i, _ in fuse(dense, lexical, dense_weight=0.5)])\n"
    )
    orders = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(1, 6)
    }
    assert len(orders) == 1
    ranked = ast.literal_eval(orders.pop())
    assert ranked[:10] == [f"mem-{i:02d}" for i in range(10, 20)]  # both sides, tied
