"""Exits at every point of taking and ending a lease (tests/exit_points.py), run in a pytest
process of their own.

They trace every line celery-lease runs and raise at each in turn, so state that earlier tests
of a long session leave behind (leases still renewed by the process's heartbeat, signal
handlers, cached clients of servers that are gone) would run under the same trace: in the
whole suite the first of them stalled at its first injected exit, while it passes alone in
seconds. A fresh interpreter gives them the process they are about.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("exit_points.py")


@pytest.mark.timeout(300)
def test_every_exit_point_of_taking_and_ending_a_lease_leaves_no_lease_held_by_nobody() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"],
        cwd=CASES.parent.parent,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
