"""`python -m build` makes a wheel and an sdist that install and import in a clean venv.

The build runs on a copy of the checkout (no ``build/`` or ``*.egg-info`` left in the
repository) with this venv's setuptools (``--no-isolation``: nothing is downloaded). The wheel
is installed with ``--no-deps`` into a fresh venv whose only other path is this venv's
site-packages, for the dependencies; the package, its version and its command must then come
from the wheel.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import langchain_tiered_memory

ROOT = Path(__file__).resolve().parents[1]
NAME = "langchain_tiered_memory"
VERSION = langchain_tiered_memory.__version__
BUILD_TIMEOUT = 300  # seconds; a build takes a few on a quiet machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * BUILD_TIMEOUT)]

IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tiered_memory",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    ".*_cache",
    "results",  # benchmarks/results: large, and not part of either artefact
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist built from a copy of the checkout."""
    work = tmp_path_factory.mktemp("build")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    out = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    return out


def only(folder: Path, pattern: str) -> Path:
    (path,) = folder.glob(pattern)
    return path


def test_version_has_one_source() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|(a|b|rc)\d+)?", VERSION)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"]  # no second copy
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": f"{NAME}.__version__"}
    assert f"## {VERSION}" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_wheel_metadata(dist: Path) -> None:
    wheel = only(dist, f"{NAME}-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"{NAME}-{VERSION}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        license_text = archive.read(f"{info}/licenses/LICENSE").decode()
    assert metadata["Name"] == "langchain-tiered-memory"
    assert metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "MIT"
    assert license_text.startswith("MIT License")
    assert metadata["Author"] or metadata["Author-email"]
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert metadata["Requires-Python"] == ">=3.11"
    assert "tiered-memory = langchain_tiered_memory.cli.app:app" in entry_points
    assert "chroma = langchain_tiered_memory.tiers.long_memory:erase_from_record" in entry_points
    # Every module of the source tree is in the wheel, and nothing else of the repository.
    sources = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / NAME).rglob("*")
        if path.is_file() and path.suffix in (".py", ".typed")
    }
    assert sources <= names
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/", "notebooks/"))]


def test_sdist_contents(dist: Path) -> None:
    sdist = only(dist, f"{NAME}-{VERSION}.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", f"{NAME}/py.typed"):
        assert name in names, name


def test_wheel_installs_and_imports_in_a_clean_venv(dist: Path, tmp_path: Path) -> None:
    wheel = only(dist, f"{NAME}-*.whl")
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    # The dependencies come from this venv, after the new venv's own site-packages.
    target = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
            env=clean,
        ).stdout.strip()
    )
    (target / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheel),
        ],
        check=True,
        timeout=BUILD_TIMEOUT,
    )
    probe = """
import importlib.metadata, json, tempfile
import langchain_tiered_memory as package
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
import langchain_tiered_memory.cli.app

folder = tempfile.mkdtemp()
history = TieredChatMessageHistory("s1", backup=MySQLBackup(f"sqlite:///{folder}/a.sqlite3"))
history.add_messages([HumanMessage("hello"), AIMessage("hi")])
print(json.dumps({
    "file": package.__file__,
    "version": package.__version__,
    "metadata": importlib.metadata.version("langchain-tiered-memory"),
    "window": [m.content for m in history.messages],
}))
"""
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=clean
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(seen["file"]).is_relative_to(target)  # the wheel's copy, not the checkout
    assert seen["version"] == seen["metadata"] == VERSION
    assert seen["window"] == ["hello", "hi"]
    command = subprocess.run(
        [str(env / "bin" / "tiered-memory"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean,
    )
    assert command.returncode == 0, command.stderr
    assert "sessions" in command.stdout
