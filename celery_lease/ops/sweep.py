"""The crash sweep: hand over what a dead holder (or a releasing worker that died before it
published) left waiting, for ``lease_on_conflict="coalesce"`` and ``"queue"``; and publish
again the lost timer of a ``lease_debounce`` burst
(:func:`celery_lease.policies.debounce.sweep_look`).

Every worker whose app has such a task runs one sweep thread in its main process
(:class:`HandoffSweep`, a bootstep added when the first such task is registered). A duplicate
parked in a key's line first notes the key in the prefix's index (a sorted set scored with
the store's clock: :func:`celery_lease.store.handoff.watch`, scored at the holder's expiry).
Each pass, every ``lease_renew_interval`` of those tasks (the shortest), takes the keys due
(scored ahead meanwhile, so one sweep at a time looks at a key) and looks at each
(:func:`celery_lease.store.handoff.recover`): a key held, or reserved and due, is noted again
for when that ends, so a live holder is never raced (its own release hands over); a free key
is handed over and the run published; a key with nothing waiting is dropped from the index.

So a holder killed by SIGKILL or OOM leaves its pending run or line to be published at most one
TTL plus one pass after it died, by any live worker, without an operator; a releaser that died
between its release and its publish leaves a reservation that passes its due time (one TTL)
and is published the same way; a run published twice runs once (``lease/acquire-4.lua``). A limited
key (``lease_limit`` above 1) is looked at while its slots are held: each slot reservation
past due is published again, its slot still reserved (the same look, the same script), and
the copy that takes the slot refuses the other (``slots/acquire_slot-3.lua``).

On Redis Cluster the index has a hash tag of its own (one node holds it; each key's line and
lease live on theirs): the index is only a hint of where to look, and each look decides on the
lease's own node, in one script; a note lost with its node costs a late look, never a race.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from redis.exceptions import RedisError

from .. import store
from ..policies import compose
from ..settings.config import LeaseOptions
from ..store import handoff as stored
from ..store import health
from .inspection import leased_tasks

__all__ = ["BATCH", "HandoffSweep", "Sweep", "sweep_once"]

logger = logging.getLogger("celery_lease")

#: Keys one pass looks at per store and prefix, at most.
BATCH = 100


def _targets(app: Any) -> dict[tuple[str, str], dict[str, LeaseOptions]]:
    """(store URL, key prefix) -> {task name: options} of the tasks that hand over."""
    found: dict[tuple[str, str], dict[str, LeaseOptions]] = {}
    for task in leased_tasks(app):
        options, url, _ = task.lease_settings()
        if options.hands_over:
            found.setdefault((url, options.key_prefix), {})[task.name] = options
    return found


def _options_for(key: str, tasks: dict[str, LeaseOptions]) -> LeaseOptions:
    """The options of the task named in ``key``'s hash tag; else the longest TTL's (a custom
    ``lease_key`` names no task)."""
    tag = key.partition("{")[2].rpartition("}")[0]
    for name, options in tasks.items():
        if tag == name or tag.startswith(name + ":"):
            return options
    return max(tasks.values(), key=lambda o: o.ttl)


def sweep_once(app: Any, client: Any, prefix: str, tasks: dict[str, LeaseOptions]) -> int:
    """One pass over the keys due under ``prefix``; returns how many runs (and debounce
    timers) it published.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    ahead = round(max(o.ttl for o in tasks.values()) * 1000)
    published = 0
    for key, score in stored.take_due(client, prefix, BATCH, ahead):
        options = _options_for(key, tasks)
        for look in compose.sweepers(options):  # the hand-over's, then a debounce timer's
            published += look(app, client, prefix, key, score, options)
    return published


class Sweep:
    """The sweep thread of one worker (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread if a task of the app hands over; else do nothing (also when the
        settings are invalid: the start check refuses the worker for that, not this)."""
        try:
            targets = _targets(self.app)
        except Exception as exc:
            logger.warning("lease hand-over sweep not started: %s", exc)
            return
        if not targets:
            return
        interval = min(o.renew_interval for tasks in targets.values() for o in tasks.values())
        self.thread = threading.Thread(
            target=self._run, args=(targets, interval), name="celery-lease-sweep", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """Stop the thread (returns within one store call)."""
        self.stopped.set()

    def _run(
        self, targets: dict[tuple[str, str], dict[str, LeaseOptions]], interval: float
    ) -> None:
        while not self.stopped.wait(interval):
            for (url, prefix), tasks in targets.items():
                self._pass(url, prefix, tasks, interval)

    def _pass(self, url: str, prefix: str, tasks: dict[str, LeaseOptions], interval: float) -> None:
        """One pass over ``prefix`` on the store at ``url``; never raises."""
        options = next(iter(tasks.values()))
        reachable = health.reachability(url)
        try:
            client = store.client_for(url, options.store_timeout, options.backend_options)
            sweep_once(self.app, client, prefix, tasks)
        except RedisError as exc:
            # An unreachable store: one line per outage (store.health), not one per pass.
            if not reachable.failed(exc, f"hand-over sweep of {prefix}"):
                logger.warning(
                    "lease sweep of %s failed (next pass in %.1fs): %s",
                    prefix,
                    interval,
                    store.describe(exc),
                )
        except Exception:  # never let the sweep die silently
            logger.exception("lease sweep of %s failed", prefix)
        else:
            reachable.answered()


class HandoffSweep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep running the :class:`Sweep` thread in the worker's main process."""

    label = "Lease hand-over sweep"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.sweep = Sweep(parent.app)

    def start(self, parent: Any) -> None:
        self.sweep.start()

    def stop(self, parent: Any) -> None:
        self.sweep.stop()
