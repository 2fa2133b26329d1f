"""In-process behaviour: eager mode, round trips, exit, fork, the heartbeat's batching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery
from celery.backends.base import BaseBackend

from celery_lease import (
    LeaseConfigError,
    LeaseConflict,
    LeasedTask,
    LeaseKeyError,
    LeaseLost,
    LeaseStartRefused,
    LeaseStoreUnavailable,
    current_lease,
    is_skipped,
    store,
)
from celery_lease.base import process
from celery_lease.core.heartbeat import heartbeat
from harness.waiting import wait_for


def make_app(url: str, **conf: Any) -> Celery:
    app = Celery("inproc", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(
        {"lease_backend": url, "task_always_eager": True, "task_eager_propagates": True, **conf}
    )
    return app


def lease_keys(client: redis.Redis) -> list[bytes]:
    return [k for k in client.scan_iter("lease:*") if not k.endswith(b":fence")]


def test_direct_call_takes_no_lease_eager_and_apply_take_and_release(
    redis_url: str,
) -> None:
    app = make_app(redis_url)
    seen: list[Any] = []

    @app.task(bind=True, base=LeasedTask, lease_ttl=2.0, shared=False)  # type: ignore[misc]
    def job(self: Any, n: int) -> int:
        seen.append(current_lease())
        return n

    client = redis.Redis.from_url(redis_url)
    assert job(1) == 1 and seen[-1] is None  # a plain call: no lease, no key at all
    assert list(client.scan_iter("lease:*")) == []
    assert job.delay(2).get() == 2 and seen[-1] is not None  # eager mode
    assert job.apply((3,)).get() == 3 and seen[-1] is not None
    assert lease_keys(client) == []
    assert seen[-1].task_id  # apply() gave it a real id, not a phantom one
    assert seen[-1].retired


def test_eager_conflict_returns_the_skip_marker_and_is_skipped_wants_the_value(
    redis_url: str,
) -> None:
    app = make_app(redis_url)

    @app.task(base=LeasedTask, lease_ttl=5.0, shared=False)  # type: ignore[misc]
    def job(n: int) -> int:
        return n

    client = store.client_for(redis_url, 1.0)
    store.acquire(
        client,
        job.lease_key_for((1,)),
        "f" * 32,
        5000,
        store.holder_json("job", "other-id", "h", 1),
    )
    outcome = job.apply((1,))
    with pytest.raises(TypeError, match=r"is_skipped\(result.get\(\)\)"):
        is_skipped(outcome)  # the EagerResult itself, not the marker it holds
    result = outcome.get()
    assert is_skipped(result) and result["holder_task_id"] == "other-id"


def test_refusing_a_duplicate_costs_one_round_trip(redis_url: str) -> None:
    app = make_app(redis_url)

    @app.task(base=LeasedTask, lease_ttl=5.0, shared=False)  # type: ignore[misc]
    def job(n: int) -> int:
        return n

    client = store.client_for(redis_url, 1.0)
    store.acquire(client, job.lease_key_for((1,)), "f" * 32, 5000, "{}")
    job.apply((1,))  # warm: connection made, script loaded
    probe = redis.Redis.from_url(redis_url)

    def calls() -> dict[str, int]:
        return {k: int(v["calls"]) for k, v in probe.info("commandstats").items()}

    before = calls()
    started = time.perf_counter()
    job.apply((1,))
    elapsed = time.perf_counter() - started
    after = calls()
    delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    # One EVALSHA on the wire; GET and PTTL run inside the script; INFO is this probe.
    assert delta == {"cmdstat_evalsha": 1, "cmdstat_get": 1, "cmdstat_pttl": 1, "cmdstat_info": 1}
    assert elapsed < 1.0  # nothing waited or polled


def test_every_error_pickles_and_survives_json_serialization() -> None:
    import pickle

    errors = [
        LeaseLost("lease:{k}", "refused", 7, 0.25),
        LeaseConflict("lease:{k}", "task-id", "host:1", 1.5),
        LeaseStoreUnavailable("lease:{k}", "acquire", "ConnectionError()"),
        LeaseConfigError("lease_ttl=0 is bad"),
        LeaseKeyError("task t: argument 'a'"),
        LeaseStartRefused("beat", "no name"),
    ]
    backend = BaseBackend(Celery(set_as_current=False), serializer="json")
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.args == error.args
        rebuilt = backend.exception_to_python(
            json.loads(json.dumps(backend.prepare_exception(error, "json")))
        )
        assert type(rebuilt) is type(error) and rebuilt.args == error.args, error
    lost = errors[0]
    assert isinstance(lost, LeaseLost)
    assert (lost.key, lost.cause, lost.fencing_token, lost.late) == (
        "lease:{k}",
        "refused",
        7,
        0.25,
    )


def test_a_lost_lease_says_what_its_seconds_count_from() -> None:
    # An operator's release is found at the next renewal: no deadline was missed.
    assert str(LeaseLost("lease:{k}", "refused", 7, 3.3374)) == (
        "lease 'lease:{k}' lost (refused, fencing token 7, found 3.337s after its last "
        "confirmed renewal)"
    )
    for cause in ("deadline", "store_error"):
        assert str(LeaseLost("lease:{k}", cause, 7, 0.012)).endswith(
            "found 0.012s after its local deadline)"
        )


def test_no_command_names_the_key_after_release(redis_url: str) -> None:
    """Watch with MONITOR: after a lease's release, no command names its key."""
    app = make_app(redis_url)

    @app.task(base=LeasedTask, lease_ttl=0.3, shared=False)  # type: ignore[misc]
    def job(n: int) -> str:
        time.sleep(0.35)  # several renewals (interval 0.1 s)
        return current_lease().key  # type: ignore[union-attr]

    monitor_client = redis.Redis.from_url(redis_url)
    lines: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        with monitor_client.monitor() as m:
            for command in m.listen():
                lines.append(command["command"])
                if stop.is_set():
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_for(lambda: redis.Redis.from_url(redis_url).ping() and lines, 5, interval=0.1)
    key = job.apply((1,)).get()
    # Nothing to wait for: the test asserts an absence, so it watches for five intervals.
    time.sleep(0.5)
    stop.set()
    redis.Redis.from_url(redis_url).ping()  # after stop is set: the watcher sees it and returns
    watcher.join(5)
    mentions = [line for line in lines if key in line]

    def is_renewal(line: str) -> bool:
        return store.renewal._renew.sha in line or "PEXPIRE" in line.upper()

    first_release = next(
        i
        for i, line in enumerate(mentions)
        if store.protocol._release.sha in line or "'DEL'" in line or "DEL" in line
    )
    assert sum(map(is_renewal, mentions[:first_release])) >= 2  # the heartbeat was at work
    late = [line for line in mentions[first_release:] if is_renewal(line)]
    assert late == [], "a renewal named the key after its release"


