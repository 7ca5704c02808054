"""The README's Python snippets run as written, top to bottom, as a reader would paste them.

Every ```python block of README.md runs, in order, in one namespace, in a temporary folder
(``TIERED_MEMORY_HOME`` inside it). The names a snippet uses without defining them are the
reader's own objects (their model, their tools, their messages) and come from ``GIVEN``
below, offline stand-ins; any other undefined name fails the test, so a snippet cannot
drift from the package's API or from the snippets above it. Top-level ``await`` runs on an
event loop. After the last snippet, what their comments promise is checked.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import itertools
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from langchain_tiered_memory import TieredChatMessageHistory
from langchain_tiered_memory.cli.llms import ScriptedChatModel as AnsweringModel
from tests.fakes import ScriptedChatModel, cut, done

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class ReaderModel(AnsweringModel):
    """The reader's chat model: answers from its prompt, and takes tools like a real one."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class ChatOpenAI(ScriptedChatModel):
    """Stands in for langchain-openai's: each answer is cut twice by the token limit."""

    def __init__(self, **kwargs: Any) -> None:
        replies = itertools.cycle([cut("The AR "), cut("reconciliation "), done("procedure.")])
        super().__init__(messages=(reply.model_copy() for reply in replies))


@tool
def query_erp(sql: str) -> str:
    """Run a read-only SQL query on the ERP database."""
    return "ar_invoice: invoice_no, customer_id, amount, due_date, status"


def given_files(ns: dict[str, Any]) -> None:
    """Files a snippet reads from the reader's folder."""
    Path("docs").mkdir(exist_ok=True)
    Path("docs/ar_tables.md").write_text("# AR\n\nar_invoice holds the invoices.\n", "utf-8")
    Path("docs/faq.txt").write_text("Invoices are due in 30 days.\n", "utf-8")


#: The reader's own objects, by the name the snippets give them.
GIVEN: dict[str, Callable[[dict[str, Any]], Any]] = {
    "llm": lambda ns: ReaderModel(),
    "model": lambda ns: ReaderModel(),
    "tools": lambda ns: [query_erp],
    "query_erp": lambda ns: query_erp,
    "ChatOpenAI": lambda ns: ChatOpenAI,
    "messages": lambda ns: [
        HumanMessage("Which fields has ar_invoice?"),
        AIMessage("", tool_calls=[{"name": "query_erp", "args": {"sql": "..."}, "id": "c1"}]),
        ToolMessage(query_erp.invoke({"sql": "..."}), tool_call_id="c1"),
        AIMessage("invoice_no, customer_id, amount, due_date and status."),
    ],
    "get_session_history": lambda ns: (
        lambda sid: TieredChatMessageHistory(sid, backup=ns["backup"], user_id="u1")
    ),
    # The chain's snippet names the knowledge base the next snippet builds.
    "kb": lambda ns: __import__("langchain_tiered_memory").KnowledgeBase.from_long_memory(
        ns["long_memory"]
    ),
}


def names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names ``tree`` reads, and those it binds."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded, bound


def free_names(tree: ast.Module) -> set[str]:
    """Names the snippet reads before it binds them, statement by statement."""
    free: set[str] = set()
    bound: set[str] = set(dir(builtins))
    for statement in tree.body:
        if isinstance(statement, ast.Assign | ast.AugAssign | ast.AnnAssign):
            # The value is read before the targets are bound (x = f(x) reads the old x).
            read, local = names(statement.value) if statement.value else (set(), set())
            free |= read - bound - local  # local: a lambda's arguments
            bound |= names(statement)[1]
        else:
            read, binds = names(statement)
            free |= read - bound - binds
            bound |= binds
    return free


def snippets() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines()[0].startswith("make demo")
    assert first_block.splitlines()[1].startswith("make test")
    assert text.index("make demo") < text.index("## ")  # before the first section
    # The front door is LangChain v1; RunnableWithMessageHistory is the deprecated side door.
    first = snippets()[0]
    assert "create_agent" in first and "TieredMemoryMiddleware" in first
    assert "RunnableWithMessageHistory" not in first
    assert "deprecates `RunnableWithMessageHistory`" in text


def test_readme_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    given_files({})
    ns: dict[str, Any] = {"__name__": "readme"}
    blocks = snippets()
    assert len(blocks) >= 8
    loop = asyncio.new_event_loop()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # RunnableWithMessageHistory
            for number, source in enumerate(blocks, 1):
                tree = ast.parse(source)
                for name in sorted(free_names(tree) - set(ns)):
                    assert name in GIVEN, f"README snippet {number} uses undefined {name!r}"
                    ns[name] = GIVEN[name](ns)
                code = compile(
                    source, f"README snippet {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                )
                result = eval(code, ns)  # a coroutine when the snippet awaits
                if asyncio.iscoroutine(result):
                    loop.run_until_complete(result)
        # What the snippets' comments promise.
        backup = ns["backup"]
        archived = [row.message for row in backup.history("s1", limit=100)]
        assert [m.text for m in archived if isinstance(m, HumanMessage)][:1] == ["AR 表结构?"]
        assert [m.text for m in archived if isinstance(m, AIMessage)]  # the agent's answer
        assert [row.role for row in backup.history("s2", limit=10)] == ["human", "ai"]
        assert ns["answer"].response_metadata["tiered_memory"] == {
            "continuations": 2,
            "truncated": False,
        }
        assert ns["answer"].text == "The AR reconciliation procedure."
        assert ns["docs"] and all("score" in d.metadata for d in ns["docs"])
        assert isinstance(ns["messages"], list)
        assert all(isinstance(m, BaseMessage) for m in ns["messages"])
    finally:
        for name in ("long_memory", "consolidator"):
            if name in ns:
                ns[name].close()
        loop.close()
