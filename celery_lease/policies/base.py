"""What every work-shaping policy is: a :class:`Policy` with one hook per phase of a leased
task's life, and what the hooks are given.

A policy (``lease_dedupe``, ``lease_debounce``, ``coalesce``, ``queue``, ``preempt``,
``lease_limit``, ``lease_cooldown``, skip/retry/fail...) is one subclass of :class:`Policy`
in its own module under :mod:`celery_lease.policies`. It overrides the hooks of the phases it
takes part in and leaves the others alone: :mod:`celery_lease.policies.compose` binds, once per
task class and process, only the hooks that the task's policies override (as Celery's
``build_tracer`` binds only the task's own handlers), so a phase no policy of a task takes
part in costs that task nothing. The rules for combining policies live in
:mod:`~celery_lease.policies.compose` too, not here and not in the policies.

The phases, in the order a message meets them (each hook's docstring says what it may do):

- at publish: :meth:`Policy.publish` (before the lease's own part), :meth:`Policy.send`
  (the message's sending);
- at the pool's accept: :meth:`Policy.acquires_apart` (whether the acquire may be written
  then);
- at the execution: :meth:`Policy.prepare` (before anything), :meth:`Policy.admit` (before the
  acquire), :meth:`Policy.shape` (the :class:`~celery_lease.core.lifecycle.AcquireRequest`),
  :meth:`Policy.on_grant`, :meth:`Policy.on_conflict` (for the conflict policies it
  ``handles``), :meth:`Policy.on_message_end` (a message that ended on a conflict),
  :meth:`Policy.release` and :meth:`Policy.loss_event` (the end);
- in every worker's crash sweep: :meth:`Policy.sweep` (a key noted as due).

A new policy is one new module here (and its store half in :mod:`celery_lease.store`, its
scripts under ``store/scripts/``): :mod:`~celery_lease.policies.compose` finds every subclass
of :class:`Policy` in the modules of this package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from kombu.serialization import dumps, loads
from kombu.utils import json

from .. import store
from ..errors import LeaseConfigError, LeaseConflict
from ..settings.config import LeaseOptions

if TYPE_CHECKING:
    from ..core.lease import Lease
    from ..core.lifecycle import AcquireRequest, Ending

__all__ = [
    "AGAIN",
    "DECLINED",
    "DISPOSITIONS",
    "PASS",
    "Arguments",
    "Conflict",
    "Policy",
    "adopt",
    "mark",
    "registered",
    "sent_key",
    "unregister",
]

#: What a conflict handler returns for "take the key again now" (it was free by the time the
#: duplicate was to be parked; or an eager ``queue`` call waiting its turn).
AGAIN: Any = object()
#: What a conflict handler returns when it cannot do what its policy says (a ``preempt`` that
#: finds nothing to take over): the composition's fallback for that policy runs instead.
DECLINED: Any = object()
#: What a publish hook returns when it leaves the publish to the next step.
PASS: Any = object()

#: The values of ``result.lease_disposition``.
DISPOSITIONS = ("published", "deduplicated", "debounced", "unguarded")

#: An execution's arguments: ``(args, kwargs)``.
Arguments = tuple[tuple[Any, ...], dict[str, Any]]

_REGISTRY: list[type[Policy]] = []


def mark(result: Any, disposition: str) -> Any:
    """Set ``result.lease_disposition`` (one of :data:`DISPOSITIONS`) and return ``result``."""
    try:
        result.lease_disposition = disposition
    except AttributeError:  # a result class with __slots__: nothing to carry it
        pass
    return result


def adopt(request: Any, message: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Make ``request`` run with the arguments of ``message`` (JSON with ``args`` and
    ``kwargs``: a burst's latest, :mod:`celery_lease.policies.debounce`; or the latest duplicate
    that joined a handed-over coalesced run, answered by its grant) and return them as
    ``(args, kwargs)``. ``request`` carries them from here on, so a copy of it parked in the
    key's line or retried runs them too.

    Raises:
        ValueError: ``message`` is not JSON; KeyError: it has no ``args`` or ``kwargs``.
    """
    body = json.loads(message)  # type: ignore[no-untyped-call]
    args, kwargs = tuple(body["args"]), dict(body["kwargs"])
    request.args, request.kwargs = list(args), kwargs
    return args, kwargs


