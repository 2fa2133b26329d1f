"""``LeasedTask``: a Celery task base class whose executions are singletons.

The lease is taken when an execution starts, before the body runs (not at publish), so it
protects ``send_task``, beat, redelivery and producers in other languages alike. It is renewed
by the process's heartbeat while the body runs, released however the execution ends, and its
loss is raised inside the body as :class:`~celery_lease.errors.LeaseLost`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Retry
from celery.result import allow_join_result
from redis.exceptions import RedisError

from .. import store
from ..base import clock, process
from ..base.keys import KeySpec, build_key, run_signature, validate_lease_key
from ..core import eager, interrupt, lifecycle
from ..core.lease import Lease, _current
from ..errors import LeaseKeyError, LeaseLost, LeaseStoreUnavailable
from ..policies import compose
from ..policies.base import AGAIN
from ..settings import publish as publish_settings
from ..settings.config import (
    TASK_OPTIONS,
    LeaseOptions,
    LeaseSettings,
    check_process_settings,
    resolve_options,
    resolve_settings,
)
from ..settings.names import check_task_names
from ..store import health
from ..store import written as store_written
from . import outage, publishing

if TYPE_CHECKING:
    from ..policies.limit import LimitSpec

__all__ = ["LeasedTask"]

_NO_HEADERS: dict[str, Any] = {}  # a message without headers of its own (never written to)

logger = logging.getLogger("celery_lease")


class LeasedTask(Task):  # type: ignore[misc]
    """Base class for tasks whose executions must not overlap: ``@app.task(base=LeasedTask)``.

    Task options: every ``lease_*`` setting a task may override (docs/reference/settings.md;
    durations are float seconds), e.g. ``lease_ttl``, ``lease_on_conflict`` (``"skip"``,
    ``"retry"``, ``"fail"``, ``"coalesce"``, ``"queue"``, ``"preempt"``), ``lease_dedupe``
    (bool, decided at publish: :mod:`celery_lease.policies.dedupe`), ``lease_cooldown``, and
    ``lease_key``:

    - ``None`` (default): every argument identifies the job;
    - a sequence of parameter names: only those (an empty one: one lease per task name);
    - a callable taking the call's arguments and returning a str: a custom key, which lets
      several tasks share one lease.

    Inside a running execution ``self.lease`` is its :class:`~celery_lease.core.lease.Lease`.
    Calling the task function directly takes no lease; ``apply()`` and eager mode do. The
    result of ``apply_async`` / ``delay`` carries ``lease_disposition`` (``"published"``,
    ``"deduplicated"``, ``"debounced"``, ``"unguarded"``).

    Raises (at registration): :class:`~celery_lease.errors.LeaseConfigError` for an invalid
    option, naming it and the fix.
    """

    lease_ttl: float | None = None
    lease_renew_interval: float | None = None
    lease_store_timeout: float | None = None
    lease_key_prefix: str | None = None
    lease_on_conflict: str | None = None
    lease_on_store_error: str | None = None
    lease_store_outage_max: float | None = None
    lease_queue_max: int | None = None
    lease_queue_timeout: float | None = None
    lease_backend: str | None = None
    lease_dedupe: bool | None = None
    lease_dedupe_ttl: float | None = None
    lease_key: KeySpec = None
    lease_limit: LimitSpec = None

    _lease_signature: ClassVar[inspect.Signature | None] = None
    _lease_spec_cache: ClassVar[tuple[KeySpec] | None] = None
    _lease_limit_cache: ClassVar[tuple[LimitSpec] | None] = None
    #: (pid, settings, steps): the settings and the policies' steps, resolved per process.
    _lease_resolved: ClassVar[tuple[int, LeaseSettings, compose.Steps] | None] = None
    #: Wait for the release's reply before the execution's result is stored (the benchmark's
    #: synchronous variant). False: the release is written before, its reply read later
    #: (:mod:`celery_lease.store.pending`), one round trip less on every execution.
    _lease_release_wait: ClassVar[bool] = False
    #: Celery's request class (a name: only workers import it), see
    #: :mod:`celery_lease.execution.accepted`.
    Request = "celery_lease.execution.accepted:LeasedRequest"

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Validate the lease options when the task is registered (the earliest moment)."""
        super().on_bound(app)
        if not getattr(cls, "name", None):  # the base class itself, or an unnamed subclass
            return
        where = f"task {cls.name}"
        given = {n for k in cls.__mro__[: cls.__mro__.index(LeasedTask)] for n in vars(k)}
        check_task_names(given, app.conf, where)
        check_process_settings(app.conf, "app.conf")
        compose.check(
            cls._lease_limit_spec(),
            resolve_options(app.conf, cls._lease_task_options(), where),
            where,
        )
        cls._lease_signature = run_signature(cls)
        sig = cls._lease_signature
        validate_lease_key(cls._lease_key_spec(), lambda: list(sig.parameters), where)
        # By name: the worker module imports this one, not the other way round.
        app.steps["worker"].add("celery_lease.ops.worker:LeaseStoreCheck")
        app.steps["worker"].add("celery_lease.ops.sweep:HandoffSweep")  # idle unless one hands over

    @classmethod
    def _lease_key_spec(cls) -> KeySpec:
        # A function given as a task option is a class attribute: read it unbound.
        cached = cls.__dict__.get("_lease_spec_cache")
        if cached is not None:
            return cached[0]  # type: ignore[no-any-return]
        spec = inspect.getattr_static(cls, "lease_key")
        spec = spec.__func__ if isinstance(spec, (staticmethod, classmethod)) else spec
        cls._lease_spec_cache = (spec,)
        return spec

    @classmethod
    def _lease_limit_spec(cls) -> LimitSpec:
        """``lease_limit`` read unbound (as ``lease_key``), kept for :meth:`_acquire`."""
        spec = inspect.getattr_static(cls, "lease_limit")
        cls._lease_limit_cache = (getattr(spec, "__func__", spec),)  # a staticmethod's own
        return cls._lease_limit_cache[0]

    @classmethod
    def _lease_task_options(cls) -> dict[str, Any]:
        return {name: getattr(cls, name, None) for name in TASK_OPTIONS}

    def lease_settings(self) -> LeaseSettings:
        """The effective settings (options, store URL, signal number), resolved once per
        process and task class. A named tuple: ``options, url, signum = ...`` works.

        Raises:
            LeaseConfigError: a setting is invalid or no Redis URL is configured.
        """
        return self._lease_resolve()[1]

    def _lease_resolve(self) -> tuple[int, LeaseSettings, compose.Steps]:
        """``(pid, settings, steps)``: the settings and the steps of the task's policies
        (:func:`celery_lease.policies.compose.steps_for`), resolved once per process.

        Raises:
            LeaseConfigError: a setting is invalid, or the policies cannot be combined
                (:func:`celery_lease.policies.compose.check`: also for app settings changed
                since registration).
        """
        cls = type(self)
        # Looked up in the class's own __dict__: a subclass of a leased task must not see
        # its parent's settings (its options may differ).
        resolved = cls.__dict__.get("_lease_resolved")
        if resolved is None or resolved[0] != process.pid():
            where = f"task {self.name}"
            settings = resolve_settings(self.app.conf, self._lease_task_options(), where)
            limit = cls._lease_limit_spec()
            # Again here: an app setting given after registration (lease_cooldown, preempt)
            # must not be dropped in silence by a limit's slots.
            compose.check(limit, settings.options, where)
            steps = compose.steps_for(settings.options, limit, cls._lease_release_wait)
            resolved = (process.pid(), settings, steps)
            cls._lease_resolved = resolved
        return resolved  # type: ignore[no-any-return]

    @classmethod
    def forget_lease_settings(cls) -> None:
        """Make the next :meth:`lease_settings` call resolve the settings again.

        Settings are resolved once per process and task class; call this after changing
        ``app.conf.lease_*`` at run time (tests do;
        :func:`celery_lease.ops.testing.use_lease_backend` calls it for every leased task of an
        app).
        """
        cls._lease_resolved = None
        publish_settings.forget(cls)  # lease_dedupe, lease_debounce
        compose.forget(cls)  # the publish steps built from them

    def lease_key_for(self, args: Any = (), kwargs: Mapping[str, Any] | None = None) -> str:
        """The lease key a call with ``args`` and ``kwargs`` takes.

        Pass the arguments as the worker receives them: with the JSON serializer a dict key
        ``1`` arrives as ``"1"`` and a tuple as a list (tuples and lists give the same key).

        Args:
            args: the positional arguments, a list or tuple (``("42",)``, not ``"42"``).
            kwargs: the keyword arguments, a mapping.

        Raises:
            LeaseKeyError: ``args`` is not a list or tuple (a string would be iterated as
                arguments), an argument cannot be encoded stably, or the arguments do not fit.
        """
        if args is None:
            args = ()
        if not isinstance(args, (list, tuple)):
            raise LeaseKeyError(
                f"task {self.name}: lease_key_for(args={args!r}) takes the positional "
                f"arguments as a list or tuple, e.g. lease_key_for(({args!r},))"
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise LeaseKeyError(
                f"task {self.name}: lease_key_for(kwargs={kwargs!r}) takes the keyword "
                f"arguments as a dict"
            )
        options, _, _ = self.lease_settings()
        sig = type(self)._lease_signature or run_signature(type(self))
        return build_key(
            options.key_prefix, self.name, sig, self._lease_key_spec(), tuple(args), kwargs or {}
        )

    @property
    def lease(self) -> Lease | None:
        """The current execution's lease (``None`` outside a leased execution)."""
        return _current.get()

    # -- publishing: dedupe, and mark a message published by the holder of the same key ---------

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Celery's ``apply_async``, with the lease's part of publishing.

        A message this execution publishes for its own key (a self-requeue, a retry) runs once
        this execution has ended. With ``lease_dedupe``, one decision in the lease store comes
        first (:func:`celery_lease.policies.dedupe.send`): while a copy of the key waits, nothing is
        published and the result is the waiting copy's. The result carries
        ``lease_disposition``.

        Raises:
            LeaseStoreUnavailable: ``lease_dedupe``, the store could not be asked and
                ``lease_on_store_error`` is ``"fail"``.
            LeaseConfigError: ``lease_dedupe`` and this process has no lease store
                configured (``lease_backend``, or a Redis ``broker_url``).
        """
        return publishing.apply_async(
            self,
            args,
            kwargs,
            options,
            lambda **sent: super(LeasedTask, self).apply_async(args, kwargs, **sent),
        )

    def on_replace(self, sig: Any) -> Any:
        """Celery's replacement hook; in eager mode the holder's lease is released first.

        On a worker the replaced execution ends (``Ignore``) and its lease is released before
        the replacement runs; eager mode runs the replacement inside ``replace()``, so the
        lease is released here, as the holder's body is over.
        """
        if not self.request.is_eager:
            return super().on_replace(sig)
        lease = _current.get()
        if lease is not None:
            self._end(lease)
        # Celery reads the finished replacement's EagerResult with .get(), which it refuses
        # under the delay() of always-eager mode; nothing can block: it ran already.
        with allow_join_result():
            return super().on_replace(sig)

    # -- execution ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call takes no lease
            return super().__call__(*args, **kwargs)
        # Filled the moment the store grants the lease: an exit that lands anywhere after
        # that (a soft time limit during the acquire's reply, gevent's Timeout) still ends it.
        claim = lifecycle.Claim()
        ending = "failure"  # how the body ended: which release it sends (lease_cooldown)
        try:
            resolved = self._lease_resolve()
            steps = resolved[2]
            args, kwargs = self._prepared(steps, request, args, kwargs)  # or Ignore
            lease = self._acquire(request, args, kwargs, claim, resolved)
            if not isinstance(lease, Lease):
                return lease  # eager mode: a skipped duplicate's marker
            args, kwargs = self._granted(steps, request, lease, args, kwargs)
            outer = _current.get()  # put back even if an exit lands right after the set
            _current.set(lease)
            try:
                result = self.run(*args, **kwargs)
                ending = "success"
                return result
            except Retry:
                ending = "retry"
                raise
            except LeaseLost as exc:
                # Store the public class, not the per-execution carrier of the threads pool.
                raise LeaseLost(*exc.args).with_traceback(exc.__traceback__) from None
            finally:
                _current.set(outer)
        finally:
            granted = claim.lease
            if granted is not None:
                try:
                    if _current.get() is granted:  # an exit landed between the set and its try
                        _current.set(outer)
                    self._end(granted, ending, steps)
                except BaseException:
                    # An exit that landed as the end began (its call): end it, then go on.
                    self._end(granted, ending, steps)
                    raise
                finally:
                    eager.run_deferred(granted.token)  # eager successors: after the release

    def _prepared(
        self, steps: compose.Steps, request: Any, args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """The phase before the acquire: the arguments the execution runs with (a debounce
        timer decides its burst here, or raises ``Ignore``)."""
        for prepare in steps.prepare:
            args, kwargs = prepare(self, request, args, kwargs)
        if steps.prepare_on:
            headers = request.headers or _NO_HEADERS
            for header, prepare in steps.prepare_on:
                if header in headers:
                    args, kwargs = prepare(self, request, args, kwargs)
        return args, kwargs

    def _granted(
        self, steps: compose.Steps, request: Any, lease: Lease, args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        """The phase after the grant: the arguments the body runs with (a handed-over run
        takes those a later duplicate joined it with)."""
        for on_grant in steps.on_grant:
            args, kwargs = on_grant(self, request, lease) or (args, kwargs)
        if steps.on_grant_on:
            headers = request.headers or _NO_HEADERS
            for header, on_grant in steps.on_grant_on:
                if header in headers:
                    args, kwargs = on_grant(self, request, lease) or (args, kwargs)
        return args, kwargs

    def _end(
        self, lease: Lease, ending: str = "failure", steps: compose.Steps | None = None
    ) -> None:
        """Stop loss delivery and release ``lease`` (once), as ``ending`` says (cooldown),
        with the ``steps`` of the task's policies that took it (default: as resolved now)."""
        if lease.retired:
            return
        try:
            # A loss delivered while the body was ending can still land in here: the
            # release below runs whatever happens.
            lease.target.finish()
        finally:
            self._release(lease, ending, steps or self._lease_resolve()[2])

    def _acquire(
        self,
        request: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        claim: lifecycle.Claim | None = None,
        resolved: tuple[int, LeaseSettings, compose.Steps] | None = None,
    ) -> Lease | dict[str, Any]:
        _, settings, steps = resolved or self._lease_resolve()
        options, url, signum = settings
        # Written as the pool accepted the request (celery_lease.execution.accepted), for
        # these arguments.
        written = store_written.take(request.id, options.renew_interval) if request.id else None
        # lease_key_for() without its checks of the arguments' types: Celery passes a tuple
        # and a dict.
        key = written.key if written is not None else self._lease_key(options, args, kwargs)
        try:  # a cluster client asks its seed for the layout: building it is a store call
            client = store.client_for(url, options.store_timeout, options.backend_options)
        except RedisError as exc:
            self._store_error(options, key, exc)
        headers = request.headers or _NO_HEADERS
        for admit in steps.admit:
            admit(self, request, client, key)
        for header, admit in steps.admit_on:  # a redelivered copy of a run that finished
            if header in headers:
                admit(self, request, client, key)
        holder = lifecycle.HolderInfo(
            self.name, request.id or "", request.hostname or socket.gethostname()
        )
        asked = lifecycle.AcquireRequest(written=written)
        for shape in steps.shape:  # the slots of a limit
            shape(self, request, args, kwargs, asked)
        for header, shape in steps.shape_on:  # claimed at publish, a handed-over run
            if header in headers:
                shape(self, request, args, kwargs, asked)
        first_conflict = None
        for attempt in itertools.count():
            target = interrupt.for_current_context(signum)
            try:
                got = lifecycle.take(
                    settings, client, key, holder, target, sender=self, claim=claim, request=asked
                )
                asked.written = None  # a second attempt sends its own
            except RedisError as exc:
                self._store_error(options, key, exc)
            if not isinstance(got, Lease):
                first_conflict = clock.now() if first_conflict is None else first_conflict
                got = compose.handle(
                    compose.conflict_of(
                        self,
                        request,
                        options,
                        key,
                        got,
                        client=client,
                        attempt=attempt,
                        waited=clock.now() - first_conflict,
                        claim=claim,
                        event=self._event,
                        store_error=functools.partial(self._store_error, options, key),
                    ),
                    steps,
                )
                if got is AGAIN:
                    continue
            return got  # type: ignore[no-any-return]
        raise AssertionError("unreachable")

    def _lease_key(self, options: LeaseOptions, args: Any, kwargs: Any) -> str:
        return build_key(
            options.key_prefix,
            self.name,
            type(self)._lease_signature or run_signature(type(self)),
            self._lease_key_spec(),
            args,
            kwargs,
        )

    def _release(self, lease: Lease, ending: str, steps: compose.Steps) -> None:
        # Runs before Celery stores the result and acknowledges the message: the release is on
        # the socket (or done, with wait) by then.
        error = compose.end(self, lease, ending, steps).loss
        if error is not None:
            self._event(
                compose.loss_event(lease, error, steps),
                lease_key=lease.key,
                lease_cause=error.cause,
                fencing_token=lease.fencing_token,
                lease_late=error.late,
                lease_holder=f"{self.request.hostname or socket.gethostname()}:{lease.pid}",
            )

    def _store_error(self, options: LeaseOptions, key: str, exc: RedisError) -> NoReturn:
        error = LeaseStoreUnavailable(key, "acquire", store.describe(exc))
        if isinstance(exc, store.PrimaryUnconfirmed):  # once a minute, naming the sentinels
            outage.report_unconfirmed(self, options, exc)
            unreachable = True
        else:  # an unreachable store is logged once per outage (store.health), not per task
            unreachable = health.reachability(self.lease_settings().url).failed(
                exc, f"acquire of {key}"
            )
        outage.wait_out(self, options, error, unreachable)  # retried, or raised

    def _event(self, type_: str, **fields: Any) -> None:
        """Send a task event (Flower shows ``task-lease-*`` as the task's state); never raises.

        The event names the task (``name``), as ``task-received`` does: a monitor that did
        not see that one (started later, or got the events out of order) would otherwise
        know the task by its id only, and Flower label its metrics with an empty task name.
        """
        if self.request.is_eager:
            return
        try:
            self.send_event(type_, retry=False, name=self.name, **fields)
        except Exception as exc:
            logger.debug("could not send %s: %s: %s", type_, type(exc).__name__, exc)
