"""The notebooks of ``notebooks/`` run top to bottom, offline, and show what they promise.

Two sides of one promise. The notebooks are stored executed (``make notebooks``), so a
reader on a code host sees their outputs: the stored outputs must show what each check below
asks, from one top-to-bottom run, with no error and nothing of the machine that made them.
And they still run: each is executed the way ``make notebooks`` does it
(``notebooks/execute.py``: a kernel of *this* interpreter, a temporary working folder with a
copy of ``notebooks/data``, no LLM reachable), here with ``TIERED_MEMORY_HOME`` inside
``tmp_path``, and its fresh outputs pass the same checks. The executed copy stays in memory;
nothing is written back into ``notebooks/``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import require_module

nbformat = require_module("nbformat", "notebooks")
nbclient = require_module("nbclient", "notebooks")
require_module("ipykernel.kernelspec", "notebooks")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK_TIMEOUT = 300  # seconds per notebook, kernel start included (each takes ~10-20 s)

# make notebooks' executor (a script of notebooks/, not a module of the package).
_spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
assert _spec is not None and _spec.loader is not None
executor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(executor)


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    """A kernelspec that runs this interpreter, in a folder of its own.

    Neither ``python3`` from the user's Jupyter folders nor ``python`` from ``PATH``
    is trusted: the kernel must import the package installed in this venv.
    """
    folder = tmp_path_factory.mktemp("kernels")
    specs = executor.kernel_specs(folder)
    spec = json.loads((folder / executor.KERNEL / "kernel.json").read_text(encoding="utf-8"))
    assert spec["argv"][0] == sys.executable
    return specs


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

    def __init__(self, nb: Any, seconds: float = 0.0) -> None:
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
    # The agent answered every question of thread 1.
    assert "bot:  You are welcome. Until tomorrow!" in out
    # The agent's TieredStore finds the Chinese preference first.
    assert "store: currency: 金额用人民币（CNY）显示，保留两位小数 (score" in out
    # A new process reads the agent's session back: the window is the last two turns...
    restarted = out.split("in a new process:\n", 1)[1]
    window = restarted.split("4 messages in the window:\n", 1)[1].splitlines()[:4]
    assert window[0] == "[human] 应付账款表 ap_bill 有哪些字段？"
    assert window[-1] == "[   ai] You are welcome. Until tomorrow!"
    # ... and the archive pages back through all ten messages, first question first.
    assert "the page before #7: 6 older messages" in restarted
    assert "#1 human: Our receivables live in ar_invoice" in restarted
    assert "session 'quickstart': 10 messages" in restarted
    # The overdue rule is the best memory, and a new thread of the agent answers from it.
    best = out.split("memories for 'When is an AR invoice overdue?':\n", 1)[1].splitlines()[0]
    assert "an invoice is overdue when status = 'open'" in best
    answers = [
        line
        for line in out.splitlines()
        if line.startswith("bot:  (scripted, quoting the best long-term memory)")
    ]
    assert len(answers) == 2  # the agent in a new thread, then the chain
    for answer in answers:
        assert "overdue when status = 'open' and due_date < CURRENT_DATE" in answer
    # The existing chain's history: a window of the last two turns.
    after = out.rsplit("4 messages in the window:\n", 1)[1].splitlines()[:4]
    assert after == window


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
    assert re.search(r"^#\d+  tool: C-1024: 2 open invoices", out, re.MULTILINE)
    system = out.split("system message of that model call:\n", 1)[1]
    assert system.startswith("You are an ERP assistant for accounts receivable and payable.")
    # Each memory line carries the date of its turn (today's: the notebook gives none).
    assert re.search(
        r"Relevant long-term memories:\n- \(\d{4}-\d\d-\d\d\) User: Remember: our fiscal year "
        "closes on March 31",
        system,
    )
    assert "recalled across threads: True" in out
    assert "['human', 'ai']" in out


def check_benchmarks(run: Run) -> None:
    out = run.stdout()
    assert "calls no chat model" in out
    # The full run's figures come from the committed results file beside the notebook.
    assert run.line("results: ") == "results: data/bench_results.json"
    committed = json.loads((NOTEBOOKS / "data" / "bench_results.json").read_text("utf-8"))
    assert f"started {committed['started_at']}" in out
    recall = committed["benchmarks"]["bench_recall"]["results"]["LoCoMo dev recall@10"]
    assert re.search(rf"^  LoCoMo dev recall@10 .* {recall['ours']:.3f} ", out, re.MULTILINE)
    match = re.search(
        r"hot path p50 over 100 turns, SQLite, 10,000 rows: ours ([\d.]+) ms, "
        r"SQLChatMessageHistory ([\d.]+) ms",
        out,
    )
    assert match, out
    assert float(match.group(1)) > 0
    assert float(match.group(2)) > 0
    assert run.images() == 2  # the full run's figures and the live run's


CHECKS: dict[str, Callable[[Run], None]] = {
    "01_quickstart.ipynb": check_quickstart,
    "02_erp_assistant.ipynb": check_erp_assistant,
    "03_migrating_from_summary_buffer.ipynb": check_migrating,
    "04_agent_middleware.ipynb": check_agent,
    "05_benchmarks.ipynb": check_benchmarks,
}


@pytest.fixture
def notebook_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel's environment, as make notebooks sets it, with everything under tmp_path."""
    work = tmp_path / "work"
    work.mkdir()
    for name in executor.UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in executor.OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    return work


def execute(path: Path, kernel_specs: KernelSpecManager, work: Path) -> Run:
    started = time.perf_counter()
    nb = executor.execute(path, kernel_specs, work)
    return Run(nb, time.perf_counter() - started)


# -- the tests ------------------------------------------------------------------------


def test_every_notebook_has_a_check() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_is_stored_with_its_outputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    # One run, top to bottom, in a fresh kernel, with no execution times recorded.
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert not [cell for cell in code if "execution" in cell.metadata]
    assert nb.metadata["kernelspec"]["name"] == "python3"
    run = Run(nb)
    assert not [out for out in run.outputs if out.output_type == "error"]
    assert "Traceback" not in run.stderr()
    # Nothing of the machine or the folder that ran it.
    text = json.dumps([out for out in run.outputs if out.output_type == "stream"])
    assert not re.search(r"/(tmp|work|home|root|Users)/", text), name
    CHECKS[name](run)


def test_bench_results_are_the_full_runs() -> None:
    """data/bench_results.json is what make notebooks derives from the committed full run."""
    committed = json.loads((NOTEBOOKS / "data" / "bench_results.json").read_text("utf-8"))
    full_run = ROOT / "benchmarks" / "results" / "latest.json"
    assert committed == executor.reduce_report(json.loads(full_run.read_text("utf-8")))
    assert set(committed["benchmarks"]) == set(executor.PLOTTED)


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
