"""Smoke test: ``python -m benchmarks --quick`` produces every figure, the table and the plots.

It asserts that the benchmark ran and reported, never how fast anything was: targets are the
benchmark's to report (see docs/benchmarks.md), not the test suite's to enforce.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PLOTS = ("cycle.png", "overhead.png", "renewal.png", "detection.png", "stall.png")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.timeout(150)
def test_quick_run_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"

    results = json.loads((out / "results.json").read_text())
    from benchmarks import cycle, detection, overhead, renewal, report

    assert report.missing_figures(results) == []
    assert results["meta"]["quick"] is True
    assert results["meta"]["cpu_count"] and results["meta"]["redis_server"]

    for name in cycle.VARIANTS:  # 1: every peer, next to the limit
        stats = results["cycle"]["variants"][name]["latency_us"]
        assert _number(stats["median"]) and _number(stats["p99"])
    for pool in overhead.POOLS:  # 2: every variant through every pool
        for variant in overhead.VARIANTS:
            ratio = results["overhead"]["pools"][pool]["variants"][variant]["ratio_to_plain"]
            assert _number(ratio["median"])
    for n in renewal.NS:  # 3: every N, and python-redis-lock where it runs
        assert _number(results["renewal"]["passes"][str(n)]["round_trips_per_pass"])
        assert _number(
            results["renewal"]["steady"]["celery_lease"][str(n)]["cpu_percent_of_one_core"]
        )
        lock = results["renewal"]["steady"]["python_redis_lock"][str(n)]
        assert (
            "not_run" in lock
            if n not in renewal.REDIS_LOCK_NS
            else _number(lock["round_trips_per_interval"])
        )
    for pool in detection.POOLS:  # 4: every pool, cause and body
        for cause in detection.CAUSES:
            for body in detection.BODIES:
                cell = results["detection"]["cells"][f"{pool}/{cause}/{body}"]
                assert cell["trials"] >= 1 and 0 <= cell["raised"] <= cell["trials"]
    assert results["stall"]["ttls"]  # 5
    for ttl in results["stall"]["ttls"].values():
        assert _number(ttl["stall_s"]["max"])
    for work in results["e2e"]["workloads"].values():  # 7: every peer, both workloads
        for variant in ("plain", "leased", "leased_sync", "singleton", "once"):
            v = work["variants"][variant]
            assert _number(v["time_ratio_to_plain"]["median"])
            assert _number(v["cpu_ratio_to_plain"]["median"])
            assert v["bodies"]["median"] >= 1
        # Back-to-back calls of one key in one solo worker never overlap: none is skipped.
        assert work["variants"]["leased"]["every_call_ran"] is True
        assert work["variants"]["leased_sync"]["every_call_ran"] is True
    assert results["targets"] and all("met" in t for t in results["targets"])

    table = (out / "results.md").read_text()
    for heading in ("### 1.", "### 2.", "### 3.", "### 4.", "### 5.", "### 7.", "### Targets"):
        assert heading in table
    for plot in PLOTS:
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot


def test_the_publish_benchmark_counts_the_lease_store_round_trips_of_each_dedupe_publish() -> None:
    from benchmarks import publish

    found = publish.measure(publishes=20, rounds=1)
    trips = {
        name: (v["broker"]["round_trips"], v["lease store"]["round_trips"])
        for name, v in found.items()
    }
    assert trips == {
        "plain": (1.0, 0.0),
        "dedupe, published": (1.0, 2.0),  # the claim, then its full lifetime
        "dedupe, deduplicated": (0.0, 1.0),
        "debounce, new burst": (1.0, 2.0),
        "debounce, joined": (0.0, 1.0),
    }
    assert all(_number(v["us_per_publish"]["median"]) for v in found.values())


def test_instruction_figures_are_what_each_library_adds_to_a_plain_task() -> None:
    from benchmarks import instructions

    per_op = {f"worker/{v}": 1000 for v in instructions.WORKER_VARIANTS}
    per_op.update({"worker/leased": 1300, "worker/singleton": 1100, "worker/once": 1150})
    per_op.update({f"publisher/{v}": 5000 for v in instructions.PUBLISHER_VARIANTS})
    per_op.update({"publisher/singleton": 5250, "publisher/once": 5050})
    per_op.update({f"step/{name}": 10 for name in instructions.STEPS})
    got = instructions.derived(per_op)
    assert got["worker_added"]["leased"] == 300 and got["publisher_added"]["leased"] == 0
    assert got["total_added"]["singleton"] == 100 + 250
    assert got["total_added"]["once"] == 150 + 50
    assert got["lease_vs_peers"] == {"singleton": round(300 / 350, 3), "once": 1.5}
    assert got["steps_rest"] == 300 - 10 * (len(instructions.STEPS) - 2)  # less the PINGs