def sent_key(task: Any, args: Any, kwargs: Any, options: Mapping[str, Any]) -> str | None:
    """The key the worker will compute for a call, from the arguments as the serializer
    hands them over (JSON turns ``{1: "a"}`` into ``{"1": "a"}``); None when they give
    none (a bad call fails at execution, with the real error).

    Raises:
        LeaseConfigError: no lease store is configured (a publisher of a task with
            ``lease_dedupe`` or ``lease_debounce`` needs one).
    """
    try:
        content_type, encoding, data = dumps(  # type: ignore[no-untyped-call]
            [list(args or ()), dict(kwargs or {})],
            serializer=options.get("serializer") or task.serializer,
        )
        sent_args, sent_kwargs = loads(  # type: ignore[no-untyped-call]
            data, content_type, encoding
        )
        return str(task.lease_key_for(sent_args, sent_kwargs))
    except LeaseConfigError:
        raise  # no store configured (a publisher of a task with lease_dedupe needs one)
    except Exception:
        return None


@dataclass(frozen=True)
class Conflict:
    """One execution that found its key held, as a conflict handler sees it.

    Attributes:
        task: the :class:`~celery_lease.LeasedTask` instance (its ``request`` is the
            execution's).
        request: the execution's Celery request.
        options: the task's lease options.
        key: the lease key (str).
        found: what the acquire found (the holder, its time left).
        error: the :class:`LeaseConflict` that describes it.
        policy: the conflict policy chosen for it (``"skip"``, ``"successor"``...).
        client: the store's client (for the policies that park the duplicate).
        attempt: how many times this execution found the key held before (int, 0 first).
        waited: float seconds since it first found the key held.
        claim: the execution's :class:`~celery_lease.core.lifecycle.Claim`, for a handler that
            takes the key after all (``"preempt"``), or None.
        event: sends a task event, ``event(type, **fields)`` (Flower shows ``task-lease-*``
            as the task's state); never raises.
        store_error: what the execution does with a store error met while handling the
            conflict (``lease_on_store_error``): raises ``Retry`` or
            :class:`~celery_lease.errors.LeaseStoreUnavailable`.
    """

    task: Any
    request: Any
    options: LeaseOptions
    key: str
    found: store.AcquireResult
    error: LeaseConflict
    policy: str = ""
    client: Any = None
    attempt: int = 0
    waited: float = 0.0
    claim: Any = None
    event: Callable[..., None] = lambda *args, **kwargs: None
    store_error: Callable[[Exception], NoReturn] | None = None

    def fail_on_store(self, exc: Exception) -> NoReturn:
        """Hand a store error to the execution (``lease_on_store_error``); never returns."""
        if self.store_error is not None:
            self.store_error(exc)
        raise exc