def test_heartbeat_renews_many_leases_in_one_round_trip_per_interval(redis_url: str) -> None:
    app = make_app(redis_url)
    started = threading.Barrier(21)
    done = threading.Event()

    @app.task(base=LeasedTask, lease_ttl=0.6, shared=False)  # type: ignore[misc]
    def job(n: int) -> None:
        started.wait(5)
        done.wait(5)

    threads = [threading.Thread(target=job.apply, args=((i,),), daemon=True) for i in range(20)]
    for t in threads:
        t.start()
    started.wait(5)
    beat = heartbeat()
    passes = beat.passes
    time.sleep(1.0)  # the measuring window: five intervals of 0.2 s
    per_interval = (beat.passes - passes) / 5
    done.set()
    for t in threads:
        t.join(5)
    assert 0.8 <= per_interval <= 2.0  # one pass per interval, whatever the number of leases


def test_exit_without_release_is_prompt_and_lease_expires(redis_url: str) -> None:
    code = textwrap.dedent(f"""
        import threading
        from celery import Celery
        from celery_lease import LeasedTask
        app = Celery("exiting", broker="memory://", set_as_current=False)
        app.conf.update(lease_backend={redis_url!r}, task_always_eager=True)

        @app.task(base=LeasedTask, lease_ttl=1.0, shared=False)
        def job():
            threading.Event().wait()  # never returns: the lease is never released

        threading.Thread(target=job.apply, daemon=True).start()
        import time
        from celery_lease.core.heartbeat import heartbeat
        while not heartbeat().held():
            time.sleep(0.01)
        print("holding", flush=True)
    """)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert "holding" in done.stdout, done.stderr
    assert time.monotonic() - started < 10
    client = redis.Redis.from_url(redis_url)
    exited = time.monotonic()
    wait_for(lambda: lease_keys(client) == [], 2.0, interval=0.01)
    assert time.monotonic() - exited <= 1.2


def test_forked_child_never_renews_or_releases_the_parents_lease(redis_url: str) -> None:
    app = make_app(redis_url)
    result: dict[str, Any] = {}

    @app.task(base=LeasedTask, lease_ttl=1.0, shared=False)  # type: ignore[misc]
    def job() -> None:
        lease = current_lease()
        assert lease is not None
        pid = os.fork()
        if pid == 0:  # the child: its heartbeat is fresh, the parent's lease is not its own
            ok = (
                heartbeat().held() == []
                and lease.pid != os.getpid()
                and process.pid() == os.getpid()
            )  # the id kept without a system call
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        result["child_ok"] = os.waitstatus_to_exitcode(status) == 0
        result["still_held"] = store.client_for(redis_url, 1.0).exists(lease.key)

    with pytest.warns(DeprecationWarning) if sys.version_info >= (3, 12) else _nothing():
        job.apply()
    assert result == {"child_ok": True, "still_held": 1}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_threads_two_keys_each_renews_and_releases_its_own(redis_url: str) -> None:
    """In one process: two executions at once, one loses its lease, the other does not."""
    app = make_app(redis_url)
    outcome: dict[int, str] = {}
    running = threading.Barrier(3)

    @app.task(bind=True, base=LeasedTask, lease_ttl=0.6, shared=False)  # type: ignore[misc]
    def job(self: Any, n: int) -> None:
        running.wait(30)
        try:
            for _ in range(100):
                time.sleep(0.02)
            outcome[n] = "done"
        except LeaseLost:
            outcome[n] = "lost"
            raise

    def run(n: int) -> None:
        job.apply((n,), throw=False)

    runners = [threading.Thread(target=run, args=(n,), daemon=True) for n in (1, 2)]
    for t in runners:
        t.start()
    running.wait(30)
    client = redis.Redis.from_url(redis_url)
    client.delete(job.lease_key_for((1,)))
    for t in runners:
        t.join(10)
    assert outcome == {1: "lost", 2: "done"}
    assert lease_keys(client) == []


@pytest.mark.parametrize("outcome", ["success", "exception", "ignore", "reject", "lost"])
def test_every_way_an_execution_ends_releases_its_lease(redis_url: str, outcome: str) -> None:
    from celery.exceptions import Ignore, Reject

    app = make_app(redis_url, task_eager_propagates=False)

    @app.task(bind=True, base=LeasedTask, lease_ttl=0.6, shared=False)  # type: ignore[misc]
    def job(self: Any) -> str:
        if outcome == "exception":
            raise KeyError("boom")
        if outcome == "ignore":
            raise Ignore()
        if outcome == "reject":
            raise Reject("no", requeue=False)
        if outcome == "lost":
            redis.Redis.from_url(redis_url).delete(self.lease.key)
            time.sleep(0.5)  # interrupted by LeaseLost at the next renewal
        return outcome

    job.apply()
    assert lease_keys(redis.Redis.from_url(redis_url)) == []


def test_renewals_answered_with_errors_end_as_store_error(throwaway_redis: Any) -> None:
    server = throwaway_redis()
    app = make_app(server.url(), task_eager_propagates=False)
    seen: dict[str, Any] = {}

    @app.task(bind=True, base=LeasedTask, lease_ttl=0.9, shared=False)  # type: ignore[misc]
    def job(self: Any) -> None:
        server.client().replicaof("127.0.0.1", "1")  # read-only now: renewals get READONLY
        try:
            time.sleep(5)
        except LeaseLost as exc:
            seen["cause"], seen["late"] = exc.cause, exc.late
            raise

    try:
        job.apply()
    finally:
        server.client().replicaof("NO", "ONE")
    assert seen["cause"] == "store_error"
    assert 0 <= seen["late"] < 0.25


def test_a_task_can_declare_its_lease_lost(redis_url: str) -> None:
    from celery_lease.base import signals

    app = make_app(redis_url, task_eager_propagates=False)
    lost: list[str] = []

    def on_lost(sender: Any, cause: str, **_: Any) -> None:
        lost.append(cause)

    signals.lease_lost.connect(on_lost)

    @app.task(bind=True, base=LeasedTask, lease_ttl=5.0, shared=False)  # type: ignore[misc]
    def job(self: Any) -> None:
        raise self.lease.lose()  # e.g. a fenced write was refused

    try:
        result = job.apply()
    finally:
        signals.lease_lost.disconnect(on_lost)
    assert isinstance(result.result, LeaseLost) and result.result.cause == "refused"
    assert lost == ["refused"]


def test_no_asynchronous_lease_lost_after_check_raised(redis_url: str) -> None:
    """Once check() handed the task its LeaseLost, a late delivery (the heartbeat finding the
    same loss a moment later) must not land again in the task's cleanup."""
    app = make_app(redis_url, task_eager_propagates=False)
    cleanup: list[str] = []

    @app.task(bind=True, base=LeasedTask, lease_ttl=5.0, shared=False)  # type: ignore[misc]
    def job(self: Any) -> None:
        lease = self.lease
        lease.mark_lost("deadline", deliver=False)
        try:
            lease.check()
        except LeaseLost as exc:
            assert lease.target.deliver(exc) is False  # what the heartbeat would do now
            time.sleep(0.05)  # cleanup that a stray delivery would interrupt
            cleanup.append("done")
            raise

    assert threading.current_thread() is threading.main_thread()  # the signal path
    job.apply()
    assert cleanup == ["done"]
