"""Run the notebooks offline and store them with their outputs: ``make notebooks``.

Each notebook runs top to bottom in a kernel of *this* interpreter (a kernelspec written for
it, whatever Jupyter kernels the machine has), in a temporary working folder holding a copy
of ``notebooks/data``, with no LLM reachable (``OPENAI_API_KEY`` unset, ``OLLAMA_HOST`` on a
closed port) and the embedding models offline. Outputs are kept without execution times and
with each cell's stream in one piece, so that a run on another day changes only what was
measured. ``tests/test_notebooks.py`` executes them the same way, through :func:`execute`.

Before running, ``data/bench_results.json`` (what notebook 05 plots) is refreshed from
``benchmarks/results/latest.json`` when that full run exists.

Usage: ``python notebooks/execute.py [NOTEBOOK ...]`` (default: every notebook).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbclient
import nbformat
from ipykernel import kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

NOTEBOOKS = Path(__file__).resolve().parent
ROOT = NOTEBOOKS.parent
DATA = NOTEBOOKS / "data"
BENCH_RESULTS = DATA / "bench_results.json"
FULL_RUN = ROOT / "benchmarks" / "results" / "latest.json"
#: The benchmark modules notebook 05 plots; the rest of a full run stays in benchmarks/results.
PLOTTED = ("bench_hot_path", "bench_long_memory", "bench_recall")
KERNEL = "tiered-memory-notebooks"
CELL_TIMEOUT = 180  # seconds per cell

#: The kernel's environment: no LLM, nothing downloaded, one hash seed.
OFFLINE = {
    "OLLAMA_HOST": "127.0.0.1:9",  # the discard port: nothing answers
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONHASHSEED": "0",
    "TQDM_DISABLE": "1",  # progress bars print speeds and times
}
#: Unset in the kernel's environment: a real LLM, a results file or a home folder of the caller.
UNSET = ("OPENAI_API_KEY", "MPLBACKEND", "TIERED_MEMORY_BENCH_JSON")


def offline_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) as the notebooks' kernel sees it."""
    env = dict(os.environ if environ is None else environ)
    for name in UNSET:
        env.pop(name, None)
    env.update(OFFLINE)
    return env


def kernel_specs(folder: Path) -> KernelSpecManager:
    """A kernelspec manager that knows one kernel: this interpreter, written into ``folder``."""
    kernelspec.write_kernel_spec(
        folder / KERNEL, overrides={"display_name": "langchain-tiered-memory"}
    )
    return KernelSpecManager(kernel_dirs=[str(folder)])


def execute(path: Path, specs: KernelSpecManager, work: Path) -> Any:
    """The notebook at ``path`` executed in ``work`` (with a copy of ``data/``), not saved.

    A failing cell raises ``nbclient.exceptions.CellExecutionError`` with its traceback.
    """
    if DATA.is_dir():
        shutil.copytree(DATA, work / "data", dirs_exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        km=AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs),
        timeout=CELL_TIMEOUT,
        allow_errors=False,
        record_timing=False,  # no execution times in the stored notebook
        coalesce_streams=True,  # one stdout output per cell, however the kernel flushed it
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(work)}},  # the kernel's working folder
    )
    client.execute(cleanup_kc=True)  # shut the kernel down even though we made its manager
    # The stored notebook names the usual kernel, not this run's private one.
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    return nb


def reduce_report(report: dict[str, Any]) -> dict[str, Any]:
    """What notebook 05 plots of a full run's JSON: its summary and the plotted modules."""
    return {
        "source": "python -m benchmarks --json (benchmarks/results/latest.json), reduced",
        **{key: report.get(key) for key in ("started_at", "finished_at", "quick", "machine")},
        "summary": report.get("summary", []),
        "benchmarks": {
            name: {key: entry.get(key) for key in ("status", "results")}
            for name, entry in report.get("benchmarks", {}).items()
            if name in PLOTTED
        },
    }


def refresh_bench_results() -> bool:
    """Write ``data/bench_results.json`` from the full run's JSON; False when there is none."""
    if not FULL_RUN.is_file():
        return False
    reduced = reduce_report(json.loads(FULL_RUN.read_text(encoding="utf-8")))
    DATA.mkdir(exist_ok=True)
    BENCH_RESULTS.write_text(json.dumps(reduced, indent=1, ensure_ascii=False) + "\n", "utf-8")
    return True


def main(argv: list[str]) -> int:
    """Execute the named notebooks (default: all) and store them with their outputs."""
    paths = [Path(arg).resolve() for arg in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    if refresh_bench_results():
        print(f"{BENCH_RESULTS.relative_to(ROOT)} <- {FULL_RUN.relative_to(ROOT)}")
    os.environ.clear()
    os.environ.update(offline_environment())
    os.environ.pop("TIERED_MEMORY_HOME", None)  # each notebook makes a temporary one
    with tempfile.TemporaryDirectory(prefix="tiered-memory-notebooks-") as tmp:
        specs = kernel_specs(Path(tmp) / "kernels")
        for path in paths:
            work = Path(tmp) / path.stem
            work.mkdir()
            nb = execute(path, specs, work)
            nbformat.write(nb, path)
            print(f"{path.relative_to(ROOT)}: executed, outputs stored")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
