"""Processes whose wall clock is off: the LD_PRELOAD shim ``skewed_clock.c``, built here.

``skewed_env(offset, build_dir)`` is the environment that runs a child process with its wall
clock (``time.time()``, ``datetime.now()``) ``offset`` float seconds off and every other clock
right. Without a C compiler the test is skipped, or fails where the environment says the
compiler must be there (``CELERY_LEASE_NEEDS_CC=1``, set by ``.ci/run``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("skewed_clock.c")


def build(build_dir: Path) -> Path:
    """Compile the shim into ``build_dir``; returns the shared library's path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CELERY_LEASE_NEEDS_CC"):
            pytest.fail("no C compiler to build the clock-skew shim (.ci/run installs gcc)")
        pytest.skip(
            "no C compiler (cc/gcc) to build the clock-skew shim tests/support/"
            "skewed_clock.c: apt-get install gcc"
        )
    target = build_dir / "skewed_clock.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return target


def skewed_env(offset: float, build_dir: Path) -> dict[str, str]:
    """Environment variables that put a child's wall clock ``offset`` float seconds off.

    Raises:
        AssertionError: the shim was built but a child's clock is not off by ``offset``.
    """
    env = {"LD_PRELOAD": str(build(build_dir)), "SKEW_SECONDS": repr(offset)}
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    off = float(probe.stdout) - time.time()
    assert abs(off - offset) < 1.0, f"the shim set the clock {off:+.2f}s off, not {offset:+g}s"
    return env
