"""The scripted ERP demo behind ``tiered-memory demo``: every tier at work, offline.

Three sessions of one user (AR and AP tables, large tool outputs) are played on the
embedded defaults; after each step the demo prints what a tier holds: the window, the
archive, a compression, the extracted memories, a consolidation into MEMORY.md, and a
later session recalling an early fact.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from rich.console import Console
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from langchain_tiered_memory.cli.render import message_text, print_memories, shorten, stamp
from langchain_tiered_memory.cli.store import Store, all_history
from langchain_tiered_memory.text.tokens import estimate_tokens

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

DEMO_USER = "alice"
DEMO_TODAY = "2024-04-01"  # the scripted ERP's today, so that its figures never change
DEMO_WINDOW_TURNS = 3
DEMO_WINDOW_TOKENS = 8_000
# The design's 60k / 100k / 120k thresholds, scaled down so that a few tool outputs pass them.
DEMO_COMPRESS = 8_000
DEMO_FORCE_DELETE = 13_000
DEMO_ERROR = 16_000
DEMO_CONSOLIDATE_AFTER = 8  # messages past the cursor (the design: 100)
DEMO_CONSOLIDATE_BATCH = 6
DEMO_ROWS = 48  # rows of each query_erp result (~4k tokens)
DEMO_MATCH_LINES = 150  # lines of the three-way match document (~4k tokens)


def _ar_open_invoices() -> tuple[str, str]:
    rng = random.Random(1024)
    rows, total, overdue = [], 0.0, 0
    for n in range(1, DEMO_ROWS + 1):
        amount = round(rng.uniform(80, 25_000), 2)
        due = f"2024-{rng.randint(1, 6):02d}-{rng.randint(1, 28):02d}"
        total += amount
        overdue += due < DEMO_TODAY
        rows.append(
            {
                "invoice_no": f"INV-24{n:05d}",
                "customer_id": "C-1024",
                "customer_name": "华东贸易有限公司",
                "amount": f"{amount:.2f}",
                "currency": "CNY",
                "due_date": due,
                "status": "open",
                "memo": f"第{n}期货款 instalment {n}",
            }
        )
    output = json.dumps({"row_count": len(rows), "rows": rows}, ensure_ascii=False)
    answer = (
        f"Customer C-1024 has {len(rows)} open invoices, CNY {total:,.2f} in total; "
        f"{overdue} of them are overdue (status = 'open' and due_date < {DEMO_TODAY})."
    )
    return output, answer


def _ap_unpaid_bills() -> tuple[str, str]:
    rng = random.Random(88)
    rows, total = [], 0.0
    for n in range(1, DEMO_ROWS + 1):
        amount = round(rng.uniform(150, 40_000), 2)
        total += amount
        rows.append(
            {
                "bill_no": f"AP-2404-{n:04d}",
                "vendor_id": "V-88",
                "vendor_name": "江南精密机械",
                "po_no": f"PO-24{rng.randint(1000, 9999)}",
                "amount": f"{amount:.2f}",
                "currency": "CNY",
                "due_date": f"2024-04-{rng.randint(1, 30):02d}",
                "paid_at": None,
                "status": "unpaid",
            }
        )
    output = json.dumps({"row_count": len(rows), "rows": rows}, ensure_ascii=False)
    answer = f"V-88 has {len(rows)} unpaid bills this month, CNY {total:,.2f} in total."
    return output, answer


def _three_way_match() -> tuple[str, str]:
    rng = random.Random(3)
    lines = ["# Three-way match, April 2024 (PO line / goods receipt / bill)", ""]
    counts = {"matched": 0, "quantity differs": 0, "awaiting goods receipt": 0}
    for n in range(DEMO_MATCH_LINES):
        state = rng.choices(list(counts), weights=(8, 1, 1))[0]
        counts[state] += 1
        ordered = rng.randint(1, 500)
        received = ordered if state == "matched" else rng.randint(0, ordered)
        lines.append(
            f"- AP-2404-{n % DEMO_ROWS + 1:04d} line {n // DEMO_ROWS + 1}: "
            f"PO-24{rng.randint(1000, 9999)} ordered {ordered} units, received {received}, "
            f"billed {ordered}; {state}."
        )
    answer = (
        f"Of the {DEMO_MATCH_LINES} PO lines on those {DEMO_ROWS} bills, {counts['matched']} "
        f"match their goods receipt, {counts['quantity differs']} differ in quantity and "
        f"{counts['awaiting goods receipt']} await the goods receipt."
    )
    return "\n".join(lines), answer


@dataclass(frozen=True)
class DemoTurn:
    """One scripted turn: a question, maybe a tool round trip, and the scripted answer."""

    question: str
    answer: str | None = None  # None: the model answers from its prompt (recalled memories)
    tool: str | None = None
    tool_args: dict[str, Any] = field(default_factory=dict)
    tool_output: Callable[[], tuple[str, str]] | None = None


DEMO_SESSIONS: list[tuple[str, str, list[DemoTurn]]] = [
    (
        "ar",
        "accounts receivable",
        [
            DemoTurn(
                "In our ERP an AR invoice is overdue when status = 'open' and due_date < "
                "CURRENT_DATE; receivables live in ar_invoice (invoice_no, customer_id, "
                "amount, currency, due_date, status).",
                "Noted: ar_invoice holds invoice_no, customer_id, amount, currency, due_date "
                "and status, and an invoice is overdue when status = 'open' and due_date < "
                "CURRENT_DATE.",
            ),
            DemoTurn(
                "I prefer amounts in CNY with two decimals, please.",
                "Understood: amounts in CNY with two decimals from now on.",
            ),
            DemoTurn(
                "List the open invoices of customer C-1024.",
                tool="query_erp",
                tool_args={
                    "sql": "SELECT * FROM ar_invoice WHERE customer_id = 'C-1024' "
                    "AND status = 'open'"
                },
                tool_output=_ar_open_invoices,
            ),
            DemoTurn(
                "Which table links receipts to invoices?",
                "ar_receipt_alloc links ar_receipt.receipt_no to ar_invoice.invoice_no, with "
                "the amount allocated to each invoice.",
            ),
        ],
    ),
    (
        "ap",
        "accounts payable",
        [
            DemoTurn(
                "应付账款表 ap_bill 有哪些字段？",
                "ap_bill 有 bill_no、vendor_id、po_no、amount、due_date、paid_at 和 status "
                "字段；付款记录在 ap_payment 表。",
            ),
            DemoTurn(
                "Show this month's unpaid bills of vendor V-88.",
                tool="query_erp",
                tool_args={
                    "sql": "SELECT * FROM ap_bill WHERE vendor_id = 'V-88' AND paid_at IS NULL "
                    "AND due_date >= '2024-04-01'"
                },
                tool_output=_ap_unpaid_bills,
            ),
            DemoTurn(
                "And what is their three-way match status?",
                tool="get_document_by_name",
                tool_args={"name": "three_way_match_2024_04"},
                tool_output=_three_way_match,
            ),
        ],
    ),
    (
        "month-end",
        "month-end close",
        [DemoTurn("Before I close the month: how do we decide that an AR invoice is overdue?")],
    ),
]


@dataclass
class _Compression:
    session_id: str
    before: int
    after: int
    messages_before: int
    messages_after: int
    summary: str


class Demo:
    """Plays the scripted conversation and shows each tier as it fills."""

    def __init__(
        self, store: Store, console: Console, llm: BaseChatModel | None, run_id: str
    ) -> None:
        from langchain_tiered_memory.cli.llms import ScriptedChatModel
        from langchain_tiered_memory.tiers.compression import ContextCompressor

        self.store = store
        self.console = console
        self.real = llm is not None
        # Tool results are made once; their scripted answers are computed from them.
        self.tool_outputs: dict[str, str] = {}
        script: dict[str, str] = {}
        for _, _, turns in DEMO_SESSIONS:
            for turn in turns:
                if turn.tool_output is not None:
                    self.tool_outputs[turn.question], script[turn.question] = turn.tool_output()
                elif turn.answer is not None:
                    script[turn.question] = turn.answer
        self.llm: BaseChatModel = llm or ScriptedChatModel(script=script)
        self.backup = store.backup(create=True)
        self.long_memory = store.long_memory(extractor=llm, start_worker=True, poll_interval=0.2)
        self.consolidator = store.consolidator(
            self.llm,
            threshold=DEMO_CONSOLIDATE_AFTER,
            batch=DEMO_CONSOLIDATE_BATCH,
            start_worker=True,
            poll_interval=0.2,
        )
        self.compressor = ContextCompressor(
            compress_threshold=DEMO_COMPRESS,
            force_delete_threshold=DEMO_FORCE_DELETE,
            error_threshold=DEMO_ERROR,
        )
        self.run_id = run_id
        self.compressions: list[_Compression] = []

    def session_id(self, key: str) -> str:
        """The demo's id for a scripted session key."""
        return f"{DEMO_USER}-{key}{self.run_id}"

    def history(self, session_id: str) -> Any:
        """The session's TieredChatMessageHistory on the demo's tiers."""
        from langchain_tiered_memory.memory.history import TieredChatMessageHistory

        return TieredChatMessageHistory.on_tiers(
            self,
            session_id,
            user_id=DEMO_USER,
            window_turns=DEMO_WINDOW_TURNS,
            window_max_tokens=DEMO_WINDOW_TOKENS,
        )

    # -- output ---------------------------------------------------------------

    def say(self, value: str, style: str = "") -> None:
        """Print a line."""
        self.console.print(Text(value, style=style))

    def section(self, title: str) -> None:
        """Print a section rule."""
        self.console.print()
        self.console.print(Rule(Text(title, style="bold"), align="left"))

    # -- the conversation -----------------------------------------------------

    def prompt(
        self, session_id: str, history: Any, new: list[BaseMessage]
    ) -> tuple[list[BaseMessage], list[Document]]:
        """The prompt of one call: system, memories, window and question."""
        question = message_text(new[0])
        memories = self.long_memory.search(
            question, session_id=session_id, user_id=DEMO_USER, scope="user", k=3
        )
        lines = ["You are an ERP assistant (AR/AP). Long-term memories, most relevant first:"]
        lines += [f"- {' '.join(doc.page_content.split())}" for doc in memories] or ["(none)"]
        memory_md = history.consolidated_memory
        if memory_md:
            lines += ["", "Consolidated memory of this session (MEMORY.md):", memory_md]
        return [SystemMessage("\n".join(lines)), *history.messages, *new], memories

    def turn(self, session_id: str, history: Any, number: int, turn: DemoTurn) -> list[Document]:
        """Play one turn: recall, answer, archive; returns the memories it recalled."""
        self.say(f"{DEMO_USER}> {turn.question}", "cyan")
        new: list[BaseMessage] = [HumanMessage(turn.question)]
        if turn.tool and turn.question in self.tool_outputs:
            output = self.tool_outputs[turn.question]
            call_id = f"call_{session_id}_{number}"
            new += [
                AIMessage(
                    "", tool_calls=[{"name": turn.tool, "args": turn.tool_args, "id": call_id}]
                ),
                ToolMessage(output, tool_call_id=call_id, name=turn.tool),
            ]
            self.say(
                f"  tool {turn.tool} -> {len(output):,} characters "
                f"(~{estimate_tokens(output):,} tokens)",
                "magenta",
            )
        prompt, memories = self.prompt(session_id, history, new)
        before = self.compressor.measure(prompt)
        sent = self.compressor.compress(prompt)
        after = self.compressor.measure(sent)
        if sent is not prompt and after < before:
            summary = next(
                (
                    message_text(m)
                    for m in sent
                    if isinstance(m, SystemMessage) and m is not prompt[0]
                ),
                "",
            )
            self.compressions.append(
                _Compression(session_id, before, after, len(prompt), len(sent), summary)
            )
            self.say(
                f"  compression: the prompt had {before:,} tokens (> {DEMO_COMPRESS:,}); "
                f"sent {after:,} tokens, {len(prompt)} -> {len(sent)} messages",
                "yellow",
            )
        reply = self.llm.invoke(sent)
        answer = reply if isinstance(reply, AIMessage) else AIMessage(message_text(reply))
        history.add_messages([*new, answer])
        label = "bot" if self.real else "bot (scripted)"
        self.say(f"{label}> {shorten(message_text(answer), 600)}", "green")
        return memories

    def play(self, index: int) -> tuple[str, Any]:
        """Play a scripted session; returns its id and history."""
        key, title, turns = DEMO_SESSIONS[index]
        session_id = self.session_id(key)
        self.section(f"Session {index + 1}: {session_id} ({title}), user {DEMO_USER}")
        history = self.history(session_id)
        for number, turn in enumerate(turns, 1):
            self.turn(session_id, history, number, turn)
        return session_id, history

    # -- the tiers ------------------------------------------------------------

    def show_window(self, session_id: str, history: Any) -> None:
        """Print the session's window."""
        self.section("The window (what the next prompt gets)")
        window = history.messages
        archived = len(history.all_messages())
        self.say(
            f"last {DEMO_WINDOW_TURNS} turns within {DEMO_WINDOW_TOKENS:,} tokens, cut on turn "
            f"boundaries: {len(window)} of the {archived} archived messages of {session_id}, "
            f"{estimate_tokens(window):,} tokens"
        )
        for message in window:
            self.say(f"  [{message.type}] {shorten(message_text(message), 110)}")

    def show_archive(self, session_id: str) -> None:
        """Print a page of the session's archive."""
        self.section("The archive (every message, durable before add_messages returns)")
        rows = all_history(self.backup, session_id)
        self.say(f"{self.backup!r}: {len(rows)} messages of {session_id}")
        grid = Table(show_header=True, box=None, pad_edge=False)
        for column in ("id", "role", "content"):
            grid.add_column(column, overflow="fold")
        for row in rows:
            grid.add_row(str(row.id), row.role, Text(shorten(message_text(row.message), 100)))
        self.console.print(grid)

    def show_compression(self) -> None:
        """Print the compression of the largest prompt seen."""
        self.section("Compression before the LLM call (ContextCompressor, no LLM needed)")
        if not self.compressions:
            self.say("no prompt passed the threshold")
            return
        self.say(
            f"thresholds: compress above {DEMO_COMPRESS:,} tokens, force-delete above "
            f"{DEMO_FORCE_DELETE:,}, refuse above {DEMO_ERROR:,} (the design's 60k/100k/120k, "
            "scaled down)"
        )
        for c in self.compressions:
            self.say(
                f"  {c.session_id}: {c.before:,} -> {c.after:,} tokens "
                f"({c.messages_before} -> {c.messages_after} messages)"
            )
        last = self.compressions[-1]
        lines = last.summary.splitlines()
        body = "\n".join(lines[:14]) + (
            f"\n... ({len(lines) - 14} more lines)" if len(lines) > 14 else ""
        )
        self.console.print(
            Panel(
                Text(body),
                title="the structured summary that replaced older messages",
                title_align="left",
            )
        )

    def show_memories(self, session_ids: Sequence[str]) -> None:
        """Print the memories extracted from the sessions."""
        self.section("Long-term memories (extracted after each turn by a background worker)")
        started = time.perf_counter()
        self.long_memory.flush(timeout=300 if self.real else 60)
        kind = "LLM extraction" if self.real else "raw turns (raw-turn extractor)"
        self.say(f"queue drained in {time.perf_counter() - started:.1f} s; {kind}:")
        grid = Table(box=None, pad_edge=False)
        for column in ("session", "kind", "memory", "source ids"):
            grid.add_column(column, overflow="fold")
        # Chroma holds what the catalog holds; in the order the turns were played.
        found = self.long_memory.collection.get(
            where={"session_id": {"$in": list(session_ids)}}, include=["documents", "metadatas"]
        )
        rows = sorted(
            zip(found["documents"], found["metadatas"], strict=True),
            key=lambda row: (list(session_ids).index(row[1]["session_id"]), row[1]["turn_at"]),
        )
        for text, meta in rows:
            grid.add_row(
                Text(meta["session_id"]), meta["kind"], Text(shorten(text, 110)), meta["source_ids"]
            )
        self.console.print(grid)

    def show_consolidation(self, session_id: str) -> None:
        """Run a consolidation and print MEMORY.md."""
        self.section("Consolidation into MEMORY.md (old history, by the LLM, off the hot path)")
        started = time.perf_counter()
        self.consolidator.flush(timeout=300 if self.real else 60)
        memory_md = self.consolidator.memory(session_id)
        entries = self.consolidator.history_entries(session_id)
        self.say(
            f"more than {DEMO_CONSOLIDATE_AFTER} messages past the cursor queue a job; "
            f"it took the oldest {DEMO_CONSOLIDATE_BATCH} ({len(entries)} batch(es), "
            f"{time.perf_counter() - started:.1f} s to wait for)"
        )
        path = self.consolidator.folder(session_id) / "MEMORY.md"
        title = f"{path}" + ("" if self.real else " (scripted consolidation)")
        self.console.print(
            Panel(Text(memory_md.strip() or "(empty)"), title=Text(title), title_align="left")
        )

    def show_recall(self, index: int) -> None:
        """Play a later session that recalls an early fact."""
        key, title, turns = DEMO_SESSIONS[index]
        session_id = self.session_id(key)
        self.section(f"Recall in a later session: {session_id} ({title}), user {DEMO_USER}")
        history = self.history(session_id)
        self.say(f"a new session: its window is empty ({len(history.messages)} messages)")
        memories: list[Document] = []
        for number, turn in enumerate(turns, 1):
            memories = self.turn(session_id, history, number, turn)
        print_memories(
            memories, "recalled by the last question (scope=user: all of alice's sessions)", 160
        )
        if memories:
            source = memories[0].metadata
            self.say(
                f"the best memory comes from session {source['session_id']}, archive messages "
                f"{source['source_ids']}, written {source['turn_at'][:19]}",
                "bold",
            )

    def show_sessions(self) -> None:
        """Print the user's sessions."""
        self.section(f"Sessions of {DEMO_USER}")
        for info in self.backup.sessions(user_id=DEMO_USER):
            self.say(
                f"  {info.session_id}: {info.message_count} messages, "
                f"last active {stamp(info.last_active)}"
            )