class Policy:
    """One work-shaping policy: its settings are the ``lease_*`` options it reads, its hooks
    the methods below that it overrides, its checks :meth:`applies` and the composition's
    rules (:mod:`celery_lease.policies.compose`).

    A hook that a subclass does not override is never called. Hooks are called on one
    instance per policy class; a policy keeps no state of its own between executions (what
    an execution needs travels in the request, the lease or the store).

    Class attributes:
        name: the policy's name, as errors and docs name it (``"lease_dedupe"``).
        order: where its hooks run among the policies of a phase (lower first).
        handles: the conflict policies it handles (``lease_on_conflict`` values, and the
            cases that ignore it: ``"successor"``, ``"redelivered"``, ``"handed_over"``).
        keeps_message: of those, the ones whose message lives on after the conflict (it runs
            later under its own task id): :meth:`on_message_end` is not called for them.
        triggers: hook name -> the message header that calls it for any task's execution
            whose message carries it, whatever the task's settings (a timer's, a hand-over's,
            a claim's): a message, not the task's options, says when these act.
        always: the hooks bound for every leased task whatever its settings (the phases a
            plain execution never reaches: a loss, a conflict; and build-time answers).
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100
    handles: ClassVar[tuple[str, ...]] = ()
    keeps_message: ClassVar[frozenset[str]] = frozenset()
    triggers: ClassVar[Mapping[str, str]] = {}
    always: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            _REGISTRY.append(cls)

    # -- which tasks it applies to ---------------------------------------------------------------

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        """Whether the execution hooks apply to a task with ``options`` and ``lease_limit``
        ``limit`` (None, an int or a callable). Default: no (only :attr:`always` hooks)."""
        return False

    def applies_at_publish(self, task: Any) -> bool:
        """Whether the publish hooks apply to ``task``; read without resolving the store, so
        a publisher of other tasks needs no lease settings. Default: no."""
        return False

    # -- publish ---------------------------------------------------------------------------------

    def publish(
        self,
        task: Any,
        args: Any,
        kwargs: Any,
        options: dict[str, Any],
        publish: Callable[..., Any],
    ) -> Any:
        """Before the lease's part of ``apply_async``: return the call's result to answer
        instead of publishing it (``publish(**options)`` publishes), or :data:`PASS`."""
        return PASS

    def send(
        self,
        task: Any,
        key: str | None,
        options: dict[str, Any],
        publish: Callable[..., Any],
        take_over: bool,
    ) -> Any:
        """Send the message (``publish(**options)``) and return its result, or :data:`PASS`.
        ``key`` is the call's lease key (None: a redelivery's check copy, or a call whose
        arguments give none); ``take_over``: the message claims for itself (a retry, a
        holder's successor)."""
        return PASS

    # -- the pool's accept -----------------------------------------------------------------------

    def acquires_apart(self, task: Any, headers: Any) -> bool:
        """True when an execution of ``task`` whose message has ``headers`` takes its lease in
        a way of its own, so its acquire is not written at the accept
        (:mod:`celery_lease.execution.accepted`)."""
        return False

    # -- the execution ---------------------------------------------------------------------------

    def prepare(
        self, task: Any, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """First of all: return the arguments the execution runs with (or raise ``Ignore``:
        nothing to run)."""
        return args, kwargs

    def admit(self, task: Any, request: Any, client: Any, key: str) -> None:
        """Before the acquire: raise ``Ignore`` for an execution that must not run at all."""

    def shape(
        self,
        task: Any,
        request: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        asked: AcquireRequest,
    ) -> None:
        """Fill in what the acquire asks for (``asked``: the key's shape, claimed, handed
        over)."""

    def on_conflict(self, c: Conflict) -> Any:
        """Handle ``c`` for one of the policies this one :attr:`handles`: raise what ends the
        execution (``Ignore``, ``Retry``, ``LeaseConflict``), return an eager call's result,
        :data:`AGAIN` (take the key again), a lease taken after all, or :data:`DECLINED`."""
        return DECLINED

    def on_message_end(self, task: Any, request: Any, policy: str) -> None:
        """The execution's message ended on the conflict policy ``policy`` without a copy
        sent on (it will not run)."""

    def on_grant(self, task: Any, request: Any, lease: Lease) -> Arguments | None:
        """The lease was granted (from the acquire, or taken after a conflict): return the
        arguments the body runs with instead of its own, or None."""
        return None

    def release(self, task: Any, lease: Lease, ending: str, wait: bool) -> Ending | None:
        """End ``lease`` the way this policy does for a body that ended with ``ending`` (one
        of ``"success"``, ``"failure"``, ``"retry"``) and return how it ended, or None to
        leave it to the next policy (the last resort is the plain release). ``wait``: wait for
        the release's reply."""
        return None

    def waits_for_release(self, options: LeaseOptions) -> bool:
        """True when an execution with ``options`` must learn its release's answer before its
        result is stored (something may be waiting for its end)."""
        return False

    def loss_event(self, lease: Lease, error: Any) -> str | None:
        """The task event of an execution that ended having lost ``lease`` (``error``, a
        ``LeaseLost``), or None to leave it to the next policy (``task-lease-lost``)."""
        return None

    # -- the crash sweep -------------------------------------------------------------------------

    def sweep(
        self, app: Any, client: Any, prefix: str, key: str, score: int, options: LeaseOptions
    ) -> int:
        """The crash sweep (:mod:`celery_lease.ops.sweep`) found ``key`` due (noted at
        ``score``, int milliseconds of the store's clock) for a task with ``options``: put
        right what a dead holder left, and return how many messages it published."""
        return 0


def unregister(cls: type[Policy]) -> None:
    """Forget the policy ``cls`` (a test's own): tasks resolved after this no longer bind it.

    Raises:
        ValueError: ``cls`` is not registered.
    """
    _REGISTRY.remove(cls)


def registered() -> list[type[Policy]]:
    """Every :class:`Policy` subclass defined so far, in :attr:`Policy.order`."""
    return sorted(_REGISTRY, key=lambda cls: (cls.order, cls.name))
