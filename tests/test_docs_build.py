"""The documentation site builds with ``mkdocs build --strict`` (every link and API page valid)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import REPO_ROOT


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in (
        "index.html",
        "concepts/index.html",
        "demo/index.html",
        "reference/api/index.html",
        "howto/fencing/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    assert "LeasedTask" in api and "fencing_token" in api
