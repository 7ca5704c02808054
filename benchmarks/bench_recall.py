"""Retrieval recall of the long-term tier on the public eval data, with the offline defaults.

Run: ``.venv/bin/python -m benchmarks.bench_recall --eval-dir ../shared/eval``

Protocol (``../shared/eval/README.md``):

* LoCoMo dev: one user per conversation, every session ingested in order through
  the archive and the extraction queue (speaker_a as human, speaker_b as AI, no
  extractor: raw turns), question as the query, user scope; recall@10 = share of a
  question's evidence turns found in the provenance of the top 10 results, averaged
  over the questions of categories 1-4.
* MADial-zh dev: corpus = the user's memories (``event``), each stored as a
  one-message turn; query = the dialogue lines before the test turn; recall@5 =
  share of ``relevant-id`` in the top 5.

Baselines from the README: LoCoMo 0.60 (dense + BM25 RRF), MADial-zh 0.53 (BM25).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from langchain_tiered_memory import MySQLBackup
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory

BASELINES = {"LoCoMo dev recall@10": 0.60, "MADial-zh dev recall@5": 0.53}
TARGET = 0.80
_DIA = re.compile(r"D(\d+):(\d+)")


def _memory(workdir: Path, name: str) -> ChromaLongMemory:
    backup = MySQLBackup(f"sqlite:///{workdir / f'{name}.sqlite3'}")
    return ChromaLongMemory(
        persist_directory=workdir / f"{name}-chroma", backup=backup, start_worker=False
    )


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


def locomo_recall(eval_dir: Path, workdir: Path, k: int = 10) -> dict[str, tuple[float, int]]:
    """Recall@k with the default dense search, and with every scope's dense side in Chroma.

    Each user of LoCoMo dev holds fewer memories than the default ``exact_limit``,
    so the default searches exactly in process; ``exact_limit=0`` sends the same
    questions through Chroma's HNSW (the path of large scopes).
    """
    samples = json.loads((eval_dir / "locomo_dev.json").read_text())
    memory = _memory(workdir, "locomo")
    paths = {"": memory.exact_limit, ", dense via Chroma HNSW": 0}
    scores: dict[str, list[float]] = {path: [] for path in paths}
    for number, sample in enumerate(samples):
        user = f"locomo-{number}"
        dia_of = ingest_locomo(memory, sample, user)
        memory.flush(timeout=600)
        for path, limit in paths.items():
            memory.exact_limit = limit
            for qa in sample["qa"]:
                if qa.get("category") not in (1, 2, 3, 4):
                    continue
                gold = {f"D{s}:{t}" for s, t in _DIA.findall(" ".join(map(str, qa["evidence"])))}
                if not gold:
                    continue
                found = set()
                for doc in memory.search(qa["question"], user_id=user, scope="user", k=k):
                    found.update(dia_of.get(i) for i in doc.metadata["source_ids"])
                scores[path].append(len(gold & found) / len(gold))
        memory.exact_limit = paths[""]
    memory.close()
    return {
        f"LoCoMo dev recall@{k}{path}": (sum(values) / len(values), len(values))
        for path, values in scores.items()
    }


def madial_recall(eval_dir: Path, workdir: Path, k: int = 5) -> dict[str, tuple[float, int]]:
    folder = eval_dir / "madial_zh"
    memory = _memory(workdir, "madial")
    memory_of: dict[int, str] = {}
    for line in (folder / "memory.jsonl").read_text().splitlines():
        (record,) = json.loads(line).values()
        user = f"madial-{record['user-id']}"
        (message_id,) = memory.backup.add_messages(
            f"{user}-m{record['id']}",
            [HumanMessage(record["event"])],
            user_id=user,
            jobs=["extract"],
        )
        memory_of[message_id] = str(record["id"])
    memory.flush(timeout=600)
    scores = []
    for line in (folder / "dialogue_dev.jsonl").read_text().splitlines():
        dialogue = json.loads(line)
        before = dialogue["dialogue"][: dialogue["test-turn"][0]]
        query = "\n".join(
            re.sub(r"^<[^>]*>:", "", text).strip().strip('"')
            for text in before
            if not text.startswith(("<BOD>", "<EOD>"))
        )
        gold = {str(i) for i in dialogue["relevant-id"]}
        found = set()
        for doc in memory.search(query, user_id=f"madial-{dialogue['user-id']}", scope="user", k=k):
            found.update(memory_of.get(i) for i in doc.metadata["source_ids"])
        scores.append(len(gold & found) / len(gold))
    memory.close()
    return {f"MADial-zh dev recall@{k}": (sum(scores) / len(scores), len(scores))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in (locomo_recall, madial_recall):
            started = time.perf_counter()
            for name, (value, questions) in run(args.eval_dir, Path(tmp)).items():
                results[name] = {
                    "ours": round(value, 3),
                    "baseline": BASELINES[name.split(",")[0]],
                    "target": TARGET,
                    "questions": questions,
                    "seconds": round(time.perf_counter() - started, 1),
                }
    print(f"{'metric':<44} {'ours':>6} {'baseline':>9} {'target':>7} {'questions':>10} {'secs':>6}")
    for name, row in results.items():
        verdict = "PASS" if row["ours"] >= TARGET else "MISS"
        print(
            f"{name:<44} {row['ours']:>6.3f} {row['baseline']:>9.2f} {TARGET:>7.2f} "
            f"{row['questions']:>10} {row['seconds']:>6} {verdict}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
