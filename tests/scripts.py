"""Run a piece of Python as a reader's own script: a new interpreter, in a folder of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Generous on a loaded 2-core machine: a script's imports alone take seconds.
SCRIPT_TIMEOUT = 240


def run_python(code: str, folder: Path, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in ``folder`` with this checkout's package; it must exit ``returncode``.

    The package's home is ``folder/home`` and no ``TIERED_MEMORY_URL`` is set, so the
    script sees the defaults a fresh user would.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIERED_MEMORY_HOME": str(folder / "home")}
    env.pop("TIERED_MEMORY_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
    )
    assert done.returncode == returncode, done.stdout + done.stderr
    return done
