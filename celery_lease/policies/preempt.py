"""Newest wins: ``lease_on_conflict="preempt"``.

A duplicate that starts while the key is held takes the key over (:func:`take_over`, the
policy's handler): one script replaces the holder's token with its own and issues a higher
fencing token (:func:`celery_lease.store.take_over`), so the old holder's renewals and fenced
writes are refused from then on. The old holder's process is told at once on its channel
(:func:`celery_lease.store.preempt_channel`), which the :class:`Listener` of every process
running a preempt task subscribes to: it raises ``LeaseLost(cause="preempted")`` in the
holder's body (:meth:`celery_lease.core.lease.Lease.mark_lost`). A notification that does not
arrive (no listener yet, a broken connection, an ACL without the channel) leaves the
heartbeat's next renewal to find the loss, within one renewal interval: refused, and the key's
new holder names the old token (:func:`celery_lease.store.was_preempted`), so the cause is
``preempted`` there too, and the old execution's end wakes a newcomer waiting out the grace
the same way. A body that ends before either told it learns it from its release, which a
task with a grace waits for (:class:`celery_lease.LeasedTask` does at its end), so its end wakes
the newcomer too (:func:`loss_event`).

With ``lease_preempt_grace`` the newcomer holds the key (reserved: no third execution takes
it) but waits, before its body runs, until the old holder ended (its end wakes the newcomer,
:func:`end_preempted`) or the grace passed: the two bodies overlap at most by the grace, and
the old one's writes are fenced off once the new one writes.

The idea: Temporal's ``TERMINATE_EXISTING`` workflow-id conflict policy and Kubernetes
CronJob's ``concurrencyPolicy: Replace`` (docs/howto/shaping/preempt.md compares them).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from typing import Any

import redis
from redis.exceptions import RedisError

from .. import store
from ..base import process, signals
from ..base.headers import CLAIM_HEADER
from ..core import interrupt, lifecycle
from ..core.heartbeat import heartbeat
from ..core.lease import Lease
from ..errors import LostCause
from ..settings.config import LeaseOptions
from .base import DECLINED, Arguments, Conflict, Policy

__all__ = ["Listener", "Preempt", "end_preempted", "listen", "loss_event", "take_over"]

logger = logging.getLogger("celery_lease")

#: Float seconds a listener waits for a message before it looks again.
POLL = 1.0
#: Float seconds between subscription attempts after a store error: doubling from POLL up to
#: this (an ACL without the channel would otherwise log every second).
MAX_BACKOFF = 60.0
#: Attempts at taking the key over when it changed hands in between (a third newcomer).
ATTEMPTS = 3


class Listener:
    """The thread of one process that turns preemption notices into ``LeaseLost``.

    Args:
        client: a client of the lease store (its own connection is taken from it).
        channel: the process's channel (:func:`celery_lease.store.preempt_channel`).
    """

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.client, self.channel = client, channel
        self.pid = process.pid()
        self.subscribed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="celery-lease-preempt", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        backoff, last_problem = POLL, ""
        while True:
            try:
                pubsub = store.subscribe(self.client, self.channel)
                self.subscribed.set()
                backoff, last_problem = POLL, ""
                while True:
                    token = store.next_message(pubsub, POLL)
                    if token is not None:
                        self.deliver(token)
            except Exception as exc:  # never die: the renewals still find a loss meanwhile
                self.subscribed.clear()
                problem = store.describe(exc) if isinstance(exc, RedisError) else repr(exc)
                if problem != last_problem:  # once per kind of failure, not every attempt
                    logger.warning(
                        "preemption listener on %s: %s; preempted leases are found "
                        "at their next renewal until it subscribes again (an ACL "
                        "user needs &<prefix>:preempt:*)",
                        self.channel,
                        problem,
                    )
                    last_problem = problem
                threading.Event().wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    @staticmethod
    def deliver(token: str) -> None:
        """Raise ``LeaseLost(cause="preempted")`` in the execution holding ``token`` here."""
        for lease in heartbeat().held():
            if lease.token == token:
                lease.mark_lost(LostCause.PREEMPTED)


_listeners: dict[str, Listener] = {}
_lock = threading.Lock()


def listen(client: redis.Redis, prefix: str, hostname: str) -> Listener:
    """Make sure this process listens for preemptions of its leases under ``prefix`` held as
    ``hostname`` (what the holder value names); the first call per process subscribes (one
    round trip, then a thread). Returns the process's :class:`Listener`.
    """
    channel = store.preempt_channel(prefix, hostname, process.pid())
    with _lock:
        found = _listeners.get(channel)
        if found is None or found.pid != process.pid() or not found.thread.is_alive():
            found = _listeners[channel] = Listener(client, channel)
    return found


class Preempt(Policy):
    """``lease_on_conflict="preempt"``: newest wins (see the module docstring)."""

    name = "preempt"
    handles = ("preempt",)
    always = frozenset({"loss_event", "waits_for_release"})

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        return options.on_conflict == "preempt"

    def on_conflict(self, c: Conflict) -> Any:
        return take_over(c) or DECLINED  # nothing to take over: the composition's fallback

    def on_grant(self, task: Any, request: Any, lease: Lease) -> Arguments | None:
        hostname = request.hostname or socket.gethostname()
        listen(lease.client, lease.options.key_prefix, hostname)  # once per process
        return None

    def waits_for_release(self, options: LeaseOptions) -> bool:
        return options.preempt_grace > 0  # a newcomer may wait for this end: learn it at once

    def loss_event(self, lease: Lease, error: Any) -> str | None:
        return loss_event(lease, error)


def take_over(c: Conflict) -> Lease | None:
    """The ``"preempt"`` policy's handler for the conflict ``c``: take the key over from the
    holder it names, tell it, wait out the grace, return the lease (the body then runs). None
    for a cooldown record, an unknown holder, or a key that keeps changing hands: the
    composition then skips (or fails, inside a chain).

    Raises:
        LeaseStoreUnavailable: the store failed (as for any acquire).
    """
    task, request, key, found = c.task, c.request, c.key, c.found
    settings = task.lease_settings()
    options = settings.options
    client = store.client_for(settings.url, options.store_timeout, options.backend_options)
    hostname = request.hostname or socket.gethostname()
    claimed = CLAIM_HEADER in (request.headers or {})  # the take-over clears its claim
    for _ in range(ATTEMPTS):
        old = found.holder
        if old.cooldown_until or old.foreign or not old.token:
            break
        target = interrupt.for_current_context(settings.signum)
        try:
            got = lifecycle.take(
                settings,
                client,
                key,
                lifecycle.HolderInfo(task.name, request.id or "", hostname),
                target,
                sender=task,
                claim=c.claim,
                request=lifecycle.AcquireRequest(
                    claimed=claimed,
                    grant=functools.partial(store.take_over, from_token=old.token),
                ),
            )
        except RedisError as exc:
            c.fail_on_store(exc)
        if isinstance(got, Lease):
            _told(task, client, options, got, old)
            return got
        found = got
    return None


def _told(task: Any, client: redis.Redis, options: Any, lease: Lease, old: store.Holder) -> None:
    """After a take-over: notify the old holder's process, signal, wait out the grace."""
    try:
        notified = store.publish_preempted(
            client, store.preempt_channel(options.key_prefix, old.hostname, old.pid), old.token
        )
    except RedisError as exc:
        notified = 0
        logger.warning(
            "could not notify the preempted holder of %s (it learns it at its next renewal): %s",
            lease.key,
            store.describe(exc),
        )
    logger.info(
        "lease %s taken over from task %s[%s] on %s (fencing_token %d -> %d, notified=%d)",
        lease.key,
        old.task_name,
        old.task_id,
        old.where,
        old.fencing_token,
        lease.fencing_token,
        notified,
    )
    signals.lease_preempted.send(
        sender=task,
        key=lease.key,
        token=lease.token,
        fencing_token=lease.fencing_token,
        task_id=lease.task_id,
        preempted_token=old.token,
        preempted_task_id=old.task_id,
        preempted_fencing_token=old.fencing_token,
        preempted_holder=old.where,
        notified=notified,
    )
    grace = options.preempt_grace
    if grace > 0:
        waiter = store.client_for(
            task.lease_settings().url, grace + options.store_timeout, options.backend_options
        )
        try:
            store.wait_preempted_end(waiter, lease.key, old.token, grace)
        except RedisError as exc:  # the grace is a courtesy: the key is ours already
            logger.warning(
                "waiting for the preempted holder of %s failed: %s", lease.key, store.describe(exc)
            )


def loss_event(lease: Lease, error: Any) -> str:
    """The task event of an execution that ended having lost ``lease`` (``error``, a
    ``LeaseLost``): ``task-lease-preempted`` for a take-over, whose newcomer it then wakes
    (:func:`end_preempted`), else ``task-lease-lost``. A take-over found only by the release
    (the notice lost, the body ended before a renewal) counts too: the key's holder names
    the token it replaced (:func:`celery_lease.store.was_preempted`, one ``GET``)."""
    if error.cause != LostCause.PREEMPTED and not (
        lease.options.on_conflict == "preempt"
        and store.was_preempted(lease.client, lease.key, lease.token)
    ):
        return "task-lease-lost"
    end_preempted(lease.client, lease.key, lease.token)
    return "task-lease-preempted"


def end_preempted(client: redis.Redis, key: str, token: str) -> None:
    """The preempted execution ``token`` ended: wake the newcomer waiting out its grace.
    Never raises for a store error (the newcomer then waits the whole grace)."""
    try:
        store.wake_preempter(client, key, token)
    except RedisError as exc:
        logger.warning(
            "could not wake the execution that preempted %s: %s", key, store.describe(exc)
        )
