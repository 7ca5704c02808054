"""The notebooks of ``notebooks/`` run top to bottom, offline, and show what they promise.

Each notebook is executed with nbclient in a kernel started from a kernelspec written for
*this* interpreter (the venv's python, whatever Jupyter kernels the machine has), in a
temporary working folder, with ``TIERED_MEMORY_HOME`` inside ``tmp_path`` and no LLM
reachable (``OPENAI_API_KEY`` unset, ``OLLAMA_HOST`` on a closed port): they run with the
raw-turn extractor and the scripted model, as on a machine without an LLM. The executed
copy stays in memory; nothing is written back into ``notebooks/``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs the 'notebooks' extra")
nbclient = pytest.importorskip("nbclient", reason="needs the 'notebooks' extra")
kernelspec = pytest.importorskip("ipykernel.kernelspec", reason="needs the 'notebooks' extra")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "tiered-memory-tests"
CELL_TIMEOUT = 180  # seconds per cell
NOTEBOOK_TIMEOUT = 300  # seconds per notebook, kernel start included (each takes ~10-20 s)


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    """A kernelspec that runs this interpreter, in a folder of its own.

    Neither ``python3`` from the user's Jupyter folders nor ``python`` from ``PATH``
    is trusted: the kernel must import the package installed in this venv.
    """
    folder = tmp_path_factory.mktemp("kernels")
    kernelspec.write_kernel_spec(
        folder / KERNEL, overrides={"display_name": "langchain-tiered-memory tests"}
    )
    spec = json.loads((folder / KERNEL / "kernel.json").read_text(encoding="utf-8"))
    assert spec["argv"][0] == sys.executable
    return KernelSpecManager(kernel_dirs=[str(folder)])


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def untouched_notebooks() -> Iterator[None]:
    """After every run, notebooks/ holds exactly what it held before."""
    before = _digest(NOTEBOOKS)
    yield
    assert _digest(NOTEBOOKS) == before


class Run:
    """An executed notebook: its cells with outputs, and their text."""

    def __init__(self, nb: Any, seconds: float) -> None:
        self.nb = nb
        self.seconds = seconds
        self.outputs = [
            out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
        ]

    def stdout(self) -> str:
        return "".join(
            out.text for out in self.outputs if out.output_type == "stream" and out.name == "stdout"
        )

    def stderr(self) -> str:
        return "".join(
            out.text for out in self.outputs if out.output_type == "stream" and out.name == "stderr"
        )

    def images(self) -> int:
        return sum(
            "image/png" in out.get("data", {})
            for out in self.outputs
            if out.output_type in ("display_data", "execute_result")
        )

    def line(self, prefix: str) -> str:
        """The first stdout line starting with ``prefix`` (fails if there is none)."""
        for line in self.stdout().splitlines():
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no output line starts with {prefix!r}:\n{self.stdout()}")


# -- what each notebook must show -----------------------------------------------------


def check_quickstart(run: Run) -> None:
    out = run.stdout()
    assert "No real LLM" in out
    assert "raw-turn extractor and a scripted model" in out
    # The window is the last two turns, and a new process shows the same.
    window = out.split("4 messages in the window:\n", 1)[1].split("\n\n", 1)[0].splitlines()[:4]
    assert window[0] == "[human] 应付账款表 ap_bill 有哪些字段？"
    assert window[-1] == "[   ai] You are welcome. Until tomorrow!"
    restarted = out.split("the window in a new process:\n", 1)[1].splitlines()[:4]
    assert restarted == window
    assert "same window after the restart: True" in out
    # The archive pages back through all ten messages.
    assert "the page before #7: 6 older messages" in out
    assert "session 'quickstart': 10 messages" in out
    # The overdue rule left the window but is the best memory, and the chain recalls it.
    best = out.split("memories for 'When is an AR invoice overdue?':\n", 1)[1].splitlines()[0]
    assert "an invoice is overdue when status = 'open'" in best
    answer = run.line("bot:  (scripted, quoting the best long-term memory)")
    assert "overdue when status = 'open' and due_date < CURRENT_DATE" in answer


def check_erp_assistant(run: Run) -> None:
    out = run.stdout()
    assert "raw-turn extractor and a scripted model" in out
    # The v3 prompt layout, in Chinese.
    for label in ("## 历史对话摘要（长期记忆）", "## 最近通话记录", "## 资料", "## 用户问题"):
        assert label in out
    # One prompt with two 150k-character tool outputs, compressed.
    before = int(run.line("before: ").split(", ")[1].split()[0].replace(",", ""))
    after = int(run.line("after: ").split(", ")[1].split()[0].replace(",", ""))
    assert before > 120_000
    assert after < 5_000
    assert "[上下文压缩摘要]" in out
    # The replay: the compressed peak stays under the design's 60k, and never overflows.
    match = re.search(r"compressed peak: ([\d,]+) tokens", out)
    assert match, out
    peak = int(match.group(1).replace(",", ""))
    assert 0 < peak < 60_000
    assert "under 60,000: True" in out
    assert "ContextOverflowError with compression: 0 times" in out
    assert run.images() == 1
    # Consolidation wrote MEMORY.md (and HISTORY.md) from the conversation.
    assert "['HISTORY.md', 'MEMORY.md']" in out
    memory_md = out.split("## Known database facts", 1)[1].split("## Solved problems", 1)[0]
    assert "ar_invoice" in memory_md
    # A new session of the same user recalls the overdue rule.
    answer = run.line("助手: (scripted, quoting the best long-term memory)")
    assert "逾期" in answer
    assert "ar_invoice" in answer


def check_migrating(run: Run) -> None:
    out = run.stdout()
    assert "after a restart: {'history': []}" in out
    assert "TypeError: TieredMemory does not take llm" in out
    assert "TypeError: TieredMemory does not take max_token_limit" in out
    assert "window: 4 messages; archive: 8" in out
    assert "March 31" in run.line("recalled in the new session: ")


def check_agent(run: Run) -> None:
    out = run.stdout()
    assert "[ tool] C-1024: 2 open invoices, CNY 17,150.50 in total" in out
    assert re.search(r"^#\d+ \S+  tool: C-1024: 2 open invoices", out, re.MULTILINE)
    system = out.split("system message of that model call:\n", 1)[1]
    assert system.startswith("You are an ERP assistant for accounts receivable and payable.")
    assert "Relevant long-term memories:\n- User: Remember: our fiscal year closes on March 31" in (
        system
    )
    assert "recalled across threads: True" in out
    assert "['human', 'ai']" in out


def check_benchmarks(run: Run) -> None:
    out = run.stdout()
    assert "calls no chat model" in out
    assert run.line("results: ").endswith("bench.json")
    match = re.search(
        r"hot path p50 over 100 turns, SQLite, 10,000 rows: ours ([\d.]+) ms, "
        r"SQLChatMessageHistory ([\d.]+) ms",
        out,
    )
    assert match, out
    assert float(match.group(1)) > 0
    assert float(match.group(2)) > 0
    if "LoCoMo not found" not in out:  # the evaluation data is not part of the project
        for mode in ("hybrid (default)", "BM25 only", "MiniLM only"):
            recall = float(run.line(f"  {mode}").rsplit(" ", 1)[1])
            assert 0 <= recall <= 1
    assert run.images() == 2  # the full run's figures and the live run's


CHECKS: dict[str, Callable[[Run], None]] = {
    "01_quickstart.ipynb": check_quickstart,
    "02_erp_assistant.ipynb": check_erp_assistant,
    "03_migrating_from_summary_buffer.ipynb": check_migrating,
    "04_agent_middleware.ipynb": check_agent,
    "05_benchmarks.ipynb": check_benchmarks,
}

#: A full-run report (``python -m benchmarks --json``), reduced to what 05 plots.
FULL_RUN = {
    "started_at": "2026-11-30T08:00:00+00:00",
    "quick": False,
    "machine": {"cpus": 2},
    "summary": [
        {"metric": "hot path p50, sqlite, 10,000 rows", "ours": "1.10 ms", "verdict": ""},
    ],
    "benchmarks": {
        "bench_hot_path": {
            "status": "ok",
            "results": {
                "results": [
                    {
                        "bench": "hot path",
                        "backend": "sqlite",
                        "rows": 10_000,
                        "impl": "ours",
                        "p50_ms": 1.11,
                        "p95_ms": 1.26,
                    },
                    {
                        "bench": "hot path",
                        "backend": "sqlite",
                        "rows": 10_000,
                        "impl": "peer",
                        "p50_ms": 7.55,
                        "p95_ms": 83.74,
                    },
                ]
            },
        },
        "bench_long_memory": {
            "status": "ok",
            "results": {
                "rows": [
                    {
                        "measure": "search 10,000",
                        "data": {
                            "size": 10_000,
                            "scope": "user",
                            "in_scope": 100,
                            "archive": "sqlite",
                            "p50_ms": 10.6,
                            "p95_ms": 12.5,
                        },
                    },
                ]
            },
        },
        "bench_recall": {
            "status": "ok",
            "results": {
                "LoCoMo dev recall@10": {
                    "ours": 0.801,
                    "baseline": 0.6,
                    "target": 0.8,
                    "questions": 760,
                },
            },
        },
    },
}


@pytest.fixture
def notebook_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel's environment: offline, no LLM, everything under tmp_path."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # inline figures
    report = tmp_path / "bench.json"
    report.write_text(json.dumps(FULL_RUN), encoding="utf-8")
    monkeypatch.setenv("TIERED_MEMORY_BENCH_JSON", str(report))
    return work


def execute(path: Path, kernel_specs: KernelSpecManager, work: Path) -> Run:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        km=AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs),
        timeout=CELL_TIMEOUT,
        allow_errors=False,  # a failing cell raises CellExecutionError with its traceback
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(work)}},  # the kernel's working folder
    )
    started = time.perf_counter()
    client.execute(cleanup_kc=True)  # shut the kernel down even though we made its manager
    return Run(nb, time.perf_counter() - started)


# -- the tests ------------------------------------------------------------------------


def test_every_notebook_has_a_check() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CHECKS)


def test_notebooks_are_stored_without_outputs() -> None:
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [], f"{path.name}: a cell has outputs"
                assert cell.execution_count is None, f"{path.name}: a cell has a count"


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_runs_offline(
    name: str,
    kernel_specs: KernelSpecManager,
    notebook_env: Path,
    untouched_notebooks: None,
) -> None:
    run = execute(NOTEBOOKS / name, kernel_specs, notebook_env)

    assert not [out for out in run.outputs if out.output_type == "error"]
    # Background workers log their failures; none may happen.
    assert "Traceback" not in run.stderr()
    assert "failed" not in run.stderr()
    CHECKS[name](run)
    print(f"{name}: {run.seconds:.1f} s")
