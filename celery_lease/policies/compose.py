"""The one place where the policies of a task are put together, and every rule for combining
them.

:func:`steps_for` builds, once per task class and process, the :class:`Steps` of a task: for
each phase, the hooks of the policies that apply to it and override that phase's hook
(:mod:`celery_lease.policies.base`), in :attr:`~celery_lease.policies.base.Policy.order`, plus
the hooks every task gets because a message header says when they act. A phase with no hook
is an empty tuple, so a task with no policy pays a loop over nothing. :func:`publish_steps`
does the same for the publish side, from the settings a publisher reads.

The combination rules:

- :func:`check`, at registration (a task's, a ``lease_tasks`` entry's) and again when a
  task's settings are resolved in a process (an app setting given later): a ``lease_limit``
  above 1 cannot go with ``lease_on_conflict="preempt"`` nor with ``lease_cooldown`` (both
  keep one holder's state at the key); one error names each and the fix. ``coalesce``,
  ``queue`` and ``retry`` work with it (:mod:`celery_lease.policies.handoff`);
- :func:`choose`, at a conflict: the cases that ignore ``lease_on_conflict`` come first (a
  second copy of a handed-over run, a holder's successor, the holder's own message
  redelivered), then a debounce burst waits in line (``queue``), then a ``skip`` or
  ``coalesce`` inside a chain fails (the chain's result raises), then the task's own policy;
- :data:`FALLBACK`: what runs when a policy declines (a ``preempt`` with nothing to take over
  skips, or fails inside a chain);
- a message that ends on a conflict policy that does not keep it gives up what it claimed at
  publish (:meth:`~celery_lease.policies.base.Policy.on_message_end`);
- the end: the first policy whose :meth:`~celery_lease.policies.base.Policy.release` answers
  ends the lease (a cooldown, then the hand-over, then a slot's release), else the plain
  release; it waits for the reply when the task or a policy needs to know it;
- the crash sweep looks at a due key with the hand-over first, then a debounce timer;
- the acquire is written at the pool's accept unless a policy takes it apart
  (:meth:`~celery_lease.policies.base.Policy.acquires_apart`) or replicas must acknowledge it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import Retry

from .. import store
from ..base import headers as base_headers
from ..base import signals
from ..core import lifecycle
from ..core.lease import Lease
from ..errors import LeaseConfigError, LeaseConflict
from ..settings.config import LeaseOptions
from . import base
from .base import DECLINED, Conflict, Policy
from .limit import LIMIT_OPTION, check_limit

__all__ = [
    "FALLBACK",
    "PublishSteps",
    "Steps",
    "acquires_apart",
    "check",
    "choose",
    "conflict_of",
    "end",
    "forget",
    "handle",
    "handlers",
    "loss_event",
    "publish_steps",
    "steps_for",
    "sweepers",
]

logger = logging.getLogger("celery_lease")

#: Conflict policy -> what runs when its handler declines, given whether the execution is
#: part of a chain.
FALLBACK: dict[str, Callable[[bool], str]] = {
    "preempt": lambda in_chain: "fail" if in_chain else "skip",
}

_PUBLISH_ATTR = "_lease_publish_steps"
_instances: dict[type[Policy], Policy] = {}
#: What every policy contributes to a conflict, kept until another policy is defined:
#: (how many policies it was made from, name -> handler, the names that keep their message).
_conflicts: tuple[int, dict[str, Callable[[Conflict], Any]], frozenset[str]] = (-1, {}, frozenset())


def _policies() -> list[Policy]:
    """One instance of every policy, in order (the package's modules imported first)."""
    if not _instances:
        for found in pkgutil.walk_packages(_package_path(), _prefix()):
            importlib.import_module(found.name)  # each defines its policies
    known = base.registered()
    for cls in known:
        if cls not in _instances:
            _instances[cls] = cls()
    for gone in set(_instances) - set(known):  # unregistered (a test's own policy)
        del _instances[gone]
    return sorted(_instances.values(), key=lambda p: (p.order, p.name))


def _package_path() -> list[str]:
    return list(importlib.import_module(_prefix()[:-1]).__path__)


def _prefix() -> str:
    return __name__.rpartition(".")[0] + "."  # "celery_lease.policies."


def _overrides(policy: Policy, hook: str) -> bool:
    return getattr(type(policy), hook) is not getattr(Policy, hook)


def _bound(hook: str, applying: list[Policy], every: list[Policy]) -> tuple[Any, ...]:
    """The ``hook`` of each policy that applies and overrides it, and of each policy that
    binds it for every task (:attr:`~celery_lease.policies.base.Policy.always`)."""
    return tuple(
        getattr(p, hook)
        for p in every
        if _overrides(p, hook) and (p in applying or hook in p.always)
    )


def _triggered(hook: str, applying: list[Policy], every: list[Policy]) -> tuple[Any, ...]:
    """``(header, hook)`` for each policy that does not apply but whose ``hook`` a message
    header calls (:attr:`~celery_lease.policies.base.Policy.triggers`)."""
    return tuple(
        (p.triggers[hook], getattr(p, hook))
        for p in every
        if hook in p.triggers and p not in applying and hook not in p.always
    )


# -- registration ------------------------------------------------------------------------------


def _refused_with_a_limit(options: LeaseOptions) -> list[str]:
    """The settings of ``options`` that a limit above 1 cannot work with, each with why and
    the fix.

    Both keep one holder's state at the key, which N slots do not have: ``"preempt"`` would
    have to pick which of N running holders to stop (a newest-wins task with room for N
    needs no take-over: a copy that finds a free slot runs at once), and a cooldown record
    holds the whole key (a window per slot would let N runs through each window, which is
    a rate, not a cooldown). Refused rather than run differently from what the setting says.
    """
    found = []
    if options.on_conflict == "preempt":
        found.append(
            "lease_on_conflict='preempt' (which of N holders would it take over? Fix: "
            "lease_on_conflict='queue', 'retry', 'coalesce', 'skip' or 'fail' with the limit, "
            "or lease_limit=1 to keep 'preempt')"
        )
    if options.cooldown is not None:
        found.append(
            "lease_cooldown (a cooldown record holds the whole key, not one of N slots. Fix: "
            "lease_cooldown=None for this task, or lease_limit=1 to keep the cooldown)"
        )
    return found


def check(limit: Any, options: LeaseOptions, where: str, name: str = LIMIT_OPTION) -> None:
    """Refuse a task whose policies cannot be combined: at registration, when a
    ``lease_tasks`` entry is applied, and when a task's settings are resolved in a process.

    Args:
        limit: the ``lease_limit`` (None, an int, or a callable of the task's arguments).
        options: the task's resolved lease options.
        where: what to name in the error (``"task proj.tasks.sync"``).
        name: the limit's name in the error.

    Raises:
        LeaseConfigError: the limit is not valid, or a limit other than 1 goes with a setting
            it cannot work with (``lease_on_conflict="preempt"``, ``lease_cooldown``), naming
            each and the fix.
    """
    check_limit(limit, where, name)
    if limit is None or (limit == 1 and type(limit) is int):
        return
    refused = _refused_with_a_limit(options)
    if refused:
        raise LeaseConfigError(
            f"{name}={limit!r} ({where}) cannot be combined with " + "; ".join(refused)
        )


# -- the steps of a task -----------------------------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """The hooks of one task's policies, per phase (tuples, in order).

    The fields named after a phase (``prepare``, ``admit``, ``shape``, ``on_grant``,
    ``release``, ``loss_event``, ``acquires_apart``, ``on_message_end``) hold the bound hooks
    of that phase (see :class:`~celery_lease.policies.base.Policy`), called for every
    execution; those ending in ``_on`` hold ``(header, hook)`` pairs, a hook called for an
    execution whose message carries the header.

    Attributes:
        waits: the release's reply is waited for before the result is stored.
    """

    prepare: tuple[Any, ...]
    prepare_on: tuple[tuple[str, Any], ...]
    admit: tuple[Any, ...]
    admit_on: tuple[tuple[str, Any], ...]
    shape: tuple[Any, ...]
    shape_on: tuple[tuple[str, Any], ...]
    on_grant: tuple[Any, ...]
    on_grant_on: tuple[tuple[str, Any], ...]
    release: tuple[Any, ...]
    loss_event: tuple[Any, ...]
    acquires_apart: tuple[Any, ...]
    acquires_apart_on: tuple[tuple[str, Any], ...]
    on_message_end: tuple[Any, ...]
    waits: bool


#: The phases of :class:`Steps` that a message header can call a hook of.
_TRIGGERED = ("prepare", "admit", "shape", "on_grant", "acquires_apart")
_BOUND = (*_TRIGGERED, "release", "loss_event", "on_message_end")


def steps_for(options: LeaseOptions, limit: Any, wait: bool = False) -> Steps:
    """The :class:`Steps` of a task with ``options`` and ``lease_limit`` ``limit``.

    Args:
        wait: the task itself waits for every release's reply.
    """
    every = _policies()
    applying = [p for p in every if p.applies(options, limit)]
    waits = wait or any(hook(options) for hook in _bound("waits_for_release", applying, every))
    bound = {phase: _bound(phase, applying, every) for phase in _BOUND}
    triggered = {f"{phase}_on": _triggered(phase, applying, every) for phase in _TRIGGERED}
    return Steps(**bound, **triggered, waits=waits)


@dataclass(frozen=True)
class PublishSteps:
    """The publish hooks of one task's policies (tuples of callables, in order)."""

    publish: tuple[Any, ...]
    send: tuple[Any, ...]


def publish_steps(task: Any) -> PublishSteps:
    """The :class:`PublishSteps` of ``task``, built once per task class (again after
    :func:`forget`), from what a publisher reads: no store settings needed."""
    cls = type(task)
    found: PublishSteps | None = cls.__dict__.get(_PUBLISH_ATTR)  # this class's own
    if found is None:
        applying = [p for p in _policies() if p.applies_at_publish(task)]
        found = PublishSteps(
            publish=tuple(p.publish for p in applying if _overrides(p, "publish")),
            send=tuple(p.send for p in applying if _overrides(p, "send")),
        )
        setattr(cls, _PUBLISH_ATTR, found)
    return found


def forget(cls: type) -> None:
    """Make the next :func:`publish_steps` of ``cls`` read its settings again."""
    setattr(cls, _PUBLISH_ATTR, None)


# -- a conflict --------------------------------------------------------------------------------


def _conflict_policies() -> tuple[dict[str, Callable[[Conflict], Any]], frozenset[str]]:
    global _conflicts
    every = _policies()
    if _conflicts[0] != len(every):
        found: dict[str, Callable[[Conflict], Any]] = {}
        for policy in every:
            for name in policy.handles:
                found.setdefault(name, policy.on_conflict)
        keeps = frozenset(name for p in every for name in p.keeps_message)
        _conflicts = (len(every), found, keeps)
    return _conflicts[1], _conflicts[2]


def handlers() -> dict[str, Callable[[Conflict], Any]]:
    """Conflict policy name -> its handler: every policy's, whatever the task's settings (a
    message's own case, a chain's fallback, can be any task's)."""
    return _conflict_policies()[0]


def _keeps_message() -> frozenset[str]:
    return _conflict_policies()[1]


def choose(c: Conflict) -> str:
    """The conflict policy for ``c`` (see the module docstring for the order)."""
    holder, request = c.found.holder, c.request
    if holder.hostname == store.RAN_HOLDER:
        return "handed_over"  # a second copy of a handed-over run that started already
    # A cooldown record (lease_cooldown) is a holder that ended: its successor is a copy.
    if (
        holder.token
        and not holder.cooldown_until
        and (request.headers or {}).get(base_headers.SUCCESSOR_HEADER) == holder.token
    ):
        return "successor"  # published by the holder itself (a retry): run once it ends
    if holder.task_id and holder.task_id == request.id:
        return "redelivered"  # same message again while it runs: not ours, not stored
    if c.options.debounce is not None:
        return "queue"  # a burst that fired waits for the previous run's release, in line
    if c.options.on_conflict in ("skip", "coalesce") and (request.chain or request.callbacks):
        # A skipped (or coalesced) link would leave the rest of its chain waiting forever
        # (Ignore sends nothing on): fail it instead, so the chain's result raises
        # LeaseConflict.
        return "fail"
    return c.options.on_conflict


def handle(c: Conflict, steps: Steps) -> Any:
    """Deal with an execution that found its key held (``c``, whose ``policy`` is filled
    here): log it, send :data:`~celery_lease.base.signals.lease_conflict`, run the chosen
    policy's handler (and its fallback if it declines).

    Returns:
        The marker result of a skipped or coalesced eager call,
        :data:`~celery_lease.policies.base.AGAIN`, or the lease a ``"preempt"`` took over
        (set in ``c.claim``): the body runs.

    Raises:
        celery.exceptions.Ignore: the execution ends without a result of its own (a stored
            skip marker, or a copy sent to run later).
        celery.exceptions.Retry: ``lease_on_conflict="retry"`` (the copy waits in the key's
            line; with a full line, Celery's retry at the holder's remaining lifetime).
        LeaseConflict: ``lease_on_conflict="fail"``, or a skip or coalesce inside a chain,
            or a successor or redelivery in eager mode, or a full line or a wait past
            ``lease_queue_timeout`` (queue).
        LeaseStoreUnavailable: the duplicate could not be parked (store error, with
            ``lease_on_store_error="fail"``; ``"retry"`` raises ``Retry``).
    """
    policy = choose(c)
    c = dataclasses.replace(c, policy=policy)
    task, request, holder = c.task, c.request, c.found.holder
    # A skip says what happened in its own line, once the marker is stored.
    logger.log(
        logging.DEBUG if policy in ("skip", "coalesce", "queue") else logging.INFO,
        "lease conflict (%s): task %s[%s] not run: %s (fencing_token=%d)",
        policy,
        task.name,
        request.id,
        c.error,
        holder.fencing_token,
    )
    signals.lease_conflict.send(
        sender=task,
        key=c.key,
        task_id=request.id,
        holder_task_id=holder.task_id,
        holder=holder.where,
        remaining=c.found.remaining,
        policy=policy,
        fencing_token=holder.fencing_token,
        token=holder.token,
    )
    try:
        return _run_handler(c, policy)
    except Retry:
        raise  # published again under its task id: a waiting copy keeps its claim
    except BaseException:
        # Its message ends here: a skip, a failure, a coalesce (the pending run, not this task
        # id, serves the trigger), a preempt that could not take over. A queued copy runs
        # later under its own id, a retried one too: they keep it.
        if policy not in _keeps_message():
            for hook in steps.on_message_end:
                hook(task, request, policy)
        raise


def _run_handler(c: Conflict, policy: str) -> Any:
    every = handlers()
    got = every[policy](c)
    if got is DECLINED:
        in_chain = bool(c.request.chain or c.request.callbacks)
        got = every[FALLBACK[policy](in_chain)](c)
    return got


def conflict_of(
    task: Any,
    request: Any,
    options: LeaseOptions,
    key: str,
    found: store.AcquireResult,
    **context: Any,
) -> Conflict:
    """The :class:`~celery_lease.policies.base.Conflict` of an execution that found ``key``
    held (``found``); ``context``: the rest of its fields (``client``, ``attempt``...)."""
    holder = found.holder
    error = LeaseConflict(key, holder.task_id, holder.where, found.remaining)
    return Conflict(task, request, options, key, found, error, **context)


# -- the end -----------------------------------------------------------------------------------


def end(task: Any, lease: Lease, ending: str, steps: Steps) -> lifecycle.Ending:
    """End ``lease`` (its body ended with ``ending``): the first policy whose release answers,
    else the plain release."""
    for release in steps.release:
        ended = release(task, lease, ending, steps.waits)
        if ended is not None:
            return ended  # type: ignore[no-any-return]
    return lifecycle.end(lease, sender=task, release=store.release, wait=steps.waits)


def loss_event(lease: Lease, error: Any, steps: Steps) -> str:
    """The task event of an execution that ended having lost ``lease``."""
    for hook in steps.loss_event:
        found = hook(lease, error)
        if found is not None:
            return found  # type: ignore[no-any-return]
    return "task-lease-lost"


def sweepers(options: LeaseOptions) -> tuple[Any, ...]:
    """The crash sweep's looks at a due key of a task with ``options``, in order (the
    hand-over's, then a debounce timer's)."""
    return tuple(
        p.sweep for p in _policies() if _overrides(p, "sweep") and p.applies(options, None)
    )


def acquires_apart(steps: Steps, task: Any, headers: Any, options: LeaseOptions) -> bool:
    """Whether an execution's acquire must not be written at the pool's accept: replicas must
    acknowledge it, or a policy takes the lease its own way."""
    if options.min_replicas:
        return True
    for hook in steps.acquires_apart:  # loops, not any(): this runs at every accept
        if hook(task, headers):
            return True
    for name, hook in steps.acquires_apart_on:
        if name in headers and hook(task, headers):
            return True
    return False
