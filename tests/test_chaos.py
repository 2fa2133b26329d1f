"""A short fault campaign end to end: real workers of three pools, real faults, no violation.

Runs ``python -m example_project chaos`` as a user would (its own Redis servers, a fresh
PostgreSQL database on the machine's server), with a fixed seed, and reads its JSON report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.workers import REPO_ROOT

DURATION = 40  # seconds of faults; with start-up, drain and probes the test takes about 70 s


@pytest.mark.timeout(420)
def test_a_short_campaign_injects_many_kinds_of_faults_and_breaks_no_promise(
    tmp_path: Path,
) -> None:
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "example_project",
            "chaos",
            "--duration",
            str(DURATION),
            "--workers",
            "3",
            "--keys",
            "8",
            "--seed",
            "7",
            "--json",
            str(report),
            "--history",
            str(tmp_path / "history.json"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert report.exists(), done.stdout + done.stderr
    result = json.loads(report.read_text())
    counts = result["counts"]
    assert result["violations"] == [], done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(counts["faults_by_kind"]) >= 4, counts["faults_by_kind"]
    assert counts["faults"] >= 8, counts
    assert set(counts["jobs_by_path"]) >= {
        "delay",
        "send_task",
        "retry",
        "requeue",
        "beat",
        "probe",
        "preempt",
    }
    assert counts["executions_by_outcome"].get("ok", 0) > 20, counts
    # A job waiting in a key's line when the store restarted empty is lost with the store's
    # data, as the leases are (the checker excuses it and counts it): no other job may be.
    assert (
        counts["jobs_by_resolution"].get("unresolved", 0) == counts["lost_with_an_emptied_store"]
    ), counts
