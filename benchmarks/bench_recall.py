"""Retrieval recall of the long-term tier on the public eval data, per embedding, in one table.

Run: ``.venv/bin/python -m benchmarks.bench_recall --eval-dir ../shared/eval``
(``--datasets locomo,madial,lme --embedding minilm,e5 --lme 3``).

Protocol (``../shared/eval/README.md``), through the public API with raw turns (no
extractor), user scope:

* LoCoMo dev: one user per conversation, every session ingested in order through
  the archive and the extraction queue (speaker_a as human, speaker_b as AI),
  question as the query; recall@10 = share of a question's evidence turns found in
  the provenance of the top 10 results, averaged over the questions of categories 1-4.
  Also one row per category (multi-hop, temporal, open-domain, single-hop), and one
  that also counts the turn a result shows before its own (its ``context_ids``).
* MADial-zh dev: corpus = the user's memories (``event``), each stored as a
  one-message turn; query = the dialogue lines before the test turn; recall@5 =
  share of ``relevant-id`` in the top 5.
* LongMemEval-S dev: each question its own user, its haystack's sessions ingested
  in order (user as human, assistant as AI); session recall_any@k = 1 if any answer
  session is among the sessions of the top k results. ``--lme N`` takes the first
  N questions (the file is stratified by type), 0 skips it.

Each row also gives the mean tokens of the returned memories (what a prompt would
carry), the search p50 (query embedding included) and the ingest rate: texts
(memories) embedded and stored per second by the worker, timed around ``flush``.

Baselines from the eval README: LoCoMo 0.60 (dense + BM25 RRF), MADial-zh 0.53 (BM25).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks.stats import percentile
from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings, MultilingualE5Embeddings
from langchain_tiered_memory.text.tokens import estimate_tokens
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

BASELINES = {"LoCoMo": 0.60, "MADial-zh": 0.53}
#: Targets of issue 13: LoCoMo dev recall@10 (overall, multi-hop, open-domain) and
#: MADial-zh dev recall@5.
TARGETS = {
    "LoCoMo": 0.88,
    "LoCoMo multi-hop": 0.65,
    "LoCoMo open-domain": 0.65,
    "MADial-zh": 0.65,
}
EMBEDDINGS: dict[str, Callable[[], Embeddings]] = {
    "minilm": MiniLMEmbeddings,
    "e5": MultilingualE5Embeddings,
}
_DIA = re.compile(r"D(\d+):(\d+)")


@dataclass
class Row:
    """One line of the table: a dataset's recall with one embedding, and its costs."""

    dataset: str
    embedding: str
    metric: str
    scores: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    search_ms: list[float] = field(default_factory=list)
    texts: int = 0
    ingest_seconds: float = 0.0
    haystacks: int = 0

    def add(self, score: float, docs: list[Any], seconds: float) -> None:
        """Record one question: its score, its returned memories and its search time."""
        self.scores.append(score)
        self.tokens.append(
            sum(estimate_tokens(d.page_content) for d in docs) / len(docs) if docs else 0.0
        )
        self.search_ms.append(seconds * 1000)

    def as_dict(self) -> dict[str, Any]:
        """The row's figures (rounded) for the table and the JSON."""
        n = len(self.scores)
        out: dict[str, Any] = {
            "dataset": self.dataset,
            "embedding": self.embedding,
            "metric": self.metric,
            "ours": round(sum(self.scores) / n, 3) if n else None,
            "questions": n,
            "mean_tokens": round(sum(self.tokens) / n, 1) if n else None,
            "search_p50_ms": round(percentile(self.search_ms, 50), 1) if n else None,
            "ingest_texts_per_s": round(self.texts / self.ingest_seconds, 1)
            if self.ingest_seconds
            else None,
        }
        if self.haystacks:
            out["ingest_s_per_haystack"] = round(self.ingest_seconds / self.haystacks, 1)
        # "LoCoMo", or "LoCoMo multi-hop" for a row of one category
        family = " ".join([self.dataset.split(" ")[0], *self.metric.split(", ")[1:]])
        if family in BASELINES:
            out["baseline"] = BASELINES[family]
        if family in TARGETS:
            out["target"] = TARGETS[family]
        return out


