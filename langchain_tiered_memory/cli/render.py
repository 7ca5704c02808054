"""How the command line shows things: messages, memories, tables, sizes and exports."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, message_to_dict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from langchain_tiered_memory.core.encoding import exact_json
from langchain_tiered_memory.core.turns import call_text

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from langchain_tiered_memory.storage.archive import ArchivedMessage


class _Output(Console):
    """A console that leaves a closed pipe to the command (rich exits with code 1)."""

    def on_broken_pipe(self) -> None:
        """Raise ``BrokenPipeError``: ``friendly_errors`` ends the command quietly."""
        raise BrokenPipeError


def out() -> Console:
    """The console of a command's output (no highlighting of numbers or paths)."""
    return _Output(highlight=False)


def message_text(message: BaseMessage) -> str:
    """A message's text, with its tool calls, or the size of a tool result."""
    content = str(message.text) if isinstance(message.text, str) else str(message.content)
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = "; ".join(f"-> {call_text(call)}" for call in message.tool_calls)
        content = f"{content}\n{calls}" if content else calls
    if isinstance(message, ToolMessage):
        content = f"[{message.name or 'tool'} result, {len(content):,} chars] {content}"
    return content


# C0 and C1 controls (ESC, CSI U+009B, BEL, DEL...) and the bidi controls that
# reorder what a reader sees ("Trojan Source"): stored text is untrusted.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
_CONTROLS_BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode()


def for_terminal(text: str) -> str:
    r"""``text`` with its control characters shown as escapes (``\x1b``), lines and tabs kept.

    What a document printed to a terminal goes through: an escape sequence in a
    stored message would drive the reader's terminal (clear the screen, hide
    lines, set its clipboard), a bidi control would reorder what they read.
    """
    return _CONTROLS_BUT_LINES.sub(_escaped, text)


def shorten(value: str, limit: int) -> str:
    r"""``value`` on one line, cut to ``limit`` characters (``0``: no limit).

    A lone surrogate is shown as its escape (``\ud83d``), so a table measures the
    cell as it is printed. So is a control character (``\x1b``), as in
    :func:`for_terminal`.
    """
    value = " ".join(value.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    value = _CONTROLS.sub(_escaped, value)
    if limit <= 0 or len(value) <= limit:
        return value
    return value[: limit - 1] + "…"


def stamp(value: datetime) -> str:
    """A timestamp to the second."""
    return value.strftime("%Y-%m-%d %H:%M:%S")


def size(num: float) -> str:
    """A number of bytes in B, KB, MB or GB."""
    if num < 1024:
        return f"{num:,.0f} B"
    for unit in ("KB", "MB", "GB"):
        num /= 1024
        if num < 1024 or unit == "GB":
            break
    return f"{num:,.1f} {unit}"


def folder_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def role_style(role: str) -> str:
    """The rich style of a message role."""
    return {"human": "cyan", "ai": "green", "tool": "magenta", "system": "yellow"}.get(role, "")


def print_memories(docs: Sequence[Document], title: str, chars: int = 300) -> None:
    """Print found long-term memories as a table."""
    console = out()
    if not docs:
        console.print(Text(f"{title}: none"))
        return
    grid = Table(title=Text(title), title_justify="left")
    for column in ("#", "score", "session", "kind", "memory", "source ids"):
        grid.add_column(column, overflow="fold", justify="right" if column in "#score" else "left")
    for rank, doc in enumerate(docs, 1):
        meta = doc.metadata
        grid.add_row(
            str(rank),
            f"{meta.get('score', 0.0):.3f}",
            Text(str(meta.get("session_id", ""))),
            str(meta.get("kind", "")),
            Text(shorten(doc.page_content, chars)),
            ",".join(map(str, meta.get("source_ids", []))),
        )
    console.print(grid)


def _fence(body: str) -> str:
    """A code fence longer than any run of backticks in ``body``."""
    runs = [len(run) for run in re.findall(r"`+", body)]
    return "`" * max(3, max(runs, default=0) + 1)


def export_md(session: str, rows: Sequence[ArchivedMessage]) -> str:
    """A session's archived messages as a readable Markdown transcript."""
    users = sorted({row.user_id for row in rows if row.user_id})
    lines = [f"# Session {session}", ""]
    if users:
        lines += [f"User: {', '.join(users)}", ""]
    lines += [
        f"{len(rows)} messages, {stamp(rows[0].created_at)} to {stamp(rows[-1].created_at)} (UTC)",
        "",
    ]
    label = {"human": "User", "ai": "Assistant", "tool": "Tool", "system": "System"}
    for row in rows:
        message = row.message
        heading = label.get(row.role, row.role)
        if isinstance(message, ToolMessage) and message.name:
            heading += f" ({message.name})"
        lines += [f"## #{row.id} {heading} · {stamp(row.created_at)}", ""]
        body = message.text if isinstance(message.text, str) else str(message.content)
        if isinstance(message, ToolMessage):
            lines += [_fence(body), body, _fence(body)]
        elif body:
            lines.append(body)
        if isinstance(message, AIMessage) and message.tool_calls:
            for call in message.tool_calls:
                lines += [
                    "",
                    f"Tool call `{call['name']}`:",
                    "```json",
                    json.dumps(call["args"], ensure_ascii=False, indent=2),
                    "```",
                ]
        lines.append("")
    return "\n".join(lines)


def export_jsonl(rows: Sequence[ArchivedMessage]) -> str:
    """One JSON line per archived message (``message_to_dict``, for ``messages_from_dict``).

    Exact, as the archive: a lone surrogate is written as its JSON escape.
    """
    return "".join(
        exact_json(
            {
                "id": row.id,
                "session_id": row.session_id,
                "user_id": row.user_id,
                "role": row.role,
                "created_at": row.created_at.isoformat(),
                "message": message_to_dict(row.message),
            }
        )
        + "\n"
        for row in rows
    )


def tolerant_output() -> None:
    r"""Let stdout and stderr print any text, escaping what their encoding cannot hold.

    The archive keeps a message exactly, a lone surrogate included, and a terminal
    may not be UTF-8: a command shows such a character as ``\ud83d`` instead of
    failing on it.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
