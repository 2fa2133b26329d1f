"""The code's form: ``ruff check``, ``ruff format --check`` and ``mypy`` (strict) all pass, so a
change that breaks one fails the suite rather than waiting for somebody to run tox."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ["celery_lease", "harness", "tests", "benchmarks", "example_project"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install '.[lint]')")
    return found


def test_ruff_finds_nothing() -> None:
    done = _run(_ruff(), "check", *TREES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_code_is_as_ruff_format_writes_it() -> None:
    done = _run(_ruff(), "format", "--check", *TREES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_finds_nothing() -> None:
    pytest.importorskip("mypy")
    done = _run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr
