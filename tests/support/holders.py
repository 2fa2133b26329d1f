"""Leased executions held open in threads of the test process, with the real heartbeat.

Each holder is an eager ``LeasedTask`` execution running in its own thread: it takes its lease
through the library's settings (``lease_backend`` + ``lease_backend_options``), is renewed by
the process's heartbeat and gets ``LeaseLost`` delivered like in the threads pool. Its body
waits until :meth:`Holders.stop` (or the loss) and records when it ran.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from celery_lease import LeasedTask, LeaseLost
from celery_lease.base import signals
from tests.support.waiting import wait_for


@dataclass
class Run:
    """One body that ran: its argument, lease and the times it started and ended."""

    n: int
    key: str
    token: str
    fencing_token: int
    started: float
    ended: float | None = None
    lost: LeaseLost | None = None


@dataclass
class Outcome:
    """What ``apply`` returned for one execution (the exception, if it failed)."""

    n: int
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Holders:
    """Start leased bodies on argument ``n`` that hold until stopped.

    ``conf`` goes to the app (``lease_backend``, ``lease_backend_options``, ``lease_ttl``...).
    ``renewed`` and ``failed`` collect ``(key, monotonic time)`` of each renewal and each failed
    renewal the heartbeat signals; ``errors`` the text of each failed renewal's error.
    """

    def __init__(self, **conf: Any) -> None:
        self.app = Celery(
            "holders", broker="memory://", backend="cache+memory://", set_as_current=False
        )
        self.app.conf.update(
            {
                "task_always_eager": True,
                "task_eager_propagates": True,
                "lease_on_store_error": "fail",
                **conf,
            }
        )
        self.runs: list[Run] = []
        self.outcomes: list[Outcome] = []
        self.renewed: list[tuple[str, float]] = []
        self.failed: list[tuple[str, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        runs = self.runs

        @self.app.task(  # type: ignore[misc]
            bind=True, base=LeasedTask, name="holders.hold", shared=False
        )
        def hold(task: Any, n: int) -> int:
            lease = task.lease
            run = Run(n, lease.key, lease.token, lease.fencing_token, time.monotonic())
            runs.append(run)
            try:
                while not self._stop.is_set():
                    self._stop.wait(0.02)  # LeaseLost lands between two waits
            except LeaseLost as exc:
                run.lost = exc
                raise
            finally:
                run.ended = time.monotonic()
            return n

        self.task = hold
        signals.lease_renewed.connect(self._on_renewed, weak=False)
        signals.lease_renewal_failed.connect(self._on_failed, weak=False)

    def _on_renewed(self, sender: Any = None, key: str = "", **_: Any) -> None:
        self.renewed.append((key, time.monotonic()))

    def _on_failed(self, sender: Any = None, key: str = "", error: Any = None, **_: Any) -> None:
        from celery_lease import store

        self.failed.append((key, time.monotonic()))
        self.errors.append(store.describe(error))

    def start(self, n: int, timeout: float = 10.0) -> Outcome:
        """Run the body for ``n`` in a new thread; returns once it runs or has failed."""
        outcome = Outcome(n)
        self.outcomes.append(outcome)

        def run() -> None:
            try:
                self.task.apply((n,), throw=True)
            except BaseException as exc:  # recorded for the test to judge
                outcome.error = exc
            finally:
                outcome.done.set()

        threading.Thread(target=run, daemon=True, name=f"holder-{n}").start()
        wait_for(
            lambda: outcome.done.is_set() or self.running(n),
            timeout,
            message=f"holder {n} neither ran nor failed",
        )
        return outcome

    def running(self, n: int) -> Run | None:
        """The body for ``n`` that runs now, if any."""
        return next((r for r in self.runs if r.n == n and r.ended is None), None)

    def key_of(self, n: int) -> str:
        """The lease key of argument ``n``."""
        key: str = self.task.lease_key_for((n,))
        return key

    def renewals_of(self, key: str, since: float) -> int:
        """How many renewals of ``key`` the heartbeat confirmed after ``since``."""
        return sum(1 for k, t in self.renewed if k == key and t > since)

    def stop(self, timeout: float = 10.0) -> None:
        """End every body and wait for each execution to return."""
        self._stop.set()
        for outcome in self.outcomes:
            outcome.done.wait(timeout)

    def close(self) -> None:
        """Stop the bodies and disconnect the signal receivers."""
        self.stop()
        signals.lease_renewed.disconnect(self._on_renewed)
        signals.lease_renewal_failed.disconnect(self._on_failed)

    def __enter__(self) -> Holders:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
