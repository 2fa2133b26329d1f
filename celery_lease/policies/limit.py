"""``lease_limit``: up to N executions per key at once, a task option and a ``hold()`` argument.

``lease_limit=N`` (an int >= 1) or a callable of the task's arguments returning one (10 for one
tenant, 2 for another). 1, the default, is the plain lease, unchanged in cost and key format;
above 1 the key is a set of individually leased slots (:mod:`celery_lease.store.slots`).

The limit is checked at the earliest moment: its type at decoration, and the settings it cannot
be combined with (a cooldown and a preemption keep one holder's state at the key) at
decoration too, for a callable as for an int above 1; a callable's
answer is checked at each execution (:class:`~celery_lease.errors.LeaseConfigError` naming
the option, before the body runs). The hand-over policies work with it: ``queue``, ``retry``
and ``coalesce`` wait in the key's line once all N slots are held, and each slot's release
hands the freed slot to the line's head (:mod:`celery_lease.policies.handoff`).

Where the idea comes from: Sidekiq Enterprise's concurrent limiter and Oban Pro's partitioned
``global_limit`` (docs/howto/shaping/limit.md compares them), made of leases that each expire on
their own instead of a counter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import store
from ..core import lifecycle
from ..errors import LeaseConfigError
from ..settings.config import LeaseOptions
from .base import Policy

if TYPE_CHECKING:
    from ..core.lease import Lease

__all__ = ["LIMIT_OPTION", "Limit", "LimitSpec", "check_limit", "limit_for"]

#: The task option's name (and ``hold(limit=)``'s setting in errors).
LIMIT_OPTION = "lease_limit"

#: An int >= 1, a callable of the task's arguments returning one, or None (1).
LimitSpec = int | Callable[..., int] | None


def check_limit(spec: Any, where: str, name: str = LIMIT_OPTION) -> None:
    """Check a ``lease_limit`` at decoration (or a ``hold(limit=)`` at its creation); the
    settings it cannot be combined with are refused by
    :func:`celery_lease.policies.compose.check`.

    Args:
        spec: the option's value: None, an int >= 1, or a callable.
        where: what to name in the error (``"task proj.tasks.sync"``).
        name: the option's name in the error (``"limit"`` for ``hold()``).

    Raises:
        LeaseConfigError: ``spec`` is not an int >= 1 (a bool, a float, 0, a string) nor a
            callable.
    """
    if spec is None or (spec == 1 and type(spec) is int):
        return
    if not callable(spec) and (type(spec) is not int or spec < 1):
        raise LeaseConfigError(
            f"{name}={spec!r} ({where}) must be a whole number of executions >= 1 at once per "
            f"key (e.g. {name}=3), or a callable of the task's arguments returning one"
        )


def limit_for(
    spec: LimitSpec, args: Any, kwargs: Mapping[str, Any], where: str, name: str = LIMIT_OPTION
) -> int:
    """The limit of one execution: ``spec`` itself, or a callable's answer for its arguments.

    Args:
        spec: as :func:`check_limit` accepted it.
        args, kwargs: the execution's arguments (as the worker received them).
        where: what to name in an error.

    Returns:
        An int >= 1 (1: the plain lease).

    Raises:
        LeaseConfigError: the callable returned something else than an int >= 1.
        Exception: whatever the callable itself raises, unchanged.
    """
    if spec is None:
        return 1
    if not callable(spec):
        return spec
    found = spec(*args, **kwargs)
    if type(found) is not int or found < 1:
        raise LeaseConfigError(
            f"{name} callable returned {found!r} ({where}); it must return a whole number of "
            f"executions >= 1 (e.g. 10 for one tenant, 2 for another)"
        )
    return found


class Limit(Policy):
    """``lease_limit``: the key of an execution whose limit is above 1 is a set of slots."""

    name = "lease_limit"
    order = 30  # after the hand-over, which hands a freed slot to the line's head

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        return limit is not None

    def acquires_apart(self, task: Any, headers: Any) -> bool:
        return True  # a slot of a limited key is never written at the accept

    def shape(
        self, task: Any, request: Any, args: Any, kwargs: Any, asked: lifecycle.AcquireRequest
    ) -> None:
        cls = type(task)
        cached = cls._lease_limit_cache  # set at registration (on_bound): no call here
        spec = cached[0] if cached is not None else cls._lease_limit_spec()
        limit = limit_for(spec, args, kwargs, f"task {task.name}")
        if limit > 1:  # 1: the plain lease
            asked.shape = store.key_shape(limit)

    def release(self, task: Any, lease: Lease, ending: str, wait: bool) -> lifecycle.Ending | None:
        if lease.limit == 1:
            return None
        return lifecycle.end(lease, sender=task, release=store.release_slot)  # no cooldown
