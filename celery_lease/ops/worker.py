"""Worker start-up: check the lease store once, in the worker's main process.

Added to ``app.steps['worker']`` when the first :class:`~celery_lease.LeasedTask` is
registered. It runs while the worker is being built, so a configuration error stops the
worker before it consumes a single message:

- every leased task's settings are valid and a Redis URL is known (else the worker refuses
  to start with a message naming ``lease_backend``);
- ``lease_signal`` names a usable signal;
- each store answers, and its ACL user may send every command the configured features send
  (:func:`celery_lease.ops.acl.problems`: a task lease's, ``WAIT`` with ``lease_min_replicas``,
  else the start is refused naming the commands; a hold's and beat's, else a warning);
- then every check of ``celery lease doctor`` that applies at start, from the doctor's own
  list (:func:`celery_lease.ops.doctor.diagnose` with ``at_start=True``): each task's settings
  against its time limits and the broker's ``visibility_timeout``, beat's, and each store's
  version, ``maxmemory-policy``, latency, clock, Sentinel failover exposure and connected
  replicas for ``lease_min_replicas``. What the doctor calls WARN is logged as a warning and
  FAIL as an error, naming the fix; a finding the settings alone make fail, whatever the
  store's state (a ``retry`` wait the broker would redeliver), refuses the start. An
  eviction policy other than ``noeviction`` can evict a live lease (the holder is told
  nothing): a loud warning, or a refusal when ``lease_require_noeviction`` is true.

The banner of ``celery worker`` gets a ``[lease]`` section naming each lease store of its
tasks, passwords masked (``.> store:       redis://:**@redis-1:6379/0``).

An unreachable store is logged (a WARNING, through :mod:`celery_lease.store.health`, which
logs the outage's end too), not fatal: tasks then follow ``lease_on_store_error``, which
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

import functools
import logging
from typing import Any

from celery import bootsteps
from redis.exceptions import RedisError

from .. import store
from ..errors import LeaseConfigError, LeaseStartRefused
from ..execution.task import LeasedTask
from ..settings.config import check_process_settings
from ..settings.names import check_app_settings
from ..store import health, permissions, topology
from ..store.errors import permanent_error
from ..store.url import safe_url
from . import acl
from .doctor import diagnose

__all__ = ["LeaseStoreCheck", "check_app", "install"]

logger = logging.getLogger("celery_lease")


def check_app(app: Any) -> list[topology.StoreCheck]:
    """Validate the lease settings of every leased task of ``app``, check each store, and run
    the checks of ``celery lease doctor`` that apply at start (:func:`_run_doctor`).

    Returns the checks of the stores that answered.

    Raises:
        LeaseConfigError: a setting is invalid or unknown, no Redis URL is known, a store error
            that waiting cannot fix, ``lease_require_noeviction`` is set while the eviction
            policy is unsafe or the store cannot be reached, or a doctor finding that the
            settings alone make fail (:attr:`celery_lease.ops.finding.Finding.refuses_start`).
    """
    check_app_settings(app.conf)
    check_process_settings(app.conf, "app.conf")
    for task in list(app.tasks.values()):
        if isinstance(task, LeasedTask):
            task.lease_settings()  # raises for an invalid setting or no Redis URL
    checks = []
    unreachable = set()
    for need in acl.needs(app, tasks_only=True):
        url = need.url
        try:
            client = store.client_for(url, max(need.timeout, 1.0), need.options)
            _check_permissions(client, need)  # first: a denied INFO is named as such
            checks.append(topology.check_store(client))
        except RedisError as exc:
            permanent = permanent_error(exc)
            if permanent:
                raise LeaseConfigError(
                    f"lease store {safe_url(url)}: {permanent} (refusing to "
                    f"start: no leased task can run until this is fixed)"
                ) from None
            if app.conf.get("lease_require_noeviction"):
                raise LeaseConfigError(
                    f"lease store {safe_url(url)} cannot be reached ({store.describe(exc)}), so "
                    f"its maxmemory-policy cannot be checked and lease_require_noeviction=True "
                    f"refuses to start without that check; start the worker once the store "
                    f"answers, or set lease_require_noeviction=False"
                ) from None
            # Not an ERROR: nothing is given up; leased tasks follow lease_on_store_error.
            health.reachability(url).failed(exc, "the worker's start check")
            unreachable.add(url)
    _run_doctor(app, unreachable)
    return checks


def _run_doctor(app: Any, unreachable: set[str]) -> None:
    """Log what ``celery lease doctor`` would report as WARN or FAIL (the same checks, from
    :func:`celery_lease.ops.doctor.diagnose`), and refuse the start for every finding the settings
    alone make fail, all in one error. An unsafe eviction policy is a loud warning, or a
    refusal under ``lease_require_noeviction``."""
    refusals = []
    for finding in diagnose(app, at_start=True, skip_stores=unreachable):
        if finding.level not in ("warn", "fail") or finding.check == "unreachable":
            continue  # an unreachable store was logged above, with what tasks do meanwhile
        text = f"{finding.subject}: {finding.message}" + (
            f". Fix: {finding.fix}" if finding.fix else ""
        )
        if finding.refuses_start:
            refusals.append(text)
        elif finding.check == "eviction" and app.conf.get("lease_require_noeviction"):
            refusals.append(f"{text} (lease_require_noeviction=True refuses such a store)")
        elif finding.check == "eviction":
            logger.warning(
                "!" * 20 + " lease %s; lease_require_noeviction=True makes the "
                "worker refuse to start on such a store instead of warning",
                text,
            )
        else:
            (logger.error if finding.level == "fail" else logger.warning)(
                "lease %s (celery lease doctor: %s)", text, finding.level.upper()
            )
    if refusals:
        raise LeaseConfigError(
            "; ".join(refusals) + " (refusing to start; `celery lease doctor` shows every check)"
        )


def _check_permissions(client: Any, need: acl.StoreNeeds) -> None:
    """Refuse the start when the ACL user lacks a command every worker sends; warn for those
    of a hold or beat (:func:`celery_lease.ops.acl.problems`). A server that cannot say (before
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
            logger.warning(
                "lease store %s cannot check the ACL user's permissions without "
                "running the commands (Redis 7.0 can): only the renewal script was "
                "probed; compare the user's ACL with `celery lease acl`",
                safe_url(need.url),
            )
        return
    refusals, warnings = found
    for message in warnings:
        logger.warning("lease store %s: %s", safe_url(need.url), message)
    if refusals:
        raise LeaseConfigError(
            f"lease store {safe_url(need.url)}: {'; '.join(refusals)} "
            f"(refusing to start: no leased task can run until this is "
            f"fixed)"
        )


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
        startup_info = getattr(parent, "startup_info", None)  # `celery worker`'s banner
        urls = dict.fromkeys(need.url for need in acl.needs(parent.app, tasks_only=True))
        if callable(startup_info) and urls:
            parent.startup_info = functools.partial(_banner, startup_info, list(urls))


def _banner(startup_info: Any, urls: list[str], artlines: bool = True) -> str:
    """Celery's worker banner (``startup_info``) with a ``[lease]`` section naming each lease
    store of the worker's tasks (``urls``, passwords masked), indented as the lines below
    Celery's logo are."""
    pad = " " * 16 if artlines else ""
    lines = [f"{pad}.> store:       {safe_url(url)}\n" for url in urls]
    return str(startup_info(artlines=artlines)) + f"\n{pad}[lease]\n" + "".join(lines)


def install(app: Any) -> None:
    """Register :class:`LeaseStoreCheck` with ``app``'s worker (idempotent)."""
    app.steps["worker"].add("celery_lease.ops.worker:LeaseStoreCheck")