def recall_store(workdir: Path, name: str, embedding: Embeddings) -> ChromaLongMemory:
    """A long-term tier in ``workdir`` (SQLite archive, embedded Chroma), no worker thread."""
    backup = MySQLBackup(f"sqlite:///{workdir / f'{name}.sqlite3'}")
    return ChromaLongMemory(
        persist_directory=workdir / f"{name}-chroma",
        backup=backup,
        start_worker=False,
        embedding=embedding,
    )


def _flush(memory: ChromaLongMemory, row: Row) -> None:
    """Drain the queue, timing it and counting the memories it made."""
    count = memory.searcher.catalog.count_plan
    before = memory.backup.run(count())
    started = time.perf_counter()
    memory.flush(timeout=3600)
    row.ingest_seconds += time.perf_counter() - started
    row.texts += memory.backup.run(count()) - before


def _search(memory: ChromaLongMemory, query: str, user: str, k: int) -> tuple[list[Any], float]:
    started = time.perf_counter()
    docs = memory.search(query, user_id=user, scope="user", k=k)
    return docs, time.perf_counter() - started


def _sessions(conversation: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    numbers = sorted(
        int(key.split("_")[1])
        for key, value in conversation.items()
        if re.fullmatch(r"session_\d+", key) and isinstance(value, list)
    )
    for number in numbers:
        yield number, conversation[f"session_{number}"]


def _line(turn: dict[str, Any]) -> str:
    caption = turn.get("blip_caption")
    return f"{turn['text']} [shares a photo: {caption}]" if caption else turn["text"]


def ingest_locomo(memory: ChromaLongMemory, sample: dict[str, Any], user: str) -> dict[int, str]:
    """Write one conversation through the archive and the queue; map message ids to dia ids."""
    conversation = sample["conversation"]
    speaker_a = conversation["speaker_a"]
    dia_of: dict[int, str] = {}
    for number, turns in _sessions(conversation):
        session = f"{user}-s{number}"
        for index, turn in enumerate(turns):
            message: BaseMessage
            if turn["speaker"] == speaker_a:
                message = HumanMessage(_line(turn), name=turn["speaker"])
            else:
                message = AIMessage(_line(turn), name=turn["speaker"])
            last = index == len(turns) - 1
            jobs = ["extract"] if isinstance(message, AIMessage) or last else []
            (message_id,) = memory.backup.add_messages(session, [message], user_id=user, jobs=jobs)
            dia_of[message_id] = turn["dia_id"]
    return dia_of


def evidence(qa: dict[str, Any]) -> set[str]:
    """A LoCoMo question's evidence turns (``D<session>:<turn>``), read leniently.

    Some evidence strings are malformed (``'D8:6; D9:17'``, ``'D:11:26'``).
    """
    return {f"D{s}:{t}" for s, t in _DIA.findall(" ".join(map(str, qa["evidence"])))}


#: LoCoMo's question categories by the official code (5, adversarial, has no evidence).
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def locomo_recall(
    eval_dir: Path, workdir: Path, name: str, embedding: Embeddings, k: int = 10, hnsw: bool = False
) -> list[Row]:
    """Recall@k with the default (exact) dense search; with ``hnsw``, also via Chroma's HNSW.

    Beside the overall row: one row per question category, and one that also counts
    the turns a result shows before its own (``context_ids``: the turn before a raw
    memory, whose text the result carries and the mean tokens already count).

    Each user of LoCoMo dev holds fewer memories than the default ``exact_limit``,
    so the default searches exactly in process; ``exact_limit=0`` sends the same
    questions through Chroma's HNSW (the path of large scopes).
    """
    samples = json.loads((eval_dir / "locomo_dev.json").read_text(encoding="utf-8"))
    memory = recall_store(workdir, f"locomo-{name}", embedding)
    paths = {memory.exact_limit: "LoCoMo dev"}
    if hnsw:
        paths[0] = "LoCoMo dev (dense via Chroma HNSW)"
    rows = {
        limit: {
            key: Row(dataset, name, f"recall@{k}" + suffix)
            for key, suffix in [
                ("all", ""),
                *((c, f", {label}") for c, label in LOCOMO_CATEGORIES.items()),
                ("shown", ", shown turns (own + context)"),
            ]
        }
        for limit, dataset in paths.items()
    }
    first = rows[memory.exact_limit]["all"]
    for number, sample in enumerate(samples):
        user = f"locomo-{number}"
        dia_of = ingest_locomo(memory, sample, user)
        _flush(memory, first)
        for limit, group in rows.items():
            memory.exact_limit = limit
            for qa in sample["qa"]:
                category = qa.get("category")
                if category not in LOCOMO_CATEGORIES:
                    continue
                gold = evidence(qa)
                if not gold:
                    continue
                docs, seconds = _search(memory, qa["question"], user, k)
                own = {dia_of.get(i) for doc in docs for i in doc.metadata["source_ids"]}
                shown = own | {dia_of.get(i) for doc in docs for i in doc.metadata["context_ids"]}
                score = len(gold & own) / len(gold)
                group["all"].add(score, docs, seconds)
                group[category].add(score, docs, seconds)
                group["shown"].add(len(gold & shown) / len(gold), docs, seconds)
        memory.exact_limit = max(rows)
    memory.close()
    return [row for group in rows.values() for row in group.values()]


def madial_query(dialogue: dict[str, Any]) -> str:
    """The dialogue lines before the test turn, without speaker tags (the protocol's query)."""
    before = dialogue["dialogue"][: dialogue["test-turn"][0]]
    return "\n".join(
        re.sub(r"^<[^>]*>:", "", text).strip().strip('"')
        for text in before
        if not text.startswith(("<BOD>", "<EOD>"))
    )


def madial_recall(
    eval_dir: Path, workdir: Path, name: str, embedding: Embeddings, k: int = 5
) -> list[Row]:
    """Recall@k of MADial-zh dev: each memory a one-message turn of its user."""
    folder = eval_dir / "madial_zh"
    memory = recall_store(workdir, f"madial-{name}", embedding)
    row = Row("MADial-zh dev", name, f"recall@{k}")
    memory_of: dict[int, str] = {}
    for line in (folder / "memory.jsonl").read_text(encoding="utf-8").splitlines():
        (record,) = json.loads(line).values()
        user = f"madial-{record['user-id']}"
        (message_id,) = memory.backup.add_messages(
            f"{user}-m{record['id']}",
            [HumanMessage(record["event"])],
            user_id=user,
            jobs=["extract"],
        )
        memory_of[message_id] = str(record["id"])
    _flush(memory, row)
    for line in (folder / "dialogue_dev.jsonl").read_text(encoding="utf-8").splitlines():
        dialogue = json.loads(line)
        gold = {str(i) for i in dialogue["relevant-id"]}
        user = f"madial-{dialogue['user-id']}"
        docs, seconds = _search(memory, madial_query(dialogue), user, k)
        found = {memory_of.get(i) for doc in docs for i in doc.metadata["source_ids"]}
        row.add(len(gold & found) / len(gold), docs, seconds)
    memory.close()
    return [row]


def ingest_haystack(memory: ChromaLongMemory, item: dict[str, Any], user: str) -> dict[int, str]:
    """Write one LongMemEval haystack, session by session; map message ids to session ids."""
    session_of: dict[int, str] = {}
    for session_id, turns in zip(
        item["haystack_session_ids"], item["haystack_sessions"], strict=True
    ):
        session = f"{user}-{session_id}"
        for index, turn in enumerate(turns):
            human = turn["role"] == "user"
            message: BaseMessage = (
                HumanMessage(turn["content"]) if human else AIMessage(turn["content"])
            )
            last = index == len(turns) - 1
            jobs = ["extract"] if not human or last else []
            (message_id,) = memory.backup.add_messages(session, [message], user_id=user, jobs=jobs)
            session_of[message_id] = session_id
    return session_of


def lme_recall(
    eval_dir: Path, workdir: Path, name: str, embedding: Embeddings, haystacks: int
) -> list[Row]:
    """Session recall_any@5 and @10 of the first ``haystacks`` LongMemEval-S dev questions."""
    items = json.loads((eval_dir / "longmemeval_s_dev.json").read_text(encoding="utf-8"))
    memory = recall_store(workdir, f"lme-{name}", embedding)
    rows = {k: Row("LongMemEval-S dev", name, f"recall_any@{k}") for k in (5, 10)}
    for number, item in enumerate(items[:haystacks]):
        user = f"lme-{number}"
        session_of = ingest_haystack(memory, item, user)
        for row in rows.values():  # the same ingest, told to both rows
            row.haystacks += 1
        _flush(memory, rows[5])
        gold = set(item["answer_session_ids"])
        docs, seconds = _search(memory, item["question"], user, 10)
        for k, row in rows.items():
            found = {session_of.get(i) for doc in docs[:k] for i in doc.metadata["source_ids"]}
            row.add(float(bool(gold & found)), docs[:k], seconds)
    rows[10].texts, rows[10].ingest_seconds = rows[5].texts, rows[5].ingest_seconds
    memory.close()
    return list(rows.values())


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict[str, Any]]) -> str:
    """The one benchmark table (Markdown)."""
    lines = [
        "| dataset | embedding | metric | recall | questions | mean tokens / memory "
        "| search p50 ms | ingest texts/s | ingest s / haystack | baseline | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['dataset']} | {r['embedding']} | {r['metric']} | {_cell(r['ours'], '.3f')} "
            f"| {r['questions']} | {_cell(r['mean_tokens'], '.1f')} "
            f"| {_cell(r['search_p50_ms'], '.1f')} | {_cell(r['ingest_texts_per_s'], '.1f')} "
            f"| {_cell(r.get('ingest_s_per_haystack'), '.1f')} "
            f"| {_cell(r.get('baseline'), '.2f')} | {_cell(r.get('target'), '.2f')} |"
        )
    return "\n".join(lines)


