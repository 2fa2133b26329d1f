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
``global_limit`` (docs/howto/shaping.md compares them), made of leases that each expire on
their own instead of a counter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import LeaseConfigError
from ..settings.config import LeaseOptions

__all__ = ["LIMIT_OPTION", "LimitSpec", "check_limit", "limit_for"]

#: The task option's name (and ``hold(limit=)``'s setting in errors).
LIMIT_OPTION = "lease_limit"

#: An int >= 1, a callable of the task's arguments returning one, or None (1).
LimitSpec = int | Callable[..., int] | None


def _refused(options: LeaseOptions) -> list[str]:
    """The settings of ``options`` that a limit above 1 cannot work with, each with why."""
    found = []
    if options.on_conflict == "preempt":
        found.append(
            "lease_on_conflict='preempt' (which of N holders would it take over? "
            "use 'queue', 'retry', 'coalesce', 'skip' or 'fail')"
        )
    if options.cooldown is not None:
        found.append("lease_cooldown (a cooldown record is one holder's; drop it)")
    return found


def check_limit(
    spec: Any, options: LeaseOptions | None, where: str, name: str = LIMIT_OPTION
) -> None:
    """Check a ``lease_limit`` at decoration (or a ``hold(limit=)`` at its creation).

    Args:
        spec: the option's value: None, an int >= 1, or a callable.
        options: the resolved lease options it goes with (None: not checked against them).
        where: what to name in the error (``"task proj.tasks.sync"``).
        name: the option's name in the error (``"limit"`` for ``hold()``).

    Raises:
        LeaseConfigError: ``spec`` is not an int >= 1 (a bool, a float, 0, a string) nor a
            callable, or a limit other than 1 goes with a setting it cannot work with
            (``lease_on_conflict="preempt"``, ``lease_cooldown``), naming each and the fix.
    """
    if spec is None or (spec == 1 and type(spec) is int):
        return
    if not callable(spec) and (type(spec) is not int or spec < 1):
        raise LeaseConfigError(
            f"{name}={spec!r} ({where}) must be a whole number of executions >= 1 at once per "
            f"key (e.g. {name}=3), or a callable of the task's arguments returning one"
        )
    if options is not None:
        refused = _refused(options)
        if refused:
            raise LeaseConfigError(
                f"{name}={spec!r} ({where}) cannot be combined with " + "; ".join(refused)
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
