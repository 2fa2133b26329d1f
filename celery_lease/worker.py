"""Worker start-up: check the lease store once, in the worker's main process.

Added to ``app.steps['worker']`` when the first :class:`~celery_lease.LeasedTask` is
registered. It runs while the worker is being built, so a configuration error stops the
worker before it consumes a single message:

- every leased task's settings are valid and a Redis URL is known (else the worker refuses
  to start with a message naming ``lease_backend``);
- ``lease_signal`` names a usable signal;
- each store runs Redis 6.0 or later (else an error is logged: the release's note of who ended
  last would silently not be written, and ``celery lease ls`` would fail; the worker still
  starts, since leases themselves work);
- each store answers, its ACL user may send every command the configured features send
  (:func:`celery_lease.acl.problems`: a task lease's, ``WAIT`` with ``lease_min_replicas``,
  else the start is refused naming the commands; a hold's and beat's, else a warning), and
  its ``maxmemory-policy`` is ``noeviction``. Any other policy can
  evict a live lease (the holder is told nothing), so the worker logs a loud warning naming the
  setting and the fix, and refuses to start when ``lease_require_noeviction`` is true.

An unreachable store is logged, not fatal: tasks then follow ``lease_on_store_error``, which
beats a worker that crash-loops while Redis restarts. Two exceptions refuse the start: a store
error that waiting cannot fix (a wrong password, an ACL denial, a refused TLS certificate, a
missing database), with a message naming the setting to fix; and ``lease_require_noeviction``
set while the store cannot be reached, since the policy it promises cannot be checked (a
supervisor restarts the worker, which starts once the store answers).

A refusal is :class:`~celery_lease.errors.LeaseStartRefused`: a ``LeaseConfigError`` for code
that builds a worker itself, and for ``celery worker`` a Click error, so the command prints one
``Error: ...`` line and exits with ``EX_CONFIG`` (78) instead of a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from redis.exceptions import RedisError

from . import acl, store
from .config import check_process_settings
from .doctor import failover_problem, redis_version_problem
from .errors import LeaseConfigError, LeaseStartRefused
from .names import check_app_settings
from .store import permissions, topology
from .store.errors import permanent_error
from .store.url import safe_url
from .task import LeasedTask

__all__ = ["LeaseStoreCheck", "check_app", "install"]

logger = logging.getLogger("celery_lease")

def check_app(app: Any) -> list[topology.StoreCheck]:
    """Validate the lease settings of every leased task of ``app`` and check each store.

    Returns the checks of the stores that answered.

    Raises:
        LeaseConfigError: a setting is invalid or unknown, no Redis URL is known, a store error
            that waiting cannot fix, or ``lease_require_noeviction`` is set while the eviction
            policy is unsafe or the store cannot be reached.
    """
    check_app_settings(app.conf)
    check_process_settings(app.conf, "app.conf")
    using: dict[tuple[str, str], list[tuple[str, Any]]] = {}  # store -> its tasks' options
    for task in list(app.tasks.values()):
        if isinstance(task, LeasedTask):
            options, url, _ = task.lease_settings()
            key = (url, repr(sorted(options.backend_options.items())))
            using.setdefault(key, []).append((task.name, options))
    checks = []
    for need in acl.needs(app, tasks_only=True):
        url = need.url
        try:
            client = store.client_for(url, max(need.timeout, 1.0), need.options)
            _check_permissions(client, need)  # first: a denied INFO is named as such
            check = topology.check_store(client)
            _warn_failover_exposure(
                client, url, using.get((url, repr(sorted(need.options.items()))), []))
        except RedisError as exc:
            permanent = permanent_error(exc)
            if permanent:
                raise LeaseConfigError(f"lease store {safe_url(url)}: {permanent} (refusing to "
                                       f"start: no leased task can run until this is fixed)"
                                       ) from None
            if app.conf.get("lease_require_noeviction"):
                raise LeaseConfigError(
                    f"lease store {safe_url(url)} cannot be reached ({store.describe(exc)}), so "
                    f"its maxmemory-policy cannot be checked and lease_require_noeviction=True "
                    f"refuses to start without that check; start the worker once the store "
                    f"answers, or set lease_require_noeviction=False") from None
            logger.error("lease store %s is unreachable at worker start: %s; leased tasks "
                         "follow lease_on_store_error until it answers", safe_url(url),
                         store.describe(exc))
            continue
        checks.append(check)
        problem = redis_version_problem(check.version)
        if problem:
            logger.error("lease store %s: %s; redeliveries of finished runs may run again",
                         safe_url(url), problem)
        if not check.safe:
            message = (
                f"lease store {safe_url(url)} runs with maxmemory-policy={check.eviction_policy}: "
                f"Redis may evict a live lease and let a second execution start while the first "
                f"still runs. Fix: CONFIG SET maxmemory-policy noeviction (and in redis.conf), "
                f"or use a dedicated Redis for lease_backend"
            )
            if app.conf.get("lease_require_noeviction"):
                raise LeaseConfigError(message + " (refusing to start: lease_require_noeviction)")
            logger.warning("!" * 20 + " " + message + "; lease_require_noeviction=True makes the "
                           "worker refuse to start on such a store instead of warning")
    return checks


def _warn_failover_exposure(client: Any, url: str, tasks: list[tuple[str, Any]]) -> None:
    """Warn for each task whose lease a Sentinel failover could let lapse under its holder
    (:func:`celery_lease.doctor.failover_problem`)."""
    down_after = topology.sentinel_down_after(client)
    if down_after is None:
        return
    for name, options in tasks:
        problem = failover_problem(options, down_after)
        if problem is not None:
            logger.warning("lease store %s, task %s: %s. Fix: %s", safe_url(url), name,
                           *problem)


def _check_permissions(client: Any, need: acl.StoreNeeds) -> None:
    """Refuse the start when the ACL user lacks a command every worker sends; warn for those
    of a hold or beat (:func:`celery_lease.acl.problems`). A server that cannot say (before
    Redis 7.0) gets the renewal script run on an absent key under each prefix instead: it
    writes nothing, and a user without the script commands, ``GET`` or the key pattern gets
    NOPERM here, not at the first acquire."""
    found = acl.problems(client, need, skip=acl.COMMAND_LINE)
    if found is None:
        probes = [(f"{p}:{permissions.PROBE_KEY}", "-", 1) for p in need.prefixes]
        for reply in store.renew_many(client, probes):
            if isinstance(reply, RedisError):
                raise reply
        if need.acl_user:
            logger.warning("lease store %s cannot check the ACL user's permissions without "
                           "running the commands (Redis 7.0 can): only the renewal script was "
                           "probed; compare the user's ACL with `celery lease acl`",
                           safe_url(need.url))
        return
    refusals, warnings = found
    for message in warnings:
        logger.warning("lease store %s: %s", safe_url(need.url), message)
    if refusals:
        raise LeaseConfigError(f"lease store {safe_url(need.url)}: {'; '.join(refusals)} "
                               f"(refusing to start: no leased task can run until this is "
                               f"fixed)")


class LeaseStoreCheck(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep running :func:`check_app` while the worker is built."""

    label = "Lease store check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        try:
            check_app(parent.app)
        except LeaseConfigError as exc:
            # Raised from the worker's construction: Click prints it as one line and exits.
            logger.critical("celery-lease refused to start this worker: %s", exc)
            raise LeaseStartRefused("worker", str(exc)) from None


def install(app: Any) -> None:
    """Register :class:`LeaseStoreCheck` with ``app``'s worker (idempotent)."""
    app.steps["worker"].add("celery_lease.worker:LeaseStoreCheck")
