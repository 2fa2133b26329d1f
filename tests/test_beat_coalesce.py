"""A beat entry whose job outlasts its period, with ``lease_on_conflict="coalesce"``: the
ticks that arrive while the job runs coalesce into one pending run, which follows the long
run; one run per tick would pile up, one run per long run does not (real beat, real worker)."""

from __future__ import annotations

import itertools
from pathlib import Path

import redis

from harness.waiting import wait_for
from tests.support.fixtures import WorkerFactory
from tests.test_beat import APP, BeatProcess, _env, _records, beats

__all__ = ["beats"]  # the fixture, used by name


def test_ticks_during_a_long_run_coalesce_into_one_run_that_follows_it(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    env = _env(
        redis_url,
        worker_factory.queue,
        BEAT_PERIOD="0.3",
        SLOW_SECONDS="1.2",
        LEASE_TTL="2.0",
        LEASE_ON_CONFLICT="coalesce",
        RECORD_SIGNALS="1",
    )
    worker = worker_factory(APP, pool="threads", concurrency=3, env=env)
    beat = BeatProcess(env, tmp_path, "coalesce-beat", leased=False).start()
    beats.append(beat)
    client = redis.Redis.from_url(redis_url)

    def coalesced() -> list[dict[str, str]]:
        return [s for s in _records(client, "signals") if s["signal"] == "lease_coalesced"]

    wait_for(
        lambda: len(_records(client, "runs:beat")) >= 3 and len(coalesced()) >= 6,
        30,
        interval=0.1,
        message=lambda: f"beat:\n{beat.log()[-2000:]}\nworker:\n{worker.log_tail()}",
    )
    beat.stop()
    pending = {s["into"] for s in coalesced()}
    # Once quiet, every pending run has run: no trigger was lost.
    wait_for(
        lambda: pending <= {r["id"] for r in _records(client, "runs:beat")},
        20,
        message=lambda: f"{pending} {_records(client, 'runs:beat')}",
    )
    runs = sorted(_records(client, "runs:beat"), key=lambda r: r["start"])
    for earlier, later in itertools.pairwise(runs):
        assert later["start"] >= earlier["end"], f"runs overlapped: {earlier} {later}"
    sent = beat.log().count("Sending due task periodic")
    # One pending run per long run, however many ticks it covered: not one run per tick.
    assert len(pending) <= len(runs) < sent
    assert len(coalesced()) > len(pending)  # several ticks joined each pending run