def run(
    eval_dir: Path,
    workdir: Path,
    datasets: list[str],
    embeddings: list[str],
    haystacks: int,
    hnsw: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every dataset with every embedding, the quickest dataset first.

    ``progress`` is told each row as it is measured.
    """
    models: dict[str, Embeddings] = {}
    results = []
    for dataset in ("madial", "locomo", "lme"):
        if dataset not in datasets:
            continue
        for name in embeddings:
            if name not in models:
                models[name] = EMBEDDINGS[name]()
                # The model's load is not ingest or search time.
                models[name].embed_query("warm up")
            embedding = models[name]
            if dataset == "locomo":
                rows = locomo_recall(eval_dir, workdir, name, embedding, hnsw=hnsw)
            elif dataset == "madial":
                rows = madial_recall(eval_dir, workdir, name, embedding)
            elif haystacks:
                rows = lme_recall(eval_dir, workdir, name, embedding, haystacks)
            else:
                rows = []
            for row in rows:
                results.append(row.as_dict())
                if progress:
                    progress(results[-1])
    return results


def keyed(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows by name: ``"LoCoMo dev recall@10"`` for the default (MiniLM), ``", e5"`` added."""
    return {
        f"{r['dataset']} {r['metric']}"
        + ("" if r["embedding"] == "minilm" else f", {r['embedding']}"): r
        for r in results
    }


def _names(text: str, allowed: set[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        msg = f"{what}: unknown {unknown or text!r}; choose from {', '.join(sorted(allowed))}"
        raise argparse.ArgumentTypeError(msg)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument(
        "--datasets",
        type=lambda t: _names(t, {"locomo", "madial", "lme"}, "--datasets"),
        default=["locomo", "madial", "lme"],
        help="comma-separated: locomo, madial, lme",
    )
    parser.add_argument(
        "--embedding",
        type=lambda t: _names(t, set(EMBEDDINGS), "--embedding"),
        default=["minilm", "e5"],
        help="comma-separated: minilm, e5",
    )
    parser.add_argument(
        "--lme", type=int, default=3, help="LongMemEval-S dev haystacks (first N; 0 skips)"
    )
    parser.add_argument("--hnsw", action="store_true", help="LoCoMo also via Chroma's HNSW")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run(
            args.eval_dir,
            Path(tmp),
            args.datasets,
            args.embedding,
            args.lme,
            args.hnsw,
            progress=lambda row: print(json.dumps(row), flush=True),
        )
    print(table(results))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(keyed(results), indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
